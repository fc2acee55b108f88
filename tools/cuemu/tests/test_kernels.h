// test_kernels.h - launchers for the kernels in test_kernels.cu, the emulator's own test kernels
// (compiled by g++ with cuemu.h force-included, exactly as kernels/cuda/*.cu are). Each launcher
// queues its grid on `stream` and returns cudaGetLastError() (the launch-configuration verdict).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace cuemu_test {

// block_sums[b] = sum of x over block b's `threads` elements (a multiple of 32; ceil(n / threads)
// blocks). missing_sync: the seeded bug, the barrier between writing the per-warp partial sums and
// reading them is left out.
cudaError_t reduce_sum(const float* x, float* block_sums, int n, int threads, bool missing_sync,
                       cudaStream_t stream);

// For every thread t of one block of `threads`: out[4 t + 0..3] = xor / down / up / indexed shuffle
// of value (t * 10 + 1) with parameter `param` and `width`.
cudaError_t shuffles(int* out, int threads, int param, int width, cudaStream_t stream);

// One block: out[3 t + 0..2] = __ballot_sync, __any_sync, __all_sync of pred(t) = (t % modulus == 0),
// all lanes of each warp taking part.
cudaError_t votes(unsigned* out, int threads, int modulus, cudaStream_t stream);

// counters: [0] float sum of 1.0f, [1] int sum of 1, [2] atomicMax of thread ids, [3] CAS-claimed slot
// count, [4] atomicExch last value (any thread id), [5..6] double sum of 0.5 (as a double).
cudaError_t atomics(float* fsum, double* dsum, int* counters, int blocks, int threads, cudaStream_t stream);

// y[i] = x[i] * scale + 1 over n elements.
cudaError_t scale_add(float* y, const float* x, float scale, int n, cudaStream_t stream);

// Reverses each block-sized chunk of x into y through dynamic shared memory of `smem_bytes`.
cudaError_t reverse_in_shared(float* y, const float* x, int n, int threads, size_t smem_bytes, cudaStream_t stream);

// out[b] = __syncthreads_count(x[b*threads + t] > 0), __syncthreads_and, __syncthreads_or per block;
// threads with t >= active return before the barrier (they have exited, so do not count).
cudaError_t block_votes(int* out, const float* x, int blocks, int threads, int active, cudaStream_t stream);

// Any launch configuration, for the launch-bound checks (the kernel writes nothing).
cudaError_t empty_kernel(dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream);
// Sets the opt-in dynamic shared memory limit of the kernel empty_kernel launches.
cudaError_t empty_kernel_allow_smem(int bytes);

// Launches scale_add with a pointer argument the caller chooses (for the host-pointer check).
cudaError_t scale_add_raw(float* y, const float* x, int n, cudaStream_t stream);

}  // namespace cuemu_test
