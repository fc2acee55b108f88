// The AMX kernels built without -march=native (as STRATA_NATIVE=OFF builds them), checked on the
// CPU the suite runs on: GCC 12 then dropped the tile configuration's stores as dead, and the first
// ldtilecfg faulted (amx_load_tile_config, kernels/cpu/amx.h). Runs gemm_amx_tile and
// amx_pairs_gemm on small random operands against the fp64 twin (kernels/cpu/ref/matmul.h); exits
// 77 (ctest: skipped) without AMX.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/cpu/amx.h"
#include "kernels/cpu/gemm_amx.h"
#include "kernels/cpu/ref/matmul.h"
#include "src/core/bf16.h"

using strata::bf16;

namespace {

// Largest |got - want| over want's scale; each product of two bf16 values is exact in f32, so a
// correct tile differs from the double sum only by f32 accumulation rounding.
double worst(const std::vector<float>& got, const std::vector<double>& want) {
  double w = 0.0;
  for (size_t i = 0; i < got.size(); ++i) w = std::fmax(w, std::fabs(got[i] - want[i]) / (1.0 + std::fabs(want[i])));
  return w;
}

}  // namespace

int main() {
  if (!strata::cpu::amx_bf16_available()) {
    std::puts("amx_portable_check: no AMX-BF16 on this CPU or OS: skipped");
    return 77;
  }
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  const int64_t m = 64, n = 48, k = 96;  // n: a whole 32 and an edge block of 16
  std::vector<bf16> a(m * k), b(k * n);  // a (M, K), b (K, N)
  for (auto& x : a) x = strata::f32_to_bf16(uni(rng));
  for (auto& x : b) x = strata::f32_to_bf16(uni(rng));
  std::vector<double> a64(a.size()), b64(b.size()), want(m * n);
  for (size_t i = 0; i < a.size(); ++i) a64[i] = strata::bf16_to_f32(a[i]);
  for (size_t i = 0; i < b.size(); ++i) b64[i] = strata::bf16_to_f32(b[i]);
  strata::ref::matmul(want.data(), a64.data(), b64.data(), m, n, k, false, false, 0.0);

  std::vector<uint32_t> pa(strata::cpu::gemm_amx_packed_words(m, k)), pb(strata::cpu::gemm_amx_packed_words(n, k));
  strata::cpu::gemm_amx_pack_a(pa.data(), a.data(), k, false, 0, m, k);
  strata::cpu::gemm_amx_pack_b(pb.data(), b.data(), n, false, 0, n, k);
  std::vector<float> c(m * n, -1.f);
  strata::cpu::gemm_amx_tile(c.data(), n, pa.data(), pb.data(), m, n, k);
  const double e_tile = worst(c, want);

  // amx_pairs_gemm: a as (m, k/2) words of pairs, b as (k/2, n) words (n a multiple of 16)
  std::vector<uint32_t> wa(m * (k / 2)), wb((k / 2) * n);
  const auto bits = [](bf16 x) { return uint32_t(x.bits); };
  for (int64_t i = 0; i < m; ++i)
    for (int64_t p = 0; p < k / 2; ++p) wa[i * (k / 2) + p] = bits(a[i * k + 2 * p]) | bits(a[i * k + 2 * p + 1]) << 16;
  for (int64_t p = 0; p < k / 2; ++p)
    for (int64_t j = 0; j < n; ++j) wb[p * n + j] = bits(b[2 * p * n + j]) | bits(b[(2 * p + 1) * n + j]) << 16;
  std::vector<float> c2(m * n, -1.f);
  strata::cpu::amx_pairs_gemm(c2.data(), n, false, wa.data(), k / 2, wb.data(), n, m, k / 2, n / 16);
  const double e_pairs = worst(c2, want);

  std::printf("amx_portable_check: gemm_amx_tile %.3g, amx_pairs_gemm %.3g (scaled max error; limit 1e-5)\n",
              e_tile, e_pairs);
  return e_tile <= 1e-5 && e_pairs <= 1e-5 ? 0 : 1;
}
