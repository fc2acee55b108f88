// ZO-SGD (MeZO / SPSA, DESIGN §8b) as a group optimizer (offload/state/optimizer.h): the update of one
// parameter group's fp32 master weights from a step's estimate, with z regenerated on the host
// (kernels/cpu/zo.h: vectorised, OpenMP over the tensor, the same bits on every thread count):
//   θ ← θ − lr · (Σ_j c_j z_j + wd · θ),   c_j = g_j / q,   g_j = (L+_j − L−_j) / (2ε)
// over the q perturbations j of the step (seed_j = zo_seed(train.seed, step, j)); weight decay
// on matrices only, as for AdamW. The working copy the device reads is rewritten from the new
// master (rounded to bf16 when the working dtype is bf16). No gradient, no moments.
#pragma once
#include <cstdint>
#include <vector>

#include "offload/state/optimizer.h"

namespace strata {

// One step's estimate: seeds[j] and coefs[j] = g_j / q for each perturbation j.
struct ZoSgdEstimate {
  std::vector<uint64_t> seeds;
  std::vector<float> coefs;
};

class HostZoSgd final : public GroupOptimizer {
 public:
  static constexpr OptimizerStateNeeds kState = optimizer_state_needs(OptimizerKind::zo_sgd);  // the master alone
  HostZoSgd(HostStore& store, StatePlacement& placement) : store_(store), placement_(placement) {}
  // The estimate the next update() calls use; set while no update is running.
  void set_estimate(ZoSgdEstimate estimate);
  // hyper.lr is the step's learning rate; the AdamW fields are not read.
  void update(size_t group, const AdamWParams& hyper, double weight_decay) override;

 private:
  HostStore& store_;
  StatePlacement& placement_;
  ZoSgdEstimate estimate_;
};

}  // namespace strata
