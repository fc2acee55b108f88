// test_wmma.h - launchers for tools/cuemu/tests/test_wmma.cu, the emulator's nvcuda::wmma test
// kernels (ordinary CUDA C++ that nvcc builds too). Each returns cudaGetLastError().
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

namespace cuemu_test {

// c (M,N) f32 = a (M,K) bf16 · b (K,N) bf16 + c (M,N) with 16x16x16 fragments, one block of 4
// warps taking the (M/16)(N/16) output tiles round-robin; M, N, K multiples of 16. a, b and c are
// read and written row-major or column-major (ld = their row or column length) as the flags say.
cudaError_t wmma_gemm(float* c, const __nv_bfloat16* a, const __nv_bfloat16* b, int m, int n, int k,
                      bool a_col_major, bool b_col_major, bool c_col_major, cudaStream_t stream);

// x (16,16) f32 row-major: x[r][c] *= row_scale[r] done on an accumulator fragment through a
// fragment of row numbers (the layout-independent way to reach rows of an accumulator).
cudaError_t wmma_row_scale(float* x, const float* row_scale, cudaStream_t stream);

// SEEDED BUG: writes an accumulator fragment's elements to x (16,16) where the sm_80 hardware
// mapping of m16n16k16 f32 accumulators would put them, instead of through store_matrix_sync.
cudaError_t wmma_store_assuming_hw_layout(float* x, const float* src, cudaStream_t stream);

}  // namespace cuemu_test
