#include "src/train/zo_step.h"

#include <cmath>
#include <cstdio>

#include "kernels/common/zo_rng.h"
#include "src/core/error.h"

namespace strata {

ZoStepOutcome zo_step_run(ZoEngine& engine, const ZoStepOptions& options, const std::vector<MicroBatch>& micro,
                          int64_t counted, int64_t step, double lr, double weight_decay) {
  STRATA_ASSERT(counted > 0 && options.perturbations >= 1 && !micro.empty());
  const float eps = float(options.eps);
  const double two_eps = 2.0 * double(eps);
  const int q = options.perturbations;
  ZoStepOutcome out;
  ZoSgdEstimate est;
  for (int j = 0; j < q; ++j) {
    const uint64_t seed = zo::zo_seed(options.seed, uint64_t(step), uint32_t(j));
    double plus = 0, minus = 0;
    for (const MicroBatch& mb : micro) {
      const ZoLosses l = engine.dual_forward(mb, seed, eps);
      plus += l.plus;
      minus += l.minus;
    }
    plus /= double(counted);
    minus /= double(counted);
    STRATA_CHECK(std::isfinite(plus) && std::isfinite(minus), "step ", step, ": the perturbed losses are not finite (",
                 plus, ", ", minus, "); lower optim.learning_rate or optim.zo_eps, or check the data");
    const double g = (plus - minus) / two_eps;
    out.projected.push_back(g);
    out.loss_plus += plus / q;
    out.loss_minus += minus / q;
    out.projected_grad += g / q;
    est.seeds.push_back(seed);
    est.coefs.push_back(float(g / q));
  }
  engine.queue_update(est, lr, weight_decay);
  return out;
}

void zo_step_notes(const Recipe& rc) {
  std::fprintf(stderr, "strata train: zeroth-order training (zo-sgd): eps %g, %ld perturbation(s) per step, "
               "two forward passes per micro-batch and perturbation, no gradients or optimizer moments\n",
               zo_eps_used(rc.zo_eps), long(rc.zo_perturbations));
  if (rc.max_grad_norm_set && rc.max_grad_norm > 0)
    std::fprintf(stderr, "strata train: warning: optim.max_grad_norm = %g does not apply to zo-sgd (there is no "
                 "gradient to clip; the step is lr * projected_grad * z); it is ignored\n", rc.max_grad_norm);
  if (rc.offload_weights != "stream")
    std::fprintf(stderr, "strata train: note: zo-sgd always streams the layers (its weights change every step); "
                 "offload.weights = \"%s\" is ignored\n", rc.offload_weights.c_str());
}

}  // namespace strata
