// SwiGLU on CUDA (twin: kernels/cpu/ref/swiglu.h): out = silu(gate) * up, elementwise, and its
// backward dgate = dout * up * s * (1 + g (1 - s)), dup = dout * silu(g), s = sigmoid(g).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace strata::cuda {
namespace {

constexpr int kThreads = 256;

// out_b null: the f32 output only; else also its bf16 rounding (cast_f32_to_bf16's bits).
__global__ void swiglu_forward_kernel(float* out, __nv_bfloat16* out_b, const float* gate, const float* up,
                                      int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float g = gate[i];
    const float s = 1.f / (1.f + expf(-g));
    const float y = g * s * up[i];
    out[i] = y;
    if (out_b) out_b[i] = bf16_from(y);
  }
}

__device__ inline void store_grad(float* p, float x) { *p = x; }
__device__ inline void store_grad(__nv_bfloat16* p, float x) { *p = bf16_from(x); }

// T float, or __nv_bfloat16 for the bf16 matmuls' operands (the f32 values, rounded as
// cast_f32_to_bf16 rounds).
template <class T>
__global__ void swiglu_backward_kernel(T* dgate, T* dup, const float* dout, const float* gate,
                                       const float* up, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float g = gate[i], u = up[i], dy = dout[i];
    const float s = 1.f / (1.f + expf(-g));
    store_grad(dgate + i, dy * u * s * (1.f + g * (1.f - s)));
    store_grad(dup + i, dy * g * s);
  }
}

}  // namespace

void swiglu_forward(float* out, const float* gate, const float* up, int64_t n,
                    cudaStream_t stream) {
  STRATA_CHECK(n >= 0, "swiglu_forward: need n >= 0, got n=", n);
  if (n == 0) return;
  STRATA_LAUNCH(swiglu_forward_kernel, grid_blocks(n, kThreads), kThreads, 0, stream, out, nullptr,
                gate, up, n);
  STRATA_CUDA_CHECK_LAUNCH("swiglu_forward");
}

void swiglu_forward_bf16(float* out, bf16* out_b, const float* gate, const float* up, int64_t n,
                         cudaStream_t stream) {
  STRATA_CHECK(n >= 0, "swiglu_forward_bf16: need n >= 0, got n=", n);
  if (n == 0) return;
  STRATA_LAUNCH(swiglu_forward_kernel, grid_blocks(n, kThreads), kThreads, 0, stream, out,
                reinterpret_cast<__nv_bfloat16*>(out_b), gate, up, n);
  STRATA_CUDA_CHECK_LAUNCH("swiglu_forward_bf16");
}

void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                     const float* up, int64_t n, cudaStream_t stream) {
  STRATA_CHECK(n >= 0, "swiglu_backward: need n >= 0, got n=", n);
  if (n == 0) return;
  STRATA_LAUNCH(swiglu_backward_kernel<float>, grid_blocks(n, kThreads), kThreads, 0, stream, dgate,
                dup, dout, gate, up, n);
  STRATA_CUDA_CHECK_LAUNCH("swiglu_backward");
}

void swiglu_backward_bf16(bf16* dgate, bf16* dup, const float* dout, const float* gate,
                          const float* up, int64_t n, cudaStream_t stream) {
  STRATA_CHECK(n >= 0, "swiglu_backward_bf16: need n >= 0, got n=", n);
  if (n == 0) return;
  STRATA_LAUNCH(swiglu_backward_kernel<__nv_bfloat16>, grid_blocks(n, kThreads), kThreads, 0, stream,
                reinterpret_cast<__nv_bfloat16*>(dgate), reinterpret_cast<__nv_bfloat16*>(dup), dout, gate,
                up, n);
  STRATA_CUDA_CHECK_LAUNCH("swiglu_backward_bf16");
}

}  // namespace strata::cuda
