// Data-parallel gradient reduction (DESIGN §8) over a Comm with host buffers (MPI): every rank
// runs its own micro-batches; each gradient is summed across the ranks where it lands on the
// host (one bucket per landing: a decoder layer, an lm_head chunk, the final norm, the
// embedding), on the engine's host queue while the device goes on with the rest of the backward.
//
// Bit-identical to one process that accumulates the ranks' micro-batches one after another in
// rank order (rank r of N holds micro-batch r of each round of N), for any N and any number of
// rounds, because every sum is made in exactly that process's order:
//   dense (layers, norm, untied head)  one process computes ((G + g0) + g1) + ... with G the
//       accumulation so far. Rank 0 contributes G + g0, rank r > 0 contributes g_r, and the MPI
//       all-reduce sums contributions in rank order ((x0 + x1) + x2) + ... (comm.h): the same
//       additions, in the same order. The result is the new G on every rank.
//   embedding (a scatter-add by token id, several additions per row)  the ranks all-gather their
//       token ids and d x0 (tokens x C floats, far less than the V x C table) and every rank
//       scatters all of them in rank order, as one process does micro-batch after micro-batch.
//   tied lm_head  one process adds micro-batch m's dense head gradient h_m and then its scatter
//       e_m, per micro-batch: ((G + h0) + e0) + h1 + e1. The dense all-reduce gives (G + h0) + h1,
//       which is right for every row no token of the round touches; for the rows some token
//       touches (at most the round's token count), each rank keeps G and its own h_r there, the
//       ranks all-gather those rows, and the chain is redone for them in the single-process order.
// An all-gather is an all-reduce of a zero-filled (N, n) buffer holding each rank's part in its
// row: x + 0 is exact (a -0 becomes +0, which no later addition can tell apart: the accumulation
// starts at +0 and so is never -0).
#pragma once
#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include "offload/reduce/grad_reduction.h"
#include "src/comm/comm.h"

namespace strata {

// Cumulative; the trainer reports per-step differences.
struct CommReductionStats {
  size_t reduced_bytes = 0;     // bytes of buffers all-reduced by this rank (its contribution)
  size_t collectives = 0;
  double comm_s = 0;            // the host queue blocked in collectives
  double hidden_s = 0;          // the part of comm_s the device's compute stream was working
};

// Worker-consistency sums (distributed.diagnostics_steps), over the dense buckets (layers, final
// norm, lm_head chunks; not the embedding's scatter) and over the rounds of micro-batches since
// diagnostics_begin: local_sq = sum of |g_r|^2 (this rank's gradient of each round), sum_sq = sum
// of |g_0 + ... + g_(N-1)|^2 (the round's summed gradient: the reduced result minus the
// accumulation before it). With one micro-batch per rank and step, g_r is the rank's gradient.
struct CommDiagnostics {
  double local_sq = 0, sum_sq = 0;
};

// A shared host store's split of the optimizer update: group g is updated by node rank
// g mod (node ranks); every group by every rank without a shared store (node null).
inline bool shared_updates_group(const Comm* node, size_t group) {
  return !node || int(group % size_t(node->size())) == node->rank();
}

// What the trainer asks of a data-parallel reduction, over host buffers (CommGradReduction) or
// on the device (offload/reduce/device_reduction.h).
class DataParallelReduction : public GradReduction {
 public:
  virtual CommReductionStats stats() const = 0;
  // Collect CommDiagnostics during the next micro-batches; end returns them.
  virtual void diagnostics_begin() = 0;
  virtual CommDiagnostics diagnostics_end() = 0;
};

class CommGradReduction final : public DataParallelReduction {
 public:
  // comm: host buffers (comm.device_buffers() false). tied_head: the lm_head is the embedding
  // table. dev: its counters tell how much of each collective the device's work hid.
  // node: non-null when the ranks of each node share one host store (distributed.shared_host_store;
  // the comm of this rank's node, Comm::split_node): the node's first rank alone writes the
  // accumulation (every node's from the same all-reduced bits, so the nodes' stores stay equal),
  // and the groups' updates are split round-robin over the node's ranks.
  CommGradReduction(Comm& comm, bool tied_head, Device& dev, Comm* node = nullptr);

  void begin_micro_batch(const int32_t* ids, int64_t n) override;
  void add_dense(float* dst, float* staging, size_t n) override;
  void add_head_rows(float* table_grad, float* staging, int64_t v0, int64_t rows, int64_t C) override;
  void add_embedding(float* table_grad, const float* dx0, const int32_t* ids, int64_t n, int64_t C) override;

  CommReductionStats stats() const override;
  bool shared_store() const override { return shared_; }
  bool updates_group(size_t group) const override { return shared_updates_group(node_, group); }
  void all_ranks_here() override;
  // (one extra pass over each bucket)
  void diagnostics_begin() override;
  CommDiagnostics diagnostics_end() override;

 private:
  void all_reduce(float* data, size_t n);
  void all_reduce(double* data, size_t n);
  void all_gather(float* all, const float* mine, size_t n);  // all: (size, n)
  void gather_ids();                                          // ids_all_ and rows_, once per micro-batch
  template <class F>
  void timed(size_t bytes, F&& collective);

  Comm& comm_;
  const bool tied_;
  Comm* const node_;
  const bool shared_;
  bool writes() const { return !shared_ || node_->rank() == 0; }  // this rank writes the accumulation
  Device& dev_;
  const int rank_, size_;
  std::vector<int32_t> ids_;              // this rank's micro-batch tokens
  bool gathered_ = false;
  std::vector<int32_t> ids_all_;          // (size, n): every rank's tokens
  std::vector<int64_t> rows_;             // tied: sorted distinct embedding rows the round touches
  int64_t C_ = 0;
  std::vector<float> old_rows_, own_rows_;  // tied: (rows, C) G before this round, this rank's h
  bool diagnose_ = false;
  CommDiagnostics diag_;
  mutable std::mutex stats_mutex_;
  CommReductionStats stats_;
};

}  // namespace strata
