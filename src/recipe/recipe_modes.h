// The recipe's mode strings parsed into offload/'s mode types (offload/modes.h), once: bad text
// is Error(input) naming the key and its valid values. The only place a mode string is compared.
#pragma once
#include <string>

#include "offload/modes.h"
#include "offload/state/store_layout.h"

namespace strata {

WeightsMode weights_mode_parse(const std::string& text);        // offload.weights: stream | device | auto
CheckpointMode checkpoint_mode_parse(const std::string& text);  // offload.checkpoints
RecomputeMode recompute_mode_parse(const std::string& text);    // offload.recompute
StateTier state_tier_parse(const std::string& text);            // offload.optimizer: auto | host | nvme
AccumulationMode accumulation_mode_parse(const std::string& text);  // offload.accumulation
OptimizerKind optimizer_kind_parse(const std::string& text);    // optim.type: adamw | zo-sgd

}  // namespace strata
