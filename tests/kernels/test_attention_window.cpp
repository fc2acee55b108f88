// Sliding-window attention on the CPU (kernels/cpu/attention*.cpp, window > 0): every ISA the CPU
// has, f32 and bf16 dots, against the fp64 twin with the same window (kernels/cpu/ref/attention.h,
// itself checked by finite differences in test_attention.cpp) at awkward sizes: windows of one
// token, shorter than a tile, a tile and one more, longer than T; T across tile boundaries; packed
// documents shorter and longer than the window; GQA. And the cached (decode) kernel's window
// against its twin and against the windowed prefill.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <vector>

#include "kernels/cpu/attention_cached.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/ref.h"
#include "kernels/cpu/ref/attention_cached.h"
#include "tests/seeded_inputs.h"
#include "tests/testing.h"

using namespace strata;
using strata::testing::convert;
using strata::testing::max_rel_error;
using strata::testing::random_floats;

namespace {

std::vector<cpu::AttentionIsa> supported_isas() {
  std::vector<cpu::AttentionIsa> isas;
  for (auto isa : {cpu::AttentionIsa::portable, cpu::AttentionIsa::avx512_bf16, cpu::AttentionIsa::amx_bf16})
    if (cpu::attention_isa_supported(isa)) isas.push_back(isa);
  return isas;
}

std::vector<float> round_bf16(const std::vector<float>& x) {
  std::vector<float> r(x.size());
  for (size_t i = 0; i < x.size(); ++i) r[i] = bf16_to_f32(f32_to_bf16(x[i]));
  return r;
}

}  // namespace

TEST_CASE("attention with a sliding window matches the fp64 twin on every ISA", "[kernels][window]") {
  // Tolerances of test_attention.cpp's awkward-size cases (inf-norm relative, floor 0.1): f32
  // 1e-5 everywhere; bf16 dots against the twin on rounded inputs with rounded backward weights:
  // the forward 1e-5, the backward 4e-3 (a weight within f32 rounding of a bf16 tie).
  const double floor = 0.1;
  int idx = 0;
  for (const cpu::AttentionIsa isa : supported_isas())
    for (const DType dot_type : {DType::f32, DType::bf16}) {
      if (isa != cpu::AttentionIsa::portable && dot_type == DType::f32) continue;  // f32 dots: one kernel
      const bool bf16 = dot_type == DType::bf16;
      double worst_fwd = 0, worst_bwd = 0;
      for (const int64_t t : {17, 130, 200})
        for (const int64_t window : {1, 7, 64, 65, 150}) {
          ++idx;
          const int64_t b = 2, h = 6, hk = 2, d = 24;
          const int64_t nq = b * t * h * d, nk = b * t * hk * d;
          auto in = [&](std::vector<float> x) { return bf16 ? round_bf16(x) : x; };
          const auto q = in(random_floats(static_cast<size_t>(nq), 5000 + idx, -2.f, 2.f));
          const auto k = in(random_floats(static_cast<size_t>(nk), 6000 + idx, -2.f, 2.f));
          const auto v = in(random_floats(static_cast<size_t>(nk), 7000 + idx));
          const auto dout = in(random_floats(static_cast<size_t>(nq), 8000 + idx));
          // no documents, or documents of 40 tokens (longer and shorter than the windows)
          const std::vector<int32_t> docs = testing::make_doc_start(b, t, 40, idx);
          const int32_t* ds = idx % 2 ? docs.data() : nullptr;
          const float scale = 1.f / std::sqrt(float(d));
          std::vector<float> out(static_cast<size_t>(nq)), lse(static_cast<size_t>(b * t * h)), dq(static_cast<size_t>(nq)), dk(static_cast<size_t>(nk)), dv(static_cast<size_t>(nk));
          cpu::attention_forward_isa(out.data(), lse.data(), q.data(), k.data(), v.data(), ds, b, t, h, hk, d, scale,
                                     dot_type, isa, window);
          cpu::attention_backward_isa(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(),
                                      out.data(), lse.data(), ds, b, t, h, hk, d, scale, dot_type, isa,
                                      cpu::kAttentionStoredDsMaxBytes, window);
          std::vector<double> ro(static_cast<size_t>(nq)), rl(lse.size()), rdq(static_cast<size_t>(nq)), rdk(static_cast<size_t>(nk)), rdv(static_cast<size_t>(nk));
          const auto qd = convert<double>(q), kd = convert<double>(k), vd = convert<double>(v);
          const auto dod = convert<double>(dout);
          ref::attention_forward(ro.data(), rl.data(), qd.data(), kd.data(), vd.data(), ds, b, t, h, hk, d,
                                 double(scale), window);
          ref::attention_backward(rdq.data(), rdk.data(), rdv.data(), dod.data(), qd.data(), kd.data(), vd.data(),
                                  ro.data(), rl.data(), ds, b, t, h, hk, d, double(scale), bf16, window);
          const double e_fwd = std::max(max_rel_error(out, ro, floor), max_rel_error(lse, rl, floor));
          const double e_bwd = std::max({max_rel_error(dq, rdq, floor), max_rel_error(dk, rdk, floor),
                                         max_rel_error(dv, rdv, floor)});
          INFO(cpu::attention_isa_name(isa) << " " << dtype_name(dot_type) << " t=" << t << " window=" << window
                                            << (ds ? " docs" : "") << " fwd " << e_fwd << " bwd " << e_bwd);
          CHECK(e_fwd <= 1e-5);
          CHECK(e_bwd <= (bf16 ? 4e-3 : 1e-5));
          worst_fwd = std::max(worst_fwd, e_fwd), worst_bwd = std::max(worst_bwd, e_bwd);
          if (window < t && window > 1) {  // the window masks: the unwindowed twin differs
            std::vector<double> full(ro.size()), full_lse(rl.size());
            ref::attention_forward(full.data(), full_lse.data(), qd.data(), kd.data(), vd.data(), ds, b, t, h, hk,
                                   d, double(scale));
            if (!ds || window < 40) CHECK(max_rel_error(out, full, floor) > 1e-3);
          }
        }
      std::printf("attention window %s %s: worst fwd %.2e bwd %.2e\n", cpu::attention_isa_name(isa),
                  dtype_name(dot_type), worst_fwd, worst_bwd);
    }
}

TEST_CASE("cached attention with a sliding window matches its twin and the windowed prefill",
          "[kernels][window][attention_cached]") {
  const int64_t B = 2, H = 4, Hk = 2, D = 20, T = 90;
  const float scale = 0.3f;
  for (const int64_t window : {1, 5, 64, 200}) {
    INFO("window " << window);
    // the whole sequence as queries against a cache holding it: the windowed causal attention
    const auto q = random_floats(static_cast<size_t>(B * T * H * D), 11, -2.f, 2.f);
    const auto k = random_floats(static_cast<size_t>(B * T * Hk * D), 12, -2.f, 2.f);
    const auto v = random_floats(static_cast<size_t>(B * T * Hk * D), 13);
    const std::vector<int32_t> start(static_cast<size_t>(B), 0);
    std::vector<float> cached(q.size()), prefill(q.size()), lse(static_cast<size_t>(B * T * H));
    cpu::attention_cached_forward(cached.data(), q.data(), k.data(), v.data(), start.data(), B, T, T, H, Hk, D, scale,
                                  DType::f32, window);
    cpu::attention_forward(prefill.data(), lse.data(), q.data(), k.data(), v.data(), nullptr, B, T, H, Hk, D, scale,
                           DType::f32, window);
    CHECK(max_rel_error(cached, prefill) <= 1e-5);
    // decode steps from later starts against the fp64 twin
    const int64_t tq = 3, tcap = T;
    const std::vector<int32_t> later = {40, 77};
    std::vector<float> out(static_cast<size_t>(B * tq * H * D));
    const auto qs = random_floats(out.size(), 14, -2.f, 2.f);
    cpu::attention_cached_forward(out.data(), qs.data(), k.data(), v.data(), later.data(), B, tq, tcap, H, Hk, D,
                                  scale, DType::f32, window);
    std::vector<double> want(out.size());
    const auto qd = convert<double>(qs), kd = convert<double>(k), vd = convert<double>(v);
    ref::attention_cached_forward(want.data(), qd.data(), kd.data(), vd.data(), later.data(), B, tq, tcap, H, Hk, D,
                                  double(scale), window);
    CHECK(max_rel_error(out, want) <= 1e-5);
  }
}
