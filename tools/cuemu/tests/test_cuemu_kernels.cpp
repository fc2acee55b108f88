// Tests of cuemu's device side: block reductions (and the seeded missing-__syncthreads bug), warp
// shuffles and votes, atomics, dynamic shared memory, __syncthreads_count/and/or with exited
// threads, and the launch-bound checks - under both executors where it matters.
#include <cuda_runtime_api.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "tools/cuemu/cuemu_control.h"
#include "tools/cuemu/tests/test_kernels.h"

namespace {

// Sets cuemu options for one scope, restoring the previous ones after.
struct ScopedOptions {
  cuemu::Options saved = cuemu::cuemu_get_options();
  explicit ScopedOptions(const cuemu::Options& o) { cuemu::cuemu_set_options(o); }
  ~ScopedOptions() { cuemu::cuemu_set_options(saved); }
};

template <class T>
T* device_alloc(size_t count) {
  void* p = nullptr;
  REQUIRE(cudaMalloc(&p, count * sizeof(T)) == cudaSuccess);
  return static_cast<T*>(p);
}

template <class T>
std::vector<T> device_read(const T* d, size_t count) {
  std::vector<T> h(count);
  REQUIRE(cudaMemcpy(h.data(), d, count * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
  return h;
}

// Runs the block reduction over n values; returns per-block (got, exact in double) sums.
// distinct_blocks: every element of block b is b + 1, so a partial read from another block shows.
std::vector<std::pair<double, double>> run_reduction(int n, int threads, bool missing_sync, bool distinct_blocks) {
  std::mt19937 rng(static_cast<unsigned>(n));
  std::uniform_real_distribution<float> dist(0.5f, 1.5f);
  const int blocks = (n + threads - 1) / threads;
  std::vector<float> h(static_cast<size_t>(n));
  std::vector<double> exact(static_cast<size_t>(blocks), 0.0);
  for (int i = 0; i < n; ++i) {
    h[i] = distinct_blocks ? float(i / threads + 1) : dist(rng);
    exact[i / threads] += h[i];
  }
  float* x = device_alloc<float>(h.size());
  float* sums = device_alloc<float>(static_cast<size_t>(blocks));
  REQUIRE(cudaMemcpy(x, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cuemu_test::reduce_sum(x, sums, n, threads, missing_sync, nullptr) == cudaSuccess);
  std::vector<float> got = device_read(sums, static_cast<size_t>(blocks));
  std::vector<std::pair<double, double>> out;
  for (int b = 0; b < blocks; ++b) out.push_back({got[b], exact[b]});
  cudaFree(x);
  cudaFree(sums);
  return out;
}

}  // namespace

TEST_CASE("cuemu block reduction matches the exact sum under both executors", "[cuda-emu]") {
  for (cuemu::Executor ex : {cuemu::Executor::fibers, cuemu::Executor::threads}) {
    cuemu::Options o = cuemu::cuemu_get_options();
    o.executor = ex;
    ScopedOptions scope(o);
    for (int n : {1, 17, 255, 256, 1000, 4097}) {
      if (ex == cuemu::Executor::threads && n > 1000) continue;  // OS threads are slow; fibers cover it
      for (bool distinct : {false, true})
        for (auto [got, exact] : run_reduction(n, 256, false, distinct)) {
          INFO("n=" << n << " executor=" << (ex == cuemu::Executor::threads ? "threads" : "fibers"));
          // f32 sums of at most 256 values in [0.5, 1.5] or small integers: relative error < 1e-5.
          CHECK(std::abs(got - exact) <= 1e-5 * exact);
        }
    }
  }
}

TEST_CASE("cuemu catches the seeded missing __syncthreads in a reduction (wrong result)", "[cuda-emu][seeded-bug]") {
  cuemu::Options o = cuemu::cuemu_get_options();
  o.executor = cuemu::Executor::fibers;  // deterministic interleaving: warp 0 reads before the others write
  ScopedOptions scope(o);
  for (int n : {256, 1000, 4096}) {
    std::vector<std::pair<double, double>> sums = run_reduction(n, 256, true, true);
    int wrong = 0;
    for (auto [got, exact] : sums) wrong += std::abs(got - exact) > 1e-3 * exact;
    INFO("n=" << n << ": " << wrong << " of " << sums.size() << " block sums wrong");
    CHECK(wrong >= int(sums.size()) - 1);  // the bug must show in (nearly) every block
    // The same data with the barrier in place is right, so the failure above is the bug's.
    for (auto [got, exact] : run_reduction(n, 256, false, true)) CHECK(std::abs(got - exact) <= 1e-5 * exact);
  }
}

TEST_CASE("cuemu warp shuffles follow CUDA's lane arithmetic, widths included", "[cuda-emu]") {
  const int threads = 64;
  int* out = device_alloc<int>(4 * threads);
  for (int width : {32, 16, 8}) {
    for (int param : {1, 3, 5}) {
      REQUIRE(cuemu_test::shuffles(out, threads, param, width, nullptr) == cudaSuccess);
      std::vector<int> got = device_read(out, 4 * threads);
      for (int t = 0; t < threads; ++t) {
        const int lane = t % 32, base = t - lane, seg = lane / width * width, in_seg = lane % width;
        auto value = [&](int src_lane) { return (base + src_lane) * 10 + 1; };
        const int xor_src = lane ^ param;
        const int want_xor = xor_src / width == lane / width ? value(xor_src) : value(lane);
        const int want_down = in_seg + param < width ? value(lane + param) : value(lane);
        const int want_up = in_seg - param >= 0 ? value(lane - param) : value(lane);
        const int want_idx = value(seg + param % width);
        INFO("width=" << width << " param=" << param << " thread=" << t);
        CHECK(got[4 * t + 0] == want_xor);
        CHECK(got[4 * t + 1] == want_down);
        CHECK(got[4 * t + 2] == want_up);
        CHECK(got[4 * t + 3] == want_idx);
      }
    }
  }
  cudaFree(out);
}

TEST_CASE("cuemu ballot, any and all votes", "[cuda-emu]") {
  const int threads = 96;
  unsigned* out = device_alloc<unsigned>(3 * threads);
  for (int modulus : {1, 3, 32, 1000}) {
    REQUIRE(cuemu_test::votes(out, threads, modulus, nullptr) == cudaSuccess);
    std::vector<unsigned> got = device_read(out, 3 * threads);
    for (int t = 0; t < threads; ++t) {
      const int warp_base = t / 32 * 32;
      unsigned ballot = 0;
      for (int l = 0; l < 32; ++l)
        if ((warp_base + l) % modulus == 0) ballot |= 1u << l;
      INFO("modulus=" << modulus << " thread=" << t);
      CHECK(got[3 * t + 0] == ballot);
      CHECK(got[3 * t + 1] == unsigned(ballot != 0));
      CHECK(got[3 * t + 2] == unsigned(ballot == 0xffffffffu));
    }
  }
  cudaFree(out);
}

TEST_CASE("cuemu atomics under both executors", "[cuda-emu]") {
  for (cuemu::Executor ex : {cuemu::Executor::fibers, cuemu::Executor::threads}) {
    cuemu::Options o = cuemu::cuemu_get_options();
    o.executor = ex;
    ScopedOptions scope(o);
    const int blocks = 5, threads = 96, total = blocks * threads;
    float* fsum = device_alloc<float>(1);
    double* dsum = device_alloc<double>(1);
    int* counters = device_alloc<int>(5);
    const int init[5] = {0, -1, -1, 0, -7};
    REQUIRE(cudaMemset(fsum, 0, sizeof(float)) == cudaSuccess);
    REQUIRE(cudaMemset(dsum, 0, sizeof(double)) == cudaSuccess);
    REQUIRE(cudaMemcpy(counters, init, sizeof init, cudaMemcpyHostToDevice) == cudaSuccess);
    REQUIRE(cuemu_test::atomics(fsum, dsum, counters, blocks, threads, nullptr) == cudaSuccess);
    std::vector<int> c = device_read(counters, 5);
    CHECK(device_read(fsum, 1)[0] == float(total));  // integers in f32: exact
    CHECK(device_read(dsum, 1)[0] == 0.5 * total);
    CHECK(c[0] == total);
    CHECK(c[1] == total - 1);
    CHECK((c[2] >= 0 && c[2] < total));
    CHECK(c[3] == 1);  // exactly one CAS winner
    CHECK((c[4] >= 0 && c[4] < total));
    cudaFree(fsum);
    cudaFree(dsum);
    cudaFree(counters);
  }
}

TEST_CASE("cuemu dynamic shared memory and __syncthreads_count/and/or with exited threads", "[cuda-emu]") {
  const int n = 300, threads = 64;
  std::vector<float> h(n);
  for (int i = 0; i < n; ++i) h[i] = float(i) - 100.f;
  float* x = device_alloc<float>(n);
  float* y = device_alloc<float>(n);
  REQUIRE(cudaMemcpy(x, h.data(), n * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cuemu_test::reverse_in_shared(y, x, n, threads, threads * sizeof(float), nullptr) == cudaSuccess);
  std::vector<float> got = device_read(y, n);
  for (int i = 0; i < n; ++i) {
    const int base = i / threads * threads, t = i - base, src = base + threads - 1 - t;
    INFO("i=" << i);
    CHECK(got[i] == (src < n ? h[src] : 0.f));
  }

  const int blocks = 4, active = 50;  // threads 50..63 exit before the barriers
  std::vector<float> p(blocks * threads);
  for (int i = 0; i < blocks * threads; ++i) p[i] = (i % 7 == 0 || i / threads == 2) ? 1.f : -1.f;
  float* px = device_alloc<float>(p.size());
  int* out = device_alloc<int>(3 * blocks);
  REQUIRE(cudaMemcpy(px, p.data(), p.size() * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cuemu_test::block_votes(out, px, blocks, threads, active, nullptr) == cudaSuccess);
  std::vector<int> v = device_read(out, 3 * blocks);
  for (int b = 0; b < blocks; ++b) {
    int count = 0;
    for (int t = 0; t < active; ++t) count += p[b * threads + t] > 0.f;
    INFO("block " << b);
    CHECK(v[3 * b + 0] == count);
    CHECK(v[3 * b + 1] == int(count == active));
    CHECK(v[3 * b + 2] == int(count > 0));
  }
  cudaFree(x);
  cudaFree(y);
  cudaFree(px);
  cudaFree(out);
}

TEST_CASE("cuemu rejects launches a GPU would reject", "[cuda-emu]") {
  cudaGetLastError();
  CHECK(cuemu_test::empty_kernel(dim3(1), dim3(1024), 0, nullptr) == cudaSuccess);
  CHECK(cuemu_test::empty_kernel(dim3(1), dim3(1025), 0, nullptr) == cudaErrorInvalidConfiguration);
  CHECK(cuemu_test::empty_kernel(dim3(1), dim3(32, 32, 2), 0, nullptr) == cudaErrorInvalidConfiguration);
  CHECK(cuemu_test::empty_kernel(dim3(1), dim3(1, 1, 65), 0, nullptr) == cudaErrorInvalidConfiguration);
  CHECK(cuemu_test::empty_kernel(dim3(0), dim3(32), 0, nullptr) == cudaErrorInvalidConfiguration);
  CHECK(cuemu_test::empty_kernel(dim3(1, 65536), dim3(32), 0, nullptr) == cudaErrorInvalidConfiguration);
  // Dynamic shared memory: 48 KiB by default, more only after opting in, never past 227 KiB.
  CHECK(cuemu_test::empty_kernel(dim3(1), dim3(32), 48 * 1024, nullptr) == cudaSuccess);
  CHECK(cuemu_test::empty_kernel(dim3(1), dim3(32), 48 * 1024 + 1, nullptr) == cudaErrorInvalidValue);
  CHECK(cuemu_test::empty_kernel_allow_smem(100 * 1024) == cudaSuccess);
  CHECK(cuemu_test::empty_kernel(dim3(1), dim3(32), 100 * 1024, nullptr) == cudaSuccess);
  CHECK(cuemu_test::empty_kernel(dim3(1), dim3(32), 100 * 1024 + 1, nullptr) == cudaErrorInvalidValue);
  CHECK(cuemu_test::empty_kernel_allow_smem(232448 + 1) == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);  // the failed attribute call is recorded too
  CHECK(cudaGetLastError() == cudaSuccess);             // and reading it clears it
  CHECK(cuemu_test::empty_kernel_allow_smem(48 * 1024) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
}

TEST_CASE("cuemu rejects a kernel argument that points to pageable host memory", "[cuda-emu]") {
  std::vector<float> host(32, 1.f);
  float* d = device_alloc<float>(32);
  cudaGetLastError();
  CHECK(cuemu_test::scale_add_raw(d, host.data(), 32, nullptr) == cudaErrorInvalidValue);
  CHECK(cuemu_test::scale_add_raw(host.data(), d, 32, nullptr) == cudaErrorInvalidValue);
  // Pinned host memory is addressable from kernels (unified addressing): accepted.
  float* pinned = nullptr;
  REQUIRE(cudaMallocHost(reinterpret_cast<void**>(&pinned), 32 * sizeof(float)) == cudaSuccess);
  for (int i = 0; i < 32; ++i) pinned[i] = float(i);
  CHECK(cuemu_test::scale_add_raw(d, pinned, 32, nullptr) == cudaSuccess);
  std::vector<float> got = device_read(d, 32);
  for (int i = 0; i < 32; ++i) CHECK(got[i] == 2.f * float(i) + 1.f);
  cudaFreeHost(pinned);
  cudaFree(d);
}
