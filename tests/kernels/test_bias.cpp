// Bias: the fp64 reference against finite differences, the fast f32 path against the fp64
// reference, and the chunked column sum bitwise independent of the thread count.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include <catch2/catch.hpp>
#include <omp.h>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/ref.h"
#include "tests/testing.h"

using namespace strata::testing;  // random_floats, convert, finite_difference, max_rel_error

TEST_CASE("bias reference backward matches finite differences", "[kernels]") {
  const int64_t n = 5, o = 7;
  auto y0 = convert<double>(random_floats(n * o, 1));
  auto b = convert<double>(random_floats(o, 2));
  auto r = convert<double>(random_floats(n * o, 3));  // loss = sum(y * r)
  auto loss = [&](const std::vector<double>& bb) {
    std::vector<double> y = y0;
    strata::ref::bias_forward(y.data(), bb.data(), n, o);
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += y[i] * r[i];
    return s;
  };
  std::vector<double> db(o, 0.0);
  strata::ref::bias_backward(db.data(), r.data(), n, o);
  double e = max_rel_error(db, finite_difference(b, loss));
  std::printf("bias ref vs finite differences: db %.2e\n", e);
  CHECK(e <= 1e-6);
}

TEST_CASE("bias fast path matches the fp64 reference", "[kernels]") {
  double worst = 0;
  for (int64_t n : {1, 15, 17, 65, 4097}) {
    for (int64_t o : {1, 7, 64, 129}) {
      auto y = random_floats(n * o, 10 + n * 3 + o), b = random_floats(o, 20 + o);
      auto dy = random_floats(n * o, 30 + n + o), db = random_floats(o, 40 + o);
      auto yd = convert<double>(y), dbd = convert<double>(db);
      strata::cpu::bias_forward(y.data(), b.data(), n, o);
      strata::cpu::bias_backward(db.data(), dy.data(), n, o);
      auto bd = convert<double>(b), dyd = convert<double>(dy);
      strata::ref::bias_forward(yd.data(), bd.data(), n, o);
      strata::ref::bias_backward(dbd.data(), dyd.data(), n, o);
      double ey = max_rel_error(y, yd), eb = max_rel_error(db, dbd);
      INFO("n=" << n << " o=" << o << " y " << ey << " db " << eb);
      CHECK(ey <= 1e-6);
      CHECK(eb <= 1e-5);
      worst = std::max({worst, ey, eb});
    }
  }
  std::printf("bias f32 vs fp64 ref (worst): %.2e\n", worst);
}

TEST_CASE("bias backward is bitwise independent of the thread count", "[kernels]") {
  for (int64_t n : {63, 4097, 64 * 64 * 2 + 5}) {  // one chunk; two levels; three levels
    const int64_t o = 33;
    auto dy = random_floats(n * o, 9 + n);
    std::vector<float> one(o, 0.5f), two(o, 0.5f);
    const int keep = omp_get_max_threads();
    omp_set_num_threads(1);
    strata::cpu::bias_backward(one.data(), dy.data(), n, o);
    omp_set_num_threads(2);
    strata::cpu::bias_backward(two.data(), dy.data(), n, o);
    omp_set_num_threads(keep);
    INFO("n=" << n);
    CHECK(std::memcmp(one.data(), two.data(), o * 4) == 0);
  }
}
