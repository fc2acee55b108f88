// GeGLU and the affine map on CUDA (twin: kernels/cpu/ref/geglu.h): out = gelu_tanh(gate) * up
// elementwise, gelu_tanh(x) = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), and its backward
// dgate = dout * up * gelu_tanh'(gate), dup = dout * gelu_tanh(gate); y = a x + b.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/geglu.h"
#include "kernels/cuda/ops.h"

namespace strata::cuda {
namespace {

constexpr int kThreads = 256;
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;

__global__ void geglu_forward_kernel(float* out, const float* gate, const float* up, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float g = gate[i];
    out[i] = 0.5f * g * (1.f + tanhf(kGeluC * (g + kGeluA * g * g * g))) * up[i];
  }
}

__global__ void geglu_backward_kernel(float* dgate, float* dup, const float* dout, const float* gate,
                                      const float* up, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float g = gate[i], dy = dout[i];
    const float th = tanhf(kGeluC * (g + kGeluA * g * g * g));
    const float grad = 0.5f * (1.f + th) + 0.5f * g * (1.f - th * th) * kGeluC * (1.f + 3.f * kGeluA * g * g);
    dgate[i] = dy * up[i] * grad;
    dup[i] = dy * (0.5f * g * (1.f + th));
  }
}

__global__ void affine_kernel(float* y, const float* x, float a, float b, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) y[i] = a * x[i] + b;
}

}  // namespace

void geglu_forward(float* out, const float* gate, const float* up, int64_t n, cudaStream_t stream) {
  STRATA_CHECK(n >= 0, "geglu_forward: need n >= 0, got n=", n);
  if (n == 0) return;
  STRATA_LAUNCH(geglu_forward_kernel, grid_blocks(n, kThreads), kThreads, 0, stream, out, gate, up, n);
  STRATA_CUDA_CHECK_LAUNCH("geglu_forward");
}

void geglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n,
                    cudaStream_t stream) {
  STRATA_CHECK(n >= 0, "geglu_backward: need n >= 0, got n=", n);
  if (n == 0) return;
  STRATA_LAUNCH(geglu_backward_kernel, grid_blocks(n, kThreads), kThreads, 0, stream, dgate, dup, dout, gate, up, n);
  STRATA_CUDA_CHECK_LAUNCH("geglu_backward");
}

void affine(float* y, const float* x, float a, float b, int64_t n, cudaStream_t stream) {
  STRATA_CHECK(n >= 0, "affine: need n >= 0, got n=", n);
  if (n == 0) return;
  STRATA_LAUNCH(affine_kernel, grid_blocks(n, kThreads), kThreads, 0, stream, y, x, a, b, n);
  STRATA_CUDA_CHECK_LAUNCH("affine");
}

}  // namespace strata::cuda
