// The zeroth-order perturbation generator and kernels (kernels/common/zo_rng.h, kernels/cpu/zo.h):
// Philox against Random123's known answers; the hand-written ln, sin, cos and the resulting z
// against fp64 over dense sweeps; the distribution of z (mean, variance, tails, Kolmogorov–
// Smirnov, correlations across elements, tensors and seeds) with stated bounds; the fast paths
// against their plain-loop twins bit for bit (awkward sizes, offsets past 2^32, any thread count,
// any split into pieces); perturb(+ε) then perturb(−ε); the ZO-SGD update against fp64.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include <catch2/catch.hpp>

#include "kernels/cpu/ref/zo.h"
#include "kernels/cpu/zo.h"
#include "src/device/device.h"
#include "tests/kernels/zo_cases.h"
#include "tests/testing.h"

namespace {

using strata::bf16;
using strata::testing::random_floats;
namespace cpu = strata::cpu;
namespace ref = strata::ref;
namespace zo = strata::zo;

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

std::vector<float> generate(uint64_t seed, uint32_t tensor, uint64_t offset, int64_t n) {
  std::vector<float> z(static_cast<size_t>(n));
  cpu::zo_generate(z.data(), seed, tensor, offset, n);
  return z;
}

// Distance to the next float away from zero: one unit in the last place of |x|.
double ulp(float x) {
  const float a = std::fabs(x);
  return double(std::nextafter(a, INFINITY)) - double(a);
}

double correlation(const std::vector<float>& a, const std::vector<float>& b) {
  double sa = 0, sb = 0, saa = 0, sbb = 0, sab = 0;
  const double n = double(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    sa += a[i];
    sb += b[i];
    saa += double(a[i]) * a[i];
    sbb += double(b[i]) * b[i];
    sab += double(a[i]) * b[i];
  }
  const double cov = sab / n - (sa / n) * (sb / n);
  return cov / std::sqrt((saa / n - (sa / n) * (sa / n)) * (sbb / n - (sb / n) * (sb / n)));
}

using strata::zo_testing::kWheres;  // the (seed, tensor, offset) cases (tests/kernels/zo_cases.h)
using strata::zo_testing::Where;
const int64_t kSizes[] = {1, 15, 17, 4097};

}  // namespace

TEST_CASE("zo: Philox4x32-10 gives Random123's known answers", "[zo]") {
  // tests/kat_vectors of Random123 (D. E. Shaw Research), the three philox4x32 10 lines.
  struct Kat {
    uint32_t ctr[4], key[2], out[4];
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat& k : kats) {
    uint32_t c0 = k.ctr[0], c1 = k.ctr[1], c2 = k.ctr[2], c3 = k.ctr[3];
    zo::zo_philox4x32_10(c0, c1, c2, c3, k.key[0], k.key[1]);
    CHECK(c0 == k.out[0]);
    CHECK(c1 == k.out[1]);
    CHECK(c2 == k.out[2]);
    CHECK(c3 == k.out[3]);
  }
  // The counter layout: block lo, block hi, tensor, 0; key: seed lo, seed hi.
  uint32_t w[4];
  zo::zo_block_words(0x299f31d0a4093822ull, 0x13198a2e, 0x85a308d3243f6a88ull, w[0], w[1], w[2],
                     w[3]);
  uint32_t c0 = 0x243f6a88, c1 = 0x85a308d3, c2 = 0x13198a2e, c3 = 0;
  zo::zo_philox4x32_10(c0, c1, c2, c3, 0xa4093822, 0x299f31d0);
  CHECK((w[0] == c0 && w[1] == c1 && w[2] == c2 && w[3] == c3));
}

TEST_CASE("zo: ln, sin, cos and z against fp64 over dense sweeps", "[zo]") {
  // ln(k / 2^24) at every k in [1, 2^24].
  double ln_abs = 0, ln_rel = 0;
  for (uint32_t k = 1; k <= (1u << 24); ++k) {
    const double want = ref::zo_ln_unit<double>(k);
    const double err = std::fabs(double(cpu::zo_probe_ln_unit(k)) - want);
    ln_abs = std::max(ln_abs, err);
    if (want != 0) ln_rel = std::max(ln_rel, err / std::fabs(want));
  }
  // sin and cos of 2π j / 2^24 at every j in [0, 2^24).
  double sc_abs = 0;
  for (uint32_t j = 0; j < (1u << 24); ++j) {
    float s, c;
    cpu::zo_probe_sincos_turn(j, &s, &c);
    double ws, wc;
    ref::zo_sincos_turn<double>(j, &ws, &wc);
    sc_abs = std::max({sc_abs, std::fabs(s - ws), std::fabs(c - wc)});
  }
  // z of 2^22 elements against Box–Muller in fp64 from the same Philox words.
  const int64_t n = int64_t(1) << 22;
  const std::vector<float> z = generate(2024, 7, 0, n);
  double z_abs = 0, z_max = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double want = ref::zo_gaussian<double>(2024, 7, uint64_t(i));
    z_abs = std::max(z_abs, std::fabs(z[size_t(i)] - want));
    z_max = std::max(z_max, double(std::fabs(z[size_t(i)])));
  }
  std::printf("zo transform vs fp64: ln u max abs %.2e (max rel %.2e) over 2^24 inputs; sin/cos max "
              "abs %.2e over 2^24; z max abs %.2e over 2^22 (largest |z| %.3f)\n",
              ln_abs, ln_rel, sc_abs, z_abs, z_max);
  // Bounds (measured: ln 5.0e-7 abs, 1.5e-7 rel; sin/cos 9.7e-8; z 5.8e-7): ln u within 2 ulp
  // relative (2^-22) and 1e-6 absolute (|ln u| <= 16.7, where an ulp is 1.9e-6); sin and cos
  // within one ulp of 1 (2^-23); z within 1e-6 (|z| <= 5.77, an ulp of 4 is 4.8e-7).
  CHECK(ln_abs < 1e-6);
  CHECK(ln_rel < 0x1p-22);
  CHECK(sc_abs < 0x1p-23);
  CHECK(z_abs < 1e-6);
  CHECK(z_max <= std::sqrt(48 * std::log(2.0)) + 1e-5);
}

TEST_CASE("zo: z is distributed as N(0, 1)", "[zo]") {
  const int64_t n = int64_t(1) << 22;  // 4.2M samples: 1/sqrt(n) = 4.9e-4
  const double se = 1 / std::sqrt(double(n));
  const std::vector<float> z = generate(0x5EED, 11, (1ull << 33) + 5, n);
  double sum = 0, sum2 = 0;
  int64_t beyond2 = 0, beyond3 = 0, beyond4 = 0;
  for (float x : z) {
    sum += x;
    sum2 += double(x) * x;
    beyond2 += std::fabs(x) > 2;
    beyond3 += std::fabs(x) > 3;
    beyond4 += std::fabs(x) > 4;
  }
  const double mean = sum / double(n), var = sum2 / double(n) - mean * mean;
  const double p2 = std::erfc(2 / std::sqrt(2.0)), p3 = std::erfc(3 / std::sqrt(2.0)),
               p4 = std::erfc(4 / std::sqrt(2.0));
  auto tail_se = [&](double p) { return std::sqrt(p * (1 - p) / double(n)); };
  const double f2 = double(beyond2) / double(n), f3 = double(beyond3) / double(n),
               f4 = double(beyond4) / double(n);
  // Kolmogorov–Smirnov distance to the normal CDF.
  std::vector<float> sorted = z;
  std::sort(sorted.begin(), sorted.end());
  double ks = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double cdf = 0.5 * std::erfc(-double(sorted[size_t(i)]) / std::sqrt(2.0));
    ks = std::max({ks, std::fabs(cdf - double(i) / double(n)),
                   std::fabs(cdf - double(i + 1) / double(n))});
  }
  std::printf("zo distribution (n=2^22): mean %.2e var-1 %.2e; |z|>2 %.5f (normal %.5f), |z|>3 "
              "%.6f (%.6f), |z|>4 %.2e (%.2e); KS sqrt(n) D = %.3f\n",
              mean, var - 1, f2, p2, f3, p3, f4, p4, ks * std::sqrt(double(n)));
  // Every bound is 5 standard errors of the statistic for a true N(0, 1) sample (the seeds are
  // fixed, so the test is deterministic; a wrong transform is off by far more).
  CHECK(std::fabs(mean) < 5 * se);
  CHECK(std::fabs(var - 1) < 5 * std::sqrt(2.0) * se);
  CHECK(std::fabs(f2 - p2) < 5 * tail_se(p2));
  CHECK(std::fabs(f3 - p3) < 5 * tail_se(p3));
  CHECK(std::fabs(f4 - p4) < 5 * tail_se(p4));
  CHECK(ks * std::sqrt(double(n)) < 1.95);  // the KS test's 0.1% critical value
}

TEST_CASE("zo: no correlation across elements, tensors and seeds", "[zo]") {
  const int64_t n = int64_t(1) << 21;
  const double bound = 5 / std::sqrt(double(n));  // 5 standard errors of a correlation of 0
  const std::vector<float> a = generate(77, 4, 0, n + 8);
  auto shifted = [&](int lag) { return std::vector<float>(a.begin() + lag, a.begin() + lag + n); };
  const std::vector<float> base = shifted(0);
  std::vector<float> sq(static_cast<size_t>(n)), sq1(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    sq[size_t(i)] = a[size_t(i)] * a[size_t(i)];
    sq1[size_t(i)] = a[size_t(i) + 1] * a[size_t(i) + 1];
  }
  struct Pair {
    const char* what;
    double r;
  };
  const Pair pairs[] = {
      {"adjacent elements (lag 1)", correlation(base, shifted(1))},
      {"lag 2 (the other Box–Muller pair)", correlation(base, shifted(2))},
      {"lag 4 (the next Philox block)", correlation(base, shifted(4))},
      {"squares of adjacent elements", correlation(sq, sq1)},
      {"tensor 4 vs tensor 5", correlation(base, generate(77, 5, 0, n))},
      {"seed 77 vs seed 78", correlation(base, generate(78, 4, 0, n))},
      {"step seeds t and t+1", correlation(generate(zo::zo_seed(1, 10, 0), 4, 0, n),
                                           generate(zo::zo_seed(1, 11, 0), 4, 0, n))},
      {"perturbations 0 and 1 of a step", correlation(generate(zo::zo_seed(1, 10, 0), 4, 0, n),
                                                      generate(zo::zo_seed(1, 10, 1), 4, 0, n))},
      {"element i vs element i + 2^32", correlation(base, generate(77, 4, 1ull << 32, n))},
  };
  for (const Pair& p : pairs) {
    INFO(p.what << ": correlation " << p.r << " (bound " << bound << ")");
    std::printf("zo correlation, %s: %+.2e\n", p.what, p.r);
    CHECK(std::fabs(p.r) < bound);
  }
  // Different keys and counters give different streams, not shifted copies of one.
  CHECK_FALSE(same_bits(generate(77, 4, 0, 64), generate(78, 4, 0, 64)));
  CHECK_FALSE(same_bits(generate(77, 4, 0, 64), generate(77, 5, 0, 64)));
}

TEST_CASE("zo: fast CPU kernels equal their plain-loop twins bit for bit", "[zo]") {
  for (const Where& w : kWheres) {
    for (int64_t n : kSizes) {
      INFO("seed " << w.seed << " tensor " << w.tensor << " offset " << w.offset << " n " << n);
      std::vector<float> want(static_cast<size_t>(n));
      ref::zo_generate(want.data(), w.seed, w.tensor, w.offset, n);
      REQUIRE(same_bits(generate(w.seed, w.tensor, w.offset, n), want));

      const std::vector<float> p0 = random_floats(size_t(n), w.offset ^ 5, -2.f, 2.f);
      std::vector<float> fast = p0, slow = p0;
      cpu::zo_perturb_f32(fast.data(), w.seed, w.tensor, w.offset, 1e-3f, n);
      ref::zo_perturb_f32(slow.data(), w.seed, w.tensor, w.offset, 1e-3f, n);
      REQUIRE(same_bits(fast, slow));
      REQUIRE_FALSE(same_bits(fast, p0));

      std::vector<bf16> b_fast = strata::testing::to_bf16(p0), b_slow = b_fast;
      cpu::zo_perturb_bf16(b_fast.data(), w.seed, w.tensor, w.offset, 0.05f, n);
      ref::zo_perturb_bf16(b_slow.data(), w.seed, w.tensor, w.offset, 0.05f, n);
      REQUIRE(std::memcmp(b_fast.data(), b_slow.data(), size_t(n) * sizeof(bf16)) == 0);

      const uint64_t seeds[3] = {w.seed, w.seed + 1, zo::zo_seed(w.seed, 3, 2)};
      const float coefs[3] = {0.75f, -1.25f, 0.5f};
      for (int q : {1, 3}) {
        for (int working : {0, 1, 2}) {  // none, f32, bf16
          std::vector<float> m_fast = p0, m_slow = p0;
          std::vector<float> wf_fast(static_cast<size_t>(n)), wf_slow(static_cast<size_t>(n));
          std::vector<bf16> wb_fast(static_cast<size_t>(n)), wb_slow(static_cast<size_t>(n));
          void* out_fast = working == 1 ? static_cast<void*>(wf_fast.data()) : wb_fast.data();
          void* out_slow = working == 1 ? static_cast<void*>(wf_slow.data()) : wb_slow.data();
          if (working == 0) out_fast = out_slow = nullptr;
          cpu::zo_sgd_update(m_fast.data(), out_fast, working == 2, seeds, coefs, q, w.tensor,
                             w.offset, 1e-2f, 0.1f, n);
          ref::zo_sgd_update(m_slow.data(), out_slow, working == 2, seeds, coefs, q, w.tensor,
                             w.offset, 1e-2f, 0.1f, n);
          INFO("q " << q << " working " << working);
          REQUIRE(same_bits(m_fast, m_slow));
          REQUIRE(same_bits(wf_fast, wf_slow));
          REQUIRE(std::memcmp(wb_fast.data(), wb_slow.data(), size_t(n) * sizeof(bf16)) == 0);
          if (working == 1) REQUIRE(same_bits(wf_fast, m_fast));
          if (working == 2)
            for (int64_t i = 0; i < n; ++i)
              REQUIRE(wb_fast[size_t(i)].bits == strata::f32_to_bf16(m_fast[size_t(i)]).bits);
        }
      }
    }
  }
}

TEST_CASE("zo: results do not depend on the thread count or on the split into pieces", "[zo]") {
  const int64_t n = 300007;  // many chunks, odd tail
  const uint64_t offset = (1ull << 32) + 3;
  const int saved = omp_get_max_threads();
  const std::vector<float> master0 = random_floats(size_t(n), 9, -1.f, 1.f);
  const uint64_t seeds[2] = {11, 12};
  const float coefs[2] = {0.3f, -0.2f};
  std::vector<float> z1, m1;
  for (int threads : {1, 2, 3, 4}) {
    omp_set_num_threads(threads);
    std::vector<float> z = generate(5, 6, offset, n);
    std::vector<float> m = master0;
    cpu::zo_sgd_update(m.data(), nullptr, false, seeds, coefs, 2, 6, offset, 1e-3f, 0.01f, n);
    if (threads == 1) {
      z1 = z;
      m1 = m;
    } else {
      INFO(threads << " threads");
      CHECK(same_bits(z, z1));
      CHECK(same_bits(m, m1));
    }
  }
  omp_set_num_threads(saved);
  // Pieces at awkward boundaries give the same bits as one call.
  std::vector<float> pieces(static_cast<size_t>(n));
  const int64_t cuts[] = {0, 1, 18, 4115, 70001, n};
  for (size_t c = 0; c + 1 < std::size(cuts); ++c)
    cpu::zo_generate(pieces.data() + cuts[c], 5, 6, offset + uint64_t(cuts[c]),
                     cuts[c + 1] - cuts[c]);
  CHECK(same_bits(pieces, z1));
}

TEST_CASE("zo: perturb by +eps then -eps restores f32 weights to within one rounding", "[zo]") {
  // p' = fl(p + fl(eps z)), p'' = fl(p' - fl(eps z)) = fl(p + e) with e the rounding error of p':
  // |p'' - p| <= 2|e| <= ulp(p'). Weights of several magnitudes, eps = 1e-3.
  const int64_t n = 100000;
  std::vector<float> p0 = random_floats(size_t(n), 31, -1.f, 1.f);
  for (int64_t i = 0; i < n; i += 3) p0[size_t(i)] *= 1e-3f;   // small weights (|εz| comparable)
  for (int64_t i = 1; i < n; i += 7) p0[size_t(i)] *= 300.f;   // large ones (εz below half an ulp)
  const float eps = 1e-3f;
  const std::vector<float> z = generate(123, 9, 1000, n);
  std::vector<float> p = p0;
  cpu::zo_perturb_f32(p.data(), 123, 9, 1000, eps, n);
  const std::vector<float> plus = p;
  cpu::zo_perturb_f32(p.data(), 123, 9, 1000, -eps, n);
  int64_t exact = 0, plus_bad = 0;
  double worst_ulps = 0;
  for (int64_t i = 0; i < n; ++i) {
    const size_t k = size_t(i);
    // p' is p + εz correctly rounded from the rounded product.
    const double step = double(eps * z[k]);
    if (std::fabs(double(plus[k]) - (double(p0[k]) + step)) > 0.5 * ulp(plus[k])) ++plus_bad;
    const double d = std::fabs(double(p[k]) - double(p0[k]));
    exact += d == 0;
    worst_ulps = std::max(worst_ulps, d / ulp(plus[k]));
  }
  std::printf("zo perturb +eps/-eps: %.2f%% of weights restored exactly, the rest within %.2f ulp "
              "of the perturbed value\n", 100.0 * double(exact) / double(n), worst_ulps);
  CHECK(plus_bad == 0);
  CHECK(worst_ulps <= 1.0);
  CHECK(exact > n / 2);  // most sums are exact or round back; a wrong sign or z would not be
}

TEST_CASE("zo: the ZO-SGD host update against an fp64 twin", "[zo]") {
  const int64_t n = 4097;
  const uint64_t offset = 77;
  const uint32_t tensor = 12;
  const float lr = 2e-2f, wd = 0.1f;
  for (int q : {1, 4}) {
    INFO("q " << q);
    std::vector<uint64_t> seeds;
    std::vector<float> coefs;
    std::vector<std::vector<float>> zs;
    for (int j = 0; j < q; ++j) {
      seeds.push_back(zo::zo_seed(8, 100, uint32_t(j)));
      coefs.push_back((j % 2 ? -1.f : 1.f) * (0.4f + 0.3f * float(j)) / float(q));
      zs.push_back(generate(seeds.back(), tensor, offset, n));
    }
    const std::vector<float> master0 = random_floats(size_t(n), 55, -3.f, 3.f);
    std::vector<float> m = master0;
    cpu::zo_sgd_update(m.data(), nullptr, false, seeds.data(), coefs.data(), q, tensor, offset, lr,
                       wd, n);
    std::vector<double> md(master0.begin(), master0.end());
    std::vector<const float*> zp;
    for (auto& z : zs) zp.push_back(z.data());
    std::vector<double> cd(coefs.begin(), coefs.end());
    ref::zo_sgd_update<double>(md.data(), zp.data(), cd.data(), q, lr, wd, n);
    // Each f32 operation rounds once (relative 2^-24): the step lr (gz + wd m) carries at most
    // (q + 3) roundings of the magnitudes it sums, and the final subtraction half an ulp.
    double worst = 0;
    int64_t moved = 0;
    for (int64_t i = 0; i < n; ++i) {
      const size_t k = size_t(i);
      double mag = std::fabs(wd * master0[k]);
      for (int j = 0; j < q; ++j) mag += std::fabs(double(coefs[size_t(j)]) * zs[size_t(j)][k]);
      const double bound = 0.5 * ulp(m[k]) + double(q + 3) * lr * mag * 0x1p-24;
      const double err = std::fabs(double(m[k]) - md[k]);
      worst = std::max(worst, err / bound);
      moved += m[k] != master0[k];
    }
    std::printf("zo sgd update q=%d vs fp64: worst error %.2f of its bound\n", q, worst);
    CHECK(worst <= 1.0);
    CHECK(moved > n * 9 / 10);
  }
}

TEST_CASE("zo: the CPU backend's device ops run the CPU kernels", "[zo]") {
  strata::DeviceOptions o;
  o.memory_bytes = size_t(8) << 20;
  auto dev = strata::device_create(o);
  const int64_t n = 4097;
  const uint64_t offset = (1ull << 32) - 5;
  auto* z = static_cast<float*>(dev->alloc(size_t(n) * 4, "zo z"));
  auto* p = static_cast<float*>(dev->alloc(size_t(n) * 4, "zo p"));
  auto* pb = static_cast<bf16*>(dev->alloc(size_t(n) * 2, "zo p bf16"));
  const std::vector<float> p0 = random_floats(size_t(n), 3);
  const std::vector<bf16> pb0 = strata::testing::to_bf16(p0);
  dev->copy_h2d(p, p0.data(), size_t(n) * 4, strata::Stream::h2d);
  dev->copy_h2d(pb, pb0.data(), size_t(n) * 2, strata::Stream::h2d);
  dev->synchronize();
  dev->zo_generate(z, 9, 2, offset, n, strata::Stream::compute);
  dev->zo_perturb(p, strata::DType::f32, 9, 2, offset, -0.5f, n, strata::Stream::compute);
  dev->zo_perturb(pb, strata::DType::bf16, 9, 2, offset, 0.25f, n, strata::Stream::compute);
  std::vector<float> z_dev(static_cast<size_t>(n)), p_dev(static_cast<size_t>(n));
  std::vector<bf16> pb_dev(static_cast<size_t>(n));
  dev->copy_d2h(z_dev.data(), z, size_t(n) * 4, strata::Stream::compute);
  dev->copy_d2h(p_dev.data(), p, size_t(n) * 4, strata::Stream::compute);
  dev->copy_d2h(pb_dev.data(), pb, size_t(n) * 2, strata::Stream::compute);
  dev->synchronize();
  std::vector<float> p_want = p0;
  std::vector<bf16> pb_want = pb0;
  ref::zo_perturb_f32(p_want.data(), 9, 2, offset, -0.5f, n);
  ref::zo_perturb_bf16(pb_want.data(), 9, 2, offset, 0.25f, n);
  CHECK(same_bits(z_dev, generate(9, 2, offset, n)));
  CHECK(same_bits(p_dev, p_want));
  CHECK(std::memcmp(pb_dev.data(), pb_want.data(), size_t(n) * 2) == 0);
  dev->free(z);
  dev->free(p);
  dev->free(pb);
}

TEST_CASE("zo: bad sizes are clear errors", "[zo]") {
  float x[4] = {};
  CHECK_THROWS_WITH(cpu::zo_generate(x, 1, 0, 0, -1), Catch::Contains("need n >= 0"));
  CHECK_THROWS_WITH(cpu::zo_perturb_f32(x, 1, 0, ~0ull - 2, 0.1f, 4), Catch::Contains("overflows"));
  const uint64_t seeds[1] = {1};
  const float coefs[1] = {1.f};
  CHECK_THROWS_WITH(cpu::zo_sgd_update(x, nullptr, false, seeds, coefs, 0, 0, 0, 1e-3f, 0.f, 4),
                    Catch::Contains("number of perturbations"));
}
