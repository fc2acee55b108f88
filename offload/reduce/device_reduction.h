// Data-parallel gradient reduction on the device (DESIGN §8), for a Comm with device buffers
// (NCCL): each gradient is all-reduced where it lands on the device, on the d2h stream right
// before its device -> host copy (grad_reduction.h on_device), so the collective of layer i runs
// while the compute stream goes on with layer i - 1; the copy then brings the ranks' sum, and
// the host adds it into the fp32 accumulation. Every NCCL call is made on the trainer thread, in
// the engine's fixed landing order, so every rank issues the same collectives in the same order.
//
// What crosses between ranks per micro-batch: every dense bucket once (the layers, the final norm,
// the lm_head chunks: the model's gradient, as an in-place all-reduce), the token ids (as f32,
// exact below 2^24) and d x0 of every rank (an all-gather: an all-reduce of a zero-filled
// (ranks, tokens, C) buffer, x + 0 being exact), and with a tied head this rank's lm_head rows
// at the tokens the round touches.
//
// Bit-identity with one process accumulating the ranks' micro-batches one after another (rank r
// holds micro-batch r of each round of N):
//   dense   the host adds S = g0 + g1 + ... (NCCL's sum) to the accumulation G: G + S. One process
//           computes ((G + g0) + g1) + .... For N = 2 and one micro-batch per rank and step (G is
//           +0 when the round lands) both are g0 + g1 bit for bit (a + b = b + a; +0 + x = x, and
//           the host accumulation never holds -0); with more rounds or more ranks the two differ
//           by rounding only (the order of the additions is NCCL's, comm.h).
//   embedding  every rank scatters every rank's d x0 by its token ids in rank order, as one
//           process does: exact for any N and any number of rounds.
//   tied lm_head  the rows no token of the round touches get G + S as above; the touched rows are
//           put back to G and the chain ((G + h0) + e0) + h1 + e1 ... is redone there from every
//           rank's own rows h_r (gathered before the all-reduce) and d x0: exact as the embedding.
// The device memory this adds: (ranks x tokens x C) f32 for d x0 and, tied, (ranks x touched rows
// x C) f32, allocated at the first micro-batch (and grown, never shrunk).
#pragma once
#include <memory>
#include <vector>

#include "offload/reduce/comm_reduction.h"

namespace strata {

class DeviceGradReduction final : public DataParallelReduction {
 public:
  // comm: device buffers (comm.device_buffers()); dev: the device whose streams it runs on.
  // node: non-null when the ranks of each node share one host store (distributed.shared_host_store;
  // the node's comm, host buffers, for all_ranks_here): every rank gets the same all-reduced bits
  // on its device, the node's first rank alone adds them into the node's store (so every node's
  // store holds the same), and the optimizer update is split over the node's ranks.
  DeviceGradReduction(Comm& comm, bool tied_head, Device& dev, Comm* node = nullptr);
  ~DeviceGradReduction() override;

  void begin_micro_batch(const int32_t* ids, int64_t n) override;
  CommTicket on_device(const GradLanding& landing, float* grad, size_t n, Stream s) override;
  void add_dense(float* dst, float* staging, size_t n) override;
  void add_head_rows(float* table_grad, float* staging, int64_t v0, int64_t rows, int64_t C) override;
  void add_embedding(float* table_grad, const float* dx0, const int32_t* ids, int64_t n, int64_t C) override;

  // reduced_bytes and collectives count the device collectives; comm_s is the time the trainer
  // thread blocked in them (the token-id exchange); the gradient all-reduces run on the d2h
  // stream and show in the engine's stream waits, not here (hidden_s stays 0).
  CommReductionStats stats() const override { return stats_; }
  // local_sq and sum_sq from device dot products (f32) of each dense bucket before and after its
  // all-reduce, on the compute stream: diagnostic steps only.
  void diagnostics_begin() override;
  CommDiagnostics diagnostics_end() override;
  bool shared_store() const override { return node_ != nullptr; }
  bool updates_group(size_t group) const override { return shared_updates_group(node_, group); }
  void all_ranks_here() override;

 private:
  bool writes() const { return !node_ || node_->rank() == 0; }  // this rank writes the accumulation
  template <class T>
  struct DeviceArray {  // a device buffer and its pinned host twin, grown on demand
    T* dev = nullptr;
    T* host = nullptr;
    size_t count = 0;
  };
  template <class T>
  void reserve(DeviceArray<T>& a, size_t count, const char* what);
  template <class T>
  void release(DeviceArray<T>& a);
  CommTicket all_reduce(float* data, size_t n, Stream s);
  void copy_own_rows(const GradLanding& landing, const float* grad, Stream s);
  void dot_into(float* acc, const float* grad, size_t n);

  Comm& comm_;
  const bool tied_;
  Comm* const node_;
  Device& dev_;
  const int rank_, size_;
  int64_t n_ = 0;                         // tokens per micro-batch (every rank)
  std::vector<int32_t> ids_all_;          // (size, n): every rank's tokens
  std::vector<int64_t> rows_;             // tied: sorted distinct embedding rows the round touches
  std::vector<float> old_rows_;           // tied: (rows, C) G before this round (host)
  bool first_head_chunk_ = true;
  DeviceArray<float> ids_, dx_all_, own_rows_;  // ids_: (size, n) as f32
  DeviceArray<float> diag_;                     // (2): sum of local squares, of summed squares
  std::unique_ptr<Event> local_done_, reduced_;
  bool diagnose_ = false;
  CommReductionStats stats_;
};

}  // namespace strata
