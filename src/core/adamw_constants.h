// The f32 constants of one AdamW update, shared by the CPU update (offload/state/adamw.cpp) and the
// CUDA one (kernels/cuda/adamw.cu) so the two give the same bits: each is derived from the
// hyperparameters in double (as Python computes them) and rounded to f32 once.
#pragma once
#include <cmath>
#include <cstdint>

#include "src/core/error.h"

namespace strata {

struct AdamWConstants {
  float clip;             // global-norm clipping factor applied to the gradient
  float decay;            // 1 - lr wd
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float bc2_sqrt;         // sqrt(1 - b2^t)
  float eps;
  float neg_step_size;    // -(lr / (1 - b1^t))
};

// step is 1-based (bias correction).
inline AdamWConstants adamw_constants(double lr, double beta1, double beta2, double eps,
                                      double weight_decay, int64_t step, double clip_scale) {
  STRATA_CHECK(step >= 1, "AdamW step is ", step, "; steps count from 1");
  const double t = double(step);
  AdamWConstants c;
  c.clip = float(clip_scale);
  c.decay = float(1.0 - lr * weight_decay);
  c.beta1 = float(beta1);
  c.one_minus_beta1 = float(1.0 - beta1);
  c.beta2 = float(beta2);
  c.one_minus_beta2 = float(1.0 - beta2);
  c.bc2_sqrt = float(std::sqrt(1.0 - std::pow(beta2, t)));
  c.eps = float(eps);
  c.neg_step_size = float(-(lr / (1.0 - std::pow(beta1, t))));
  return c;
}

}  // namespace strata
