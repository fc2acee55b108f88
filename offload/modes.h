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
// offload.speculative_update: with clipping, start a group's AdamW as its gradient lands in the
// last backward, before the global norm is known, keeping its master and moments to redo the
// update exactly when the norm clips (engine.cpp); auto: where the plan finds it faster and the
// backup fits; on: as many groups as the host budget holds; off: never.
enum class SpeculateMode : uint8_t { automatic, on, off };
// offload.working_weights: the bf16 working copy of the decoder layers kept in RAM ("stored"), or
// made from the fp32 master at each upload ("derived": 2 bytes a parameter less in RAM, the same
// bits on the device, a host conversion per upload); auto: the plan's choice by the step model.
enum class WorkingMode : uint8_t { automatic, stored, derived };
// offload.norm_pass: with clipping at one pass a step, run the pass twice, the first for the
// global norm alone (each gradient dropped as it lands), the second updating each group as it
// lands, clipped: the gradient buffer shrinks to one slot for a second pass of compute and
// transfers (engine.cpp, StepWork::norm_pass); auto: the plan's choice by the step model.
enum class NormPassMode : uint8_t { automatic, on, off };

// A mode's spellings: its recipe key and every value's name, in the order messages list them. One
// table per enum, found by mode_table(E{}) (here, beside the enums elsewhere, and in
// src/recipe/recipe_modes.cpp), read by the recipe's parsing and by messages alike.
template <class E>
struct ModeSpelling {
  E value;
  const char* name;  // as the recipe writes it
};
template <class E>
struct ModeTable {
  const char* key;  // the recipe key
  const ModeSpelling<E>* first;
  size_t count;
  const ModeSpelling<E>* begin() const { return first; }
  const ModeSpelling<E>* end() const { return first + count; }
};
template <class E, size_t N>
constexpr ModeTable<E> mode_table_of(const char* key, const ModeSpelling<E> (&spellings)[N]) {
  return {key, spellings, N};
}

inline constexpr ModeSpelling<WeightsMode> kWeightsModes[] = {
    {WeightsMode::automatic, "auto"}, {WeightsMode::stream, "stream"}, {WeightsMode::device, "device"}};
inline constexpr ModeSpelling<CheckpointMode> kCheckpointModes[] = {{CheckpointMode::automatic, "auto"},
    {CheckpointMode::device, "device"}, {CheckpointMode::host, "host"}, {CheckpointMode::nvme, "nvme"}};
inline constexpr ModeSpelling<RecomputeMode> kRecomputeModes[] = {
    {RecomputeMode::automatic, "auto"}, {RecomputeMode::always, "always"}, {RecomputeMode::never, "never"}};
inline constexpr ModeSpelling<StateTier> kStateTiers[] = {
    {StateTier::automatic, "auto"}, {StateTier::host, "host"}, {StateTier::nvme, "nvme"}};
inline constexpr ModeSpelling<AccumulationMode> kAccumulationModes[] = {{AccumulationMode::automatic, "auto"},
    {AccumulationMode::layer_major, "layer_major"}, {AccumulationMode::micro_batch, "micro_batch"}};
inline constexpr ModeSpelling<SpeculateMode> kSpeculateModes[] = {
    {SpeculateMode::automatic, "auto"}, {SpeculateMode::on, "on"}, {SpeculateMode::off, "off"}};
inline constexpr ModeSpelling<NormPassMode> kNormPassModes[] = {
    {NormPassMode::automatic, "auto"}, {NormPassMode::on, "on"}, {NormPassMode::off, "off"}};
inline constexpr ModeSpelling<WorkingMode> kWorkingModes[] = {
    {WorkingMode::automatic, "auto"}, {WorkingMode::stored, "stored"}, {WorkingMode::derived, "derived"}};

constexpr ModeTable<WeightsMode> mode_table(WeightsMode) { return mode_table_of("offload.weights", kWeightsModes); }
constexpr ModeTable<CheckpointMode> mode_table(CheckpointMode) {
  return mode_table_of("offload.checkpoints", kCheckpointModes);
}
constexpr ModeTable<RecomputeMode> mode_table(RecomputeMode) { return mode_table_of("offload.recompute", kRecomputeModes); }
constexpr ModeTable<StateTier> mode_table(StateTier) { return mode_table_of("offload.optimizer", kStateTiers); }
constexpr ModeTable<AccumulationMode> mode_table(AccumulationMode) {
  return mode_table_of("offload.accumulation", kAccumulationModes);
}
constexpr ModeTable<SpeculateMode> mode_table(SpeculateMode) {
  return mode_table_of("offload.speculative_update", kSpeculateModes);
}
constexpr ModeTable<WorkingMode> mode_table(WorkingMode) { return mode_table_of("offload.working_weights", kWorkingModes); }
constexpr ModeTable<NormPassMode> mode_table(NormPassMode) { return mode_table_of("offload.norm_pass", kNormPassModes); }

// The recipe's spelling of a value ("stream", "auto", "layer_major", ...), for messages.
template <class E>
const char* mode_name(E value) {
  for (const ModeSpelling<E>& s : mode_table(E{}))
    if (s.value == value) return s.name;
  return "?";
}

}  // namespace strata
