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

// How the frozen base's decoder-layer linear weights are stored on the host and over the link
// (lora.base_dtype, offload/state/nf4_layout.h): as the working dtype (none), or as bitsandbytes'
// NF4 codes + absmax (double-quantized with double_quant), dequantized to bf16 on the device.
// torch_threads: the torch thread count whose float32 sum the double quantization's mean
// reproduces (kernels/cpu/nf4.h: it matters above 32768 blocks).
struct BaseQuant {
  bool nf4 = false;
  bool double_quant = true;
  int torch_threads = 1;
};

struct ModelSpec {
  ModelConfig config;
  DType matrix_dtype = DType::f32;  // 2-D weights on the device; vectors are always f32
  TensorTable params;               // HF names; tier device (resident) by default
  std::vector<ModelLayer> layers;
  int64_t embed = kAbsent, final_norm = kAbsent, lm_head = kAbsent;  // lm_head kAbsent: tied
  BaseQuant base_quant;             // set after model_spec_build by a QLoRA run

  int64_t lm_head_row() const { return lm_head == kAbsent ? embed : lm_head; }
  int64_t parameter_count() const;
  std::vector<ExpectedTensor> expected_tensors() const;
  std::vector<const LayerKind*> layer_kinds() const;  // each kind once, in layer order
  // The most any layer needs of `what` at dims d (one workspace serves every layer in turn).
  size_t layer_bytes(LayerBuffer what, const LayerDims& d) const { return layer_kinds_bytes(layer_kinds(), what, d); }
};

// Each layer of the kind its family and config say (model_layer_kinds).
ModelSpec model_spec_build(const ModelConfig& config, DType matrix_dtype);
// The kinds model_spec_build gives the layers: dense (sliding where config.sliding_layers says)
// for llama, mistral, qwen2 and qwen3; Gemma 3's and OLMo 2's (models/gemma_layer.h); the
// mixture-of-experts kind where config.moe_layer(l) (models/moe_layer.h), dense elsewhere.
std::vector<const LayerKind*> model_layer_kinds(const ModelConfig& config);
// Layer l of kind kinds[l] (one per config.num_hidden_layers).
ModelSpec model_spec_build(const ModelConfig& config, DType matrix_dtype, const std::vector<const LayerKind*>& kinds);

// RoPE inverse frequencies (head_dim/2) as transformers computes them in f32, including the
// llama3 and linear rope_scaling rules. Gemma 3: head_dim floats, the global layers' (scaled)
// then the sliding layers' (base rope_local_theta): TokenContext::inv_freq holds both. Phi-3's
// LongRoPE: head_dim floats too, the short factors' table then the long ones' (models/phi3_layer.h).
// With a partial rotary factor (phi3) the tables are rotary_dim / 2 long, not head_dim / 2.
std::vector<float> model_rope_inv_freq(const ModelConfig& config);
// Its RMSNorms scale by (1 + w) (Gemma 3): the final norm too (offload/engine/layer_pass.cpp).
inline bool model_norm_plus_one(const ModelConfig& config) { return config.family == "gemma3_text"; }
// The attention scores' scale: query_pre_attn_scalar^-1/2 (Gemma 3), else head_dim^-1/2, times
// LongRoPE's attention_factor squared (Phi-3: it scales q and k).
float model_attention_scale(const ModelConfig& config);

}  // namespace strata
