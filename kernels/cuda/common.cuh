// Shared pieces of the CUDA kernels: the launch macro, error checks with file, line and the
// call, warp and block reductions, grid sizing, bf16 conversions and the kernel error word.
// Included by every kernels/cuda/*.cu file; compiled by nvcc for the GPU and by g++ against the
// project's CUDA emulator (tools/cuemu) for tests, so only what both run is used here:
// _sync warp intrinsics, static __shared__ arrays, no inline PTX.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/launch.h"
#include "kernels/cuda/ops.h"
#include "src/core/error.h"

namespace strata::cuda {

// Checks a CUDA runtime call; the message carries the call, its file and line.
#define STRATA_CUDA_CHECK(call)                                                            \
  do {                                                                                     \
    const cudaError_t strata_cuda_status = (call);                                         \
    STRATA_CHECK(strata_cuda_status == cudaSuccess, __FILE__, ":", __LINE__, ": ", #call,  \
                 " failed: ", cudaGetErrorString(strata_cuda_status));                     \
  } while (0)

// After a launch: a bad configuration shows up here, not at the next synchronize.
#define STRATA_CUDA_CHECK_LAUNCH(what) STRATA_CUDA_CHECK(cudaGetLastError())

constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int64_t kMaxGridX = int64_t(1) << 20;  // grid-stride loops cap the block count here

// Blocks for n items at `per_block` items each, capped (kernels then loop grid-stride).
inline unsigned grid_blocks(int64_t n, int64_t per_block) {
  int64_t blocks = (n + per_block - 1) / per_block;
  if (blocks < 1) blocks = 1;
  if (blocks > kMaxGridX) blocks = kMaxGridX;
  return unsigned(blocks);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int off = kWarp / 2; off > 0; off /= 2) v += __shfl_xor_sync(kFullMask, v, off);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
  for (int off = kWarp / 2; off > 0; off /= 2) v += __shfl_xor_sync(kFullMask, v, off);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int off = kWarp / 2; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, off));
  return v;
}

// Sum over a block whose size is a multiple of 32 (at most 1024); every thread gets the result.
// Fixed shape, fixed order: deterministic. `scratch` holds 32 values; the trailing barrier
// lets the caller reuse it at once.
template <class T>
__device__ __forceinline__ T block_sum(T v, T* scratch) {
  const int lane = int(threadIdx.x) % kWarp, warp = int(threadIdx.x) / kWarp;
  const int warps = int(blockDim.x) / kWarp;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T total = T(0);
  for (int w = 0; w < warps; ++w) total += scratch[w];
  __syncthreads();
  return total;
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = int(threadIdx.x) % kWarp, warp = int(threadIdx.x) / kWarp;
  const int warps = int(blockDim.x) / kWarp;
  v = warp_max(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float m = scratch[0];
  for (int w = 1; w < warps; ++w) m = fmaxf(m, scratch[w]);
  __syncthreads();
  return m;
}

__device__ __forceinline__ void kernel_error_raise(int* error_word, int bit) {
  if (error_word) atomicOr(error_word, bit);
}

__device__ __forceinline__ float bf16_load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ __nv_bfloat16 bf16_from(float x) { return __float2bfloat16_rn(x); }

}  // namespace strata::cuda
