// Moving a model's weights between Hugging Face directories (safetensors + config.json) and a
// CausalLM's host mirror: load with full validation, random init from a seed, export.
#pragma once
#include <cstdint>
#include <string>

#include "models/causal_lm.h"

namespace strata {

// Reads every parameter from dir (any of F32/BF16/F16 on disk) into the model's host mirror.
// Missing, unexpected or misshapen tensors are one error listing them all.
void model_load_weights(CausalLM& model, const std::string& dir);

// Initialises weights from a seed the way HF does for a fresh model: matrices N(0, std),
// norms 1, biases 0. Deterministic for a seed, independent of thread count.
void model_init_weights(CausalLM& model, uint64_t seed, double std = 0.02);

// Writes config.json and the weights (sharded when above max_shard_bytes) into dir.
void model_save_hf(const CausalLM& model, const std::string& dir, DType dtype,
                   uint64_t max_shard_bytes = 5ull << 30);

}  // namespace strata
