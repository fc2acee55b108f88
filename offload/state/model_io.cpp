#include "offload/state/model_io.h"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <filesystem>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>
#include <random>

#include "io/safetensors.h"
#include "offload/state/moe_packed.h"
#include "offload/state/nf4_hf.h"
#include "src/core/error.h"
#include "src/core/threads.h"

namespace strata {

void model_load_weights(HostStore& store, const std::string& dir, const LoraAdapter* adapter) {
  const ModelSpec& spec = store.spec();
  // saved pre-quantized by bitsandbytes (offload/state/nf4_hf.h); another quantization: exit 2
  if (std::filesystem::exists(dir + "/config.json"))  // the dir's own, not the spec's (quantizing at load reads a bf16 dir)
    if (const HfQuantization q = hf_quantization_of(hf_config_load(dir), dir); q.nf4) return nf4_hf_load(store, dir, q, adapter);
  SafetensorsDir st = SafetensorsDir::open(dir);
  // MoE experts in the Hub's per-expert layout, or packed 3-D (offload/state/moe_packed.h)
  const bool moe = spec.config.num_experts > 0;
  std::vector<ExpectedTensor> expected = moe ? moe_packed_expected(st, spec.expected_tensors()) : spec.expected_tensors();
  // a gemma3 checkpoint's vision tower and projector sit beside its text model: present, not read
  const std::string& text = spec.config.text_prefix;
  if (text != "model.")
    for (const std::string& n : st.names())
      if (n.rfind(text, 0) != 0 && n.rfind("lm_head.", 0) != 0) expected.push_back(ExpectedTensor{n, st.find(n)->shape});
  safetensors_check_tensors(st, expected,
                            str_cat("config.json describes a ", spec.config.family, " model with ",
                                    spec.config.num_hidden_layers, " layers"));
  std::vector<float> buf, packed;
  std::string packed_name;
  for (size_t i = 0; i < spec.params.size(); ++i) {
    const TensorSpec& r = spec.params[i];
    buf.resize(size_t(r.numel()));
    if (const auto slice = moe ? moe_packed_slice(st, r.name) : std::nullopt) {
      moe_packed_read(st, *slice, packed, packed_name, buf.data());
    } else {
      st.read(r.name, DType::f32, buf.data());
      st.release(r.name);  // one tensor's file pages resident at a time (offload/plan/placement_plan.h counts it)
    }
    if (adapter) lora_adapter_merge_row(*adapter, i, buf.data());
    store.set_param(i, buf.data());
  }
}

namespace {

// Tensor i's initial values: matrices N(0, std) from one generator per tensor, seeded by (seed, i)
// (adding a tensor never shifts the others, and any order of generation gives the same bits),
// norms 1 (0 where the model's norms scale by 1 + w: Gemma 3, as transformers initialises them),
// the rest (biases) 0.
void init_tensor_values(const TensorSpec& r, size_t i, uint64_t seed, double std, bool norm_plus_one,
                        std::vector<float>& buf) {
  buf.assign(size_t(r.numel()), 0.f);
  const bool is_norm = r.name.find("norm") != std::string::npos && !norm_plus_one;
  if (r.shape.size() == 2) {
    std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + i);
    std::normal_distribution<double> dist(0.0, std);
    for (auto& x : buf) x = float(dist(rng));
  } else if (is_norm) {
    for (auto& x : buf) x = 1.f;
  }
}

}  // namespace

void model_init_weights(HostStore& store, uint64_t seed, double std) {
  // A generator runs sequentially within its tensor (~15-25 ns a value: a minute for 3B values on
  // one thread), so tensors are generated side by side on cpu_threads_count() - 1 threads, as long
  // as the values in flight fit in the largest tensor's (the host memory the placement plan
  // counts for this phase: "weight initialisation (one tensor)"), and this thread hands each
  // finished tensor to the store, as the sequential loop did.
  const ModelSpec& spec = store.spec();
  const size_t count = spec.params.size();
  const int threads = cpu_threads_count();
  std::vector<float> buf;
  if (threads <= 1 || count <= 1) {
    for (size_t i = 0; i < count; ++i) {
      init_tensor_values(spec.params[i], i, seed, std, model_norm_plus_one(spec.config), buf);
      store.set_param(i, buf.data());
    }
    return;
  }
  size_t budget = 0;
  for (size_t i = 0; i < count; ++i) budget = std::max(budget, size_t(spec.params[i].numel()));
  std::mutex mu;
  std::condition_variable changed;
  size_t next = 0, in_flight = 0;  // the next tensor to generate; values generated or generating
  std::vector<std::pair<size_t, std::vector<float>>> ready;  // generated, not yet in the store
  std::exception_ptr failure;
  bool stop = false;
  auto generate = [&] {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      changed.wait(lock, [&] {
        return stop || next == count || in_flight == 0 || in_flight + size_t(spec.params[next].numel()) <= budget;
      });
      if (stop || next == count) return;
      const size_t i = next++;
      in_flight += size_t(spec.params[i].numel());
      lock.unlock();
      std::vector<float> values;
      std::exception_ptr error;
      try {
        init_tensor_values(spec.params[i], i, seed, std, model_norm_plus_one(spec.config), values);
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      if (error && !failure) failure = error;
      ready.emplace_back(i, std::move(values));
      changed.notify_all();
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads && size_t(t) <= count; ++t) {
    try {
      pool.emplace_back(generate);
    } catch (const std::system_error&) {  // no more threads: the ones made do the work
      break;
    }
  }
  auto join = [&] {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    changed.notify_all();
    for (auto& t : pool) t.join();
  };
  try {
    for (size_t done = 0; done < count; ++done) {
      std::pair<size_t, std::vector<float>> item;
      {
        std::unique_lock<std::mutex> lock(mu);
        if (pool.empty()) {  // no generator thread could start: generate here
          item.first = next++;
          in_flight += size_t(spec.params[item.first].numel());
          init_tensor_values(spec.params[item.first], item.first, seed, std, model_norm_plus_one(spec.config), item.second);
        } else {
          changed.wait(lock, [&] { return !ready.empty() || failure; });
          if (failure) std::rethrow_exception(failure);
          item = std::move(ready.back());
          ready.pop_back();
        }
      }
      store.set_param(item.first, item.second.data());
      const size_t n = item.second.size();
      item.second = std::vector<float>();  // its values leave the budget with it
      {
        std::lock_guard<std::mutex> lock(mu);
        in_flight -= n;
      }
      changed.notify_all();
    }
  } catch (...) {
    join();
    throw;
  }
  join();
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
  cfg.raw.erase("quantization_config");  // a pre-quantized base's (nf4_hf.h): these weights are plain
  hf_config_save(cfg, dir + "/config.json");
}

}  // namespace strata
