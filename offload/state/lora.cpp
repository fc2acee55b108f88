#include "offload/state/lora.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>

#include <nlohmann/json.hpp>

#include "io/files.h"
#include "io/safetensors.h"
#include "models/lora_adapter.h"
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

// The mixture-of-experts parts PEFT names but strata's adapters do not reach: the router ("gate";
// transformers 5 keeps it a bare parameter, not a Linear) and the experts (packed 3-D parameters
// in transformers 5, PEFT's target_parameters; Mixtral's w1, w2, w3 in older checkpoints).
static bool lora_names_moe_part(const std::string& n) {
  return n == "gate" || n == "router" || n == "w1" || n == "w2" || n == "w3" || n.find("experts") != std::string::npos;
}
constexpr const char* kMoeLoraRefusal =
    "LoRA on a mixture-of-experts layer's router or experts is not supported: transformers 5 keeps the experts as "
    "packed 3-D parameters and the router as a bare parameter, which PEFT adapts only through target_parameters "
    "(one A and B per expert); strata adapts the attention projections of MoE layers (q_proj, k_proj, v_proj, "
    "o_proj) and the MLPs of their dense layers: name those in target_modules";

uint32_t lora_targets_parse(const std::vector<std::string>& names, const std::string& origin) {
  STRATA_CHECK(!names.empty(), origin, ": lora.target_modules is empty; name at least one of q_proj, k_proj, "
               "v_proj, o_proj, gate_proj, up_proj, down_proj (Phi-3: qkv_proj, o_proj, gate_up_proj, down_proj)");
  uint32_t mask = 0;
  for (const std::string& n : names) {
    int found = -1;
    for (int t = 0; t < kLoraTargets; ++t)
      if (n == layer_linear_name(t)) found = t;
    STRATA_CHECK(found >= 0 || !lora_names_moe_part(n), origin, ": lora.target_modules names \"", n, "\". ",
                 kMoeLoraRefusal);
    STRATA_CHECK(found >= 0, origin, ": lora.target_modules names \"", n, "\"; use PEFT's names: q_proj, k_proj, "
                 "v_proj, o_proj, gate_proj, up_proj, down_proj (Phi-3: qkv_proj, o_proj, gate_up_proj, down_proj)");
    mask |= 1u << found;
  }
  return mask;
}

std::vector<std::string> lora_target_names(uint32_t mask) {
  std::vector<std::string> out;
  for (int t = 0; t < kLoraTargets; ++t)
    if (mask & (1u << t)) out.push_back(layer_linear_name(t));
  return out;
}

LoraLayout LoraLayout::of(const ModelSpec& spec, const LoraOptions& o) {
  STRATA_ASSERT(o.r > 0);
  LoraLayout l;
  l.r = o.r;
  l.scale = o.scale();
  for (const ModelLayer& layer : spec.layers) {
    std::array<int64_t, kLoraTargets> a{};
    for (int t = 0; t < kLoraTargets; ++t) {
      a[size_t(t)] = kAbsent;
      const int64_t br = layer.linear_row(t);
      if (!(o.targets & (1u << t)) || br == kAbsent) continue;
      const TensorSpec& w = spec.params[size_t(br)];
      a[size_t(t)] = int64_t(l.table.add(TensorSpec{peft_name(w.name, "lora_A"), {o.r, w.shape[1]}, DType::f32, Tier::host}));
      l.b_rows.push_back(l.table.add(TensorSpec{peft_name(w.name, "lora_B"), {w.shape[0], o.r}, DType::f32, Tier::host}));
    }
    l.a_row.push_back(a);
  }
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

void lora_merge_into(HostStore& store, const LoraStore& lora) {
  const ModelSpec& spec = store.spec();
  const LoraLayout& l = lora.layout();
  std::vector<float> w;
  for (size_t layer = 0; layer < spec.layers.size(); ++layer)
    for (int t = 0; t < kLoraTargets; ++t) {
      const int64_t a_row = l.a_row[layer][size_t(t)];
      if (a_row == kAbsent) continue;
      const size_t row = size_t(spec.layers[layer].linear_row(t));
      const TensorSpec& a = l.table[size_t(a_row)];
      const int64_t out = spec.params[row].shape[0], in = spec.params[row].shape[1], r = l.r;
      const float* A = lora.master() + a.offset / 4;                       // (r, in)
      const float* B = lora.master() + l.table[size_t(a_row) + 1].offset / 4;  // (out, r)
      w.resize(size_t(out * in));
      store.get_param(row, w.data());
      lora_merge_weight(w.data(), A, B, out, in, r, l.scale);  // the merge `strata generate --adapter` runs
      store.set_param(row, w.data());
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
  for (const TensorSpec& t : layout_.table.rows())
    out.push_back(TensorToWrite{t.name, DType::f32, t.shape, static_cast<const void*>(master_ + t.offset / 4)});
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
  if (j.contains("target_modules") && j["target_modules"].is_array()) {
    std::vector<std::string> names;
    for (const auto& n : j["target_modules"])
      if (n.is_string()) names.push_back(n.get<std::string>());
    STRATA_CHECK(lora_targets_parse(names, cfg_path) == options_.targets, cfg_path, ": target_modules differ from "
                 "lora.target_modules; set lora.target_modules to the adapter's");
  }
  if (j.contains("target_parameters") && !j["target_parameters"].is_null())
    STRATA_CHECK(j["target_parameters"].empty(), cfg_path, ": target_parameters is ", j["target_parameters"].dump(),
                 ". ", kMoeLoraRefusal);
  SafetensorsFile f = SafetensorsFile::open(dir + "/adapter_model.safetensors");
  std::string problems;
  for (const TensorSpec& t : layout_.table.rows()) {
    const SafetensorsEntry* e = f.find(t.name);
    if (!e) {
      problems += "\n  missing " + t.name;
      continue;
    }
    if (e->shape != t.shape) {
      problems += str_cat("\n  ", t.name, " has another shape than (", t.shape[0], ", ", t.shape[1], ")");
      continue;
    }
    STRATA_CHECK(e->dtype == DType::f32 || e->dtype == DType::bf16 || e->dtype == DType::f16, f.path(), ": ", t.name,
                 " is neither F32, BF16 nor F16");
    dtype_convert(master_ + t.offset / 4, DType::f32, f.data(*e), e->dtype, size_t(t.numel()));
  }
  STRATA_CHECK(problems.empty(), f.path(), " does not hold this model's adapters (r = ", options_.r, ", ",
               layout_.table.size(), " tensors):", problems);
  refresh_image();
}

}  // namespace strata
