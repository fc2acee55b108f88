// Tests of the lm_head + cross-entropy kernels, fused and vocab-chunked (a streamed lm_head): the
// fp64 references against finite differences and against each other, the f32 and bf16 fast paths
// against them at awkward sizes (ignored rows, all rows ignored, more counted rows than one 128-row
// tile, an uneven last chunk, one-row chunks), one chunk = the fused kernels bit for bit,
// thread-count independence, bad targets and chunks.
#include <omp.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/ref.h"
#include "src/core/error.h"
#include "tests/kernels/ce_chunked.h"
#include "tests/seeded_inputs.h"
#include "tests/testing.h"

using namespace strata;
using namespace strata::testing;  // inputs, fp64 conversions, error measures, ce_chunked_cpu

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

// Seeds of one fused case's inputs: h, w, dw's start, and targets with every `ignore_every`-th row ignored.
struct CeSeeds {
  uint64_t h, w, dw0;
  int64_t ignore_every;
  uint64_t targets;
};

// The fused fast path (w in f32, or stored as bf16 with the reference fed bf16-rounded h and w) on
// every case against the fp64 reference: the loss within tol_loss and dh and the dw increment within
// tol_grad relative, the counted rows equal; the worst errors reported. seeds(i) seeds case i (from 1).
template <class Seeds>
void check_fused_against_ref(const std::vector<CeCase>& cases, bool bf, double tol_loss, double tol_grad,
                             Seeds seeds) {
  testing::WorstError worst_loss{"loss", tol_loss}, worst_grad{"gradients", tol_grad};
  int idx = 0;
  for (const CeCase cc : cases) {
    ++idx;
    const auto [n, c, v] = cc;
    const CeSeeds sd = seeds(idx);
    const auto h = random_floats(size_t(n * c), sd.h, -1.f, 1.f);
    const auto w = random_floats(size_t(v * c), sd.w, -1.f, 1.f);
    const auto wb = to_bf16(w);
    const auto dw0 = random_floats(size_t(v * c), sd.dw0, -0.1f, 0.1f);
    const auto targets = make_targets(n, v, sd.ignore_every, sd.targets);
    const float grad_scale = 1.f / float(n);

    int64_t count_f = -1, count_b = -1, count_r = -1;
    std::vector<float> dh(size_t(n * c), 7.f), dw = dw0;
    double loss_f, loss_b;
    if (bf) {
      loss_f = cpu::lm_head_ce_forward_bf16(&count_f, h.data(), wb.data(), targets.data(), n, c, v);
      loss_b = cpu::lm_head_ce_backward_bf16(dh.data(), dw.data(), &count_b, h.data(), wb.data(), targets.data(), n, c,
                                             v, grad_scale);
    } else {
      loss_f = cpu::lm_head_ce_forward(&count_f, h.data(), w.data(), targets.data(), n, c, v);
      loss_b = cpu::lm_head_ce_backward(dh.data(), dw.data(), &count_b, h.data(), w.data(), targets.data(), n, c, v,
                                        grad_scale);
    }
    const auto hd = convert<double>(bf ? round_bf16(h) : h), wd = convert<double>(bf ? round_bf16(w) : w);
    std::vector<double> dh_ref(size_t(n * c)), dw_ref(size_t(v * c), 0.0);
    const double loss_r = ref::lm_head_ce_backward(dh_ref.data(), dw_ref.data(), &count_r, hd.data(), wd.data(),
                                                   targets.data(), n, c, v, double(grad_scale));
    const double e_loss =
        std::max(std::abs(loss_f - loss_r), std::abs(loss_b - loss_r)) / std::max(std::abs(loss_r), 1e-30);
    const double e_grad = std::max(max_rel_error(dh, dh_ref), max_rel_error(delta(dw, dw0), dw_ref));
    INFO("n=" << n << " c=" << c << " v=" << v << " loss " << e_loss << " grad " << e_grad);
    REQUIRE(count_f == count_r);
    REQUIRE(count_b == count_r);
    worst_loss.add(e_loss);
    worst_grad.add(e_grad);
  }
  worst_loss.check();
  worst_grad.check();
}

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
  // A Latin square over N x V x C: every (N,V), (N,C) and (V,C) pair once, in nine runs.
  // N=300 with every third row ignored is 200 counted rows: two chunks of 128.
  const int64_t ns[] = {1, 17, 300}, vs[] = {7, 1000, 5003}, cs[] = {3, 64, 33};
  std::vector<CeCase> cases;
  for (int ni = 0; ni < 3; ++ni)
    for (int vi = 0; vi < 3; ++vi) cases.push_back({ns[ni], cs[(ni + vi) % 3], vs[vi]});
  check_fused_against_ref(cases, false, 1e-5, 1e-5, [](int idx) {
    return CeSeeds{100 + uint64_t(idx), 200 + uint64_t(idx), 300 + uint64_t(idx), 3, uint64_t(idx)};
  });
}

TEST_CASE("cross-entropy bf16 fast path matches the reference on bf16-rounded inputs",
          "[kernels]") {
  // The reference sees h and w rounded to bf16; the kernel's logits then differ only by f32
  // accumulation (loss to 1e-5). The backward also rounds dlogits to bf16 (2^-9 relative per
  // element), so dh and the dw increment get a looser 1e-2 relative to max-abs.
  check_fused_against_ref(
      {CeCase{1, 3, 7}, CeCase{17, 33, 1000}, CeCase{300, 64, 5003}, CeCase{300, 33, 7}, CeCase{17, 64, 5003}}, true,
      1e-5, 1e-2, [](int idx) {
        return CeSeeds{500 + uint64_t(idx), 600 + uint64_t(idx), 700 + uint64_t(idx), 4, 50 + uint64_t(idx)};
      });
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
  // 300 rows with every third ignored = 200 counted: two 128-row tiles in f32 (bf16 sizes its
  // tiles by the chunk: one tile up to vc 4096, two 128-row tiles at vc 20000); v = 5003 in chunks
  // of 4096 leaves a 907-row last chunk; rows = 1 puts one vocab row in each chunk.
  for (Case k : {Case{1, 3, 7, 1}, Case{17, 33, 1000, 333}, Case{300, 64, 5003, 4096}, Case{300, 17, 97, 97},
                 Case{40, 8, 130, 64}, Case{300, 8, 20000, 20000}}) {
    INFO("n=" << k.n << " c=" << k.c << " v=" << k.v << " rows=" << k.rows);
    const auto h = random_floats(size_t(k.n * k.c), 100 + uint64_t(k.v), -1.f, 1.f);
    const auto w = random_floats(size_t(k.v * k.c), 200 + uint64_t(k.v), -1.f, 1.f);
    const auto dw0 = random_floats(size_t(k.v * k.c), 300 + uint64_t(k.v), -0.1f, 0.1f);
    const auto targets = make_targets(k.n, k.v, 3, uint64_t(k.n));
    const float grad_scale = 1.f / float(k.n);
    for (bool bf : {false, true}) {
      INFO((bf ? "bf16" : "f32"));
      const ChunkedResult got =
          ce_chunked_cpu(h, w, bf ? DType::bf16 : DType::f32, targets, k.n, k.c, k.v, k.rows, grad_scale, dw0);
      const auto hd = convert<double>(bf ? round_bf16(h) : h), wd = convert<double>(bf ? round_bf16(w) : w);
      std::vector<double> dh(size_t(k.n * k.c)), dw(size_t(k.v * k.c), 0.0);
      const double loss = ref_chunked(dh.data(), dw.data(), hd.data(), wd.data(), targets.data(), k.n, k.c, k.v, k.rows,
                                      double(grad_scale), true);
      CHECK(std::abs(got.loss - loss) <= 1e-5 * std::abs(loss));
      const double tol = bf ? 1e-2 : 1e-5;
      CHECK(max_rel_error(got.dh, dh) <= tol);
      CHECK(max_rel_error(delta(got.dw, dw0), dw) <= tol);
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
    const ChunkedResult got = ce_chunked_cpu(h, w, bf ? DType::bf16 : DType::f32, targets, n, c, v, v, 0.01f, dw0);
    CHECK(std::memcmp(&got.loss, &loss, sizeof(double)) == 0);
    CHECK(got.dh == dh);  // == on floats: +0 and -0 are the same gradient
    CHECK(got.dw == dw);
  }
}

TEST_CASE("chunked cross-entropy results are bitwise independent of the thread count", "[kernels][ce-chunked]") {
  // 240 counted rows: one row tile, and (bf16 at vc 20000) two tiles of 128 rows
  const int64_t n = 300, c = 64;
  const int threads = omp_get_max_threads();
  for (const auto& [v, rows] : {std::pair<int64_t, int64_t>{1000, 300}, {20000, 20000}}) {
    INFO("v=" << v << " rows=" << rows);
    const auto h = random_floats(size_t(n * c), 51), w = random_floats(size_t(v * c), 52);
    const auto targets = make_targets(n, v, 5, 53);
    const std::vector<float> dw0(size_t(v * c), 0.f);
    for (bool bf : {false, true}) {
      omp_set_num_threads(1);
      const DType wt = bf ? DType::bf16 : DType::f32;
      const ChunkedResult one = ce_chunked_cpu(h, w, wt, targets, n, c, v, rows, 0.01f, dw0);
      omp_set_num_threads(std::max(2, threads));
      const ChunkedResult many = ce_chunked_cpu(h, w, wt, targets, n, c, v, rows, 0.01f, dw0);
      CHECK(std::memcmp(&one.loss, &many.loss, sizeof(double)) == 0);
      CHECK(std::memcmp(one.dh.data(), many.dh.data(), one.dh.size() * 4) == 0);
      CHECK(std::memcmp(one.dw.data(), many.dw.data(), one.dw.size() * 4) == 0);
    }
  }
  omp_set_num_threads(threads);
}

TEST_CASE("chunked cross-entropy backward without a weight gradient gives the same d(hidden), bit for bit",
          "[kernels][ce-chunked]") {
  // LoRA's frozen lm_head passes dw_chunk = null: the dW matmul is skipped, dh must not change.
  const int64_t n = 37, c = 33, v = 1003, rows = 256;
  const auto h = random_floats(size_t(n * c), 61), w = random_floats(size_t(v * c), 62);
  const auto targets = make_targets(n, v, 4, 63);
  const std::vector<float> dw0(size_t(v * c), 0.f);
  for (bool bf : {false, true}) {
    const DType wt = bf ? DType::bf16 : DType::f32;
    const ChunkedResult full = ce_chunked_cpu(h, w, wt, targets, n, c, v, rows, 0.01f, dw0);
    const ChunkedResult dh_only = ce_chunked_cpu(h, w, wt, targets, n, c, v, rows, 0.01f, dw0, false);
    CHECK(std::memcmp(full.dh.data(), dh_only.dh.data(), full.dh.size() * 4) == 0);
    CHECK(dh_only.dw == dw0);
    CHECK(full.dw != dw0);
  }
}

TEST_CASE("kept logits: the stats pass keeps each chunk's logits and the backward reading them gives a recompute's bits",
          "[kernels][ce-chunked]") {
  // 300 rows (every 7th ignored; 3 row tiles in f32), 3 vocab chunks (384, 384, 232 rows)
  const int64_t n = 300, c = 40, v = 1000, rows = 384;
  const auto h = random_floats(size_t(n * c), 71), w = random_floats(size_t(v * c), 72);
  const auto targets = make_targets(n, v, 7, 73);
  std::vector<int64_t> counted;
  for (int64_t i = 0; i < n; ++i)
    if (targets[size_t(i)] != -100) counted.push_back(i);
  REQUIRE(counted.size() < size_t(n));
  auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  const std::vector<float> dw0(size_t(v * c), 0.25f);
  for (DType wt : {DType::f32, DType::bf16})
    for (bool with_dw : {true, false}) {
      INFO(dtype_name(wt) << (with_dw ? " with dw" : " dh only"));
      const auto recomputed = ce_chunked_cpu(h, w, wt, targets, n, c, v, rows, 0.01f, dw0, with_dw, false);
      const auto kept = ce_chunked_cpu(h, w, wt, targets, n, c, v, rows, 0.01f, dw0, with_dw, true);
      CHECK(std::memcmp(&kept.loss, &recomputed.loss, sizeof(double)) == 0);
      CHECK(same(kept.dh, recomputed.dh));
      CHECK(same(kept.dw, recomputed.dw));
    }
  {  // bf16 sizes its row tiles by the chunk: at vc 384 one tile; at vc 10000 two (209 rows each)
    const int64_t big_v = 20000, big_rows = 10000;
    const auto big_w = random_floats(size_t(big_v * c), 74);
    const auto big_targets = make_targets(n, big_v, 7, 75);
    const std::vector<float> big_dw0(size_t(big_v * c), 0.25f);
    const auto recomputed = ce_chunked_cpu(h, big_w, DType::bf16, big_targets, n, c, big_v, big_rows, 0.01f, big_dw0,
                                           true, false);
    const auto kept = ce_chunked_cpu(h, big_w, DType::bf16, big_targets, n, c, big_v, big_rows, 0.01f, big_dw0, true,
                                     true);
    CHECK(std::memcmp(&kept.loss, &recomputed.loss, sizeof(double)) == 0);
    CHECK(same(kept.dh, recomputed.dh));
    CHECK(same(kept.dw, recomputed.dw));
  }
  // What the stats pass keeps are the logits: counted row r of the chunk is h_i · w_(v0 + j), in
  // the pass's compacted row order (f32 against fp64 dots; rows past the counted ones untouched).
  std::vector<double> stats(size_t(3 * n));
  std::vector<float> logits(size_t(n * rows), -3.f);
  cpu::lm_head_ce_chunk_stats(stats.data(), h.data(), w.data() + rows * c, targets.data(), n, c, v, rows, rows, true,
                              logits.data());
  double worst = 0;
  for (size_t r = 0; r < counted.size(); ++r)
    for (int64_t j = 0; j < rows; ++j) {
      double want = 0;
      for (int64_t e = 0; e < c; ++e) want += double(h[size_t(counted[r] * c + e)]) * double(w[size_t((rows + j) * c + e)]);
      worst = std::max(worst, std::abs(double(logits[r * size_t(rows) + size_t(j)]) - want));
    }
  CHECK(worst <= 2e-5);
  CHECK(logits[counted.size() * size_t(rows)] == -3.f);
}

TEST_CASE("chunked cross-entropy rejects a chunk outside the vocabulary and a bad target", "[kernels][ce-chunked]") {
  const int64_t n = 4, c = 2, v = 7;
  const auto h = random_floats(size_t(n * c), 1), w = random_floats(size_t(v * c), 2);
  std::vector<double> stats(size_t(3 * n));
  const std::vector<int32_t> good = {0, -100, 3, 6};
  REQUIRE_THROWS_WITH(cpu::lm_head_ce_chunk_stats(stats.data(), h.data(), w.data(), good.data(), n, c, v, 4, 4, true, nullptr),
                      Catch::Contains("[4, 8)") && Catch::Contains("[0, 7)"));
  REQUIRE_THROWS_WITH(cpu::lm_head_ce_chunk_stats(stats.data(), h.data(), w.data(), good.data(), n, c, v, 0, 0, true, nullptr),
                      Catch::Contains("non-empty"));
  const std::vector<int32_t> bad = {0, -100, 3, 7};
  REQUIRE_THROWS_WITH(cpu::lm_head_ce_chunk_stats(stats.data(), h.data(), w.data(), bad.data(), n, c, v, 0, 4, true, nullptr),
                      Catch::Contains("row 3") && Catch::Contains("target id 7"));
}
