#include "src/train/zo_step.h"

#include <cmath>
#include <cstdio>

#include "src/core/error.h"

namespace strata {

ZoParallel zo_parallel_layout(ZoParallelMode mode, int rank, int size) {
  STRATA_ASSERT(size >= 1 && rank >= 0 && rank < size);
  ZoParallel p;
  if (mode == ZoParallelMode::data) {
    p.groups = size;
    p.group = rank;
    return p;
  }
  STRATA_CHECK(mode != ZoParallelMode::perturbation || size == 2, "distributed.zo = \"perturbation\" runs on a pair of ranks (one "
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

void zo_step_notes(const Recipe& rc) {
  std::fprintf(stderr, "strata train: zeroth-order training (zo-sgd): eps %g, %ld perturbation(s) per step, "
               "two forward passes per micro-batch and perturbation, no gradients or optimizer moments\n",
               zo_eps_used(rc.zo_eps), long(rc.zo_perturbations));
  if (rc.max_grad_norm_set && rc.max_grad_norm > 0)
    std::fprintf(stderr, "strata train: warning: optim.max_grad_norm = %g does not apply to zo-sgd (there is no "
                 "gradient to clip; the step is lr * projected_grad * z); it is ignored\n", rc.max_grad_norm);
  if (rc.modes.weights == WeightsMode::device)
    std::fprintf(stderr, "strata train: note: zo-sgd always streams the layers (its weights change every step); "
                 "offload.weights = \"%s\" is ignored\n", rc.offload_weights.c_str());
}

}  // namespace strata
