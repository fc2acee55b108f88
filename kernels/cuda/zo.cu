// Zeroth-order perturbations on CUDA (twins: kernels/cpu/ref/zo.h, f32, one element at a time):
// generate z into a buffer, and perturb a device tensor in place, p += scale * z, f32 or bf16
// (computed in f32, rounded to nearest even once). z comes from kernels/common/zo_rng.h, whose
// float transform uses only __fmul_rn / __fadd_rn / __fdiv_rn / __fsqrt_rn here: nvcc never
// fuses those, so the bits equal the CPU's (tests/cuda/test_cuda_zo.cpp; -fmad=false is set for
// this file as well, kernels/cuda/cuda.cmake, so nothing else in it is contracted either; its PTX
// holds mul.rn / add.rn / div.rn / sqrt.rn .f32 only, which the PTX ISA forbids ptxas to fuse).
//
// One thread per Philox block (4 consecutive elements of the tensor's global index), grid-stride;
// a range [offset, offset + n) that starts or ends inside a block skips the lanes outside it.
#include "kernels/common/zo_rng.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace strata::cuda {
namespace {

constexpr int kThreads = 256;

// kPerturb: p[i] = p[i] + scale z; otherwise p[i] = z (p is f32 then).
template <class T, bool kPerturb>
__global__ void zo_kernel(T* p, uint64_t seed, uint32_t tensor, uint64_t offset, float scale,
                          int64_t n) {
  const uint64_t first_block = offset / 4;
  const uint64_t end = offset + uint64_t(n);
  const int64_t blocks = int64_t((end + 3) / 4 - first_block);
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < blocks; j += stride) {
    const uint64_t block = first_block + uint64_t(j);
    float z[4];
    zo::zo_gaussian4(seed, tensor, block, z[0], z[1], z[2], z[3]);
#pragma unroll
    for (int lane = 0; lane < 4; ++lane) {
      const uint64_t g = 4 * block + uint64_t(lane);
      if (g < offset || g >= end) continue;
      T* q = p + (g - offset);
      if constexpr (kPerturb)
        store_f32(q, zo::zo_perturbed(load_f32(q), scale, z[lane]));
      else
        store_f32(q, z[lane]);
    }
  }
}

int64_t zo_blocks(uint64_t offset, int64_t n) {
  return int64_t((offset + uint64_t(n) + 3) / 4 - offset / 4);
}

void zo_check(uint64_t offset, int64_t n, const char* what) {
  STRATA_CHECK(n >= 0, what, ": need n >= 0, got n=", n);
  STRATA_CHECK(offset <= UINT64_MAX - uint64_t(n) - 3, what, ": element range [", offset, ", ",
               offset, " + ", n, ") overflows the 64-bit element index");
}

}  // namespace

void zo_generate(float* z, uint64_t seed, uint32_t tensor, uint64_t offset, int64_t n,
                 cudaStream_t stream) {
  zo_check(offset, n, "zo_generate");
  if (n == 0) return;
  auto* k = zo_kernel<float, false>;
  STRATA_LAUNCH(k, grid_blocks(zo_blocks(offset, n), kThreads), kThreads, 0, stream, z, seed,
                tensor, offset, 0.0f, n);
  STRATA_CUDA_CHECK_LAUNCH("zo_generate");
}

void zo_perturb(void* p, bool p_bf16, uint64_t seed, uint32_t tensor, uint64_t offset,
                float scale, int64_t n, cudaStream_t stream) {
  zo_check(offset, n, "zo_perturb");
  if (n == 0) return;
  const unsigned grid = grid_blocks(zo_blocks(offset, n), kThreads);
  if (p_bf16) {
    auto* k = zo_kernel<__nv_bfloat16, true>;
    STRATA_LAUNCH(k, grid, kThreads, 0, stream, static_cast<__nv_bfloat16*>(p), seed, tensor,
                  offset, scale, n);
  } else {
    auto* k = zo_kernel<float, true>;
    STRATA_LAUNCH(k, grid, kThreads, 0, stream, static_cast<float*>(p), seed, tensor, offset,
                  scale, n);
  }
  STRATA_CUDA_CHECK_LAUNCH("zo_perturb");
}

}  // namespace strata::cuda
