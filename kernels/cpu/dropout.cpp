// LoRA dropout, the CPU fast path and its plain-loop twin (kernels/cpu/dropout.h,
// kernels/cpu/ref/dropout.h). Compiled with -ffp-contract=off and STRATA_ZO_NO_CONTRACT
// (CMakeLists.txt): out + in · scale is two roundings here, as on the GPU.
#include "kernels/cpu/dropout.h"

#include "kernels/common/dropout_mask.h"
#include "kernels/cpu/ref/dropout.h"
#include "src/core/error.h"

#if !defined(STRATA_ZO_NO_CONTRACT)
#error "kernels/cpu/dropout.cpp must be compiled with -ffp-contract=off -DSTRATA_ZO_NO_CONTRACT"
#endif

namespace strata {
namespace {

constexpr int64_t kParallelMin = 1 << 14;  // elements; fewer are not worth waking threads

void dropout_check(double p, int64_t n) {
  STRATA_CHECK(n >= 0, "dropout: need n >= 0, got n=", n);
  STRATA_CHECK(p >= 0.0 && p < 1.0, "dropout: the probability must be in [0, 1), got ", p);
}

// Element i of the output from its keep bit.
inline float dropout_one(float out, float in, bool keep, float scale, bool accumulate) {
  const float v = keep ? zo::zo_mul(in, scale) : 0.0f;
  return accumulate ? zo::zo_add(out, v) : v;
}

}  // namespace

void cpu::dropout_apply(float* out, const float* in, uint64_t seed, uint32_t tensor, double p, int64_t n,
                        bool accumulate) {
  dropout_check(p, n);
  const uint32_t threshold = dropout::dropout_threshold(p);
  const float scale = dropout::dropout_scale(p);
  const int64_t blocks = (n + 3) / 4;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t b = 0; b < blocks; ++b) {  // one Philox call per 4 elements
    const uint32_t keep = dropout::dropout_keep4(seed, tensor, uint64_t(b), threshold);
    const int64_t end = n - 4 * b < 4 ? n - 4 * b : 4;
    for (int64_t l = 0; l < end; ++l) {
      const int64_t i = 4 * b + l;
      out[i] = dropout_one(out[i], in[i], (keep >> l) & 1u, scale, accumulate);
    }
  }
}

void ref::dropout_apply(float* out, const float* in, uint64_t seed, uint32_t tensor, double p, int64_t n,
                        bool accumulate) {
  dropout_check(p, n);
  for (int64_t i = 0; i < n; ++i) {
    uint32_t w[4];
    zo::zo_block_words(seed, tensor, uint64_t(i) / 4, w[0], w[1], w[2], w[3]);
    const bool keep = w[i % 4] >= uint32_t(p * 4294967296.0);
    out[i] = dropout_one(out[i], in[i], keep, float(1.0 / (1.0 - p)), accumulate);
  }
}

}  // namespace strata
