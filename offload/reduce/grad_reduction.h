// The gradient-reduction seam: the engine hands every gradient it produces to a GradReduction
// where it lands on the host, and the reduction adds it into the host fp32 accumulation:
//   add_dense       a decoder layer's or the final norm's gradient (staging -> accumulation);
//   add_head_rows   an lm_head chunk's rows (into the embedding's gradient when tied);
//   add_embedding   the embedding's scatter-add of d x0 by token id.
// The engine calls these on its host queue, one at a time and in a fixed order (head chunks
// K-1..0, the final norm, layers L-1..0, the embedding), and begin_micro_batch on the trainer
// thread after the host queue drained, before the micro-batch's forward.
//
// on_device: the same landings, earlier, on the device: the engine calls it on the trainer thread
// (in the same order) right before it queues a gradient's device -> host copy on stream `s`,
// which already waits for the compute that produced `grad`; work queued on `s` here runs before
// the copy (offload/reduce/device_reduction.h all-reduces there, over NCCL). The host task of the
// landing waits for the returned ticket before it reads the staging buffer.
//
// NoGradReduction (one process): the plain fixed-order additions. offload/reduce/comm_reduction.h
// (data parallel): the same sums across ranks, bit-identical to one process accumulating the
// ranks' micro-batches one after another.
#pragma once
#include <cstddef>
#include <cstdint>

#include "src/comm/comm.h"
#include "src/device/device.h"

namespace strata {

// dst[0, n) += src[0, n), elementwise (the host accumulation; every order of the elements gives
// the same bits).
void grad_accumulate(float* dst, const float* src, size_t n);

// Which gradient lands: a dense bucket (decoder layer, final norm), an lm_head chunk (rows [v0,
// v0 + rows) of the (V, C) table) or the embedding's d x0 ((tokens, C)).
struct GradLanding {
  enum Kind : uint8_t { dense, head_chunk, embedding } kind = dense;
  int64_t v0 = 0, rows = 0, C = 0;
};

class GradReduction {
 public:
  virtual ~GradReduction() = default;
  // grad: n floats of device memory (see above). The default leaves the device alone.
  virtual CommTicket on_device(const GradLanding&, float* /*grad*/, size_t /*n*/, Stream /*s*/) { return {}; }
  // The micro-batch about to run (n token ids, host; copied if kept).
  virtual void begin_micro_batch(const int32_t* ids, int64_t n) = 0;
  // dst[0, n) += staging[0, n); staging may be used as scratch.
  virtual void add_dense(float* dst, float* staging, size_t n) = 0;
  // Rows [v0, v0 + rows) of the (V, C) table gradient += staging (rows, C).
  virtual void add_head_rows(float* table_grad, float* staging, int64_t v0, int64_t rows, int64_t C) = 0;
  // table_grad[ids[t]] += dx0[t] for t = 0..n-1 in order (dx0: (n, C)).
  virtual void add_embedding(float* table_grad, const float* dx0, const int32_t* ids, int64_t n, int64_t C) = 0;

  // A host store shared by the ranks of a node (distributed.shared_host_store): the optimizer
  // step meets the other ranks (all_ranks_here, called with the host queue drained) before the
  // gradients are read, after the norm and after the updates, and this rank updates only the
  // groups updates_group says.
  virtual bool shared_store() const { return false; }
  virtual bool updates_group(size_t) const { return true; }
  virtual void all_ranks_here() {}
};

class NoGradReduction final : public GradReduction {
 public:
  void begin_micro_batch(const int32_t*, int64_t) override {}
  void add_dense(float* dst, float* staging, size_t n) override { grad_accumulate(dst, staging, n); }
  void add_head_rows(float* table_grad, float* staging, int64_t v0, int64_t rows, int64_t C) override {
    grad_accumulate(table_grad + v0 * C, staging, size_t(rows * C));
  }
  void add_embedding(float* table_grad, const float* dx0, const int32_t* ids, int64_t n, int64_t C) override;
};

}  // namespace strata
