// RMSNorm: the fp64 reference against finite differences, the fast f32 path against the fp64
// reference at awkward sizes, and thread-count independence of the fast path.
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

// f32 fast-path results of forward and backward on fixed inputs.
struct RmsnormRun {
  std::vector<float> out, rstd, din, dweight;
};

RmsnormRun rmsnorm_run_fast(const std::vector<float>& x, const std::vector<float>& w,
                            const std::vector<float>& dy, const std::vector<float>& dw0,
                            int64_t n, int64_t c, float eps) {
  RmsnormRun r{std::vector<float>(x.size()), std::vector<float>(size_t(n)),
               std::vector<float>(x.size()), dw0};
  strata::cpu::rmsnorm_forward(r.out.data(), r.rstd.data(), x.data(), w.data(), n, c, eps);
  strata::cpu::rmsnorm_backward(r.din.data(), r.dweight.data(), dy.data(), x.data(), w.data(),
                                r.rstd.data(), n, c);
  return r;
}

}  // namespace

TEST_CASE("rmsnorm reference backward matches finite differences", "[kernels]") {
  const int64_t n = 3, c = 7;
  const double eps = 1e-5;
  auto x = convert<double>(random_floats(n * c, 1));
  auto w = convert<double>(random_floats(c, 2, 0.5f, 1.5f));
  auto r = convert<double>(random_floats(n * c, 3));  // random projection: loss = sum(out * r)
  auto loss = [&](const std::vector<double>& xx, const std::vector<double>& ww) {
    std::vector<double> out(n * c), rstd(n);
    strata::ref::rmsnorm_forward(out.data(), rstd.data(), xx.data(), ww.data(), n, c, eps);
    double s = 0;
    for (size_t i = 0; i < out.size(); ++i) s += out[i] * r[i];
    return s;
  };
  std::vector<double> out(n * c), rstd(n), dx(n * c), dw(c, 0.0);
  strata::ref::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), n, c, eps);
  strata::ref::rmsnorm_backward(dx.data(), dw.data(), r.data(), x.data(), w.data(), rstd.data(),
                                n, c);
  auto fd_x = finite_difference(x, [&](const std::vector<double>& v) { return loss(v, w); });
  auto fd_w = finite_difference(w, [&](const std::vector<double>& v) { return loss(x, v); });
  double ex = max_rel_error(dx, fd_x), ew = max_rel_error(dw, fd_w);
  std::printf("rmsnorm ref vs finite differences: din %.2e dweight %.2e\n", ex, ew);
  CHECK(ex <= 1e-6);
  CHECK(ew <= 1e-6);
}

TEST_CASE("rmsnorm fast path matches the fp64 reference", "[kernels]") {
  const float eps = 1e-5f;
  double worst_out = 0, worst_din = 0, worst_dw = 0;
  for (int64_t n : {1, 15, 17, 130}) {
    for (int64_t c : {1, 7, 64, 129, 4097}) {
      auto x = random_floats(n * c, 10 + n * 7 + c, -2.f, 2.f);
      auto w = random_floats(c, 20 + c, 0.5f, 1.5f);
      auto dy = random_floats(n * c, 30 + n + c);
      auto dw0 = random_floats(c, 40 + c);  // dweight is accumulated: start from nonzero
      RmsnormRun f = rmsnorm_run_fast(x, w, dy, dw0, n, c, eps);

      auto xd = convert<double>(x), wd = convert<double>(w), dyd = convert<double>(dy);
      std::vector<double> out(n * c), rstd(n), din(n * c), dw = convert<double>(dw0);
      strata::ref::rmsnorm_forward(out.data(), rstd.data(), xd.data(), wd.data(), n, c,
                                   double(eps));
      strata::ref::rmsnorm_backward(din.data(), dw.data(), dyd.data(), xd.data(), wd.data(),
                                    rstd.data(), n, c);
      // din is a difference of two terms of size r*dy*w (they cancel almost fully when c = 1):
      // measure its error against the size of those terms.
      double term = 0;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < c; ++j)
          term = std::max(term, std::abs(rstd[i] * dyd[i * c + j] * wd[j]));
      double eo = std::max(max_rel_error(f.out, out), max_rel_error(f.rstd, rstd));
      double ed = max_rel_error(f.din, din, term);
      double ew = max_rel_error(f.dweight, dw);
      INFO("n=" << n << " c=" << c << " out " << eo << " din " << ed << " dweight " << ew);
      CHECK(eo <= 1e-5);
      CHECK(ed <= 1e-5);
      CHECK(ew <= 1e-5);
      worst_out = std::max(worst_out, eo);
      worst_din = std::max(worst_din, ed);
      worst_dw = std::max(worst_dw, ew);
    }
  }
  std::printf("rmsnorm f32 vs fp64 ref (worst): out/rstd %.2e din %.2e dweight %.2e\n",
              worst_out, worst_din, worst_dw);
}

TEST_CASE("rmsnorm fast path is bitwise independent of the thread count", "[kernels]") {
  const int64_t n = 1000, c = 129;  // 16 chunks of 64 rows, the last one short
  auto x = random_floats(n * c, 50), w = random_floats(c, 51), dy = random_floats(n * c, 52);
  std::vector<float> dw0(c, 0.25f);
  const int keep = omp_get_max_threads();
  omp_set_num_threads(1);
  RmsnormRun one = rmsnorm_run_fast(x, w, dy, dw0, n, c, 1e-6f);
  omp_set_num_threads(2);
  RmsnormRun two = rmsnorm_run_fast(x, w, dy, dw0, n, c, 1e-6f);
  omp_set_num_threads(keep);
  CHECK(std::memcmp(one.out.data(), two.out.data(), one.out.size() * 4) == 0);
  CHECK(std::memcmp(one.din.data(), two.din.data(), one.din.size() * 4) == 0);
  CHECK(std::memcmp(one.dweight.data(), two.dweight.data(), one.dweight.size() * 4) == 0);
}

TEST_CASE("rmsnorm's bf16-output forward: the f32 forward's bits, and their rounding", "[kernels]") {
  // 1000 x 129: both threads' rows and the vector loop's tail; large inputs round up past a
  // bf16 boundary, zero rows give zeros
  const int64_t n = 1000, c = 129;
  auto x = random_floats(n * c, 60, -300.f, 300.f), w = random_floats(c, 61);
  for (int64_t j = 0; j < c; ++j) x[size_t(7 * c + j)] = 0.f;
  std::vector<float> out(x.size()), rstd(static_cast<size_t>(n)), out2(x.size()), rstd2(static_cast<size_t>(n));
  std::vector<strata::bf16> out_b(x.size()), want(x.size());
  strata::cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), n, c, 1e-6f);
  strata::cpu::rmsnorm_forward_bf16(out2.data(), out_b.data(), rstd2.data(), x.data(), w.data(), n, c, 1e-6f);
  strata::cpu::cast_f32_to_bf16(want.data(), out.data(), n * c);
  CHECK(std::memcmp(out.data(), out2.data(), out.size() * 4) == 0);
  CHECK(std::memcmp(rstd.data(), rstd2.data(), rstd.size() * 4) == 0);
  CHECK(bf16_mismatches(out_b, want) == 0);
}

TEST_CASE("rmsnorm rejects bad sizes", "[kernels]") {
  float x = 1, w = 1, out, rstd;
  strata::bf16 out_b;
  CHECK_THROWS_AS(strata::cpu::rmsnorm_forward(&out, &rstd, &x, &w, 1, 0, 1e-6f), strata::Error);
  CHECK_THROWS_AS(strata::cpu::rmsnorm_forward_bf16(&out, &out_b, &rstd, &x, &w, -1, 1, 1e-6f), strata::Error);
}
