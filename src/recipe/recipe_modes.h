// The recipe's mode strings parsed into offload/'s mode types (offload/modes.h), once: bad text
// is Error(input) naming the key and its valid values. The only place a mode string is compared.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "offload/modes.h"
#include "offload/objective/preference_loss.h"
#include "offload/state/store_layout.h"
#include "src/comm/comm.h"
#include "src/core/error.h"
#include "src/device/device.h"

namespace strata {

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
  SpeculateMode speculate = SpeculateMode::automatic;
  WorkingMode working = WorkingMode::automatic;
  NormPassMode norm_pass = NormPassMode::automatic;
  DeviceBackend device{};                                // device.backend (0: cpu)
  CommBackend distributed{};                             // distributed.backend (0: auto)
  Toggle shared_host_store = Toggle::automatic;
  ZoParallelMode zo = ZoParallelMode::data;
  LrSchedule lr_schedule = LrSchedule::cosine;
  bool drop_overlong = false;                            // data.overlong = "drop"
};


// The spellings of the recipe's modes that offload/ does not hold (distributed.backend = "single"
// is refused by the recipe's checks: it is the launcher's).
inline constexpr ModeSpelling<DeviceBackend> kDeviceBackends[] = {
    {DeviceBackend::cpu, "cpu"}, {DeviceBackend::cuda, "cuda"}, {DeviceBackend::automatic, "auto"}};
inline constexpr ModeSpelling<CommBackend> kCommBackends[] = {{CommBackend::automatic, "auto"},
    {CommBackend::nccl, "nccl"}, {CommBackend::mpi, "mpi"}, {CommBackend::single, "single"}};
inline constexpr ModeSpelling<ZoParallelMode> kZoParallelModes[] = {{ZoParallelMode::data, "data"},
    {ZoParallelMode::perturbation, "perturbation"}, {ZoParallelMode::pairs_by_data, "2d"}};
inline constexpr ModeSpelling<LrSchedule> kLrSchedules[] = {
    {LrSchedule::cosine, "cosine"}, {LrSchedule::linear, "linear"}, {LrSchedule::constant, "constant"}};
inline constexpr ModeSpelling<Toggle> kToggles[] = {{Toggle::automatic, "auto"}, {Toggle::on, "true"}, {Toggle::off, "false"}};

constexpr ModeTable<DeviceBackend> mode_table(DeviceBackend) { return mode_table_of("device.backend", kDeviceBackends); }
constexpr ModeTable<CommBackend> mode_table(CommBackend) { return mode_table_of("distributed.backend", kCommBackends); }
constexpr ModeTable<ZoParallelMode> mode_table(ZoParallelMode) { return mode_table_of("distributed.zo", kZoParallelModes); }
constexpr ModeTable<LrSchedule> mode_table(LrSchedule) { return mode_table_of("optim.lr_scheduler_type", kLrSchedules); }
constexpr ModeTable<Toggle> mode_table(Toggle) { return mode_table_of("distributed.shared_host_store", kToggles); }

// The value `text` spells, or Error(input) at `where`: `key must be "a", "b" or "c" (not "text")`
// (distributed.shared_host_store's true and false unquoted: they are TOML booleans there).
template <class E>
E mode_parse(const std::string& text, const std::string& where) {
  const ModeTable<E> table = mode_table(E{});
  std::string valid;
  for (size_t i = 0; i < table.count; ++i) {
    const ModeSpelling<E>& s = table.first[i];
    if (text == s.name) return s.value;
    const bool quoted = std::string_view(s.name) != "true" && std::string_view(s.name) != "false";
    valid += str_cat(i == 0 ? "" : i + 1 == table.count ? " or " : ", ", quoted ? "\"" : "", s.name, quoted ? "\"" : "");
  }
  STRATA_CHECK(false, where, where.empty() ? "" : ": ", table.key, " must be ", valid, " (not \"", text, "\")");
  return table.first[0].value;
}

// One mode from its spelling, for the command line and tests (the message as above, without a place).
inline WeightsMode weights_mode_parse(const std::string& t) { return mode_parse<WeightsMode>(t, ""); }  // auto | stream | device
inline CheckpointMode checkpoint_mode_parse(const std::string& t) { return mode_parse<CheckpointMode>(t, ""); }  // offload.checkpoints
inline RecomputeMode recompute_mode_parse(const std::string& t) { return mode_parse<RecomputeMode>(t, ""); }  // offload.recompute
inline StateTier state_tier_parse(const std::string& t) { return mode_parse<StateTier>(t, ""); }  // offload.optimizer
inline AccumulationMode accumulation_mode_parse(const std::string& t) {  // offload.accumulation
  return mode_parse<AccumulationMode>(t, "");
}
inline OptimizerKind optimizer_kind_parse(const std::string& t) { return mode_parse<OptimizerKind>(t, ""); }  // adamw | zo-sgd
inline PreferenceObjective preference_objective_parse(const std::string& t) {  // dpo | ipo | simpo | orpo
  return mode_parse<PreferenceObjective>(t, "");
}
inline DeviceBackend device_backend_parse(const std::string& t) { return mode_parse<DeviceBackend>(t, ""); }  // cpu | cuda | auto
inline CommBackend comm_backend_parse(const std::string& t) { return mode_parse<CommBackend>(t, ""); }  // distributed.backend
inline ZoParallelMode zo_parallel_mode_parse(const std::string& t) {  // data | perturbation | 2d
  return mode_parse<ZoParallelMode>(t, "");
}
inline LrSchedule lr_schedule_parse(const std::string& t) { return mode_parse<LrSchedule>(t, ""); }  // cosine | linear | constant
inline Toggle toggle_parse(const std::string& t) { return mode_parse<Toggle>(t, ""); }  // auto | true | false

}  // namespace strata
