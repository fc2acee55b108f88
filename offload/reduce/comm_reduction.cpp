// Data-parallel gradient reduction (comm_reduction.h).
#include "offload/reduce/comm_reduction.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "offload/state/adamw.h"
#include "src/core/error.h"
#include "src/device/host_ops.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;

// Device time that would have passed anyway: the compute stream running or blocked on another
// stream.
double device_active_s(const DeviceCounters& c) { return c.compute_busy_s + c.stream_wait_s[int(Stream::compute)]; }

}  // namespace

CommGradReduction::CommGradReduction(Comm& comm, bool tied_head, Device& dev, Comm* node)
    : comm_(comm), tied_(tied_head), node_(node), shared_(node != nullptr), dev_(dev), rank_(comm.rank()),
      size_(comm.size()) {
  STRATA_CHECK(!comm.device_buffers(), "data-parallel training reduces gradients in host memory; the ",
               comm.name(), " comm takes device buffers: set distributed.backend = \"mpi\"");
}

template <class F>
void CommGradReduction::timed(size_t bytes, F&& collective) {
  const auto t0 = Clock::now();
  const double d0 = device_active_s(dev_.counters());
  collective();
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  const double device = device_active_s(dev_.counters()) - d0;
  std::lock_guard<std::mutex> lock(stats_mutex_);
  stats_.reduced_bytes += bytes;
  stats_.collectives += 1;
  stats_.comm_s += wall;
  stats_.hidden_s += std::min(wall, std::max(0.0, device));
}

void CommGradReduction::all_reduce(float* data, size_t n) {
  timed(n * sizeof(float), [&] { comm_.all_reduce_sum(data, n).wait(); });
}

void CommGradReduction::all_reduce(double* data, size_t n) {
  timed(n * sizeof(double), [&] { comm_.all_reduce_sum(data, n).wait(); });
}

void CommGradReduction::all_gather(float* all, const float* mine, size_t n) {
  std::fill(all, all + size_t(size_) * n, 0.f);
  std::memcpy(all + size_t(rank_) * n, mine, n * sizeof(float));
  all_reduce(all, size_t(size_) * n);
}

CommReductionStats CommGradReduction::stats() const {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  return stats_;
}

void CommGradReduction::begin_micro_batch(const int32_t* ids, int64_t n) {
  ids_.assign(ids, ids + n);
  gathered_ = false;
}

// Every rank's token ids (exact in doubles), after checking that every rank has as many.
void CommGradReduction::gather_ids() {
  if (gathered_) return;
  const double n = double(ids_.size());
  double count[2] = {n, n * n};
  all_reduce(count, 2);
  STRATA_CHECK(count[0] == n * size_ && count[1] == n * n * size_, "rank ", rank_, ": the ranks' micro-batches "
               "hold different token counts (this rank ", ids_.size(), ", all ranks ", count[0], "); data-parallel "
               "training needs micro-batches of one shape (micro_batch_size rows of sequence_len)");
  std::vector<double> all(size_t(size_) * ids_.size(), 0.0);
  std::copy(ids_.begin(), ids_.end(), all.begin() + int64_t(size_t(rank_) * ids_.size()));
  all_reduce(all.data(), all.size());
  ids_all_.assign(all.begin(), all.end());
  if (tied_) {
    rows_.assign(ids_all_.begin(), ids_all_.end());
    std::sort(rows_.begin(), rows_.end());
    rows_.erase(std::unique(rows_.begin(), rows_.end()), rows_.end());
  }
  gathered_ = true;
}

void CommGradReduction::add_dense(float* dst, float* staging, size_t n) {
  if (size_ == 1) return grad_accumulate(dst, staging, n);
  if (diagnose_) diag_.local_sq += sum_of_squares(staging, int64_t(n));
  // G + g0 (addition commutes bit for bit); with shared stores rank 0 reads its node's G, which
  // every node's store holds alike
  if (rank_ == 0) grad_accumulate(staging, dst, n);
  all_reduce(staging, n);
  if (diagnose_ && writes()) {
    double sq = 0;
#pragma omp parallel for reduction(+ : sq) schedule(static)
    for (size_t i = 0; i < n; ++i) {
      const double d = double(staging[i]) - double(dst[i]);
      sq += d * d;
    }
    diag_.sum_sq += sq;
  }
  if (writes()) std::memcpy(dst, staging, n * sizeof(float));
}

void CommGradReduction::all_ranks_here() {
  if (shared_) timed(0, [&] { node_->barrier(); });
}

// Called by the trainer between steps, with the engine's host queue idle.
void CommGradReduction::diagnostics_begin() {
  diagnose_ = true;
  diag_ = {};
}

CommDiagnostics CommGradReduction::diagnostics_end() {
  diagnose_ = false;
  return diag_;
}

void CommGradReduction::add_head_rows(float* table_grad, float* staging, int64_t v0, int64_t rows, int64_t C) {
  if (tied_ && size_ > 1) {  // keep G and this rank's h on the rows the round's tokens touch
    gather_ids();
    if (C_ != C || old_rows_.size() != rows_.size() * size_t(C)) {
      C_ = C;
      old_rows_.assign(rows_.size() * size_t(C), 0.f);
      own_rows_.assign(rows_.size() * size_t(C), 0.f);
    }
    const auto lo = std::lower_bound(rows_.begin(), rows_.end(), v0);
    const auto hi = std::lower_bound(rows_.begin(), rows_.end(), v0 + rows);
    for (auto it = lo; it != hi; ++it) {
      const size_t k = size_t(it - rows_.begin());
      if (writes()) std::memcpy(&old_rows_[k * size_t(C)], table_grad + *it * C, size_t(C) * sizeof(float));
      std::memcpy(&own_rows_[k * size_t(C)], staging + (*it - v0) * C, size_t(C) * sizeof(float));
    }
  }
  add_dense(table_grad + v0 * C, staging, size_t(rows * C));
}

void CommGradReduction::add_embedding(float* table_grad, const float* dx0, const int32_t* ids, int64_t n,
                                      int64_t C) {
  if (size_ == 1) return host_embedding_backward(table_grad, dx0, ids, n, C);
  gather_ids();
  STRATA_ASSERT(size_t(n) == ids_.size() && std::equal(ids, ids + n, ids_.begin()),
                "the embedding's token ids are not the micro-batch's");
  const size_t nc = size_t(n * C);
  std::vector<float> dx_all(size_t(size_) * nc);
  all_gather(dx_all.data(), dx0, nc);
  std::vector<float> own_all;
  if (tied_) {  // (all-gathers first: every rank takes part; shared store: rank 0 alone writes)
    STRATA_ASSERT(C_ == C && own_rows_.size() == rows_.size() * size_t(C), "tied head rows were not kept");
    own_all.resize(size_t(size_) * own_rows_.size());
    all_gather(own_all.data(), own_rows_.data(), own_rows_.size());
    if (!writes()) {
      gathered_ = false;
      return;
    }
    for (size_t k = 0; k < rows_.size(); ++k)  // the touched rows back to G before the round
      std::memcpy(table_grad + rows_[k] * C, &old_rows_[k * size_t(C)], size_t(C) * sizeof(float));
  }
  if (!writes()) {
    gathered_ = false;
    return;
  }
  for (int r = 0; r < size_; ++r) {
    if (tied_)
      for (size_t k = 0; k < rows_.size(); ++k)
        grad_accumulate(table_grad + rows_[k] * C, &own_all[(size_t(r) * rows_.size() + k) * size_t(C)], size_t(C));
    host_embedding_backward(table_grad, dx_all.data() + size_t(r) * nc, ids_all_.data() + size_t(r) * size_t(n), n, C);
  }
  gathered_ = false;
}

}  // namespace strata
