// The CUDA backend of the device interface (DESIGN §5): three CUDA streams (compute, h2d, d2h),
// events, pinned host memory from cudaMallocHost, device memory from one cudaMalloc carved by
// the budgeted Arena (poisoned with NaN on allocation, like the CPU backend), cuBLAS for the
// matmuls and kernels/cuda for every other op. Clear errors: no GPU or no driver, a driver
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
#include <memory>
#include <mutex>

#include "kernels/cuda/ops.h"
#include "src/core/error.h"
#include "src/device/arena.h"
#include "src/device/device.h"

namespace strata {
namespace {

constexpr size_t kCublasWorkspaceBytes = size_t(8) << 20;  // per stream that runs matmuls
constexpr int kMinComputeMajor = 8;                        // kernels are built for sm_80+

#define STRATA_CUDA_DEVICE_CHECK(call)                                                     \
  do {                                                                                     \
    const cudaError_t strata_status = (call);                                              \
    STRATA_CHECK(strata_status == cudaSuccess, __FILE__, ":", __LINE__, ": ", #call,       \
                 " failed: ", cudaGetErrorString(strata_status));                          \
  } while (0)

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
  STRATA_CUDA_DEVICE_CHECK(cudaDriverGetVersion(&driver));
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
  STRATA_CUDA_DEVICE_CHECK(cudaSetDevice(0));
  int major = 0, minor = 0;
  STRATA_CUDA_DEVICE_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  STRATA_CUDA_DEVICE_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0));
  STRATA_CHECK(major >= kMinComputeMajor, "device backend 'cuda': GPU 0 is sm_", major, minor,
               "; strata's CUDA kernels need sm_80 or newer (A100, RTX 30xx and later)", use_cpu);
}

class CudaEvent final : public Event {
 public:
  CudaEvent() { STRATA_CUDA_DEVICE_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming)); }
  ~CudaEvent() override { cudaEventDestroy(event); }
  cudaEvent_t event = nullptr;
};

class CudaDevice final : public ArenaDevice {
 public:
  explicit CudaDevice(const DeviceOptions& o) {
    STRATA_CHECK(o.memory_bytes > 0, "[device] memory must be positive");
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
    for (auto& s : streams_) STRATA_CUDA_DEVICE_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    error_word_ = static_cast<int*>(alloc(sizeof(int), "kernel error word"));
    STRATA_CUDA_DEVICE_CHECK(cudaMemsetAsync(error_word_, 0, sizeof(int), stream(Stream::compute)));
    STRATA_CUDA_DEVICE_CHECK(cudaMallocHost(reinterpret_cast<void**>(&error_word_host_), sizeof(int)));
    STRATA_CUDA_DEVICE_CHECK(cudaStreamSynchronize(stream(Stream::compute)));
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
      STRATA_CUDA_DEVICE_CHECK(cudaMemsetAsync(p, 0xff, bytes, s));
      STRATA_CUDA_DEVICE_CHECK(cudaStreamSynchronize(s));
    }
    return p;
  }
  void* alloc_pinned(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t status = cudaMallocHost(&p, std::max<size_t>(bytes, 1));
    if (status != cudaSuccess) cudaGetLastError();
    STRATA_CHECK_BUDGET(status == cudaSuccess, "cannot allocate ", bytes, " bytes (", bytes >> 20,
                        " MiB) of pinned host memory: ", cudaGetErrorString(status),
                        "; lower the host memory the recipe needs");
    return p;
  }
  void free_pinned(void* p) override {
    if (p) STRATA_CUDA_DEVICE_CHECK(cudaFreeHost(p));
  }

  // ---- streams, events, copies ----
  std::unique_ptr<Event> event_create() override { return std::make_unique<CudaEvent>(); }
  void event_record(Event& e, Stream s) override {
    STRATA_CUDA_DEVICE_CHECK(cudaEventRecord(static_cast<CudaEvent&>(e).event, stream(s)));
  }
  void stream_wait_event(Stream s, Event& e) override {
    STRATA_CUDA_DEVICE_CHECK(cudaStreamWaitEvent(stream(s), static_cast<CudaEvent&>(e).event, 0));
  }
  void event_synchronize(Event& e) override {
    STRATA_CUDA_DEVICE_CHECK(cudaEventSynchronize(static_cast<CudaEvent&>(e).event));
  }
  void stream_synchronize(Stream s) override {
    STRATA_CUDA_DEVICE_CHECK(cudaStreamSynchronize(stream(s)));
    if (checks_pending_[int(s)].exchange(false)) report_kernel_errors(s);
  }

  void copy_h2d(void* dst, const void* src, size_t bytes, Stream s) override {
    check_device_range(dst, bytes, "copy_h2d destination");
    h2d_bytes_ += bytes;
    STRATA_CUDA_DEVICE_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream(s)));
  }
  void copy_d2h(void* dst, const void* src, size_t bytes, Stream s) override {
    check_device_range(src, bytes, "copy_d2h source");
    d2h_bytes_ += bytes;
    STRATA_CUDA_DEVICE_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream(s)));
  }
  void copy_d2d(void* dst, const void* src, size_t bytes, Stream s) override {
    check_device_range(dst, bytes, "copy_d2d destination");
    check_device_range(src, bytes, "copy_d2d source");
    STRATA_CUDA_DEVICE_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream(s)));
  }
  void memset_zero(void* dst, size_t bytes, Stream s) override {
    check_device_range(dst, bytes, "memset destination");
    STRATA_CUDA_DEVICE_CHECK(cudaMemsetAsync(dst, 0, bytes, stream(s)));
  }
  // Busy times and the per-op split are not measured on this backend yet (they would need
  // timing events around every op); bytes are counted.
  DeviceCounters counters() const override {
    DeviceCounters c;
    c.h2d_bytes = h2d_bytes_;
    c.d2h_bytes = d2h_bytes_;
    return c;
  }

  // ---- ops ----
  void matmul(Stream s, float* c, const void* a, const void* b, DType ab, int64_t m, int64_t n,
              int64_t k, bool ta, bool tb, float beta) override {
    STRATA_ASSERT(ab == DType::f32 || ab == DType::bf16, "matmul inputs must be f32 or bf16");
    cuda::matmul(cublas(s), stream(s), c, a, b, ab == DType::bf16, m, n, k, ta, tb, beta);
  }
  void rmsnorm_forward(Stream s, float* out, float* rstd, const float* in, const float* weight,
                       int64_t n, int64_t c, float eps) override {
    cuda::rmsnorm_forward(out, rstd, in, weight, n, c, eps, stream(s));
  }
  void rmsnorm_backward(Stream s, float* din, float* dweight, const float* dout, const float* in,
                        const float* weight, const float* rstd, int64_t n, int64_t c) override {
    cuda::rmsnorm_backward(din, dweight, dout, in, weight, rstd, n, c, stream(s));
  }
  void rope_forward(Stream s, float* out, const float* in, const int32_t* pos,
                    const float* inv_freq, int64_t n, int64_t nh, int64_t d) override {
    cuda::rope_forward(out, in, pos, inv_freq, n, nh, d, stream(s));
  }
  void rope_backward(Stream s, float* din, const float* dout, const int32_t* pos,
                     const float* inv_freq, int64_t n, int64_t nh, int64_t d) override {
    cuda::rope_backward(din, dout, pos, inv_freq, n, nh, d, stream(s));
  }
  void swiglu_forward(Stream s, float* out, const float* gate, const float* up, int64_t n) override {
    cuda::swiglu_forward(out, gate, up, n, stream(s));
  }
  void swiglu_backward(Stream s, float* dgate, float* dup, const float* dout, const float* gate,
                       const float* up, int64_t n) override {
    cuda::swiglu_backward(dgate, dup, dout, gate, up, n, stream(s));
  }
  void bias_forward(Stream s, float* y, const float* b, int64_t n, int64_t o) override {
    cuda::bias_forward(y, b, n, o, stream(s));
  }
  void bias_backward(Stream s, float* db, const float* dy, int64_t n, int64_t o) override {
    cuda::bias_backward(db, dy, n, o, stream(s));
  }
  void embedding_forward(Stream s, float* out, const void* table, DType tt, const int32_t* ids,
                         int64_t n, int64_t c) override {
    STRATA_ASSERT(tt == DType::f32 || tt == DType::bf16, "embedding table must be f32 or bf16");
    checks_pending_[int(s)] = true;
    cuda::embedding_forward(out, table, tt == DType::bf16, ids, n, c, error_word_, stream(s));
  }
  void embedding_backward(Stream s, float* dtable, const float* dout, const int32_t* ids,
                          int64_t n, int64_t c) override {
    checks_pending_[int(s)] = true;
    cuda::embedding_backward(dtable, dout, ids, n, c, error_word_, stream(s));
  }
  void attention_forward(Stream s, float* out, float* lse, const float* q, const float* k,
                         const float* v, const int32_t* doc_start, int64_t b, int64_t t,
                         int64_t h, int64_t hk, int64_t d, float scale) override {
    if (doc_start) checks_pending_[int(s)] = true;
    cuda::attention_forward(out, lse, q, k, v, doc_start, b, t, h, hk, d, scale, error_word_, stream(s));
  }
  void attention_backward(Stream s, float* dq, float* dk, float* dv, const float* dout,
                          const float* q, const float* k, const float* v, const float* out,
                          const float* lse, const int32_t* doc_start, int64_t b, int64_t t,
                          int64_t h, int64_t hk, int64_t d, float scale) override {
    if (doc_start) checks_pending_[int(s)] = true;
    cuda::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, doc_start, b, t, h, hk, d, scale,
                             error_word_, stream(s));
  }
  void lm_head_ce(Stream s, double* loss_sum, float* dh, float* dw, const float* h, const void* w,
                  DType wt, const int32_t* targets, int64_t n, int64_t c, int64_t v,
                  float grad_scale) override {
    STRATA_ASSERT(wt == DType::f32 || wt == DType::bf16, "lm_head weights must be f32 or bf16");
    STRATA_CHECK(c > 0 && v > 0, "lm_head_ce: sizes must be positive (got c=", c, " v=", v, ")");
    void* ws = ce_workspace(cuda::lm_head_ce_workspace_bytes(c, v));
    checks_pending_[int(s)] = true;
    cuda::lm_head_ce(cublas(s), stream(s), loss_sum, dh, dw, h, w, wt == DType::bf16, targets, n, c,
                     v, grad_scale, ws, ce_workspace_bytes_, error_word_);
  }
  void add_inplace(Stream s, float* y, const float* x, int64_t n) override {
    cuda::add_inplace(y, x, n, stream(s));
  }
  void cast_f32_to_bf16(Stream s, bf16* out, const float* in, int64_t n) override {
    cuda::cast_f32_to_bf16(out, in, n, stream(s));
  }

 private:
  cudaStream_t stream(Stream s) const { return streams_[int(s)]; }

  // The cuBLAS handle of a stream, created on first use with its own workspace from the arena
  // (so cuBLAS allocates nothing behind the budget's back and streams never share one).
  cublasHandle_t cublas(Stream s) {
    cublasHandle_t& h = cublas_[int(s)];
    if (!h) {
      void* ws = alloc(kCublasWorkspaceBytes, str_cat("cuBLAS workspace (stream ", int(s), ")"));
      STRATA_CUBLAS_DEVICE_CHECK(cublasCreate(&h));
      STRATA_CUBLAS_DEVICE_CHECK(cublasSetStream(h, stream(s)));
      STRATA_CUBLAS_DEVICE_CHECK(cublasSetWorkspace(h, ws, kCublasWorkspaceBytes));
    }
    return h;
  }

  // The lm_head_ce logits workspace, grown on demand. Growing waits for every stream, since
  // work already queued may still use the old one.
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
    STRATA_CUDA_DEVICE_CHECK(cudaMemcpyAsync(error_word_host_, error_word_, sizeof(int),
                                             cudaMemcpyDeviceToHost, st));
    STRATA_CUDA_DEVICE_CHECK(cudaStreamSynchronize(st));
    const int bits = *error_word_host_;
    if (bits == 0) return;
    STRATA_CUDA_DEVICE_CHECK(cudaMemsetAsync(error_word_, 0, sizeof(int), st));
    STRATA_CUDA_DEVICE_CHECK(cudaStreamSynchronize(st));
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
  int* error_word_ = nullptr;       // device, KernelError bits
  int* error_word_host_ = nullptr;  // pinned, read back at synchronize
  std::atomic<bool> checks_pending_[kStreamCount] = {};
  void* ce_workspace_ = nullptr;
  size_t ce_workspace_bytes_ = 0;
  std::atomic<size_t> h2d_bytes_{0}, d2h_bytes_{0};
};

}  // namespace

std::unique_ptr<Device> device_create_cuda(const DeviceOptions& options) {
  return std::make_unique<CudaDevice>(options);
}

}  // namespace strata
