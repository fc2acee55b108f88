// A Llama-family model (llama, mistral, qwen2, qwen3) as a table of parameters with their
// Hugging Face names, built from config.json. The same table sizes the device, host and
// checkpoint arenas and tells the checkpoint reader which tensors must be present. Each decoder
// layer names its kind (models/layer_kind.h) and its rows in the kind's parameter order.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/hf_config.h"
#include "io/safetensors.h"
#include "models/layer_kind.h"
#include "src/core/tensor.h"

namespace strata {

constexpr int64_t kAbsent = -1;

// One decoder layer: its kind, and per parameter of the kind (LayerKind::params, in order) the
// description and its row in ModelSpec::params (kAbsent where this configuration has none).
struct ModelLayer {
  const LayerKind* kind = nullptr;
  std::vector<LayerParam> params;
  std::vector<int64_t> rows;

  int64_t linear_row(int target) const;  // the row of LoRA target `target` (layer_linear_name); kAbsent
};

struct ModelSpec {
  ModelConfig config;
  DType matrix_dtype = DType::f32;  // 2-D weights on the device; vectors are always f32
  TensorTable params;               // HF names; tier device (resident) by default
  std::vector<ModelLayer> layers;
  int64_t embed = kAbsent, final_norm = kAbsent, lm_head = kAbsent;  // lm_head kAbsent: tied

  int64_t lm_head_row() const { return lm_head == kAbsent ? embed : lm_head; }
  int64_t parameter_count() const;
  std::vector<ExpectedTensor> expected_tensors() const;
  std::vector<const LayerKind*> layer_kinds() const;  // each kind once, in layer order
  // The most any layer needs of `what` at dims d (one workspace serves every layer in turn).
  size_t layer_bytes(LayerBuffer what, const LayerDims& d) const { return layer_kinds_bytes(layer_kinds(), what, d); }
};

// Each layer of the kind its config says (models/moe_layer.h: model_layer_kinds): dense
// (models/dense_layer.h), or mixture-of-experts where config.moe_layer(l).
ModelSpec model_spec_build(const ModelConfig& config, DType matrix_dtype);
// Layer l of kind kinds[l] (one per config.num_hidden_layers).
ModelSpec model_spec_build(const ModelConfig& config, DType matrix_dtype, const std::vector<const LayerKind*>& kinds);

// RoPE inverse frequencies (head_dim/2) as transformers computes them in f32, including the
// llama3 and linear rope_scaling rules.
std::vector<float> model_rope_inv_freq(const ModelConfig& config);

}  // namespace strata
