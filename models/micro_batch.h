// One micro-batch of token rows on the host, as every engine and trainer consumes it.
#pragma once
#include <cstdint>
#include <vector>

namespace strata {

// Targets are already shifted (targets[n] is the label of the token after n; -100 where
// nothing is predicted): the HF causal-LM convention.
struct MicroBatch {
  int64_t B = 0, T = 0;
  std::vector<int32_t> ids;        // (B*T)
  std::vector<int32_t> targets;    // (B*T)
  std::vector<int32_t> pos;        // (B*T) position within the token's document
  std::vector<int32_t> doc_start;  // (B*T) or empty when every row is one document
  int64_t counted() const;         // targets != -100
};

// From rows of input ids and labels (labels empty: = input ids): targets = labels shifted
// left by one, positions 0..T-1, no document boundaries.
MicroBatch micro_batch_from_labels(const std::vector<std::vector<int32_t>>& input_ids,
                                   const std::vector<std::vector<int32_t>>& labels);

}  // namespace strata
