// The preference head's kernels (kernels/cpu/ops.h: lm_head_ce_stats_seq_sums,
// lm_head_ce_chunk_backward_weighted): the fp64 twins against finite differences of
// F = Σ_i w_i · (-log p_i(target)) and against direct per-sequence sums of log-softmax; the f32
// and bf16 fast paths against the fp64 twins at awkward sizes (uneven last vocab chunk, more
// rows than one 128-row tile, ignored rows, rows without a sequence); weights of 1 give the
// unweighted kernel's bits.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/ref.h"
#include "tests/seeded_inputs.h"
#include "tests/testing.h"

using namespace strata;
using namespace strata::testing;  // seeded inputs, fp64 conversions, error measures

namespace {

// seq (N): rows in runs of `len` per sequence, every 7th row without one (-1).
std::vector<int32_t> make_seq(int64_t n, int64_t len, int64_t* num_seqs) {
  std::vector<int32_t> seq(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) seq[size_t(i)] = i % 7 == 3 ? -1 : int32_t(i / len);
  *num_seqs = (n + len - 1) / len;
  return seq;
}

// fp64 stats over chunks of `rows` vocab rows.
std::vector<double> ref_stats(const std::vector<double>& h, const std::vector<double>& w,
                              const std::vector<int32_t>& targets, int64_t n, int64_t c, int64_t v, int64_t rows) {
  std::vector<double> stats(size_t(3 * n));
  for (int64_t v0 = 0; v0 < v; v0 += rows)
    ref::lm_head_ce_chunk_stats(stats.data(), h.data(), w.data() + v0 * c, targets.data(), n, c, v, v0,
                                std::min(rows, v - v0), v0 == 0);
  return stats;
}

// F(h, w) = Σ_i weight_i · (-log softmax(h_i w^T)[target_i]) in fp64, by the unchunked twin.
double weighted_ce(const std::vector<double>& h, const std::vector<double>& w, const std::vector<int32_t>& targets,
                   const std::vector<double>& weight, int64_t n, int64_t c, int64_t v) {
  double f = 0;
  std::vector<int32_t> one(1);
  for (int64_t i = 0; i < n; ++i) {
    if (targets[size_t(i)] == -100) continue;
    one[0] = targets[size_t(i)];
    int64_t count = 0;
    f += weight[size_t(i)] * ref::lm_head_ce_forward(&count, h.data() + i * c, w.data(), one.data(), 1, c, v);
  }
  return f;
}

}  // namespace

TEST_CASE("per-sequence log-prob sums: the twin equals direct log-softmax sums", "[kernels][preference]") {
  const int64_t n = 23, c = 9, v = 37, rows = 10;
  const auto h = convert<double>(random_floats(size_t(n * c), 11));
  const auto w = convert<double>(random_floats(size_t(v * c), 12));
  const auto targets = make_targets(n, v, 5, 13);
  int64_t S = 0;
  const auto seq = make_seq(n, 6, &S);
  const auto stats = ref_stats(h, w, targets, n, c, v, rows);
  std::vector<double> sums(size_t(2 * S), -3.0);
  ref::lm_head_ce_stats_seq_sums(sums.data(), stats.data(), targets.data(), seq.data(), n, v, S);
  std::vector<double> want(size_t(2 * S), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    if (targets[size_t(i)] == -100 || seq[size_t(i)] < 0) continue;
    std::vector<double> logits;
    const double lse = ref::ce_row_logits(logits, h.data(), w.data(), i, c, v);
    want[size_t(2 * seq[size_t(i)])] += logits[size_t(targets[size_t(i)])] - lse;
    want[size_t(2 * seq[size_t(i)] + 1)] += 1;
  }
  CHECK(want[1] > 0);
  for (size_t q = 0; q < want.size(); ++q) {
    INFO("entry " << q);
    CHECK(std::abs(sums[q] - want[q]) <= 1e-12 * (1 + std::abs(want[q])));
  }
}

TEST_CASE("weighted chunk backward: the fp64 twin matches finite differences", "[kernels][preference]") {
  const int64_t n = 7, c = 5, v = 13, rows = 4;
  auto h = convert<double>(random_floats(size_t(n * c), 21));
  auto w = convert<double>(random_floats(size_t(v * c), 22));
  const auto targets = make_targets(n, v, 3, 23);
  std::vector<double> weight(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) weight[size_t(i)] = 0.3 * double(i) - 0.8;  // signs differ, one near 0
  const auto stats = ref_stats(h, w, targets, n, c, v, rows);
  std::vector<double> dh(size_t(n * c), 0.0), dw(size_t(v * c), 0.0);
  for (int64_t v0 = 0; v0 < v; v0 += rows)
    ref::lm_head_ce_chunk_backward_weighted(dh.data(), dw.data() + v0 * c, h.data(), w.data() + v0 * c, stats.data(),
                                            targets.data(), weight.data(), n, c, v, v0, std::min(rows, v - v0), 1.0);
  const auto fd_h = testing::finite_difference(h, [&](const std::vector<double>& x) {
    return weighted_ce(x, w, targets, weight, n, c, v);
  });
  const auto fd_w = testing::finite_difference(w, [&](const std::vector<double>& x) {
    return weighted_ce(h, x, targets, weight, n, c, v);
  });
  CHECK(max_rel_error(dh, fd_h) < 1e-7);
  CHECK(max_rel_error(dw, fd_w) < 1e-7);
}

TEST_CASE("preference head kernels: the f32 and bf16 fast paths against the fp64 twins", "[kernels][preference]") {
  struct Case {
    int64_t n, c, v, rows, seq_len;
  };
  for (const Case k : {Case{1, 15, 17, 17, 1}, Case{37, 17, 61, 16, 9}, Case{300, 16, 97, 40, 70}}) {
    INFO("n=" << k.n << " c=" << k.c << " v=" << k.v << " rows=" << k.rows);
    const auto hf = random_floats(size_t(k.n * k.c), 31);
    const auto wf = random_floats(size_t(k.v * k.c), 32);
    const auto targets = make_targets(k.n, k.v, 4, 33);
    int64_t S = 0;
    const auto seq = make_seq(k.n, k.seq_len, &S);
    std::vector<float> weight(static_cast<size_t>(k.n));
    for (int64_t i = 0; i < k.n; ++i) weight[size_t(i)] = float(std::sin(double(i)) * 0.7);
    for (const bool bf : {false, true}) {
      INFO((bf ? "bf16" : "f32"));
      const std::vector<float> hr = bf ? testing::round_bf16(hf) : hf;  // what the bf16 matmuls see
      const std::vector<float> wr = bf ? testing::round_bf16(wf) : wf;
      const auto h64 = convert<double>(hr), w64 = convert<double>(wr);
      const auto stats64 = ref_stats(h64, w64, targets, k.n, k.c, k.v, k.rows);
      std::vector<double> want_sums(size_t(2 * S));
      ref::lm_head_ce_stats_seq_sums(want_sums.data(), stats64.data(), targets.data(), seq.data(), k.n, k.v, S);
      std::vector<double> dh64(size_t(k.n * k.c), 0.0), dw64(size_t(k.v * k.c), 0.0);
      const auto weight64 = convert<double>(weight);
      for (int64_t v0 = 0; v0 < k.v; v0 += k.rows)
        ref::lm_head_ce_chunk_backward_weighted(dh64.data(), dw64.data() + v0 * k.c, h64.data(), w64.data() + v0 * k.c,
                                                stats64.data(), targets.data(), weight64.data(), k.n, k.c, k.v, v0,
                                                std::min(k.rows, k.v - v0), 0.5);

      const auto wb = to_bf16(wf);
      std::vector<double> stats(size_t(3 * k.n));
      const int64_t chunks = (k.v + k.rows - 1) / k.rows;
      for (int64_t ci = 0; ci < chunks; ++ci) {
        const int64_t v0 = ci * k.rows, vc = std::min(k.rows, k.v - v0);
        if (bf)
          cpu::lm_head_ce_chunk_stats_bf16(stats.data(), hf.data(), wb.data() + v0 * k.c, targets.data(), k.n, k.c, k.v,
                                           v0, vc, ci == 0, nullptr);
        else
          cpu::lm_head_ce_chunk_stats(stats.data(), hf.data(), wf.data() + v0 * k.c, targets.data(), k.n, k.c, k.v, v0,
                                      vc, ci == 0, nullptr);
      }
      std::vector<double> sums(size_t(2 * S), 99.0);
      cpu::lm_head_ce_stats_seq_sums(sums.data(), stats.data(), targets.data(), seq.data(), k.n, k.v, S);
      for (size_t q = 0; q < sums.size(); ++q) {
        INFO("sum entry " << q);
        CHECK(std::abs(sums[q] - want_sums[q]) <= 2e-5 * (1 + std::abs(want_sums[q])));
      }
      std::vector<float> dh(size_t(k.n * k.c), 0.f), dw(size_t(k.v * k.c), 0.f);
      std::vector<float> dh1(size_t(k.n * k.c), 0.f), dw1(size_t(k.v * k.c), 0.f);
      std::vector<float> dh_u(size_t(k.n * k.c), 0.f), dw_u(size_t(k.v * k.c), 0.f);
      const std::vector<float> ones(size_t(k.n), 1.f);
      for (int64_t ci = chunks - 1; ci >= 0; --ci) {
        const int64_t v0 = ci * k.rows, vc = std::min(k.rows, k.v - v0);
        if (bf) {
          cpu::lm_head_ce_chunk_backward_weighted_bf16(dh.data(), dw.data() + v0 * k.c, hf.data(), wb.data() + v0 * k.c,
                                                       stats.data(), targets.data(), weight.data(), k.n, k.c, k.v, v0,
                                                       vc, 0.5f, nullptr);
          cpu::lm_head_ce_chunk_backward_weighted_bf16(dh1.data(), dw1.data() + v0 * k.c, hf.data(),
                                                       wb.data() + v0 * k.c, stats.data(), targets.data(), ones.data(),
                                                       k.n, k.c, k.v, v0, vc, 0.5f, nullptr);
          cpu::lm_head_ce_chunk_backward_bf16(dh_u.data(), dw_u.data() + v0 * k.c, hf.data(), wb.data() + v0 * k.c,
                                              stats.data(), targets.data(), k.n, k.c, k.v, v0, vc, 0.5f, nullptr);
        } else {
          cpu::lm_head_ce_chunk_backward_weighted(dh.data(), dw.data() + v0 * k.c, hf.data(), wf.data() + v0 * k.c,
                                                  stats.data(), targets.data(), weight.data(), k.n, k.c, k.v, v0, vc,
                                                  0.5f, nullptr);
          cpu::lm_head_ce_chunk_backward_weighted(dh1.data(), dw1.data() + v0 * k.c, hf.data(), wf.data() + v0 * k.c,
                                                  stats.data(), targets.data(), ones.data(), k.n, k.c, k.v, v0, vc,
                                                  0.5f, nullptr);
          cpu::lm_head_ce_chunk_backward(dh_u.data(), dw_u.data() + v0 * k.c, hf.data(), wf.data() + v0 * k.c,
                                         stats.data(), targets.data(), k.n, k.c, k.v, v0, vc, 0.5f, nullptr);
        }
      }
      // bf16 dlogits carry 8 bits of mantissa
      const double tol = bf ? 2e-2 : 2e-5;
      CHECK(max_rel_error(dh, dh64) < tol);
      CHECK(max_rel_error(dw, dw64) < tol);
      CHECK(std::memcmp(dh1.data(), dh_u.data(), dh1.size() * 4) == 0);
      CHECK(std::memcmp(dw1.data(), dw_u.data(), dw1.size() * 4) == 0);
    }
  }
}

TEST_CASE("per-sequence sums reject a sequence id beyond the count", "[kernels][preference]") {
  const int64_t n = 3, v = 5;
  const std::vector<double> stats(size_t(3 * n), 1.0);
  const std::vector<int32_t> targets = {1, 2, 3}, seq = {0, 1, 2};
  std::vector<double> sums(4);
  CHECK_THROWS_WITH(cpu::lm_head_ce_stats_seq_sums(sums.data(), stats.data(), targets.data(), seq.data(), n, v, 2),
                    Catch::Contains("names sequence 2 of 2"));
}
