// The tensor-core attention (kernels/cuda/attention_tc.cu, WMMA; under the emulator cuemu's
// wmma with its own fragment mapping) against the fp64 twin (kernels/cpu/ref/attention.h) on
// the same bf16-rounded q, k, v, dout, the twin's backward rounding P and dS to bf16 as the op
// defines: every padded head dim (64, 80, 128, 256, and 5 and 100 padded up), GQA ratios 1, 4
// and 8, odd T (1, 17, 67, 130: partial 16-row, 64-query and key tiles), several documents per
// row, sliding windows (alone and with documents); every case run twice, bitwise equal.
//
// Stated tolerances. The kernel rounds the forward's P to bf16 before P V (the twin keeps it
// exact) and sums products in f32: out max |err| / max |out| <= 1e-2; lse max |err| / max |lse|
// <= 1e-5 (scores are exact bf16 products summed in f32). Gradients: relative L2 error
// ||got - want|| / ||want|| <= 2e-2 and max |err| / max |want| <= 4e-2 for dq, dk, dv (P and dS
// are formed in f32 from the f32 lse and then rounded, so a weight near a bf16 tie may round
// the other way from the twin's fp64 value).
#include <catch2/catch.hpp>
#include <cmath>
#include <algorithm>
#include <cstdio>
#include <vector>

#include "kernels/cpu/ref.h"
#include "kernels/cuda/ops.h"
#include "tests/cuda/cuda_testing.h"
#include "tests/seeded_inputs.h"
#include "tests/testing.h"

namespace strata {
namespace {

using testing::make_doc_start;

struct TcCase {
  int64_t b, t, h, hk, d;
  int64_t max_doc;  // 0: no doc_start; else documents of 1..max_doc tokens
  int64_t window;   // 0: no sliding window
};

// ||got - want|| / max(||want||, floor sqrt(n)): with one-token documents dq and dk are 0 up to
// rounding (dS = P (dP - D_i) with P = 1, dP = D_i), so the floor keeps the measure meaningful.
double rel_l2_error(const std::vector<float>& got, const std::vector<double>& want, double floor) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), floor * std::sqrt(double(want.size())));
}

TEST_CASE("cuda tensor-core attention matches the fp64 twin at bf16 tolerances", "[cuda-emu][attention]") {
  auto dev = cuda_testing::test_device(size_t(256) << 20);
  if (!dev) return;
  const TcCase cases[] = {
      {1, 1, 1, 1, 64, 0, 0},      {2, 17, 4, 1, 64, 0, 0},     {1, 130, 8, 1, 80, 0, 0},
      {2, 70, 4, 4, 128, 13, 0},   {1, 130, 4, 1, 128, 40, 32}, {1, 67, 2, 2, 256, 0, 0},
      {1, 130, 8, 1, 256, 30, 48}, {1, 17, 2, 1, 5, 6, 4},      {1, 100, 2, 2, 64, 0, 16},
      {2, 45, 4, 4, 100, 1, 0}};
  cudaStream_t stream = nullptr;
  Buffer<int> error_word(*dev, std::vector<int>{0});
  for (const TcCase& c : cases) {
    INFO("b=" << c.b << " t=" << c.t << " h=" << c.h << " hk=" << c.hk << " d=" << c.d
              << " max_doc=" << c.max_doc << " window=" << c.window);
    const size_t nq = size_t(c.b * c.t * c.h * c.d), nk = size_t(c.b * c.t * c.hk * c.d);
    const auto q = testing::round_bf16(random_floats(nq, 171, -2.f, 2.f));
    const auto k = testing::round_bf16(random_floats(nk, 172, -2.f, 2.f));
    const auto v = testing::round_bf16(random_floats(nk, 173));
    const auto dout = testing::round_bf16(random_floats(nq, 174));
    std::vector<int32_t> docs = c.max_doc ? make_doc_start(c.b, c.t, c.max_doc, 175) : std::vector<int32_t>{};
    const int32_t* ds_host = c.max_doc ? docs.data() : nullptr;
    const double scale = 1.0 / std::sqrt(double(c.d));

    std::vector<double> out(nq), lse(size_t(c.b * c.t * c.h)), dq(nq), dk(nk), dv(nk);
    const auto qd = convert<double>(q), kd = convert<double>(k), vd = convert<double>(v);
    const auto dod = convert<double>(dout);
    ref::attention_forward<double>(out.data(), lse.data(), qd.data(), kd.data(), vd.data(), ds_host,
                                   c.b, c.t, c.h, c.hk, c.d, scale, c.window);
    ref::attention_backward<double>(dq.data(), dk.data(), dv.data(), dod.data(), qd.data(), kd.data(),
                                    vd.data(), out.data(), lse.data(), ds_host, c.b, c.t, c.h, c.hk,
                                    c.d, scale, true, c.window);

    Buffer<float> gq(*dev, q), gk(*dev, k), gv(*dev, v), gdo(*dev, dout);
    Buffer<float> gout(*dev, nq), glse(*dev, lse.size()), gdq(*dev, nq), gdk(*dev, nk), gdv(*dev, nk);
    Buffer<int32_t> gds(*dev, docs.empty() ? std::vector<int32_t>(1, 0) : docs);
    const int32_t* ds_dev = c.max_doc ? gds.get() : nullptr;
    auto run = [&] {
      cuda::attention_tc_forward(gout, glse, gq, gk, gv, ds_dev, c.b, c.t, c.h, c.hk, c.d,
                                 float(scale), c.window, error_word, stream);
      cuda::attention_tc_backward(gdq, gdk, gdv, gdo, gq, gk, gv, gout, glse, ds_dev, c.b, c.t,
                                  c.h, c.hk, c.d, float(scale), c.window, error_word, stream);
      REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    };
    run();
    const std::vector<float> out1 = gout.download(), lse1 = glse.download();
    const std::vector<float> dq1 = gdq.download(), dk1 = gdk.download(), dv1 = gdv.download();
    const double e_out = max_rel_error(out1, out), e_lse = max_rel_error(lse1, lse);
    // Gradient floors 1e-3: far below the gradients' scale (dv ~ 0.3, dq and dk ~ 0.1 here).
    const double e_dq = rel_l2_error(dq1, dq, 1e-3), e_dk = rel_l2_error(dk1, dk, 1e-3);
    const double e_dv = rel_l2_error(dv1, dv, 1e-3);
    const double m_dq = max_rel_error(dq1, dq, 1e-3), m_dk = max_rel_error(dk1, dk, 1e-3);
    const double m_dv = max_rel_error(dv1, dv, 1e-3);
    std::printf("tc attention b=%lld t=%lld h=%lld hk=%lld d=%lld docs=%lld window=%lld: out %.2e lse %.2e"
                " | rel L2 dq %.2e dk %.2e dv %.2e | max dq %.2e dk %.2e dv %.2e\n",
                (long long)c.b, (long long)c.t, (long long)c.h, (long long)c.hk, (long long)c.d,
                (long long)c.max_doc, (long long)c.window, e_out, e_lse, e_dq, e_dk, e_dv, m_dq, m_dk, m_dv);
    CHECK(e_out <= 1e-2);
    CHECK(e_lse <= 1e-5);
    CHECK(e_dq <= 2e-2);
    CHECK(e_dk <= 2e-2);
    CHECK(e_dv <= 2e-2);
    CHECK(m_dq <= 4e-2);
    CHECK(m_dk <= 4e-2);
    CHECK(m_dv <= 4e-2);

    // No atomics: a second run (blocks in another shuffled order) is bitwise equal.
    run();
    CHECK(gout.download() == out1);
    CHECK(glse.download() == lse1);
    CHECK(gdq.download() == dq1);
    CHECK(gdk.download() == dk1);
    CHECK(gdv.download() == dv1);
  }
  CHECK(error_word.download() == std::vector<int>{0});
}


// The backward stages D_i in dq before its dK dV pass reads the inputs: a dq that overlaps one of
// them is refused with an error naming the cause, before anything runs.
TEST_CASE("cuda tensor-core attention's backward refuses a dq that overlaps its inputs", "[cuda-emu][attention]") {
  auto dev = cuda_testing::test_device(size_t(16) << 20);
  if (!dev) return;
  const int64_t b = 1, t = 8, h = 2, hk = 1, d = 64, nq = b * t * h * d, nk = b * t * hk * d;
  const std::vector<float> before = random_floats(size_t(nq), 5);
  Buffer<float> q(*dev, before), k(*dev, size_t(nk)), v(*dev, size_t(nk)), dout(*dev, size_t(nq));
  Buffer<float> out(*dev, size_t(nq)), lse(*dev, size_t(b * t * h)), dk(*dev, size_t(nk)), dv(*dev, size_t(nk));
  Buffer<int> error_word(*dev, std::vector<int>{0});
  CHECK_THROWS_WITH(cuda::attention_tc_backward(q, dk, dv, dout, q, k, v, out, lse, nullptr, b, t, h, hk, d, 0.125f,
                                                0, error_word, nullptr),
                    Catch::Contains("dq overlaps an input"));
  CHECK_THROWS_WITH(cuda::attention_tc_backward(out.get() + 1, dk, dv, dout, q, k, v, out, lse, nullptr, b, t, h, hk,
                                                d, 0.125f, 0, error_word, nullptr),
                    Catch::Contains("dq overlaps an input"));
  CHECK(q.download() == before);  // nothing ran: the D_i kernel would have written q's first columns
}

}  // namespace
}  // namespace strata
