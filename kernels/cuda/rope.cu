// RoPE on CUDA, Hugging Face rotate-half layout (twin: kernels/cpu/ref/rope.h): x (N, nh, D);
// angle = float(pos) * inv_freq[j] in f32, cos/sin in f32 (full-precision cosf/sinf, no fast
// math), as HF computes them. One thread per rotated pair (j, j + D/2); in-place safe since a
// thread reads and writes only its own pair. The backward is the opposite rotation.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace strata::cuda {
namespace {

constexpr int kThreads = 256;

// sign = +1 forward, -1 backward (the transpose of a rotation).
__global__ void rope_kernel(float* out, const float* in, const int32_t* pos, const float* inv_freq,
                            int64_t n, int64_t nh, int64_t d, float sign) {
  const int64_t half = d / 2, pairs = n * nh * half;
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

void rope_launch(float* out, const float* in, const int32_t* pos, const float* inv_freq,
                 int64_t n, int64_t nh, int64_t d, float sign, cudaStream_t stream) {
  STRATA_CHECK(n >= 0 && nh > 0 && d > 0 && d % 2 == 0,
               "rope: need n >= 0, nh > 0 and an even head dim d > 0, got n=", n, " nh=", nh,
               " d=", d);
  const int64_t pairs = n * nh * (d / 2);
  if (pairs == 0) return;
  STRATA_LAUNCH(rope_kernel, grid_blocks(pairs, kThreads), kThreads, 0, stream, out, in, pos,
                inv_freq, n, nh, d, sign);
  STRATA_CUDA_CHECK_LAUNCH("rope");
}

}  // namespace

void rope_forward(float* out, const float* in, const int32_t* pos, const float* inv_freq,
                  int64_t n, int64_t nh, int64_t d, cudaStream_t stream) {
  rope_launch(out, in, pos, inv_freq, n, nh, d, 1.f, stream);
}

void rope_backward(float* din, const float* dout, const int32_t* pos, const float* inv_freq,
                   int64_t n, int64_t nh, int64_t d, cudaStream_t stream) {
  rope_launch(din, dout, pos, inv_freq, n, nh, d, -1.f, stream);
}

}  // namespace strata::cuda
