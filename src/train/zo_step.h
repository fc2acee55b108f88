// One zeroth-order training step (optim.type = "zo-sgd", DESIGN §8b): for each of the q
// perturbations j of step t (seed_j = zo_seed(train.seed, t, j), kernels/common/zo_rng.h), the
// dual forward of every micro-batch of the step (offload/engine/engine_zo.h), then
//   g_j = (ΣL+ − ΣL−) / counted / (2ε)
// the projected gradient of the step's token-mean loss (gradient accumulation = more batches in
// one estimate), and the ZO-SGD update of every group queued on the host with coefficients g_j / q
// (offload/state/zo_sgd.h). The RNG position is (train.seed, step): a resumed run regenerates the same
// z from the checkpoint's step, so resume is bit-exact with nothing more to store.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "models/micro_batch.h"
#include "offload/engine/engine_zo.h"
#include "src/comm/comm.h"
#include "src/recipe/recipe.h"

namespace strata {

struct ZoStepOptions {
  uint64_t seed = 0;      // train.seed
  double eps = 1e-3;      // optim.zo_eps
  int perturbations = 1;  // optim.zo_perturbations (q)
};

struct ZoStepOutcome {
  double loss_plus = 0, loss_minus = 0;  // token-mean L(θ ± εz), averaged over the q perturbations
  double projected_grad = 0;             // mean over j of g_j
  std::vector<double> projected;         // g_j
  size_t comm_bytes = 0;                 // the loss scalars this rank all-reduced (0 on one rank)
  double loss() const { return 0.5 * (loss_plus + loss_minus); }  // L(θ) to O(ε²)
};

// The ε the passes perturb with (an f32 value, as the device sees it).
inline double zo_eps_used(double eps) { return double(float(eps)); }

// Zeroth-order parallel (distributed.zo, DistZO2): the N ranks as sides x data groups.
//   "data"          every rank runs both passes; N data groups
//   "perturbation"  N = 2: rank 0 runs θ + εz, rank 1 θ − εz, on the same micro-batches
//   "2d"            N even: rank r runs side r % 2 of data group r / 2 (N / 2 groups)
// The step's micro-batches (gradient_accumulation_steps x groups of them, in the single-process
// order) are dealt round-robin over the data groups: group d runs micro-batches d, d + groups, ...
// Every rank regenerates the same z (the same seeds) and all hold the same weights.
struct ZoParallel {
  int sides = 1;   // 1: both passes on each rank; 2: one side per rank of a pair
  int side = 0;    // with sides = 2: 0 runs θ + εz, 1 runs θ − εz
  int groups = 1;  // data groups
  int group = 0;   // this rank's
};
ZoParallel zo_parallel_layout(const std::string& mode, int rank, int size);  // bad input: an error

// The step's dual forwards and its queued update; `step` is 1-based. Throws (bad input) when a
// loss is not finite. `micro` is this rank's share of the step (all of it on one rank); `counted`
// the labelled tokens of the whole step. With several ranks (comm given, layout `par`) each rank
// computes its side's summed loss of each of its micro-batches, one all-reduce of those scalars
// (q x micro-batches x 2 doubles, each filled by one rank, zeros elsewhere: the sum is exact)
// gives every rank all of them, and each sums them in the single-process order: the losses, the
// projected gradients and hence the update are bit-identical to one process running the whole
// step.
ZoStepOutcome zo_step_run(ZoEngine& engine, const ZoStepOptions& options, const std::vector<MicroBatch>& micro,
                          int64_t counted, int64_t step, double lr, double weight_decay, const ZoParallel& par = {},
                          Comm* comm = nullptr);

// Model FLOPs of a zo-sgd step per token over those of a forward + backward: two forward passes
// (each a third of forward + backward) per perturbation.
inline double zo_flops_ratio(const Recipe& recipe) { return 2.0 / 3.0 * double(recipe.zo_perturbations); }

// What a zo-sgd run says at start: its settings, and warnings for keys that do not apply
// (optim.max_grad_norm: there is no gradient to clip; offload.weights = "device" and
// offload.checkpoints: the ZO engine always streams and keeps no checkpoints).
void zo_step_notes(const Recipe& recipe);

}  // namespace strata
