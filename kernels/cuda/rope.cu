// RoPE on CUDA, Hugging Face rotate-half layout (twin: kernels/cpu/ref/rope.h): x (N, nh, D);
// angle = float(pos) * inv_freq[j] in f32, cos/sin in f32 (full-precision cosf/sinf, no fast
// math), as HF computes them. Only the first rot dims of each head turn (partial rotary); one
// thread per rotated pair (j, j + rot/2), and one per passed dim when out != in (a copy); in-place
// safe since a thread reads and writes only its own elements. The backward is the opposite rotation.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace strata::cuda {
namespace {

constexpr int kThreads = 256;

// sign = +1 forward, -1 backward (the transpose of a rotation).
__global__ void rope_kernel(float* out, const float* in, const int32_t* pos, const float* inv_freq,
                            int64_t n, int64_t nh, int64_t d, int64_t rot, float sign) {
  const int64_t half = rot / 2, pairs = n * nh * half;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < pairs; p += stride) {
    const int64_t j = p % half, row = p / half;  // row = token * nh + head
    const int64_t token = row / nh;
    const float angle = float(pos[token]) * inv_freq[j];
    const float cs = cosf(angle), sn = sign * sinf(angle);
    const float x0 = in[row * d + j], x1 = in[row * d + j + half];
    out[row * d + j] = x0 * cs - x1 * sn;
    out[row * d + j + half] = x1 * cs + x0 * sn;
  }
}

// The dims a partial rotary leaves: copied (out != in only).
__global__ void rope_pass_kernel(float* out, const float* in, int64_t rows, int64_t d, int64_t rot) {
  const int64_t rest = d - rot, count = rows * rest;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < count; p += stride) {
    const int64_t row = p / rest, j = rot + p % rest;
    out[row * d + j] = in[row * d + j];
  }
}

void rope_launch(float* out, const float* in, const int32_t* pos, const float* inv_freq,
                 int64_t n, int64_t nh, int64_t d, int64_t rot, float sign, cudaStream_t stream) {
  if (rot == 0) rot = d;
  STRATA_CHECK(n >= 0 && nh > 0 && d > 0 && rot > 0 && rot % 2 == 0 && rot <= d,
               "rope: need n >= 0, nh > 0, a head dim d > 0 and an even rotary dim 0 < rot <= d, got n=", n,
               " nh=", nh, " d=", d, " rot=", rot);
  const int64_t pairs = n * nh * (rot / 2);
  if (pairs == 0) return;
  STRATA_LAUNCH(rope_kernel, grid_blocks(pairs, kThreads), kThreads, 0, stream, out, in, pos,
                inv_freq, n, nh, d, rot, sign);
  STRATA_CUDA_CHECK_LAUNCH("rope");
  if (rot < d && out != in) {
    const int64_t rest = n * nh * (d - rot);
    STRATA_LAUNCH(rope_pass_kernel, grid_blocks(rest, kThreads), kThreads, 0, stream, out, in, n * nh, d, rot);
    STRATA_CUDA_CHECK_LAUNCH("rope_pass");
  }
}

}  // namespace

void rope_forward(float* out, const float* in, const int32_t* pos, const float* inv_freq,
                  int64_t n, int64_t nh, int64_t d, int64_t rot, cudaStream_t stream) {
  rope_launch(out, in, pos, inv_freq, n, nh, d, rot, 1.f, stream);
}

void rope_backward(float* din, const float* dout, const int32_t* pos, const float* inv_freq,
                   int64_t n, int64_t nh, int64_t d, int64_t rot, cudaStream_t stream) {
  rope_launch(din, dout, pos, inv_freq, n, nh, d, rot, -1.f, stream);
}

}  // namespace strata::cuda
