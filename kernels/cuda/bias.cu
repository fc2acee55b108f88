// Bias on CUDA (twin: kernels/cpu/ref/bias.h): y (N,O) += b (O), and db (O) += column sums of
// dy (N,O). The backward is a deterministic column reduction without atomics: a block owns 32
// columns; its 8 row groups each sum a fixed stride of rows in order, and one thread adds the
// 8 partials in order. (The same shape sums the RMSNorm weight gradient, see rmsnorm.cu.)
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace strata::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kColRows = 8;  // row groups per column block: block (32, 8)

__global__ void bias_forward_kernel(float* y, const float* b, int64_t n, int64_t o) {
  const int64_t total = n * o, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride)
    y[i] += b[i % o];
}

// grid (ceil(o/32)), block (32, kColRows).
__global__ void bias_backward_kernel(float* db, const float* dy, int64_t n, int64_t o) {
  __shared__ float partial[kColRows][kWarp + 1];
  const int64_t col = int64_t(blockIdx.x) * kWarp + threadIdx.x;
  float acc = 0.f;
  if (col < o)
    for (int64_t i = threadIdx.y; i < n; i += kColRows) acc += dy[i * o + col];
  column_sum_add<kColRows>(partial, acc, db, col, o);
}

}  // namespace

void bias_forward(float* y, const float* b, int64_t n, int64_t o, cudaStream_t stream) {
  STRATA_CHECK(n >= 0 && o > 0, "bias_forward: need n >= 0 and o > 0, got n=", n, " o=", o);
  if (n == 0) return;
  STRATA_LAUNCH(bias_forward_kernel, grid_blocks(n * o, kThreads), kThreads, 0, stream, y, b, n, o);
  STRATA_CUDA_CHECK_LAUNCH("bias_forward");
}

void bias_backward(float* db, const float* dy, int64_t n, int64_t o, cudaStream_t stream) {
  STRATA_CHECK(n >= 0 && o > 0, "bias_backward: need n >= 0 and o > 0, got n=", n, " o=", o);
  if (n == 0) return;
  STRATA_LAUNCH(bias_backward_kernel, unsigned((o + kWarp - 1) / kWarp), dim3(kWarp, kColRows), 0,
                stream, db, dy, n, o);
  STRATA_CUDA_CHECK_LAUNCH("bias_backward");
}

}  // namespace strata::cuda
