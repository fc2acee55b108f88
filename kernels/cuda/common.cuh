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

#include "kernels/cuda/check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/ops.h"
#include "src/core/error.h"

namespace strata::cuda {

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

// The first half of a block reduction over a block whose size is a multiple of 32 (at most 1024):
// each warp's sum (or max, kMax) in scratch[warp], then a barrier. Returns the number of warps.
template <bool kMax, class T>
__device__ __forceinline__ int block_partials(T v, T* scratch) {
  const int lane = int(threadIdx.x) % kWarp, warp = int(threadIdx.x) / kWarp;
  if constexpr (kMax) v = warp_max(v);
  else v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  return int(blockDim.x) / kWarp;
}

// Sum over the block; every thread gets the result. Fixed shape, fixed order: deterministic.
// `scratch` holds 32 values; the trailing barrier lets the caller reuse it at once.
template <class T>
__device__ __forceinline__ T block_sum(T v, T* scratch) {
  const int warps = block_partials<false>(v, scratch);
  T total = T(0);
  for (int w = 0; w < warps; ++w) total += scratch[w];
  __syncthreads();
  return total;
}

// Max over the block, as block_sum.
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int warps = block_partials<true>(v, scratch);
  float m = scratch[0];
  for (int w = 1; w < warps; ++w) m = fmaxf(m, scratch[w]);
  __syncthreads();
  return m;
}

// The end of a column sum on a (32, kRows) block: thread (x, y) holds acc, its partial of column
// col over rows y, y + kRows, ...; the kRows partials are summed in row order (deterministic) and
// added into out[col] when col < cols. `partial` is the block's shared [kRows][33] scratch.
template <int kRows>
__device__ __forceinline__ void column_sum_add(float (*partial)[kWarp + 1], float acc, float* out, int64_t col,
                                               int64_t cols) {
  partial[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float sum = 0.f;
    for (int r = 0; r < kRows; ++r) sum += partial[r][threadIdx.x];
    out[col] += sum;
  }
}

__device__ __forceinline__ void kernel_error_raise(int* error_word, int bit) {
  if (error_word) atomicOr(error_word, bit);
}

// The first key query tq may see: its document start clamped into [0, tq] (a bad doc_start
// raises the error bit), or the window's first key tq - window + 1 when that is later.
__device__ __forceinline__ int64_t attention_first_key(const int32_t* doc_start, int64_t bi,
                                                       int64_t t, int64_t tq, int64_t window,
                                                       int* error_word) {
  int64_t ds = 0;
  if (doc_start) {
    ds = doc_start[bi * t + tq];
    if (ds < 0 || ds > tq) {
      kernel_error_raise(error_word, kErrorDocStart);
      ds = ds < 0 ? 0 : tq;
    }
  }
  return window > 0 && tq - window + 1 > ds ? tq - window + 1 : ds;
}

// Smallest first key over queries t0 .. t0+nq-1 (every thread computes it: block-uniform; with
// documents, nq reads).
__device__ __forceinline__ int64_t attention_tile_first_key(const int32_t* doc_start, int64_t bi,
                                                            int64_t t, int64_t t0, int nq,
                                                            int64_t window) {
  const int64_t window_first = window > 0 && t0 - window + 1 > 0 ? t0 - window + 1 : 0;
  if (!doc_start) return window_first;  // the first query's first key is the smallest
  int64_t first = t0 + nq - 1;
  for (int r = 0; r < nq; ++r) {
    int64_t ds = doc_start[bi * t + t0 + r];
    ds = ds < 0 ? 0 : (ds > t0 + r ? t0 + r : ds);
    if (window > 0 && t0 + r - window + 1 > ds) ds = t0 + r - window + 1;
    first = ds < first ? ds : first;
  }
  return first;
}

__device__ __forceinline__ float bf16_load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ __nv_bfloat16 bf16_from(float x) { return __float2bfloat16_rn(x); }
__device__ __forceinline__ float bf16_load_rounded(float x) { return __bfloat162float(bf16_from(x)); }

// An f32 value from f32 or bf16 storage, and back (bf16 rounded to nearest even).
__device__ __forceinline__ float load_f32(const float* p) { return *p; }
__device__ __forceinline__ float load_f32(const __nv_bfloat16* p) { return bf16_load(p); }
__device__ __forceinline__ void store_f32(float* p, float x) { *p = x; }
__device__ __forceinline__ void store_f32(__nv_bfloat16* p, float x) { *p = bf16_from(x); }

}  // namespace strata::cuda
