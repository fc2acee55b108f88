// Token embedding on CUDA (twin: kernels/cpu/ref/embedding.h): out (N,C) = table (V,C)[ids],
// table f32 or bf16; and dtable (V,C) += dout scattered to rows ids, in token order.
//
// The scatter-add is deterministic without atomics or sorting, by row ownership: the block of
// token i owns table row ids[i] when i is the first token with that id (it scans ids[0..i) to
// find out; other blocks leave at once). The owner walks tokens i..N-1 in tiles, compacts the
// matching token indices in order (warp ballots), and adds their dout rows in token order,
// each thread holding its columns in a register: the sum order is the CPU reference's.
// Cost O(N^2 / threads) id compares: fine for the tokens of one micro-batch.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace strata::cuda {
namespace {

constexpr int kThreads = 256;          // forward
constexpr int kScatterThreads = 128;   // backward, one block per token
constexpr int kScatterWarps = kScatterThreads / kWarp;
constexpr int kIdTile = 1024;          // token ids compacted per step of the owner's walk

template <class W>
__device__ __forceinline__ float embedding_load(const W* p) {
  return float(*p);
}
template <>
__device__ __forceinline__ float embedding_load<__nv_bfloat16>(const __nv_bfloat16* p) {
  return bf16_load(p);
}

template <class W>
__global__ void embedding_forward_kernel(float* out, const W* table, const int32_t* ids, int64_t n,
                                         int64_t c, int* error_word) {
  const int64_t total = n * c, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const int64_t i = e / c, j = e % c;
    const int32_t id = ids[i];
    if (id < 0) {
      kernel_error_raise(error_word, kErrorTokenId);
      out[e] = 0.f;
      continue;
    }
    out[e] = embedding_load(table + int64_t(id) * c + j);
  }
}

// grid (n), block (kScatterThreads).
__global__ void embedding_backward_kernel(float* dtable, const float* dout, const int32_t* ids,
                                          int64_t n, int64_t c, int* error_word) {
  __shared__ int64_t match[kIdTile];      // token indices with this block's id, in order
  __shared__ int warp_count[kScatterWarps];
  __shared__ float scratch[kWarp];
  const int64_t i = blockIdx.x;
  const int lane = int(threadIdx.x) % kWarp, warp = int(threadIdx.x) / kWarp;
  const int32_t id = ids[i];
  if (id < 0) {  // uniform over the block
    if (threadIdx.x == 0) kernel_error_raise(error_word, kErrorTokenId);
    return;
  }
  float earlier = 0.f;
  for (int64_t j = threadIdx.x; j < i; j += kScatterThreads) earlier += ids[j] == id ? 1.f : 0.f;
  if (block_sum(earlier, scratch) > 0.f) return;  // not the owner of row id

  float* row = dtable + int64_t(id) * c;  // (c)
  for (int64_t t0 = i; t0 < n; t0 += kIdTile) {
    // Compact the matches among tokens t0 .. t0+kIdTile-1, in token order.
    int count = 0;
    for (int r = 0; r < kIdTile / kScatterThreads; ++r) {
      const int64_t j = t0 + int64_t(r) * kScatterThreads + threadIdx.x;
      const bool hit = j < n && ids[j] == id;
      const unsigned ballot = __ballot_sync(kFullMask, hit);
      if (lane == 0) warp_count[warp] = __popc(ballot);
      __syncthreads();
      int base = count;
      for (int w = 0; w < warp; ++w) base += warp_count[w];
      if (hit) match[base + __popc(ballot & ((1u << lane) - 1u))] = j;
      for (int w = 0; w < kScatterWarps; ++w) count += warp_count[w];
      __syncthreads();
    }
    for (int64_t col = threadIdx.x; col < c; col += kScatterThreads) {
      float acc = row[col];
      for (int m = 0; m < count; ++m) acc += dout[match[m] * c + col];
      row[col] = acc;
    }
    __syncthreads();  // match[] is rewritten by the next tile
  }
}

}  // namespace

void embedding_forward(float* out, const void* table, bool table_bf16, const int32_t* ids,
                       int64_t n, int64_t c, int* error_word, cudaStream_t stream) {
  STRATA_CHECK(n >= 0 && c > 0, "embedding_forward: need n >= 0 and c > 0, got n=", n, " c=", c);
  if (n == 0) return;
  const unsigned blocks = grid_blocks(n * c, kThreads);
  if (table_bf16) {
    auto* t = static_cast<const __nv_bfloat16*>(table);
    STRATA_LAUNCH(embedding_forward_kernel<__nv_bfloat16>, blocks, kThreads, 0, stream, out, t, ids,
                  n, c, error_word);
  } else {
    auto* t = static_cast<const float*>(table);
    STRATA_LAUNCH(embedding_forward_kernel<float>, blocks, kThreads, 0, stream, out, t, ids, n, c,
                  error_word);
  }
  STRATA_CUDA_CHECK_LAUNCH("embedding_forward");
}

void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int64_t n,
                        int64_t c, int* error_word, cudaStream_t stream) {
  STRATA_CHECK(n >= 0 && c > 0, "embedding_backward: need n >= 0 and c > 0, got n=", n, " c=",
               c);
  if (n == 0) return;
  STRATA_CHECK(n <= 0x7fffffff, "embedding_backward: too many tokens (", n, ")");
  STRATA_LAUNCH(embedding_backward_kernel, unsigned(n), kScatterThreads, 0, stream, dtable, dout,
                ids, n, c, error_word);
  STRATA_CUDA_CHECK_LAUNCH("embedding_backward");
}

}  // namespace strata::cuda
