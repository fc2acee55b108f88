#include "models/model_spec.h"

#include <cmath>

#include "src/core/error.h"

namespace strata {

static int64_t add_param(ModelSpec& spec, const std::string& name, Shape shape) {
  DType dt = shape.size() == 2 ? spec.matrix_dtype : DType::f32;
  return int64_t(spec.params.add(TensorSpec{name, std::move(shape), dt, Tier::device}));
}

ModelSpec model_spec_build(const ModelConfig& cfg, DType matrix_dtype) {
  ModelSpec spec;
  spec.config = cfg;
  spec.matrix_dtype = matrix_dtype;
  const int64_t C = cfg.hidden_size, H = cfg.num_attention_heads, Hk = cfg.num_key_value_heads;
  const int64_t D = cfg.head_dim, F = cfg.intermediate_size, V = cfg.vocab_size;
  STRATA_CHECK(!cfg.mlp_bias, "config.json sets mlp_bias = true, which strata does not support yet");

  spec.embed = add_param(spec, "model.embed_tokens.weight", {V, C});
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    LayerParamRows r;
    r.input_norm = add_param(spec, p + "input_layernorm.weight", {C});
    r.q = add_param(spec, p + "self_attn.q_proj.weight", {H * D, C});
    r.k = add_param(spec, p + "self_attn.k_proj.weight", {Hk * D, C});
    r.v = add_param(spec, p + "self_attn.v_proj.weight", {Hk * D, C});
    r.o = add_param(spec, p + "self_attn.o_proj.weight", {C, H * D});
    if (cfg.qkv_bias) {
      r.q_bias = add_param(spec, p + "self_attn.q_proj.bias", {H * D});
      r.k_bias = add_param(spec, p + "self_attn.k_proj.bias", {Hk * D});
      r.v_bias = add_param(spec, p + "self_attn.v_proj.bias", {Hk * D});
    }
    if (cfg.o_bias) r.o_bias = add_param(spec, p + "self_attn.o_proj.bias", {C});
    if (cfg.qk_norm) {
      r.q_norm = add_param(spec, p + "self_attn.q_norm.weight", {D});
      r.k_norm = add_param(spec, p + "self_attn.k_norm.weight", {D});
    }
    r.post_norm = add_param(spec, p + "post_attention_layernorm.weight", {C});
    r.gate = add_param(spec, p + "mlp.gate_proj.weight", {F, C});
    r.up = add_param(spec, p + "mlp.up_proj.weight", {F, C});
    r.down = add_param(spec, p + "mlp.down_proj.weight", {C, F});
    spec.layers.push_back(r);
  }
  spec.final_norm = add_param(spec, "model.norm.weight", {C});
  if (!cfg.tie_word_embeddings) spec.lm_head = add_param(spec, "lm_head.weight", {V, C});
  return spec;
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
  const int64_t D = cfg.head_dim;
  std::vector<float> inv(size_t(D / 2));
  const float base = float(cfg.rope_theta);
  for (int64_t j = 0; j < D / 2; ++j)
    inv[size_t(j)] = 1.0f / std::pow(base, float(2 * j) / float(D));
  const RopeScaling& rs = cfg.rope_scaling;
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
  return inv;
}

}  // namespace strata
