// bitsandbytes' NF4 in a Hugging Face dir (nf4_hf.h): the quantization_config check, reading a
// pre-quantized dir into an NF4 or a plain store, and writing an NF4 store as transformers does.
#include "offload/state/nf4_hf.h"

#include <cstring>
#include <vector>

#include "io/json.h"
#include "io/safetensors.h"
#include "kernels/cpu/nf4.h"
#include "offload/state/moe_packed.h"
#include "offload/state/nf4_layout.h"
#include "src/core/error.h"

namespace strata {
namespace {

constexpr const char* kQuantState = ".weight.quant_state.bitsandbytes__nf4";

// The quantized rows' tensors, read from a dir: each checked against what row `row` of `spec` needs.
struct HfRow {
  std::vector<uint8_t> codes, qabsmax;
  std::vector<float> absmax, nested;
  float offset = 0;
};

template <class T>
std::vector<T> read_exact(const SafetensorsDir& st, const std::string& name, DType type, int64_t count) {
  const SafetensorsEntry* e = st.find(name);
  STRATA_CHECK(e, st.dir(), ": a bitsandbytes NF4 weight lacks ", name, " (save it again with transformers)");
  STRATA_CHECK(e->dtype == type && e->numel() == count, st.dir(), ": ", name, " is ", dtype_safetensors_name(e->dtype), " ",
               safetensors_format_shape(e->shape), ", bitsandbytes writes ", dtype_safetensors_name(type), " of ", count,
               " elements");
  std::vector<T> out(static_cast<size_t>(count));
  st.read(name, type, out.data());
  return out;
}

HfRow hf_read_row(const SafetensorsDir& st, const TensorSpec& spec, bool double_quant) {
  const std::string& w = spec.name;  // "<module>.weight"
  const int64_t n = spec.numel(), blocks = cpu::nf4_blocks(n);
  const std::string state_name = w + ".quant_state.bitsandbytes__nf4";
  const SafetensorsEntry* se = st.find(state_name);
  const std::vector<uint8_t> state = read_exact<uint8_t>(st, state_name, DType::u8, se ? se->numel() : 1);
  const nlohmann::json js = nlohmann::json::parse(std::string(state.begin(), state.end()), nullptr, false);
  STRATA_CHECK(js.is_object() && js.value("quant_type", "") == "nf4" && js.value("blocksize", 0) == 64, st.dir(), ": ",
               state_name, " is not NF4 in blocks of 64; strata reads bitsandbytes' nf4 with blocksize 64 only");
  STRATA_CHECK(js.contains("shape") && js["shape"].get<std::vector<int64_t>>() == spec.shape, st.dir(), ": ", w,
               " was quantized from shape ", js.contains("shape") ? js["shape"].dump() : "?", ", config.json says ",
               safetensors_format_shape(spec.shape));
  const bool dq = js.contains("nested_offset");
  STRATA_CHECK(dq == double_quant, st.dir(), ": ", w, dq ? " is" : " is not", " double-quantized, the run asks for ",
               double_quant ? "" : "no ", "double quantization: set lora.double_quant = ", dq ? "true" : "false");
  HfRow r;
  r.codes = read_exact<uint8_t>(st, w, DType::u8, cpu::nf4_code_bytes(n));
  const std::vector<float> map = read_exact<float>(st, w + ".quant_map", DType::f32, 16);
  STRATA_CHECK(std::memcmp(map.data(), cpu::nf4_code(), 16 * sizeof(float)) == 0, st.dir(), ": ", w,
               ".quant_map is not bitsandbytes' NF4 table");
  if (dq) {
    r.qabsmax = read_exact<uint8_t>(st, w + ".absmax", DType::u8, blocks);
    r.nested = read_exact<float>(st, w + ".nested_absmax", DType::f32, cpu::nf4_nested_blocks(n));
    const std::vector<float> nmap = read_exact<float>(st, w + ".nested_quant_map", DType::f32, 256);
    STRATA_CHECK(std::memcmp(nmap.data(), cpu::nf4_dynamic_map(), 256 * sizeof(float)) == 0, st.dir(), ": ", w,
                 ".nested_quant_map is not bitsandbytes' dynamic map");
    STRATA_CHECK(js.value("nested_blocksize", 0) == 256, st.dir(), ": ", w, " nested blocks are not 256");
    r.offset = js["nested_offset"].get<float>();
  } else {
    r.absmax = read_exact<float>(st, w + ".absmax", DType::f32, blocks);
  }
  return r;
}

// The expected tensors of a pre-quantized dir: the plain ones (a mixture of experts' in the Hub's
// per-expert layout or packed 3-D, offload/state/moe_packed.h), and each quantized weight's parts.
std::vector<ExpectedTensor> hf_expected(const SafetensorsDir& st, const ModelSpec& spec, const std::vector<bool>& packed,
                                        bool dq) {
  std::vector<ExpectedTensor> plain, out;
  for (size_t r = 0; r < spec.params.size(); ++r) {
    const TensorSpec& t = spec.params[r];
    if (!packed[r]) {
      plain.push_back({t.name, t.shape});
      continue;
    }
    const int64_t n = t.numel();
    out.push_back({t.name, {cpu::nf4_code_bytes(n), 1}});
    out.push_back({t.name + ".absmax", {cpu::nf4_blocks(n)}});
    out.push_back({t.name + ".quant_map", {16}});
    if (dq) {
      out.push_back({t.name + ".nested_absmax", {cpu::nf4_nested_blocks(n)}});
      out.push_back({t.name + ".nested_quant_map", {256}});
    }
  }
  if (spec.config.num_experts > 0) plain = moe_packed_expected(st, plain);
  out.insert(out.begin(), plain.begin(), plain.end());
  return out;
}

}  // namespace

HfQuantization hf_quantization_of(const ModelConfig& config, const std::string& dir) {
  HfQuantization q;
  if (!config.raw.is_object() || !config.raw.contains("quantization_config")) return q;
  const nlohmann::json& qc = config.raw["quantization_config"];
  const std::string method = qc.is_object() ? qc.value("quant_method", std::string("?")) : std::string("?");
  STRATA_CHECK(method == "bitsandbytes", dir, "/config.json: quantization_config.quant_method = \"", method,
               "\": strata reads bitsandbytes' 4-bit NF4 only; give the unquantized model (bf16 or f32) and set "
               "lora.base_dtype = \"nf4\" to quantize it at load");
  const bool four = qc.value("load_in_4bit", false) || qc.value("_load_in_4bit", false);
  const std::string type = qc.value("bnb_4bit_quant_type", std::string("?"));
  STRATA_CHECK(four && type == "nf4", dir, "/config.json: a bitsandbytes ", four ? str_cat("4-bit ", type) : "8-bit (int8)",
               " model: strata reads bitsandbytes' 4-bit NF4 only; give the unquantized model and set lora.base_dtype = "
               "\"nf4\"");
  q.nf4 = true;
  q.double_quant = qc.value("bnb_4bit_use_double_quant", false);
  return q;
}

void nf4_hf_load(HostStore& store, const std::string& dir, const HfQuantization& q, const LoraAdapter* adapter) {
  const ModelSpec& spec = store.spec();
  ModelSpec as_nf4 = spec;  // the rows bitsandbytes quantized: the decoder layers' linears
  as_nf4.base_quant.nf4 = true;
  const std::vector<bool> packed = nf4_packed_rows(as_nf4);
  const SafetensorsDir st = SafetensorsDir::open(dir);
  std::vector<ExpectedTensor> expected = hf_expected(st, spec, packed, q.double_quant);
  for (const std::string& name : st.names())  // the JSON states: their length varies
    if (name.size() > std::strlen(kQuantState) && name.compare(name.size() - std::strlen(kQuantState), std::string::npos, kQuantState) == 0)
      expected.push_back({name, st.find(name)->shape});
  safetensors_check_tensors(st, expected, str_cat("config.json describes a bitsandbytes NF4 ", spec.config.family,
                                                  " model with ", spec.config.num_hidden_layers, " layers"));
  STRATA_CHECK(!store.packed() || spec.base_quant.double_quant == q.double_quant, dir, ": the model is NF4 ",
               q.double_quant ? "with" : "without", " double quantization; set lora.double_quant = ",
               q.double_quant ? "true" : "false");
  const bool moe = spec.config.num_experts > 0;  // experts and routers: bf16, per expert or packed 3-D
  std::vector<float> values, moe_values;
  std::string moe_name;
  for (size_t r = 0; r < spec.params.size(); ++r) {
    const TensorSpec& t = spec.params[r];
    values.resize(size_t(t.numel()));
    if (!packed[r]) {
      if (const auto slice = moe ? moe_packed_slice(st, t.name) : std::nullopt)
        moe_packed_read(st, *slice, moe_values, moe_name, values.data());
      else
        st.read(t.name, DType::f32, values.data());
      if (adapter) lora_adapter_merge_row(*adapter, r, values.data());
      store.set_param(r, values.data());
      continue;
    }
    const HfRow h = hf_read_row(st, t, q.double_quant);
    const int64_t n = t.numel();
    if (store.packed() && !adapter) {  // the codes and scales as they are
      const Nf4RowLayout l = Nf4RowLayout::of(n, q.double_quant);
      char* dst = static_cast<char*>(store.working_of(r));
      std::memcpy(dst, h.codes.data(), h.codes.size());
      if (q.double_quant) {
        std::memcpy(dst + l.qabsmax, h.qabsmax.data(), h.qabsmax.size());
        std::memcpy(dst + l.absmax, h.nested.data(), h.nested.size() * 4);
        std::memcpy(dst + l.offset, &h.offset, 4);
      } else {
        std::memcpy(dst + l.absmax, h.absmax.data(), h.absmax.size() * 4);
      }
      continue;
    }
    std::vector<bf16> w(static_cast<size_t>(n));
    cpu::nf4_dequantize_bf16(w.data(), h.codes.data(), q.double_quant ? h.qabsmax.data() : nullptr,
                             q.double_quant ? h.nested.data() : h.absmax.data(), h.offset, n);
    dtype_convert(values.data(), DType::f32, w.data(), DType::bf16, size_t(n));
    if (adapter) lora_adapter_merge_row(*adapter, r, values.data());
    store.set_param(r, values.data());  // a plain store: the dequantized weights (an NF4 store: quantized again)
  }
}

void nf4_hf_save(const HostStore& store, const std::string& dir) {
  const ModelSpec& spec = store.spec();
  STRATA_ASSERT(store.packed(), "nf4_hf_save writes an NF4 store");
  const bool dq = spec.base_quant.double_quant;
  static const std::vector<float> kCode(cpu::nf4_code(), cpu::nf4_code() + 16);
  static const std::vector<float> kMap(cpu::nf4_dynamic_map(), cpu::nf4_dynamic_map() + 256);
  std::vector<TensorToWrite> tensors;
  std::vector<std::string> states;  // the JSON strings the writer reads from
  std::vector<std::vector<float>> plain;
  states.reserve(spec.params.size());
  plain.reserve(spec.params.size());
  for (size_t r = 0; r < spec.params.size(); ++r) {
    const TensorSpec& t = spec.params[r];
    const char* row = store.working() + store.working_table()[r].offset;
    if (store.working_table()[r].dtype != DType::u8) {  // bf16 on disk, as bitsandbytes leaves them
      plain.emplace_back(size_t(t.numel()));
      store.get_param(r, plain.back().data());
      std::vector<float>& v = plain.back();
      tensors.emplace_back(t.name, DType::bf16, t.shape, TensorToWrite::Fill([&v](uint64_t offset, void* dst, size_t bytes) {
        dtype_convert(dst, DType::bf16, v.data() + offset / 2, DType::f32, bytes / 2);
      }));
      continue;
    }
    const int64_t n = t.numel();
    const Nf4RowLayout l = Nf4RowLayout::of(n, dq);
    // Python's json.dumps as bitsandbytes calls it: ", " and ": ", the mean as the shortest repr of its double
    std::string js = str_cat("{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"bfloat16\", \"shape\": [");
    for (size_t d = 0; d < t.shape.size(); ++d) js += str_cat(d ? ", " : "", t.shape[d]);
    js += "]";
    if (dq) {
      float offset = 0;
      std::memcpy(&offset, row + l.offset, 4);
      js += str_cat(", \"nested_blocksize\": 256, \"nested_dtype\": \"float32\", \"nested_offset\": ",
                    nlohmann::json(double(offset)).dump());
    }
    states.push_back(js + "}");
    tensors.emplace_back(t.name, DType::u8, std::vector<int64_t>{cpu::nf4_code_bytes(n), 1}, static_cast<const void*>(row));
    if (dq) {
      tensors.emplace_back(t.name + ".absmax", DType::u8, std::vector<int64_t>{cpu::nf4_blocks(n)},
                           static_cast<const void*>(row + l.qabsmax));
      tensors.emplace_back(t.name + ".nested_absmax", DType::f32, std::vector<int64_t>{cpu::nf4_nested_blocks(n)},
                           static_cast<const void*>(row + l.absmax));
      tensors.emplace_back(t.name + ".nested_quant_map", DType::f32, std::vector<int64_t>{256},
                           static_cast<const void*>(kMap.data()));
    } else {
      tensors.emplace_back(t.name + ".absmax", DType::f32, std::vector<int64_t>{cpu::nf4_blocks(n)},
                           static_cast<const void*>(row + l.absmax));
    }
    tensors.emplace_back(t.name + ".quant_map", DType::f32, std::vector<int64_t>{16}, static_cast<const void*>(kCode.data()));
    tensors.emplace_back(t.name + ".quant_state.bitsandbytes__nf4", DType::u8, std::vector<int64_t>{int64_t(states.back().size())},
                         static_cast<const void*>(states.back().data()));
  }
  safetensors_write_dir(dir, tensors, uint64_t(5) << 30);
  ModelConfig cfg = spec.config;
  cfg.raw["torch_dtype"] = "bfloat16";
  cfg.raw["quantization_config"] = {{"_load_in_4bit", true},
                                    {"_load_in_8bit", false},
                                    {"bnb_4bit_compute_dtype", "bfloat16"},
                                    {"bnb_4bit_quant_storage", "uint8"},
                                    {"bnb_4bit_quant_type", "nf4"},
                                    {"bnb_4bit_use_double_quant", dq},
                                    {"llm_int8_enable_fp32_cpu_offload", false},
                                    {"llm_int8_has_fp16_weight", false},
                                    {"llm_int8_skip_modules", nullptr},
                                    {"llm_int8_threshold", 6.0},
                                    {"load_in_4bit", true},
                                    {"load_in_8bit", false},
                                    {"quant_method", "bitsandbytes"}};
  hf_config_save(cfg, dir + "/config.json");
}

}  // namespace strata
