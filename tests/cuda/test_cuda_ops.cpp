// The CUDA backend's ops against the fp64 reference twins (kernels/cpu/ref), at awkward sizes,
// through the Device interface: under the emulator (strata_cuda_emu_tests) and on a real GPU
// (strata_cuda_tests). Tolerances are per-tensor max errors relative to the tensor's largest
// entry (testing::max_rel_error); each says what it allows for.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/ref.h"
#include "tests/cuda/cuda_testing.h"
#include "tests/testing.h"

namespace strata {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// f32 kernels vs fp64 on the same f32 inputs: f32 rounding over sums of up to ~100 terms.
constexpr double kF32Tol = 2e-6;

TEST_CASE("cuda matmul maps row-major onto cuBLAS for every transpose, f32 and bf16", "[cuda-emu]") {
  auto dev = cuda_testing::test_device();
  if (!dev) return;
  struct Shape { int64_t m, n, k; };
  for (Shape s : {Shape{1, 1, 1}, Shape{17, 5, 3}, Shape{3, 17, 24}, Shape{9, 1, 33}}) {
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (float beta : {0.f, 1.f})
          for (DType dt : {DType::f32, DType::bf16}) {
            INFO("m=" << s.m << " n=" << s.n << " k=" << s.k << " ta=" << ta << " tb=" << tb
                      << " beta=" << beta << " " << dtype_name(dt));
            std::vector<float> a = random_floats(size_t(s.m * s.k), 1 + s.m);
            std::vector<float> b = random_floats(size_t(s.k * s.n), 2 + s.n);
            std::vector<float> c0 = random_floats(size_t(s.m * s.n), 3);
            if (beta == 0.f) c0.assign(c0.size(), kNaN);  // beta 0 must not read c
            if (dt == DType::bf16) {
              a = testing::round_bf16(a);
              b = testing::round_bf16(b);
            }
            std::vector<double> want = convert<double>(c0);
            if (beta == 0.f) want.assign(want.size(), 0.0);
            ref::matmul<double>(want.data(), convert<double>(a).data(), convert<double>(b).data(),
                                s.m, s.n, s.k, ta, tb, double(beta));
            Buffer<float> c(*dev, c0);
            std::vector<float> got;
            if (dt == DType::f32) {
              Buffer<float> da(*dev, a), db(*dev, b);
              dev->matmul(c, da, db, dt, s.m, s.n, s.k, ta, tb, beta, Stream::compute);
              got = c.download();
            } else {
              Buffer<bf16> da(*dev, testing::to_bf16(a)), db(*dev, testing::to_bf16(b));
              dev->matmul(c, da, db, dt, s.m, s.n, s.k, ta, tb, beta, Stream::compute);
              got = c.download();
            }
            CHECK(max_rel_error(got, want) <= 1e-5);  // exact inputs, f32 accumulation
          }
  }
}

TEST_CASE("cuda rmsnorm forward and backward match the fp64 reference", "[cuda-emu]") {
  auto dev = cuda_testing::test_device();
  if (!dev) return;
  struct Shape { int64_t n, c; };  // per-head shapes too: many rows of c = D
  for (Shape s : {Shape{1, 1}, Shape{17, 5}, Shape{3, 24}, Shape{40, 64}, Shape{2, 129}}) {
    INFO("n=" << s.n << " c=" << s.c);
    const float eps = 1e-6f;
    auto x = random_floats(size_t(s.n * s.c), 11, -2.f, 2.f);
    auto w = random_floats(size_t(s.c), 12, 0.5f, 1.5f);
    auto dy = random_floats(size_t(s.n * s.c), 13);
    auto dw0 = random_floats(size_t(s.c), 14);  // accumulated into
    std::vector<double> out(x.size()), rstd(size_t(s.n)), dx(x.size());
    std::vector<double> dw = convert<double>(dw0);
    auto xd = convert<double>(x), wd = convert<double>(w), dyd = convert<double>(dy);
    ref::rmsnorm_forward<double>(out.data(), rstd.data(), xd.data(), wd.data(), s.n, s.c, eps);
    ref::rmsnorm_backward<double>(dx.data(), dw.data(), dyd.data(), xd.data(), wd.data(),
                                  rstd.data(), s.n, s.c);

    Buffer<float> gx(*dev, x), gw(*dev, w), gdy(*dev, dy), gdw(*dev, dw0);
    Buffer<float> gout(*dev, x.size()), grstd(*dev, size_t(s.n)), gdx(*dev, x.size());
    dev->rmsnorm_forward(gout, grstd, gx, gw, s.n, s.c, eps, Stream::compute);
    dev->rmsnorm_backward(gdx, gdw, gdy, gx, gw, grstd, s.n, s.c, Stream::compute);
    CHECK(max_rel_error(gout.download(), out) <= kF32Tol);
    CHECK(max_rel_error(grstd.download(), rstd) <= kF32Tol);
    // r^3 * dot: a longer chain. With c = 1 the exact din is ~eps-small (x r = +-1 almost
    // exactly) and all that is left is cancellation noise: measure it against the O(1) scale.
    CHECK(max_rel_error(gdx.download(), dx, 1e-2) <= 1e-5);
    CHECK(max_rel_error(gdw.download(), dw) <= 1e-5);
    // the bf16-output forward: its own f32 forward's bits, and those rounded as
    // cast_f32_to_bf16 rounds; so within bf16 rounding (2^-9) of the CPU twin's copy
    Buffer<float> gout2(*dev, x.size()), grstd2(*dev, size_t(s.n));
    Buffer<bf16> gout_b(*dev, x.size());
    dev->rmsnorm_forward_bf16(gout2, gout_b, grstd2, gx, gw, s.n, s.c, eps, Stream::compute);
    const std::vector<float> f32_out = gout.download(), f32_out2 = gout2.download();
    CHECK(std::memcmp(f32_out.data(), f32_out2.data(), f32_out.size() * 4) == 0);
    const std::vector<bf16> got_b = gout_b.download();
    CHECK(testing::bf16_mismatches(got_b, testing::to_bf16(f32_out)) == 0);
    std::vector<float> cpu_out(x.size()), cpu_rstd(size_t(s.n));
    std::vector<bf16> cpu_b(x.size());
    cpu::rmsnorm_forward_bf16(cpu_out.data(), cpu_b.data(), cpu_rstd.data(), x.data(), w.data(), s.n, s.c, eps);
    std::vector<float> widened(x.size()), cpu_widened(x.size());
    for (size_t i = 0; i < x.size(); ++i) widened[i] = bf16_to_f32(got_b[i]), cpu_widened[i] = bf16_to_f32(cpu_b[i]);
    CHECK(max_rel_error(widened, convert<double>(cpu_widened)) <= 1.0 / 256);
  }
}

TEST_CASE("cuda rope forward and backward match the reference, in place", "[cuda-emu]") {
  auto dev = cuda_testing::test_device();
  if (!dev) return;
  struct Shape { int64_t n, nh, d; };
  for (Shape s : {Shape{1, 1, 2}, Shape{17, 3, 24}, Shape{5, 2, 64}}) {
    INFO("n=" << s.n << " nh=" << s.nh << " d=" << s.d);
    auto x = random_floats(size_t(s.n * s.nh * s.d), 21);
    std::vector<int32_t> pos(size_t(s.n));
    for (int64_t i = 0; i < s.n; ++i) pos[size_t(i)] = int32_t((i * 7919) % 4099);  // large angles
    std::vector<float> inv_freq(size_t(s.d / 2));
    for (int64_t j = 0; j < s.d / 2; ++j)
      inv_freq[size_t(j)] = float(std::pow(10000.0, -2.0 * double(j) / double(s.d)));
    // The reference angle is float(pos) * inv_freq in f32, then cos/sin in fp64 of that f32.
    std::vector<double> want(x.size()), back(x.size());
    auto xd = convert<double>(x);
    for (int64_t i = 0; i < s.n; ++i) {
      for (int64_t h = 0; h < s.nh; ++h)
        for (int64_t j = 0; j < s.d / 2; ++j) {
          const double a = double(float(pos[size_t(i)]) * inv_freq[size_t(j)]);
          const double cs = std::cos(a), sn = std::sin(a);
          const size_t base = size_t((i * s.nh + h) * s.d);
          const double x0 = xd[base + size_t(j)], x1 = xd[base + size_t(j + s.d / 2)];
          want[base + size_t(j)] = x0 * cs - x1 * sn;
          want[base + size_t(j + s.d / 2)] = x1 * cs + x0 * sn;
          back[base + size_t(j)] = x0 * cs + x1 * sn;
          back[base + size_t(j + s.d / 2)] = x1 * cs - x0 * sn;
        }
    }
    Buffer<float> gx(*dev, x), gy(*dev, x);
    Buffer<int32_t> gpos(*dev, pos);
    Buffer<float> gf(*dev, inv_freq);
    dev->rope_forward(gx, gx, gpos, gf, s.n, s.nh, s.d, s.d, Stream::compute);   // in place
    dev->rope_backward(gy, gy, gpos, gf, s.n, s.nh, s.d, s.d, Stream::compute);  // in place
    // cosf/sinf of angles up to ~4e3 rad: a few ulp of the f32 angle's result.
    CHECK(max_rel_error(gx.download(), want) <= 1e-5);
    CHECK(max_rel_error(gy.download(), back) <= 1e-5);
  }
}

TEST_CASE("cuda rope with a partial rotary dim matches the CPU kernel, out of place and in place", "[cuda-emu][rope]") {
  // partial_rotary_factor < 1 (Phi-4-mini's 0.75): the first rot dims turn, the rest pass (copied by
  // rope_pass_kernel out of place)
  auto dev = cuda_testing::test_device();
  if (!dev) return;
  const int64_t n = 19, nh = 3, d = 16, rot = 12, size = n * nh * d;
  const std::vector<float> x = random_floats(size_t(size), 77, -2.f, 2.f);
  std::vector<int32_t> pos(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) pos[size_t(i)] = int32_t((i * 37) % 500);
  std::vector<float> inv(size_t(rot / 2));
  for (int64_t j = 0; j < rot / 2; ++j) inv[size_t(j)] = 1.f / std::pow(10000.f, float(2 * j) / float(rot));
  std::vector<float> want(static_cast<size_t>(size)), back(static_cast<size_t>(size));
  cpu::rope_forward(want.data(), x.data(), pos.data(), inv.data(), n, nh, d, rot);
  cpu::rope_backward(back.data(), x.data(), pos.data(), inv.data(), n, nh, d, rot);
  Buffer<float> gx(*dev, x), gout(*dev, std::vector<float>(size_t(size), -9.f)), gin(*dev, x);
  Buffer<int32_t> gpos(*dev, pos);
  Buffer<float> gf(*dev, inv);
  dev->rope_forward(gout, gx, gpos, gf, n, nh, d, rot, Stream::compute);    // out of place
  dev->rope_backward(gin, gin, gpos, gf, n, nh, d, rot, Stream::compute);   // in place
  const std::vector<float> out = gout.download(), din = gin.download();
  CHECK(max_rel_error(out, convert<double>(want)) <= 1e-5);
  CHECK(max_rel_error(din, convert<double>(back)) <= 1e-5);
  for (int64_t r = 0; r < n * nh; ++r)
    for (int64_t j = rot; j < d; ++j) {
      REQUIRE(out[size_t(r * d + j)] == x[size_t(r * d + j)]);
      REQUIRE(din[size_t(r * d + j)] == x[size_t(r * d + j)]);
    }
}

TEST_CASE("cuda swiglu, bias, add and casts match the reference", "[cuda-emu]") {
  auto dev = cuda_testing::test_device();
  if (!dev) return;
  for (int64_t n : {1, 17, 1031}) {
    INFO("n=" << n);
    auto g = random_floats(size_t(n), 31, -6.f, 6.f), u = random_floats(size_t(n), 32);
    auto dy = random_floats(size_t(n), 33);
    std::vector<double> out(static_cast<size_t>(n)), dg(out.size()), du(out.size());
    auto gd = convert<double>(g), ud = convert<double>(u), dyd = convert<double>(dy);
    ref::swiglu_forward<double>(out.data(), gd.data(), ud.data(), n);
    ref::swiglu_backward<double>(dg.data(), du.data(), dyd.data(), gd.data(), ud.data(), n);
    Buffer<float> bg(*dev, g), bu(*dev, u), bdy(*dev, dy), bout(*dev, g.size());
    Buffer<float> bdg(*dev, g.size()), bdu(*dev, g.size());
    dev->swiglu_forward(bout, bg, bu, n, Stream::compute);
    dev->swiglu_backward(bdg, bdu, bdy, bg, bu, n, Stream::compute);
    CHECK(max_rel_error(bout.download(), out) <= kF32Tol);
    CHECK(max_rel_error(bdg.download(), dg) <= kF32Tol);
    CHECK(max_rel_error(bdu.download(), du) <= kF32Tol);
    // the bf16-output backward: the f32 backward's values rounded as cast_f32_to_bf16 rounds, bit
    // for bit, and so within bf16 rounding (2^-9) of the CPU twin's
    Buffer<bf16> bdg16(*dev, g.size()), bdu16(*dev, g.size());
    dev->swiglu_backward_bf16(bdg16, bdu16, bdy, bg, bu, n, Stream::compute);
    // and the bf16-output forward: its own f32 forward's bits and their rounding
    Buffer<float> bout2(*dev, g.size());
    Buffer<bf16> bout16(*dev, g.size());
    dev->swiglu_forward_bf16(bout2, bout16, bg, bu, n, Stream::compute);
    const std::vector<float> fwd = bout.download(), fwd2 = bout2.download();
    CHECK(std::memcmp(fwd.data(), fwd2.data(), fwd.size() * 4) == 0);
    CHECK(testing::bf16_mismatches(bout16.download(), testing::to_bf16(fwd)) == 0);
    const std::vector<bf16> dg16 = bdg16.download(), du16 = bdu16.download();
    CHECK(testing::bf16_mismatches(dg16, testing::to_bf16(bdg.download())) == 0);
    CHECK(testing::bf16_mismatches(du16, testing::to_bf16(bdu.download())) == 0);
    std::vector<bf16> cpu_dg(g.size()), cpu_du(g.size());
    cpu::swiglu_backward_bf16(cpu_dg.data(), cpu_du.data(), dy.data(), g.data(), u.data(), n);
    std::vector<float> widened(g.size()), cpu_widened(g.size());
    for (size_t i = 0; i < g.size(); ++i) widened[i] = bf16_to_f32(dg16[i]), cpu_widened[i] = bf16_to_f32(cpu_dg[i]);
    CHECK(max_rel_error(widened, convert<double>(cpu_widened)) <= 1.0 / 256);

    // y += x, then bf16 of y: round to nearest even like src/core/bf16.h, bit for bit.
    std::vector<float> y = u;
    for (size_t i = 0; i < y.size(); ++i) y[i] += g[i];
    dev->add_inplace(bu, bg, n, Stream::compute);
    CHECK(bu.download() == y);
    Buffer<bf16> bb(*dev, g.size());
    dev->cast_f32_to_bf16(bb, bu, n, Stream::compute);
    CHECK(testing::bf16_mismatches(bb.download(), testing::to_bf16(y)) == 0);
  }
  struct Shape { int64_t n, o; };
  for (Shape s : {Shape{1, 1}, Shape{17, 33}, Shape{70, 5}}) {
    INFO("bias n=" << s.n << " o=" << s.o);
    auto y = random_floats(size_t(s.n * s.o), 41), b = random_floats(size_t(s.o), 42);
    auto db0 = random_floats(size_t(s.o), 43);
    std::vector<double> yd = convert<double>(y), dbd = convert<double>(db0);
    ref::bias_forward<double>(yd.data(), convert<double>(b).data(), s.n, s.o);
    ref::bias_backward<double>(dbd.data(), convert<double>(y).data(), s.n, s.o);
    Buffer<float> by(*dev, y), bb(*dev, b), bdb(*dev, db0), bdy(*dev, y);
    dev->bias_forward(by, bb, s.n, s.o, Stream::compute);
    dev->bias_backward(bdb, bdy, s.n, s.o, Stream::compute);
    CHECK(max_rel_error(by.download(), yd) <= kF32Tol);
    CHECK(max_rel_error(bdb.download(), dbd) <= kF32Tol * 4);  // 70-term column sums
  }
}

TEST_CASE("cuda embedding gather (f32, bf16) and deterministic scatter-add", "[cuda-emu]") {
  auto dev = cuda_testing::test_device();
  if (!dev) return;
  struct Shape { int64_t n, c, v; };
  // 1100 tokens over 5 ids: every owner walks two 1024-token tiles of its matches.
  for (Shape s : {Shape{1, 1, 3}, Shape{17, 24, 9}, Shape{1100, 3, 5}}) {
    INFO("n=" << s.n << " c=" << s.c << " v=" << s.v);
    auto table = random_floats(size_t(s.v * s.c), 51);
    std::vector<int32_t> ids(size_t(s.n));
    for (int64_t i = 0; i < s.n; ++i) ids[size_t(i)] = int32_t((i * i + 3 * i) % s.v);
    auto dout = random_floats(size_t(s.n * s.c), 52);
    auto dtable0 = random_floats(size_t(s.v * s.c), 53);
    std::vector<double> out(size_t(s.n * s.c)), dtable = convert<double>(dtable0);
    ref::embedding_forward<double>(out.data(), convert<double>(table).data(), ids.data(), s.n, s.c);
    ref::embedding_backward<double>(dtable.data(), convert<double>(dout).data(), ids.data(), s.n, s.c);

    Buffer<int32_t> bids(*dev, ids);
    Buffer<float> btable(*dev, table), bout(*dev, size_t(s.n * s.c));
    dev->embedding_forward(bout, btable, DType::f32, bids, s.n, s.c, Stream::compute);
    CHECK(max_rel_error(bout.download(), out) == 0.0);  // a gather is exact
    std::vector<float> gathered(size_t(s.n * s.c));  // (n, c) table rows of ids, f32
    for (int64_t i = 0; i < s.n; ++i)
      for (int64_t j = 0; j < s.c; ++j)
        gathered[size_t(i * s.c + j)] = table[size_t(ids[size_t(i)] * s.c + j)];
    Buffer<bf16> btable16(*dev, testing::to_bf16(table));
    dev->embedding_forward(bout, btable16, DType::bf16, bids, s.n, s.c, Stream::compute);
    CHECK(bout.download() == testing::round_bf16(gathered));  // bf16 -> f32 is exact

    Buffer<float> bdout(*dev, dout), bdtable(*dev, dtable0);
    dev->embedding_backward(bdtable, bdout, bids, s.n, s.c, Stream::compute);
    const std::vector<float> first = bdtable.download();
    CHECK(max_rel_error(first, dtable) <= 1e-5);  // token-order f32 sums of up to 220 terms
    // Deterministic: the same scatter again gives bitwise the same table.
    bdtable.upload(dtable0);
    dev->embedding_backward(bdtable, bdout, bids, s.n, s.c, Stream::compute);
    CHECK(bdtable.download() == first);
  }
}

TEST_CASE("cuda lm_head cross-entropy matches the reference across chunks, f32 and bf16", "[cuda-emu]") {
  auto dev = cuda_testing::test_device();
  if (!dev) return;
  struct Shape { int64_t n, c, v; };
  // 130 rows cross the 128-row chunk; v = 71 and 300 are odd vocabularies.
  for (Shape s : {Shape{1, 5, 71}, Shape{17, 24, 300}, Shape{130, 8, 71}}) {
    for (DType wt : {DType::f32, DType::bf16}) {
      INFO("n=" << s.n << " c=" << s.c << " v=" << s.v << " " << dtype_name(wt));
      auto h = random_floats(size_t(s.n * s.c), 61, -2.f, 2.f);
      auto w = random_floats(size_t(s.v * s.c), 62, -1.f, 1.f);
      std::vector<int32_t> targets(size_t(s.n));
      for (int64_t i = 0; i < s.n; ++i) targets[size_t(i)] = (i % 5 == 3) ? -100 : int32_t((i * 13) % s.v);
      auto dw0 = random_floats(size_t(s.v * s.c), 63);
      const float scale = 0.37f;
      // bf16 weights: the kernels round h (and the logit gradient) to bf16 for the matmuls;
      // the reference runs in fp64 on the bf16-rounded h and w.
      std::vector<float> hr = wt == DType::bf16 ? testing::round_bf16(h) : h;
      std::vector<float> wr = wt == DType::bf16 ? testing::round_bf16(w) : w;
      std::vector<double> dh(h.size()), dw = convert<double>(dw0);
      int64_t count = 0;
      const double loss = ref::lm_head_ce_backward<double>(dh.data(), dw.data(), &count,
          convert<double>(hr).data(), convert<double>(wr).data(), targets.data(), s.n, s.c, s.v,
          double(scale));

      Buffer<float> bh(*dev, h), bdh(*dev, h.size()), bdw(*dev, dw0);
      Buffer<int32_t> bt(*dev, targets);
      Buffer<double> bloss(*dev, std::vector<double>{0.25});  // accumulated into
      std::unique_ptr<Buffer<float>> bw32;
      std::unique_ptr<Buffer<bf16>> bw16;
      const void* wp;
      if (wt == DType::f32) {
        bw32 = std::make_unique<Buffer<float>>(*dev, w);
        wp = bw32->get();
      } else {
        bw16 = std::make_unique<Buffer<bf16>>(*dev, testing::to_bf16(w));
        wp = bw16->get();
      }
      // the whole vocabulary: the one-chunk case of the chunked loss
      Buffer<double> stats(*dev, size_t(s.n * 3));
      dev->lm_head_ce_chunk_stats(stats, bh, wp, wt, bt, s.n, s.c, s.v, 0, s.v, true, nullptr, Stream::compute);
      dev->lm_head_ce_stats_loss(bloss, stats, bt, s.n, s.v, Stream::compute);
      const double fwd = bloss.download()[0] - 0.25;
      dev->lm_head_ce_stats_loss(bloss, stats, bt, s.n, s.v, Stream::compute);
      dev->memset_zero(bdh, h.size() * 4, Stream::compute);
      dev->lm_head_ce_chunk_backward(bdh, bdw, bh, wp, wt, stats, bt, s.n, s.c, s.v, 0,
                                     s.v, scale, nullptr, Stream::compute);
      const double both = bloss.download()[0] - 0.25;
      const double tol_loss = wt == DType::f32 ? 2e-6 : 1e-5;
      CHECK(std::abs(fwd - loss) <= tol_loss * std::abs(loss));
      CHECK(std::abs(both - 2 * loss) <= 2 * tol_loss * std::abs(loss));
      // bf16: the logit gradient is rounded to bf16 (2^-9 relative) before both matmuls.
      const double tol_grad = wt == DType::f32 ? 1e-5 : 1e-2;
      CHECK(max_rel_error(bdh.download(), dh) <= tol_grad);
      CHECK(max_rel_error(bdw.download(), dw) <= tol_grad);
    }
  }
}

}  // namespace
}  // namespace strata
