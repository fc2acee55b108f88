// LoRA dropout (kernels/cpu/dropout.h, kernels/common/dropout_mask.h): the CPU fast path equals its
// plain-loop twin bit for bit at awkward sizes, in place and accumulating, whatever the thread
// count; the kept fraction is 1 − p (within five binomial standard deviations); kept elements are
// in · f32(1 / (1 − p)) and dropped ones 0; p = 0 keeps everything; the keys separate.
#include <omp.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/common/dropout_mask.h"
#include "kernels/cpu/dropout.h"
#include "kernels/cpu/ref/dropout.h"
#include "src/core/error.h"
#include "tests/testing.h"

using namespace strata;
using strata::testing::random_floats;

namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("dropout: the fast path equals the plain-loop twin bit for bit", "[kernels][dropout]") {
  for (int64_t n : {int64_t(1), int64_t(3), int64_t(15), int64_t(17), int64_t(4097), int64_t(70001)}) {
    for (double p : {0.0, 0.05, 0.5, 0.9}) {
      for (bool accumulate : {false, true}) {
        INFO("n " << n << " p " << p << " accumulate " << accumulate);
        const std::vector<float> in = random_floats(size_t(n), uint64_t(n) + 1, -3.f, 3.f);
        const std::vector<float> out0 = random_floats(size_t(n), uint64_t(n) + 2, -1.f, 1.f);
        std::vector<float> fast = out0, twin = out0;
        cpu::dropout_apply(fast.data(), in.data(), 0x1234ABCDull, 11, p, n, accumulate);
        ref::dropout_apply(twin.data(), in.data(), 0x1234ABCDull, 11, p, n, accumulate);
        CHECK(same_bits(fast, twin));
        const float scale = float(1.0 / (1.0 - p));
        int64_t bad = 0;
        for (int64_t i = 0; i < n; ++i) {  // each element: kept (in · scale) or dropped (0)
          const double base = accumulate ? out0[size_t(i)] : 0.0;
          const double kept = base + double(in[size_t(i)]) * double(scale), got = fast[size_t(i)];
          bad += got != float(base) && std::abs(got - kept) > 1e-6 * (std::abs(kept) + 1.0);
        }
        CHECK(bad == 0);
        if (p == 0.0) {
          std::vector<float> want(static_cast<size_t>(n));
          for (int64_t i = 0; i < n; ++i) want[size_t(i)] = accumulate ? out0[size_t(i)] + in[size_t(i)] : in[size_t(i)];
          CHECK(same_bits(fast, want));
        }
      }
    }
  }
}

TEST_CASE("dropout: in place, and independent of the thread count", "[kernels][dropout]") {
  const int64_t n = 100003;
  const std::vector<float> in = random_floats(size_t(n), 5, -2.f, 2.f);
  std::vector<float> twin(static_cast<size_t>(n));
  ref::dropout_apply(twin.data(), in.data(), 99, 3, 0.25, n, false);
  std::vector<float> inplace = in;
  cpu::dropout_apply(inplace.data(), inplace.data(), 99, 3, 0.25, n, false);
  CHECK(same_bits(inplace, twin));
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  std::vector<float> one(static_cast<size_t>(n));
  cpu::dropout_apply(one.data(), in.data(), 99, 3, 0.25, n, false);
  omp_set_num_threads(std::max(2, threads));
  std::vector<float> many(static_cast<size_t>(n));
  cpu::dropout_apply(many.data(), in.data(), 99, 3, 0.25, n, false);
  omp_set_num_threads(threads);
  CHECK(same_bits(one, twin));
  CHECK(same_bits(many, twin));
}

TEST_CASE("dropout: the kept fraction is 1 - p and the keys give unrelated masks", "[kernels][dropout]") {
  const int64_t n = 1 << 18;
  const std::vector<float> ones(size_t(n), 1.f);
  auto kept = [&](uint64_t seed, uint32_t tensor, double p, std::vector<float>* out) {
    out->assign(size_t(n), 0.f);
    cpu::dropout_apply(out->data(), ones.data(), seed, tensor, p, n, false);
    int64_t k = 0;
    for (float x : *out) k += x != 0.f;
    return k;
  };
  for (double p : {0.05, 0.1, 0.5, 0.75}) {
    INFO("p " << p);
    std::vector<float> a, b, c;
    const double sd = std::sqrt(double(n) * p * (1 - p));
    const int64_t ka = kept(dropout::dropout_seed(1, 1, 0), 0, p, &a);
    CHECK(std::abs(double(ka) - double(n) * (1 - p)) <= 5 * sd);
    // another micro-batch, another module: masks agreeing on about p² + (1-p)² of the elements
    kept(dropout::dropout_seed(1, 1, 1), 0, p, &b);
    kept(dropout::dropout_seed(1, 1, 0), 1, p, &c);
    for (const std::vector<float>* other : {&b, &c}) {
      int64_t agree = 0;
      for (int64_t i = 0; i < n; ++i) agree += (a[size_t(i)] != 0.f) == ((*other)[size_t(i)] != 0.f);
      const double q = p * p + (1 - p) * (1 - p);
      CHECK(std::abs(double(agree) - double(n) * q) <= 5 * std::sqrt(double(n) * q * (1 - q)));
    }
  }
  CHECK(dropout::dropout_seed(1, 1, 0) != dropout::dropout_seed(1, 0, 1));
  CHECK(dropout::dropout_threshold(0.5) == 0x80000000u);
  CHECK(dropout::dropout_threshold(0.0) == 0u);
}

TEST_CASE("dropout: a probability below 0 or at 1 and above is refused", "[kernels][dropout]") {
  std::vector<float> x(4, 1.f);
  CHECK_THROWS_AS(cpu::dropout_apply(x.data(), x.data(), 1, 0, 1.0, 4, false), Error);
  CHECK_THROWS_AS(cpu::dropout_apply(x.data(), x.data(), 1, 0, -0.5, 4, false), Error);
}
