// The recipe's mode strings parsed into offload/'s mode types (offload/modes.h), once: bad text
// is Error(input) naming the key and its valid values. The only place a mode string is compared.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "offload/modes.h"
#include "offload/objective/preference_loss.h"
#include "offload/state/store_layout.h"

namespace strata {

enum class DeviceBackend : uint8_t;  // src/device/device.h
enum class CommBackend : uint8_t;    // src/comm/comm.h

// The recipe's keys that are not the plan's but still name a mode.
enum class LrSchedule : uint8_t { cosine, linear, constant };   // optim.lr_scheduler_type
enum class Toggle : uint8_t { automatic, on, off };             // distributed.shared_host_store
enum class ZoParallelMode : uint8_t { data, perturbation, pairs_by_data };  // distributed.zo: data, perturbation, 2d

// Every mode key of a recipe, typed: recipe_parse fills Recipe::modes once; the program reads these
// (the recipe's strings stay for messages and the stored recipe).
struct RecipeModes {
  OptimizerKind optimizer = OptimizerKind::adamw;        // optim.type
  std::optional<PreferenceObjective> preference;         // train.objective: none = "sft"
  WeightsMode weights = WeightsMode::automatic;          // offload.*
  CheckpointMode checkpoints = CheckpointMode::automatic;
  RecomputeMode recompute = RecomputeMode::automatic;
  StateTier optimizer_tier = StateTier::automatic;
  AccumulationMode accumulation = AccumulationMode::automatic;
  DeviceBackend device{};                                // device.backend (0: cpu)
  CommBackend distributed{};                             // distributed.backend (0: auto)
  Toggle shared_host_store = Toggle::automatic;
  ZoParallelMode zo = ZoParallelMode::data;
  LrSchedule lr_schedule = LrSchedule::cosine;
  bool drop_overlong = false;                            // data.overlong = "drop"
};

WeightsMode weights_mode_parse(const std::string& text);        // offload.weights: stream | device | auto
CheckpointMode checkpoint_mode_parse(const std::string& text);  // offload.checkpoints
RecomputeMode recompute_mode_parse(const std::string& text);    // offload.recompute
StateTier state_tier_parse(const std::string& text);            // offload.optimizer: auto | host | nvme
AccumulationMode accumulation_mode_parse(const std::string& text);  // offload.accumulation
OptimizerKind optimizer_kind_parse(const std::string& text);    // optim.type: adamw | zo-sgd
PreferenceObjective preference_objective_parse(const std::string& text);  // dpo | ipo | simpo | orpo
DeviceBackend device_backend_parse(const std::string& text);    // device.backend: cpu | cuda | auto
CommBackend comm_backend_parse(const std::string& text);        // distributed.backend: auto | nccl | mpi | single
ZoParallelMode zo_parallel_mode_parse(const std::string& text); // distributed.zo: data | perturbation | 2d
LrSchedule lr_schedule_parse(const std::string& text);          // optim.lr_scheduler_type
Toggle toggle_parse(const std::string& text);                   // distributed.shared_host_store: auto | true | false


}  // namespace strata
