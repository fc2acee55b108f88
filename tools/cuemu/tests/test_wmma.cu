// test_wmma.cu - the emulator's nvcuda::wmma test kernels (launchers: test_wmma.h): a tiled
// bf16 GEMM over every memory layout, per-row scaling of an accumulator through a fragment of
// row numbers, and the SEEDED BUG of a kernel that assumes the hardware's fragment mapping.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include "kernels/cuda/launch.h"
#include "tools/cuemu/tests/test_wmma.h"

namespace cuemu_test {
namespace {

namespace wmma = nvcuda::wmma;
constexpr int kTile = 16;
constexpr int kWarps = 4;

template <class LayoutA, class LayoutB>
__global__ void wmma_gemm_kernel(float* c, const __nv_bfloat16* a, const __nv_bfloat16* b, int m, int n,
                                 int k, bool c_col_major) {
  constexpr bool a_col = std::is_same<LayoutA, wmma::col_major>::value;
  constexpr bool b_col = std::is_same<LayoutB, wmma::col_major>::value;
  const int warp = int(threadIdx.x) / 32;
  const int tiles_n = n / kTile;
  const wmma::layout_t c_layout = c_col_major ? wmma::mem_col_major : wmma::mem_row_major;
  for (int tile = warp; tile < (m / kTile) * tiles_n; tile += kWarps) {
    const int i0 = tile / tiles_n * kTile, j0 = tile % tiles_n * kTile;
    float* c_tile = c_col_major ? c + size_t(j0) * m + i0 : c + size_t(i0) * n + j0;
    const unsigned ldc = c_col_major ? unsigned(m) : unsigned(n);
    wmma::fragment<wmma::accumulator, kTile, kTile, kTile, float> acc;
    wmma::load_matrix_sync(acc, c_tile, ldc, c_layout);
    for (int k0 = 0; k0 < k; k0 += kTile) {
      wmma::fragment<wmma::matrix_a, kTile, kTile, kTile, __nv_bfloat16, LayoutA> fa;
      wmma::fragment<wmma::matrix_b, kTile, kTile, kTile, __nv_bfloat16, LayoutB> fb;
      wmma::load_matrix_sync(fa, a_col ? a + size_t(k0) * m + i0 : a + size_t(i0) * k + k0,
                             a_col ? unsigned(m) : unsigned(k));
      wmma::load_matrix_sync(fb, b_col ? b + size_t(j0) * k + k0 : b + size_t(k0) * n + j0,
                             b_col ? unsigned(k) : unsigned(n));
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(c_tile, acc, ldc, c_layout);
  }
}

__global__ void wmma_row_scale_kernel(float* x, const float* row_scale) {
  __shared__ float rows[kTile * kTile];  // rows[r][c] = r
  for (int e = int(threadIdx.x); e < kTile * kTile; e += 32) rows[e] = float(e / kTile);
  __syncwarp();
  wmma::fragment<wmma::accumulator, kTile, kTile, kTile, float> acc, row_of;
  wmma::load_matrix_sync(row_of, rows, kTile, wmma::mem_row_major);
  wmma::load_matrix_sync(acc, x, kTile, wmma::mem_row_major);
  for (int e = 0; e < acc.num_elements; ++e) acc.x[e] *= row_scale[int(row_of.x[e])];
  wmma::store_matrix_sync(x, acc, kTile, wmma::mem_row_major);
}

// SEEDED BUG: element e of lane l is taken to be entry (l/4 + 8 ((e/2)%2), 2 (l%4) + e%2 + 8 (e/4))
// as on sm_80 - a mapping the CUDA API does not promise.
__global__ void wmma_store_assuming_hw_layout_kernel(float* x, const float* src) {
  wmma::fragment<wmma::accumulator, kTile, kTile, kTile, float> acc;
  wmma::load_matrix_sync(acc, src, kTile, wmma::mem_row_major);
  const int lane = int(threadIdx.x) % 32;
  for (int e = 0; e < acc.num_elements; ++e) {
    const int r = lane / 4 + 8 * ((e / 2) % 2), c = 2 * (lane % 4) + e % 2 + 8 * (e / 4);
    x[r * kTile + c] = acc.x[e];
  }
}

}  // namespace

cudaError_t wmma_gemm(float* c, const __nv_bfloat16* a, const __nv_bfloat16* b, int m, int n, int k,
                      bool a_col_major, bool b_col_major, bool c_col_major, cudaStream_t stream) {
  using R = wmma::row_major;
  using C = wmma::col_major;
  if (!a_col_major && !b_col_major)
    STRATA_LAUNCH((wmma_gemm_kernel<R, R>), 1, 32 * kWarps, 0, stream, c, a, b, m, n, k, c_col_major);
  else if (!a_col_major)
    STRATA_LAUNCH((wmma_gemm_kernel<R, C>), 1, 32 * kWarps, 0, stream, c, a, b, m, n, k, c_col_major);
  else if (!b_col_major)
    STRATA_LAUNCH((wmma_gemm_kernel<C, R>), 1, 32 * kWarps, 0, stream, c, a, b, m, n, k, c_col_major);
  else
    STRATA_LAUNCH((wmma_gemm_kernel<C, C>), 1, 32 * kWarps, 0, stream, c, a, b, m, n, k, c_col_major);
  return cudaGetLastError();
}

cudaError_t wmma_row_scale(float* x, const float* row_scale, cudaStream_t stream) {
  STRATA_LAUNCH(wmma_row_scale_kernel, 1, 32, 0, stream, x, row_scale);
  return cudaGetLastError();
}

cudaError_t wmma_store_assuming_hw_layout(float* x, const float* src, cudaStream_t stream) {
  STRATA_LAUNCH(wmma_store_assuming_hw_layout_kernel, 1, 32, 0, stream, x, src);
  return cudaGetLastError();
}

}  // namespace cuemu_test
