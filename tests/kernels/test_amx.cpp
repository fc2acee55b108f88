// The AMX bf16 tile products (kernels/cpu/amx.h) against an fp64 sum of the same bf16 products, at
// shapes that exercise every tail: rows past a multiple of 16, a last chunk of fewer than 16
// pairs, one to eight 16-column blocks (two column groups), padded strides, and accumulation.
// Skipped (reported) on a CPU or OS without AMX-BF16.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/amx.h"
#include "src/core/bf16.h"
#include "tests/testing.h"

using namespace strata;

namespace {

// Random words of two bf16 values each, in [-2, 2).
std::vector<uint32_t> random_pairs(size_t n, uint64_t seed) {
  const std::vector<float> v = testing::random_floats(2 * n, seed, -2.f, 2.f);
  std::vector<uint32_t> w(n);
  for (size_t i = 0; i < n; ++i)
    w[i] = uint32_t(f32_to_bf16(v[2 * i]).bits) | uint32_t(f32_to_bf16(v[2 * i + 1]).bits) << 16;
  return w;
}

double lo(uint32_t w) { return bf16_to_f32(bf16{uint16_t(w & 0xffffu)}); }
double hi(uint32_t w) { return bf16_to_f32(bf16{uint16_t(w >> 16)}); }

}  // namespace

TEST_CASE("amx_pairs_gemm sums the bf16 pair products like fp64 does, to f32 rounding, at every tail",
          "[kernels]") {
  if (!cpu::amx_bf16_available()) {
    WARN("SKIPPED: this CPU or OS offers no AMX-BF16");
    return;
  }
  struct Shape {
    int64_t m, np, nv;
  };
  const Shape shapes[] = {{1, 1, 1}, {16, 16, 4}, {17, 17, 5}, {64, 32, 8}, {33, 7, 3}, {5, 40, 2}};
  uint64_t seed = 1;
  for (const Shape& s : shapes) {
    for (const bool accumulate : {false, true}) {
      INFO("m " << s.m << " np " << s.np << " nv " << s.nv << " accumulate " << accumulate);
      const int64_t lda = s.np + 3, ldb = 16 * s.nv + 16, ldc = 16 * s.nv + 5;  // padded strides
      const std::vector<uint32_t> a = random_pairs(size_t(s.m * lda), seed++);
      const std::vector<uint32_t> b = random_pairs(size_t(s.np * ldb), seed++);
      std::vector<float> c = testing::random_floats(size_t((s.m + 1) * ldc), seed++);
      const std::vector<float> c0 = c;
      cpu::amx_pairs_gemm(c.data(), ldc, accumulate, a.data(), lda, b.data(), ldb, s.m, s.np, s.nv);
      double worst = 0;
      int64_t untouched = 0, outside = 0;
      for (int64_t i = 0; i <= s.m; ++i) {
        for (int64_t j = 0; j < ldc; ++j) {
          const size_t at = size_t(i * ldc + j);
          if (i == s.m || j >= 16 * s.nv) {  // past the rows or the columns: left as it was
            ++outside;
            untouched += c[at] == c0[at];
            continue;
          }
          double want = accumulate ? double(c0[at]) : 0.0, scale = std::abs(want);
          for (int64_t p = 0; p < s.np; ++p) {
            const uint32_t x = a[size_t(i * lda + p)], y = b[size_t(p * ldb + j)];
            want += lo(x) * lo(y) + hi(x) * hi(y);
            scale += std::abs(lo(x) * lo(y)) + std::abs(hi(x) * hi(y));
          }
          // each product is exact in f32; f32 sums of 2 np + 1 terms: (2 np + 1) 2^-24 of their
          // magnitudes bounds the rounding
          worst = std::max(worst, std::abs(c[at] - want) / (scale * double(2 * s.np + 1) * std::ldexp(1.0, -24)));
        }
      }
      CHECK(worst <= 1.0);
      CHECK(untouched == outside);
    }
  }
}
