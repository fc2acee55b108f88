#include "offload/state/model_io.h"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <vector>
#include <random>

#include "io/safetensors.h"
#include "src/core/error.h"

namespace strata {

void model_load_weights(HostStore& store, const std::string& dir, const LoraAdapter* adapter) {
  const ModelSpec& spec = store.spec();
  SafetensorsDir st = SafetensorsDir::open(dir);
  safetensors_check_tensors(st, spec.expected_tensors(),
                            str_cat("config.json describes a ", spec.config.family, " model with ",
                                    spec.config.num_hidden_layers, " layers"));
  std::vector<float> buf;
  for (size_t i = 0; i < spec.params.size(); ++i) {
    const TensorSpec& r = spec.params[i];
    buf.resize(size_t(r.numel()));
    st.read(r.name, DType::f32, buf.data());
    st.release(r.name);  // one tensor's file pages resident at a time (offload/plan/placement_plan.h counts it)
    if (adapter) lora_adapter_merge_row(*adapter, i, buf.data());
    store.set_param(i, buf.data());
  }
}

void model_init_weights(HostStore& store, uint64_t seed, double std) {
  const ModelSpec& spec = store.spec();
  std::vector<float> buf;
  for (size_t i = 0; i < spec.params.size(); ++i) {
    const TensorSpec& r = spec.params[i];
    buf.assign(size_t(r.numel()), 0.f);
    const bool is_norm = r.name.find("norm") != std::string::npos;
    if (r.shape.size() == 2) {
      // one generator per tensor, seeded by (seed, row): adding a tensor never shifts others
      std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + i);
      std::normal_distribution<double> dist(0.0, std);
      for (auto& x : buf) x = float(dist(rng));
    } else if (is_norm) {
      for (auto& x : buf) x = 1.f;
    }
    store.set_param(i, buf.data());
  }
}

void model_save_hf(const HostStore& store, const std::string& dir, DType dtype,
                   uint64_t max_shard_bytes) {
  const ModelSpec& spec = store.spec();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  STRATA_CHECK_IO(!ec, "cannot create output directory ", dir, ": ", ec.message());
  // Streamed tensor by tensor: one tensor's f32 values (read from the master, in RAM or on NVMe)
  // and one chunk of it in the save dtype are all the export holds (offload/plan/placement_plan.h
  // counts exactly these).
  std::vector<float> values;
  std::vector<char> converted;
  std::vector<TensorToWrite> tensors;
  for (size_t i = 0; i < spec.params.size(); ++i) {
    const TensorSpec& r = spec.params[i];
    TensorToWrite t(r.name, dtype, r.shape, static_cast<const void*>(nullptr));
    t.stream = [&store, &values, &converted, i, dtype](const TensorSink& write) {
      values.resize(size_t(store.spec().params[i].numel()));
      store.get_param(i, values.data());
      if (dtype == DType::f32) {
        write(values.data(), values.size() * 4);
        return;
      }
      converted.resize(std::min(values.size(), kExportChunkElements) * dtype_size(dtype));
      for (size_t first = 0; first < values.size(); first += kExportChunkElements) {
        const size_t n = std::min(kExportChunkElements, values.size() - first);
        dtype_convert(converted.data(), dtype, values.data() + first, DType::f32, n);
        write(converted.data(), n * dtype_size(dtype));
      }
    };
    tensors.push_back(std::move(t));
  }
  safetensors_write_dir(dir, tensors, max_shard_bytes);
  ModelConfig cfg = spec.config;
  cfg.raw["torch_dtype"] = dtype == DType::bf16 ? "bfloat16" : "float32";
  hf_config_save(cfg, dir + "/config.json");
}

}  // namespace strata
