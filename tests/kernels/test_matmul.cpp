// Matmul (oneDNN, or strata's own AVX2 kernel) against the plain-loop reference in fp64: all four
// transpose combinations, beta 0 and 1, f32 and bf16 inputs, awkward shapes; the reference's transpose handling checked
// by finite differences; thread-count independence measured. Also the elementwise helpers that
// feed matmul_bf16: the f32 -> bf16 rounding against an independent rounding in double,
// bf16 -> f32 and add_inplace.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <omp.h>

#include "kernels/cpu/gemm_amx.h"
#include "kernels/cpu/gemm_avx2.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/ref.h"
#include "src/core/error.h"
#include "tests/testing.h"

using namespace strata::testing;  // random_floats, convert, finite_difference, max_rel_error

namespace {

using strata::bf16;

struct MatmulShape {
  int64_t m, n, k;
};
// (300, 520, 70) spans 2 x 3 of matmul.cpp's 256 x 256 tiles, edge tiles included; (300, 400, 70)
// 2 x 2. On AVX2 with 2 threads (strata's kernel) their transposed-a products share one packed a
// (2 x 3) or one packed b (2 x 2) between the threads. (70, 40, 1100): three of the kernel's
// 512-step blocks of K, the last with a tail that is not a multiple of 8; 70 and 40 are not
// multiples of the kernel's 6 x 16.
// On an AMX CPU strata's AMX tile (kernels/cpu/gemm_amx.h) takes the products with K a multiple of
// 32: (128, 256, 96) and (544, 320, 64) pack with the vector packers (whole 32s), the latter in
// 3 x 2 tiles of 192 / 160; (300, 200, 64)'s tiles of 160 / 140 rows and 200 columns take the
// scalar packers for the ragged ones. The rest go to oneDNN.
const MatmulShape kShapes[] = {{1, 1, 1},       {3, 17, 15},    {65, 33, 129},  {128, 256, 96},
                               {300, 520, 70}, {300, 400, 70}, {70, 40, 1100}, {544, 320, 64},
                               {300, 200, 64}};

// ---- matmul -------------------------------------------------------------------------------

// Worst error of the fast path (f32 or bf16 inputs) against the fp64 reference over all shapes,
// transposes and betas. The reference runs on the same (for bf16: rounded) inputs.
// widened: bf16 through matmul_bf16_widened (a CPU without native bf16 GEMMs and without AVX2).
template <bool kBf16>
double matmul_check_all(double tol, bool widened = false) {
  double worst = 0;
  for (const MatmulShape& s : kShapes) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        for (float beta : {0.f, 1.f}) {
          uint64_t seed = uint64_t(s.m * 1000 + s.n * 10 + s.k + ta * 7 + tb * 13);
          auto a = random_floats(s.m * s.k, seed);  // (M,K) or (K,M)
          auto b = random_floats(s.k * s.n, seed + 1);  // (K,N) or (N,K)
          auto c0 = random_floats(s.m * s.n, seed + 2);  // (M,N)
          if (kBf16) {
            a = strata::testing::round_bf16(a);
            b = strata::testing::round_bf16(b);
          }
          // beta 0 must overwrite: start from NaN.
          std::vector<float> c = beta == 0.f
              ? std::vector<float>(c0.size(), std::numeric_limits<float>::quiet_NaN()) : c0;
          if (kBf16) {
            auto a16 = strata::testing::to_bf16(a), b16 = strata::testing::to_bf16(b);
            if (widened) strata::cpu::matmul_bf16_widened(c.data(), a16.data(), b16.data(), s.m, s.n, s.k, ta, tb, beta);
            else strata::cpu::matmul_bf16(c.data(), a16.data(), b16.data(), s.m, s.n, s.k, ta, tb, beta);
          } else {
            strata::cpu::matmul_f32(c.data(), a.data(), b.data(), s.m, s.n, s.k, ta, tb, beta);
          }
          auto ad = convert<double>(a), bd = convert<double>(b), cd = convert<double>(c0);
          strata::ref::matmul(cd.data(), ad.data(), bd.data(), s.m, s.n, s.k, ta, tb,
                              double(beta));
          double e = max_rel_error(c, cd);
          INFO((kBf16 ? "bf16" : "f32") << " m=" << s.m << " n=" << s.n << " k=" << s.k
                                        << " ta=" << ta << " tb=" << tb << " beta=" << beta
                                        << " err " << e);
          CHECK(e <= tol);
          worst = std::max(worst, e);
        }
      }
    }
  }
  return worst;
}

// True when matmul (f32 or bf16 inputs) gives the same bits with 1 and 2 OpenMP threads.
bool matmul_same_bits_1_2_threads(bool use_bf16, int64_t m, int64_t n, int64_t k, bool ta,
                                  bool tb, float beta, bool widened = false) {
  auto a = random_floats(m * k, 1), b = random_floats(k * n, 2), c0 = random_floats(m * n, 3);
  auto a16 = strata::testing::to_bf16(a), b16 = strata::testing::to_bf16(b);
  std::vector<float> one = c0, two = c0;
  const int keep = omp_get_max_threads();
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    float* c = threads == 1 ? one.data() : two.data();
    if (use_bf16 && widened) strata::cpu::matmul_bf16_widened(c, a16.data(), b16.data(), m, n, k, ta, tb, beta);
    else if (use_bf16) strata::cpu::matmul_bf16(c, a16.data(), b16.data(), m, n, k, ta, tb, beta);
    else strata::cpu::matmul_f32(c, a.data(), b.data(), m, n, k, ta, tb, beta);
    CHECK(omp_get_max_threads() == threads);  // matmul leaves the caller's thread count alone
  }
  omp_set_num_threads(keep);
  return std::memcmp(one.data(), two.data(), one.size() * 4) == 0;
}

}  // namespace

TEST_CASE("matmul reference gradients match finite differences for every transpose", "[kernels]") {
  // The backward of c = op(a) op(b) is two more matmuls (ops.h shows the linear-layer use);
  // check those calls of the reference against finite differences of its forward.
  const int64_t m = 3, n = 4, k = 5;
  double worst = 0;
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      auto a = convert<double>(random_floats(m * k, 1 + ta));
      auto b = convert<double>(random_floats(k * n, 3 + tb));
      auto r = convert<double>(random_floats(m * n, 5));  // loss = sum(c * r)
      auto loss = [&](const std::vector<double>& aa, const std::vector<double>& bb) {
        std::vector<double> c(m * n);
        strata::ref::matmul(c.data(), aa.data(), bb.data(), m, n, k, ta, tb, 0.0);
        double s = 0;
        for (size_t i = 0; i < c.size(); ++i) s += c[i] * r[i];
        return s;
      };
      std::vector<double> da(m * k), db(k * n);
      if (!ta) strata::ref::matmul(da.data(), r.data(), b.data(), m, k, n, false, !tb, 0.0);
      else strata::ref::matmul(da.data(), b.data(), r.data(), k, m, n, bool(tb), true, 0.0);
      if (!tb) strata::ref::matmul(db.data(), a.data(), r.data(), k, n, m, !ta, false, 0.0);
      else strata::ref::matmul(db.data(), r.data(), a.data(), n, k, m, true, bool(ta), 0.0);
      auto fd_a = finite_difference(a, [&](const auto& v) { return loss(v, b); });
      auto fd_b = finite_difference(b, [&](const auto& v) { return loss(a, v); });
      double ea = max_rel_error(da, fd_a), eb = max_rel_error(db, fd_b);
      INFO("ta=" << ta << " tb=" << tb);
      CHECK(ea <= 1e-6);
      CHECK(eb <= 1e-6);
      worst = std::max({worst, ea, eb});
    }
  }
  std::printf("matmul ref gradients vs finite differences: %.2e\n", worst);
}

TEST_CASE("matmul_f32 matches the fp64 reference", "[kernels]") {
  double worst = matmul_check_all<false>(1e-5);
  std::printf("matmul_f32 vs fp64 ref (worst over shapes/transposes/beta): %.2e\n", worst);
}

TEST_CASE("matmul_bf16 matches the fp64 reference on the rounded inputs", "[kernels]") {
  double worst = matmul_check_all<true>(1e-5);
  std::printf("matmul_bf16 vs fp64 ref on bf16-rounded inputs (worst): %.2e\n", worst);
}

TEST_CASE("matmul_bf16_widened (bf16 where oneDNN has no bf16 GEMM) matches the fp64 reference", "[kernels]") {
  // the path a CPU with neither AVX-512 nor AVX2 runs for every bf16 GEMM (an AVX2 CPU widens in
  // strata's own kernel, checked through matmul_bf16 above); elsewhere this is the only place the
  // widened path runs
  double worst = matmul_check_all<true>(1e-5, true);
  std::printf("matmul_bf16_widened vs fp64 ref on bf16-rounded inputs (worst): %.2e (native bf16 here: %s)\n", worst,
              strata::cpu::matmul_bf16_native() ? "yes" : "no");
  // the thread-count independence of the tiles holds for it too
  CHECK(matmul_same_bits_1_2_threads(true, 300, 520, 96, false, true, 0.f, true));
  CHECK(matmul_same_bits_1_2_threads(true, 520, 96, 300, true, false, 1.f, true));
  CHECK(matmul_same_bits_1_2_threads(true, 64, 64, 8192, true, false, 1.f, true));
}

TEST_CASE("matmul keeps the scratch it says it keeps, sized by the longest sum", "[kernels][scratch]") {
  struct Held {
    size_t overwrite = 0, small = 0, large = 0, after = 0;
  } held;
  std::thread worker([&] {
    omp_set_num_threads(1);  // every tile on this thread
    auto run = [](int64_t m, int64_t n, int64_t k, float beta) {
      const auto a = strata::testing::to_bf16(random_floats(m * k, 5));
      const auto b = strata::testing::to_bf16(random_floats(k * n, 6));
      std::vector<float> c(size_t(m * n), 0.f);
      strata::cpu::matmul_bf16_widened(c.data(), a.data(), b.data(), m, n, k, false, true, beta);
    };
    run(300, 520, 70, 0.f);
    held.overwrite = strata::cpu::matmul_scratch_held_bytes();
    run(300, 520, 70, 1.f);
    held.small = strata::cpu::matmul_scratch_held_bytes();
    run(65, 33, 129, 1.f);
    held.large = strata::cpu::matmul_scratch_held_bytes();
    run(300, 520, 70, 1.f);  // a shorter sum fits in what the thread holds
    held.after = strata::cpu::matmul_scratch_held_bytes();
  });
  worker.join();
  // 256 x K of op(a) and K x 256 of op(b) widened, and with beta = 1 the 256 x 256 product, f32
  CHECK(held.overwrite == size_t(512 * 70 * 4));
  CHECK(held.small == size_t((512 * 70 + 65536) * 4));
  CHECK(held.large == size_t((512 * 129 + 65536) * 4));
  CHECK(held.after == held.large);
  // matmul_bf16 without native bf16: strata's kernel where it runs (a tile row of op(a) in panels
  // of 6 rows, 258 x K, a tile column of op(b), 256 x K, and a thread's share of a packed operand
  // its team shares, up to 258 x K), else the widened buffers above
  const bool own = strata::cpu::gemm_avx2_available();
  CHECK(strata::cpu::gemm_packed_a_floats(256, 129) == 258 * 129);
  CHECK(strata::cpu::gemm_packed_b_floats(256, 129) == 256 * 129);
  // AMX: a tile row of op(a) in 1 KiB tiles (256 x 160 values: K padded to 5 chunks of 32), a
  // thread's share of a band of op(b)'s tile columns (4 of them), and the product
  CHECK(strata::cpu::matmul_scratch_bytes(129, strata::DType::bf16) ==
        (strata::cpu::gemm_amx_available()  ? size_t((5 * 16 * 5 * 256 + 65536) * 4)
         : strata::cpu::matmul_bf16_native() ? size_t(65536 * 4)
         : own                             ? size_t(((258 + 256 + 258) * 129 + 65536) * 4)
                                           : held.large));
  CHECK(strata::cpu::matmul_scratch_bytes(129, strata::DType::f32) ==
        (strata::cpu::matmul_f32_packs() ? size_t(((258 + 256 + 258) * 129 + 65536) * 4) : size_t(65536 * 4)));
  // f32 tiles through strata's kernel (2 x 3 tiles: a read transposed, then a stored (M, K), read
  // in place but for its last partial panel of rows) hold its buffers: on one thread its own; on
  // three, b's 3 tile columns packed once into the calling thread's shared buffer; on two (a fresh
  // thread, its own buffers first made by a call on one thread, whichever tiles the team then
  // hands it), the transposed a's 2 tile rows packed once there instead
  size_t shared_held = 0, shared_a_held = 0;
  std::thread f32_worker([&] {
    omp_set_num_threads(1);
    const auto a = random_floats(300 * 129, 7), b = random_floats(129 * 520, 8);
    std::vector<float> c(300 * 520, 0.f);
    strata::cpu::matmul_f32(c.data(), a.data(), b.data(), 300, 520, 129, true, false, 1.f);
    strata::cpu::matmul_f32(c.data(), a.data(), b.data(), 300, 520, 129, false, false, 1.f);
    held.large = strata::cpu::matmul_scratch_held_bytes();
    omp_set_num_threads(3);
    strata::cpu::matmul_f32(c.data(), a.data(), b.data(), 300, 520, 129, true, false, 1.f);
    shared_held = strata::cpu::matmul_scratch_held_bytes();
  });
  f32_worker.join();
  std::thread shared_a_worker([&] {
    const auto a = random_floats(300 * 129, 7), b = random_floats(129 * 520, 8);
    std::vector<float> c(300 * 520, 0.f);
    omp_set_num_threads(1);
    strata::cpu::matmul_f32(c.data(), a.data(), b.data(), 300, 520, 129, true, false, 1.f);
    omp_set_num_threads(2);
    strata::cpu::matmul_f32(c.data(), a.data(), b.data(), 300, 520, 129, true, false, 1.f);
    shared_a_held = strata::cpu::matmul_scratch_held_bytes();
  });
  shared_a_worker.join();
  if (strata::cpu::matmul_f32_packs()) {
    CHECK(held.large == size_t(((258 + 256) * 129 + 65536) * 4));
    CHECK(shared_held == held.large + size_t(3 * 256 * 129 * 4));
    CHECK(shared_held <= 3 * strata::cpu::matmul_scratch_bytes(129, strata::DType::f32));
    CHECK(shared_a_held == held.large + size_t(2 * 258 * 129 * 4));
    CHECK(shared_a_held <= 2 * strata::cpu::matmul_scratch_bytes(129, strata::DType::f32));
  } else {
    CHECK(held.large == strata::cpu::matmul_scratch_bytes(129, strata::DType::f32));
  }
  CHECK_THROWS_WITH(strata::cpu::matmul_scratch_bytes(-1, strata::DType::f32), Catch::Contains("k must be >= 0"));
}

TEST_CASE("matmul's beta = 1 adds a finished sum: accumulating equals a second buffer added", "[kernels]") {
  // what the engine's schedules rely on (offload/engine/engine.cpp: LoRA's adapter gradients summed by
  // the GEMM over a layer-major pass, or per micro-batch and added): dW += dy^T x by the GEMM
  // gives the bits of dW + (dy^T x into another buffer). oneDNN's own sum post-op does not on an
  // AVX2 CPU (its f32 GEMM starts the sums from c for a transposed a), so matmul adds after.
  for (const MatmulShape s : {MatmulShape{64, 32, 128}, MatmulShape{16, 64, 1024}, MatmulShape{300, 520, 70}}) {
    for (int path = 0; path < 3; ++path) {  // f32, bf16 as this CPU runs it, bf16 widened
      const auto a = random_floats(s.m * s.k, 11), b = random_floats(s.k * s.n, 12);  // a (K, M): transposed
      const auto a16 = strata::testing::to_bf16(a), b16 = strata::testing::to_bf16(b);
      const auto c0 = random_floats(s.m * s.n, 13);
      std::vector<float> fused = c0, separate = c0, t(c0.size());
      for (float beta : {1.f, 0.f}) {
        float* c = beta != 0.f ? fused.data() : t.data();
        if (path == 0) strata::cpu::matmul_f32(c, a.data(), b.data(), s.m, s.n, s.k, true, false, beta);
        if (path == 1) strata::cpu::matmul_bf16(c, a16.data(), b16.data(), s.m, s.n, s.k, true, false, beta);
        if (path == 2) strata::cpu::matmul_bf16_widened(c, a16.data(), b16.data(), s.m, s.n, s.k, true, false, beta);
      }
      for (size_t i = 0; i < t.size(); ++i) separate[i] += t[i];
      INFO("path " << path << " m=" << s.m << " n=" << s.n << " k=" << s.k);
      CHECK(std::memcmp(fused.data(), separate.data(), fused.size() * 4) == 0);
    }
  }
}

TEST_CASE("matmul handles empty sizes and rejects other betas", "[kernels]") {
  std::vector<float> c(6, 3.f), a(1), b(1);
  strata::cpu::matmul_f32(c.data(), a.data(), b.data(), 2, 3, 0, false, false, 1.f);
  CHECK(c == std::vector<float>(6, 3.f));  // k = 0, beta 1: unchanged
  strata::cpu::matmul_f32(c.data(), a.data(), b.data(), 2, 3, 0, false, false, 0.f);
  CHECK(c == std::vector<float>(6, 0.f));  // k = 0, beta 0: zeros
  strata::cpu::matmul_f32(c.data(), a.data(), b.data(), 0, 3, 4, false, false, 0.f);  // no-op
  CHECK_THROWS_AS(
      strata::cpu::matmul_f32(c.data(), a.data(), b.data(), 1, 1, 1, false, false, 0.5f),
      strata::Error);
}

TEST_CASE("matmul results are bitwise independent of the thread count", "[kernels]") {
  // A model's three matmuls (forward, dx, dW accumulate) with edge tiles, and long-K products
  // with small M x N, where oneDNN on its own splits K across threads (measured: it does for a
  // transposed a, e.g. m = n = 64, k = 2048, in f32 and bf16).
  struct Case { int64_t m, n, k; bool ta, tb; float beta; const char* what; };
  const Case cases[] = {{300, 520, 96, false, true, 0.f, "y = x W^T"},
                        {300, 96, 520, false, false, 0.f, "dx = dy W"},
                        {520, 96, 300, true, false, 1.f, "dW += dy^T x"},
                        // a packed and two tile columns of b: on 2 threads b is packed once, shared
                        {520, 300, 96, true, false, 1.f, "dW += dy^T x, b shared"},
                        // a read in place, six tile columns of b: runs down the tile columns
                        {600, 1408, 64, false, true, 0.f, "y = x W^T, wide"},
                        // four tile columns, two rows: on 2 threads a is packed once, shared
                        {300, 800, 96, true, false, 1.f, "dW += dy^T x, a shared"},
                        {8, 8, 16384, true, false, 0.f, "long K"},
                        {64, 64, 8192, true, false, 1.f, "dW, many tokens"}};
  int differ = 0;
  for (const Case& c : cases) {
    for (bool use_bf16 : {false, true}) {
      bool same = matmul_same_bits_1_2_threads(use_bf16, c.m, c.n, c.k, c.ta, c.tb, c.beta);
      INFO((use_bf16 ? "bf16 " : "f32 ") << c.what << " m=" << c.m << " n=" << c.n << " k=" << c.k);
      CHECK(same);
      differ += !same;
    }
  }
  std::printf("matmul 1 vs 2 threads: %d of %d cases differ\n", differ, int(2 * std::size(cases)));
}

TEST_CASE("matmul gives the same bits for an a read in place and one packed", "[kernels]") {
  // strata's AVX2 kernel reads an f32 a stored (M, K) in place and packs a transposed one (and
  // a last partial panel of rows); both must feed the same products in the same order. The same
  // op(a) stored both ways, with b both ways: over more than one 512-step block of K, edge tiles,
  // partial 6-row panels and 16-column panels, 1 and 2 threads. (oneDNN makes no such promise:
  // checked only where strata's kernel runs.)
  if (!strata::cpu::matmul_f32_packs()) SUCCEED("oneDNN's tiles on this CPU");
  else {
    const int64_t m = 301, n = 270, k = 530;
    const auto a = random_floats(m * k, 11), b = random_floats(k * n, 12);
    std::vector<float> at(size_t(m * k));  // a transposed: stored (K, M)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t p = 0; p < k; ++p) at[size_t(p * m + i)] = a[size_t(i * k + p)];
    const int keep = omp_get_max_threads();
    for (int threads : {1, 2}) {
      omp_set_num_threads(threads);
      for (bool tb : {false, true}) {
        for (float beta : {0.f, 1.f}) {
          std::vector<float> in_place(size_t(m * n), 0.5f), packed(size_t(m * n), 0.5f);
          strata::cpu::matmul_f32(in_place.data(), a.data(), b.data(), m, n, k, false, tb, beta);
          strata::cpu::matmul_f32(packed.data(), at.data(), b.data(), m, n, k, true, tb, beta);
          INFO("threads " << threads << " tb " << tb << " beta " << beta);
          CHECK(std::memcmp(in_place.data(), packed.data(), in_place.size() * 4) == 0);
        }
      }
    }
    omp_set_num_threads(keep);
  }
}

// ---- elementwise helpers that feed matmul_bf16 ---------------------------------------------

namespace {

// Value of a bf16 bit pattern in double, decoded from the fields; the all-ones exponent with
// a zero mantissa decodes as 2^128, the "next value" past the largest finite bf16, which is
// what round-to-nearest compares against before overflowing to infinity.
double bf16_bits_value(uint16_t h) {
  int sign = h >> 15, exp = (h >> 7) & 0xff, mant = h & 0x7f;
  double mag = exp == 0 ? std::ldexp(mant / 128.0, -126) : std::ldexp(1 + mant / 128.0, exp - 127);
  return sign ? -mag : mag;
}

// Independent f32 -> bf16: pick the nearer of the two neighbouring bf16 values by comparing
// distances in double; ties go to the even mantissa. NaN -> quiet NaN of the same sign.
uint16_t bf16_round_by_distance(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return uint16_t((u >> 16) | 0x40);
  if (std::isinf(f)) return uint16_t(u >> 16);
  uint16_t lo = uint16_t(u >> 16), hi = uint16_t(lo + 1);  // |lo| <= |f| < |hi|, same sign
  double dlo = std::abs(double(f) - bf16_bits_value(lo));
  double dhi = std::abs(bf16_bits_value(hi) - double(f));
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (lo & 1) ? hi : lo;
}

}  // namespace

TEST_CASE("cast_f32_to_bf16 rounds to nearest even like an independent rounding", "[kernels]") {
  std::vector<uint32_t> bits = {
      0x00000000, 0x80000000, 0x3f800000, 0xbf800000,  // zeros, +-1
      0x3f808000, 0x3f818000, 0x3f808001, 0x3f80ffff,  // ties to even (down, up), above tie
      0x3f807fff, 0x7f7fffff, 0xff7fffff, 0x7f7f7fff,  // below tie, max float -> inf
      0x7f7f8000, 0x7f7f0000, 0x7f800000, 0xff800000,  // tie at max -> inf, max bf16, infs
      0x7fc00000, 0x7f800001, 0xff800001, 0x7fffffff,  // quiet and signalling NaNs
      0x00000001, 0x00008000, 0x00018000, 0x807fffff,  // subnormals, ties among them
      0x007fffff, 0x00800000, 0x4b800000, 0x33000000};
  std::mt19937_64 rng(42);
  for (int i = 0; i < 200000; ++i) bits.push_back(uint32_t(rng()));
  std::vector<float> in(bits.size());
  std::memcpy(in.data(), bits.data(), bits.size() * 4);
  std::vector<bf16> out(in.size());
  strata::cpu::cast_f32_to_bf16(out.data(), in.data(), int64_t(in.size()));
  int64_t bad = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    uint16_t want = bf16_round_by_distance(in[i]);
    if (out[i].bits != want || strata::f32_to_bf16(in[i]).bits != want) {
      if (bad++ < 5) UNSCOPED_INFO("0x" << std::hex << bits[i] << " -> 0x" << out[i].bits
                                        << " want 0x" << want);
    }
  }
  CHECK(bad == 0);
  // A short array takes the serial path.
  std::vector<bf16> head(17);
  strata::cpu::cast_f32_to_bf16(head.data(), in.data(), 17);
  for (int i = 0; i < 17; ++i) CHECK(head[i].bits == out[i].bits);
}

TEST_CASE("cast_bf16_to_f32 is exact for every bit pattern", "[kernels]") {
  std::vector<bf16> in(65536);
  for (uint32_t i = 0; i < 65536; ++i) in[i].bits = uint16_t(i);
  std::vector<float> out(in.size());
  strata::cpu::cast_bf16_to_f32(out.data(), in.data(), int64_t(in.size()));
  int64_t bad = 0;
  for (uint32_t i = 0; i < 65536; ++i) {
    bool is_nan = ((i >> 7) & 0xff) == 0xff && (i & 0x7f);
    bool inf = ((i >> 7) & 0xff) == 0xff && !(i & 0x7f);
    double want = inf ? ((i >> 15) ? -INFINITY : INFINITY) : bf16_bits_value(uint16_t(i));
    bool ok = is_nan ? std::isnan(out[i])
                     : double(out[i]) == want && std::signbit(out[i]) == bool(i >> 15);
    bad += !ok;
  }
  CHECK(bad == 0);
}

TEST_CASE("add_inplace adds elementwise", "[kernels]") {
  for (int64_t n : {1, 15, 17, 4097, 100003}) {
    auto y = random_floats(n, 1 + n), x = random_floats(n, 2 + n);
    std::vector<float> want(n);
    for (int64_t i = 0; i < n; ++i) want[i] = y[i] + x[i];
    strata::cpu::add_inplace(y.data(), x.data(), n);
    CHECK(std::memcmp(y.data(), want.data(), n * 4) == 0);
  }
}
