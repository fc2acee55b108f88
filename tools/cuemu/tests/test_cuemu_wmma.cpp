// Tests of cuemu's nvcuda::wmma: a bf16 GEMM through fragments against an fp64 product on every
// memory layout of A, B and C, under both executors; per-row scaling of an accumulator through a
// fragment of row numbers (how a kernel reaches rows without knowing the mapping); and the seeded
// bug of a kernel that assumes the hardware's fragment mapping, which must come out wrong.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <vector>

#include "tools/cuemu/cuemu_control.h"
#include "tools/cuemu/tests/test_wmma.h"

namespace {

template <class T>
T* to_device(const std::vector<T>& h) {
  void* p = nullptr;
  REQUIRE(cudaMalloc(&p, h.size() * sizeof(T)) == cudaSuccess);
  REQUIRE(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
  return static_cast<T*>(p);
}

template <class T>
std::vector<T> from_device(const T* d, size_t count) {
  std::vector<T> h(count);
  REQUIRE(cudaMemcpy(h.data(), d, count * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
  return h;
}

std::vector<float> random_values(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-2.f, 2.f);
  std::vector<float> x(n);
  for (float& e : x) e = dist(rng);
  return x;
}

TEST_CASE("cuemu wmma bf16 gemm matches an fp64 product on every layout", "[cuda-emu][wmma]") {
  const int m = 32, n = 48, k = 64;
  for (cuemu::Executor ex : {cuemu::Executor::fibers, cuemu::Executor::threads}) {
    cuemu::Options saved = cuemu::cuemu_get_options(), o = saved;
    o.executor = ex;
    cuemu::cuemu_set_options(o);
    for (int layouts = 0; layouts < 8; ++layouts) {
      const bool a_col = layouts & 1, b_col = layouts & 2, c_col = layouts & 4;
      INFO("a " << (a_col ? "col" : "row") << ", b " << (b_col ? "col" : "row") << ", c "
                << (c_col ? "col" : "row") << (ex == cuemu::Executor::threads ? ", threads" : ", fibers"));
      // Logical a (m,k), b (k,n), c (m,n), each in bf16-exact values, stored as the flags say.
      std::vector<float> a = random_values(size_t(m * k), 1), b = random_values(size_t(k * n), 2);
      std::vector<float> c = random_values(size_t(m * n), 3);
      std::vector<__nv_bfloat16> a_mem(a.size()), b_mem(b.size());
      std::vector<float> c_mem(c.size());
      for (int i = 0; i < m; ++i)
        for (int j = 0; j < k; ++j) a_mem[a_col ? size_t(j * m + i) : size_t(i * k + j)] = __float2bfloat16_rn(a[i * k + j]);
      for (int i = 0; i < k; ++i)
        for (int j = 0; j < n; ++j) b_mem[b_col ? size_t(j * k + i) : size_t(i * n + j)] = __float2bfloat16_rn(b[i * n + j]);
      for (int i = 0; i < m; ++i)
        for (int j = 0; j < n; ++j) c_mem[c_col ? size_t(j * m + i) : size_t(i * n + j)] = c[i * n + j];
      __nv_bfloat16* da = to_device(a_mem);
      __nv_bfloat16* db = to_device(b_mem);
      float* dc = to_device(c_mem);
      REQUIRE(cuemu_test::wmma_gemm(dc, da, db, m, n, k, a_col, b_col, c_col, nullptr) == cudaSuccess);
      const std::vector<float> got = from_device(dc, c.size());
      double worst = 0.0;
      for (int i = 0; i < m; ++i)
        for (int j = 0; j < n; ++j) {
          double want = c[i * n + j];
          for (int kk = 0; kk < k; ++kk)
            want += double(__bfloat162float(a_mem[a_col ? size_t(kk * m + i) : size_t(i * k + kk)])) *
                    double(__bfloat162float(b_mem[b_col ? size_t(j * k + kk) : size_t(kk * n + j)]));
          const double g = got[c_col ? size_t(j * m + i) : size_t(i * n + j)];
          worst = std::max(worst, std::abs(g - want) / (1.0 + std::abs(want)));
        }
      // Four fp64 16-term sums rounded to f32 each (one per k step): a few f32 ulps.
      CHECK(worst <= 1e-6);
      cudaFree(da);
      cudaFree(db);
      cudaFree(dc);
    }
    cuemu::cuemu_set_options(saved);
  }
}

TEST_CASE("cuemu wmma scales accumulator rows through a fragment of row numbers", "[cuda-emu][wmma]") {
  std::vector<float> x = random_values(256, 4), scale(16);
  for (int r = 0; r < 16; ++r) scale[size_t(r)] = float(r + 1);
  float* dx = to_device(x);
  float* ds = to_device(scale);
  REQUIRE(cuemu_test::wmma_row_scale(dx, ds, nullptr) == cudaSuccess);
  const std::vector<float> got = from_device(dx, x.size());
  for (int e = 0; e < 256; ++e) CHECK(got[size_t(e)] == x[size_t(e)] * float(e / 16 + 1));
  cudaFree(dx);
  cudaFree(ds);
}

TEST_CASE("cuemu wmma catches the seeded kernel that assumes the hardware fragment mapping",
          "[cuda-emu][wmma][seeded-bug]") {
  std::vector<float> src(256);
  for (int e = 0; e < 256; ++e) src[size_t(e)] = float(e);
  float* ds = to_device(src);
  float* dx = to_device(std::vector<float>(256, -1.f));
  REQUIRE(cuemu_test::wmma_store_assuming_hw_layout(dx, ds, nullptr) == cudaSuccess);
  const std::vector<float> got = from_device(dx, src.size());
  int wrong = 0;
  for (int e = 0; e < 256; ++e) wrong += got[size_t(e)] != src[size_t(e)];
  INFO(wrong << " of 256 entries misplaced");
  CHECK(wrong >= 200);  // the emulator's mapping shares almost nothing with the hardware's
  cudaFree(ds);
  cudaFree(dx);
}

}  // namespace
