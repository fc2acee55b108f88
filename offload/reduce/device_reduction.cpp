// Data-parallel gradient reduction on the device (device_reduction.h).
#include "offload/reduce/device_reduction.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "src/core/error.h"
#include "src/device/host_ops.h"

namespace strata {
namespace {

constexpr int64_t kExactIdLimit = int64_t(1) << 24;  // every integer below it is an exact f32

}  // namespace

DeviceGradReduction::DeviceGradReduction(Comm& comm, bool tied_head, Device& dev, Comm* node)
    : comm_(comm), tied_(tied_head), node_(node), dev_(dev), rank_(comm.rank()), size_(comm.size()),
      local_done_(dev.event_create()), reduced_(dev.event_create()) {
  STRATA_CHECK(comm.device_buffers(), "the device gradient reduction needs a comm over device buffers (nccl); the ",
               comm.name(), " comm reduces host buffers: use the host reduction (offload/reduce/comm_reduction.h)");
  reserve(diag_, 2, "data-parallel diagnostics");
}

DeviceGradReduction::~DeviceGradReduction() {
  for (DeviceArray<float>* a : {&ids_, &dx_all_, &own_rows_, &diag_}) release(*a);
}

template <class T>
void DeviceGradReduction::reserve(DeviceArray<T>& a, size_t count, const char* what) {
  if (count <= a.count) return;
  release(a);
  a.dev = static_cast<T*>(dev_.alloc(count * sizeof(T), what));
  a.host = static_cast<T*>(dev_.alloc_pinned(count * sizeof(T)));
  a.count = count;
}

template <class T>
void DeviceGradReduction::release(DeviceArray<T>& a) {
  if (a.dev) dev_.free(a.dev);
  if (a.host) dev_.free_pinned(a.host);
  a = {};
}

CommTicket DeviceGradReduction::all_reduce(float* data, size_t n, Stream s) {
  stats_.reduced_bytes += n * sizeof(float);
  stats_.collectives += 1;
  return comm_.all_reduce_sum(data, n, s);
}

// On the trainer thread, the engine's streams idle (the host queue drained after the last
// micro-batch, whose tasks waited for every copy): every rank's token ids, synchronously.
void DeviceGradReduction::begin_micro_batch(const int32_t* ids, int64_t n) {
  const auto t0 = std::chrono::steady_clock::now();
  double count[2] = {double(n), double(n) * double(n)};
  comm_.all_reduce_sum(count, 2).wait();
  stats_.collectives += 1;
  stats_.reduced_bytes += sizeof count;
  STRATA_CHECK(count[0] == double(n) * size_ && count[1] == double(n) * double(n) * size_, "rank ", rank_,
               ": the ranks' micro-batches hold different token counts (this rank ", n, ", all ranks ", count[0],
               "); data-parallel training needs micro-batches of one shape (micro_batch_size rows of sequence_len)");
  n_ = n;
  const size_t all = size_t(size_) * size_t(n);
  reserve(ids_, all, "data-parallel token ids");
  std::fill(ids_.host, ids_.host + all, 0.f);
  for (int64_t t = 0; t < n; ++t) {
    STRATA_CHECK(ids[t] >= 0 && ids[t] < kExactIdLimit, "token id ", ids[t], " is outside [0, 2^24): the device "
                 "gradient reduction exchanges token ids as f32; use distributed.backend = \"mpi\"");
    ids_.host[size_t(rank_) * size_t(n) + size_t(t)] = float(ids[t]);
  }
  const Stream s = Stream::d2h;
  dev_.copy_h2d(ids_.dev, ids_.host, all * sizeof(float), s);
  CommTicket t = all_reduce(ids_.dev, all, s);
  dev_.copy_d2h(ids_.host, ids_.dev, all * sizeof(float), s);
  t.wait();
  dev_.stream_synchronize(s);
  ids_all_.resize(all);
  for (size_t i = 0; i < all; ++i) ids_all_[i] = int32_t(ids_.host[i]);
  STRATA_ASSERT(std::equal(ids, ids + n, ids_all_.begin() + std::ptrdiff_t(size_t(rank_) * size_t(n))),
                "the token-id exchange changed this rank's ids");
  if (tied_) {
    rows_.assign(ids_all_.begin(), ids_all_.end());
    std::sort(rows_.begin(), rows_.end());
    rows_.erase(std::unique(rows_.begin(), rows_.end()), rows_.end());
  }
  first_head_chunk_ = true;
  stats_.comm_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// This rank's lm_head rows at the round's touched rows inside the chunk (before the all-reduce
// sums them), into its block of own_rows (size, rows, C); runs of consecutive rows in one copy.
void DeviceGradReduction::copy_own_rows(const GradLanding& l, const float* grad, Stream s) {
  const size_t C = size_t(l.C), block = size_t(rank_) * rows_.size() * C;
  const auto lo = std::lower_bound(rows_.begin(), rows_.end(), l.v0);
  const auto hi = std::lower_bound(rows_.begin(), rows_.end(), l.v0 + l.rows);
  for (auto it = lo; it != hi;) {
    auto end = it + 1;
    while (end != hi && *end == *(end - 1) + 1) ++end;
    const size_t k = size_t(it - rows_.begin()), run = size_t(end - it);
    dev_.copy_d2d(own_rows_.dev + block + k * C, grad + size_t(*it - l.v0) * C, run * C * sizeof(float), s);
    it = end;
  }
}

// acc += grad . grad (f32, on the compute stream).
void DeviceGradReduction::dot_into(float* acc, const float* grad, size_t n) {
  dev_.matmul(acc, grad, grad, DType::f32, 1, 1, int64_t(n), false, false, 1.f, Stream::compute);
}

CommTicket DeviceGradReduction::on_device(const GradLanding& l, float* grad, size_t n, Stream s) {
  if (l.kind == GradLanding::embedding) {
    STRATA_ASSERT(l.rows == n_ && n == size_t(n_ * l.C), "the embedding's d x0 is not the micro-batch's");
    const size_t nc = size_t(n_ * l.C), all = size_t(size_) * nc;
    reserve(dx_all_, all, "data-parallel d x0 of every rank");
    dev_.memset_zero(dx_all_.dev, all * sizeof(float), s);
    dev_.copy_d2d(dx_all_.dev + size_t(rank_) * nc, grad, nc * sizeof(float), s);
    if (tied_ && !rows_.empty()) {
      const size_t own = size_t(size_) * rows_.size() * size_t(l.C);
      all_reduce(own_rows_.dev, own, s);
      dev_.copy_d2h(own_rows_.host, own_rows_.dev, own * sizeof(float), s);
    }
    CommTicket t = all_reduce(dx_all_.dev, all, s);
    dev_.copy_d2h(dx_all_.host, dx_all_.dev, all * sizeof(float), s);
    return t;  // (the own-rows collective came first on s: done when this one is)
  }
  if (tied_ && l.kind == GradLanding::head_chunk && !rows_.empty()) {
    const size_t own = size_t(size_) * rows_.size() * size_t(l.C);
    if (first_head_chunk_) {
      reserve(own_rows_, own, "data-parallel tied lm_head rows");
      dev_.memset_zero(own_rows_.dev, own * sizeof(float), s);
      first_head_chunk_ = false;
    }
    copy_own_rows(l, grad, s);
  }
  if (diagnose_) {  // |g_r|^2 before the all-reduce, |sum_r g_r|^2 after it
    dot_into(diag_.dev, grad, n);
    dev_.event_record(*local_done_, Stream::compute);
    dev_.stream_wait_event(s, *local_done_);
  }
  CommTicket t = all_reduce(grad, n, s);
  if (diagnose_) {
    dev_.event_record(*reduced_, s);
    dev_.stream_wait_event(Stream::compute, *reduced_);
    dot_into(diag_.dev + 1, grad, n);
    dev_.event_record(*local_done_, Stream::compute);
    dev_.stream_wait_event(s, *local_done_);  // the copy (and the slot's reuse) after the read
  }
  return t;
}

void DeviceGradReduction::add_dense(float* dst, float* staging, size_t n) {
  if (writes()) grad_accumulate(dst, staging, n);
}

void DeviceGradReduction::all_ranks_here() {
  if (node_) node_->barrier();
}

void DeviceGradReduction::add_head_rows(float* table_grad, float* staging, int64_t v0, int64_t rows, int64_t C) {
  if (!writes()) return;
  if (tied_) {  // keep G on the touched rows: add_embedding redoes their chain
    if (old_rows_.size() != rows_.size() * size_t(C)) old_rows_.assign(rows_.size() * size_t(C), 0.f);
    const auto lo = std::lower_bound(rows_.begin(), rows_.end(), v0);
    const auto hi = std::lower_bound(rows_.begin(), rows_.end(), v0 + rows);
    for (auto it = lo; it != hi; ++it)
      std::memcpy(&old_rows_[size_t(it - rows_.begin()) * size_t(C)], table_grad + *it * C, size_t(C) * sizeof(float));
  }
  grad_accumulate(table_grad + v0 * C, staging, size_t(rows * C));
}

void DeviceGradReduction::add_embedding(float* table_grad, const float*, const int32_t* ids, int64_t n, int64_t C) {
  STRATA_ASSERT(n == n_ && std::equal(ids, ids + n, ids_all_.begin() + std::ptrdiff_t(size_t(rank_) * size_t(n))),
                "the embedding's token ids are not the micro-batch's");
  if (!writes()) return;
  const size_t nc = size_t(n * C), R = rows_.size();
  if (tied_)  // the touched rows back to G before the round
    for (size_t k = 0; k < R; ++k)
      std::memcpy(table_grad + rows_[k] * C, &old_rows_[k * size_t(C)], size_t(C) * sizeof(float));
  for (int r = 0; r < size_; ++r) {
    if (tied_)
      for (size_t k = 0; k < R; ++k)
        grad_accumulate(table_grad + rows_[k] * C, own_rows_.host + (size_t(r) * R + k) * size_t(C), size_t(C));
    host_embedding_backward(table_grad, dx_all_.host + size_t(r) * nc, ids_all_.data() + size_t(r) * size_t(n), n, C);
  }
}

void DeviceGradReduction::diagnostics_begin() {
  dev_.memset_zero(diag_.dev, 2 * sizeof(float), Stream::compute);
  diagnose_ = true;
}

CommDiagnostics DeviceGradReduction::diagnostics_end() {
  diagnose_ = false;
  dev_.copy_d2h(diag_.host, diag_.dev, 2 * sizeof(float), Stream::compute);
  dev_.stream_synchronize(Stream::compute);
  return {double(diag_.host[0]), double(diag_.host[1])};
}

}  // namespace strata
