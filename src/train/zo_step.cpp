#include "src/train/zo_step.h"

#include <cmath>
#include <cstdio>

#include "src/core/error.h"
#include "src/device/host_ops.h"

namespace strata {

ZoParallel zo_parallel_layout(const std::string& mode, int rank, int size) {
  STRATA_ASSERT(size >= 1 && rank >= 0 && rank < size);
  ZoParallel p;
  if (mode == "data") {
    p.groups = size;
    p.group = rank;
    return p;
  }
  STRATA_CHECK(mode == "perturbation" || mode == "2d", "distributed.zo must be \"data\", \"perturbation\" or \"2d\", "
               "not \"", mode, "\"");
  STRATA_CHECK(mode != "perturbation" || size == 2, "distributed.zo = \"perturbation\" runs on a pair of ranks (one "
               "for θ + εz, one for θ − εz) but this launch has ", size, ": use mpirun -np 2, or distributed.zo = \"2d\" "
               "for pairs x data groups");
  STRATA_CHECK(size % 2 == 0, "distributed.zo = \"2d\" needs an even number of ranks (pairs x data groups), not ",
               size, ": launch with mpirun -np ", size + 1, " or ", size - 1);
  p.sides = 2;
  p.side = rank % 2;
  p.groups = size / 2;
  p.group = rank / 2;
  return p;
}

ZoStepOutcome zo_step_run(ZoEngine& engine, const ZoStepOptions& options, const std::vector<MicroBatch>& micro,
                          int64_t counted, int64_t step, double lr, double weight_decay, const ZoParallel& par,
                          Comm* comm) {
  STRATA_ASSERT(counted > 0 && options.perturbations >= 1 && !micro.empty());
  STRATA_ASSERT(par.sides == 1 || par.sides == 2);
  const float eps = float(options.eps);
  const double two_eps = 2.0 * double(eps);
  const size_t q = size_t(options.perturbations), M = micro.size() * size_t(par.groups);
  // losses[(j * M + i) * 2 + s]: side s (0: θ + εz, 1: θ − εz) of global micro-batch i under z_j
  std::vector<double> losses(q * M * 2, 0.0);
  std::vector<uint64_t> seeds(q);
  for (size_t j = 0; j < q; ++j) {
    seeds[j] = host_zo_seed(options.seed, uint64_t(step), uint32_t(j));
    for (size_t k = 0; k < micro.size(); ++k) {
      double* at = &losses[(j * M + k * size_t(par.groups) + size_t(par.group)) * 2];
      if (par.sides == 1) {
        const ZoLosses l = engine.dual_forward(micro[k], seeds[j], eps);
        at[0] = l.plus;
        at[1] = l.minus;
      } else {
        at[par.side] = engine.perturbed_forward(micro[k], seeds[j], eps, par.side == 0 ? 1 : -1);
      }
    }
  }
  ZoStepOutcome out;
  if (comm && comm->size() > 1) {
    comm->all_reduce_sum(losses.data(), losses.size()).wait();
    out.comm_bytes = losses.size() * sizeof(double);
  }
  ZoSgdEstimate est;
  for (size_t j = 0; j < q; ++j) {
    double plus = 0, minus = 0;  // in the single-process order of the micro-batches
    for (size_t i = 0; i < M; ++i) {
      plus += losses[(j * M + i) * 2];
      minus += losses[(j * M + i) * 2 + 1];
    }
    plus /= double(counted);
    minus /= double(counted);
    STRATA_CHECK(std::isfinite(plus) && std::isfinite(minus), "step ", step, ": the perturbed losses are not finite (",
                 plus, ", ", minus, "); lower optim.learning_rate or optim.zo_eps, or check the data");
    const double g = (plus - minus) / two_eps;
    out.projected.push_back(g);
    out.loss_plus += plus / double(q);
    out.loss_minus += minus / double(q);
    out.projected_grad += g / double(q);
    est.seeds.push_back(seeds[j]);
    est.coefs.push_back(float(g / double(q)));
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
  if (rc.offload_weights == "device")
    std::fprintf(stderr, "strata train: note: zo-sgd always streams the layers (its weights change every step); "
                 "offload.weights = \"%s\" is ignored\n", rc.offload_weights.c_str());
}

}  // namespace strata
