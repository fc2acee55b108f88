// The CUDA backend of the device interface (DESIGN §5): three CUDA streams (compute, h2d, d2h),
// events, pinned host memory from cudaMallocHost (pageable, with a warning, when that fails),
// device memory from one cudaMalloc carved by the budgeted Arena (poisoned with NaN on
// allocation, like the CPU backend), cuBLAS for the matmuls and kernels/cuda for every other op. Clear errors: no GPU or no driver, a driver
// older than the CUDA this was built with, a GPU older than sm_80, out of memory naming the
// tensor.
//
// Bad input that only a kernel can see (a target outside the vocab, a doc_start outside
// [0, t], a negative token id) sets a bit in a device error word; the next stream_synchronize
// reads it back and throws, as the CPU backend rethrows an exception from queued work.
//
// Built twice: by the host compiler against the real CUDA runtime (the product, with
// STRATA_CUDA) and by g++ against tools/cuemu (the emulated test suite).
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "kernels/cuda/check.h"
#include "kernels/cuda/attention_cached.h"
#include "kernels/cuda/dropout.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/nf4.h"
#include "kernels/cpu/nf4.h"
#include "kernels/cuda/geglu.h"
#include "kernels/cuda/ops.h"
#include "src/core/error.h"
#include "src/core/fault.h"
#include "src/core/tensor.h"
#include "src/core/threads.h"
#include "src/device/arena.h"
#include "src/device/device.h"

namespace strata {
namespace {

constexpr int kMinComputeMajor = 8;                        // kernels are built for sm_80+

#define STRATA_CUBLAS_DEVICE_CHECK(call)                                                   \
  do {                                                                                     \
    const cublasStatus_t strata_status = (call);                                           \
    STRATA_CHECK(strata_status == CUBLAS_STATUS_SUCCESS, __FILE__, ":", __LINE__, ": ",    \
                 #call, " failed with cuBLAS status ", int(strata_status));                \
  } while (0)

std::string cuda_version_text(int v) { return str_cat(v / 1000, ".", (v % 1000) / 10); }

// Checks that a usable GPU is there; throws the error a user can act on when not.
void cuda_check_environment() {
  const char* use_cpu = "; use [device] backend = \"cpu\" on machines without one";
  int driver = 0;
  STRATA_CUDA_CHECK(cudaDriverGetVersion(&driver));
  STRATA_CHECK(driver > 0, "device backend 'cuda': no CUDA GPU found (no NVIDIA driver is "
               "installed)", use_cpu);
  STRATA_CHECK(driver / 1000 >= CUDART_VERSION / 1000, "device backend 'cuda': the NVIDIA driver "
               "supports CUDA ", cuda_version_text(driver), " but strata was built with CUDA ",
               cuda_version_text(CUDART_VERSION), "; update the driver to one for CUDA ",
               CUDART_VERSION / 1000, ".x", use_cpu);
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  STRATA_CHECK(status != cudaErrorInsufficientDriver, "device backend 'cuda': the NVIDIA driver "
               "is too old for CUDA ", cuda_version_text(CUDART_VERSION), "; update it", use_cpu);
  STRATA_CHECK(status == cudaSuccess && count > 0, "device backend 'cuda': no CUDA GPU found (",
               status == cudaSuccess ? "no devices" : cudaGetErrorString(status), ")", use_cpu);
  STRATA_CUDA_CHECK(cudaSetDevice(0));
  int major = 0, minor = 0;
  STRATA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  STRATA_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0));
  STRATA_CHECK(major >= kMinComputeMajor, "device backend 'cuda': GPU 0 is sm_", major, minor,
               "; strata's CUDA kernels need sm_80 or newer (A100, RTX 30xx and later)", use_cpu);
}

class CudaEvent final : public Event {
 public:
  CudaEvent() { STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming)); }
  ~CudaEvent() override { cudaEventDestroy(event); }
  cudaEvent_t event = nullptr;
};

// Busy and wait times (DeviceCounters) from CUDA timing events, without synchronising anything:
// a span is a pair of events recorded on one stream around an op, a copy or a memset, or a
// stream's wait on an event. A span's time is added once its end event has completed; spans
// are read in each stream's order when counters() is called and whenever the pool of free
// events runs dry, so the events alive stay about as many as the spans still queued.
class CudaSpanTimer {
 public:
  enum class What : uint8_t { op, copy, wait };

  CudaSpanTimer() = default;
  CudaSpanTimer(const CudaSpanTimer&) = delete;
  CudaSpanTimer& operator=(const CudaSpanTimer&) = delete;
  ~CudaSpanTimer() {  // after the device has synchronised its streams
    for (auto& spans : pending_)
      for (const Span& sp : spans) {
        cudaEventDestroy(sp.begin);
        cudaEventDestroy(sp.end);
      }
    for (cudaEvent_t e : free_) cudaEventDestroy(e);
  }

  // Records the start of a span on `st`; its event goes back to end().
  cudaEvent_t begin(cudaStream_t st) {
    std::lock_guard lock(mu_);
    cudaEvent_t e = take_locked();
    const cudaError_t status = cudaEventRecord(e, st);
    if (status != cudaSuccess) free_.push_back(e);
    STRATA_CUDA_CHECK(status);
    return e;
  }

  // Records the end of the span begun with `begin` on the same stream (s) and queues it. Runs in
  // destructors, so it never throws: a span whose end cannot be recorded is dropped.
  void end(cudaEvent_t begin, cudaStream_t st, Stream s, What what, OpKind kind) noexcept {
    std::lock_guard lock(mu_);
    cudaEvent_t e = nullptr;
    try {
      e = take_locked();
    } catch (...) {
    }
    if (!e || cudaEventRecord(e, st) != cudaSuccess) {
      cudaGetLastError();
      free_.push_back(begin);  // re-recording a pending event is allowed
      if (e) free_.push_back(e);
      return;
    }
    pending_[int(s)].push_back(Span{begin, e, what, kind});
  }

  // Adds the spans finished so far to c's busy, per-op and wait times.
  void add_to(DeviceCounters& c) {
    std::lock_guard lock(mu_);
    harvest_locked();
    c.compute_busy_s = busy_s_[int(Stream::compute)];
    c.h2d_busy_s = busy_s_[int(Stream::h2d)];
    c.d2h_busy_s = busy_s_[int(Stream::d2h)];
    for (int k = 0; k < int(OpKind::count); ++k) c.op_s[k] = op_s_[k];
    for (int k = 0; k < kStreamCount; ++k) c.stream_wait_s[k] = wait_s_[k];
  }

 private:
  struct Span {
    cudaEvent_t begin, end;
    What what;
    OpKind kind;
  };

  cudaEvent_t take_locked() {
    if (free_.empty()) harvest_locked();
    if (free_.empty()) {
      cudaEvent_t e = nullptr;
      STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDefault));
      return e;
    }
    cudaEvent_t e = free_.back();
    free_.pop_back();
    return e;
  }

  // Moves the completed spans at the front of each stream's queue into the totals.
  void harvest_locked() {
    for (int s = 0; s < kStreamCount; ++s) {
      auto& spans = pending_[s];
      while (!spans.empty()) {
        const Span sp = spans.front();
        const cudaError_t status = cudaEventQuery(sp.end);
        if (status != cudaSuccess) {
          // "not ready" is no error; don't leave it for the next launch check to find
          if (cudaPeekAtLastError() == status) cudaGetLastError();
          break;
        }
        float ms = 0.f;
        if (cudaEventElapsedTime(&ms, sp.begin, sp.end) == cudaSuccess) {
          const double sec = std::max(0.0, double(ms) * 1e-3);
          if (sp.what == What::wait) {
            wait_s_[s] += sec;
          } else {
            busy_s_[s] += sec;
            if (sp.what == What::op) op_s_[int(sp.kind)] += sec;
          }
        } else {
          cudaGetLastError();
        }
        free_.push_back(sp.begin);
        free_.push_back(sp.end);
        spans.pop_front();
      }
    }
  }

  std::mutex mu_;
  std::vector<cudaEvent_t> free_;
  std::deque<Span> pending_[kStreamCount];
  double busy_s_[kStreamCount] = {}, wait_s_[kStreamCount] = {}, op_s_[int(OpKind::count)] = {};
};

// Attention's dot products: f32, or bf16-rounded q, k, v, dout (kernels/cpu/ops.h).
bool attention_bf16_dots(DType dot_type) {
  STRATA_CHECK(dot_type == DType::f32 || dot_type == DType::bf16,
               "attention: dot products run in f32 or bf16 (got ", dtype_name(dot_type), ")");
  return dot_type == DType::bf16;
}

class CudaDevice final : public ArenaDevice {
 public:
  explicit CudaDevice(const DeviceOptions& o) {
    STRATA_CHECK(o.memory_bytes > 0, "[device] memory must be positive");
    // the host's kernel threads (AdamW and gradient accumulation on the host queue), checked
    // first: exit 3 naming device.cpu_threads and the ulimits when they cannot all be made
    cpu_threads_start();
    cuda_check_environment();
    const cudaError_t status = cudaMalloc(reinterpret_cast<void**>(&base_), o.memory_bytes);
    if (status != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free error so later calls work
      size_t free_bytes = 0, total_bytes = 0;
      cudaMemGetInfo(&free_bytes, &total_bytes);
      STRATA_CHECK_BUDGET(false, "cannot reserve ", o.memory_bytes, " bytes (", o.memory_bytes >> 20,
                          " MiB) of GPU memory for the device arena: ", cudaGetErrorString(status),
                          " (", free_bytes >> 20, " MiB free of ", total_bytes >> 20,
                          " MiB); lower [device] memory");
    }
    mapping_bytes_ = o.memory_bytes;
    arena_init(base_, mapping_bytes_);
    for (auto& s : streams_) STRATA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    error_word_ = static_cast<int*>(alloc(sizeof(int), "kernel error word"));
    STRATA_CUDA_CHECK(cudaMemsetAsync(error_word_, 0, sizeof(int), stream(Stream::compute)));
    STRATA_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&error_word_host_), sizeof(int)));
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream(Stream::compute)));
  }

  ~CudaDevice() override {
    for (auto s : streams_)
      if (s) cudaStreamSynchronize(s);
    for (auto h : cublas_)
      if (h) cublasDestroy(h);
    for (auto s : streams_)
      if (s) cudaStreamDestroy(s);
    if (error_word_host_) cudaFreeHost(error_word_host_);
    if (base_) cudaFree(base_);
  }

  std::string name() const override { return "cuda"; }

  // ---- memory ----
  void* alloc(size_t bytes, const std::string& tensor) override {
    char* p = arena_alloc(bytes, tensor);
    // NaN poison, finished before the memory is handed out so that no stream's later use of it
    // can race with the fill.
    if (bytes > 0) {
      cudaStream_t s = stream(Stream::compute);
      STRATA_CUDA_CHECK(cudaMemsetAsync(p, 0xff, bytes, s));
      STRATA_CUDA_CHECK(cudaStreamSynchronize(s));
    }
    return p;
  }
  // cudaMallocHost, or pageable memory (one warning, counted) when pinning fails.
  void* alloc_pinned(size_t bytes) override {
    if (pinned_fail_forced()) return pageable_fallback_alloc(bytes, "STRATA_FAKE_PINNED_FAIL=1");
    // STRATA_FAULT=alloc@host-alloc: pinned and pageable host memory both exhausted
    STRATA_CHECK_BUDGET(fault_point("host-alloc") != FaultKind::alloc, "cannot allocate ", format_bytes(bytes),
                        " of host memory (pinning it failed: STRATA_FAULT, and pageable memory is exhausted too); "
                        "lower the host memory the recipe needs (a smaller model, micro_batch_size or sequence_len)");
    void* p = nullptr;
    const cudaError_t status = cudaMallocHost(&p, std::max<size_t>(bytes, 1));
    if (status == cudaSuccess) return p;
    cudaGetLastError();  // clear it: the fallback is not an error
    return pageable_fallback_alloc(bytes, str_cat("cudaMallocHost: ", cudaGetErrorString(status)));
  }
  void free_pinned(void* p) override {
    if (p && !pageable_fallback_free(p)) STRATA_CUDA_CHECK(cudaFreeHost(p));
  }
  // cudaHostRegister, or pageable (one warning) when it fails.
  bool register_host(void* p, size_t bytes) override {
    if (pinned_fail_forced()) {
      pageable_warning(bytes, "STRATA_FAKE_PINNED_FAIL=1");
      return false;
    }
    const cudaError_t status = cudaHostRegister(p, bytes, cudaHostRegisterDefault);
    if (status == cudaSuccess) return true;
    cudaGetLastError();  // clear it: the fallback is not an error
    pageable_warning(bytes, str_cat("cudaHostRegister: ", cudaGetErrorString(status)));
    return false;
  }
  void unregister_host(void* p) override { STRATA_CUDA_CHECK(cudaHostUnregister(p)); }

  // ---- streams, events, copies ----
  std::unique_ptr<Event> event_create() override { return std::make_unique<CudaEvent>(); }
  void event_record(Event& e, Stream s) override {
    STRATA_CUDA_CHECK(cudaEventRecord(static_cast<CudaEvent&>(e).event, stream(s)));
  }
  void stream_wait_event(Stream s, Event& e) override {
    const auto timed = time_wait(s);
    STRATA_CUDA_CHECK(cudaStreamWaitEvent(stream(s), static_cast<CudaEvent&>(e).event, 0));
  }
  void event_synchronize(Event& e) override {
    STRATA_CUDA_CHECK(cudaEventSynchronize(static_cast<CudaEvent&>(e).event));
  }
  void stream_synchronize(Stream s) override {
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream(s)));
    if (checks_pending_[int(s)].exchange(false)) report_kernel_errors(s);
  }

  void copy_h2d(void* dst, const void* src, size_t bytes, Stream s) override {
    const auto timed = time_copy(s);
    check_device_range(dst, bytes, "copy_h2d destination");
    h2d_bytes_ += bytes;
    STRATA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream(s)));
  }
  void copy_d2h(void* dst, const void* src, size_t bytes, Stream s) override {
    const auto timed = time_copy(s);
    check_device_range(src, bytes, "copy_d2h source");
    d2h_bytes_ += bytes;
    STRATA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream(s)));
  }
  void copy_d2d(void* dst, const void* src, size_t bytes, Stream s) override {
    const auto timed = time_copy(s);
    check_device_range(dst, bytes, "copy_d2d destination");
    check_device_range(src, bytes, "copy_d2d source");
    STRATA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream(s)));
  }
  void memset_zero(void* dst, size_t bytes, Stream s) override {
    const auto timed = time_copy(s);
    check_device_range(dst, bytes, "memset destination");
    STRATA_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream(s)));
  }
  // Busy: ops, copies and memsets on each stream; waits: the time a stream stood blocked in
  // stream_wait_event. Spans still queued on the GPU count once they finish (CudaSpanTimer).
  DeviceCounters counters() const override {
    DeviceCounters c;
    c.h2d_bytes = h2d_bytes_;
    c.d2h_bytes = d2h_bytes_;
    timer_.add_to(c);
    return c;
  }

  // The datasheet figure for a GPU the table knows; otherwise the median of 5 cuBLAS GEMMs
  // (4096 cubed, after a warm-up) timed with events on the compute stream, once per dtype.
  DevicePeak peak_flops(DType ab) override {
    STRATA_ASSERT(ab == DType::f32 || ab == DType::bf16, "peak FLOP/s is kept for f32 and bf16");
    std::lock_guard lock(peak_mu_);
    DevicePeak& p = peak_[ab == DType::bf16];
    if (p.flops_per_s > 0) return p;
    cudaDeviceProp prop{};
    STRATA_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    if (auto known = gpu_datasheet_peak(prop.name, ab)) return p = *known;
    p = measure_peak(ab, prop.name);
    return p;
  }

  // ---- ops ----
  void matmul(float* c, const void* a, const void* b, DType ab, int64_t m, int64_t n,
              int64_t k, bool ta, bool tb, float beta, Stream s) override {
    const auto timed = time_op(s, OpKind::matmul);
    STRATA_ASSERT(ab == DType::f32 || ab == DType::bf16, "matmul inputs must be f32 or bf16");
    cuda::matmul(c, a, b, ab == DType::bf16, m, n, k, ta, tb, beta, cublas(s), stream(s));
  }
  void rmsnorm_forward(float* out, float* rstd, const float* in, const float* weight,
                       int64_t n, int64_t c, float eps, Stream s) override {
    const auto timed = time_op(s, OpKind::norm);
    cuda::rmsnorm_forward(out, rstd, in, weight, n, c, eps, stream(s));
  }  void rmsnorm_forward_bf16(float* out, bf16* out_b, float* rstd, const float* in, const float* weight, int64_t n,
                            int64_t c, float eps, Stream s) override {
    const auto timed = time_op(s, OpKind::norm);
    cuda::rmsnorm_forward_bf16(out, out_b, rstd, in, weight, n, c, eps, stream(s));
  }

  void rmsnorm_backward(float* din, float* dweight, const float* dout, const float* in,
                        const float* weight, const float* rstd, int64_t n, int64_t c, Stream s) override {
    const auto timed = time_op(s, OpKind::norm);
    cuda::rmsnorm_backward(din, dweight, dout, in, weight, rstd, n, c, stream(s));
  }
  void rope_forward(float* out, const float* in, const int32_t* pos,
                    const float* inv_freq, int64_t n, int64_t nh, int64_t d, int64_t rot, Stream s) override {
    const auto timed = time_op(s, OpKind::rope);
    cuda::rope_forward(out, in, pos, inv_freq, n, nh, d, rot, stream(s));
  }
  void rope_backward(float* din, const float* dout, const int32_t* pos,
                     const float* inv_freq, int64_t n, int64_t nh, int64_t d, int64_t rot, Stream s) override {
    const auto timed = time_op(s, OpKind::rope);
    cuda::rope_backward(din, dout, pos, inv_freq, n, nh, d, rot, stream(s));
  }
  void swiglu_forward(float* out, const float* gate, const float* up, int64_t n, Stream s) override {
    const auto timed = time_op(s, OpKind::elementwise);
    cuda::swiglu_forward(out, gate, up, n, stream(s));
  }  void swiglu_forward_bf16(float* out, bf16* out_b, const float* gate, const float* up, int64_t n,
                           Stream s) override {
    const auto timed = time_op(s, OpKind::elementwise);
    cuda::swiglu_forward_bf16(out, out_b, gate, up, n, stream(s));
  }

  void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                       const float* up, int64_t n, Stream s) override {
    const auto timed = time_op(s, OpKind::elementwise);
    cuda::swiglu_backward(dgate, dup, dout, gate, up, n, stream(s));
  }
  void swiglu_backward_bf16(bf16* dgate, bf16* dup, const float* dout, const float* gate, const float* up,
                            int64_t n, Stream s) override {
    const auto timed = time_op(s, OpKind::elementwise);
    cuda::swiglu_backward_bf16(dgate, dup, dout, gate, up, n, stream(s));
  }
  void bias_forward(float* y, const float* b, int64_t n, int64_t o, Stream s) override {
    const auto timed = time_op(s, OpKind::elementwise);
    cuda::bias_forward(y, b, n, o, stream(s));
  }
  void bias_backward(float* db, const float* dy, int64_t n, int64_t o, Stream s) override {
    const auto timed = time_op(s, OpKind::elementwise);
    cuda::bias_backward(db, dy, n, o, stream(s));
  }
  void embedding_forward(float* out, const void* table, DType tt, const int32_t* ids,
                         int64_t n, int64_t c, Stream s) override {
    const auto timed = time_op(s, OpKind::embedding);
    STRATA_ASSERT(tt == DType::f32 || tt == DType::bf16, "embedding table must be f32 or bf16");
    checks_pending_[int(s)] = true;
    cuda::embedding_forward(out, table, tt == DType::bf16, ids, n, c, error_word_, stream(s));
  }
  void embedding_backward(float* dtable, const float* dout, const int32_t* ids,
                          int64_t n, int64_t c, Stream s) override {
    const auto timed = time_op(s, OpKind::embedding);
    checks_pending_[int(s)] = true;
    cuda::embedding_backward(dtable, dout, ids, n, c, error_word_, stream(s));
  }
  void attention_forward(float* out, float* lse, const float* q, const float* k,
                         const float* v, const int32_t* doc_start, int64_t b, int64_t t,
                         int64_t h, int64_t hk, int64_t d, float scale, DType dot_type,
                         Stream s, int64_t window) override {
    const auto timed = time_op(s, OpKind::attention);
    if (doc_start) checks_pending_[int(s)] = true;
    // bf16 dots (the model's bf16 mode; q, k, v stay f32 in memory): the tensor-core kernel;
    // f32 dots: the f32 CUDA-core kernel.
    if (attention_bf16_dots(dot_type))
      cuda::attention_tc_forward(out, lse, q, k, v, doc_start, b, t, h, hk, d, scale, window, error_word_,
                                 stream(s));
    else
      cuda::attention_forward(out, lse, q, k, v, doc_start, b, t, h, hk, d, scale, false, window, error_word_,
                              stream(s));
  }
  void attention_backward(float* dq, float* dk, float* dv, const float* dout,
                          const float* q, const float* k, const float* v, const float* out,
                          const float* lse, const int32_t* doc_start, int64_t b, int64_t t,
                          int64_t h, int64_t hk, int64_t d, float scale, DType dot_type,
                          Stream s, int64_t window) override {
    const auto timed = time_op(s, OpKind::attention);
    if (doc_start) checks_pending_[int(s)] = true;
    if (attention_bf16_dots(dot_type))
      cuda::attention_tc_backward(dq, dk, dv, dout, q, k, v, out, lse, doc_start, b, t, h, hk, d, scale,
                                  window, error_word_, stream(s));
    else
      cuda::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, doc_start, b, t, h, hk, d, scale,
                               false, window, error_word_, stream(s));
  }
  void attention_cached_forward(float* out, const float* q, const float* k_cache, const float* v_cache,
                                const int32_t* start, int64_t b, int64_t tq, int64_t tcap, int64_t h, int64_t hk,
                                int64_t d, float scale, DType dot_type, Stream s, int64_t window) override {
    const auto timed = time_op(s, OpKind::attention);
    cuda::attention_cached_forward(out, q, k_cache, v_cache, start, b, tq, tcap, h, hk, d, scale,
                                   attention_bf16_dots(dot_type), window, stream(s));
  }
  void lm_head_ce_chunk_stats(double* stats, const float* h, const void* w, DType wt,
                              const int32_t* targets, int64_t n, int64_t c, int64_t v, int64_t v0,
                              int64_t vc, bool first, float* keep_logits, Stream s) override {
    const auto timed = time_op(s, OpKind::cross_entropy);
    void* ws = ce_chunk_workspace(wt, c, vc, s);
    cuda::lm_head_ce_chunk_stats(stats, h, w, wt == DType::bf16, targets, n, c, v, v0, vc, first,
                                 keep_logits, ws, ce_workspace_bytes_, error_word_, cublas(s), stream(s));
  }
  void lm_head_ce_chunk_stats_entropy(double* stats, double* ent, const float* h, const void* w, DType wt,
                                      const int32_t* targets, int64_t n, int64_t c, int64_t v, int64_t v0,
                                      int64_t vc, bool first, float* keep_logits, Stream s) override {
    const auto timed = time_op(s, OpKind::cross_entropy);
    void* ws = ce_chunk_workspace(wt, c, vc, s);
    cuda::lm_head_ce_chunk_stats_entropy(stats, ent, h, w, wt == DType::bf16, targets, n, c, v, v0, vc, first,
                                         keep_logits, ws, ce_workspace_bytes_, error_word_, cublas(s), stream(s));
  }
  void lm_head_ce_stats_loss(double* loss_sum, const double* stats, const int32_t* targets,
                             int64_t n, int64_t v, Stream s) override {
    const auto timed = time_op(s, OpKind::cross_entropy);
    cuda::lm_head_ce_stats_loss(loss_sum, stats, targets, n, v, stream(s));
  }
  void lm_head_ce_chunk_backward(float* dh, float* dw_chunk, const float* h, const void* w,
                                 DType wt, const double* stats, const int32_t* targets, int64_t n,
                                 int64_t c, int64_t v, int64_t v0, int64_t vc, float grad_scale, float* kept_logits,
                                 Stream s) override {
    lm_head_ce_chunk_backward_weighted(dh, dw_chunk, h, w, wt, stats, targets, nullptr, n, c, v, v0, vc, grad_scale,
                                       kept_logits, s);
  }
  void lm_head_ce_stats_seq_sums(double* seq_sums, const double* stats, const int32_t* targets,
                                 const int32_t* seq, int64_t n, int64_t v, int64_t num_seqs, Stream s) override {
    const auto timed = time_op(s, OpKind::cross_entropy);
    cuda::lm_head_ce_stats_seq_sums(seq_sums, stats, targets, seq, n, v, num_seqs, stream(s));
  }
  void lm_head_ce_chunk_backward_weighted(float* dh, float* dw_chunk, const float* h, const void* w, DType wt,
                                          const double* stats, const int32_t* targets,
                                          const float* token_weight, int64_t n, int64_t c, int64_t v,
                                          int64_t v0, int64_t vc, float grad_scale, float* kept_logits,
                                          Stream s) override {
    const auto timed = time_op(s, OpKind::cross_entropy);
    void* ws = ce_chunk_workspace(wt, c, vc, s);
    cuda::lm_head_ce_chunk_backward(dh, dw_chunk, h, w, wt == DType::bf16, stats, targets, token_weight, n,
                                    c, v, v0, vc, grad_scale, kept_logits, ws, ce_workspace_bytes_, error_word_,
                                    cublas(s), stream(s));
  }
  void add_inplace(float* y, const float* x, int64_t n, Stream s) override {
    const auto timed = time_op(s, OpKind::elementwise);
    cuda::add_inplace(y, x, n, stream(s));
  }
  void moe_combine_forward(float* out, const float* y, const float* w, const int32_t* token_row, int64_t n, int64_t k,
                           int64_t c, Stream s) override {
    const auto timed = time_op(s, OpKind::elementwise);
    cuda::moe_combine_forward(out, y, w, token_row, n, k, c, stream(s));
  }
  void moe_combine_backward(float* dy, float* dw, const float* dout, const float* y, const float* w,
                            const int32_t* row_token, int64_t m, int64_t c, Stream s) override {
    const auto timed = time_op(s, OpKind::elementwise);
    cuda::moe_combine_backward(dy, dw, dout, y, w, row_token, m, c, stream(s));
  }
  void geglu_forward(float* out, const float* gate, const float* up, int64_t n, Stream s) override {
    const auto timed = time_op(s, OpKind::elementwise);
    cuda::geglu_forward(out, gate, up, n, stream(s));
  }
  void geglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n,
                      Stream s) override {
    const auto timed = time_op(s, OpKind::elementwise);
    cuda::geglu_backward(dgate, dup, dout, gate, up, n, stream(s));
  }
  void affine(float* y, const float* x, float a, float b, int64_t n, Stream s) override {
    const auto timed = time_op(s, OpKind::elementwise);
    cuda::affine(y, x, a, b, n, stream(s));
  }
  void cast_f32_to_bf16(bf16* out, const float* in, int64_t n, Stream s) override {
    const auto timed = time_op(s, OpKind::elementwise);
    cuda::cast_f32_to_bf16(out, in, n, stream(s));
  }
  // The dynamic map the double quantization indexes (1 KiB of the arena, uploaded at the first call,
  // on the stream the kernel then runs on; the host table is static).
  void nf4_dequantize(void* w, DType w_type, const uint8_t* codes, const uint8_t* qabsmax, const float* absmax,
                      float offset, int64_t n, Stream s) override {
    STRATA_ASSERT(w_type == DType::bf16 || w_type == DType::f32, "NF4 dequantizes to bf16 or f32");
    if (qabsmax && !nf4_map_) {
      nf4_map_ = static_cast<float*>(alloc(256 * sizeof(float), "NF4 dynamic map"));
      STRATA_CUDA_CHECK(cudaMemcpyAsync(nf4_map_, cpu::nf4_dynamic_map(), 256 * sizeof(float), cudaMemcpyHostToDevice,
                                        stream(s)));
    }
    const auto timed = time_op(s, OpKind::elementwise);
    if (w_type == DType::bf16)
      cuda::nf4_dequantize_bf16(static_cast<bf16*>(w), codes, qabsmax, absmax, offset, nf4_map_, n, stream(s));
    else
      cuda::nf4_dequantize_bf16_as_f32(static_cast<float*>(w), codes, qabsmax, absmax, offset, nf4_map_, n, stream(s));
  }
  void zo_generate(float* z, uint64_t seed, uint32_t tensor, uint64_t offset, int64_t n,
                   Stream s) override {
    const auto timed = time_op(s, OpKind::elementwise);
    cuda::zo_generate(z, seed, tensor, offset, n, stream(s));
  }
  void zo_perturb(void* p, DType pt, uint64_t seed, uint32_t tensor, uint64_t offset, float scale,
                  int64_t n, Stream s) override {
    const auto timed = time_op(s, OpKind::elementwise);
    STRATA_ASSERT(pt == DType::f32 || pt == DType::bf16, "zo_perturb: tensors must be f32 or bf16");
    cuda::zo_perturb(p, pt == DType::bf16, seed, tensor, offset, scale, n, stream(s));
  }
  void dropout_apply(float* out, const float* in, uint64_t seed, uint32_t tensor, double p, int64_t n,
                     bool accumulate, Stream s) override {
    const auto timed = time_op(s, OpKind::elementwise);
    cuda::dropout_apply(out, in, seed, tensor, p, n, accumulate, stream(s));
  }

  void* native_stream(Stream s) override { return stream(s); }
  size_t pending_workspace_bytes(Stream s) const override {
    return cublas_[int(s)] ? 0 : Arena::footprint(kCudaCublasWorkspaceBytes);
  }
  size_t pending_lm_head_ce_workspace_bytes(int64_t c, int64_t vc) const override {
    const size_t bytes = cuda::lm_head_ce_workspace_bytes(c, vc);
    return bytes > ce_workspace_bytes_ ? Arena::footprint(bytes) : 0;
  }

 private:
  cudaStream_t stream(Stream s) const { return streams_[int(s)]; }

  // Times the rest of the calling scope's work on stream s (CudaSpanTimer): an op of family
  // `kind`, a copy or memset, or a wait on an event.
  class Timed {
   public:
    Timed(const CudaDevice& d, Stream s, CudaSpanTimer::What what, OpKind kind)
        : d_(d), s_(s), what_(what), kind_(kind), begin_(d.timer_.begin(d.stream(s))) {}
    ~Timed() { d_.timer_.end(begin_, d_.stream(s_), s_, what_, kind_); }
    Timed(const Timed&) = delete;
    Timed& operator=(const Timed&) = delete;

   private:
    const CudaDevice& d_;
    Stream s_;
    CudaSpanTimer::What what_;
    OpKind kind_;
    cudaEvent_t begin_;
  };
  Timed time_op(Stream s, OpKind kind) const { return Timed(*this, s, CudaSpanTimer::What::op, kind); }
  Timed time_copy(Stream s) const { return Timed(*this, s, CudaSpanTimer::What::copy, OpKind::count); }
  Timed time_wait(Stream s) const { return Timed(*this, s, CudaSpanTimer::What::wait, OpKind::count); }

  // The cuBLAS handle of a stream, created on first use with its own workspace from the arena
  // (so cuBLAS allocates nothing behind the budget's back and streams never share one).
  DevicePeak measure_peak(DType ab, const std::string& gpu) {
    const int64_t n = 4096;
    const size_t in_bytes = size_t(n * n) * (ab == DType::bf16 ? 2 : 4), out_bytes = size_t(n * n) * 4;
    void *a = nullptr, *b = nullptr, *c = nullptr;
    STRATA_CUDA_CHECK(cudaMalloc(&a, in_bytes));
    STRATA_CUDA_CHECK(cudaMalloc(&b, in_bytes));
    STRATA_CUDA_CHECK(cudaMalloc(&c, out_bytes));
    cudaEvent_t start = nullptr, stop = nullptr;
    STRATA_CUDA_CHECK(cudaEventCreate(&start));
    STRATA_CUDA_CHECK(cudaEventCreate(&stop));
    const cudaStream_t st = stream(Stream::compute);
    STRATA_CUDA_CHECK(cudaMemsetAsync(a, 0, in_bytes, st));
    STRATA_CUDA_CHECK(cudaMemsetAsync(b, 0, in_bytes, st));
    std::vector<double> runs;
    for (int r = 0; r < 6; ++r) {  // the first is a warm-up
      STRATA_CUDA_CHECK(cudaEventRecord(start, st));
      cuda::matmul(static_cast<float*>(c), a, b, ab == DType::bf16, n, n, n, false, true, 0.f,
                   cublas(Stream::compute), st);
      STRATA_CUDA_CHECK(cudaEventRecord(stop, st));
      STRATA_CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      STRATA_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      if (r > 0) runs.push_back(double(ms) / 1e3);
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
    DevicePeak p;
    p.flops_per_s = 2.0 * double(n) * double(n) * double(n) / std::max(median_seconds(runs), 1e-9);
    p.source = str_cat("measured: median of 5 cuBLAS ", dtype_name(ab), " GEMMs 4096x4096x4096 on ", gpu,
                       " (not in the datasheet table)");
    return p;
  }

  cublasHandle_t cublas(Stream s) {
    cublasHandle_t& h = cublas_[int(s)];
    if (!h) {
      void* ws = alloc(kCudaCublasWorkspaceBytes, str_cat("cuBLAS workspace (stream ", int(s), ")"));
      STRATA_CUBLAS_DEVICE_CHECK(cublasCreate(&h));
      STRATA_CUBLAS_DEVICE_CHECK(cublasSetStream(h, stream(s)));
      STRATA_CUBLAS_DEVICE_CHECK(cublasSetWorkspace(h, ws, kCudaCublasWorkspaceBytes));
    }
    return h;
  }

  // The lm_head_ce logits workspace, grown on demand. Growing waits for every stream, since
  // work already queued may still use the old one.
  // An lm_head chunk op's checks and its workspace (the statistics passes and the weighted backward).
  void* ce_chunk_workspace(DType wt, int64_t c, int64_t vc, Stream s) {
    STRATA_ASSERT(wt == DType::f32 || wt == DType::bf16, "lm_head weights must be f32 or bf16");
    STRATA_CHECK(c > 0 && vc > 0, "lm_head_ce chunk: sizes must be positive (got c=", c, " vc=", vc, ")");
    void* ws = ce_workspace(cuda::lm_head_ce_workspace_bytes(c, vc));
    checks_pending_[int(s)] = true;
    return ws;
  }
  void* ce_workspace(size_t bytes) {
    if (bytes > ce_workspace_bytes_) {
      if (ce_workspace_) {
        synchronize();
        free(ce_workspace_);
        ce_workspace_ = nullptr;
        ce_workspace_bytes_ = 0;
      }
      ce_workspace_ = alloc(bytes, "lm_head_ce workspace (128 rows of logits)");
      ce_workspace_bytes_ = bytes;
    }
    return ce_workspace_;
  }

  // Reads the error word after a synchronize of stream s; throws what the kernels found.
  void report_kernel_errors(Stream s) {
    cudaStream_t st = stream(s);
    STRATA_CUDA_CHECK(cudaMemcpyAsync(error_word_host_, error_word_, sizeof(int),
                                             cudaMemcpyDeviceToHost, st));
    STRATA_CUDA_CHECK(cudaStreamSynchronize(st));
    const int bits = *error_word_host_;
    if (bits == 0) return;
    STRATA_CUDA_CHECK(cudaMemsetAsync(error_word_, 0, sizeof(int), st));
    STRATA_CUDA_CHECK(cudaStreamSynchronize(st));
    STRATA_CHECK(!(bits & cuda::kErrorTarget), "lm_head_ce: a target id lies outside [0, vocab); "
                 "use -100 to ignore a token");
    STRATA_CHECK(!(bits & cuda::kErrorDocStart), "attention: a doc_start[b,t] lies outside [0, t] "
                 "(it must be the start of the token's document)");
    STRATA_CHECK(!(bits & cuda::kErrorTokenId), "embedding: a token id is negative");
    STRATA_CHECK(false, "a CUDA kernel reported error bits ", bits);
  }

  void check_device_range(const void* p, size_t bytes, const char* what) const {
    auto* c = static_cast<const char*>(p);
    STRATA_ASSERT(c >= base_ && c + bytes <= base_ + mapping_bytes_, what,
                  " is not device memory (wrong copy direction?)");
  }

  char* base_ = nullptr;
  size_t mapping_bytes_ = 0;
  cudaStream_t streams_[kStreamCount] = {};
  cublasHandle_t cublas_[kStreamCount] = {};
  std::mutex peak_mu_;
  DevicePeak peak_[2];  // f32, bf16; flops_per_s 0 until asked
  int* error_word_ = nullptr;       // device, KernelError bits
  int* error_word_host_ = nullptr;  // pinned, read back at synchronize
  std::atomic<bool> checks_pending_[kStreamCount] = {};
  void* ce_workspace_ = nullptr;
  float* nf4_map_ = nullptr;  // the NF4 double quantization's dynamic map (first use)
  size_t ce_workspace_bytes_ = 0;
  std::atomic<size_t> h2d_bytes_{0}, d2h_bytes_{0};
  mutable CudaSpanTimer timer_;  // busy, per-op and wait times
};

}  // namespace

std::unique_ptr<Device> device_create_cuda(const DeviceOptions& options) {
  return std::make_unique<CudaDevice>(options);
}

}  // namespace strata
