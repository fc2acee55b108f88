// Tests of the vocab-chunked lm_head + cross-entropy kernels (a streamed lm_head): the fp64
// chunked reference against the unchunked reference and finite differences, the f32 and bf16
// fast paths against the fp64 chunked reference at awkward sizes (uneven last chunk, one-row
// chunks, more counted rows than one 128-row tile), one chunk = the fused kernels bit for bit,
// thread-count independence, bad input.
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

// The fp64 reference, chunked: loss, dh (written from zero) and dw (accumulated).
template <class T>
double ref_chunked(T* dh, T* dw, const T* h, const T* w, const int32_t* targets, int64_t n, int64_t c,
                   int64_t v, int64_t rows, T grad_scale, bool backward) {
  std::vector<T> stats(size_t(3 * n));
  for (int64_t v0 = 0; v0 < v; v0 += rows)
    ref::lm_head_ce_chunk_stats(stats.data(), h, w + v0 * c, targets, n, c, v, v0, std::min(rows, v - v0), v0 == 0);
  int64_t count = 0;
  const double loss = ref::lm_head_ce_stats_loss(&count, stats.data(), targets, n, v);
  if (!backward) return loss;
  std::fill(dh, dh + n * c, T(0));
  for (int64_t v0 = 0; v0 < v; v0 += rows)
    ref::lm_head_ce_chunk_backward(dh, dw + v0 * c, h, w + v0 * c, stats.data(), targets, n, c, v, v0,
                                   std::min(rows, v - v0), grad_scale);
  return loss;
}

// The CPU fast path, chunked: chunks visited forward in the stats pass and in reverse in the
// backward pass, as the engine does.
struct FastResult {
  double loss = 0;
  std::vector<float> dh, dw;
};
FastResult fast_chunked(const std::vector<float>& h, const std::vector<float>& w, const std::vector<bf16>* wb,
                        const std::vector<int32_t>& targets, int64_t n, int64_t c, int64_t v, int64_t rows,
                        float grad_scale, const std::vector<float>& dw0) {
  FastResult r;
  std::vector<double> stats(size_t(3 * n), -7.0);  // garbage: the first chunk must initialise
  const int64_t chunks = (v + rows - 1) / rows;
  for (int64_t k = 0; k < chunks; ++k) {
    const int64_t v0 = k * rows, vc = std::min(rows, v - v0);
    if (wb)
      cpu::lm_head_ce_chunk_stats_bf16(stats.data(), h.data(), wb->data() + v0 * c, targets.data(), n, c, v, v0, vc, k == 0);
    else
      cpu::lm_head_ce_chunk_stats(stats.data(), h.data(), w.data() + v0 * c, targets.data(), n, c, v, v0, vc, k == 0);
  }
  int64_t count = 0;
  r.loss = cpu::lm_head_ce_stats_loss(&count, stats.data(), targets.data(), n, v);
  r.dh.assign(size_t(n * c), 0.f);
  r.dw = dw0;
  for (int64_t k = chunks - 1; k >= 0; --k) {
    const int64_t v0 = k * rows, vc = std::min(rows, v - v0);
    if (wb)
      cpu::lm_head_ce_chunk_backward_bf16(r.dh.data(), r.dw.data() + v0 * c, h.data(), wb->data() + v0 * c,
                                          stats.data(), targets.data(), n, c, v, v0, vc, grad_scale);
    else
      cpu::lm_head_ce_chunk_backward(r.dh.data(), r.dw.data() + v0 * c, h.data(), w.data() + v0 * c, stats.data(),
                                     targets.data(), n, c, v, v0, vc, grad_scale);
  }
  return r;
}

std::vector<double> minus(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<double> d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = double(a[i]) - double(b[i]);
  return d;
}

}  // namespace

TEST_CASE("chunked cross-entropy reference equals the unchunked reference in fp64", "[kernels][ce-chunked]") {
  const int64_t n = 9, c = 5, v = 11;
  const auto targets = make_targets(n, v, 4, 3);
  const auto h = convert<double>(random_floats(size_t(n * c), 11, -2.f, 2.f));
  const auto w = convert<double>(random_floats(size_t(v * c), 12, -2.f, 2.f));
  std::vector<double> dh_u(size_t(n * c)), dw_u(size_t(v * c), 0.0);
  int64_t count = 0;
  const double loss_u = ref::lm_head_ce_backward(dh_u.data(), dw_u.data(), &count, h.data(), w.data(),
                                                 targets.data(), n, c, v, 0.3);
  for (int64_t rows : {1, 3, 4, 10, 11}) {  // one-row chunks, uneven last chunk, one chunk
    INFO("rows per chunk " << rows);
    std::vector<double> dh(size_t(n * c)), dw(size_t(v * c), 0.0);
    const double loss = ref_chunked(dh.data(), dw.data(), h.data(), w.data(), targets.data(), n, c, v, rows, 0.3, true);
    CHECK(std::abs(loss - loss_u) <= 1e-13 * std::abs(loss_u));
    CHECK(max_rel_error(dh, dh_u) <= 1e-13);
    CHECK(max_rel_error(dw, dw_u) <= 1e-13);
  }
}

TEST_CASE("chunked cross-entropy reference backward matches finite differences in fp64", "[kernels][ce-chunked]") {
  const int64_t n = 6, c = 4, v = 10, rows = 3;  // chunks of 3, 3, 3, 1
  const std::vector<int32_t> targets = {3, -100, 9, 6, 0, 3};
  const double grad_scale = 0.37;
  std::vector<double> x = convert<double>(random_floats(size_t(n * c + v * c), 22, -2.f, 2.f));  // [h, w]
  auto f = [&](const std::vector<double>& xs) {
    return grad_scale * ref_chunked<double>(nullptr, nullptr, xs.data(), xs.data() + n * c, targets.data(), n, c, v,
                                            rows, grad_scale, false);
  };
  std::vector<double> grad(x.size(), 0.0);
  ref_chunked(grad.data(), grad.data() + n * c, x.data(), x.data() + n * c, targets.data(), n, c, v, rows, grad_scale,
              true);
  const std::vector<double> fd = strata::testing::finite_difference(x, f);
  INFO("rel err " << max_rel_error(grad, fd));
  CHECK(max_rel_error(grad, fd) <= 1e-6);
  for (int64_t e = 0; e < c; ++e) CHECK(grad[size_t(1 * c + e)] == 0.0);  // ignored row
}

TEST_CASE("chunked cross-entropy f32 and bf16 fast paths match the fp64 chunked reference", "[kernels][ce-chunked]") {
  // f32: loss and gradients to 1e-5 relative (as the fused kernels). bf16: the reference sees
  // bf16-rounded h and w; dlogits are rounded to bf16 too (2^-9), so gradients get 1e-2.
  struct Case {
    int64_t n, c, v, rows;
  };
  // 300 rows with every third ignored = 200 counted: two 128-row tiles; v = 5003 in chunks of
  // 4096 leaves a 907-row last chunk; rows = 1 puts one vocab row in each chunk.
  for (Case k : {Case{1, 3, 7, 1}, Case{17, 33, 1000, 333}, Case{300, 64, 5003, 4096}, Case{300, 17, 97, 97},
                 Case{40, 8, 130, 64}}) {
    INFO("n=" << k.n << " c=" << k.c << " v=" << k.v << " rows=" << k.rows);
    const auto h = random_floats(size_t(k.n * k.c), 100 + uint64_t(k.v), -1.f, 1.f);
    const auto w = random_floats(size_t(k.v * k.c), 200 + uint64_t(k.v), -1.f, 1.f);
    const auto dw0 = random_floats(size_t(k.v * k.c), 300 + uint64_t(k.v), -0.1f, 0.1f);
    const auto targets = make_targets(k.n, k.v, 3, uint64_t(k.n));
    const float grad_scale = 1.f / float(k.n);
    for (bool bf : {false, true}) {
      INFO((bf ? "bf16" : "f32"));
      const auto wb = to_bf16(w);
      const FastResult got = fast_chunked(h, w, bf ? &wb : nullptr, targets, k.n, k.c, k.v, k.rows, grad_scale, dw0);
      const auto hd = convert<double>(bf ? round_bf16(h) : h), wd = convert<double>(bf ? round_bf16(w) : w);
      std::vector<double> dh(size_t(k.n * k.c)), dw(size_t(k.v * k.c), 0.0);
      const double loss = ref_chunked(dh.data(), dw.data(), hd.data(), wd.data(), targets.data(), k.n, k.c, k.v, k.rows,
                                      double(grad_scale), true);
      CHECK(std::abs(got.loss - loss) <= 1e-5 * std::abs(loss));
      const double tol = bf ? 1e-2 : 1e-5;
      CHECK(max_rel_error(got.dh, dh) <= tol);
      CHECK(max_rel_error(minus(got.dw, dw0), dw) <= tol);
    }
  }
}

TEST_CASE("one chunk of the whole vocabulary computes what the fused kernels compute, bit for bit", "[kernels][ce-chunked]") {
  const int64_t n = 300, c = 33, v = 1000;
  const auto h = random_floats(size_t(n * c), 41), w = random_floats(size_t(v * c), 42);
  const auto wb = to_bf16(w);
  const auto dw0 = random_floats(size_t(v * c), 43, -0.1f, 0.1f);
  const auto targets = make_targets(n, v, 5, 44);
  for (bool bf : {false, true}) {
    INFO((bf ? "bf16" : "f32"));
    std::vector<float> dh(size_t(n * c)), dw = dw0;
    int64_t count = 0;
    const double loss = bf ? cpu::lm_head_ce_backward_bf16(dh.data(), dw.data(), &count, h.data(), wb.data(),
                                                           targets.data(), n, c, v, 0.01f)
                           : cpu::lm_head_ce_backward(dh.data(), dw.data(), &count, h.data(), w.data(), targets.data(),
                                                      n, c, v, 0.01f);
    const FastResult got = fast_chunked(h, w, bf ? &wb : nullptr, targets, n, c, v, v, 0.01f, dw0);
    CHECK(std::memcmp(&got.loss, &loss, sizeof(double)) == 0);
    CHECK(got.dh == dh);  // == on floats: +0 and -0 are the same gradient
    CHECK(got.dw == dw);
  }
}

TEST_CASE("chunked cross-entropy results are bitwise independent of the thread count", "[kernels][ce-chunked]") {
  const int64_t n = 300, c = 64, v = 1000, rows = 300;
  const auto h = random_floats(size_t(n * c), 51), w = random_floats(size_t(v * c), 52);
  const auto wb = to_bf16(w);
  const auto targets = make_targets(n, v, 5, 53);
  const std::vector<float> dw0(size_t(v * c), 0.f);
  const int threads = omp_get_max_threads();
  for (bool bf : {false, true}) {
    omp_set_num_threads(1);
    const FastResult one = fast_chunked(h, w, bf ? &wb : nullptr, targets, n, c, v, rows, 0.01f, dw0);
    omp_set_num_threads(std::max(2, threads));
    const FastResult many = fast_chunked(h, w, bf ? &wb : nullptr, targets, n, c, v, rows, 0.01f, dw0);
    CHECK(std::memcmp(&one.loss, &many.loss, sizeof(double)) == 0);
    CHECK(std::memcmp(one.dh.data(), many.dh.data(), one.dh.size() * 4) == 0);
    CHECK(std::memcmp(one.dw.data(), many.dw.data(), one.dw.size() * 4) == 0);
  }
  omp_set_num_threads(threads);
}

TEST_CASE("chunked cross-entropy rejects a chunk outside the vocabulary and a bad target", "[kernels][ce-chunked]") {
  const int64_t n = 4, c = 2, v = 7;
  const auto h = random_floats(size_t(n * c), 1), w = random_floats(size_t(v * c), 2);
  std::vector<double> stats(size_t(3 * n));
  const std::vector<int32_t> good = {0, -100, 3, 6};
  REQUIRE_THROWS_WITH(cpu::lm_head_ce_chunk_stats(stats.data(), h.data(), w.data(), good.data(), n, c, v, 4, 4, true),
                      Catch::Contains("[4, 8)") && Catch::Contains("[0, 7)"));
  REQUIRE_THROWS_WITH(cpu::lm_head_ce_chunk_stats(stats.data(), h.data(), w.data(), good.data(), n, c, v, 0, 0, true),
                      Catch::Contains("non-empty"));
  const std::vector<int32_t> bad = {0, -100, 3, 7};
  REQUIRE_THROWS_WITH(cpu::lm_head_ce_chunk_stats(stats.data(), h.data(), w.data(), bad.data(), n, c, v, 0, 4, true),
                      Catch::Contains("row 3") && Catch::Contains("target id 7"));
}
