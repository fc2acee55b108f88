// Reading order: the module names of a model, adapter_config.json, the tensors, the merge.
#include "models/lora_adapter.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

#include "io/files.h"
#include "io/safetensors.h"
#include "models/moe_layer.h"
#include "src/core/error.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

const std::string kPrefix = "base_model.model.";

// The linear modules an adapter may name: module name -> (parameter row, decoder layer or -1).
// A mixture-of-experts layer's router and experts (PEFT's target_parameters) too: the router
// "mlp.gate" a plain linear on its row; the experts' packed gate_up_proj or down_proj (`packed`
// 1 or 2) on "mlp.experts" or, when both are targeted, gate_up_proj's on "mlp.experts.base_layer"
// (PEFT nests the first of the experts' parameters inside), whose A (E*r, in) and B (out, E*r)
// become one pair per expert's row (models/layer_kind.h, offload/state/lora.h).
enum Packed { kLinear = 0, kGateUp = 1, kDown = 2, kRouter = 3 };
struct ModelModule {
  size_t row;
  int64_t layer;
  int packed = kLinear;
  std::string key;  // target_parameters' "<module>.<parameter>" (kLinear: empty)
};

// gate_up, down: whether the adapter targets the experts' gate_up_proj and down_proj (their module
// names depend on both).
std::map<std::string, ModelModule> linear_modules(const ModelSpec& spec, bool gate_up = false, bool down = false) {
  std::map<std::string, ModelModule> m;
  auto add = [&](int64_t row, int64_t layer) {
    if (row == kAbsent) return;
    const std::string& name = spec.params[size_t(row)].name;  // "<module>.weight"
    m[name.substr(0, name.size() - 7)] = ModelModule{size_t(row), layer};
  };
  for (size_t l = 0; l < spec.layers.size(); ++l) {
    const ModelLayer& layer = spec.layers[l];
    for (size_t p = 0; p < layer.params.size(); ++p)
      if (layer.params[p].lora_target >= 0) add(layer.rows[p], int64_t(l));
    MoeExpertParams mp;
    if (!moe_kind_expert_params(*layer.kind, &mp)) continue;
    const std::string stem = spec.config.text_prefix + "layers." + std::to_string(l) + ".mlp.";
    m[stem + "gate"] = ModelModule{size_t(layer.rows[mp.router]), int64_t(l), kRouter, stem + "gate.weight"};
    if (gate_up)
      m[stem + (down ? "experts.base_layer" : "experts")] =
          ModelModule{size_t(layer.rows[mp.first]), int64_t(l), kGateUp, stem + "experts.gate_up_proj"};
    if (down)
      m[stem + "experts"] = ModelModule{size_t(layer.rows[mp.first]), int64_t(l), kDown, stem + "experts.down_proj"};
  }
  add(spec.lm_head, -1);  // kAbsent when tied to the embedding
  return m;
}

std::string kind_of(const std::string& module) { return module.substr(module.rfind('.') + 1); }

// PEFT's rule for a target_modules list entry: the module's name, or its last dotted parts.
bool name_matches(const std::string& module, const std::string& t) {
  return module == t || (module.size() > t.size() && module.compare(module.size() - t.size(), t.size(), t) == 0 &&
                         module[module.size() - t.size() - 1] == '.');
}

// PEFT's pattern keys (rank_pattern, alpha_pattern) match a module name by regex on a suffix.
bool pattern_matches(const std::string& key, const std::string& module) {
  return std::regex_match(module, std::regex("(.*\\.)?(" + key + ")"));
}

// adapter_config.json, as far as the merge needs it.
struct AdapterConfig {
  int64_t r = 0;
  double alpha = 0;
  bool use_rslora = false;
  bool all_linear = false;
  std::string target_regex;                  // target_modules given as one string
  std::vector<std::string> target_list;      // ... or as a list of names
  std::set<int64_t> layers;                  // layers_to_transform; empty: every layer
  std::map<std::string, int64_t> rank_pattern;
  std::map<std::string, double> alpha_pattern;
  std::vector<std::string> target_parameters;  // PEFT's: "<module>.<parameter>" keys or dotted suffixes

  bool targets_parameter(const std::string& name) const {
    for (const std::string& t : target_parameters)
      if (name_matches(name, t)) return true;
    return false;
  }
  bool targets(const std::string& module, const ModelModule& m) const {
    const int64_t layer = m.layer;
    if (!layers.empty() && layer >= 0 && !layers.count(layer)) return false;
    if (m.packed != kLinear) return targets_parameter(m.key);  // not nn.Linear modules: target_parameters only
    if (all_linear) return kind_of(module) != "lm_head";
    if (!target_list.empty()) {
      for (const std::string& t : target_list)
        if (name_matches(module, t)) return true;
      return false;
    }
    return std::regex_match(module, std::regex(target_regex));
  }
};

AdapterConfig read_config(const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(file_read(path, "adapter config", "pass a PEFT LoRA adapter directory (adapter_config.json + "
                                                                "adapter_model.safetensors)", ErrorKind::input));
  } catch (const nlohmann::json::parse_error& e) {
    STRATA_CHECK(false, path, " is not valid JSON: ", e.what());
  }
  STRATA_CHECK(j.is_object(), path, ": expected a JSON object");
  auto bad = [&](const std::string& what) { return str_cat(path, ": ", what); };
  if (j.contains("peft_type") && !j["peft_type"].is_null())
    STRATA_CHECK(j["peft_type"] == "LORA", bad("peft_type is " + j["peft_type"].dump() + ", only \"LORA\" adapters can be merged"));
  AdapterConfig c;
  STRATA_CHECK(j.contains("r") && j["r"].is_number_integer() && j["r"].get<int64_t>() > 0, bad("\"r\" must be a positive integer"));
  c.r = j["r"].get<int64_t>();
  STRATA_CHECK(j.contains("lora_alpha") && j["lora_alpha"].is_number(), bad("\"lora_alpha\" must be a number"));
  c.alpha = j["lora_alpha"].get<double>();
  auto flag = [&](const char* key) {
    if (!j.contains(key) || j[key].is_null()) return false;
    STRATA_CHECK(j[key].is_boolean(), bad(str_cat("\"", key, "\" must be true or false")));
    return j[key].get<bool>();
  };
  c.use_rslora = flag("use_rslora");
  STRATA_CHECK(!flag("fan_in_fan_out"),
               bad("fan_in_fan_out = true stores weights transposed (GPT-2's Conv1D); Llama-family adapters have false"));
  STRATA_CHECK(!flag("use_dora"), bad("use_dora = true: DoRA adapters cannot be merged by strata (LoRA only)"));
  if (j.contains("bias") && !j["bias"].is_null())
    STRATA_CHECK(j["bias"] == "none", bad("bias = " + j["bias"].dump() + ": adapters that train biases are not supported (\"none\" only)"));
  if (j.contains("modules_to_save") && !j["modules_to_save"].is_null())
    STRATA_CHECK(j["modules_to_save"].is_array() && j["modules_to_save"].empty(),
                 bad("modules_to_save (whole trained modules beside the adapter) is not supported"));
  STRATA_CHECK(j.contains("target_modules") && !j["target_modules"].is_null(), bad("\"target_modules\" is missing"));
  const nlohmann::json& t = j["target_modules"];
  if (t.is_string()) {
    if (t == "all-linear") c.all_linear = true;
    else c.target_regex = t.get<std::string>();
  } else {
    STRATA_CHECK(t.is_array() && (!t.empty() || j.contains("target_parameters")),
                 bad("\"target_modules\" must be a list of module names or a regex string"));
    for (const auto& v : t) {
      STRATA_CHECK(v.is_string(), bad("\"target_modules\" must hold strings, found " + v.dump()));
      c.target_list.push_back(v.get<std::string>());
    }
  }
  if (j.contains("target_parameters") && !j["target_parameters"].is_null()) {
    STRATA_CHECK(j["target_parameters"].is_array(), bad("\"target_parameters\" must be a list of parameter names"));
    for (const auto& v : j["target_parameters"]) {
      STRATA_CHECK(v.is_string(), bad("\"target_parameters\" must hold strings, found " + v.dump()));
      c.target_parameters.push_back(v.get<std::string>());
    }
  }
  if (j.contains("layers_to_transform") && !j["layers_to_transform"].is_null()) {
    const nlohmann::json& l = j["layers_to_transform"];
    STRATA_CHECK(l.is_number_integer() || l.is_array(), bad("\"layers_to_transform\" must be an integer or a list"));
    if (l.is_number_integer()) c.layers.insert(l.get<int64_t>());
    for (const auto& v : l.is_array() ? l : nlohmann::json::array()) {
      STRATA_CHECK(v.is_number_integer(), bad("\"layers_to_transform\" must hold integers"));
      c.layers.insert(v.get<int64_t>());
    }
  }
  for (const char* key : {"rank_pattern", "alpha_pattern"}) {
    if (!j.contains(key) || j[key].is_null()) continue;
    STRATA_CHECK(j[key].is_object(), bad(str_cat("\"", key, "\" must be an object {module pattern: value}")));
    for (auto it = j[key].begin(); it != j[key].end(); ++it) {
      const std::string& k = it.key();
      const nlohmann::json& v = it.value();
      STRATA_CHECK(v.is_number(), bad(str_cat("\"", key, "\"[\"", k, "\"] must be a number")));
      if (std::string(key) == "rank_pattern") {
        STRATA_CHECK(v.is_number_integer() && v.get<int64_t>() > 0, bad("rank_pattern values must be positive integers"));
        c.rank_pattern[k] = v.get<int64_t>();
      } else {
        c.alpha_pattern[k] = v.get<double>();
      }
    }
  }
  return c;
}

// The adapter tensor name's module and which matrix ('A' or 'B'); false when it is not a LoRA
// matrix name.
bool parse_tensor_name(const std::string& name, std::string* module, char* which) {
  for (const char w : {'A', 'B'}) {
    const std::string suffix = std::string(".lora_") + w + ".weight";
    if (name.size() > kPrefix.size() + suffix.size() && name.compare(0, kPrefix.size(), kPrefix) == 0 &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      *module = name.substr(kPrefix.size(), name.size() - kPrefix.size() - suffix.size());
      *which = w;
      return true;
    }
  }
  return false;
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

}  // namespace

const std::vector<std::string>& lora_module_kinds() {
  static const std::vector<std::string> kinds = {"q_proj",    "k_proj", "v_proj",   "o_proj",
                                                 "gate_proj", "up_proj", "down_proj", "qkv_proj",
                                                 "gate_up_proj", "lm_head"};  // qkv_proj, gate_up_proj: Phi-3
  return kinds;
}

std::string lora_tensor_name(const std::string& module, char which) {
  return kPrefix + module + ".lora_" + which + ".weight";
}

const LoraPair* LoraAdapter::find(size_t param_row) const {
  for (const LoraPair& p : pairs)
    if (p.param_row == param_row) return &p;
  return nullptr;
}

LoraAdapter lora_adapter_read(const std::string& dir, const ModelSpec& spec) {
  STRATA_CHECK(fs::is_directory(dir), "adapter ", dir,
               " is not a directory: pass a PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors)");
  const AdapterConfig cfg = read_config(dir + "/adapter_config.json");
  const std::string st_path = dir + "/adapter_model.safetensors";
  STRATA_CHECK(fs::exists(st_path), "adapter ", dir, " has no adapter_model.safetensors",
               fs::exists(dir + "/adapter_model.bin")
                   ? " (only adapter_model.bin, a pickle: save it again with safe_serialization=True)"
                   : "");
  const SafetensorsFile file = SafetensorsFile::open(st_path);
  bool gate_up = false, down = false;  // the experts' parameters the adapter targets (their module names follow)
  for (const std::string& t : cfg.target_parameters) {
    gate_up = gate_up || name_matches("experts.gate_up_proj", t) || name_matches(t, "experts.gate_up_proj");
    down = down || name_matches("experts.down_proj", t) || name_matches(t, "experts.down_proj");
  }
  const std::map<std::string, ModelModule> modules = linear_modules(spec, gate_up, down);

  // every tensor is a LoRA matrix of a module the model has and the config targets
  std::vector<std::string> problems;
  std::map<std::string, std::map<char, const SafetensorsEntry*>> found;
  for (const SafetensorsEntry& e : file.entries()) {
    std::string module;
    char which = 0;
    if (!parse_tensor_name(e.name, &module, &which)) {
      problems.push_back(str_cat("tensor '", e.name, "' is not a LoRA matrix (", kPrefix,
                                 "<module>.lora_A.weight / .lora_B.weight; embedding adapters, biases and "
                                 "modules_to_save are not supported)"));
      continue;
    }
    const auto it = modules.find(module);
    if (it == modules.end()) {
      problems.push_back(str_cat("tensor '", e.name, "': the model has no linear module ", module));
      continue;
    }
    if (!cfg.targets(module, it->second))
      problems.push_back(str_cat("tensor '", e.name, "': ", module, " is not among adapter_config.json's target_modules"));
    found[module][which] = &e;
  }
  // every target names a module kind the model has, and every targeted module has its pair
  std::vector<std::string> kinds;
  for (const auto& [name, m] : modules)
    if (std::find(kinds.begin(), kinds.end(), kind_of(name)) == kinds.end()) kinds.push_back(kind_of(name));
  for (const std::string& t : cfg.target_list) {
    bool any = false;
    for (const auto& [name, m] : modules) any = any || name_matches(name, t);
    if (!any)
      problems.push_back(str_cat("target module '", t, "' is not a linear module of this ", spec.config.family,
                                 " model (it has ", join(kinds, ", "), ")"));
  }
  for (const auto& [name, m] : modules)
    if (cfg.targets(name, m) && !found.count(name))
      problems.push_back(str_cat("target module ", name, " has no ", lora_tensor_name(name, 'A'), " / lora_B"));

  LoraAdapter a;
  a.dir = dir, a.r = cfg.r, a.lora_alpha = cfg.alpha, a.use_rslora = cfg.use_rslora;
  for (const auto& [module, mats] : found) {
    const ModelModule& m = modules.at(module);
    const TensorSpec& w = spec.params[m.row];
    const bool packed = m.packed == kGateUp || m.packed == kDown;
    MoeExpertParams mp;
    const bool moe = packed && moe_kind_expert_params(*spec.layers[size_t(m.layer)].kind, &mp);
    STRATA_ASSERT(moe || !packed, "packed experts on a layer that is not mixture-of-experts");
    const int64_t E = packed ? mp.experts : 1;
    const Shape& down =  // expert 0's down_proj (C, I)
        packed ? spec.params[size_t(spec.layers[size_t(m.layer)].rows[mp.first + 2])].shape : w.shape;
    LoraPair p;
    p.module = module, p.param_row = m.row, p.out = w.shape[0], p.in = w.shape[1], p.r = cfg.r;
    if (m.packed == kGateUp) p.out = 2 * down[1], p.in = down[0];  // per expert: gate_up (2I, C)
    if (m.packed == kDown) p.out = down[0], p.in = down[1];        // down (C, I)
    const std::string& pattern_name = m.packed == kLinear ? module : m.key;
    double alpha = cfg.alpha;
    for (const auto& [k, v] : cfg.rank_pattern)
      if (pattern_matches(k, pattern_name)) { p.r = v; break; }
    for (const auto& [k, v] : cfg.alpha_pattern)
      if (pattern_matches(k, pattern_name)) { alpha = v; break; }
    p.scale = float(cfg.use_rslora ? alpha / std::sqrt(double(p.r)) : alpha / double(p.r));
    for (const char which : {'A', 'B'}) {
      const auto it = mats.find(which);
      if (it == mats.end()) {
        problems.push_back(str_cat(lora_tensor_name(module, which == 'A' ? 'B' : 'A'), " has no ",
                                   lora_tensor_name(module, which)));
        continue;
      }
      const std::vector<int64_t> want =
          which == 'A' ? std::vector<int64_t>{E * p.r, p.in} : std::vector<int64_t>{p.out, E * p.r};
      if (it->second->shape != want) {
        problems.push_back(str_cat(it->second->name, " is ", safetensors_format_shape(it->second->shape), ", expected ",
                                   safetensors_format_shape(want), " (r = ", p.r, ", ", w.name, " is ",
                                   safetensors_format_shape(w.shape), ")"));
        continue;
      }
      std::vector<float>& dst = which == 'A' ? p.A : p.B;
      dst.resize(size_t(it->second->numel()));
      file.read(*it->second, DType::f32, dst.data());
    }
    if (p.A.size() != size_t(E * p.r * p.in) || p.B.size() != size_t(p.out * E * p.r)) continue;
    if (!packed) {
      a.pairs.push_back(std::move(p));
      continue;
    }
    // one pair per expert's row: A_e the rows e*r.., B_e the columns k*E + e of PEFT's B (an expert's
    // gate_up B_e split into gate's first and up's last I rows, as its merged weight is split)
    for (int64_t e = 0; e < E; ++e) {
      const int64_t r = p.r, C = down[0], I = down[1];
      std::vector<float> Ae(p.A.begin() + e * r * p.in, p.A.begin() + (e + 1) * r * p.in);
      auto b_rows = [&](int64_t from, int64_t rows) {  // rows [from, from + rows) of B_e (out, r)
        std::vector<float> b(size_t(rows * r));
        for (int64_t o = 0; o < rows; ++o)
          for (int64_t k = 0; k < r; ++k) b[size_t(o * r + k)] = p.B[size_t((from + o) * E * r + k * E + e)];
        return b;
      };
      const size_t first = mp.first + size_t(e) * mp.per_expert;  // gate, up, down
      const ModelLayer& layer = spec.layers[size_t(m.layer)];
      auto pair = [&](size_t which, int64_t out, int64_t in, std::vector<float> b) {
        LoraPair q;
        q.module = str_cat(module, "[expert ", e, "]"), q.param_row = size_t(layer.rows[first + which]);
        q.r = r, q.out = out, q.in = in, q.scale = p.scale, q.A = Ae, q.B = std::move(b);
        a.pairs.push_back(std::move(q));
      };
      if (m.packed == kGateUp) {
        pair(0, I, C, b_rows(0, I));
        pair(1, I, C, b_rows(I, I));
      } else {
        pair(2, C, I, b_rows(0, C));
      }
    }
  }
  if (!problems.empty()) {
    if (problems.size() > 12) problems.resize(12), problems.push_back("...");
    STRATA_CHECK(false, "adapter ", dir, " does not fit the model in ", spec.config.family, " (",
                 spec.config.num_hidden_layers, " layers):\n  ", join(problems, "\n  "));
  }
  STRATA_CHECK(!a.pairs.empty(), "adapter ", st_path, " holds no LoRA matrices");
  std::sort(a.pairs.begin(), a.pairs.end(), [](const LoraPair& x, const LoraPair& y) { return x.param_row < y.param_row; });
  return a;
}

void lora_merge_weight(float* W, const float* A, const float* B, int64_t out, int64_t in, int64_t r, float scale) {
  std::vector<float> acc(static_cast<size_t>(in));
  for (int64_t o = 0; o < out; ++o) {
    std::fill(acc.begin(), acc.end(), 0.f);
    for (int64_t k = 0; k < r; ++k) {  // (B A)[o, :], fused multiply-adds over k in order, as a BLAS sgemm
      const float b = B[o * r + k];
      const float* a = A + k * in;
      for (int64_t i = 0; i < in; ++i) acc[size_t(i)] = std::fma(b, a[i], acc[size_t(i)]);
    }
    // then times s, then plus W, each rounded on its own (torch's W + (B @ A) * s): two loops,
    // so the compiler cannot fuse the multiply into the add
    for (int64_t i = 0; i < in; ++i) acc[size_t(i)] *= scale;
    float* w = W + o * in;
    for (int64_t i = 0; i < in; ++i) w[i] += acc[size_t(i)];
  }
}

bool lora_adapter_merge_row(const LoraAdapter& adapter, size_t param_row, float* values) {
  const LoraPair* p = adapter.find(param_row);
  if (!p) return false;
  lora_merge_weight(values, p->A.data(), p->B.data(), p->out, p->in, p->r, p->scale);
  return true;
}

}  // namespace strata
