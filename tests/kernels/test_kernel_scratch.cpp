// The scratch the CPU kernels keep on a thread from one call to the next (kernels/cpu/ops.h:
// attention's input copies, key and value transposes and kept dS, the lm_head loss's row tiles): what a thread holds
// after calls of a shape is what attention_scratch_bytes and lm_head_ce_scratch_bytes say, the
// figures the placement plan counts (src/device/device.h, cpu_backend_scratch_bytes).
#include <catch2/catch.hpp>
#include <cstdint>
#include <thread>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/scratch.h"
#include "tests/seeded_inputs.h"

using namespace strata;

namespace {

std::vector<float> ramp(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * float(int(i * 7919 % 61) - 30);
  return v;
}

struct Held {
  size_t attention = 0, loss = 0;
};

// One forward and backward of attention (b, t, h, hk, d) and one lm_head loss over n rows and
// chunks of vc vocab rows (logits recomputed, as a forward-only pass does), on a fresh thread;
// then calls of a smaller shape, which must not change what the thread holds.
Held held_after(int64_t b, int64_t t, int64_t h, int64_t hk, int64_t d, int64_t c, int64_t vc, DType dt) {
  Held held;
  std::thread worker([&] {
    for (const int64_t scale : {int64_t(1), int64_t(2)}) {  // the full shape, then half of t and n
      const int64_t tt = t / scale, n = b * tt;
      const auto q = ramp(size_t(n * h * d), 0.01f), k = ramp(size_t(n * hk * d), 0.02f);
      const auto v = ramp(size_t(n * hk * d), 0.03f), dout = ramp(size_t(n * h * d), 0.04f);
      std::vector<float> out(q.size()), lse(size_t(n * h)), dq(q.size()), dk(k.size()), dv(v.size());
      cpu::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), nullptr, b, tt, h, hk, d, 0.125f, dt);
      cpu::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(), out.data(),
                              lse.data(), nullptr, b, tt, h, hk, d, 0.125f, dt);
      const auto hid = ramp(size_t(n * c), 0.05f), w = ramp(size_t(vc * c), 0.01f);
      std::vector<bf16> wb(w.size());
      for (size_t i = 0; i < w.size(); ++i) wb[i] = f32_to_bf16(w[i]);
      const auto targets = testing::make_targets(n, 2 * vc, 0, 3);
      std::vector<double> stats(size_t(3 * n));
      std::vector<float> dh(size_t(n * c), 0.f), dw(size_t(vc * c), 0.f);
      if (dt == DType::bf16) {
        cpu::lm_head_ce_chunk_stats_bf16(stats.data(), hid.data(), wb.data(), targets.data(), n, c, 2 * vc, 0, vc, true,
                                         nullptr);
        cpu::lm_head_ce_chunk_backward_bf16(dh.data(), dw.data(), hid.data(), wb.data(), stats.data(), targets.data(),
                                            n, c, 2 * vc, 0, vc, 1.f, nullptr);
      } else {
        cpu::lm_head_ce_chunk_stats(stats.data(), hid.data(), w.data(), targets.data(), n, c, 2 * vc, 0, vc, true,
                                    nullptr);
        cpu::lm_head_ce_chunk_backward(dh.data(), dw.data(), hid.data(), w.data(), stats.data(), targets.data(), n, c,
                                       2 * vc, 0, vc, 1.f, nullptr);
      }
      if (scale == 1) held = {cpu::attention_scratch_held_bytes(), cpu::lm_head_ce_scratch_held_bytes()};
    }
    CHECK(cpu::attention_scratch_held_bytes() == held.attention);  // the smaller calls fit in it
    CHECK(cpu::lm_head_ce_scratch_held_bytes() == held.loss);
  });
  worker.join();
  return held;
}

}  // namespace

TEST_CASE("the CPU kernels keep the scratch they say they keep, sized by the largest call", "[kernels][scratch]") {
  struct Case {
    int64_t b, t, h, hk, d, c, vc;
  };
  // T 200: 4 query tiles (the kept dS: 10 tile pairs per head); vc 3000: bf16 row tiles of 699
  // rows, two of them over 800 rows; vc 20000: tiles of 128 rows
  for (const Case k : {Case{4, 200, 4, 2, 32, 48, 3000}, Case{1, 300, 2, 1, 16, 24, 20000}}) {
    for (const DType dt : {DType::bf16, DType::f32}) {
      INFO("b=" << k.b << " t=" << k.t << " vc=" << k.vc << " " << dtype_name(dt));
      const Held held = held_after(k.b, k.t, k.h, k.hk, k.d, k.c, k.vc, dt);
      const size_t attention = cpu::attention_scratch_bytes(k.b, k.t, k.h, k.hk, k.d, dt, cpu::attention_isa_active());
      const size_t loss = cpu::lm_head_ce_scratch_bytes(k.b * k.t, k.c, k.vc, dt);
      CHECK(held.attention == attention);
      CHECK(held.loss == loss);
      // f32 dots keep the inputs head-major and the keys' and values' transposes,
      // (B, Hk, D, T rounded up to 64, plus 16), in f32
      const int64_t tp = (k.t + 63) / 64 * 64 + 16;
      const size_t portable = size_t(2 * k.b * k.hk * k.d * tp + 2 * k.b * k.t * (k.h + k.hk) * k.d) * 4;
      if (dt == DType::f32) CHECK(attention == portable);
      else CHECK(attention > size_t(2 * k.b * k.t * (k.h + k.hk) * k.d) * 2 - 1);  // at least the inputs' copies
      CHECK(loss > 0);
    }
  }
  // sizes that cannot be a loss call are refused, not divided by
  CHECK_THROWS_WITH(cpu::lm_head_ce_scratch_bytes(32, 64, 0, DType::bf16), Catch::Contains("vc=0"));
  CHECK_THROWS_WITH(cpu::lm_head_ce_scratch_bytes(-1, 64, 256, DType::f32), Catch::Contains("n=-1"));
  // a kept dS larger than the cap is recomputed, not kept: the vdpbf16ps and AMX kernels keep the
  // inputs' bf16 copies, the portable one their roundings in f32 (head-major) and the transposes
  const bool portable = cpu::attention_isa_active() == cpu::AttentionIsa::portable;
  CHECK(cpu::attention_scratch_bytes(1, 512, 8, 8, 64, DType::bf16, cpu::attention_isa_active(), 0) ==
        (portable ? size_t(2 * 512 * 16 * 64) * 4 + size_t(2 * 8 * 64 * (512 + 16)) * 4 : size_t(2 * 512 * 16 * 64) * 2));
}

// The scratch the AMX kernels pack into starts on a 64-byte line whatever malloc would do, and
// stays on one as scratch_grow grows it (kernels/cpu/scratch.h: tile rows straddling two lines
// ran the AMX GEMM tile at half its rate). Sizes that malloc would place 16 bytes past a line
// (large blocks come from mmap with a 16-byte header) and small ones from the heap.
TEST_CASE("LineVector scratch starts on a 64-byte line, before and after it grows", "[kernels][scratch]") {
  for (const size_t n : {size_t(1), size_t(3), size_t(17), size_t(1000), size_t(1) << 16, size_t(1) << 20}) {
    cpu::LineVector<uint32_t> words;
    const uint32_t* p = cpu::scratch_grow(words, n);
    CHECK(reinterpret_cast<uintptr_t>(p) % 64 == 0);
    CHECK(words.size() == n);
    p = cpu::scratch_grow(words, 3 * n + 5);  // a grown block: a new allocation
    CHECK(reinterpret_cast<uintptr_t>(p) % 64 == 0);
    CHECK(words.size() == 3 * n + 5);
    cpu::LineVector<float> floats(n + 1);
    CHECK(reinterpret_cast<uintptr_t>(floats.data()) % 64 == 0);
  }
}
