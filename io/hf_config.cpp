// config.json parsing for llama / mistral / qwen2 / qwen3 / gemma3_text (and a gemma3
// checkpoint's text_config) / olmo2 / qwen3_moe / mixtral. Defaults are those of transformers'
// LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config (v4.5x), Gemma3TextConfig, Olmo2Config,
// Phi3Config, Qwen3MoeConfig and MixtralConfig (v5.24), applied when a key is absent;
// a key set to null falls back the way those classes do (e.g. num_key_value_heads -> heads).
#include "io/hf_config.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "io/files.h"
#include "io/safetensors.h"
#include "src/core/error.h"

namespace strata {

namespace {

using json = nlohmann::json;

struct Family {
  const char* model_type;
  const char* architecture;
};
constexpr Family kFamilies[] = {{"llama", "LlamaForCausalLM"},
                                {"mistral", "MistralForCausalLM"},
                                {"qwen2", "Qwen2ForCausalLM"},
                                {"qwen3", "Qwen3ForCausalLM"},
                                {"gemma3_text", "Gemma3ForCausalLM"},
                                {"olmo2", "Olmo2ForCausalLM"},
                                {"phi3", "Phi3ForCausalLM"},
                                {"qwen3_moe", "Qwen3MoeForCausalLM"},
                                {"mixtral", "MixtralForCausalLM"}};

std::string supported_list() {
  std::string s;
  for (const auto& f : kFamilies) s += str_cat(s.empty() ? "" : ", ", f.architecture, " (", f.model_type, ")");
  return s;
}

// Typed access to one config object with messages that name the file and the key.
struct Reader {
  const json& j;
  const std::string& origin;
  std::string prefix;  // "" for top level, "rope_scaling." inside

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw Error(ErrorKind::input, str_cat("config ", origin, ": key '", prefix, key, "' ", what));
  }
  // Present and not null.
  const json* get(const std::string& key) const {
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  }
  bool has_key(const std::string& key) const { return j.contains(key); }

  int64_t integer(const std::string& key, const json* v) const {
    if (v->is_number_unsigned()) {
      uint64_t u = v->get<uint64_t>();
      if (u > uint64_t(INT64_MAX)) fail(key, str_cat("is too large: ", u));
      return int64_t(u);
    }
    if (v->is_number_integer()) return v->get<int64_t>();
    fail(key, str_cat("must be an integer, got ", v->type_name(), " ", v->dump()));
  }
  int64_t req_int(const std::string& key) const {
    auto it = j.find(key);
    if (it == j.end()) fail(key, "is missing (required)");
    if (it->is_null()) fail(key, "must be an integer, got null");
    return integer(key, &*it);
  }
  int64_t opt_int(const std::string& key, int64_t dflt) const {
    const json* v = get(key);
    return v ? integer(key, v) : dflt;
  }
  double number(const std::string& key, const json* v) const {
    if (!v->is_number()) fail(key, str_cat("must be a number, got ", v->type_name(), " ", v->dump()));
    return v->get<double>();
  }
  double req_num(const std::string& key) const {
    const json* v = get(key);
    if (!v) fail(key, "is missing (required)");
    return number(key, v);
  }
  double opt_num(const std::string& key, double dflt) const {
    const json* v = get(key);
    return v ? number(key, v) : dflt;
  }
  bool opt_bool(const std::string& key, bool dflt) const {
    const json* v = get(key);
    if (!v) return dflt;
    if (!v->is_boolean()) fail(key, str_cat("must be true or false, got ", v->type_name(), " ", v->dump()));
    return v->get<bool>();
  }
  std::string opt_str(const std::string& key) const {
    const json* v = get(key);
    if (!v) return "";
    if (!v->is_string()) fail(key, str_cat("must be a string, got ", v->type_name(), " ", v->dump()));
    return v->get<std::string>();
  }
  void positive(const std::string& key, int64_t v) const {
    if (v <= 0) fail(key, str_cat("must be positive, got ", v));
  }
  void positive(const std::string& key, double v) const {
    if (!(v > 0) || !std::isfinite(v)) fail(key, str_cat("must be a positive finite number, got ", v));
  }
};

std::vector<double> number_list(const Reader& rd, const std::string& key) {
  const json* v = rd.get(key);
  if (!v) rd.fail(key, "is missing (required for longrope)");
  if (!v->is_array()) rd.fail(key, str_cat("must be a list of numbers, got ", v->dump()));
  std::vector<double> out;
  for (const json& x : *v) {
    if (!x.is_number() || !(x.get<double>() > 0)) rd.fail(key, str_cat("must hold positive numbers, got ", x.dump()));
    out.push_back(x.get<double>());
  }
  return out;
}

// longrope_ok: Phi-3, whose config reads "su", "yarn" and "longrope" as LongRoPE (Phi3Config).
RopeScaling rope_parse(const json& rs, const std::string& origin, const std::string& key, bool longrope_ok = false) {
  RopeScaling r;
  if (rs.is_null()) return r;
  if (!rs.is_object())
    throw Error(ErrorKind::input, str_cat("config ", origin, ": key '", key, "' must be an object or null, got ",
                                          rs.type_name()));
  Reader rd{rs, origin, key + "."};
  std::string type = rd.opt_str("rope_type");
  if (type.empty()) type = rd.opt_str("type");
  if (type.empty()) rd.fail("rope_type", "is missing: say which RoPE scaling to use (default, linear, llama3)");
  if (longrope_ok && (type == "su" || type == "yarn")) type = "longrope";
  r.type = type;
  if (type == "default") return r;
  if (type == "longrope" && longrope_ok) {  // the rest once the config's sizes are known (phi3_rope_finish)
    r.short_factor = number_list(rd, "short_factor");
    r.long_factor = number_list(rd, "long_factor");
    r.factor = rd.opt_num("factor", 0);                      // 0: max_position_embeddings / original
    r.attention_factor = rd.opt_num("attention_factor", 0);  // 0: from the factor
    return r;
  }
  if (type == "linear") {
    r.factor = rd.req_num("factor");
    rd.positive("factor", r.factor);
    return r;
  }
  if (type == "llama3") {
    r.factor = rd.req_num("factor");
    r.low_freq_factor = rd.req_num("low_freq_factor");
    r.high_freq_factor = rd.req_num("high_freq_factor");
    r.original_max_position_embeddings = rd.req_int("original_max_position_embeddings");
    rd.positive("factor", r.factor);
    rd.positive("low_freq_factor", r.low_freq_factor);
    rd.positive("original_max_position_embeddings", r.original_max_position_embeddings);
    if (!(r.high_freq_factor > r.low_freq_factor))
      rd.fail("high_freq_factor", str_cat("must be greater than low_freq_factor (", r.high_freq_factor,
                                          " <= ", r.low_freq_factor, ")"));
    return r;
  }
  rd.fail(type == rd.opt_str("rope_type") ? "rope_type" : "type",
          str_cat("names RoPE scaling '", type, "', which strata does not support (supported: default, linear, llama3",
                  longrope_ok ? ", longrope" : "", ")"));
}

// Phi-3's RoPE once the sizes are known, as transformers 5.24's Phi3Config and
// _compute_longrope_parameters do: original_max_position_embeddings is the config's top-level key
// (Phi3Config's default 4096 wins over the rope dict's), factor max_position_embeddings / original
// when not given, attention_factor sqrt(1 + ln(factor) / ln(original)) when not given (1 when
// factor <= 1); the factor lists hold rotary_dim / 2 numbers. partial_rotary_factor (top level or in
// rope_parameters; Phi-4-mini's 0.75): RoPE turns the first int(head_dim * factor) dims of each head.
// partial_rotary_factor: the rope dict's (rope_parameters, or rope_scaling as transformers 5 saves it
// back) where it has one, else the top-level key, else 1.
double partial_rotary_factor(const Reader& rd, const json* rp) {
  const json* rs = rd.get("rope_scaling");
  for (const auto& [dict, prefix] : {std::pair{rp, "rope_parameters."}, std::pair{rs, "rope_scaling."}})
    if (dict && dict->is_object() && dict->contains("partial_rotary_factor"))
      return Reader{*dict, rd.origin, prefix}.req_num("partial_rotary_factor");
  return rd.opt_num("partial_rotary_factor", 1.0);
}

void phi3_rope_finish(ModelConfig& c, const Reader& rd, const json* rp) {
  const double partial = partial_rotary_factor(rd, rp);
  if (!(partial > 0.0 && partial <= 1.0))
    rd.fail("partial_rotary_factor", str_cat("is ", partial, "; it must be in (0, 1]"));
  c.rotary_dim = int64_t(double(c.head_dim) * partial);  // Python's int(): toward zero, as transformers
  if (c.rotary_dim < 2 || c.rotary_dim % 2 != 0)
    rd.fail("partial_rotary_factor", str_cat("is ", partial, ": head_dim * factor = ", c.rotary_dim,
                                             " rotated dims, which must be even and at least 2"));
  RopeScaling& r = c.rope_scaling;
  if (r.type != "longrope") return;
  r.original_max_position_embeddings = rd.opt_int("original_max_position_embeddings", 4096);
  rd.positive("original_max_position_embeddings", r.original_max_position_embeddings);
  const size_t half = size_t(c.rotary_dim / 2);
  if (r.short_factor.size() != half || r.long_factor.size() != half)
    rd.fail("rope_scaling", str_cat("'s short_factor and long_factor must hold rotary_dim / 2 = ", half,
                                    " numbers each (head_dim * partial_rotary_factor / 2), got ",
                                    r.short_factor.size(), " and ", r.long_factor.size()));
  const double orig = double(r.original_max_position_embeddings);
  if (r.factor <= 0) r.factor = double(c.max_position_embeddings) / orig;
  if (r.attention_factor <= 0)
    r.attention_factor = r.factor <= 1.0 ? 1.0 : std::sqrt(1 + std::log(r.factor) / std::log(orig));
  // transformers scales cos and sin, so only the rotated dims of q and k, by attention_factor;
  // strata folds it into the scores' scale (model_attention_scale), which is that only when every
  // dim turns. Scaling the rotated part alone needs a factor in the RoPE op: not built yet.
  if (c.rotary_dim != c.head_dim && r.attention_factor != 1.0)
    rd.fail("partial_rotary_factor", str_cat("is ", partial, " with LongRoPE's attention_factor ", r.attention_factor,
                                             " (max_position_embeddings ", c.max_position_embeddings,
                                             " / original_max_position_embeddings ", r.original_max_position_embeddings,
                                             "): strata rotates part of each head only where that factor is 1 "
                                             "(LongRoPE with max_position_embeddings <= original, or no rope_scaling); "
                                             "scaling the rotated dims alone is not built yet"));
}

// The mixture-of-experts keys of qwen3_moe and mixtral, with their classes' defaults.
void moe_parse(ModelConfig& c, const Reader& rd, bool mixtral) {
  // Qwen3MoeConfig maps num_experts to num_local_experts (and saves the latter); the Hub's
  // Qwen3-MoE configs say num_experts.
  const char* experts_key = !mixtral && rd.has_key("num_experts") ? "num_experts" : "num_local_experts";
  if (!mixtral && rd.has_key("num_experts") && rd.has_key("num_local_experts") &&
      rd.opt_int("num_experts", 0) != rd.opt_int("num_local_experts", 0))
    rd.fail("num_experts", "and num_local_experts differ: give one of them");
  c.num_experts = rd.opt_int(experts_key, mixtral ? 8 : 128);
  c.num_experts_per_tok = rd.opt_int("num_experts_per_tok", mixtral ? 2 : 8);
  c.moe_intermediate_size = mixtral ? c.intermediate_size : rd.opt_int("moe_intermediate_size", 768);
  c.norm_topk_prob = mixtral || rd.opt_bool("norm_topk_prob", false);  // MixtralTopKRouter always renormalises
  c.decoder_sparse_step = mixtral ? 1 : rd.opt_int("decoder_sparse_step", 1);
  c.output_router_logits = rd.opt_bool("output_router_logits", false);
  c.router_aux_loss_coef = rd.opt_num("router_aux_loss_coef", 0.001);
  rd.positive(experts_key, c.num_experts);
  rd.positive("num_experts_per_tok", c.num_experts_per_tok);
  rd.positive(mixtral ? "intermediate_size" : "moe_intermediate_size", c.moe_intermediate_size);
  rd.positive("decoder_sparse_step", c.decoder_sparse_step);
  if (c.num_experts_per_tok > c.num_experts)
    rd.fail("num_experts_per_tok", str_cat("(", c.num_experts_per_tok, ") must not exceed the number of experts (",
                                           c.num_experts, ")"));
  if (!std::isfinite(c.router_aux_loss_coef) || c.router_aux_loss_coef < 0)
    rd.fail("router_aux_loss_coef", str_cat("must be a finite number >= 0, got ", c.router_aux_loss_coef));
  if (mixtral && rd.opt_num("router_jitter_noise", 0.0) != 0.0)
    rd.fail("router_jitter_noise", "is not 0: strata does not add router noise in training; set it to 0");
  if (!mixtral)
    if (const json* m = rd.get("mlp_only_layers")) {
      if (!m->is_array()) rd.fail("mlp_only_layers", str_cat("must be a list of layer indices, got ", m->dump()));
      for (const json& v : *m) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= c.num_hidden_layers)
          rd.fail("mlp_only_layers", str_cat("must hold layer indices in [0, ", c.num_hidden_layers, "), got ", v.dump()));
        c.mlp_only_layers.push_back(v.get<int64_t>());
      }
    }
  for (const char* key : {"shared_expert_intermediate_size", "n_shared_experts"})
    if (rd.get(key) && rd.opt_int(key, 0) != 0)
      rd.fail(key, "asks for shared experts, which qwen3_moe and mixtral do not have");
}

ModelConfig hf_config_parse_object(ModelConfig c, const Reader& rd, const std::string& origin);

}  // namespace

std::vector<std::string> hf_config_supported_architectures() {
  std::vector<std::string> v;
  for (const auto& f : kFamilies) v.push_back(f.architecture);
  return v;
}

ModelConfig hf_config_parse(const std::string& json_text, const std::string& origin) {
  ModelConfig c;
  try {
    c.raw = json::parse(json_text);
  } catch (const json::exception& e) {
    throw Error(ErrorKind::input, str_cat("config ", origin, " is not valid JSON (", e.what(), ")"));
  }
  STRATA_CHECK(c.raw.is_object(), "config ", origin, " must be a JSON object, got ", c.raw.type_name());
  const Reader rd{c.raw, origin, ""};
  return hf_config_parse_object(c, rd, origin);
}

namespace {

// Which layers slide (ModelConfig::sliding_layers): "layer_types" when the config gives it
// (each "sliding_attention" or "full_attention"), else rule(i).
template <class Rule>
void sliding_layers_parse(ModelConfig& c, const Reader& rd, Rule rule) {
  c.sliding_layers.assign(size_t(c.num_hidden_layers), 0);
  const json* lt = rd.get("layer_types");
  if (lt) {
    if (!lt->is_array() || int64_t(lt->size()) != c.num_hidden_layers)
      rd.fail("layer_types", str_cat("must list one type per layer (", c.num_hidden_layers, "), got ", lt->dump()));
    for (size_t i = 0; i < lt->size(); ++i) {
      const json& t = (*lt)[i];
      if (!t.is_string() || (t != "sliding_attention" && t != "full_attention"))
        rd.fail("layer_types", str_cat("entry ", i, " is ", t.dump(), "; strata knows \"sliding_attention\" and \"full_attention\""));
      c.sliding_layers[i] = t == "sliding_attention" && c.sliding_window > 0;
    }
    return;
  }
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) c.sliding_layers[size_t(i)] = c.sliding_window > 0 && rule(i);
}

// Gemma 3's RoPE: rope_parameters {"full_attention": {...}, "sliding_attention": {...}} in newer
// configs; else rope_theta (global, default 1e6), rope_local_base_freq (default 1e4) and a
// rope_scaling that applies to the global (full attention) layers only.
void gemma3_rope_parse(ModelConfig& c, const Reader& rd, const std::string& origin) {
  c.rope_theta = 1e6;
  c.rope_local_theta = 1e4;
  c.rope_scaling = RopeScaling{};
  const json* rp = rd.get("rope_parameters");
  if (rp && rp->is_object() && (rp->contains("full_attention") || rp->contains("sliding_attention"))) {
    for (const char* kind : {"full_attention", "sliding_attention"}) {
      const json* p = rp->contains(kind) && !(*rp)[kind].is_null() ? &(*rp)[kind] : nullptr;
      if (!p) continue;
      const std::string key = str_cat("rope_parameters.", kind);
      const Reader pr{*p, origin, key + "."};
      const bool full = std::string(kind) == "full_attention";
      if (p->contains("rope_theta")) (full ? c.rope_theta : c.rope_local_theta) = pr.req_num("rope_theta");
      const RopeScaling r = rope_parse(*p, origin, key);
      if (full) c.rope_scaling = r;
      else if (r.type != "default")
        pr.fail("rope_type", "is not 'default': strata scales RoPE on Gemma 3's global layers only");
    }
  } else {
    c.rope_theta = rd.opt_num("rope_theta", 1e6);
    c.rope_local_theta = rd.opt_num("rope_local_base_freq", 1e4);
    if (const json* rs = rd.get("rope_scaling")) c.rope_scaling = rope_parse(*rs, origin, "rope_scaling");
  }
  rd.positive("rope_theta", c.rope_theta);
  rd.positive("rope_local_base_freq", c.rope_local_theta);
}

ModelConfig hf_config_parse_object(ModelConfig c, const Reader& rd, const std::string& origin) {
  // A gemma3 checkpoint (Gemma3ForConditionalGeneration): its text model, text_config, with the
  // decoder's tensors under language_model (the vision tower is not read).
  if (rd.opt_str("model_type") == "gemma3" ||
      (rd.get("architectures") && rd.j["architectures"].is_array() && !rd.j["architectures"].empty() &&
       rd.j["architectures"][0] == "Gemma3ForConditionalGeneration")) {
    const json* tc = rd.get("text_config");
    if (!tc || !tc->is_object()) rd.fail("text_config", "is missing: a gemma3 config keeps its text model there");
    json text = *tc;
    text["model_type"] = "gemma3_text";
    text.erase("architectures");
    if (!text.contains("tie_word_embeddings") && rd.j.contains("tie_word_embeddings"))
      text["tie_word_embeddings"] = rd.j["tie_word_embeddings"];
    ModelConfig t;
    t.raw = c.raw;
    const Reader trd{text, origin, "text_config."};
    t = hf_config_parse_object(t, trd, origin);
    t.text_prefix = "language_model.model.";
    return t;
  }

  // ---- family: model_type, cross-checked with architectures[0] ----
  std::string model_type = rd.opt_str("model_type");
  std::string arch;
  if (const json* a = rd.get("architectures")) {
    if (!a->is_array() || a->empty() || !(*a)[0].is_string())
      rd.fail("architectures", str_cat("must be a non-empty list of class names, got ", a->dump()));
    arch = (*a)[0].get<std::string>();
  }
  STRATA_CHECK(!model_type.empty() || !arch.empty(), "config ", origin,
               " has neither 'model_type' nor 'architectures'; supported: ", supported_list());
  const Family* fam_t = nullptr;
  const Family* fam_a = nullptr;
  for (const auto& f : kFamilies) {
    if (model_type == f.model_type) fam_t = &f;
    if (arch == f.architecture) fam_a = &f;
  }
  if (!model_type.empty() && !fam_t)
    rd.fail("model_type", str_cat("is '", model_type, "', which strata does not support; supported: ", supported_list()));
  if (!arch.empty() && !fam_a)
    rd.fail("architectures", str_cat("names '", arch, "', which strata does not support; supported: ", supported_list()));
  if (fam_t && fam_a && fam_t != fam_a)
    rd.fail("model_type", str_cat("is '", model_type, "' but architectures[0] is '", arch,
                                  "'; they must name the same family"));
  const Family& fam = fam_t ? *fam_t : *fam_a;
  c.family = fam.model_type;
  c.architecture = fam.architecture;
  const bool llama = c.family == "llama", mixtral = c.family == "mixtral";
  const bool mistral = c.family == "mistral" || mixtral;  // Mixtral's attention is Mistral's
  const bool qwen3_moe = c.family == "qwen3_moe";
  const bool qwen = c.family == "qwen2" || c.family == "qwen3" || qwen3_moe;
  const bool gemma = c.family == "gemma3_text", olmo2 = c.family == "olmo2", phi3 = c.family == "phi3";

  // ---- sizes ----
  c.hidden_size = rd.req_int("hidden_size");
  c.intermediate_size = rd.req_int("intermediate_size");
  c.num_hidden_layers = rd.req_int("num_hidden_layers");
  c.num_attention_heads = rd.req_int("num_attention_heads");
  c.vocab_size = rd.req_int("vocab_size");
  for (auto [k, v] : {std::pair<const char*, int64_t>{"hidden_size", c.hidden_size},
                      {"intermediate_size", c.intermediate_size},
                      {"num_hidden_layers", c.num_hidden_layers},
                      {"num_attention_heads", c.num_attention_heads},
                      {"vocab_size", c.vocab_size}})
    rd.positive(k, v);

  // num_key_value_heads: the class default when the key is absent (llama None, mistral 8,
  // qwen2/qwen3 32, qwen3_moe 4, gemma3_text 4, olmo2 None); null means "same as
  // num_attention_heads" in every class.
  const int64_t kv_default = llama || olmo2 || phi3 ? c.num_attention_heads : mistral ? 8 : qwen3_moe || gemma ? 4 : 32;
  c.num_key_value_heads = rd.has_key("num_key_value_heads")
                              ? rd.opt_int("num_key_value_heads", c.num_attention_heads)
                              : kv_default;
  rd.positive("num_key_value_heads", c.num_key_value_heads);
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    rd.fail("num_key_value_heads", str_cat("(", c.num_key_value_heads, ") must divide num_attention_heads (",
                                           c.num_attention_heads, ")",
                                           rd.has_key("num_key_value_heads") ? "" : "; the key is absent and transformers' default applies: set it"));

  // head_dim: qwen3's class default is 128; elsewhere (qwen3_moe too, and for null) hidden_size / heads.
  const json* hd = rd.get("head_dim");
  if (hd) {
    c.head_dim = rd.integer("head_dim", hd);
    rd.positive("head_dim", c.head_dim);
  } else if (c.family == "qwen3" && !rd.has_key("head_dim")) {
    c.head_dim = 128;
  } else if (gemma && !rd.has_key("head_dim")) {
    c.head_dim = 256;
  } else {
    if (c.hidden_size % c.num_attention_heads != 0)
      rd.fail("hidden_size", str_cat("(", c.hidden_size, ") is not divisible by num_attention_heads (",
                                      c.num_attention_heads, "); set head_dim explicitly"));
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  if (c.head_dim % 2 != 0) rd.fail("head_dim", str_cat("must be even for rotary embeddings, got ", c.head_dim));

  c.max_position_embeddings =
      rd.opt_int("max_position_embeddings", llama || olmo2 ? 2048 : mistral ? 4096 * 32 : gemma ? 131072 : phi3 ? 4096 : 32768);
  rd.positive("max_position_embeddings", c.max_position_embeddings);

  // ---- numerics ----
  c.rms_norm_eps = rd.opt_num("rms_norm_eps", mixtral || olmo2 || phi3 ? 1e-5 : 1e-6);
  rd.positive("rms_norm_eps", c.rms_norm_eps);
  // Newer transformers write RoPE settings as "rope_parameters" {"rope_type", "rope_theta", ...}.
  const json* rp = gemma ? nullptr : rd.get("rope_parameters");  // gemma3: gemma3_rope_parse below
  if (rp && !rp->is_object()) rd.fail("rope_parameters", str_cat("must be an object, got ", rp->type_name()));
  double theta_default = mixtral ? 1e6 : 10000.0;
  if (rp && rp->contains("rope_theta")) theta_default = Reader{*rp, origin, "rope_parameters."}.req_num("rope_theta");
  c.rope_theta = rd.opt_num("rope_theta", theta_default);
  rd.positive("rope_theta", c.rope_theta);
  if (gemma) {
  } else if (const json* rs = rd.get("rope_scaling"))
    c.rope_scaling = rope_parse(*rs, origin, "rope_scaling", phi3);
  else if (rp)
    c.rope_scaling = rope_parse(*rp, origin, "rope_parameters", phi3);
  c.rotary_dim = c.head_dim;
  if (phi3) {
    phi3_rope_finish(c, rd, rp);
  } else {  // transformers' other supported families rotate whole heads (their attention has no pass-through part)
    const double partial = gemma ? 1.0 : partial_rotary_factor(rd, rp);
    if (partial != 1.0)
      rd.fail("partial_rotary_factor", str_cat("is ", partial, "; only phi3 configs rotate part of each head in "
                                               "transformers' modeling code (", c.family, " rotates all of it): remove "
                                               "the key or set it to 1.0"));
  }

  if (gemma) {
    gemma3_rope_parse(c, rd, origin);
    const std::string act = rd.opt_str("hidden_activation");
    if (!act.empty() && act != "gelu_pytorch_tanh")
      rd.fail("hidden_activation", str_cat("is '", act, "'; strata's gemma3_text implementation uses gelu_pytorch_tanh"));
    for (const char* cap : {"final_logit_softcapping", "attn_logit_softcapping"})
      if (rd.get(cap)) rd.fail(cap, "is set; strata implements Gemma 3, whose configs leave it null");
    if (rd.opt_bool("use_bidirectional_attention", false))
      rd.fail("use_bidirectional_attention", "is true; strata trains causal language models only");
    c.query_pre_attn_scalar = rd.opt_int("query_pre_attn_scalar", 256);
    rd.positive("query_pre_attn_scalar", c.query_pre_attn_scalar);
  } else {
    const std::string act = rd.opt_str("hidden_act");
    if (!act.empty() && act != "silu")
      rd.fail("hidden_act", str_cat("is '", act, "'; strata's ", c.family, " implementation uses silu"));
  }

  // ---- structure ----
  c.tie_word_embeddings = rd.opt_bool("tie_word_embeddings", gemma);
  const bool attention_bias = rd.opt_bool("attention_bias", false);
  if (c.family == "qwen2") {
    c.qkv_bias = true;
    c.o_bias = false;
  } else if (mistral || phi3) {
    c.qkv_bias = c.o_bias = false;  // MistralAttention and Phi3Attention build their projections without bias
  } else {
    c.qkv_bias = c.o_bias = attention_bias;
  }
  c.qk_norm = c.family == "qwen3" || qwen3_moe || gemma || olmo2;  // gemma3 per head, olmo2 over the whole projection
  c.mlp_bias = llama && rd.opt_bool("mlp_bias", false);

  if (mistral) {  // MixtralConfig's sliding_window defaults to None
    c.sliding_window = rd.has_key("sliding_window") ? rd.opt_int("sliding_window", 0) : mixtral ? 0 : 4096;
    c.max_window_layers = 0;
  } else if (qwen && rd.opt_bool("use_sliding_window", false)) {
    c.sliding_window = rd.has_key("sliding_window") ? rd.opt_int("sliding_window", 0) : 4096;
    c.max_window_layers = qwen3_moe ? 0 : rd.opt_int("max_window_layers", 28);  // Qwen3-MoE: every layer
    if (c.max_window_layers < 0) rd.fail("max_window_layers", str_cat("must be >= 0, got ", c.max_window_layers));
  }
  if (gemma) c.sliding_window = rd.has_key("sliding_window") ? rd.opt_int("sliding_window", 0) : 4096;
  if (phi3) c.sliding_window = rd.opt_int("sliding_window", 0);  // Phi3Config: None; set, every layer slides
  if (c.sliding_window < 0) rd.fail("sliding_window", str_cat("must be positive or null, got ", c.sliding_window));
  if (gemma) {
    const int64_t pattern = rd.opt_int("sliding_window_pattern", 6);
    rd.positive("sliding_window_pattern", pattern);
    sliding_layers_parse(c, rd, [&](int64_t i) { return (i + 1) % pattern != 0; });
  } else if (mistral || phi3) {
    c.sliding_layers.assign(size_t(c.num_hidden_layers), c.sliding_window > 0);
  } else {
    sliding_layers_parse(c, rd, [&](int64_t i) { return i >= c.max_window_layers; });
  }

  if (qwen3_moe || mixtral) {
    moe_parse(c, rd, mixtral);
    for (size_t l = 0; l < c.sliding_layers.size(); ++l)
      if (c.sliding_layers[l] && c.moe_layer(int64_t(l)))
        rd.fail("sliding_window", str_cat("slides layer ", l, "'s attention, and strata's mixture-of-experts layers "
                                          "attend over the whole context; set sliding_window to null (or "
                                          "use_sliding_window to false)"));
  }

  c.torch_dtype = rd.opt_str("torch_dtype");
  if (c.torch_dtype.empty()) c.torch_dtype = rd.opt_str("dtype");
  return c;
}

}  // namespace

bool ModelConfig::moe_layer(int64_t layer) const {
  if (num_experts <= 0) return false;
  for (int64_t l : mlp_only_layers)
    if (l == layer) return false;
  return (layer + 1) % decoder_sparse_step == 0;
}

ModelConfig hf_config_load(const std::string& path) {
  std::error_code ec;
  const bool dir = std::filesystem::is_directory(path, ec);
  std::string file = dir ? (std::filesystem::path(path) / "config.json").string() : path;
  const std::string text = file_read(file, "config");
  ModelConfig c = hf_config_parse(text, file);
  // A gemma3 checkpoint saved by transformers 5 keeps its text model under model.language_model.
  // (4.x: language_model.model.): the checkpoint beside the config says which
  const std::string model_dir = std::filesystem::path(file).parent_path().string();
  if (c.text_prefix == "language_model.model." &&
      (std::filesystem::exists(model_dir + "/model.safetensors.index.json", ec) ||
       std::filesystem::exists(model_dir + "/model.safetensors", ec))) {
    const SafetensorsDir weights = SafetensorsDir::open(model_dir);
    if (weights.find("model.language_model.embed_tokens.weight")) c.text_prefix = "model.language_model.";
  }
  return c;
}

void hf_config_save(const ModelConfig& cfg, const std::string& path) {
  std::error_code ec;
  std::string file = std::filesystem::is_directory(path, ec) ? (std::filesystem::path(path) / "config.json").string()
                                                             : path;
  std::string text = cfg.raw.dump(2) + "\n";
  file_write_atomic(file, text.data(), text.size());
}

}  // namespace strata
