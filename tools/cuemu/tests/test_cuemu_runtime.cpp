// Tests of cuemu's runtime: NaN-poisoned allocations, copy-direction checks, streams and events
// across streams, device queries (no GPU, old driver, out of memory), and the pinned-buffer hazard
// detector with its seeded bug (a staging buffer reused before its async copy finished).
#include <cuda_runtime_api.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "tools/cuemu/cuemu_control.h"
#include "tools/cuemu/tests/test_kernels.h"

namespace {

struct ScopedOptions {
  cuemu::Options saved = cuemu::cuemu_get_options();
  explicit ScopedOptions(const cuemu::Options& o) { cuemu::cuemu_set_options(o); }
  ~ScopedOptions() { cuemu::cuemu_set_options(saved); }
};

struct ScopedEnv {
  const char* name;
  explicit ScopedEnv(const char* n, const char* v) : name(n) { setenv(n, v, 1); }
  ~ScopedEnv() { unsetenv(name); }
};

// A gate: enqueued on a stream as a host callback, it holds the stream until the test opens it,
// so the work queued behind it is certainly still in flight (no sleeps, no timing). `entered` and
// `opened` bracket the time the stream was held, on the clock cuemu's events use.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open_ = false;
  std::chrono::steady_clock::time_point entered, opened;
  void enqueue(cudaStream_t s) { REQUIRE(cudaLaunchHostFunc(s, &Gate::hold, this) == cudaSuccess); }
  void open() {
    {
      std::lock_guard lock(mu);
      open_ = true;
      opened = std::chrono::steady_clock::now();
    }
    cv.notify_all();
  }
  void wait_entered() {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return entered.time_since_epoch().count() != 0; });
  }
  static void CUDART_CB hold(void* self) {
    auto* g = static_cast<Gate*>(self);
    std::unique_lock lock(g->mu);
    g->entered = std::chrono::steady_clock::now();
    g->cv.notify_all();
    g->cv.wait(lock, [&] { return g->open_; });
  }
};

float* device_floats(size_t n) {
  void* p = nullptr;
  REQUIRE(cudaMalloc(&p, n * sizeof(float)) == cudaSuccess);
  return static_cast<float*>(p);
}

}  // namespace

TEST_CASE("cuemu device memory starts as NaN", "[cuda-emu]") {
  const size_t n = 17;
  float* d = device_floats(n);
  std::vector<uint32_t> bits(n);
  REQUIRE(cudaMemcpy(bits.data(), d, n * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
  for (uint32_t b : bits) {
    float f;
    std::memcpy(&f, &b, 4);
    CHECK(std::isnan(f));
    CHECK((b & 0xffffu) == 0xffffu);  // also NaN read as bf16
  }
  CHECK(cuemu::cuemu_device_bytes_in_use() >= n * 4);
  REQUIRE(cudaFree(d) == cudaSuccess);
  CHECK(cudaFree(d) == cudaErrorInvalidValue);  // double free is refused
  cudaGetLastError();
}

TEST_CASE("cuemu copy-direction and bounds checks", "[cuda-emu]") {
  std::vector<float> host(64, 3.f), back(64, 0.f);
  float* d = device_floats(64);
  cudaGetLastError();
  CHECK(cudaMemcpy(d, host.data(), 64 * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  // HostToDevice into host memory, DeviceToHost from host memory, DeviceToDevice with a host side.
  CHECK(cudaMemcpy(back.data(), host.data(), 64 * 4, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
  CHECK(cudaMemcpy(back.data(), host.data(), 64 * 4, cudaMemcpyDeviceToHost) == cudaErrorInvalidValue);
  CHECK(cudaMemcpy(d, host.data(), 64 * 4, cudaMemcpyDeviceToDevice) == cudaErrorInvalidValue);
  CHECK(cudaMemcpy(host.data(), d, 64 * 4, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
  CHECK(cudaMemcpyAsync(back.data(), d, 64 * 4, cudaMemcpyHostToDevice, nullptr) == cudaErrorInvalidValue);
  // Past the end of the allocation.
  CHECK(cudaMemcpy(d + 1, host.data(), 64 * 4, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
  CHECK(cudaMemset(d + 60, 0, 5 * 4) == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  // cudaMemcpyDefault infers the direction.
  CHECK(cudaMemcpy(back.data(), d, 64 * 4, cudaMemcpyDefault) == cudaSuccess);
  CHECK(back == host);
  cudaFree(d);
}

TEST_CASE("cuemu pageable async copies: source reusable at once, destination filled on return", "[cuda-emu]") {
  cudaStream_t s;
  REQUIRE(cudaStreamCreate(&s) == cudaSuccess);
  float* d = device_floats(8);
  std::vector<float> src(8, 1.f), dst(8, 0.f);
  Gate gate;
  gate.enqueue(s);  // the copy below is queued behind it
  REQUIRE(cudaMemcpyAsync(d, src.data(), 32, cudaMemcpyHostToDevice, s) == cudaSuccess);
  std::fill(src.begin(), src.end(), 2.f);  // legal: a pageable source is staged before the call returns
  gate.open();
  REQUIRE(cudaMemcpyAsync(dst.data(), d, 32, cudaMemcpyDeviceToHost, s) == cudaSuccess);
  CHECK(dst == std::vector<float>(8, 1.f));  // pageable destination: complete when the call returns
  cudaStreamDestroy(s);
  cudaFree(d);
}

TEST_CASE("cuemu events order work across streams, a missing wait reads NaN poison", "[cuda-emu]") {
  const int n = 1000;
  std::vector<float> h(n);
  for (int i = 0; i < n; ++i) h[i] = float(i % 13);
  cudaStream_t a, b;
  REQUIRE(cudaStreamCreate(&a) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking) == cudaSuccess);
  cudaEvent_t ready, start, stop;
  REQUIRE(cudaEventCreate(&ready) == cudaSuccess);
  REQUIRE(cudaEventCreate(&start) == cudaSuccess);
  REQUIRE(cudaEventCreate(&stop) == cudaSuccess);

  for (bool wait : {true, false}) {
    float *x = device_floats(n), *y = device_floats(n), *z = device_floats(n);
    REQUIRE(cudaMemcpy(x, h.data(), n * 4, cudaMemcpyHostToDevice) == cudaSuccess);
    REQUIRE(cudaEventRecord(start, a) == cudaSuccess);
    Gate gate;
    gate.enqueue(a);
    REQUIRE(cuemu_test::scale_add(y, x, 2.f, n, a) == cudaSuccess);  // y = 2x + 1, late
    REQUIRE(cudaEventRecord(ready, a) == cudaSuccess);
    REQUIRE(cudaEventRecord(stop, a) == cudaSuccess);
    CHECK(cudaEventQuery(ready) == cudaErrorNotReady);
    CHECK(cudaStreamQuery(a) == cudaErrorNotReady);
    if (wait) REQUIRE(cudaStreamWaitEvent(b, ready, 0) == cudaSuccess);
    REQUIRE(cuemu_test::scale_add(z, y, 2.f, n, b) == cudaSuccess);  // z = 2y + 1
    if (wait) {  // b waits for a: a must be let through first, once it is being held
      gate.wait_entered();
      gate.open();
    }
    REQUIRE(cudaStreamSynchronize(b) == cudaSuccess);
    if (!wait) gate.open();  // b ran while a was still held
    std::vector<float> got(n);
    REQUIRE(cudaMemcpyAsync(got.data(), z, n * 4, cudaMemcpyDeviceToHost, b) == cudaSuccess);
    REQUIRE(cudaEventSynchronize(stop) == cudaSuccess);
    if (wait) {
      for (int i = 0; i < n; ++i) REQUIRE(got[i] == 2.f * (2.f * h[i] + 1.f) + 1.f);
      float ms = 0;
      REQUIRE(cudaEventElapsedTime(&ms, start, stop) == cudaSuccess);
      // The gate lies between the two records: the events span at least the time it was held.
      const float held_ms = std::chrono::duration<float, std::milli>(gate.opened - gate.entered).count();
      CHECK(ms >= held_ms);
    } else {
      // Without the wait, stream b read y before stream a wrote it: the poison shows.
      int nans = 0;
      for (float v : got) nans += std::isnan(v);
      CHECK(nans == n);
    }
    CHECK(cudaEventQuery(ready) == cudaSuccess);
    cudaFree(x);
    cudaFree(y);
    cudaFree(z);
  }
  cudaEventDestroy(ready);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
}

TEST_CASE("cuemu device queries, no GPU, old driver and out of memory", "[cuda-emu]") {
  int count = -1;
  REQUIRE(cudaGetDeviceCount(&count) == cudaSuccess);
  CHECK(count == 1);
  cudaDeviceProp prop;
  REQUIRE(cudaGetDeviceProperties(&prop, 0) == cudaSuccess);
  CHECK(prop.major == 9);
  CHECK(prop.warpSize == 32);
  CHECK(prop.maxThreadsPerBlock == 1024);
  CHECK(prop.sharedMemPerBlockOptin == 232448);
  int driver = 0, runtime = 0;
  REQUIRE(cudaDriverGetVersion(&driver) == cudaSuccess);
  REQUIRE(cudaRuntimeGetVersion(&runtime) == cudaSuccess);
  CHECK(driver >= runtime);
  size_t free_bytes = 0, total = 0;
  REQUIRE(cudaMemGetInfo(&free_bytes, &total) == cudaSuccess);
  CHECK(free_bytes <= total);
  void* p = nullptr;
  CHECK(cudaMalloc(&p, total + 1) == cudaErrorMemoryAllocation);
  CHECK(p == nullptr);
  CHECK(std::string(cudaGetErrorString(cudaErrorMemoryAllocation)) == "out of memory");
  cudaGetLastError();
  {
    ScopedEnv no_gpu("CUEMU_DEVICES", "0");
    CHECK(cudaGetDeviceCount(&count) == cudaErrorNoDevice);
    CHECK(count == 0);
    CHECK(cudaSetDevice(0) == cudaErrorNoDevice);
    CHECK(cudaMalloc(&p, 16) == cudaErrorNoDevice);
  }
  {
    ScopedEnv old("CUEMU_DRIVER", "11080");
    REQUIRE(cudaDriverGetVersion(&driver) == cudaSuccess);
    CHECK(driver == 11080);
  }
  cudaGetLastError();
}

TEST_CASE("cuemu catches the seeded bug of a staging buffer reused before its copy finished",
          "[cuda-emu][seeded-bug]") {
  cuemu::Options o = cuemu::cuemu_get_options();
  o.hazard_policy = cuemu::HazardPolicy::record;
  ScopedOptions scope(o);
  cuemu::cuemu_take_hazards();
  const int n = 4096;
  cudaStream_t copy;
  REQUIRE(cudaStreamCreate(&copy) == cudaSuccess);
  float* staging = nullptr;
  REQUIRE(cudaMallocHost(reinterpret_cast<void**>(&staging), n * sizeof(float)) == cudaSuccess);
  float* d = device_floats(2 * n);
  cudaEvent_t copied;
  REQUIRE(cudaEventCreate(&copied) == cudaSuccess);

  SECTION("unguarded reuse: the host overwrites the staging buffer while its copy is queued") {
    for (int i = 0; i < n; ++i) staging[i] = 1.f;
    Gate gate;
    gate.enqueue(copy);
    REQUIRE(cudaMemcpyAsync(d, staging, n * sizeof(float), cudaMemcpyHostToDevice, copy) == cudaSuccess);
    staging[100] = 2.f;  // BUG: the copy above has not run yet
    gate.open();
    REQUIRE(cudaStreamSynchronize(copy) == cudaSuccess);
    std::vector<cuemu::Hazard> hz = cuemu::cuemu_take_hazards();
    REQUIRE(hz.size() == 1);
    CHECK(hz[0].buffer == reinterpret_cast<uintptr_t>(staging));
    CHECK(hz[0].offset == 100 * sizeof(float));
    CHECK(hz[0].host_wrote);
    CHECK_FALSE(hz[0].copy_to_host);
  }
  SECTION("reading a device->host destination before the copy landed") {
    REQUIRE(cudaMemset(d, 0, n * sizeof(float)) == cudaSuccess);
    Gate gate;
    gate.enqueue(copy);
    REQUIRE(cudaMemcpyAsync(staging, d, n * sizeof(float), cudaMemcpyDeviceToHost, copy) == cudaSuccess);
    volatile float early = staging[n - 1];  // BUG: no synchronize before reading
    (void)early;
    gate.open();
    REQUIRE(cudaStreamSynchronize(copy) == cudaSuccess);
    std::vector<cuemu::Hazard> hz = cuemu::cuemu_take_hazards();
    REQUIRE(hz.size() == 1);
    CHECK(hz[0].offset == (n - 1) * sizeof(float));
    CHECK_FALSE(hz[0].host_wrote);
    CHECK(hz[0].copy_to_host);
    CHECK(staging[0] == 0.f);  // the copy itself still landed
  }
  SECTION("double buffering guarded by events: no hazard and every chunk arrives intact") {
    for (int chunk = 0; chunk < 6; ++chunk) {
      REQUIRE(cudaEventSynchronize(copied) == cudaSuccess);  // staging free again
      for (int i = 0; i < n; ++i) staging[i] = float(chunk * n + i);
      REQUIRE(cudaMemcpyAsync(d + (chunk % 2) * n, staging, n * sizeof(float), cudaMemcpyHostToDevice, copy) ==
              cudaSuccess);
      REQUIRE(cudaEventRecord(copied, copy) == cudaSuccess);
      if (chunk >= 4) {
        REQUIRE(cudaStreamSynchronize(copy) == cudaSuccess);
        std::vector<float> back(n);
        REQUIRE(cudaMemcpy(back.data(), d + (chunk % 2) * n, n * sizeof(float), cudaMemcpyDeviceToHost) ==
                cudaSuccess);
        for (int i = 0; i < n; ++i) REQUIRE(back[i] == float(chunk * n + i));
      }
    }
    REQUIRE(cudaStreamSynchronize(copy) == cudaSuccess);
    CHECK(cuemu::cuemu_take_hazards().empty());
  }
  cudaEventDestroy(copied);
  cudaFree(d);
  cudaFreeHost(staging);
  cudaStreamDestroy(copy);
}

TEST_CASE("cuemu cudaHostRegister watches registered buffers too", "[cuda-emu][seeded-bug]") {
  cuemu::Options o = cuemu::cuemu_get_options();
  o.hazard_policy = cuemu::HazardPolicy::record;
  ScopedOptions scope(o);
  cuemu::cuemu_take_hazards();
  const size_t n = 3 * 4096 / sizeof(float) + 5;  // spans pages, not page-sized
  std::vector<float> buf(n, 4.f);
  REQUIRE(cudaHostRegister(buf.data(), n * sizeof(float), cudaHostRegisterDefault) == cudaSuccess);
  CHECK(cudaHostRegister(buf.data(), n * sizeof(float), cudaHostRegisterDefault) ==
        cudaErrorHostMemoryAlreadyRegistered);
  cudaGetLastError();
  float* d = device_floats(n);
  cudaStream_t s;
  REQUIRE(cudaStreamCreate(&s) == cudaSuccess);
  Gate gate;
  gate.enqueue(s);
  REQUIRE(cudaMemcpyAsync(d, buf.data(), n * sizeof(float), cudaMemcpyHostToDevice, s) == cudaSuccess);
  float before = buf[n / 2];  // reading a host->device source while in flight is fine
  buf[n / 2] = before + 1.f;  // writing it is the hazard
  gate.open();
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  std::vector<cuemu::Hazard> hz = cuemu::cuemu_take_hazards();
  REQUIRE(hz.size() == 1);
  CHECK(hz[0].offset == (n / 2) * sizeof(float));
  REQUIRE(cudaHostUnregister(buf.data()) == cudaSuccess);
  cudaStreamDestroy(s);
  cudaFree(d);
}

// cudaDeviceSynchronize (and every call that drains the whole device: cudaFree, cudaFreeHost,
// legacy-stream work) walks every stream; another thread destroying its stream meanwhile must not
// free a stream the walk still holds (seen as a hang and heap corruption when the ranks of an
// emulated NCCL run tore down their devices while one of them freed pinned memory). The walk is
// held on the first stream of its order by a gate while a second thread destroys the other one:
// the destroy returns at once, as on a GPU, and the walk finishes. The unfixed walk hangs here on
// the freed stream (AddressSanitizer reports the use after free).
TEST_CASE("cuemu device-wide drains survive streams destroyed by other threads", "[cuda-emu]") {
  cudaStream_t a, b;
  REQUIRE(cudaStreamCreate(&a) == cudaSuccess);
  REQUIRE(cudaStreamCreate(&b) == cudaSuccess);
  const bool a_first = std::less<cudaStream_t>()(a, b);  // the walk's order (the set's)
  cudaStream_t held = a_first ? a : b, doomed = a_first ? b : a;
  Gate gate;
  gate.enqueue(held);
  gate.wait_entered();
  std::atomic<cudaError_t> sync_rc{cudaErrorUnknown};
  std::thread syncer([&] { sync_rc = cudaDeviceSynchronize(); });
  // No event marks the walk reaching the gate; a pause lets it get there (if it has not, the
  // destroy below simply comes first and the case proves less, but still passes).
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(cudaStreamDestroy(doomed) == cudaSuccess);  // does not wait for the walk
  gate.open();
  syncer.join();
  CHECK(sync_rc.load() == cudaSuccess);
  CHECK(cudaStreamQuery(doomed) == cudaErrorInvalidResourceHandle);  // gone for the caller
  cudaGetLastError();
  REQUIRE(cudaStreamDestroy(held) == cudaSuccess);
}
