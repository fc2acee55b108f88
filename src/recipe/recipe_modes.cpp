#include "src/recipe/recipe_modes.h"

#include "src/comm/comm.h"
#include "src/core/error.h"
#include "src/device/device.h"

namespace strata {

// The spellings of the modes offload/modes.h does not hold.
template <>
struct ModeTable<OptimizerKind> {
  static constexpr const char* key = "optim.type";
  static constexpr ModeSpelling<OptimizerKind> values[] = {{OptimizerKind::adamw, "adamw"},
                                                           {OptimizerKind::zo_sgd, "zo-sgd"}};
};
template <>
struct ModeTable<PreferenceObjective> {
  static constexpr const char* key = "train.objective";
  static constexpr ModeSpelling<PreferenceObjective> values[] = {{PreferenceObjective::dpo, "dpo"},
                                                                 {PreferenceObjective::ipo, "ipo"},
                                                                 {PreferenceObjective::simpo, "simpo"},
                                                                 {PreferenceObjective::orpo, "orpo"}};
};
template <>
struct ModeTable<DeviceBackend> {
  static constexpr const char* key = "device.backend";
  static constexpr ModeSpelling<DeviceBackend> values[] = {
      {DeviceBackend::cpu, "cpu"}, {DeviceBackend::cuda, "cuda"}, {DeviceBackend::automatic, "auto"}};
};
template <>
struct ModeTable<CommBackend> {
  static constexpr const char* key = "distributed.backend";
  static constexpr ModeSpelling<CommBackend> values[] = {{CommBackend::automatic, "auto"},
                                                         {CommBackend::nccl, "nccl"},
                                                         {CommBackend::mpi, "mpi"},
                                                         {CommBackend::single, "single"}};
};
template <>
struct ModeTable<ZoParallelMode> {
  static constexpr const char* key = "distributed.zo";
  static constexpr ModeSpelling<ZoParallelMode> values[] = {{ZoParallelMode::data, "data"},
                                                            {ZoParallelMode::perturbation, "perturbation"},
                                                            {ZoParallelMode::pairs_by_data, "2d"}};
};
template <>
struct ModeTable<LrSchedule> {
  static constexpr const char* key = "optim.lr_scheduler_type";
  static constexpr ModeSpelling<LrSchedule> values[] = {
      {LrSchedule::cosine, "cosine"}, {LrSchedule::linear, "linear"}, {LrSchedule::constant, "constant"}};
};
template <>
struct ModeTable<Toggle> {
  static constexpr const char* key = "distributed.shared_host_store";
  static constexpr ModeSpelling<Toggle> values[] = {
      {Toggle::automatic, "auto"}, {Toggle::on, "true"}, {Toggle::off, "false"}};
};

namespace {

// The value `text` spells, or Error(input): `key = "text": use "a", "b" or "c"`.
template <class E>
E mode_parse(const std::string& text) {
  std::string valid;
  const size_t n = std::size(ModeTable<E>::values);
  for (size_t i = 0; i < n; ++i) {
    const ModeSpelling<E>& s = ModeTable<E>::values[i];
    if (text == s.name) return s.value;
    valid += str_cat(i == 0 ? "" : i + 1 == n ? " or " : ", ", "\"", s.name, "\"");
  }
  STRATA_CHECK(false, ModeTable<E>::key, " = \"", text, "\": use ", valid);
  return ModeTable<E>::values[0].value;
}

}  // namespace

WeightsMode weights_mode_parse(const std::string& text) { return mode_parse<WeightsMode>(text); }
CheckpointMode checkpoint_mode_parse(const std::string& text) { return mode_parse<CheckpointMode>(text); }
RecomputeMode recompute_mode_parse(const std::string& text) { return mode_parse<RecomputeMode>(text); }
StateTier state_tier_parse(const std::string& text) { return mode_parse<StateTier>(text); }
AccumulationMode accumulation_mode_parse(const std::string& text) { return mode_parse<AccumulationMode>(text); }
OptimizerKind optimizer_kind_parse(const std::string& text) { return mode_parse<OptimizerKind>(text); }
PreferenceObjective preference_objective_parse(const std::string& text) { return mode_parse<PreferenceObjective>(text); }
DeviceBackend device_backend_parse(const std::string& text) { return mode_parse<DeviceBackend>(text); }
CommBackend comm_backend_parse(const std::string& text) { return mode_parse<CommBackend>(text); }
ZoParallelMode zo_parallel_mode_parse(const std::string& text) { return mode_parse<ZoParallelMode>(text); }
LrSchedule lr_schedule_parse(const std::string& text) { return mode_parse<LrSchedule>(text); }
Toggle toggle_parse(const std::string& text) { return mode_parse<Toggle>(text); }

}  // namespace strata
