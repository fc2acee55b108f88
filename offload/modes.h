// The run's modes as types: the vocabulary every part of offload/ shares. The recipe's strings
// are parsed into these once (src/recipe/recipe_modes.h); nothing in offload/ compares a mode
// string. `automatic` values are plan inputs only: the plan (offload/plan/placement_plan.h)
// resolves them, and what it returns (RunPlan) holds none but CheckpointMode::automatic and
// RecomputeMode::automatic, which are engine behaviours (keep on the device while the budget
// allows), not undecided choices.
#pragma once
#include <cstddef>
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

// A mode's spellings: one table per enum (here and in src/recipe/recipe_modes.h), read by the
// recipe's parsing and by messages alike.
template <class E>
struct ModeSpelling {
  E value;
  const char* name;  // as the recipe writes it
};
template <class E>
struct ModeTable;  // ModeTable<E>::key (the recipe key) and ::values (every spelling)

template <>
struct ModeTable<WeightsMode> {
  static constexpr const char* key = "offload.weights";
  static constexpr ModeSpelling<WeightsMode> values[] = {
      {WeightsMode::stream, "stream"}, {WeightsMode::device, "device"}, {WeightsMode::automatic, "auto"}};
};
template <>
struct ModeTable<CheckpointMode> {
  static constexpr const char* key = "offload.checkpoints";
  static constexpr ModeSpelling<CheckpointMode> values[] = {{CheckpointMode::automatic, "auto"},
                                                            {CheckpointMode::device, "device"},
                                                            {CheckpointMode::host, "host"},
                                                            {CheckpointMode::nvme, "nvme"}};
};
template <>
struct ModeTable<RecomputeMode> {
  static constexpr const char* key = "offload.recompute";
  static constexpr ModeSpelling<RecomputeMode> values[] = {
      {RecomputeMode::automatic, "auto"}, {RecomputeMode::always, "always"}, {RecomputeMode::never, "never"}};
};
template <>
struct ModeTable<StateTier> {
  static constexpr const char* key = "offload.optimizer";
  static constexpr ModeSpelling<StateTier> values[] = {
      {StateTier::automatic, "auto"}, {StateTier::host, "host"}, {StateTier::nvme, "nvme"}};
};
template <>
struct ModeTable<AccumulationMode> {
  static constexpr const char* key = "offload.accumulation";
  static constexpr ModeSpelling<AccumulationMode> values[] = {{AccumulationMode::automatic, "auto"},
                                                              {AccumulationMode::micro_batch, "micro_batch"},
                                                              {AccumulationMode::layer_major, "layer_major"}};
};

// The recipe's spelling of a value ("stream", "auto", "layer_major", ...), for messages.
template <class E>
const char* mode_name(E value) {
  for (const ModeSpelling<E>& s : ModeTable<E>::values)
    if (s.value == value) return s.name;
  return "?";
}

}  // namespace strata
