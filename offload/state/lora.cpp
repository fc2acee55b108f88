#include "offload/state/lora.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>

#include <nlohmann/json.hpp>

#include "io/files.h"
#include "io/safetensors.h"
#include "models/lora_adapter.h"
#include "models/moe_layer.h"
#include "offload/state/host_store.h"
#include "src/core/error.h"
#include "src/device/host_ops.h"

namespace strata {
namespace {

// "model.layers.0.self_attn.q_proj.weight" -> "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
std::string peft_name(const std::string& base, const char* which) {
  const std::string stem = base.substr(0, base.size() - std::string(".weight").size());
  return "base_model.model." + stem + "." + which + ".weight";
}

float* alloc_floats(size_t n, const char* what) {
  const size_t bytes = std::max<size_t>((n * 4 + 4095) / 4096 * 4096, 4096);
  void* p = std::aligned_alloc(4096, bytes);
  STRATA_CHECK_BUDGET(p, "cannot allocate ", format_bytes(n * 4), " of host memory for ", what);
  std::memset(p, 0, n * 4);
  return static_cast<float*>(p);
}

}  // namespace

const char* lora_target_name(LoraTarget t) { return layer_linear_name(int(t)); }

// The mixture-of-experts parts named as modules, which PEFT reaches only as target_parameters: the
// router ("gate"; transformers 5 keeps it a bare parameter, not a Linear) and the experts (packed
// 3-D parameters in transformers 5; Mixtral's w1, w2, w3 in older checkpoints).
static bool lora_names_moe_part(const std::string& n) {
  return n == "gate" || n == "router" || n == "w1" || n == "w2" || n == "w3" || n.find("experts") != std::string::npos;
}
constexpr const char* kMoeLoraNames =
    "a mixture-of-experts layer's router and experts are PEFT's target_parameters (transformers 5 keeps them as "
    "parameters, not nn.Linear modules): name them mlp.gate.weight, mlp.experts.gate_up_proj, mlp.experts.down_proj "
    "(lora.target_parameters; on the command line among --lora-targets)";

// A target_parameters entry names target t when it is t's name or a dotted suffix of it (PEFT matches
// "<module>.<parameter>" keys ending in "." + the entry), at least "<module>.<parameter>".
static bool names_parameter_target(const std::string& n, int t) {
  const std::string full = layer_linear_name(t);
  return n == full || (n.find('.') != std::string::npos && full.size() > n.size() &&
                       full.compare(full.size() - n.size(), n.size(), n) == 0 && full[full.size() - n.size() - 1] == '.');
}

uint32_t lora_targets_parse(const std::vector<std::string>& names, const std::string& origin) {
  STRATA_CHECK(!names.empty(), origin, ": lora.target_modules is empty; name at least one of q_proj, k_proj, "
               "v_proj, o_proj, gate_proj, up_proj, down_proj (Phi-3: qkv_proj, o_proj, gate_up_proj, down_proj)");
  uint32_t mask = 0;
  for (const std::string& n : names) {
    int found = -1;
    for (int t = 0; t < kLoraTargets; ++t)
      if (t < kLayerRouter ? n == layer_linear_name(t) : names_parameter_target(n, t)) found = t;
    STRATA_CHECK(found >= 0 || !lora_names_moe_part(n), origin, ": lora.target_modules names \"", n, "\"; ",
                 kMoeLoraNames);
    STRATA_CHECK(found >= 0, origin, ": lora.target_modules names \"", n, "\"; use PEFT's names: q_proj, k_proj, "
                 "v_proj, o_proj, gate_proj, up_proj, down_proj (Phi-3: qkv_proj, o_proj, gate_up_proj, down_proj; ",
                 kMoeLoraNames, ")");
    mask |= 1u << found;
  }
  return mask;
}

std::vector<std::string> lora_target_names(uint32_t mask) {
  std::vector<std::string> out;
  for (int t = 0; t < kLayerRouter; ++t)
    if (mask & (1u << t)) out.push_back(layer_linear_name(t));
  return out;
}

std::vector<std::string> lora_target_parameter_names(uint32_t mask) {
  std::vector<std::string> out;
  for (int t = kLayerRouter; t < kLoraTargets; ++t)
    if (mask & (1u << t)) out.push_back(layer_linear_name(t));
  return out;
}

namespace {

// A mixture-of-experts layer's adapted parameter for target t (router, experts' gate_up, down): the
// PEFT module that holds it ("model.layers.3.mlp.gate", "...mlp.experts" or, for gate_up_proj's
// wrapper when down_proj is targeted too, "...mlp.experts.base_layer": PEFT nests the wrappers in
// the experts' parameter order, gate_up_proj innermost), its experts (0: the router, a plain
// linear) and its per-expert (out, in). False when the layer has no such part.
struct MoePart {
  std::string module;
  int64_t experts = 0, out = 0, in = 0;
};
bool moe_part(const ModelSpec& spec, size_t layer, int t, uint32_t targets, MoePart* p) {
  const ModelLayer& l = spec.layers[layer];
  MoeExpertParams mp;
  if (!moe_kind_expert_params(*l.kind, &mp)) return false;
  const std::string stem = spec.config.text_prefix + "layers." + std::to_string(layer) + ".mlp.";
  const Shape& router = spec.params[size_t(l.rows[mp.router])].shape;            // (E, C)
  const Shape& down = spec.params[size_t(l.rows[mp.first + 2])].shape;           // expert 0's (C, I)
  if (t == kLayerRouter) {
    *p = MoePart{stem + "gate", 0, router[0], router[1]};
  } else if (t == kLayerExpertsGateUp) {
    const bool nested = targets & (1u << kLayerExpertsDown);
    *p = MoePart{stem + (nested ? "experts.base_layer" : "experts"), mp.experts, 2 * down[1], down[0]};
  } else {
    *p = MoePart{stem + "experts", mp.experts, down[0], down[1]};
  }
  return true;
}

std::string peft_module_name(const std::string& module, const char* which) {
  return "base_model.model." + module + "." + which + ".weight";
}

}  // namespace

LoraLayout LoraLayout::of(const ModelSpec& spec, const LoraOptions& o) {
  STRATA_ASSERT(o.r > 0);
  STRATA_CHECK(o.dropout == 0 || !(o.targets & kLoraParameterTargets), "lora.dropout is ", o.dropout, " with ",
               "target_parameters (", lora_target_parameter_names(o.targets & kLoraParameterTargets).front(),
               "): PEFT's ParamWrapper, which adapts a mixture-of-experts layer's router and experts, refuses "
               "dropout (it cannot factor x out of the merged weight); set lora.dropout = 0");
  LoraLayout l;
  l.r = o.r;
  l.scale = o.scale();
  auto add = [&](const std::string& name, Shape shape, int64_t experts) {
    const size_t row = l.table.add(TensorSpec{name, std::move(shape), DType::f32, Tier::host});
    l.experts.resize(row + 1, 0);
    l.experts[row] = experts;
    return row;
  };
  bool any_moe_part = false;
  for (size_t li = 0; li < spec.layers.size(); ++li) {
    const ModelLayer& layer = spec.layers[li];
    std::array<int64_t, kLoraTargets> a{};
    for (int t = 0; t < kLoraTargets; ++t) {
      a[size_t(t)] = kAbsent;
      if (!(o.targets & (1u << t))) continue;
      if (t >= kLayerRouter) {
        MoePart p;
        if (!moe_part(spec, li, t, o.targets, &p)) continue;
        any_moe_part = true;
        const int64_t E = std::max<int64_t>(p.experts, 1);
        a[size_t(t)] = int64_t(add(peft_module_name(p.module, "lora_A"), {E * o.r, p.in}, p.experts));
        l.b_rows.push_back(add(peft_module_name(p.module, "lora_B"), {E * p.out, o.r}, p.experts));
        continue;
      }
      const int64_t br = layer.linear_row(t);
      if (br == kAbsent) continue;
      const TensorSpec& w = spec.params[size_t(br)];
      a[size_t(t)] = int64_t(add(peft_name(w.name, "lora_A"), {o.r, w.shape[1]}, 0));
      l.b_rows.push_back(add(peft_name(w.name, "lora_B"), {w.shape[0], o.r}, 0));
    }
    l.a_row.push_back(a);
  }
  STRATA_CHECK(any_moe_part || !(o.targets & kLoraParameterTargets), "lora target_parameters (",
               lora_target_parameter_names(o.targets & kLoraParameterTargets).front(), ") name a mixture-of-experts "
               "layer's router or experts, and this model (", spec.config.family, ") has none");
  // Phi-3 fuses q, k, v into qkv_proj and gate, up into gate_up_proj (PEFT's modules): naming the
  // parts alone would leave them without adapters where the user asked for them
  const uint32_t parts_qkv = (1u << int(LoraTarget::q)) | (1u << int(LoraTarget::k)) | (1u << int(LoraTarget::v));
  const uint32_t parts_gate_up = (1u << int(LoraTarget::gate)) | (1u << int(LoraTarget::up));
  for (const ModelLayer& layer : spec.layers) {
    STRATA_CHECK(layer.linear_row(kLayerQkv) == kAbsent || !(o.targets & parts_qkv) ||
                     (o.targets & (1u << kLayerQkv)),
                 "lora.target_modules names q_proj, k_proj or v_proj, which this model (", spec.config.family,
                 ") fuses into qkv_proj: name qkv_proj instead");
    STRATA_CHECK(layer.linear_row(kLayerGateUp) == kAbsent || !(o.targets & parts_gate_up) ||
                     (o.targets & (1u << kLayerGateUp)),
                 "lora.target_modules names gate_proj or up_proj, which this model (", spec.config.family,
                 ") fuses into gate_up_proj: name gate_up_proj instead");
  }
  std::string asked;
  for (const std::string& n : lora_target_names(o.targets)) asked += (asked.empty() ? "" : ", ") + n;
  STRATA_CHECK(l.table.size() > 0, "lora.target_modules (", asked,
               ") names none of this model's linear layers (", spec.config.family, "); name PEFT modules it has");
  l.bytes = l.table.layout(Tier::host);
  return l;
}

int64_t LoraLayout::parameter_count() const {
  int64_t n = 0;
  for (const TensorSpec& t : table.rows()) n += t.numel();
  return n;
}

LoraStore::LoraStore(Device& dev, const ModelSpec& spec, const LoraOptions& options)
    : dev_(dev), options_(options), layout_(LoraLayout::of(spec, options)) {
  const size_t n = layout_.floats();
  try {
    master_ = alloc_floats(n, "LoRA master weights");
    m_ = alloc_floats(n, "LoRA AdamW first moments");
    v_ = alloc_floats(n, "LoRA AdamW second moments");
    host_bytes_ = 3 * layout_.bytes;
    for (float** p : {&grad_, &image_}) {
      *p = static_cast<float*>(dev_.alloc_pinned(layout_.bytes));
      std::memset(*p, 0, layout_.bytes);
      (dev_.host_is_pinned(*p) ? pinned_bytes_ : host_bytes_) += layout_.bytes;
    }
  } catch (...) {
    release();
    throw;
  }
}

LoraStore::~LoraStore() { release(); }

void LoraStore::release() {
  std::free(master_);
  std::free(m_);
  std::free(v_);
  if (grad_) dev_.free_pinned(grad_);
  if (image_) dev_.free_pinned(image_);
  master_ = m_ = v_ = grad_ = image_ = nullptr;
}

void LoraStore::init(uint64_t seed) {
  const TensorTable& t = layout_.table;
  for (size_t i = 0; i < t.size(); ++i) {
    float* p = master_ + t[i].offset / 4;
    const bool is_a = t[i].name.find(".lora_A.") != std::string::npos;
    if (!is_a) {
      std::fill(p, p + t[i].numel(), 0.f);
      continue;
    }
    // kaiming_uniform_(a = sqrt(5)): gain sqrt(2 / (1 + 5)), bound gain * sqrt(3 / fan_in) = 1 / sqrt(fan_in)
    const double bound = 1.0 / std::sqrt(double(t[i].shape[1]));
    std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + 0x10ad + i);
    std::uniform_real_distribution<double> dist(-bound, bound);
    for (int64_t k = 0; k < t[i].numel(); ++k) p[k] = float(dist(rng));
  }
  refresh_image();
}

void LoraStore::refresh_image() {
  std::memcpy(image_, master_, layout_.bytes);
  for (size_t row : layout_.b_rows) {
    const TensorSpec& b = layout_.table[row];
    float* p = image_ + b.offset / 4;
    for (int64_t k = 0; k < b.numel(); ++k) p[k] *= layout_.scale;
  }
}

void LoraStore::unscale_b() {
  for (size_t row : layout_.b_rows) {
    const TensorSpec& b = layout_.table[row];
    float* p = grad_ + b.offset / 4;
    for (int64_t k = 0; k < b.numel(); ++k) p[k] *= layout_.scale;
  }
}

void LoraStore::adamw(const AdamWParams& params, double weight_decay) {
  AdamWParams p = params;
  p.weight_decay = weight_decay;
  for (const TensorSpec& t : layout_.table.rows()) {
    const size_t at = t.offset / 4;
    adamw_update(master_ + at, m_ + at, v_ + at, grad_ + at, nullptr, DType::f32, t.numel(), p);
  }
  std::memset(grad_, 0, layout_.bytes);
  refresh_image();
}

Shape lora_peft_shape(const LoraLayout& l, size_t row) {
  const TensorSpec& t = l.table[row];
  const int64_t E = l.experts[row];
  const bool packed_b = E > 0 && t.shape[1] == l.r && t.name.find(".lora_B.") != std::string::npos;
  return packed_b ? Shape{t.shape[0] / E, E * l.r} : t.shape;
}

namespace {

// strata's packed expert B (E, out, r) <-> PEFT's (out, r*E), whose column k*E + e is expert e's k;
// any other row is the same in both layouts.
void lora_peft_reorder(const LoraLayout& l, size_t row, const float* in, float* out, bool to_peft) {
  const TensorSpec& t = l.table[row];
  const Shape peft = lora_peft_shape(l, row);
  if (peft == t.shape) {
    std::memcpy(out, in, size_t(t.numel()) * 4);
    return;
  }
  const int64_t E = l.experts[row], r = l.r, O = peft[0];
  for (int64_t e = 0; e < E; ++e)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t k = 0; k < r; ++k) {
        const int64_t ours = (e * O + o) * r + k, theirs = o * r * E + k * E + e;
        out[to_peft ? theirs : ours] = in[to_peft ? ours : theirs];
      }
}

}  // namespace

void lora_peft_tensor(const LoraLayout& l, size_t row, const float* in, float* out) {
  lora_peft_reorder(l, row, in, out, true);
}

void lora_from_peft_tensor(const LoraLayout& l, size_t row, const float* in, float* out) {
  lora_peft_reorder(l, row, in, out, false);
}

std::vector<LoraMergeTerm> lora_merge_terms(const ModelSpec& spec, const LoraLayout& l) {
  std::vector<LoraMergeTerm> terms;
  const int64_t r = l.r;
  for (size_t layer = 0; layer < spec.layers.size(); ++layer) {
    const ModelLayer& ml = spec.layers[layer];
    for (int t = 0; t < kLoraTargets; ++t) {
      const int64_t a_row = l.a_row[layer][size_t(t)];
      if (a_row == kAbsent) continue;
      const size_t a = l.table[size_t(a_row)].offset / 4, b = l.table[size_t(a_row) + 1].offset / 4;
      if (t < kLayerRouter) {
        const size_t row = size_t(ml.linear_row(t));
        terms.push_back({row, a, b, spec.params[row].shape[0], spec.params[row].shape[1]});
        continue;
      }
      MoeExpertParams mp;
      const bool moe = moe_kind_expert_params(*ml.kind, &mp);
      STRATA_ASSERT(moe, "a router or expert adapter on a layer that is not mixture-of-experts");
      if (t == kLayerRouter) {
        const size_t row = size_t(ml.rows[mp.router]);
        terms.push_back({row, a, b, spec.params[row].shape[0], spec.params[row].shape[1]});
        continue;
      }
      for (int64_t e = 0; e < mp.experts; ++e) {
        const size_t first = mp.first + size_t(e) * mp.per_expert;  // gate, up, down
        const Shape& down = spec.params[size_t(ml.rows[first + 2])].shape;  // (C, I)
        const int64_t C = down[0], I = down[1];
        if (t == kLayerExpertsGateUp) {  // A_e (r, C); B_e (2I, r): gate's rows, then up's
          const size_t ae = a + size_t(e * r * C), be = b + size_t(e * 2 * I * r);
          terms.push_back({size_t(ml.rows[first]), ae, be, I, C});
          terms.push_back({size_t(ml.rows[first + 1]), ae, be + size_t(I * r), I, C});
        } else {  // A_e (r, I); B_e (C, r)
          terms.push_back({size_t(ml.rows[first + 2]), a + size_t(e * r * I), b + size_t(e * C * r), C, I});
        }
      }
    }
  }
  return terms;
}

void lora_merge_into(HostStore& store, const LoraStore& lora) {
  const ModelSpec& spec = store.spec();
  const LoraLayout& l = lora.layout();
  std::vector<float> w;
  for (const LoraMergeTerm& m : lora_merge_terms(spec, l)) {
    w.resize(size_t(m.out * m.in));
    store.get_param(m.param_row, w.data());
    // the merge `strata generate --adapter` runs: A (r, in), B (out, r)
    lora_merge_weight(w.data(), lora.master() + m.a, lora.master() + m.b, m.out, m.in, l.r, l.scale);
    store.set_param(m.param_row, w.data());
  }
}

uint64_t lora_dropout_seed(uint64_t run_seed, int64_t step, int64_t micro_batch) {
  return host_dropout_seed(run_seed, uint64_t(step), uint64_t(micro_batch));
}

std::string lora_adapter_config_json(const LoraOptions& o, const std::string& base_model) {
  nlohmann::json j = {{"peft_type", "LORA"},
                      {"task_type", "CAUSAL_LM"},
                      {"r", o.r},
                      {"lora_alpha", o.alpha},
                      {"lora_dropout", o.dropout},
                      {"target_modules", lora_target_names(o.targets)},
                      {"target_parameters", o.targets & kLoraParameterTargets
                                                ? nlohmann::json(lora_target_parameter_names(o.targets))
                                                : nlohmann::json(nullptr)},
                      {"base_model_name_or_path", base_model},
                      {"bias", "none"},
                      {"fan_in_fan_out", false},
                      {"inference_mode", true},
                      {"init_lora_weights", true},
                      {"modules_to_save", nullptr},
                      {"use_rslora", false},
                      {"use_dora", false}};
  return j.dump(2) + "\n";
}

void LoraStore::save_peft(const std::string& dir, const std::string& base_model) const {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  STRATA_CHECK_IO(!ec, "cannot create the adapter directory ", dir, ": ", ec.message());
  std::vector<TensorToWrite> out;
  std::vector<std::vector<float>> reordered;  // PEFT's layout of the packed expert B rows
  reordered.reserve(layout_.table.size());
  for (size_t i = 0; i < layout_.table.size(); ++i) {
    const TensorSpec& t = layout_.table[i];
    const float* p = master_ + t.offset / 4;
    if (lora_peft_shape(layout_, i) != t.shape) {
      reordered.emplace_back(size_t(t.numel()));
      lora_peft_tensor(layout_, i, p, reordered.back().data());
      p = reordered.back().data();
    }
    out.push_back(TensorToWrite{t.name, DType::f32, lora_peft_shape(layout_, i), static_cast<const void*>(p)});
  }
  safetensors_write_file(dir + "/adapter_model.safetensors", out);
  file_write_atomic(dir + "/adapter_config.json", lora_adapter_config_json(options_, base_model));
}

void LoraStore::load_peft(const std::string& dir) {
  const std::string cfg_path = dir + "/adapter_config.json";
  const std::string text = file_read(cfg_path, "adapter config", "lora.adapter must name a PEFT adapter dir "
                                     "(adapter_config.json + adapter_model.safetensors)", ErrorKind::input);
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  STRATA_CHECK(j.is_object(), cfg_path, " is not a JSON object");
  STRATA_CHECK(j.value("peft_type", std::string("LORA")) == "LORA", cfg_path, ": peft_type is not \"LORA\"");
  STRATA_CHECK(j.contains("r") && j["r"].is_number_integer() && j["r"].get<int64_t>() == options_.r, cfg_path,
               ": r is ", j.value("r", nlohmann::json()).dump(), " but lora.r is ", options_.r,
               "; set lora.r to the adapter's rank");
  if (j.contains("lora_alpha") && j["lora_alpha"].is_number())
    STRATA_CHECK(std::abs(j["lora_alpha"].get<double>() - options_.alpha) < 1e-9, cfg_path, ": lora_alpha is ",
                 j["lora_alpha"].get<double>(), " but lora.alpha is ", options_.alpha, "; set lora.alpha to match");
  // target_modules and target_parameters (PEFT's list for the MoE router and experts) together
  // name the targets lora.target_modules (and lora.target_parameters) asked for
  std::vector<std::string> names;
  for (const char* key : {"target_modules", "target_parameters"})
    if (j.contains(key) && j[key].is_array())
      for (const auto& n : j[key])
        if (n.is_string()) names.push_back(n.get<std::string>());
  if (!names.empty())
    STRATA_CHECK(lora_targets_parse(names, cfg_path) == options_.targets, cfg_path, ": target_modules and "
                 "target_parameters (", (nlohmann::json(names)).dump(), ") differ from lora.target_modules and "
                 "lora.target_parameters (", nlohmann::json(lora_target_names(options_.targets)).dump(), ", ",
                 nlohmann::json(lora_target_parameter_names(options_.targets)).dump(), "); set them to the adapter's");
  SafetensorsFile f = SafetensorsFile::open(dir + "/adapter_model.safetensors");
  std::string problems;
  std::vector<float> peft;
  for (size_t i = 0; i < layout_.table.size(); ++i) {
    const TensorSpec& t = layout_.table[i];
    const Shape want = lora_peft_shape(layout_, i);
    const SafetensorsEntry* e = f.find(t.name);
    if (!e) {
      problems += "\n  missing " + t.name;
      continue;
    }
    if (e->shape != want) {
      problems += str_cat("\n  ", t.name, " is ", safetensors_format_shape(e->shape), ", expected ",
                          safetensors_format_shape(want));
      continue;
    }
    STRATA_CHECK(e->dtype == DType::f32 || e->dtype == DType::bf16 || e->dtype == DType::f16, f.path(), ": ", t.name,
                 " is neither F32, BF16 nor F16");
    peft.resize(size_t(t.numel()));
    dtype_convert(peft.data(), DType::f32, f.data(*e), e->dtype, peft.size());
    lora_from_peft_tensor(layout_, i, peft.data(), master_ + t.offset / 4);
  }
  STRATA_CHECK(problems.empty(), f.path(), " does not hold this model's adapters (r = ", options_.r, ", ",
               layout_.table.size(), " tensors):", problems);
  refresh_image();
}

}  // namespace strata
