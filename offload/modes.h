// The run's modes as types: the vocabulary every part of offload/ shares. The recipe's strings
// are parsed into these once (src/recipe/recipe_modes.h); nothing in offload/ compares a mode
// string. `automatic` values are plan inputs only: the plan (offload/plan/placement_plan.h)
// resolves them, and what it returns (RunPlan) holds none but CheckpointMode::automatic and
// RecomputeMode::automatic, which are engine behaviours (keep on the device while the budget
// allows), not undecided choices.
#pragma once
#include <cstdint>

namespace strata {

// offload.weights: two streamed device slots, or every layer resident.
enum class WeightsMode : uint8_t { stream, device, automatic };
// offload.checkpoints: layer inputs on the device while the budget allows then pinned host; all on
// the device; spilled to pinned host; spilled to NVMe files.
enum class CheckpointMode : uint8_t { automatic, device, host, nvme };
// offload.recompute: keep activations while the budget allows; recompute every layer; keep all.
enum class RecomputeMode : uint8_t { automatic, always, never };
// offload.optimizer: where the fp32 master and the AdamW moments live.
enum class StateTier : uint8_t { automatic, host, nvme };
// offload.accumulation: the schedule over a step's micro-batches.
enum class AccumulationMode : uint8_t { automatic, micro_batch, layer_major };

// The recipe's spelling of each value ("stream", "auto", "layer_major", ...), for messages.
const char* mode_name(WeightsMode m);
const char* mode_name(CheckpointMode m);
const char* mode_name(RecomputeMode m);
const char* mode_name(StateTier m);
const char* mode_name(AccumulationMode m);

}  // namespace strata
