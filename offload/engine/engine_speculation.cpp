// Speculation (offload.speculative_update; SuperOffload's speculate-then-validate, made exact):
// the Engine's part of a clipped step whose updates start before the global norm is known.
#include <algorithm>

#include "offload/engine/engine.h"
#include "src/core/error.h"

namespace strata {

// With clipping every update waits for the global norm, which is known only after the whole last
// backward. The speculated groups (the options' range: the head and the last layers, which land
// first) update as they land instead, inside the backward, with clip scale 1 and their master,
// m and v copied to a host backup first (HostAdamW::speculate); the gradient is kept. When the
// norm is known, optimizer_step commits each (the gradient consumed) if the norm does not clip,
// or restores it from the backup and updates again with the clip scale. The state then holds
// exactly what the serial step gives, to the bit; the cost of a clipping step is the redone
// updates and the copies back. The uploads of the next pass wait on each group's last ticket.

void Engine::set_speculated_groups(size_t first, size_t end) {
  STRATA_ASSERT(!speculation_pending(), "the speculated groups changed inside a step");
  opt_.speculate_first_group = first;
  opt_.speculate_end_group = end;
  const size_t groups = store_.groups().size();
  spec_.offset.assign(groups, SIZE_MAX);
  spec_.pending.assign(groups, 0);
  spec_.backup.reset();
  spec_.bytes = 0;
  if (!adamw_ || opt_.speculate_first_group >= opt_.speculate_end_group) return;
  STRATA_CHECK(opt_.speculate_first_group >= 1 && opt_.speculate_end_group <= groups, "speculated groups [",
               opt_.speculate_first_group, ", ", opt_.speculate_end_group, ") are not within 1..", groups);
  const HostStoreOptions& so = store_.options();
  STRATA_CHECK(!so.state_on_nvme || opt_.speculate_end_group <= so.nvme_first_group,
               "speculated groups must keep their optimizer state in RAM (the NVMe part starts at group ",
               so.nvme_first_group, ")");
  for (size_t gi = opt_.speculate_first_group; gi < opt_.speculate_end_group; ++gi) {
    spec_.offset[gi] = spec_.bytes;
    spec_.bytes += HostAdamW::speculation_backup_bytes(store_, gi);
  }
  spec_.backup.reset(new char[spec_.bytes]);
}

bool Engine::speculation_pending() const {
  return std::find(spec_.pending.begin(), spec_.pending.end(), 1) != spec_.pending.end();
}

// The norm is known: commit the speculated update of `group`, or redo it with the clip scale.
void Engine::optimizer_queue_speculated(size_t gi, const AdamWParams& params, double weight_decay) {
  const AdamWParams& ran = spec_.params;
  STRATA_ASSERT(ran.lr == params.lr && ran.beta1 == params.beta1 && ran.beta2 == params.beta2 && ran.eps == params.eps &&
                    ran.weight_decay == params.weight_decay && ran.step == params.step &&
                    spec_.weight_decay == weight_decay,
                "optimizer_step got other hyperparameters than the speculated pass ran with");
  spec_.pending[gi] = 0;
  if (params.clip_scale == 1.0) {
    layer_pass_->queue_update(gi, [this, gi] { adamw_->commit(gi); });
    return;
  }
  ++spec_.redos;
  const char* backup = spec_.backup.get() + spec_.offset[gi];
  layer_pass_->queue_update(gi, [this, gi, params, weight_decay, backup] { adamw_->redo(gi, params, weight_decay, backup); });
}

}  // namespace strata
