// One zeroth-order training step (optim.type = "zo-sgd", DESIGN §8b): for each of the q
// perturbations j of step t (seed_j = zo_seed(train.seed, t, j), kernels/common/zo_rng.h), the
// dual forward of every micro-batch of the step (offload/engine/engine_zo.h; with
// offload.accumulation layer-major all q x k of them in one run, the weights crossing once), then
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

// Zeroth-order parallel (distributed.zo, DistZO2): the N ranks as sides x data groups
// (ZoParallel, offload/engine/engine_zo.h).
//   "data"          every rank runs both passes; N data groups
//   "perturbation"  N = 2: rank 0 runs θ + εz, rank 1 θ − εz, on the same micro-batches
//   "2d"            N even: rank r runs side r % 2 of data group r / 2 (N / 2 groups)
// The step's micro-batches (gradient_accumulation_steps x groups of them, in the single-process
// order) are dealt round-robin over the data groups: group d runs micro-batches d, d + groups, ...
// Every rank regenerates the same z (the same seeds) and all hold the same weights.
ZoParallel zo_parallel_layout(ZoParallelMode mode, int rank, int size);  // bad input: an error

// Model FLOPs of a zo-sgd step per token over those of a forward + backward: two forward passes
// (each a third of forward + backward) per perturbation.
inline double zo_flops_ratio(const Recipe& recipe) { return 2.0 / 3.0 * double(recipe.zo_perturbations); }

// What a zo-sgd run says at start: its settings, and warnings for keys that do not apply
// (optim.max_grad_norm: there is no gradient to clip; offload.weights = "device" and
// offload.checkpoints: the ZO engine always streams and keeps no checkpoints).
void zo_step_notes(const Recipe& recipe);

}  // namespace strata
