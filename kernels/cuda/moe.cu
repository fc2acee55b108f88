// The mixture-of-experts combine ops on CUDA (twin: kernels/cpu/ref/moe.h, fast CPU path
// kernels/cpu/moe.cpp). The forward gathers each token's k expert rows in routing order (no
// atomics: a thread owns one output element); the backward's dot per row is one block's
// fixed-shape reduction. Both deterministic.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/moe.h"

namespace strata::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kDotThreads = 128;  // backward: one block per routed row

__global__ void moe_combine_forward_kernel(float* out, const float* y, const float* w, const int32_t* token_row,
                                           int64_t n, int64_t k, int64_t c) {
  const int64_t total = n * c, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const int64_t t = e / c, i = e % c;
    float acc = 0.f;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t r = token_row[t * k + j];
      acc += (w ? w[r] : 1.f) * y[r * c + i];
    }
    out[e] += acc;
  }
}

// grid (m), block (kDotThreads).
__global__ void moe_combine_backward_kernel(float* dy, float* dw, const float* dout, const float* y, const float* w,
                                            const int32_t* row_token, int64_t c) {
  __shared__ float scratch[kWarp];
  const int64_t r = blockIdx.x;
  const float* g = dout + int64_t(row_token[r]) * c;  // (c)
  const float wr = w[r];
  float dot = 0.f;
  for (int64_t i = threadIdx.x; i < c; i += kDotThreads) {
    dy[r * c + i] = wr * g[i];
    dot += g[i] * y[r * c + i];
  }
  dot = block_sum(dot, scratch);
  if (dw && threadIdx.x == 0) dw[r] = dot;
}

}  // namespace

void moe_combine_forward(float* out, const float* y, const float* w, const int32_t* token_row, int64_t n, int64_t k,
                         int64_t c, cudaStream_t stream) {
  STRATA_CHECK(n >= 0 && k > 0 && c > 0, "moe_combine_forward: need n >= 0, k > 0, c > 0, got n=", n, " k=", k,
               " c=", c);
  if (n == 0) return;
  STRATA_LAUNCH(moe_combine_forward_kernel, grid_blocks(n * c, kThreads), kThreads, 0, stream, out, y, w, token_row,
                n, k, c);
  STRATA_CUDA_CHECK_LAUNCH("moe_combine_forward");
}

void moe_combine_backward(float* dy, float* dw, const float* dout, const float* y, const float* w,
                          const int32_t* row_token, int64_t m, int64_t c, cudaStream_t stream) {
  STRATA_CHECK(m >= 0 && c > 0, "moe_combine_backward: need m >= 0 and c > 0, got m=", m, " c=", c);
  if (m == 0) return;
  STRATA_CHECK(m <= 0x7fffffff, "moe_combine_backward: too many routed rows (", m, ")");
  STRATA_LAUNCH(moe_combine_backward_kernel, unsigned(m), kDotThreads, 0, stream, dy, dw, dout, y, w, row_token, c);
  STRATA_CUDA_CHECK_LAUNCH("moe_combine_backward");
}

}  // namespace strata::cuda
