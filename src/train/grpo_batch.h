// The fixed GRPO batch of `strata grad --objective grpo` (issue 41's contract) as a micro-batch
// and its head layout: {"input_ids": [[...]], "completion_mask": [[0|1 ...]], "advantages": [one
// per row], "old_per_token_logps": [[...]]?, "ref_per_token_logps": [[...]]?}, per-token arrays
// aligned with input_ids (entry t: log p of token t given those before it; entry 0 never counts).
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "offload/objective/grpo_head.h"

namespace strata {

struct GrpoBatch {
  MicroBatch mb;
  GrpoLayout layout;  // totals: one micro-batch, its counted tokens
};

// Exit 2 naming the key and row for a malformed batch; ref_per_token_logps required when
// beta > 0 (need_ref).
GrpoBatch grpo_batch_from_json(const nlohmann::json& j, const std::string& path, bool need_ref);

}  // namespace strata
