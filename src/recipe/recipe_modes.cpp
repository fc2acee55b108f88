#include "src/recipe/recipe_modes.h"

#include "src/recipe/recipe.h"

namespace strata {

RecipeModes recipe_modes_parse(const Recipe& t, const std::function<std::string(const char*)>& where) {
  RecipeModes m;
  m.optimizer = mode_parse<OptimizerKind>(t.optim_type, where("optim.type"));
  if (t.objective != "sft") m.preference = mode_parse<PreferenceObjective>(t.objective, where("train.objective"));
  m.weights = mode_parse<WeightsMode>(t.offload_weights, where("offload.weights"));
  m.checkpoints = mode_parse<CheckpointMode>(t.offload_checkpoints, where("offload.checkpoints"));
  m.recompute = mode_parse<RecomputeMode>(t.offload_recompute, where("offload.recompute"));
  m.optimizer_tier = mode_parse<StateTier>(t.offload_optimizer, where("offload.optimizer"));
  m.accumulation = mode_parse<AccumulationMode>(t.offload_accumulation, where("offload.accumulation"));
  m.device = mode_parse<DeviceBackend>(t.device_backend, where("device.backend"));
  m.distributed = mode_parse<CommBackend>(t.distributed_backend, where("distributed.backend"));
  m.shared_host_store = mode_parse<Toggle>(t.distributed_shared_host_store, where("distributed.shared_host_store"));
  m.zo = mode_parse<ZoParallelMode>(t.distributed_zo, where("distributed.zo"));
  m.lr_schedule = mode_parse<LrSchedule>(t.lr_scheduler_type, where("optim.lr_scheduler_type"));
  return m;
}

}  // namespace strata
