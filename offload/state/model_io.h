// Moving a model's weights between Hugging Face directories (safetensors + config.json) and the
// host parameter store: load with full validation, random init from a seed, export.
#pragma once
#include <cstdint>
#include <string>

#include "models/lora_adapter.h"
#include "offload/state/host_store.h"

namespace strata {

// The HF export converts a tensor to its save dtype through a buffer of this many elements (the
// placement plan counts it among the transient buffers).
inline constexpr size_t kExportChunkElements = size_t(1) << 20;

// Reads every parameter from dir (any of F32/BF16/F16 on disk) into the store (master and
// working copy). Missing, unexpected or misshapen tensors are one error listing them all.
// With an adapter (models/lora_adapter.h), each adapted weight is merged in f32 as it is read
// and rounded once to the store's dtypes. A dir saved pre-quantized by bitsandbytes (4-bit NF4)
// is read by nf4_hf_load; any other quantization_config is refused by name.
void model_load_weights(HostStore& store, const std::string& dir, const LoraAdapter* adapter = nullptr);

// Initialises weights from a seed the way HF does for a fresh model: matrices N(0, std),
// norms 1, biases 0. Deterministic for a seed; one generator per tensor.
void model_init_weights(HostStore& store, uint64_t seed, double std = 0.02);

// Writes config.json and the master weights (rounded to dtype; sharded above max_shard_bytes).
void model_save_hf(const HostStore& store, const std::string& dir, DType dtype,
                   uint64_t max_shard_bytes = 5ull << 30);

}  // namespace strata
