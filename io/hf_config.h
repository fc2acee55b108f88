// Hugging Face config.json for the supported decoder families (llama, mistral, qwen2, qwen3,
// gemma3_text and a gemma3 checkpoint's text model, olmo2, phi3, and the mixture-of-experts
// qwen3_moe and mixtral):
// parse with transformers' own class defaults, validate with messages that name the file and
// the key, and write back unchanged.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/json.h"

namespace strata {

struct RopeScaling {
  std::string type;  // "" = none (null/absent), "default", "linear", "llama3", "longrope" (phi3; "su" and
                     // "yarn" read as it, as Phi3Config does)
  double factor = 1, low_freq_factor = 1, high_freq_factor = 4;
  int64_t original_max_position_embeddings = 8192;
  // longrope: per frequency (head_dim / 2) divisors, the short ones while max position + 1 <=
  // original_max_position_embeddings, else the long ones; cos and sin scaled by attention_factor
  // (given, or sqrt(1 + ln(factor) / ln(original)) with factor max_position_embeddings / original)
  std::vector<double> short_factor, long_factor;
  double attention_factor = 1;
};

struct ModelConfig {
  std::string family;        // "llama" | "mistral" | "qwen2" | "qwen3" | "gemma3_text" | "olmo2" | "phi3" | "qwen3_moe" | "mixtral" (model_type, cross-checked with architectures[0])
  std::string architecture;  // e.g. "LlamaForCausalLM"
  int64_t hidden_size = 0, intermediate_size = 0, num_hidden_layers = 0, num_attention_heads = 0,
          num_key_value_heads = 0, head_dim = 0, vocab_size = 0, max_position_embeddings = 0;
  double rms_norm_eps = 1e-6, rope_theta = 10000;
  RopeScaling rope_scaling;
  // The leading dims of each head RoPE turns: int(head_dim * partial_rotary_factor) as transformers
  // takes it (phi3: Phi-4-mini's 0.75), the rest pass unrotated; head_dim elsewhere.
  int64_t rotary_dim = 0;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // qwen2: always true; llama/qwen3: "attention_bias"; mistral: false (transformers ignores the key)
  bool o_bias = false;    // llama/qwen3: "attention_bias"; qwen2/mistral: false
  bool qk_norm = false;   // qwen3: true
  bool mlp_bias = false;  // llama "mlp_bias" (default false)
  int64_t sliding_window = 0;     // 0 = none; mistral: "sliding_window"; qwen2/qwen3: only when "use_sliding_window"
  int64_t max_window_layers = 0;  // sliding window applies to layers >= this (qwen2/qwen3); 0 = all layers
  // Mixture of experts (qwen3_moe, mixtral; num_experts 0: every layer dense). Qwen3-MoE's keys and
  // defaults: num_experts (or num_local_experts) 128, num_experts_per_tok 8, moe_intermediate_size
  // 768, norm_topk_prob false, decoder_sparse_step 1, mlp_only_layers []; Mixtral's: num_local_experts
  // 8, num_experts_per_tok 2, experts of intermediate_size, top-k always renormalised. Both:
  // output_router_logits false, router_aux_loss_coef 0.001.
  int64_t num_experts = 0, num_experts_per_tok = 0, moe_intermediate_size = 0, decoder_sparse_step = 1;
  bool norm_topk_prob = false;
  std::vector<int64_t> mlp_only_layers;
  bool output_router_logits = false;
  double router_aux_loss_coef = 0.001;
  // Layer `layer` has a sparse MoE block (transformers' rule: not in mlp_only_layers, and
  // (layer + 1) % decoder_sparse_step == 0); false for every layer of a dense family.
  bool moe_layer(int64_t layer) const;
  // Per layer: 1 where the layer's attention slides over the last sliding_window tokens
  // (transformers' layer_types "sliding_attention"): every layer for mistral; qwen2/qwen3 the
  // layers >= max_window_layers (or their layer_types); gemma3_text its layer_types or
  // sliding_window_pattern. Empty or all 0 when sliding_window is 0.
  std::vector<uint8_t> sliding_layers;
  // Gemma 3 (gemma3_text, or a gemma3 checkpoint's text_config) and OLMo 2 (olmo2); defaults elsewhere.
  int64_t query_pre_attn_scalar = 0;  // gemma3: scores scaled by query_pre_attn_scalar^-1/2 (0: head_dim^-1/2)
  double rope_local_theta = 0;        // gemma3: RoPE base of the sliding layers (rope_local_base_freq)
  std::string text_prefix = "model.";  // where the decoder's tensors live: "model." or a gemma3
                                       // checkpoint's "model.language_model." / "language_model.model."
  std::string torch_dtype;        // as written ("torch_dtype", or "dtype" from newer transformers); may be ""
  nlohmann::json raw;             // the parsed file, for writing it back unchanged
};

// Parses and validates; throws strata::Error (kind input) naming `origin` and the key.
ModelConfig hf_config_parse(const std::string& json_text, const std::string& origin);
// A config.json path, or a directory holding one.
ModelConfig hf_config_load(const std::string& path);
// Writes cfg.raw (pretty, 2-space indent) atomically to path (a file, or a directory that gets
// config.json); the typed fields are not written back: edit raw to change the file.
void hf_config_save(const ModelConfig& cfg, const std::string& path);
std::vector<std::string> hf_config_supported_architectures();

}  // namespace strata
