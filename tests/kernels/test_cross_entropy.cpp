// Tests of the chunked lm_head + cross-entropy kernels: the fp64 reference against finite
// differences, the f32 and bf16 fast paths against the reference at awkward sizes (ignored
// rows, all rows ignored, more rows than one chunk), thread-count independence, bad targets.
#include <omp.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/ref.h"
#include "src/core/error.h"
#include "tests/seeded_inputs.h"
#include "tests/testing.h"

using namespace strata;
using strata::testing::convert;
using strata::testing::make_targets;
using strata::testing::max_rel_error;
using strata::testing::random_floats;
using strata::testing::round_bf16;
using strata::testing::to_bf16;

namespace {

// Gradient increment of dw: the kernels accumulate into a non-zero start.
std::vector<double> delta(const std::vector<float>& after, const std::vector<float>& before) {
  std::vector<double> d(after.size());
  for (size_t i = 0; i < d.size(); ++i) d[i] = double(after[i]) - double(before[i]);
  return d;
}

struct CeCase {
  int64_t n, c, v;
};

}  // namespace

TEST_CASE("cross-entropy reference backward matches finite differences in fp64", "[kernels]") {
  const int64_t n = 6, c = 4, v = 7;
  const std::vector<int32_t> targets = {3, -100, 0, 6, 2, 3};
  const double grad_scale = 0.37;
  // x = [h, w]; f = grad_scale * summed loss.
  std::vector<double> x = convert<double>(random_floats(size_t(n * c + v * c), 21, -2.f, 2.f));
  auto f = [&](const std::vector<double>& xs) {
    int64_t count = 0;
    return grad_scale *
           ref::lm_head_ce_forward(&count, xs.data(), xs.data() + n * c, targets.data(), n, c, v);
  };
  std::vector<double> grad(x.size(), 0.0);
  for (int64_t i = n * c; i < int64_t(x.size()); ++i) grad[i] = 0.5;  // dw accumulates
  int64_t count = 0;
  const double loss =
      ref::lm_head_ce_backward(grad.data(), grad.data() + n * c, &count, x.data(), x.data() + n * c,
                               targets.data(), n, c, v, grad_scale);
  for (int64_t i = n * c; i < int64_t(x.size()); ++i) grad[i] -= 0.5;
  CHECK(count == 5);
  CHECK(std::abs(grad_scale * loss - f(x)) <= 1e-12 * std::abs(f(x)));
  const std::vector<double> fd = strata::testing::finite_difference(x, f);
  INFO("rel err " << max_rel_error(grad, fd));
  CHECK(max_rel_error(grad, fd) <= 1e-6);
  for (int64_t e = 0; e < c; ++e) CHECK(grad[1 * c + e] == 0.0);  // ignored row
}

TEST_CASE("cross-entropy f32 fast path matches the fp64 reference", "[kernels]") {
  // ||fast - ref||_inf / ||ref||_inf <= 1e-5 for dh and the dw increment; loss to 1e-5 relative.
  const double tol = 1e-5;
  double worst_loss = 0, worst_grad = 0;
  // A Latin square over N x V x C: every (N,V), (N,C) and (V,C) pair once, in nine runs.
  // N=300 with every third row ignored is 200 counted rows: two chunks of 128.
  const int64_t ns[] = {1, 17, 300}, vs[] = {7, 1000, 5003}, cs[] = {3, 64, 33};
  int idx = 0;
  for (int ni = 0; ni < 3; ++ni)
    for (int vi = 0; vi < 3; ++vi) {
      const int64_t n = ns[ni], v = vs[vi], c = cs[(ni + vi) % 3];
      ++idx;
      const auto h = random_floats(size_t(n * c), 100 + idx, -1.f, 1.f);
      const auto w = random_floats(size_t(v * c), 200 + idx, -1.f, 1.f);
      const auto dw0 = random_floats(size_t(v * c), 300 + idx, -0.1f, 0.1f);
      const auto targets = make_targets(n, v, 3, idx);
      const float grad_scale = 1.f / float(n);

      int64_t count_f = -1, count_b = -1, count_r = -1;
      const double loss_f =
          cpu::lm_head_ce_forward(&count_f, h.data(), w.data(), targets.data(), n, c, v);
      std::vector<float> dh(size_t(n * c), 7.f), dw = dw0;
      const double loss_b = cpu::lm_head_ce_backward(dh.data(), dw.data(), &count_b, h.data(),
                                                     w.data(), targets.data(), n, c, v, grad_scale);
      const auto hd = convert<double>(h), wd = convert<double>(w);
      std::vector<double> dh_ref(size_t(n * c)), dw_ref(size_t(v * c), 0.0);
      const double loss_r =
          ref::lm_head_ce_backward(dh_ref.data(), dw_ref.data(), &count_r, hd.data(), wd.data(),
                                   targets.data(), n, c, v, double(grad_scale));
      const double e_loss = std::max(std::abs(loss_f - loss_r), std::abs(loss_b - loss_r)) /
                            std::max(std::abs(loss_r), 1e-30);
      const double e_grad =
          std::max(max_rel_error(dh, dh_ref), max_rel_error(delta(dw, dw0), dw_ref));
      INFO("n=" << n << " c=" << c << " v=" << v << " loss " << e_loss << " grad " << e_grad);
      REQUIRE(count_f == count_r);
      REQUIRE(count_b == count_r);
      REQUIRE(e_loss <= tol);
      REQUIRE(e_grad <= tol);
      worst_loss = std::max(worst_loss, e_loss);
      worst_grad = std::max(worst_grad, e_grad);
    }
  INFO("worst rel err: loss " << worst_loss << ", gradients " << worst_grad);
  CHECK(worst_loss <= tol);
  CHECK(worst_grad <= tol);
}

TEST_CASE("cross-entropy bf16 fast path matches the reference on bf16-rounded inputs",
          "[kernels]") {
  // The reference sees h and w rounded to bf16; the kernel's logits then differ only by f32
  // accumulation (loss to 1e-5). The backward also rounds dlogits to bf16 (2^-9 relative per
  // element), so dh and the dw increment get a looser 1e-2 relative to max-abs.
  const double tol_loss = 1e-5, tol_grad = 1e-2;
  double worst_loss = 0, worst_grad = 0;
  int idx = 0;
  for (const CeCase cc : {CeCase{1, 3, 7}, CeCase{17, 33, 1000}, CeCase{300, 64, 5003},
                          CeCase{300, 33, 7}, CeCase{17, 64, 5003}}) {
    ++idx;
    const auto [n, c, v] = cc;
    const auto h = random_floats(size_t(n * c), 500 + idx, -1.f, 1.f);
    const auto w = random_floats(size_t(v * c), 600 + idx, -1.f, 1.f);
    const auto wb = to_bf16(w);
    const auto dw0 = random_floats(size_t(v * c), 700 + idx, -0.1f, 0.1f);
    const auto targets = make_targets(n, v, 4, 50 + idx);
    const float grad_scale = 1.f / float(n);

    int64_t count_f = -1, count_b = -1, count_r = -1;
    const double loss_f =
        cpu::lm_head_ce_forward_bf16(&count_f, h.data(), wb.data(), targets.data(), n, c, v);
    std::vector<float> dh(size_t(n * c), 7.f), dw = dw0;
    const double loss_b = cpu::lm_head_ce_backward_bf16(
        dh.data(), dw.data(), &count_b, h.data(), wb.data(), targets.data(), n, c, v, grad_scale);
    const auto hd = convert<double>(round_bf16(h)), wd = convert<double>(round_bf16(w));
    std::vector<double> dh_ref(size_t(n * c)), dw_ref(size_t(v * c), 0.0);
    const double loss_r =
        ref::lm_head_ce_backward(dh_ref.data(), dw_ref.data(), &count_r, hd.data(), wd.data(),
                                 targets.data(), n, c, v, double(grad_scale));
    const double e_loss = std::max(std::abs(loss_f - loss_r), std::abs(loss_b - loss_r)) /
                          std::max(std::abs(loss_r), 1e-30);
    const double e_grad =
        std::max(max_rel_error(dh, dh_ref), max_rel_error(delta(dw, dw0), dw_ref));
    INFO("n=" << n << " c=" << c << " v=" << v << " loss " << e_loss << " grad " << e_grad);
    REQUIRE(count_f == count_r);
    REQUIRE(count_b == count_r);
    REQUIRE(e_loss <= tol_loss);
    REQUIRE(e_grad <= tol_grad);
    worst_loss = std::max(worst_loss, e_loss);
    worst_grad = std::max(worst_grad, e_grad);
  }
  INFO("worst rel err: loss " << worst_loss << ", gradients " << worst_grad);
  CHECK(worst_loss <= tol_loss);
  CHECK(worst_grad <= tol_grad);
}

TEST_CASE("cross-entropy with every row ignored", "[kernels]") {
  const int64_t n = 5, c = 3, v = 11;
  const std::vector<int32_t> targets(size_t(n), -100);
  const auto h = random_floats(size_t(n * c), 1), w = random_floats(size_t(v * c), 2);
  const auto dw0 = random_floats(size_t(v * c), 3);
  int64_t count = -1;
  CHECK(cpu::lm_head_ce_forward(&count, h.data(), w.data(), targets.data(), n, c, v) == 0.0);
  CHECK(count == 0);
  std::vector<float> dh(size_t(n * c), 7.f), dw = dw0;
  count = -1;
  CHECK(cpu::lm_head_ce_backward(dh.data(), dw.data(), &count, h.data(), w.data(), targets.data(),
                                 n, c, v, 1.f) == 0.0);
  CHECK(count == 0);
  for (float x : dh) CHECK(x == 0.f);
  CHECK(dw == dw0);
  const auto wb = to_bf16(w);
  count = -1;
  std::fill(dh.begin(), dh.end(), 7.f);
  CHECK(cpu::lm_head_ce_backward_bf16(dh.data(), dw.data(), &count, h.data(), wb.data(),
                                      targets.data(), n, c, v, 1.f) == 0.0);
  CHECK(count == 0);
  for (float x : dh) CHECK(x == 0.f);
  CHECK(dw == dw0);
}

TEST_CASE("cross-entropy results are bitwise independent of the thread count", "[kernels]") {
  const int64_t n = 300, c = 64, v = 1000;
  const auto h = random_floats(size_t(n * c), 31), w = random_floats(size_t(v * c), 32);
  const auto wb = to_bf16(w);
  const auto targets = make_targets(n, v, 5, 33);
  struct Run {
    double loss_f32, loss_bf16;
    std::vector<float> dh, dw, dh_bf16, dw_bf16;
  };
  auto run = [&](int threads) {
    omp_set_num_threads(threads);
    Run r;
    int64_t count = 0;
    r.dh.resize(size_t(n * c));
    r.dw.assign(size_t(v * c), 0.f);
    r.dh_bf16.resize(size_t(n * c));
    r.dw_bf16.assign(size_t(v * c), 0.f);
    r.loss_f32 = cpu::lm_head_ce_backward(r.dh.data(), r.dw.data(), &count, h.data(), w.data(),
                                          targets.data(), n, c, v, 0.01f);
    r.loss_bf16 =
        cpu::lm_head_ce_backward_bf16(r.dh_bf16.data(), r.dw_bf16.data(), &count, h.data(),
                                      wb.data(), targets.data(), n, c, v, 0.01f);
    return r;
  };
  const int threads = omp_get_max_threads();
  const Run one = run(1), two = run(2);
  omp_set_num_threads(threads);
  auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  CHECK(std::memcmp(&one.loss_f32, &two.loss_f32, sizeof(double)) == 0);
  CHECK(std::memcmp(&one.loss_bf16, &two.loss_bf16, sizeof(double)) == 0);
  CHECK(same(one.dh, two.dh));
  CHECK(same(one.dw, two.dw));
  CHECK(same(one.dh_bf16, two.dh_bf16));
  CHECK(same(one.dw_bf16, two.dw_bf16));
}

TEST_CASE("cross-entropy rejects a target id outside the vocabulary", "[kernels]") {
  const int64_t n = 4, c = 2, v = 7;
  const auto h = random_floats(size_t(n * c), 1), w = random_floats(size_t(v * c), 2);
  int64_t count = 0;
  for (int32_t bad : {7, -1}) {
    const std::vector<int32_t> targets = {0, -100, 3, bad};
    REQUIRE_THROWS_WITH(
        cpu::lm_head_ce_forward(&count, h.data(), w.data(), targets.data(), n, c, v),
        Catch::Contains("row 3") && Catch::Contains("target id " + std::to_string(bad)));
  }
}
