// The CPU backend: a real device, not a mock (DESIGN §5). Device memory is one reserved
// mapping carved by the budgeted Arena and poisoned with NaN on allocation; each stream is a
// worker thread running its queue in order; events are real; copies really copy, and the
// host<->device link can be throttled to a set bandwidth so streaming schedules are exercised
// and timed as they would be over PCIe.
//
// Errors, as CUDA's sticky errors: an exception thrown by queued work (bad input found by a
// kernel, a failed allocation, STRATA_FAULT=throw@task) is kept by its stream, which skips its
// later work until stream_synchronize rethrows it. Event records always run: one recorded after
// the failure completes marked failed with that error, so a stream waiting on it fails too (and
// skips), and event_synchronize rethrows it. No waiter is left blocked by a failure.
#include <sys/mman.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <atomic>
#include <mutex>
#include <thread>

#include "kernels/cpu/attention_cached.h"
#include "kernels/cpu/dropout.h"
#include "kernels/cpu/nf4.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/zo.h"
#include "src/core/error.h"
#include "src/core/fault.h"
#include "src/core/task_worker.h"
#include "src/core/tensor.h"
#include "src/core/threads.h"
#include "src/device/arena.h"
#include "src/device/device.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;


// An event's state, shared by the Event and the tasks that record or wait on it: an Event may be
// destroyed with such tasks still queued (as cudaEventDestroy allows), and they still run.
struct CpuEventState {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0;   // generation of the latest record()
  uint64_t completed = 0;  // generation the stream has reached
  uint64_t failed = 0;     // the latest generation completed after a failure on its stream
  std::exception_ptr error;  // that failure

  // Until generation gen has completed; rethrows the failure of the work before it (or before a
  // later record that completed first: the stream failed either way).
  void wait_for(uint64_t gen) {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return completed >= gen; });
    if (gen > 0 && failed >= gen && error) std::rethrow_exception(error);
  }
  void complete(uint64_t gen, std::exception_ptr err) noexcept {
    std::lock_guard lock(mu);
    completed = std::max(completed, gen);
    if (err) {
      failed = std::max(failed, gen);
      error = std::move(err);
    }
    cv.notify_all();
  }
};

class CpuEvent final : public Event {
 public:
  const std::shared_ptr<CpuEventState> state = std::make_shared<CpuEventState>();
};

// A stream: tasks in order on one thread; after a failed task the rest are skipped (event
// records still run, completing their events marked failed) until stream_synchronize rethrows
// the error.
class StreamWorker : public TaskWorker {
 public:
  StreamWorker() : TaskWorker(AfterError::skip_until_wait) {}
};

class CpuDevice final : public ArenaDevice {
 public:
  explicit CpuDevice(const DeviceOptions& o) : link_bytes_per_s_(o.link_bytes_per_s) {
    STRATA_CHECK(o.memory_bytes > 0, "[device] memory must be positive");
    mapping_bytes_ = o.memory_bytes;
    void* base = mmap(nullptr, mapping_bytes_, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    STRATA_CHECK_BUDGET(base != MAP_FAILED, "cannot reserve ", o.memory_bytes,
                        " bytes for the CPU device arena: ", std::strerror(errno),
                        "; lower [device] memory");
    base_ = static_cast<char*>(base);
    arena_init(base_, mapping_bytes_);
    // The kernels' threads, checked now that the arena's address space is taken (exit 3 naming
    // device.cpu_threads and the ulimits when they cannot all be made), and the compute stream's
    // OpenMP team made, so that no later kernel has to create a thread (src/core/threads.h). The
    // copy streams run no parallel region on this backend.
    try {
      cpu_threads_start();
      StreamWorker& compute = worker(Stream::compute);
      compute.wait(compute.enqueue([] { cpu_threads_start_team(); }));
    } catch (...) {
      munmap(base_, mapping_bytes_);
      throw;
    }
  }
  ~CpuDevice() override {
    for (auto& w : workers_) w.drain_quiet();
    munmap(base_, mapping_bytes_);
  }

  std::string name() const override { return "cpu"; }

  void* alloc(size_t bytes, const std::string& tensor) override {
    char* p = arena_alloc(bytes, tensor);
    std::memset(p, 0xff, bytes);  // NaN poison: reading memory nobody wrote shows up in results
    return p;
  }
  // Host memory is what the copies use either way here; STRATA_FAKE_PINNED_FAIL=1 makes every
  // pinned allocation take the pageable fallback so its accounting and warning can be tested.
  void* alloc_pinned(size_t bytes) override {
    if (pinned_fail_forced()) return pageable_fallback_alloc(bytes, "STRATA_FAKE_PINNED_FAIL=1");
    // STRATA_FAULT=alloc@host-alloc: the allocation fails as malloc's would
    void* p = fault_point("host-alloc") == FaultKind::alloc
                  ? nullptr
                  : std::aligned_alloc(4096, (std::max<size_t>(bytes, 1) + 4095) / 4096 * 4096);
    STRATA_CHECK_BUDGET(p, "cannot allocate ", format_bytes(bytes), " of pinned host memory: the host is out of "
                        "memory (or of address space: ulimit -v); lower the host memory the recipe needs (a "
                        "smaller model, micro_batch_size or sequence_len)");
    return p;
  }
  void free_pinned(void* p) override {
    if (!pageable_fallback_free(p)) std::free(p);
  }
  bool register_host(void*, size_t bytes) override {
    if (!pinned_fail_forced()) return true;
    pageable_warning(bytes, "STRATA_FAKE_PINNED_FAIL=1");
    return false;
  }
  void unregister_host(void*) override {}

  std::unique_ptr<Event> event_create() override { return std::make_unique<CpuEvent>(); }
  void event_record(Event& e, Stream s) override {
    const std::shared_ptr<CpuEventState>& ev = static_cast<CpuEvent&>(e).state;
    uint64_t gen;
    {
      std::lock_guard lock(ev->mu);
      gen = ++ev->recorded;
    }
    try {
      // a marker: runs even while the stream skips after a failure, and passes the failure on
      worker(s).enqueue_marker([ev, gen](std::exception_ptr failure) { ev->complete(gen, std::move(failure)); });
    } catch (...) {  // not queued (out of memory): nothing may wait for this generation in vain
      ev->complete(gen, std::current_exception());
      throw;
    }
  }
  void stream_wait_event(Stream s, Event& e) override {
    const std::shared_ptr<CpuEventState>& ev = static_cast<CpuEvent&>(e).state;
    uint64_t gen;
    {
      std::lock_guard lock(ev->mu);
      gen = ev->recorded;
    }
    worker(s).enqueue([this, ev, gen, si = int(s)] {
      auto t0 = Clock::now();
      auto count = [&] {
        const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
        std::lock_guard lock(op_mu_);  // counters() reads it from other threads, mid-step too
        stream_wait_s_[si] += dt;
      };
      try {
        ev->wait_for(gen);  // rethrows the recording stream's failure: this stream fails too
      } catch (...) {
        count();
        throw;
      }
      count();
    });
  }
  void event_synchronize(Event& e) override {
    CpuEventState& ev = *static_cast<CpuEvent&>(e).state;
    uint64_t gen;
    {
      std::lock_guard lock(ev.mu);
      gen = ev.recorded;
    }
    ev.wait_for(gen);
  }
  void stream_synchronize(Stream s) override { worker(s).drain(); }

  void copy_h2d(void* dst, const void* src, size_t bytes, Stream s) override {
    check_device_range(dst, bytes, "copy_h2d destination");
    h2d_bytes_ += bytes;
    enqueue_copy(s, dst, src, bytes);
  }
  void copy_d2h(void* dst, const void* src, size_t bytes, Stream s) override {
    check_device_range(src, bytes, "copy_d2h source");
    d2h_bytes_ += bytes;
    enqueue_copy(s, dst, src, bytes);
  }
  void copy_d2d(void* dst, const void* src, size_t bytes, Stream s) override {
    check_device_range(dst, bytes, "copy_d2d destination");
    check_device_range(src, bytes, "copy_d2d source");
    enqueue_task(s, [=] { std::memcpy(dst, src, bytes); });
  }
  void memset_zero(void* dst, size_t bytes, Stream s) override {
    check_device_range(dst, bytes, "memset destination");
    enqueue_task(s, [=] { std::memset(dst, 0, bytes); });
  }
  DeviceCounters counters() const override {
    DeviceCounters c;
    c.h2d_bytes = h2d_bytes_;
    c.d2h_bytes = d2h_bytes_;
    std::lock_guard lock(op_mu_);
    for (int k = 0; k < int(OpKind::count); ++k) c.op_s[k] = op_s_[k];
    for (int k = 0; k < kStreamCount; ++k) c.stream_wait_s[k] = stream_wait_s_[k];
    // busy means working, as on CUDA: a stream's time blocked in stream_wait_event is not busy
    c.compute_busy_s = std::max(0.0, workers_[0].busy_s() - c.stream_wait_s[0]);
    c.h2d_busy_s = std::max(0.0, workers_[1].busy_s() - c.stream_wait_s[1]);
    c.d2h_busy_s = std::max(0.0, workers_[2].busy_s() - c.stream_wait_s[2]);
    return c;
  }

  DevicePeak peak_flops(DType ab) override { return cpu_measured_peak(ab); }

  // ---- ops ----
  void matmul(float* c, const void* a, const void* b, DType ab, int64_t m, int64_t n,
              int64_t k, bool ta, bool tb, float beta, Stream s) override {
    STRATA_ASSERT(ab == DType::f32 || ab == DType::bf16, "matmul inputs must be f32 or bf16");
    enqueue_op(s, OpKind::matmul, [=] {
      if (ab == DType::f32)
        cpu::matmul_f32(c, static_cast<const float*>(a), static_cast<const float*>(b), m, n, k, ta, tb, beta);
      else
        cpu::matmul_bf16(c, static_cast<const bf16*>(a), static_cast<const bf16*>(b), m, n, k, ta, tb, beta);
    });
  }
  void rmsnorm_forward(float* out, float* rstd, const float* in, const float* weight,
                       int64_t n, int64_t c, float eps, Stream s) override {
    enqueue_op(s, OpKind::norm, [=] { cpu::rmsnorm_forward(out, rstd, in, weight, n, c, eps); });
  }  void rmsnorm_forward_bf16(float* out, bf16* out_b, float* rstd, const float* in, const float* weight, int64_t n,
                            int64_t c, float eps, Stream s) override {
    enqueue_op(s, OpKind::norm, [=] { cpu::rmsnorm_forward_bf16(out, out_b, rstd, in, weight, n, c, eps); });
  }

  void rmsnorm_backward(float* din, float* dweight, const float* dout, const float* in,
                        const float* weight, const float* rstd, int64_t n, int64_t c, Stream s) override {
    enqueue_op(s, OpKind::norm, [=] { cpu::rmsnorm_backward(din, dweight, dout, in, weight, rstd, n, c); });
  }
  void rope_forward(float* out, const float* in, const int32_t* pos,
                    const float* inv_freq, int64_t n, int64_t nh, int64_t d, int64_t rot, Stream s) override {
    enqueue_op(s, OpKind::rope, [=] { cpu::rope_forward(out, in, pos, inv_freq, n, nh, d, rot); });
  }
  void rope_backward(float* din, const float* dout, const int32_t* pos,
                     const float* inv_freq, int64_t n, int64_t nh, int64_t d, int64_t rot, Stream s) override {
    enqueue_op(s, OpKind::rope, [=] { cpu::rope_backward(din, dout, pos, inv_freq, n, nh, d, rot); });
  }
  void swiglu_forward(float* out, const float* gate, const float* up, int64_t n, Stream s) override {
    enqueue_op(s, OpKind::elementwise, [=] { cpu::swiglu_forward(out, gate, up, n); });
  }
  void swiglu_forward_bf16(float* out, bf16* out_b, const float* gate, const float* up, int64_t n,
                           Stream s) override {
    enqueue_op(s, OpKind::elementwise, [=] { cpu::swiglu_forward_bf16(out, out_b, gate, up, n); });
  }
  void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                       const float* up, int64_t n, Stream s) override {
    enqueue_op(s, OpKind::elementwise, [=] { cpu::swiglu_backward(dgate, dup, dout, gate, up, n); });
  }
  void swiglu_backward_bf16(bf16* dgate, bf16* dup, const float* dout, const float* gate, const float* up,
                            int64_t n, Stream s) override {
    enqueue_op(s, OpKind::elementwise, [=] { cpu::swiglu_backward_bf16(dgate, dup, dout, gate, up, n); });
  }
  void bias_forward(float* y, const float* b, int64_t n, int64_t o, Stream s) override {
    enqueue_op(s, OpKind::elementwise, [=] { cpu::bias_forward(y, b, n, o); });
  }
  void bias_backward(float* db, const float* dy, int64_t n, int64_t o, Stream s) override {
    enqueue_op(s, OpKind::elementwise, [=] { cpu::bias_backward(db, dy, n, o); });
  }
  void embedding_forward(float* out, const void* table, DType tt, const int32_t* ids,
                         int64_t n, int64_t c, Stream s) override {
    enqueue_op(s, OpKind::embedding, [=] {
      if (tt == DType::f32)
        cpu::embedding_forward(out, static_cast<const float*>(table), ids, n, c);
      else
        cpu::embedding_forward_bf16(out, static_cast<const bf16*>(table), ids, n, c);
    });
  }
  void embedding_backward(float* dtable, const float* dout, const int32_t* ids,
                          int64_t n, int64_t c, Stream s) override {
    enqueue_op(s, OpKind::embedding, [=] { cpu::embedding_backward(dtable, dout, ids, n, c); });
  }
  void attention_forward(float* out, float* lse, const float* q, const float* k,
                         const float* v, const int32_t* doc_start, int64_t b, int64_t t,
                         int64_t h, int64_t hk, int64_t d, float scale, DType dot_type,
                         Stream s, int64_t window) override {
    enqueue_op(s, OpKind::attention,
               [=] { cpu::attention_forward(out, lse, q, k, v, doc_start, b, t, h, hk, d, scale, dot_type, window); });
  }
  void attention_backward(float* dq, float* dk, float* dv, const float* dout,
                          const float* q, const float* k, const float* v, const float* out,
                          const float* lse, const int32_t* doc_start, int64_t b, int64_t t,
                          int64_t h, int64_t hk, int64_t d, float scale, DType dot_type,
                          Stream s, int64_t window) override {
    enqueue_op(s, OpKind::attention, [=] {
      cpu::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, doc_start, b, t, h, hk, d, scale,
                              dot_type, window);
    });
  }
  void attention_cached_forward(float* out, const float* q, const float* k_cache, const float* v_cache,
                                const int32_t* start, int64_t b, int64_t tq, int64_t tcap, int64_t h, int64_t hk,
                                int64_t d, float scale, DType dot_type, Stream s, int64_t window) override {
    enqueue_op(s, OpKind::attention, [=] {
      cpu::attention_cached_forward(out, q, k_cache, v_cache, start, b, tq, tcap, h, hk, d, scale, dot_type, window);
    });
  }
  void lm_head_ce_chunk_stats(double* stats, const float* h, const void* w, DType wt,
                              const int32_t* targets, int64_t n, int64_t c, int64_t v, int64_t v0,
                              int64_t vc, bool first, float* keep_logits, Stream s) override {
    STRATA_ASSERT(wt == DType::f32 || wt == DType::bf16, "lm_head weights must be f32 or bf16");
    enqueue_op(s, OpKind::cross_entropy, [=] {
      if (wt == DType::f32)
        cpu::lm_head_ce_chunk_stats(stats, h, static_cast<const float*>(w), targets, n, c, v, v0, vc, first,
                                    keep_logits);
      else
        cpu::lm_head_ce_chunk_stats_bf16(stats, h, static_cast<const bf16*>(w), targets, n, c, v, v0, vc, first,
                                         keep_logits);
    });
  }
  void lm_head_ce_chunk_stats_entropy(double* stats, double* ent, const float* h, const void* w, DType wt,
                                      const int32_t* targets, int64_t n, int64_t c, int64_t v, int64_t v0,
                                      int64_t vc, bool first, float* keep_logits, Stream s) override {
    STRATA_ASSERT(wt == DType::f32 || wt == DType::bf16, "lm_head weights must be f32 or bf16");
    enqueue_op(s, OpKind::cross_entropy, [=] {
      if (wt == DType::f32)
        cpu::lm_head_ce_chunk_stats_entropy(stats, ent, h, static_cast<const float*>(w), targets, n, c, v, v0, vc,
                                            first, keep_logits);
      else
        cpu::lm_head_ce_chunk_stats_entropy_bf16(stats, ent, h, static_cast<const bf16*>(w), targets, n, c, v, v0,
                                                 vc, first, keep_logits);
    });
  }
  void lm_head_ce_stats_loss(double* loss_sum, const double* stats, const int32_t* targets,
                             int64_t n, int64_t v, Stream s) override {
    enqueue_op(s, OpKind::cross_entropy, [=] {
      int64_t count = 0;
      *loss_sum += cpu::lm_head_ce_stats_loss(&count, stats, targets, n, v);
    });
  }
  void lm_head_ce_chunk_backward(float* dh, float* dw_chunk, const float* h, const void* w,
                                 DType wt, const double* stats, const int32_t* targets, int64_t n,
                                 int64_t c, int64_t v, int64_t v0, int64_t vc, float grad_scale, float* kept_logits,
                                 Stream s) override {
    STRATA_ASSERT(wt == DType::f32 || wt == DType::bf16, "lm_head weights must be f32 or bf16");
    enqueue_op(s, OpKind::cross_entropy, [=] {
      if (wt == DType::f32)
        cpu::lm_head_ce_chunk_backward(dh, dw_chunk, h, static_cast<const float*>(w), stats, targets, n, c,
                                       v, v0, vc, grad_scale, kept_logits);
      else
        cpu::lm_head_ce_chunk_backward_bf16(dh, dw_chunk, h, static_cast<const bf16*>(w), stats, targets,
                                            n, c, v, v0, vc, grad_scale, kept_logits);
    });
  }
  void lm_head_ce_stats_seq_sums(double* seq_sums, const double* stats, const int32_t* targets,
                                 const int32_t* seq, int64_t n, int64_t v, int64_t num_seqs, Stream s) override {
    enqueue_op(s, OpKind::cross_entropy,
               [=] { cpu::lm_head_ce_stats_seq_sums(seq_sums, stats, targets, seq, n, v, num_seqs); });
  }
  void lm_head_ce_chunk_backward_weighted(float* dh, float* dw_chunk, const float* h, const void* w, DType wt,
                                          const double* stats, const int32_t* targets,
                                          const float* token_weight, int64_t n, int64_t c, int64_t v,
                                          int64_t v0, int64_t vc, float grad_scale, float* kept_logits,
                                          Stream s) override {
    STRATA_ASSERT(wt == DType::f32 || wt == DType::bf16, "lm_head weights must be f32 or bf16");
    enqueue_op(s, OpKind::cross_entropy, [=] {
      if (wt == DType::f32)
        cpu::lm_head_ce_chunk_backward_weighted(dh, dw_chunk, h, static_cast<const float*>(w), stats, targets,
                                                token_weight, n, c, v, v0, vc, grad_scale, kept_logits);
      else
        cpu::lm_head_ce_chunk_backward_weighted_bf16(dh, dw_chunk, h, static_cast<const bf16*>(w), stats,
                                                     targets, token_weight, n, c, v, v0, vc, grad_scale,
                                                     kept_logits);
    });
  }
  void add_inplace(float* y, const float* x, int64_t n, Stream s) override {
    enqueue_op(s, OpKind::elementwise, [=] { cpu::add_inplace(y, x, n); });
  }
  void moe_combine_forward(float* out, const float* y, const float* w, const int32_t* token_row, int64_t n, int64_t k,
                           int64_t c, Stream s) override {
    enqueue_op(s, OpKind::elementwise, [=] { cpu::moe_combine_forward(out, y, w, token_row, n, k, c); });
  }
  void moe_combine_backward(float* dy, float* dw, const float* dout, const float* y, const float* w,
                            const int32_t* row_token, int64_t m, int64_t c, Stream s) override {
    enqueue_op(s, OpKind::elementwise, [=] { cpu::moe_combine_backward(dy, dw, dout, y, w, row_token, m, c); });
  }
  void geglu_forward(float* out, const float* gate, const float* up, int64_t n, Stream s) override {
    enqueue_op(s, OpKind::elementwise, [=] { cpu::geglu_forward(out, gate, up, n); });
  }
  void geglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n,
                      Stream s) override {
    enqueue_op(s, OpKind::elementwise, [=] { cpu::geglu_backward(dgate, dup, dout, gate, up, n); });
  }
  void affine(float* y, const float* x, float a, float b, int64_t n, Stream s) override {
    enqueue_op(s, OpKind::elementwise, [=] { cpu::affine(y, x, a, b, n); });
  }
  void cast_f32_to_bf16(bf16* out, const float* in, int64_t n, Stream s) override {
    enqueue_op(s, OpKind::elementwise, [=] { cpu::cast_f32_to_bf16(out, in, n); });
  }
  void nf4_dequantize(void* w, DType w_type, const uint8_t* codes, const uint8_t* qabsmax, const float* absmax,
                      float offset, int64_t n, Stream s) override {
    STRATA_ASSERT(w_type == DType::bf16 || w_type == DType::f32, "NF4 dequantizes to bf16 or f32");
    enqueue_op(s, OpKind::elementwise, [=] {
      if (w_type == DType::bf16) cpu::nf4_dequantize_bf16(static_cast<bf16*>(w), codes, qabsmax, absmax, offset, n);
      else cpu::nf4_dequantize_bf16_as_f32(static_cast<float*>(w), codes, qabsmax, absmax, offset, n);
    });
  }
  void zo_generate(float* z, uint64_t seed, uint32_t tensor, uint64_t offset, int64_t n,
                   Stream s) override {
    enqueue_op(s, OpKind::elementwise, [=] { cpu::zo_generate(z, seed, tensor, offset, n); });
  }
  void zo_perturb(void* p, DType pt, uint64_t seed, uint32_t tensor, uint64_t offset, float scale,
                  int64_t n, Stream s) override {
    STRATA_ASSERT(pt == DType::f32 || pt == DType::bf16, "zo_perturb: tensors must be f32 or bf16");
    enqueue_op(s, OpKind::elementwise, [=] {
      if (pt == DType::f32)
        cpu::zo_perturb_f32(static_cast<float*>(p), seed, tensor, offset, scale, n);
      else
        cpu::zo_perturb_bf16(static_cast<bf16*>(p), seed, tensor, offset, scale, n);
    });
  }
  void dropout_apply(float* out, const float* in, uint64_t seed, uint32_t tensor, double p, int64_t n,
                     bool accumulate, Stream s) override {
    enqueue_op(s, OpKind::elementwise, [=] { cpu::dropout_apply(out, in, seed, tensor, p, n, accumulate); });
  }

 private:
  StreamWorker& worker(Stream s) { return workers_[int(s)]; }

  // Every op, copy and memset runs through here (event records and waits do not): the place a
  // task's failure is injected, STRATA_FAULT=throw@task[:N] (the N-th such task of the process).
  template <class F>
  void enqueue_task(Stream s, F&& f) {
    worker(s).enqueue([f = std::forward<F>(f)] {
      fault_point("task");
      f();
    });
  }

  template <class F>
  void enqueue_op(Stream s, OpKind kind, F&& f) {
    enqueue_task(s, [this, kind, f = std::forward<F>(f)] {
      auto t0 = Clock::now();
      f();
      double dt = std::chrono::duration<double>(Clock::now() - t0).count();
      std::lock_guard lock(op_mu_);
      op_s_[int(kind)] += dt;
    });
  }

  void check_device_range(const void* p, size_t bytes, const char* what) const {
    auto* c = static_cast<const char*>(p);
    STRATA_ASSERT(c >= base_ && c + bytes <= base_ + mapping_bytes_, what,
                  " is not device memory (wrong copy direction?)");
  }

  void enqueue_copy(Stream s, void* dst, const void* src, size_t bytes) {
    double bw = link_bytes_per_s_;
    enqueue_task(s, [=] {
      auto t0 = Clock::now();
      std::memcpy(dst, src, bytes);
      if (bw > 0) std::this_thread::sleep_until(t0 + std::chrono::duration<double>(double(bytes) / bw));
    });
  }

  double link_bytes_per_s_;
  char* base_ = nullptr;
  size_t mapping_bytes_ = 0;
  std::atomic<size_t> h2d_bytes_{0}, d2h_bytes_{0};
  mutable std::mutex op_mu_;
  double op_s_[int(OpKind::count)] = {};
  double stream_wait_s_[kStreamCount] = {};
  StreamWorker workers_[kStreamCount];
};

}  // namespace

std::unique_ptr<Device> device_create_cpu(const DeviceOptions& options) {
  return std::make_unique<CpuDevice>(options);
}

}  // namespace strata
