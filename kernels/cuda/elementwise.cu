// Elementwise CUDA kernels: y += x (residual adds) and the f32 <-> bf16 casts that feed bf16
// matmuls. Grid-stride loops, one element per thread per step. Casts round to nearest even,
// as src/core/bf16.h does on the CPU.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace strata::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void add_inplace_kernel(float* y, const float* x, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) y[i] += x[i];
}

__global__ void cast_f32_to_bf16_kernel(__nv_bfloat16* out, const float* in, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = bf16_from(in[i]);
}

__global__ void cast_bf16_to_f32_kernel(float* out, const __nv_bfloat16* in, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = bf16_load(in + i);
}

void elementwise_check(int64_t n, const char* what) {
  STRATA_CHECK(n >= 0, what, ": need n >= 0, got n=", n);
}

}  // namespace

void add_inplace(float* y, const float* x, int64_t n, cudaStream_t stream) {
  elementwise_check(n, "add_inplace");
  if (n == 0) return;
  STRATA_LAUNCH(add_inplace_kernel, grid_blocks(n, kThreads), kThreads, 0, stream, y, x, n);
  STRATA_CUDA_CHECK_LAUNCH("add_inplace");
}

void cast_f32_to_bf16(bf16* out, const float* in, int64_t n, cudaStream_t stream) {
  elementwise_check(n, "cast_f32_to_bf16");
  if (n == 0) return;
  auto* o = reinterpret_cast<__nv_bfloat16*>(out);
  STRATA_LAUNCH(cast_f32_to_bf16_kernel, grid_blocks(n, kThreads), kThreads, 0, stream, o, in, n);
  STRATA_CUDA_CHECK_LAUNCH("cast_f32_to_bf16");
}

void cast_bf16_to_f32(float* out, const bf16* in, int64_t n, cudaStream_t stream) {
  elementwise_check(n, "cast_bf16_to_f32");
  if (n == 0) return;
  auto* i = reinterpret_cast<const __nv_bfloat16*>(in);
  STRATA_LAUNCH(cast_bf16_to_f32_kernel, grid_blocks(n, kThreads), kThreads, 0, stream, out, i, n);
  STRATA_CUDA_CHECK_LAUNCH("cast_bf16_to_f32");
}

}  // namespace strata::cuda
