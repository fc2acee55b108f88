#include "models/model_spec.h"

#include <algorithm>
#include <cmath>

#include "models/gemma_layer.h"
#include "models/moe_layer.h"
#include "models/phi3_layer.h"
#include "src/core/error.h"

namespace strata {

static int64_t add_param(ModelSpec& spec, const std::string& name, Shape shape) {
  DType dt = shape.size() == 2 ? spec.matrix_dtype : DType::f32;
  return int64_t(spec.params.add(TensorSpec{name, std::move(shape), dt, Tier::device}));
}

std::vector<const LayerKind*> model_layer_kinds(const ModelConfig& cfg) {
  std::vector<const LayerKind*> kinds;
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
    const bool sliding = size_t(i) < cfg.sliding_layers.size() && cfg.sliding_layers[size_t(i)];
    if (cfg.moe_layer(i))
      kinds.push_back(&moe_layer_kind(cfg));
    else if (cfg.family == "gemma3_text")
      kinds.push_back(&gemma_layer_kind(sliding, i == 0));
    else if (cfg.family == "olmo2")
      kinds.push_back(&olmo2_layer_kind());
    else if (cfg.family == "phi3")
      kinds.push_back(&phi3_layer_kind(cfg, sliding));
    else
      kinds.push_back(&dense_layer_kind(sliding));
  }
  return kinds;
}

ModelSpec model_spec_build(const ModelConfig& cfg, DType matrix_dtype) {
  return model_spec_build(cfg, matrix_dtype, model_layer_kinds(cfg));
}

ModelSpec model_spec_build(const ModelConfig& cfg, DType matrix_dtype, const std::vector<const LayerKind*>& kinds) {
  ModelSpec spec;
  spec.config = cfg;
  spec.matrix_dtype = matrix_dtype;
  const int64_t C = cfg.hidden_size, V = cfg.vocab_size;
  STRATA_ASSERT(int64_t(kinds.size()) == cfg.num_hidden_layers, "one layer kind per layer");

  const std::string& text = cfg.text_prefix;  // "model.", or a gemma3 checkpoint's language model
  spec.embed = add_param(spec, text + "embed_tokens.weight", {V, C});
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
    const std::string prefix = text + "layers." + std::to_string(i) + ".";
    ModelLayer layer{kinds[size_t(i)], kinds[size_t(i)]->params(cfg), {}};
    for (const LayerParam& p : layer.params)
      layer.rows.push_back(p.shape.empty() ? kAbsent : add_param(spec, prefix + p.suffix, p.shape));
    spec.layers.push_back(std::move(layer));
  }
  spec.final_norm = add_param(spec, text + "norm.weight", {C});
  if (!cfg.tie_word_embeddings) spec.lm_head = add_param(spec, "lm_head.weight", {V, C});
  return spec;
}

int64_t ModelLayer::linear_row(int target) const {
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i].lora_target == target) return rows[i];
  return kAbsent;
}

std::vector<const LayerKind*> ModelSpec::layer_kinds() const {
  std::vector<const LayerKind*> kinds;
  for (const ModelLayer& l : layers)
    if (std::find(kinds.begin(), kinds.end(), l.kind) == kinds.end()) kinds.push_back(l.kind);
  return kinds;
}

int64_t ModelSpec::parameter_count() const {
  int64_t n = 0;
  for (auto& r : params.rows()) n += r.numel();
  return n;
}

std::vector<ExpectedTensor> ModelSpec::expected_tensors() const {
  std::vector<ExpectedTensor> out;
  for (auto& r : params.rows()) out.push_back(ExpectedTensor{r.name, r.shape});
  return out;
}

std::vector<float> model_rope_inv_freq(const ModelConfig& cfg) {
  const int64_t D = cfg.rotary_dim > 0 ? cfg.rotary_dim : cfg.head_dim;  // the dims RoPE turns (partial rotary)
  std::vector<float> inv(size_t(D / 2));
  const float base = float(cfg.rope_theta);
  for (int64_t j = 0; j < D / 2; ++j)
    inv[size_t(j)] = 1.0f / std::pow(base, float(2 * j) / float(D));
  const RopeScaling& rs = cfg.rope_scaling;
  if (rs.type == "longrope") {  // transformers: 1 / (f32(factor) * base^(2j / D)), the short table, then the long
    std::vector<float> both;
    for (const std::vector<double>* f : {&rs.short_factor, &rs.long_factor})
      for (int64_t j = 0; j < D / 2; ++j)
        both.push_back(1.0f / (float((*f)[size_t(j)]) * std::pow(base, float(2 * j) / float(D))));
    return both;
  }
  if (rs.type == "linear") {
    for (auto& f : inv) f = f / float(rs.factor);
  } else if (rs.type == "llama3") {
    const float factor = float(rs.factor), lo = float(rs.low_freq_factor), hi = float(rs.high_freq_factor);
    const float old_len = float(rs.original_max_position_embeddings);
    const float lo_wavelen = old_len / lo, hi_wavelen = old_len / hi;
    const float pi = 3.14159265358979323846f;
    for (auto& f : inv) {
      float wavelen = 2 * pi / f;
      float scaled = wavelen > lo_wavelen ? f / factor : f;
      float smooth = (old_len / wavelen - lo) / (hi - lo);
      float smoothed = (1 - smooth) * scaled / factor + smooth * scaled;
      bool medium = !(wavelen < hi_wavelen) && !(wavelen > lo_wavelen);
      f = medium ? smoothed : scaled;
    }
  }
  if (cfg.family == "gemma3_text") {  // the sliding layers' table after the global one: default RoPE
    const float local = float(cfg.rope_local_theta);
    for (int64_t j = 0; j < D / 2; ++j) inv.push_back(1.0f / std::pow(local, float(2 * j) / float(D)));
  }
  return inv;
}

float model_attention_scale(const ModelConfig& cfg) {
  // transformers: query_pre_attn_scalar**-0.5 in Python (f64), then f32; head_dim as the kernels
  // always computed it
  if (cfg.query_pre_attn_scalar > 0) return float(1.0 / std::sqrt(double(cfg.query_pre_attn_scalar)));
  // LongRoPE scales cos and sin, so q and k, by attention_factor: the scores by its square
  if (cfg.rope_scaling.type == "longrope") {
    const float af = float(cfg.rope_scaling.attention_factor);
    return af * af / std::sqrt(float(cfg.head_dim));
  }
  return 1.0f / std::sqrt(float(cfg.head_dim));
}

}  // namespace strata
