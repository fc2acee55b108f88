// Matmul on CUDA through cuBLAS (twin: kernels/cpu/ref/matmul.h): c (M,N) = op(a) · op(b)
// + beta c, row-major, f32 or bf16 inputs, f32 output and f32 accumulation (CUBLAS_COMPUTE_32F:
// no TF32, so f32 matmuls are as exact as the CPU's).
//
// cuBLAS is column-major. A row-major (R, S) matrix is the column-major (S, R) matrix with the
// same bytes, so strata's row-major c = op(a) op(b) is cuBLAS's c^T = op(b)^T op(a)^T: b goes
// first, a second, and the transposes keep their flags:
//   cublas m = N, n = M, k = K;
//   first operand  b: stored (K,N) row-major -> col-major (N,K), ld N, op N;
//                     trans_b: stored (N,K)  -> col-major (K,N), ld K, op T;
//   second operand a: stored (M,K) row-major -> col-major (K,M), ld K, op N;
//                     trans_a: stored (K,M)  -> col-major (M,K), ld M, op T;
//   c: (M,N) row-major -> col-major (N,M), ld N.
// beta = 0 does not read c (it may hold NaN poison), as cuBLAS documents.
#include <cublas_v2.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace strata::cuda {

#define STRATA_CUBLAS_CHECK(call)                                                          \
  do {                                                                                     \
    const cublasStatus_t strata_cublas_status = (call);                                    \
    STRATA_CHECK(strata_cublas_status == CUBLAS_STATUS_SUCCESS, __FILE__, ":", __LINE__,   \
                 ": ", #call, " failed with cuBLAS status ", int(strata_cublas_status));   \
  } while (0)

void matmul(float* c, const void* a, const void* b, bool bf16, int64_t m, int64_t n, int64_t k,
            bool trans_a, bool trans_b, float beta, cublasHandle_t handle, cudaStream_t stream) {
  STRATA_CHECK(m >= 0 && n >= 0 && k >= 0, "matmul: sizes must be non-negative (got m=", m,
               " n=", n, " k=", k, ")");
  STRATA_CHECK(beta == 0.f || beta == 1.f, "matmul: beta must be 0 or 1, got ", beta);
  constexpr int64_t kIntMax = 0x7fffffff;
  STRATA_CHECK(m <= kIntMax && n <= kIntMax && k <= kIntMax,
               "matmul: a dimension exceeds cuBLAS's int range (m=", m, " n=", n, " k=", k, ")");
  if (m == 0 || n == 0) return;
  if (k == 0) {  // an empty sum: c = beta c
    if (beta == 0.f) STRATA_CUDA_CHECK(cudaMemsetAsync(c, 0, size_t(m * n) * sizeof(float), stream));
    return;
  }
  const cudaDataType_t type = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const float alpha = 1.f;
  STRATA_CUBLAS_CHECK(cublasSetStream(handle, stream));
  STRATA_CUBLAS_CHECK(cublasGemmEx(handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                   trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, int(n), int(m), int(k),
                                   &alpha, b, type, int(trans_b ? k : n), a, type,
                                   int(trans_a ? m : k), &beta, c, CUDA_R_32F, int(n),
                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace strata::cuda
