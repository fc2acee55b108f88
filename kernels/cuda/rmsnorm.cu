// RMSNorm on CUDA (twin: kernels/cpu/ref/rmsnorm.h), also used per head (n = N*H rows of
// c = D). rstd = 1/sqrt(mean(x^2) + eps), out = weight * (x * rstd), all f32.
// Forward and the input gradient: one warp per row, lanes stride the row, warp-shuffle sums.
// The weight gradient dweight[j] += sum_i dy[i,j] x[i,j] rstd[i] is a separate deterministic
// column reduction (no atomics): a block owns 32 columns, 32 row groups sum fixed row strides
// in order, one thread adds the 32 partials in order.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace strata::cuda {
namespace {

constexpr int kRowsPerBlock = 8;  // warps per block, one row each
constexpr int kColRows = 32;      // row groups of the dweight reduction: block (32, 32)

// out_b null: the f32 output only; else also its bf16 rounding (cast_f32_to_bf16's bits).
__global__ void rmsnorm_forward_kernel(float* out, __nv_bfloat16* out_b, float* rstd, const float* in,
                                       const float* weight, int64_t n, int64_t c, float eps) {
  const int lane = int(threadIdx.x) % kWarp;
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (row >= n) return;  // whole warp leaves together
  const float* x = in + row * c;  // (c)
  float* y = out + row * c;       // (c)
  float ss = 0.f;
  for (int64_t j = lane; j < c; j += kWarp) ss += x[j] * x[j];
  ss = warp_sum(ss);
  const float r = 1.f / sqrtf(ss / float(c) + eps);
  if (lane == 0) rstd[row] = r;
  for (int64_t j = lane; j < c; j += kWarp) {
    const float v = weight[j] * (x[j] * r);
    y[j] = v;
    if (out_b) out_b[row * c + j] = bf16_from(v);
  }
}

void rmsnorm_forward_launch(float* out, __nv_bfloat16* out_b, float* rstd, const float* in,
                            const float* weight, int64_t n, int64_t c, float eps, cudaStream_t stream,
                            const char* name) {
  STRATA_CHECK(n >= 0 && c > 0, name, ": need n >= 0 and c > 0, got n=", n, " c=", c);
  if (n == 0) return;
  const int64_t blocks = (n + kRowsPerBlock - 1) / kRowsPerBlock;
  STRATA_CHECK(blocks <= 0x7fffffff, name, ": too many rows (", n, ")");
  STRATA_LAUNCH(rmsnorm_forward_kernel, unsigned(blocks), kRowsPerBlock * kWarp, 0, stream, out, out_b,
                rstd, in, weight, n, c, eps);
  STRATA_CUDA_CHECK_LAUNCH(name);
}

__global__ void rmsnorm_backward_input_kernel(float* din, const float* dout, const float* in,
                                              const float* weight, const float* rstd, int64_t n,
                                              int64_t c) {
  const int lane = int(threadIdx.x) % kWarp;
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (row >= n) return;
  const float* x = in + row * c;     // (c)
  const float* dy = dout + row * c;  // (c)
  float* dx = din + row * c;         // (c)
  const float r = rstd[row];
  float dot = 0.f;
  for (int64_t j = lane; j < c; j += kWarp) dot += dy[j] * weight[j] * x[j];
  dot = warp_sum(dot);
  const float coef = dot * r * r * r / float(c);
  for (int64_t j = lane; j < c; j += kWarp) dx[j] = r * (dy[j] * weight[j]) - x[j] * coef;
}

// grid (ceil(c/32)), block (32, kColRows).
__global__ void rmsnorm_backward_weight_kernel(float* dweight, const float* dout, const float* in,
                                               const float* rstd, int64_t n, int64_t c) {
  __shared__ float partial[kColRows][kWarp + 1];
  const int64_t col = int64_t(blockIdx.x) * kWarp + threadIdx.x;
  float acc = 0.f;
  if (col < c)
    for (int64_t i = threadIdx.y; i < n; i += kColRows) acc += dout[i * c + col] * (in[i * c + col] * rstd[i]);
  column_sum_add<kColRows>(partial, acc, dweight, col, c);
}

}  // namespace

void rmsnorm_forward(float* out, float* rstd, const float* in, const float* weight, int64_t n,
                     int64_t c, float eps, cudaStream_t stream) {
  rmsnorm_forward_launch(out, nullptr, rstd, in, weight, n, c, eps, stream, "rmsnorm_forward");
}

void rmsnorm_forward_bf16(float* out, bf16* out_b, float* rstd, const float* in, const float* weight,
                          int64_t n, int64_t c, float eps, cudaStream_t stream) {
  rmsnorm_forward_launch(out, reinterpret_cast<__nv_bfloat16*>(out_b), rstd, in, weight, n, c, eps, stream,
                         "rmsnorm_forward_bf16");
}

void rmsnorm_backward(float* din, float* dweight, const float* dout, const float* in,
                      const float* weight, const float* rstd, int64_t n, int64_t c,
                      cudaStream_t stream) {
  STRATA_CHECK(n >= 0 && c > 0, "rmsnorm_backward: need n >= 0 and c > 0, got n=", n, " c=", c);
  if (n == 0) return;
  const int64_t blocks = (n + kRowsPerBlock - 1) / kRowsPerBlock;
  STRATA_CHECK(blocks <= 0x7fffffff, "rmsnorm_backward: too many rows (", n, ")");
  STRATA_LAUNCH(rmsnorm_backward_input_kernel, unsigned(blocks), kRowsPerBlock * kWarp, 0, stream,
                din, dout, in, weight, rstd, n, c);
  STRATA_CUDA_CHECK_LAUNCH("rmsnorm_backward input");
  STRATA_LAUNCH(rmsnorm_backward_weight_kernel, unsigned((c + kWarp - 1) / kWarp),
                dim3(kWarp, kColRows), 0, stream, dweight, dout, in, rstd, n, c);
  STRATA_CUDA_CHECK_LAUNCH("rmsnorm_backward weight");
}

}  // namespace strata::cuda
