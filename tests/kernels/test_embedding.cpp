// Embedding: the fp64 reference against finite differences, the fast paths against the
// references (lookups exact; the scatter bitwise equal to the f32 reference, since both add in
// token order), and thread-count independence of the scatter.
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

namespace {

std::vector<int32_t> embedding_ids(int64_t n, int64_t v, uint64_t seed) {
  auto u = random_floats(n, seed, 0.f, float(v));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[i] = std::min(int32_t(u[i]), int32_t(v - 1));
  return ids;
}

}  // namespace

TEST_CASE("embedding reference backward matches finite differences", "[kernels]") {
  const int64_t v = 4, c = 3, n = 6;
  auto table = convert<double>(random_floats(v * c, 1));
  auto r = convert<double>(random_floats(n * c, 2));  // loss = sum(out * r)
  std::vector<int32_t> ids = {2, 0, 2, 3, 2, 0};        // repeats; row 1 unused
  auto loss = [&](const std::vector<double>& t) {
    std::vector<double> out(n * c);
    strata::ref::embedding_forward(out.data(), t.data(), ids.data(), n, c);
    double s = 0;
    for (size_t i = 0; i < out.size(); ++i) s += out[i] * r[i];
    return s;
  };
  std::vector<double> dt(v * c, 0.0);
  strata::ref::embedding_backward(dt.data(), r.data(), ids.data(), n, c);
  double e = max_rel_error(dt, finite_difference(table, loss));
  std::printf("embedding ref vs finite differences: dtable %.2e\n", e);
  CHECK(e <= 1e-6);
}

TEST_CASE("embedding fast paths match the references", "[kernels]") {
  double worst = 0;
  for (int64_t n : {1, 15, 17, 4097}) {
    for (int64_t c : {1, 7, 64, 129}) {
      const int64_t v = 37;
      auto table = random_floats(v * c, 10 + c);
      auto ids = embedding_ids(n, v, 20 + n);
      std::vector<float> out(n * c), ref_out(n * c);
      strata::cpu::embedding_forward(out.data(), table.data(), ids.data(), n, c);
      strata::ref::embedding_forward(ref_out.data(), table.data(), ids.data(), n, c);
      CHECK(std::memcmp(out.data(), ref_out.data(), out.size() * 4) == 0);

      auto table16 = strata::testing::to_bf16(table);
      std::vector<float> out16(n * c), ref16(n * c);
      auto rounded = strata::testing::round_bf16(table);
      strata::cpu::embedding_forward_bf16(out16.data(), table16.data(), ids.data(), n, c);
      strata::ref::embedding_forward(ref16.data(), rounded.data(), ids.data(), n, c);
      CHECK(std::memcmp(out16.data(), ref16.data(), out16.size() * 4) == 0);

      auto dout = random_floats(n * c, 30 + n + c);
      auto dt = random_floats(v * c, 40 + c);  // accumulated into: start nonzero
      auto dt_f32 = dt;
      auto dt_f64 = convert<double>(dt);
      auto dout64 = convert<double>(dout);
      strata::cpu::embedding_backward(dt.data(), dout.data(), ids.data(), n, c);
      strata::ref::embedding_backward(dt_f32.data(), dout.data(), ids.data(), n, c);
      strata::ref::embedding_backward(dt_f64.data(), dout64.data(), ids.data(), n, c);
      INFO("n=" << n << " c=" << c);
      CHECK(std::memcmp(dt.data(), dt_f32.data(), dt.size() * 4) == 0);
      double e = max_rel_error(dt, dt_f64);
      CHECK(e <= 1e-5);
      worst = std::max(worst, e);
    }
  }
  std::printf("embedding f32 vs fp64 ref (worst dtable): %.2e; lookups and scatter vs f32 ref: "
              "bitwise\n", worst);
}

TEST_CASE("embedding backward is bitwise independent of the thread count", "[kernels]") {
  const int64_t n = 3001, c = 67, v = 11;
  auto ids = embedding_ids(n, v, 5);
  auto dout = random_floats(n * c, 6);
  std::vector<float> one(v * c, 0.f), two(v * c, 0.f);
  const int keep = omp_get_max_threads();
  omp_set_num_threads(1);
  strata::cpu::embedding_backward(one.data(), dout.data(), ids.data(), n, c);
  omp_set_num_threads(2);
  strata::cpu::embedding_backward(two.data(), dout.data(), ids.data(), n, c);
  omp_set_num_threads(keep);
  CHECK(std::memcmp(one.data(), two.data(), one.size() * 4) == 0);
}
