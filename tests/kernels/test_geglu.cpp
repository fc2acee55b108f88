// GeGLU (Gemma's MLP gate, gelu_tanh(gate) * up) and the affine map y = a x + b: the fp64 twin
// (kernels/cpu/ref/geglu.h) against finite differences and against PyTorch's published values of
// gelu(approximate="tanh"), the fast CPU kernels against the twin at SIMD-tail and threaded sizes.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/ref/geglu.h"
#include "tests/seeded_inputs.h"
#include "tests/testing.h"

using namespace strata;
using strata::testing::convert;
using strata::testing::max_rel_error;
using strata::testing::random_floats;

TEST_CASE("gelu_tanh's twin gives PyTorch's values and its derivative matches finite differences", "[kernels][geglu]") {
  // torch.nn.functional.gelu(torch.tensor(x, dtype=torch.float64), approximate="tanh")
  CHECK(std::abs(ref::gelu_tanh(1.0) - 0.8411919906082768) <= 1e-15);
  CHECK(std::abs(ref::gelu_tanh(-2.5) - (-0.015084266089998577)) <= 1e-15);
  CHECK(ref::gelu_tanh(0.0) == 0.0);
  // the whole op: d(sum w * out)/d(gate, up) against central differences
  const int64_t n = 9;
  const auto x = convert<double>(random_floats(static_cast<size_t>(2 * n), 3, -3.f, 3.f));  // gate then up
  const auto w = convert<double>(random_floats(static_cast<size_t>(n), 4));
  auto loss = [&](const std::vector<double>& in) {
    std::vector<double> out(static_cast<size_t>(n));
    ref::geglu_forward(out.data(), in.data(), in.data() + n, n);
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += w[static_cast<size_t>(i)] * out[static_cast<size_t>(i)];
    return s;
  };
  std::vector<double> grad(static_cast<size_t>(2 * n));
  ref::geglu_backward(grad.data(), grad.data() + n, w.data(), x.data(), x.data() + n, n);
  CHECK(max_rel_error(grad, strata::testing::finite_difference(x, loss)) <= 1e-7);
}

TEST_CASE("geglu and affine fast paths match the fp64 twin at awkward sizes", "[kernels][geglu]") {
  for (const int64_t n : {1, 15, 17, 4097, 70001}) {
    INFO("n=" << n);
    const auto gate = random_floats(static_cast<size_t>(n), 10 + n, -4.f, 4.f), up = random_floats(static_cast<size_t>(n), 20 + n);
    const auto dout = random_floats(static_cast<size_t>(n), 30 + n);
    std::vector<float> out(static_cast<size_t>(n)), dgate(static_cast<size_t>(n)), dup(static_cast<size_t>(n)), y(static_cast<size_t>(n));
    cpu::geglu_forward(out.data(), gate.data(), up.data(), n);
    cpu::geglu_backward(dgate.data(), dup.data(), dout.data(), gate.data(), up.data(), n);
    cpu::affine(y.data(), gate.data(), 6.3245554f, 1.f, n);
    const auto gd = convert<double>(gate), ud = convert<double>(up), dd = convert<double>(dout);
    std::vector<double> ro(static_cast<size_t>(n)), rg(static_cast<size_t>(n)), ru(static_cast<size_t>(n)), ry(static_cast<size_t>(n));
    ref::geglu_forward(ro.data(), gd.data(), ud.data(), n);
    ref::geglu_backward(rg.data(), ru.data(), dd.data(), gd.data(), ud.data(), n);
    ref::affine(ry.data(), gd.data(), double(6.3245554f), 1.0, n);
    // f32 tanh and products: a few ulps of each element's magnitude
    CHECK(max_rel_error(out, ro) <= 2e-6);
    CHECK(max_rel_error(dgate, rg) <= 2e-6);
    CHECK(max_rel_error(dup, ru) <= 2e-6);
    CHECK(max_rel_error(y, ry) <= 1e-7);
    // in place
    std::vector<float> z = gate;
    cpu::affine(z.data(), z.data(), 6.3245554f, 1.f, n);
    CHECK(z == y);
  }
}
