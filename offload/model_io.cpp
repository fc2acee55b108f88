#include "offload/model_io.h"

#include <filesystem>
#include <memory>
#include <vector>
#include <random>

#include "io/safetensors.h"
#include "src/core/error.h"

namespace strata {

void model_load_weights(HostStore& store, const std::string& dir) {
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
  // streamed: each tensor is read from the master (RAM or NVMe) a piece at a time, converted
  // and written, so the export holds one piece, never the model
  auto buf = std::make_shared<std::vector<float>>();
  std::vector<TensorToWrite> tensors;
  for (size_t i = 0; i < spec.params.size(); ++i) {
    const TensorSpec& r = spec.params[i];
    tensors.emplace_back(r.name, dtype, r.shape, [&store, buf, i, dtype](uint64_t offset, void* dst, size_t bytes) {
      const size_t es = dtype_size(dtype), count = bytes / es;
      buf->resize(count);
      store.read_state(StateArray::master, i, int64_t(offset / es), int64_t(count), buf->data());
      dtype_convert(dst, dtype, buf->data(), DType::f32, count);
    });
  }
  safetensors_write_dir(dir, tensors, max_shard_bytes);
  ModelConfig cfg = spec.config;
  cfg.raw["torch_dtype"] = dtype == DType::bf16 ? "bfloat16" : "float32";
  hf_config_save(cfg, dir + "/config.json");
}

}  // namespace strata
