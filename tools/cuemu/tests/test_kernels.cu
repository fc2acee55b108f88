// test_kernels.cu - the emulator's own test kernels: ordinary CUDA C++ that nvcc would also build,
// compiled here by g++ with tools/cuemu/cuemu.h force-included. Includes the seeded bug of a
// block reduction whose __syncthreads is missing.
#include <cuda_runtime.h>

#include "kernels/cuda/launch.h"
#include "tools/cuemu/tests/test_kernels.h"

namespace cuemu_test {
namespace {

constexpr unsigned kFull = 0xffffffffu;

__device__ float warp_sum(float v) {
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(kFull, v, off);
  return v;
}

// Two-stage block sum: shuffles within each warp, per-warp partials through static shared
// memory, then warp 0 sums the partials into block_sums[blockIdx.x]. kSync false is the SEEDED
// BUG: no barrier between the two stages, so warp 0 may read partials not yet written.
template <bool kSync>
__device__ void reduce_sum_block(const float* x, float* block_sums, int n) {
  __shared__ float partial[32];
  const int tid = int(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int i = int(blockIdx.x * blockDim.x) + tid;
  float v = warp_sum(i < n ? x[i] : 0.f);
  if (lane == 0) partial[warp] = v;
  if constexpr (kSync) __syncthreads();
  if (warp == 0) {
    v = warp_sum(lane < int(blockDim.x / 32) ? partial[lane] : 0.f);
    if (lane == 0) block_sums[blockIdx.x] = v;
  }
}

__global__ void reduce_sum_kernel(const float* x, float* block_sums, int n) { reduce_sum_block<true>(x, block_sums, n); }
__global__ void reduce_sum_missing_sync_kernel(const float* x, float* block_sums, int n) {
  reduce_sum_block<false>(x, block_sums, n);
}

__global__ void shuffles_kernel(int* out, int param, int width) {
  const int t = int(threadIdx.x);
  const int v = t * 10 + 1;
  out[4 * t + 0] = __shfl_xor_sync(kFull, v, param, width);
  out[4 * t + 1] = __shfl_down_sync(kFull, v, unsigned(param), width);
  out[4 * t + 2] = __shfl_up_sync(kFull, v, unsigned(param), width);
  out[4 * t + 3] = __shfl_sync(kFull, v, param, width);
}

__global__ void votes_kernel(unsigned* out, int modulus) {
  const int t = int(threadIdx.x);
  const int pred = t % modulus == 0;
  out[3 * t + 0] = __ballot_sync(kFull, pred);
  out[3 * t + 1] = unsigned(__any_sync(kFull, pred));
  out[3 * t + 2] = unsigned(__all_sync(kFull, pred));
}

__global__ void atomics_kernel(float* fsum, double* dsum, int* counters) {
  const int id = int(blockIdx.x * blockDim.x + threadIdx.x);
  atomicAdd(fsum, 1.0f);
  atomicAdd(dsum, 0.5);
  atomicAdd(&counters[0], 1);
  atomicMax(&counters[1], id);
  // Claim slot 2 exactly once through compare-and-swap; every winner counts in counters[3].
  if (atomicCAS(&counters[2], -1, id) == -1) atomicAdd(&counters[3], 1);
  atomicExch(&counters[4], id);
}

__global__ void scale_add_kernel(float* y, const float* x, float scale, int n) {
  for (int i = int(blockIdx.x * blockDim.x + threadIdx.x); i < n; i += int(gridDim.x * blockDim.x))
    y[i] = x[i] * scale + 1.0f;
}

__global__ void reverse_in_shared_kernel(float* y, const float* x, int n) {
  STRATA_DYN_SHARED(float, tile);
  const int t = int(threadIdx.x), base = int(blockIdx.x * blockDim.x);
  tile[t] = base + t < n ? x[base + t] : 0.f;
  __syncthreads();
  const int src = int(blockDim.x) - 1 - t;
  if (base + t < n) y[base + t] = tile[src];
}

__global__ void block_votes_kernel(int* out, const float* x, int active) {
  const int t = int(threadIdx.x);
  if (t >= active) return;  // exited threads leave the barrier (sm_70+ semantics)
  const int p = x[blockIdx.x * blockDim.x + t] > 0.f;
  const int count = __syncthreads_count(p);
  const int all = __syncthreads_and(p);
  const int any = __syncthreads_or(p);
  if (t == 0) {
    out[3 * blockIdx.x + 0] = count;
    out[3 * blockIdx.x + 1] = all;
    out[3 * blockIdx.x + 2] = any;
  }
}

__global__ void empty_kernel_impl(int unused) {}

}  // namespace

cudaError_t reduce_sum(const float* x, float* block_sums, int n, int threads, bool missing_sync,
                       cudaStream_t stream) {
  const unsigned blocks = unsigned((n + threads - 1) / threads);
  if (missing_sync) STRATA_LAUNCH(reduce_sum_missing_sync_kernel, blocks, threads, 0, stream, x, block_sums, n);
  else STRATA_LAUNCH(reduce_sum_kernel, blocks, threads, 0, stream, x, block_sums, n);
  return cudaGetLastError();
}

cudaError_t shuffles(int* out, int threads, int param, int width, cudaStream_t stream) {
  STRATA_LAUNCH(shuffles_kernel, 1, threads, 0, stream, out, param, width);
  return cudaGetLastError();
}

cudaError_t votes(unsigned* out, int threads, int modulus, cudaStream_t stream) {
  STRATA_LAUNCH(votes_kernel, 1, threads, 0, stream, out, modulus);
  return cudaGetLastError();
}

cudaError_t atomics(float* fsum, double* dsum, int* counters, int blocks, int threads, cudaStream_t stream) {
  STRATA_LAUNCH(atomics_kernel, blocks, threads, 0, stream, fsum, dsum, counters);
  return cudaGetLastError();
}

cudaError_t scale_add(float* y, const float* x, float scale, int n, cudaStream_t stream) {
  STRATA_LAUNCH(scale_add_kernel, unsigned((n + 127) / 128), 128, 0, stream, y, x, scale, n);
  return cudaGetLastError();
}

cudaError_t scale_add_raw(float* y, const float* x, int n, cudaStream_t stream) {
  STRATA_LAUNCH(scale_add_kernel, 1, 32, 0, stream, y, x, 2.0f, n);
  return cudaGetLastError();
}

cudaError_t reverse_in_shared(float* y, const float* x, int n, int threads, size_t smem_bytes, cudaStream_t stream) {
  STRATA_LAUNCH(reverse_in_shared_kernel, unsigned((n + threads - 1) / threads), threads, smem_bytes, stream, y, x,
                n);
  return cudaGetLastError();
}

cudaError_t block_votes(int* out, const float* x, int blocks, int threads, int active, cudaStream_t stream) {
  STRATA_LAUNCH(block_votes_kernel, blocks, threads, 0, stream, out, x, active);
  return cudaGetLastError();
}

cudaError_t empty_kernel(dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream) {
  STRATA_LAUNCH(empty_kernel_impl, grid, block, smem_bytes, stream, 0);
  return cudaGetLastError();
}

cudaError_t empty_kernel_allow_smem(int bytes) {
  return cudaFuncSetAttribute(reinterpret_cast<const void*>(&empty_kernel_impl),
                              cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

}  // namespace cuemu_test
