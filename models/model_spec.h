// A Llama-family model (llama, mistral, qwen2, qwen3) as a table of parameters with their
// Hugging Face names, built from config.json. The same table sizes the device, host and
// checkpoint arenas and tells the checkpoint reader which tensors must be present.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/hf_config.h"
#include "io/safetensors.h"
#include "src/core/tensor.h"

namespace strata {

constexpr int64_t kAbsent = -1;

// Row indices into ModelSpec::params for one decoder layer; kAbsent where the family has none.
struct LayerParamRows {
  int64_t input_norm = kAbsent, q = kAbsent, k = kAbsent, v = kAbsent, o = kAbsent;
  int64_t q_bias = kAbsent, k_bias = kAbsent, v_bias = kAbsent, o_bias = kAbsent;
  int64_t q_norm = kAbsent, k_norm = kAbsent;
  int64_t post_norm = kAbsent, gate = kAbsent, up = kAbsent, down = kAbsent;
};

struct ModelSpec {
  ModelConfig config;
  DType matrix_dtype = DType::f32;  // 2-D weights on the device; vectors are always f32
  TensorTable params;               // HF names; tier device (resident) by default
  std::vector<LayerParamRows> layers;
  int64_t embed = kAbsent, final_norm = kAbsent, lm_head = kAbsent;  // lm_head kAbsent: tied

  int64_t lm_head_row() const { return lm_head == kAbsent ? embed : lm_head; }
  int64_t parameter_count() const;
  std::vector<ExpectedTensor> expected_tensors() const;
};

ModelSpec model_spec_build(const ModelConfig& config, DType matrix_dtype);

// RoPE inverse frequencies (head_dim/2) as transformers computes them in f32, including the
// llama3 and linear rope_scaling rules.
std::vector<float> model_rope_inv_freq(const ModelConfig& config);

}  // namespace strata
