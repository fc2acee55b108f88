// LoRA dropout on CUDA (twin: kernels/cpu/ref/dropout.h, equal bit for bit): out = mask · in /
// (1 − p), or out += that, the mask from kernels/common/dropout_mask.h. The product and the sum are
// __fmul_rn / __fadd_rn (zo_mul / zo_add), and the file is built with -fmad=false
// (kernels/cuda/cuda.cmake), so nothing is contracted and the bits equal the CPU's
// (tests/cuda/test_cuda_dropout.cpp). One thread per Philox block (4 consecutive elements), grid-stride.
#include "kernels/common/dropout_mask.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dropout.h"

namespace strata::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void dropout_kernel(float* out, const float* in, uint64_t seed, uint32_t tensor, uint32_t threshold,
                               float scale, int64_t n, bool accumulate) {
  const int64_t blocks = (n + 3) / 4;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; b < blocks; b += stride) {
    const uint32_t keep = dropout::dropout_keep4(seed, tensor, uint64_t(b), threshold);
    const int64_t end = n - 4 * b < 4 ? n - 4 * b : 4;
    for (int64_t l = 0; l < end; ++l) {
      const int64_t i = 4 * b + l;
      const float v = ((keep >> l) & 1u) ? zo::zo_mul(in[i], scale) : 0.0f;
      out[i] = accumulate ? zo::zo_add(out[i], v) : v;
    }
  }
}

}  // namespace

void dropout_apply(float* out, const float* in, uint64_t seed, uint32_t tensor, double p, int64_t n,
                   bool accumulate, cudaStream_t stream) {
  STRATA_CHECK(n >= 0, "dropout: need n >= 0, got n=", n);
  STRATA_CHECK(p >= 0.0 && p < 1.0, "dropout: the probability must be in [0, 1), got ", p);
  if (n == 0) return;
  STRATA_LAUNCH(dropout_kernel, grid_blocks((n + 3) / 4, kThreads), kThreads, 0, stream, out, in, seed, tensor,
                dropout::dropout_threshold(p), dropout::dropout_scale(p), n, accumulate);
  STRATA_CUDA_CHECK_LAUNCH("dropout");
}

}  // namespace strata::cuda
