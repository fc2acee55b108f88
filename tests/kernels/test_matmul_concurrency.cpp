// Regression: matmul tiles run concurrently; oneDNN's library scratchpad is shared between
// concurrent executions, which made multi-tile products differ from call to call (and broke
// training). Each thread now passes its own scratchpad.
#include <omp.h>

#include <catch2/catch.hpp>
#include <thread>
#include <vector>

#include "kernels/cpu/ops.h"
#include "tests/testing.h"

namespace strata {

TEST_CASE("multi-tile matmuls are bitwise repeatable, also from two threads at once", "[kernels]") {
  const int64_t m = 512, n = 72, k = 40;  // two row tiles with a partial column tile
  auto a = testing::random_floats(size_t(m * k), 11), b = testing::random_floats(size_t(n * k), 12);
  std::vector<float> want(size_t(m * n));
  omp_set_num_threads(2);
  cpu::matmul_f32(want.data(), a.data(), b.data(), m, n, k, false, true, 0.f);
  auto run = [&](std::vector<float>& out) {
    omp_set_num_threads(2);
    for (int r = 0; r < 5; ++r) cpu::matmul_f32(out.data(), a.data(), b.data(), m, n, k, false, true, 0.f);
  };
  std::vector<float> x(want.size()), y(want.size());
  std::thread t1([&] { run(x); }), t2([&] { run(y); });
  t1.join();
  t2.join();
  CHECK(x == want);
  CHECK(y == want);
}

}  // namespace strata
