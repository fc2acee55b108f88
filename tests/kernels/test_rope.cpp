// RoPE (HF rotate-half): the fp64 reference against finite differences, the fast f32 path
// against the fp64 reference (small positions) and the f32 reference (large positions, where
// the f32 angle is the point), in-place use, and thread-count independence.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include <catch2/catch.hpp>
#include <omp.h>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/ref.h"
#include "src/core/error.h"
#include "tests/testing.h"

using namespace strata::testing;  // random_floats, convert, finite_difference, max_rel_error

namespace {

// HF's inv_freq[j] = 1 / theta^(2j/d), computed in f32 like torch does.
std::vector<float> rope_inv_freq(int64_t d, float theta = 10000.f) {
  std::vector<float> f(static_cast<size_t>(d / 2));
  for (int64_t j = 0; j < d / 2; ++j) f[j] = 1.f / std::pow(theta, float(2 * j) / float(d));
  return f;
}

std::vector<int32_t> rope_positions(int64_t n, int32_t max_pos, uint64_t seed) {
  auto u = random_floats(n, seed, 0.f, float(max_pos));
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[i] = int32_t(u[i]);
  return p;
}

}  // namespace

TEST_CASE("rope reference backward matches finite differences", "[kernels]") {
  const int64_t n = 3, nh = 2, d = 6;
  auto x = convert<double>(random_floats(n * nh * d, 1));
  auto r = convert<double>(random_floats(n * nh * d, 2));  // loss = sum(out * r)
  auto inv = convert<double>(rope_inv_freq(d));
  std::vector<int32_t> pos = {0, 5, 37};
  auto loss = [&](const std::vector<double>& xx) {
    std::vector<double> out(xx.size());
    strata::ref::rope_forward(out.data(), xx.data(), pos.data(), inv.data(), n, nh, d);
    double s = 0;
    for (size_t i = 0; i < out.size(); ++i) s += out[i] * r[i];
    return s;
  };
  std::vector<double> dx(x.size());
  strata::ref::rope_backward(dx.data(), r.data(), pos.data(), inv.data(), n, nh, d);
  double e = max_rel_error(dx, finite_difference(x, loss));
  std::printf("rope ref vs finite differences: din %.2e\n", e);
  CHECK(e <= 1e-6);
}

TEST_CASE("rope fast path matches the references", "[kernels]") {
  double worst_small = 0, worst_large = 0;
  for (int64_t n : {1, 15, 17, 65}) {
    for (int64_t nh : {1, 3}) {
      for (int64_t d : {2, 14, 64, 130}) {
        const int64_t size = n * nh * d;
        auto x = random_floats(size, 100 + n * 31 + nh * 7 + d);
        auto inv = rope_inv_freq(d);
        std::vector<float> out(size), din(size);
        // Small positions: the f32 angle float(pos) * inv_freq is within ~1e-6 of the exact one.
        auto pos = rope_positions(n, 64, 200 + n);
        strata::cpu::rope_forward(out.data(), x.data(), pos.data(), inv.data(), n, nh, d);
        strata::cpu::rope_backward(din.data(), x.data(), pos.data(), inv.data(), n, nh, d);
        auto xd = convert<double>(x), invd = convert<double>(inv);
        std::vector<double> ref_out(size), ref_din(size);
        strata::ref::rope_forward(ref_out.data(), xd.data(), pos.data(), invd.data(), n, nh, d);
        strata::ref::rope_backward(ref_din.data(), xd.data(), pos.data(), invd.data(), n, nh, d);
        double es = std::max(max_rel_error(out, ref_out), max_rel_error(din, ref_din));
        INFO("n=" << n << " nh=" << nh << " d=" << d << " small-pos err " << es);
        CHECK(es <= 1e-5);
        worst_small = std::max(worst_small, es);

        // Large positions: the f32 angle differs from the exact one by design (as in HF), so
        // compare with the reference run in f32, which takes the same angle.
        auto big = rope_positions(n, 131072, 300 + n);
        strata::cpu::rope_forward(out.data(), x.data(), big.data(), inv.data(), n, nh, d);
        strata::cpu::rope_backward(din.data(), x.data(), big.data(), inv.data(), n, nh, d);
        std::vector<float> f_out(size), f_din(size);
        strata::ref::rope_forward(f_out.data(), x.data(), big.data(), inv.data(), n, nh, d);
        strata::ref::rope_backward(f_din.data(), x.data(), big.data(), inv.data(), n, nh, d);
        double el = std::max(max_rel_error(out, f_out), max_rel_error(din, f_din));
        INFO("large-pos err vs f32 ref " << el);
        CHECK(el <= 1e-6);
        worst_large = std::max(worst_large, el);
      }
    }
  }
  std::printf("rope f32 vs fp64 ref (pos < 64, worst) %.2e; vs f32 ref (pos < 131072) %.2e\n",
              worst_small, worst_large);
}

TEST_CASE("rope fast path works in place and is independent of the thread count", "[kernels]") {
  const int64_t n = 301, nh = 4, d = 66, size = n * nh * d;
  auto x = random_floats(size, 7);
  auto inv = rope_inv_freq(d, 500000.f);
  auto pos = rope_positions(n, 8192, 8);
  std::vector<float> out(size), din(size);
  strata::cpu::rope_forward(out.data(), x.data(), pos.data(), inv.data(), n, nh, d);
  strata::cpu::rope_backward(din.data(), out.data(), pos.data(), inv.data(), n, nh, d);
  // The backward is the inverse rotation: it must bring x back (to rounding).
  CHECK(max_rel_error(din, x) <= 1e-6);

  std::vector<float> inplace = x;
  strata::cpu::rope_forward(inplace.data(), inplace.data(), pos.data(), inv.data(), n, nh, d);
  CHECK(std::memcmp(inplace.data(), out.data(), size * 4) == 0);
  strata::cpu::rope_backward(inplace.data(), inplace.data(), pos.data(), inv.data(), n, nh, d);
  CHECK(std::memcmp(inplace.data(), din.data(), size * 4) == 0);

  const int keep = omp_get_max_threads();
  std::vector<float> one(size), two(size);
  omp_set_num_threads(1);
  strata::cpu::rope_forward(one.data(), x.data(), pos.data(), inv.data(), n, nh, d);
  omp_set_num_threads(2);
  strata::cpu::rope_forward(two.data(), x.data(), pos.data(), inv.data(), n, nh, d);
  omp_set_num_threads(keep);
  CHECK(std::memcmp(one.data(), two.data(), size * 4) == 0);
}

TEST_CASE("rope rejects an odd head dim", "[kernels]") {
  std::vector<float> x(3), inv(1);
  int32_t pos = 0;
  CHECK_THROWS_AS(strata::cpu::rope_forward(x.data(), x.data(), &pos, inv.data(), 1, 1, 3),
                  strata::Error);
}

TEST_CASE("rope with a partial rotary dim turns the leading dims and passes the rest", "[kernels][rope]") {
  // Phi-4-mini's partial_rotary_factor 0.75: rot < d. The fast path against the fp64 twin, out of
  // place (the passed dims copied) and in place (left as they are), and the twin against a whole-head
  // rope on the first rot dims alone.
  for (int64_t n : {1, 17}) {
    for (int64_t d : {16, 130}) {
      for (int64_t rot : {int64_t(2), d * 3 / 4 / 2 * 2, d - 2}) {
        const int64_t nh = 3, size = n * nh * d;
        INFO("n=" << n << " d=" << d << " rot=" << rot);
        auto x = random_floats(size, 900 + n + d + rot);
        auto inv = rope_inv_freq(rot);
        auto pos = rope_positions(n, 64, 901 + n);
        std::vector<float> out(size, -7.f), din(size, -7.f);
        strata::cpu::rope_forward(out.data(), x.data(), pos.data(), inv.data(), n, nh, d, rot);
        strata::cpu::rope_backward(din.data(), x.data(), pos.data(), inv.data(), n, nh, d, rot);
        auto xd = convert<double>(x), invd = convert<double>(inv);
        std::vector<double> ref_out(size), ref_din(size);
        strata::ref::rope_forward(ref_out.data(), xd.data(), pos.data(), invd.data(), n, nh, d, rot);
        strata::ref::rope_backward(ref_din.data(), xd.data(), pos.data(), invd.data(), n, nh, d, rot);
        CHECK(std::max(max_rel_error(out, ref_out), max_rel_error(din, ref_din)) <= 1e-5);
        // the twin: each head's first rot dims as a whole-head rope of dim rot, the rest x itself
        std::vector<double> head(static_cast<size_t>(rot)), turned(static_cast<size_t>(rot));
        for (int64_t i = 0; i < n; ++i)
          for (int64_t h = 0; h < nh; ++h) {
            const double* xh = xd.data() + (i * nh + h) * d;
            std::copy(xh, xh + rot, head.begin());
            strata::ref::rope_forward(turned.data(), head.data(), pos.data() + i, invd.data(), 1, 1, rot);
            for (int64_t j = 0; j < d; ++j) {
              const double want = j < rot ? turned[size_t(j)] : xh[j];
              REQUIRE(ref_out[size_t((i * nh + h) * d + j)] == want);
              if (j >= rot) REQUIRE(out[size_t((i * nh + h) * d + j)] == x[size_t((i * nh + h) * d + j)]);
            }
          }
        std::vector<float> inplace = x;
        strata::cpu::rope_forward(inplace.data(), inplace.data(), pos.data(), inv.data(), n, nh, d, rot);
        CHECK(std::memcmp(inplace.data(), out.data(), size_t(size) * 4) == 0);
      }
    }
  }
  std::vector<float> x(8), inv(2);
  int32_t pos = 0;
  CHECK_THROWS_AS(strata::cpu::rope_forward(x.data(), x.data(), &pos, inv.data(), 1, 1, 8, 3), strata::Error);  // odd
  CHECK_THROWS_AS(strata::cpu::rope_forward(x.data(), x.data(), &pos, inv.data(), 1, 1, 8, 10), strata::Error); // > d
}
