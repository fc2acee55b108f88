// SwiGLU: the fp64 reference against finite differences and the fast f32 path (with its own
// vectorised exp) against the fp64 reference, including saturating gates.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include <catch2/catch.hpp>
#include <omp.h>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/ref.h"
#include "tests/testing.h"

using namespace strata::testing;  // random_floats, convert, finite_difference, max_rel_error

TEST_CASE("swiglu reference backward matches finite differences", "[kernels]") {
  const int64_t n = 17;
  auto g = convert<double>(random_floats(n, 1, -6.f, 6.f));
  auto u = convert<double>(random_floats(n, 2, -2.f, 2.f));
  auto r = convert<double>(random_floats(n, 3));  // loss = sum(out * r)
  auto loss = [&](const std::vector<double>& gg, const std::vector<double>& uu) {
    std::vector<double> out(n);
    strata::ref::swiglu_forward(out.data(), gg.data(), uu.data(), n);
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += out[i] * r[i];
    return s;
  };
  std::vector<double> dg(n), du(n);
  strata::ref::swiglu_backward(dg.data(), du.data(), r.data(), g.data(), u.data(), n);
  double eg = max_rel_error(dg, finite_difference(g, [&](const auto& v) { return loss(v, u); }));
  double eu = max_rel_error(du, finite_difference(u, [&](const auto& v) { return loss(g, v); }));
  std::printf("swiglu ref vs finite differences: dgate %.2e dup %.2e\n", eg, eu);
  CHECK(eg <= 1e-6);
  CHECK(eu <= 1e-6);
}

TEST_CASE("swiglu fast path matches the fp64 reference", "[kernels]") {
  double worst = 0;
  for (int64_t n : {1, 15, 17, 4097, 100003}) {
    auto g = random_floats(n, 10 + n, -12.f, 12.f);
    auto u = random_floats(n, 20 + n, -2.f, 2.f);
    auto dy = random_floats(n, 30 + n);
    // Saturating and special gates where exp over/underflows.
    const float special[] = {0.f, -0.f, 87.5f, -87.5f, 88.5f, -88.5f, 100.f, -100.f, 1e-30f};
    for (size_t i = 0; i < std::size(special) && i < size_t(n); ++i)
      g[i * (n / 9 + 1) % n] = special[i];
    std::vector<float> out(n), dg(n), du(n);
    strata::cpu::swiglu_forward(out.data(), g.data(), u.data(), n);
    strata::cpu::swiglu_backward(dg.data(), du.data(), dy.data(), g.data(), u.data(), n);
    auto gd = convert<double>(g), ud = convert<double>(u), dyd = convert<double>(dy);
    std::vector<double> ro(n), rg(n), ru(n);
    strata::ref::swiglu_forward(ro.data(), gd.data(), ud.data(), n);
    strata::ref::swiglu_backward(rg.data(), ru.data(), dyd.data(), gd.data(), ud.data(), n);
    double eo = max_rel_error(out, ro), eg = max_rel_error(dg, rg), eu = max_rel_error(du, ru);
    INFO("n=" << n << " out " << eo << " dgate " << eg << " dup " << eu);
    CHECK(eo <= 1e-5);
    CHECK(eg <= 1e-5);
    CHECK(eu <= 1e-5);
    worst = std::max({worst, eo, eg, eu});
  }
  // Elementwise too: the exp must be accurate near 0 where silu is small but not negligible.
  const int64_t m = 2001;
  std::vector<float> g(m), u(m, 1.f), out(m);
  for (int64_t i = 0; i < m; ++i) g[i] = -20.f + 40.f * float(i) / float(m - 1);
  strata::cpu::swiglu_forward(out.data(), g.data(), u.data(), m);
  double elem = 0;
  for (int64_t i = 0; i < m; ++i) {
    double x = g[i], want = x / (1 + std::exp(-x));
    elem = std::max(elem, std::abs(out[i] - want) / std::max(std::abs(want), 1e-30));
  }
  CHECK(elem <= 1e-6);
  std::printf("swiglu f32 vs fp64 ref (worst): %.2e; elementwise relative on [-20,20]: %.2e\n",
              worst, elem);
}

TEST_CASE("swiglu's bf16-output backward is the f32 backward rounded, bit for bit", "[kernels]") {
  // 70001 elements: both threads' shares and the vector loop's tail; gates up to +-90 saturate
  // the sigmoid, zero gates and outputs exercise signed zeros
  for (const float range : {8.f, 90.f}) {
    const int64_t n = 70001;
    auto g = random_floats(n, 15, -range, range), u = random_floats(n, 16), dy = random_floats(n, 17);
    for (int64_t i = 0; i < n; i += 97) g[size_t(i)] = 0.f, dy[size_t(i + 1 < n ? i + 1 : i)] = -0.f;
    std::vector<float> dg(n), du(n);
    strata::cpu::swiglu_backward(dg.data(), du.data(), dy.data(), g.data(), u.data(), n);
    std::vector<strata::bf16> dg16(n), du16(n), want_dg(n), want_du(n);
    strata::cpu::swiglu_backward_bf16(dg16.data(), du16.data(), dy.data(), g.data(), u.data(), n);
    strata::cpu::cast_f32_to_bf16(want_dg.data(), dg.data(), n);
    strata::cpu::cast_f32_to_bf16(want_du.data(), du.data(), n);
    INFO("gate range +-" << range);
    CHECK(strata::testing::bf16_mismatches(dg16, want_dg) == 0);
    CHECK(strata::testing::bf16_mismatches(du16, want_du) == 0);
  }
}

TEST_CASE("swiglu's bf16-output forward: the f32 forward's bits, and their rounding", "[kernels]") {
  for (const float range : {8.f, 90.f}) {
    const int64_t n = 70001;
    auto g = random_floats(n, 25, -range, range), u = random_floats(n, 26);
    for (int64_t i = 0; i < n; i += 89) g[size_t(i)] = 0.f;
    std::vector<float> out(n), out2(n);
    std::vector<strata::bf16> out_b(n), want(n);
    strata::cpu::swiglu_forward(out.data(), g.data(), u.data(), n);
    strata::cpu::swiglu_forward_bf16(out2.data(), out_b.data(), g.data(), u.data(), n);
    strata::cpu::cast_f32_to_bf16(want.data(), out.data(), n);
    INFO("gate range +-" << range);
    CHECK(std::memcmp(out.data(), out2.data(), out.size() * 4) == 0);
    CHECK(strata::testing::bf16_mismatches(out_b, want) == 0);
  }
}

TEST_CASE("swiglu's bf16-output ops reject a negative size", "[kernels]") {
  float x = 1, y = 1, out = 0;
  strata::bf16 b{0}, b2{0};
  CHECK_THROWS_WITH(strata::cpu::swiglu_forward_bf16(&out, &b, &x, &y, -1), Catch::Contains("need n >= 0"));
  CHECK_THROWS_WITH(strata::cpu::swiglu_backward_bf16(&b, &b2, &x, &x, &y, -1), Catch::Contains("need n >= 0"));
}

TEST_CASE("swiglu fast path is bitwise independent of the thread count", "[kernels]") {
  const int64_t n = 70001;
  auto g = random_floats(n, 5, -8.f, 8.f), u = random_floats(n, 6), dy = random_floats(n, 7);
  const int keep = omp_get_max_threads();
  std::vector<float> g1(n), u1(n), g2(n), u2(n);
  omp_set_num_threads(1);
  strata::cpu::swiglu_backward(g1.data(), u1.data(), dy.data(), g.data(), u.data(), n);
  omp_set_num_threads(2);
  strata::cpu::swiglu_backward(g2.data(), u2.data(), dy.data(), g.data(), u.data(), n);
  omp_set_num_threads(keep);
  CHECK(std::memcmp(g1.data(), g2.data(), n * 4) == 0);
  CHECK(std::memcmp(u1.data(), u2.data(), n * 4) == 0);
}
