#include "src/recipe/recipe_modes.h"

#include "src/core/error.h"

namespace strata {

WeightsMode weights_mode_parse(const std::string& text) {
  if (text == "stream") return WeightsMode::stream;
  if (text == "auto") return WeightsMode::automatic;
  STRATA_CHECK(text == "device", "offload.weights = \"", text, "\": use \"stream\", \"device\" or \"auto\"");
  return WeightsMode::device;
}

CheckpointMode checkpoint_mode_parse(const std::string& text) {
  if (text == "auto") return CheckpointMode::automatic;
  if (text == "device") return CheckpointMode::device;
  if (text == "nvme") return CheckpointMode::nvme;
  STRATA_CHECK(text == "host", "offload.checkpoints = \"", text,
               "\": use \"auto\", \"device\", \"host\" or \"nvme\"");
  return CheckpointMode::host;
}

RecomputeMode recompute_mode_parse(const std::string& text) {
  if (text == "auto") return RecomputeMode::automatic;
  if (text == "always") return RecomputeMode::always;
  STRATA_CHECK(text == "never", "offload.recompute = \"", text, "\": use \"auto\", \"always\" or \"never\"");
  return RecomputeMode::never;
}

StateTier state_tier_parse(const std::string& text) {
  if (text == "auto") return StateTier::automatic;
  if (text == "host") return StateTier::host;
  STRATA_CHECK(text == "nvme", "offload.optimizer = \"", text, "\": use \"auto\", \"host\" or \"nvme\"");
  return StateTier::nvme;
}

AccumulationMode accumulation_mode_parse(const std::string& text) {
  if (text == "auto") return AccumulationMode::automatic;
  if (text == "micro_batch") return AccumulationMode::micro_batch;
  STRATA_CHECK(text == "layer_major", "offload.accumulation = \"", text,
               "\": use \"auto\", \"layer_major\" or \"micro_batch\"");
  return AccumulationMode::layer_major;
}

OptimizerKind optimizer_kind_parse(const std::string& text) {
  if (text == "adamw") return OptimizerKind::adamw;
  STRATA_CHECK(text == "zo-sgd", "optim.type must be \"adamw\" or \"zo-sgd\", not \"", text, "\"");
  return OptimizerKind::zo_sgd;
}

}  // namespace strata
