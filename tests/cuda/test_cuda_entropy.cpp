// The CUDA stats pass with the softmax entropy (kernels/cuda/cross_entropy.cu,
// Device::lm_head_ce_chunk_stats_entropy) against its CPU twin (kernels/cpu/cross_entropy.cpp) on
// the same seeded inputs, f32 and bf16 heads, over vocab chunks whose logits grow from chunk to
// chunk (the running max moves), with ignored rows, a tile's worth of rows and more, and logits
// kept for the backward; and its stats equal to the plain stats pass's bits on the same device.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/ops.h"
#include "tests/cuda/cuda_testing.h"
#include "tests/seeded_inputs.h"
#include "tests/testing.h"

namespace strata {
namespace {

using cuda_testing::Buffer;

struct Run {
  std::vector<double> stats, ent;
};

// Over chunks of `rows` vocab rows on `dev` (each chunk's weights in their own buffer, as the
// engine streams them); entropy false: the plain stats pass.
Run device_stats(Device& dev, const std::vector<float>& h, const std::vector<float>& w, DType wt,
                 const std::vector<int32_t>& targets, int64_t n, int64_t c, int64_t v, int64_t rows, bool entropy,
                 bool keep) {
  Buffer<float> bh(dev, h);
  Buffer<int32_t> bt(dev, targets);
  Buffer<double> bstats(dev, std::vector<double>(size_t(3 * n), -7.0)), bent(dev, std::vector<double>(size_t(n), -5.0));
  Buffer<float> kept(dev, size_t(n * rows));
  for (int64_t v0 = 0, k = 0; v0 < v; v0 += rows, ++k) {
    const int64_t vc = std::min(rows, v - v0);
    const std::vector<float> part(w.begin() + long(v0 * c), w.begin() + long((v0 + vc) * c));
    std::unique_ptr<Buffer<float>> w32;
    std::unique_ptr<Buffer<bf16>> w16;
    const void* wp = nullptr;
    if (wt == DType::bf16) {
      w16 = std::make_unique<Buffer<bf16>>(dev, testing::to_bf16(part));
      wp = w16->get();
    } else {
      w32 = std::make_unique<Buffer<float>>(dev, part);
      wp = w32->get();
    }
    float* kp = keep ? kept.get() : nullptr;
    if (entropy)
      dev.lm_head_ce_chunk_stats_entropy(bstats, bent, bh, wp, wt, bt, n, c, v, v0, vc, k == 0, kp, Stream::compute);
    else
      dev.lm_head_ce_chunk_stats(bstats, bh, wp, wt, bt, n, c, v, v0, vc, k == 0, kp, Stream::compute);
    dev.synchronize();  // the chunk's buffers go at the end of the iteration
  }
  return {bstats.download(), bent.download()};
}

}  // namespace

TEST_CASE("the CUDA stats pass with entropy matches its CPU twin", "[cuda-emu][grpo][kernels]") {
  auto dev = cuda_testing::test_device();
  if (!dev) return;
  struct Case {
    int64_t n, c, v, rows;
  };
  const Case cases[] = {{5, 7, 33, 33}, {19, 13, 300, 77}, {150, 9, 65, 16}, {3, 4, 17, 1}};
  int idx = 0;
  for (const Case cs : cases) {
    ++idx;
    for (const DType wt : {DType::f32, DType::bf16}) {
      for (const bool keep : {false, true}) {
        INFO("case " << idx << (wt == DType::bf16 ? " bf16" : " f32") << (keep ? " kept logits" : ""));
        auto h = testing::random_floats(size_t(cs.n * cs.c), 400 + uint64_t(idx), -2.f, 2.f);
        auto w = testing::random_floats(size_t(cs.v * cs.c), 500 + uint64_t(idx), -1.f, 1.f);
        for (int64_t j = 0; j < cs.v; ++j)
          for (int64_t e = 0; e < cs.c; ++e) w[size_t(j * cs.c + e)] *= 1.f + 3.f * float(j) / float(cs.v);
        const auto targets = testing::make_targets(cs.n, cs.v, 4, 600 + uint64_t(idx));
        const Run got = device_stats(*dev, h, w, wt, targets, cs.n, cs.c, cs.v, cs.rows, true, keep);
        const Run plain = device_stats(*dev, h, w, wt, targets, cs.n, cs.c, cs.v, cs.rows, false, keep);
        CHECK(std::memcmp(got.stats.data(), plain.stats.data(), got.stats.size() * sizeof(double)) == 0);
        // the CPU twin
        std::vector<double> stats(size_t(3 * cs.n), -7.0), ent(size_t(cs.n), -5.0);
        const std::vector<bf16> wb = testing::to_bf16(w);
        for (int64_t v0 = 0, k = 0; v0 < cs.v; v0 += cs.rows, ++k) {
          const int64_t vc = std::min(cs.rows, cs.v - v0);
          if (wt == DType::bf16)
            cpu::lm_head_ce_chunk_stats_entropy_bf16(stats.data(), ent.data(), h.data(), wb.data() + v0 * cs.c,
                                                     targets.data(), cs.n, cs.c, cs.v, v0, vc, k == 0, nullptr);
          else
            cpu::lm_head_ce_chunk_stats_entropy(stats.data(), ent.data(), h.data(), w.data() + v0 * cs.c,
                                                targets.data(), cs.n, cs.c, cs.v, v0, vc, k == 0, nullptr);
        }
        // the entropies H = log(sum) - ent / sum of the counted rows: f32 logits and exps on both
        // sides, summed in different orders
        double worst = 0, scale = 0;
        for (int64_t i = 0; i < cs.n; ++i) {
          if (targets[size_t(i)] == -100) {
            CHECK(got.ent[size_t(i)] == 0.0);
            continue;
          }
          const double hg = std::log(got.stats[3 * i + 1]) - got.ent[size_t(i)] / got.stats[3 * i + 1];
          const double hc = std::log(stats[3 * i + 1]) - ent[size_t(i)] / stats[3 * i + 1];
          worst = std::max(worst, std::abs(hg - hc));
          scale = std::max(scale, std::abs(hc));
        }
        REQUIRE(scale > 0.1);
        CHECK(worst <= 1e-5 * scale);
      }
    }
  }
}

}  // namespace strata
