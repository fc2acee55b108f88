// The CPU fast path of the vocab-chunked lm_head + cross-entropy driven as the engine drives it,
// shared by the CPU kernel tests and the CUDA tests that compare against it.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cpu/ops.h"
#include "src/core/bf16.h"
#include "src/core/dtype.h"
#include "tests/testing.h"

namespace strata::testing {

struct ChunkedResult {
  double loss = 0;
  std::vector<float> dh, dw;
};

// Over chunks of `rows` vocab rows: the stats pass chunk by chunk forward, then the backward chunk
// by chunk in reverse. w (V, C) is used in f32, or rounded to bf16 when wt is bf16; dh starts at
// zero, dw at dw0 (the kernels accumulate into it).
inline ChunkedResult ce_chunked_cpu(const std::vector<float>& h, const std::vector<float>& w, DType wt,
                                    const std::vector<int32_t>& targets, int64_t n, int64_t c, int64_t v,
                                    int64_t rows, float grad_scale, const std::vector<float>& dw0,
                                    bool with_dw = true,  // false: dw null (frozen head), r.dw stays dw0
                                    bool keep = false) {  // true: the backward reads the logits the stats pass kept
  const bool bf = wt == DType::bf16;
  const std::vector<bf16> wb = bf ? to_bf16(w) : std::vector<bf16>();
  std::vector<double> stats(size_t(3 * n), -7.0);  // garbage: the first chunk must initialise
  const int64_t chunks = (v + rows - 1) / rows;
  std::vector<std::vector<float>> kept(keep ? size_t(chunks) : 0, std::vector<float>(size_t(n * rows), -3.f));
  auto kept_of = [&](int64_t k) { return keep ? kept[size_t(k)].data() : nullptr; };
  for (int64_t k = 0; k < chunks; ++k) {
    const int64_t v0 = k * rows, vc = std::min(rows, v - v0);
    if (bf)
      cpu::lm_head_ce_chunk_stats_bf16(stats.data(), h.data(), wb.data() + v0 * c, targets.data(), n, c, v, v0, vc,
                                       k == 0, kept_of(k));
    else
      cpu::lm_head_ce_chunk_stats(stats.data(), h.data(), w.data() + v0 * c, targets.data(), n, c, v, v0, vc, k == 0,
                                  kept_of(k));
  }
  ChunkedResult r;
  int64_t count = 0;
  r.loss = cpu::lm_head_ce_stats_loss(&count, stats.data(), targets.data(), n, v);
  r.dh.assign(size_t(n * c), 0.f);
  r.dw = dw0;
  for (int64_t k = chunks - 1; k >= 0; --k) {
    const int64_t v0 = k * rows, vc = std::min(rows, v - v0);
    if (bf)
      cpu::lm_head_ce_chunk_backward_bf16(r.dh.data(), with_dw ? r.dw.data() + v0 * c : nullptr, h.data(), wb.data() + v0 * c,
                                          stats.data(), targets.data(), n, c, v, v0, vc, grad_scale, kept_of(k));
    else
      cpu::lm_head_ce_chunk_backward(r.dh.data(), with_dw ? r.dw.data() + v0 * c : nullptr, h.data(), w.data() + v0 * c, stats.data(),
                                     targets.data(), n, c, v, v0, vc, grad_scale, kept_of(k));
  }
  return r;
}

}  // namespace strata::testing
