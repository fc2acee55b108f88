// AdamW on CUDA (twin: the CPU AdamW, offload/state/adamw.h): one fused pass per element, the same
// f32 operations in the same order as offload/state/adamw_kernels.h, so the results are the CPU's
// bits (tests/cuda/test_cuda_adamw.cpp checks it):
//   g  = grad * clip;  p = p * (1 - lr wd)
//   m  = fma(1 - b1, g, m * b1);  v = fma((1 - b2) * g, g, v * b2)
//   p  = p + (-(lr / (1 - b1^t)) * m) / (sqrt(v) / sqrt(1 - b2^t) + eps)
// then the fp32 master is stored and the working copy (f32 or bf16, round to nearest even)
// written from it. Moments are f32, or bf16 (read, computed in f32, rounded back).
// Every operation is an explicitly rounded intrinsic (__fmul_rn, __fadd_rn, __fdiv_rn,
// __fsqrt_rn, __fmaf_rn): nvcc never contracts those into other FMAs and -prec-div/-prec-sqrt
// do not touch them, so the operation order above is exactly what runs (subnormals too, as
// strata builds without -ftz / --use_fast_math).
//
// Optional and not wired into the engine: the engine keeps AdamW on the CPU by design (DESIGN
// §3, §6: the fp32 master weights and moments live in host memory and the update runs on the
// host queue, overlapping the next forward). This is for a device-resident optimizer state.
// Weight decay is per call: a caller with parameter groups calls once per group (the engine's
// rule is decay on matrices, none on norms and biases).
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace strata::cuda {
namespace {

constexpr int kThreads = 256;

// M: moment storage (float or bf16); W: working copy storage (float or bf16; working may be null).
template <class M, class W>
__global__ void adamw_kernel(float* master, M* m, M* v, const float* grad, W* working,
                             AdamWConstants c, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float g = __fmul_rn(grad[i], c.clip);
    const float pd = __fmul_rn(master[i], c.decay);
    const float mi = __fmaf_rn(c.one_minus_beta1, g, __fmul_rn(load_f32(m + i), c.beta1));
    const float vi = __fmaf_rn(__fmul_rn(c.one_minus_beta2, g), g, __fmul_rn(load_f32(v + i), c.beta2));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), c.bc2_sqrt), c.eps);
    const float p = __fadd_rn(pd, __fdiv_rn(__fmul_rn(c.neg_step_size, mi), denom));
    master[i] = p;
    store_f32(m + i, mi);
    store_f32(v + i, vi);
    if (working) store_f32(working + i, p);
  }
}

template <class M, class W>
void adamw_launch(float* master, void* m, void* v, const float* grad, void* working,
                  const AdamWConstants& c, int64_t n, cudaStream_t stream) {
  auto* k = adamw_kernel<M, W>;
  STRATA_LAUNCH(k, grid_blocks(n, kThreads), kThreads, 0, stream, master, static_cast<M*>(m),
                static_cast<M*>(v), grad, static_cast<W*>(working), c, n);
}

}  // namespace

void adamw_update(float* master, void* m, void* v, bool moments_bf16, const float* grad,
                  void* working, bool working_bf16, int64_t n, const AdamWConstants& c,
                  cudaStream_t stream) {
  STRATA_CHECK(n >= 0, "adamw_update: need n >= 0, got n=", n);
  if (n == 0) return;
  STRATA_CHECK(master && m && v && grad, "adamw_update: master, m, v and grad must be device "
               "buffers of n elements (got a null pointer)");
  using bf = __nv_bfloat16;
  if (moments_bf16) {
    if (working_bf16) adamw_launch<bf, bf>(master, m, v, grad, working, c, n, stream);
    else adamw_launch<bf, float>(master, m, v, grad, working, c, n, stream);
  } else {
    if (working_bf16) adamw_launch<float, bf>(master, m, v, grad, working, c, n, stream);
    else adamw_launch<float, float>(master, m, v, grad, working, c, n, stream);
  }
  STRATA_CUDA_CHECK_LAUNCH("adamw_update");
}

}  // namespace strata::cuda
