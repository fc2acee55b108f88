// The recipe's spelling of each mode (offload/modes.h).
#include "offload/modes.h"

namespace strata {

const char* mode_name(WeightsMode m) {
  switch (m) {
    case WeightsMode::stream: return "stream";
    case WeightsMode::device: return "device";
    case WeightsMode::automatic: return "auto";
  }
  return "?";
}

const char* mode_name(CheckpointMode m) {
  switch (m) {
    case CheckpointMode::automatic: return "auto";
    case CheckpointMode::device: return "device";
    case CheckpointMode::host: return "host";
    case CheckpointMode::nvme: return "nvme";
  }
  return "?";
}

const char* mode_name(RecomputeMode m) {
  switch (m) {
    case RecomputeMode::automatic: return "auto";
    case RecomputeMode::always: return "always";
    case RecomputeMode::never: return "never";
  }
  return "?";
}

const char* mode_name(StateTier m) {
  switch (m) {
    case StateTier::automatic: return "auto";
    case StateTier::host: return "host";
    case StateTier::nvme: return "nvme";
  }
  return "?";
}

const char* mode_name(AccumulationMode m) {
  switch (m) {
    case AccumulationMode::automatic: return "auto";
    case AccumulationMode::micro_batch: return "micro_batch";
    case AccumulationMode::layer_major: return "layer_major";
  }
  return "?";
}

}  // namespace strata
