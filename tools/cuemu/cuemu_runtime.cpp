// cuemu_runtime.cpp - the CUDA runtime calls strata's backend uses, on the CPU: device memory
// (NaN-poisoned, budgeted), copies with direction checks, streams as worker threads with seeded
// random delays, events, device queries, and error reporting. Definitions sit in extern "C" against
// the declarations of the real cuda_runtime_api.h, so a signature that drifts fails to compile.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#include "tools/cuemu/cuemu_internal.h"

// ---- streams and events (the runtime's opaque types) -------------------------------------------
struct CUstream_st {
  explicit CUstream_st(uint64_t seed) : rng(seed), worker([this] { run(); }) {}
  ~CUstream_st() {
    {
      std::lock_guard<std::mutex> lock(m);
      stop = true;
    }
    cv.notify_all();
    worker.join();
  }
  void push(std::function<void()> op) {
    {
      std::lock_guard<std::mutex> lock(m);
      queue.push_back(std::move(op));
      ++submitted;
    }
    cv.notify_all();
  }
  void drain() {
    std::unique_lock<std::mutex> lock(m);
    uint64_t target = submitted;
    cv.wait(lock, [&] { return completed >= target; });
  }
  bool idle() {
    std::lock_guard<std::mutex> lock(m);
    return completed == submitted;
  }

  std::mutex m;
  std::condition_variable cv;
  std::deque<std::function<void()>> queue;
  uint64_t submitted = 0, completed = 0;
  bool stop = false;
  int pins = 0;         // drain_all calls holding this stream (guarded by g_streams_mutex)
  bool doomed = false;  // destroyed while pinned: the last drain_all to unpin it deletes it
  std::mt19937_64 rng;
  std::thread worker;

 private:
  void run() {
    for (;;) {
      std::function<void()> op;
      int delay_us = 0;
      {
        std::unique_lock<std::mutex> lock(m);
        cv.wait(lock, [&] { return stop || !queue.empty(); });
        if (queue.empty()) return;
        op = std::move(queue.front());
        queue.pop_front();
        int max_us = cuemu::detail::options_current().max_delay_us;
        if (max_us > 0) delay_us = static_cast<int>(rng() % static_cast<uint64_t>(max_us + 1));
      }
      if (delay_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
      op();
      {
        std::lock_guard<std::mutex> lock(m);
        ++completed;
      }
      cv.notify_all();
    }
  }
};

struct CUevent_st {
  std::mutex m;
  std::condition_variable cv;
  uint64_t recorded = 0, completed = 0;
  bool timing = true;
  std::chrono::steady_clock::time_point when{};
};

namespace cuemu::detail {
namespace {

Options options_from_environment() {
  Options o;
  auto env = [](const char* name) -> const char* {
    const char* v = std::getenv(name);
    return v && *v ? v : nullptr;
  };
  if (const char* v = env("CUEMU_THREADS")) o.executor = std::atoi(v) ? Executor::threads : Executor::fibers;
#if defined(__SANITIZE_THREAD__)
  if (!env("CUEMU_THREADS")) o.executor = Executor::threads;  // TSan cannot follow fibers
#endif
  if (const char* v = env("CUEMU_SEED")) o.seed = std::strtoull(v, nullptr, 10);
  if (const char* v = env("CUEMU_SHUFFLE")) o.shuffle_blocks = std::atoi(v) != 0;
  if (const char* v = env("CUEMU_DELAY_US")) o.max_delay_us = std::max(0, std::atoi(v));
  if (const char* v = env("CUEMU_HAZARD"))
    o.hazard_policy = std::strcmp(v, "record") == 0 ? HazardPolicy::record : HazardPolicy::abort_process;
  return o;
}
Options g_options = options_from_environment();

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}
// Read at each call, so a test can emulate a machine without a GPU or with an old driver.
int device_count() { return std::max(0, env_int("CUEMU_DEVICES", 1)); }
const size_t g_memory_bytes = static_cast<size_t>(env_int("CUEMU_MEM_MIB", 81559)) << 20;

thread_local cudaError_t tl_last_error = cudaSuccess;

// Device allocations: start -> bytes.
std::shared_mutex g_dev_mutex;
std::map<uintptr_t, size_t> g_dev;
size_t g_dev_bytes = 0;

std::mutex g_streams_mutex;
std::set<CUstream_st*> g_streams;
uint64_t g_stream_serial = 0;

std::mutex g_func_mutex;
std::map<const void*, size_t> g_func_smem;

size_t device_rounded(size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

bool is_legacy(cudaStream_t s) { return s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread; }

// The legacy default stream waits for all queued work; cuemu then runs its op on the caller.
// Each stream is pinned while the walk holds it: another thread's cudaStreamDestroy (a rank of an
// emulated NCCL run tearing down its device) then leaves the deletion to the walk, as a GPU
// releases a destroyed stream's resources once its work is done, without blocking the caller.
void drain_all() {
  std::vector<CUstream_st*> all, doomed;
  {
    std::lock_guard<std::mutex> lock(g_streams_mutex);
    all.assign(g_streams.begin(), g_streams.end());
    for (CUstream_st* s : all) ++s->pins;
  }
  for (CUstream_st* s : all) s->drain();
  {
    std::lock_guard<std::mutex> lock(g_streams_mutex);
    for (CUstream_st* s : all)
      if (--s->pins == 0 && s->doomed) doomed.push_back(s);
  }
  for (CUstream_st* s : doomed) delete s;
}

const char* kind_name(cudaMemcpyKind k) {
  switch (k) {
    case cudaMemcpyHostToHost: return "cudaMemcpyHostToHost";
    case cudaMemcpyHostToDevice: return "cudaMemcpyHostToDevice";
    case cudaMemcpyDeviceToHost: return "cudaMemcpyDeviceToHost";
    case cudaMemcpyDeviceToDevice: return "cudaMemcpyDeviceToDevice";
    default: return "cudaMemcpyDefault";
  }
}

// Validates a copy against where its pointers really are. Stricter than a GPU (which accepts some
// mismatches under unified addressing): a wrong direction is a bug in strata either way.
cudaError_t copy_check(const char* call, void* dst, const void* src, size_t bytes, cudaMemcpyKind& kind) {
  bool dst_dev = is_device_range(dst, bytes), src_dev = is_device_range(src, bytes);
  bool dst_in = is_device_range(dst, 0), src_in = is_device_range(src, 0);
  if ((dst_in && !dst_dev) || (src_in && !src_dev)) {
    report("%s: %zu bytes run past the end of the device allocation holding %s %p", call, bytes,
           dst_in && !dst_dev ? "destination" : "source", dst_in && !dst_dev ? dst : src);
    return set_last_error(cudaErrorInvalidValue);
  }
  if (kind == cudaMemcpyDefault)
    kind = dst_dev ? (src_dev ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                   : (src_dev ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
  bool want_dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  bool want_src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDeviceToDevice) return set_last_error(cudaErrorInvalidMemcpyDirection);
  if (dst_dev != want_dst_dev || src_dev != want_src_dev) {
    report("%s: %s but the destination %p is %s memory and the source %p is %s memory", call, kind_name(kind), dst,
           dst_dev ? "device" : "host", src, src_dev ? "device" : "host");
    return set_last_error(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

cudaError_t copy_async(const char* call, void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                       cudaStream_t stream) {
  if (cudaError_t e = copy_check(call, dst, src, bytes, kind)) return e;
  if (!stream_known(stream)) return set_last_error(cudaErrorInvalidResourceHandle);
  if (bytes == 0) return cudaSuccess;
  // A pinned host side is copied on the stream, between pinned_copy_begin and pinned_copy_end.
  const bool h2d = kind == cudaMemcpyHostToDevice, d2h = kind == cudaMemcpyDeviceToHost;
  const void* host = h2d ? src : dst;
  if ((h2d || d2h) && is_pinned_range(host, bytes)) {
    PinnedCopy pc = pinned_copy_begin(host, bytes, d2h);
    return stream_submit(stream, [=] {
      if (h2d) pinned_read(dst, src, bytes);
      else pinned_write(dst, src, bytes);
      pinned_copy_end(pc);
    });
  }
  if (h2d) {
    // Pageable source: the runtime stages it before returning, so the caller may reuse it at once.
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src), static_cast<const char*>(src) + bytes);
    return stream_submit(stream, [=] { std::memcpy(dst, staged->data(), bytes); });
  }
  if (d2h) {
    // Pageable destination: the runtime returns only once the bytes have landed.
    auto landed = std::make_shared<std::promise<void>>();
    std::future<void> done = landed->get_future();
    cudaError_t e = stream_submit(stream, [=] {
      std::memcpy(dst, src, bytes);
      landed->set_value();
    });
    if (e == cudaSuccess) done.wait();
    return e;
  }
  return stream_submit(stream, [=] { std::memmove(dst, src, bytes); });
}

}  // namespace

const Options& options_current() { return g_options; }

namespace {
// One "cuemu: <prefix><message>" line on stderr.
void report_line(const char* prefix, const char* fmt, va_list ap) {
  char buf[1024];
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  std::fprintf(stderr, "cuemu: %s%s\n", prefix, buf);
}
}  // namespace

void report(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  report_line("", fmt, ap);
  va_end(ap);
}

void fatal(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  report_line("FATAL: ", fmt, ap);
  va_end(ap);
  std::fflush(stderr);
  std::abort();
}

cudaError_t set_last_error(cudaError_t e) {
  if (e != cudaSuccess) tl_last_error = e;
  return e;
}

bool stream_known(cudaStream_t s) {
  if (is_legacy(s)) return true;
  std::lock_guard<std::mutex> lock(g_streams_mutex);
  return g_streams.count(s) != 0;
}

cudaError_t stream_submit(cudaStream_t s, std::function<void()> op) {
  if (!stream_known(s)) return set_last_error(cudaErrorInvalidResourceHandle);
  if (is_legacy(s)) {
    drain_all();
    op();
    return cudaSuccess;
  }
  s->push(std::move(op));
  return cudaSuccess;
}

bool is_device_range(const void* p, size_t bytes) {
  uintptr_t a = reinterpret_cast<uintptr_t>(p);
  std::shared_lock<std::shared_mutex> lock(g_dev_mutex);
  auto it = g_dev.upper_bound(a);
  if (it == g_dev.begin()) return false;
  --it;
  uintptr_t end = it->first + it->second;
  return bytes == 0 ? a <= end : a + bytes <= end;
}

size_t kernel_max_dynamic_smem(const void* kernel) {
  std::lock_guard<std::mutex> lock(g_func_mutex);
  auto it = g_func_smem.find(kernel);
  return it == g_func_smem.end() ? kDefaultDynamicSmemBytes : it->second;
}

}  // namespace cuemu::detail

namespace cuemu {
Options cuemu_get_options() { return detail::g_options; }
void cuemu_set_options(const Options& options) { detail::g_options = options; }
size_t cuemu_device_bytes_in_use() {
  std::shared_lock<std::shared_mutex> lock(detail::g_dev_mutex);
  return detail::g_dev_bytes;
}
}  // namespace cuemu

using namespace cuemu::detail;

extern "C" {

// ---- errors --------------------------------------------------------------------------------------
cudaError_t cudaGetLastError(void) {
  cudaError_t e = tl_last_error;
  tl_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError(void) { return tl_last_error; }

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorInsufficientDriver: return "cudaErrorInsufficientDriver";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorHostMemoryAlreadyRegistered: return "cudaErrorHostMemoryAlreadyRegistered";
    case cudaErrorHostMemoryNotRegistered: return "cudaErrorHostMemoryNotRegistered";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    default: return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorInsufficientDriver: return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorHostMemoryAlreadyRegistered: return "part or all of the requested memory range is already mapped";
    case cudaErrorHostMemoryNotRegistered: return "pointer does not correspond to a registered memory region";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorNotSupported: return "operation not supported";
    default: return "unknown error (cuemu)";
  }
}

// ---- device ------------------------------------------------------------------------------------
cudaError_t cudaGetDeviceCount(int* count) {
  if (!count) return set_last_error(cudaErrorInvalidValue);
  *count = device_count();
  return *count == 0 ? set_last_error(cudaErrorNoDevice) : cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= device_count()) return set_last_error(device_count() ? cudaErrorInvalidDevice : cudaErrorNoDevice);
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  if (device_count() <= 0) return set_last_error(cudaErrorNoDevice);
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* v) {
  *v = env_int("CUEMU_DRIVER", 13000);
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device) {
  if (!p) return set_last_error(cudaErrorInvalidValue);
  if (device < 0 || device >= device_count()) return set_last_error(cudaErrorInvalidDevice);
  std::memset(p, 0, sizeof *p);
  std::snprintf(p->name, sizeof p->name, "cuemu emulated GPU (sm_90, H100-like)");
  p->totalGlobalMem = g_memory_bytes;
  p->sharedMemPerBlock = kDefaultDynamicSmemBytes;
  p->sharedMemPerBlockOptin = kOptInDynamicSmemBytes;
  p->sharedMemPerMultiprocessor = 233472;
  p->regsPerBlock = 65536;
  p->regsPerMultiprocessor = 65536;
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  p->maxThreadsPerMultiProcessor = 2048;
  p->maxThreadsDim[0] = 1024;
  p->maxThreadsDim[1] = 1024;
  p->maxThreadsDim[2] = 64;
  p->maxGridSize[0] = 0x7fffffff;
  p->maxGridSize[1] = 65535;
  p->maxGridSize[2] = 65535;
  p->totalConstMem = 65536;
  p->major = 9;
  p->minor = 0;
  p->multiProcessorCount = 132;
  p->l2CacheSize = 50 * 1024 * 1024;
  p->memoryBusWidth = 5120;
  p->asyncEngineCount = 2;
  p->unifiedAddressing = 1;
  p->canMapHostMemory = 1;
  p->concurrentKernels = 1;
  p->pciBusID = 1;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  cudaDeviceProp p;
  if (cudaError_t e = cudaGetDeviceProperties(&p, device)) return e;
  switch (attr) {
    case cudaDevAttrComputeCapabilityMajor: *value = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = p.minor; break;
    case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; break;
    case cudaDevAttrMaxThreadsPerBlock: *value = p.maxThreadsPerBlock; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = static_cast<int>(p.sharedMemPerBlock); break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = static_cast<int>(p.sharedMemPerBlockOptin); break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = static_cast<int>(p.sharedMemPerMultiprocessor); break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrL2CacheSize: *value = p.l2CacheSize; break;
    case cudaDevAttrMaxBlockDimX: *value = 1024; break;
    case cudaDevAttrMaxBlockDimY: *value = 1024; break;
    case cudaDevAttrMaxBlockDimZ: *value = 64; break;
    case cudaDevAttrMaxGridDimX: *value = 0x7fffffff; break;
    case cudaDevAttrMaxGridDimY: *value = 65535; break;
    case cudaDevAttrMaxGridDimZ: *value = 65535; break;
    case cudaDevAttrMaxRegistersPerBlock: *value = 65536; break;
    case cudaDevAttrUnifiedAddressing: *value = 1; break;
    case cudaDevAttrAsyncEngineCount: *value = 2; break;
    default: *value = 0; break;
  }
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  std::shared_lock<std::shared_mutex> lock(g_dev_mutex);
  *total_bytes = g_memory_bytes;
  *free_bytes = g_memory_bytes - std::min(g_memory_bytes, g_dev_bytes);
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  drain_all();
  return cudaSuccess;
}
cudaError_t cudaDeviceReset(void) {
  drain_all();
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (!func) return set_last_error(cudaErrorInvalidDeviceFunction);
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value < 0 || static_cast<size_t>(value) > kOptInDynamicSmemBytes) {
      report("cudaFuncSetAttribute: MaxDynamicSharedMemorySize %d exceeds the device's opt-in limit %zu", value,
             kOptInDynamicSmemBytes);
      return set_last_error(cudaErrorInvalidValue);
    }
    std::lock_guard<std::mutex> lock(g_func_mutex);
    g_func_smem[func] = static_cast<size_t>(value);
  }
  return cudaSuccess;
}

// ---- device memory ------------------------------------------------------------------------------
cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (!p) return set_last_error(cudaErrorInvalidValue);
  *p = nullptr;
  if (device_count() <= 0) return set_last_error(cudaErrorNoDevice);
  if (bytes == 0) return cudaSuccess;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  size_t rounded = (bytes + page - 1) / page * page;
  {
    std::unique_lock<std::shared_mutex> lock(g_dev_mutex);
    if (g_dev_bytes + rounded > g_memory_bytes) return set_last_error(cudaErrorMemoryAllocation);
    g_dev_bytes += rounded;
  }
  // Own pages (mmap), never shared with the host heap: pinned-page protection cannot reach device
  // memory, and a kernel touching freed device memory faults.
  void* q = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (q == MAP_FAILED) {
    std::unique_lock<std::shared_mutex> lock(g_dev_mutex);
    g_dev_bytes -= rounded;
    return set_last_error(cudaErrorMemoryAllocation);
  }
  std::memset(q, 0xff, rounded);  // POISON: uninitialised device memory reads as NaN (f32 and bf16)
  std::unique_lock<std::shared_mutex> lock(g_dev_mutex);
  g_dev[reinterpret_cast<uintptr_t>(q)] = bytes;
  *p = q;
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  size_t bytes = 0;
  drain_all();  // cudaFree synchronises the device
  {
    std::unique_lock<std::shared_mutex> lock(g_dev_mutex);
    auto it = g_dev.find(reinterpret_cast<uintptr_t>(p));
    if (it == g_dev.end()) {
      report("cudaFree(%p): not the start of a live cudaMalloc allocation", p);
      return set_last_error(cudaErrorInvalidValue);
    }
    bytes = device_rounded(it->second);
    g_dev_bytes -= bytes;
    g_dev.erase(it);
  }
  munmap(p, bytes);
  return cudaSuccess;
}

cudaError_t cudaMallocAsync(void** p, size_t bytes, cudaStream_t stream) {
  if (!stream_known(stream)) return set_last_error(cudaErrorInvalidResourceHandle);
  return cudaMalloc(p, bytes);
}
cudaError_t cudaFreeAsync(void* p, cudaStream_t stream) {
  if (!stream_known(stream)) return set_last_error(cudaErrorInvalidResourceHandle);
  if (p && !is_device_range(p, 1)) return set_last_error(cudaErrorInvalidValue);
  return stream_submit(stream, [p] {
    std::unique_lock<std::shared_mutex> lock(g_dev_mutex);
    auto it = g_dev.find(reinterpret_cast<uintptr_t>(p));
    if (it == g_dev.end()) return;
    size_t bytes = device_rounded(it->second);
    g_dev_bytes -= bytes;
    g_dev.erase(it);
    munmap(p, bytes);
  });
}

// ---- pinned host memory -------------------------------------------------------------------------
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int flags) {
  if (!p) return set_last_error(cudaErrorInvalidValue);
  long page = sysconf(_SC_PAGESIZE);
  size_t rounded = std::max<size_t>((bytes + page - 1) / page * page, page);  // own pages: protection stays local
  void* q = std::aligned_alloc(static_cast<size_t>(page), rounded);
  if (!q) return set_last_error(cudaErrorMemoryAllocation);
  pinned_register(q, rounded);
  *p = q;
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void** p, size_t bytes) { return cudaHostAlloc(p, bytes, cudaHostAllocDefault); }
cudaError_t cudaFreeHost(void* p) {
  if (!p) return cudaSuccess;
  drain_all();
  if (!pinned_unregister(p)) return set_last_error(cudaErrorInvalidValue);
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaHostRegister(void* p, size_t bytes, unsigned int flags) {
  if (!p || bytes == 0) return set_last_error(cudaErrorInvalidValue);
  if (is_pinned_range(p, 1) || is_pinned_range(static_cast<char*>(p) + bytes - 1, 1))
    return set_last_error(cudaErrorHostMemoryAlreadyRegistered);
  pinned_register(p, bytes);
  return cudaSuccess;
}
cudaError_t cudaHostUnregister(void* p) {
  drain_all();
  return pinned_unregister(p) ? cudaSuccess : set_last_error(cudaErrorHostMemoryNotRegistered);
}
cudaError_t cudaHostGetDevicePointer(void** dev, void* host, unsigned int flags) {
  if (!is_pinned_range(host, 1)) return set_last_error(cudaErrorInvalidValue);
  *dev = host;  // unified addressing: the same pointer
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p) {
  std::memset(a, 0, sizeof *a);
  a->device = 0;
  if (is_device_range(p, 1)) {
    a->type = cudaMemoryTypeDevice;
    a->devicePointer = const_cast<void*>(p);
  } else if (is_pinned_range(p, 1)) {
    a->type = cudaMemoryTypeHost;
    a->devicePointer = const_cast<void*>(p);
    a->hostPointer = const_cast<void*>(p);
  } else {
    a->type = cudaMemoryTypeUnregistered;
    a->hostPointer = const_cast<void*>(p);
  }
  return cudaSuccess;
}

// ---- copies and sets ------------------------------------------------------------------------------
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  return copy_async("cudaMemcpyAsync", dst, src, bytes, kind, stream);
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  return copy_async("cudaMemcpy", dst, src, bytes, kind, nullptr);
}
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream) {
  if (!is_device_range(dst, bytes)) {
    report("cudaMemsetAsync: %p + %zu bytes is not inside one device allocation", dst, bytes);
    return set_last_error(cudaErrorInvalidValue);
  }
  return stream_submit(stream, [=] { std::memset(dst, value, bytes); });
}
cudaError_t cudaMemset(void* dst, int value, size_t bytes) { return cudaMemsetAsync(dst, value, bytes, nullptr); }

// ---- streams ------------------------------------------------------------------------------------
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  if (!s) return set_last_error(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(g_streams_mutex);
  *s = new CUstream_st(g_options.seed * 1000003u + ++g_stream_serial);
  g_streams.insert(*s);
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned int flags, int priority) {
  return cudaStreamCreateWithFlags(s, flags);
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (is_legacy(s) || !stream_known(s)) return set_last_error(cudaErrorInvalidResourceHandle);
  s->drain();  // queued work still completes, as on a GPU
  {
    std::lock_guard<std::mutex> lock(g_streams_mutex);
    g_streams.erase(s);
    if (s->pins > 0) {  // a drain_all on another thread holds it and deletes it when done
      s->doomed = true;
      return cudaSuccess;
    }
  }
  delete s;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (!stream_known(s)) return set_last_error(cudaErrorInvalidResourceHandle);
  if (is_legacy(s)) drain_all();
  else s->drain();
  return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t s) {
  if (!stream_known(s)) return set_last_error(cudaErrorInvalidResourceHandle);
  if (is_legacy(s)) return cudaSuccess;
  return s->idle() ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void* user) {
  return stream_submit(s, [fn, user] { fn(user); });
}

// ---- events -------------------------------------------------------------------------------------
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags) {
  if (!e) return set_last_error(cudaErrorInvalidValue);
  *e = new CUevent_st;
  (*e)->timing = !(flags & cudaEventDisableTiming);
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  if (!e) return set_last_error(cudaErrorInvalidResourceHandle);
  cudaEventSynchronize(e);  // a GPU releases it once its work completes; cuemu waits for that
  delete e;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  if (!e) return set_last_error(cudaErrorInvalidResourceHandle);
  if (!stream_known(s)) return set_last_error(cudaErrorInvalidResourceHandle);
  uint64_t generation;
  {
    std::lock_guard<std::mutex> lock(e->m);
    generation = ++e->recorded;
  }
  return stream_submit(s, [e, generation] {
    // Notified under the lock: the host may destroy the event as soon as it sees it complete
    // (cudaEventQuery, then cudaEventDestroy), so nothing may touch e after the lock is released.
    std::lock_guard<std::mutex> lock(e->m);
    e->completed = std::max(e->completed, generation);
    e->when = std::chrono::steady_clock::now();
    e->cv.notify_all();
  });
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (!e) return set_last_error(cudaErrorInvalidResourceHandle);
  std::unique_lock<std::mutex> lock(e->m);
  uint64_t target = e->recorded;
  e->cv.wait(lock, [&] { return e->completed >= target; });
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (!e) return set_last_error(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> lock(e->m);
  return e->completed >= e->recorded ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (!ms || !start || !end) return set_last_error(cudaErrorInvalidValue);
  std::scoped_lock lock(start->m, end->m);
  if (!start->timing || !end->timing) return set_last_error(cudaErrorInvalidResourceHandle);
  if (start->recorded == 0 || end->recorded == 0) return set_last_error(cudaErrorInvalidResourceHandle);
  if (start->completed < start->recorded || end->completed < end->recorded) return cudaErrorNotReady;
  *ms = std::chrono::duration<float, std::milli>(end->when - start->when).count();
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
  if (!e) return set_last_error(cudaErrorInvalidResourceHandle);
  uint64_t target;
  {
    std::lock_guard<std::mutex> lock(e->m);
    target = e->recorded;  // the most recent record at the time of the call, as CUDA specifies
  }
  return stream_submit(s, [e, target] {
    std::unique_lock<std::mutex> lock(e->m);
    e->cv.wait(lock, [&] { return e->completed >= target; });
  });
}

}  // extern "C"
