// CPU AdamW over fp32 master weights and moments (DESIGN §3, §6): one fused pass per element
// — clip scale, decoupled weight decay, moment updates, bias correction, master update — that
// also writes the working copy the device reads (f32 or bf16). torch.optim.AdamW semantics:
//   g = grad * clip_scale;  p -= lr * wd * p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
// Elementwise, so results are independent of the thread count.
#pragma once
#include <cstdint>

#include "src/core/dtype.h"

namespace strata {

struct AdamWParams {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.f;
  int64_t step = 1;        // 1-based, for bias correction
  float clip_scale = 1.f;  // global-norm clipping factor applied to the gradient
};

// n elements: master, m, v updated in place from grad; working (dtype `working_type`) receives
// the new weights rounded to its dtype (may be null).
void adamw_update(float* master, float* m, float* v, const float* grad, void* working,
                  DType working_type, int64_t n, const AdamWParams& p);

// The plain fp64 reference of the same update, for tests.
void adamw_update_ref(double* master, double* m, double* v, const double* grad, int64_t n,
                      const AdamWParams& p);

// Sum of squares in double, in fixed-size chunks summed in order (thread-count independent).
double sum_of_squares(const float* x, int64_t n);

}  // namespace strata
