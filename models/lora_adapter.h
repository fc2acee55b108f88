// A PEFT LoRA adapter directory, read and checked against a model, and its merge into the base
// weights: W' = W + s · B · A, with s = lora_alpha / r (lora_alpha / sqrt(r) with use_rslora).
//
// The directory is what PEFT's save_pretrained writes:
//   adapter_config.json        r, lora_alpha, target_modules (a list of module names, a regex
//                              string, or "all-linear"), and optionally fan_in_fan_out (false),
//                              use_rslora, rank_pattern / alpha_pattern, layers_to_transform
//   adapter_model.safetensors  base_model.model.<module>.lora_A.weight (r, in) and
//                              base_model.model.<module>.lora_B.weight (out, r), for each adapted
//                              module, e.g. <module> = model.layers.0.self_attn.q_proj
// A mixture-of-experts layer's router and experts come through adapter_config.json's
// target_parameters (PEFT's ParamWrapper): the router <module> = model.layers.0.mlp.gate, a plain
// pair; the experts' packed gate_up_proj and down_proj on model.layers.0.mlp.experts (gate_up_proj's
// on mlp.experts.base_layer when both are targeted), A (E*r, in) and B (out, E*r) with expert e's
// A_e the rows e*r .. e*r+r-1 and B_e the columns k*E + e: read as one LoraPair per expert's row
// (an expert's gate_proj and up_proj share A_e and take the first and last I rows of B_e).
// Every problem is bad input (exit 2) naming the file, the tensor and what was expected: a
// missing file, a tensor the model has no module for, a lone A or B, a shape that disagrees with
// the model or with r, a target module the model does not have, features the merge does not
// implement (DoRA, fan_in_fan_out, trained biases, modules_to_save, embedding adapters).
//
// The merge accumulates B · A in f32 (fused multiply-adds, k = 0 .. r-1 in order), multiplies by
// s and adds the f32 weight (torch's W + (B @ A) * s); the caller rounds once to the stored dtype (model_load_weights through
// lora_adapter_merge_row, or an export writing the merged f32 values). Nothing here knows the
// generator or the trainer.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "models/model_spec.h"

namespace strata {

// One adapted linear layer.
struct LoraPair {
  std::string module;     // "model.layers.0.self_attn.q_proj"
  size_t param_row = 0;   // the row of <module>.weight in ModelSpec::params
  int64_t r = 0, in = 0, out = 0;
  float scale = 0;        // lora_alpha / r, after rank_pattern / alpha_pattern and use_rslora
  std::vector<float> A;   // (r, in)
  std::vector<float> B;   // (out, r)
};

struct LoraAdapter {
  std::string dir;
  int64_t r = 0;           // adapter_config.json's r
  double lora_alpha = 0;
  bool use_rslora = false;
  std::vector<LoraPair> pairs;  // in parameter-row order

  const LoraPair* find(size_t param_row) const;  // null when the row is not adapted
};

// PEFT's module kinds of a Llama-family decoder (and lm_head when the model has its own).
const std::vector<std::string>& lora_module_kinds();

// "base_model.model.<module>.lora_A.weight" (which = 'A') or ".lora_B.weight" (which = 'B').
std::string lora_tensor_name(const std::string& module, char which);

// Reads and checks the adapter in `dir` against `spec` (see the file comment for the errors).
LoraAdapter lora_adapter_read(const std::string& dir, const ModelSpec& spec);

// W (out, in) += scale · B (out, r) · A (r, in), the product accumulated in f32.
void lora_merge_weight(float* W, const float* A, const float* B, int64_t out, int64_t in, int64_t r, float scale);

// Merges the adapter's pair for parameter `param_row` into `values` (that parameter's f32
// values); false, values untouched, when the row is not adapted.
bool lora_adapter_merge_row(const LoraAdapter& adapter, size_t param_row, float* values);

}  // namespace strata
