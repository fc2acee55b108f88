// The stats pass with the softmax entropy (kernels/cpu/ops.h lm_head_ce_chunk_stats_entropy,
// GRPO's `entropy` metric): the fp64 reference (kernels/cpu/ref/cross_entropy.h ce_ref_entropy)
// against closed forms, and the f32 and bf16 fast paths over vocab chunks against it at awkward
// sizes (one chunk, an uneven last chunk, one-row chunks, ignored rows, logits that grow from
// chunk to chunk so the running max moves), their stats the plain stats pass's bits.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/ref.h"
#include "tests/seeded_inputs.h"
#include "tests/testing.h"

using namespace strata;
using namespace strata::testing;

namespace {

// The chunked fast path as the engine drives it: stats and entropy accumulators over chunks of
// `rows` vocab rows (garbage before the first chunk), then H = log(sum) - ent / sum per counted row.
struct EntropyRun {
  std::vector<double> stats, ent, entropy;  // (N, 3), (N), (N; NaN where ignored)
};

EntropyRun chunked_entropy(const std::vector<float>& h, const std::vector<float>& w, bool bf,
                           const std::vector<int32_t>& targets, int64_t n, int64_t c, int64_t v, int64_t rows) {
  const std::vector<bf16> wb = bf ? to_bf16(w) : std::vector<bf16>();
  EntropyRun r;
  r.stats.assign(size_t(3 * n), -7.0);
  r.ent.assign(size_t(n), -5.0);
  for (int64_t v0 = 0, k = 0; v0 < v; v0 += rows, ++k) {
    const int64_t vc = std::min(rows, v - v0);
    if (bf)
      cpu::lm_head_ce_chunk_stats_entropy_bf16(r.stats.data(), r.ent.data(), h.data(), wb.data() + v0 * c,
                                               targets.data(), n, c, v, v0, vc, k == 0, nullptr);
    else
      cpu::lm_head_ce_chunk_stats_entropy(r.stats.data(), r.ent.data(), h.data(), w.data() + v0 * c, targets.data(), n,
                                          c, v, v0, vc, k == 0, nullptr);
  }
  r.entropy.assign(size_t(n), NAN);
  for (int64_t i = 0; i < n; ++i)
    if (targets[size_t(i)] != -100) r.entropy[size_t(i)] = std::log(r.stats[3 * i + 1]) - r.ent[size_t(i)] / r.stats[3 * i + 1];
  return r;
}

std::vector<double> plain_stats(const std::vector<float>& h, const std::vector<float>& w, bool bf,
                                const std::vector<int32_t>& targets, int64_t n, int64_t c, int64_t v, int64_t rows) {
  const std::vector<bf16> wb = bf ? to_bf16(w) : std::vector<bf16>();
  std::vector<double> stats(size_t(3 * n), -7.0);
  for (int64_t v0 = 0, k = 0; v0 < v; v0 += rows, ++k) {
    const int64_t vc = std::min(rows, v - v0);
    if (bf)
      cpu::lm_head_ce_chunk_stats_bf16(stats.data(), h.data(), wb.data() + v0 * c, targets.data(), n, c, v, v0, vc,
                                       k == 0, nullptr);
    else
      cpu::lm_head_ce_chunk_stats(stats.data(), h.data(), w.data() + v0 * c, targets.data(), n, c, v, v0, vc, k == 0,
                                  nullptr);
  }
  return stats;
}

}  // namespace

TEST_CASE("the fp64 entropy reference gives log V on equal logits and the two-level closed form", "[kernels][grpo]") {
  const int64_t v = 37, c = 1;
  const std::vector<double> h = {1.0};
  const std::vector<int32_t> targets = {5};
  double H = 0;
  const std::vector<double> zero(size_t(v), 0.0);
  ref::ce_ref_entropy(&H, h.data(), zero.data(), targets.data(), 1, c, v);
  CHECK(std::abs(H - std::log(double(v))) < 1e-13);
  // k logits at a, the rest at 0: p_a = e^a / (k e^a + v - k), p_0 = 1 / (k e^a + v - k)
  const int64_t k = 4;
  const double a = 3.25;
  std::vector<double> w(size_t(v), 0.0);
  for (int64_t j = 0; j < k; ++j) w[size_t(7 * j)] = a;
  ref::ce_ref_entropy(&H, h.data(), w.data(), targets.data(), 1, c, v);
  const double Z = double(k) * std::exp(a) + double(v - k), pa = std::exp(a) / Z, p0 = 1 / Z;
  const double want = -(double(k) * pa * std::log(pa) + double(v - k) * p0 * std::log(p0));
  CHECK(std::abs(H - want) < 1e-13);
  // an ignored row is NaN
  const std::vector<int32_t> ignored = {-100};
  ref::ce_ref_entropy(&H, h.data(), w.data(), ignored.data(), 1, c, v);
  CHECK(std::isnan(H));
}

TEST_CASE("the stats pass with entropy equals the fp64 entropy and keeps the plain stats' bits", "[kernels][grpo]") {
  struct Case {
    int64_t n, c, v, rows;
  };
  // one chunk; an uneven last chunk; one-row chunks; more rows than a tile; a SIMD tail of 17
  const Case cases[] = {{5, 7, 33, 33}, {19, 13, 1000, 333}, {6, 5, 9, 1}, {300, 11, 129, 40}, {3, 4, 17, 17}};
  for (const bool bf : {false, true}) {
    WorstError worst{"entropy", 2e-5};
    int idx = 0;
    for (const Case cs : cases) {
      ++idx;
      INFO("case " << idx << (bf ? " bf16" : " f32") << " n " << cs.n << " c " << cs.c << " v " << cs.v << " rows "
                   << cs.rows);
      auto h = random_floats(size_t(cs.n * cs.c), 100 + uint64_t(idx), -2.f, 2.f);
      auto w = random_floats(size_t(cs.v * cs.c), 200 + uint64_t(idx), -1.f, 1.f);
      // later vocab rows larger: the running max moves as chunks come
      for (int64_t j = 0; j < cs.v; ++j)
        for (int64_t e = 0; e < cs.c; ++e) w[size_t(j * cs.c + e)] *= 1.f + 3.f * float(j) / float(cs.v);
      const auto targets = make_targets(cs.n, cs.v, 3, 300 + uint64_t(idx));
      const EntropyRun got = chunked_entropy(h, w, bf, targets, cs.n, cs.c, cs.v, cs.rows);
      // the stats are the plain pass's, bit for bit
      const std::vector<double> plain = plain_stats(h, w, bf, targets, cs.n, cs.c, cs.v, cs.rows);
      CHECK(std::memcmp(plain.data(), got.stats.data(), plain.size() * sizeof(double)) == 0);
      // against fp64 over the inputs as the kernel reads them (bf16: h and w rounded)
      const std::vector<double> hd = convert<double>(bf ? round_bf16(h) : h), wd = convert<double>(bf ? round_bf16(w) : w);
      std::vector<double> want(size_t(cs.n));
      ref::ce_ref_entropy(want.data(), hd.data(), wd.data(), targets.data(), cs.n, cs.c, cs.v);
      double err = 0, ref_max = 0;
      for (int64_t i = 0; i < cs.n; ++i) {
        if (targets[size_t(i)] == -100) {
          CHECK(got.ent[size_t(i)] == 0.0);  // the first chunk zeroes ignored rows
          continue;
        }
        err = std::max(err, std::abs(got.entropy[size_t(i)] - want[size_t(i)]));
        ref_max = std::max(ref_max, std::abs(want[size_t(i)]));
      }
      REQUIRE(ref_max > 0.1);  // non-trivial distributions
      worst.add(err / ref_max);
    }
    worst.check();
  }
}
