// The QLoRA rig (offload/state/nf4_layout.h) the CPU and emulated-CUDA tests share: golden
// `name`'s model (tests/golden/<name>) with the adapters of tests/golden/qlora_grad/<name>/adapter
// (the newer families: tools/golden/make_qlora_family_goldens.py) or else
// tests/golden/lora_grad/<name>, its
// base held as NF4 (double-quantized or not) or, for comparison, as a plain store of the NF4
// base's dequantized weights (the same values, unpacked); one forward_backward (or accum strided
// micro-batches, one at a time or in one layer-major pass) through an engine with streamed
// weights and host checkpoints. Returns the loss per counted token, the adapters' gradients (PEFT
// names, dB unscaled) and the engine's stats (layer_upload_bytes: the decoder layers' link bytes).
#pragma once
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "offload/engine/engine.h"
#include "offload/state/lora.h"
#include "offload/state/model_io.h"
#include "offload/state/nf4_layout.h"
#include "tests/seeded_inputs.h"
#include "tests/testing.h"

namespace strata::testing {

enum class QloraBase { nf4, nf4_no_double_quant, dequantized, bf16 };

struct QloraStep {
  double loss = 0;
  std::vector<double> losses;
  std::vector<std::pair<std::string, std::vector<float>>> grads;
  EngineStats stats;
  size_t layer_host_bytes = 0;   // the store's working bytes of the decoder layers
  int64_t layer_params = 0;      // the decoder layers' parameters
};

inline QloraStep qlora_step(Device& dev, const std::string& name, DType dtype, QloraBase base, int accum = 0,
                            bool layer_major = false) {
  const Golden g = Golden::load(name);
  const std::string own = source_path("tests/golden/qlora_grad/" + name);
  const std::string dir = std::filesystem::exists(own + "/adapter") ? own : source_path("tests/golden/lora_grad/" + name);
  const nlohmann::json expected = nlohmann::json::parse(read_file(dir + "/expected.json"));
  ModelSpec spec = model_spec_build(hf_config_load(g.dir), dtype);
  ModelSpec nf4 = spec;
  nf4_base_enable(nf4, base != QloraBase::nf4_no_double_quant);
  HostStoreOptions so;
  so.weights_only = true;
  const bool packed = base == QloraBase::nf4 || base == QloraBase::nf4_no_double_quant;
  HostStore store(dev, packed ? nf4 : spec, so);
  if (base == QloraBase::dequantized) {  // the NF4 base's weights, unpacked
    HostStore q(dev, nf4, so);
    model_load_weights(q, g.dir);
    std::vector<float> values;
    for (size_t r = 0; r < spec.params.size(); ++r) {
      values.resize(size_t(spec.params[r].numel()));
      q.get_param(r, values.data());
      store.set_param(r, values.data());
    }
  } else {
    model_load_weights(store, g.dir);
  }
  LoraOptions lo;
  lo.r = expected["r"].get<int64_t>();
  lo.alpha = expected["alpha"].get<double>();
  lo.targets = lora_targets_parse(expected["targets"].get<std::vector<std::string>>(), "expected.json");
  LoraStore lora(dev, spec, lo);
  lora.load_peft(dir + "/adapter");
  EngineOptions eo;
  eo.weights = WeightsMode::stream;
  eo.checkpoints = CheckpointMode::host;
  eo.max_batch = g.batch.B;
  eo.max_tokens = g.batch.T;
  eo.lora = lo;
  eo.group = layer_major ? accum : 1;
  Engine engine(dev, store, eo, &lora);
  QloraStep r;
  for (size_t l = 0; l < spec.layers.size(); ++l) {
    r.layer_host_bytes += store.layer_group(l).working_bytes;
    for (size_t row = store.layer_group(l).first_row; row < store.layer_group(l).end_row; ++row)
      r.layer_params += spec.params[row].numel();
  }
  if (accum == 0) {
    r.loss = engine.forward_backward(g.batch, float(1.0 / double(g.batch.counted()))) / double(g.batch.counted());
  } else {
    std::vector<MicroBatch> mbs;
    int64_t counted = 0;
    for (int a = 0; a < accum; ++a)
      mbs.push_back(strided_batch(g.batch.B, g.batch.T - a, spec.config.vocab_size, 37 + a, 5 * a)),
          counted += mbs.back().counted();
    const float scale = float(1.0 / double(counted));
    if (layer_major) r.losses = engine.forward_backward_group(mbs, scale);
    else
      for (const MicroBatch& mb : mbs) r.losses.push_back(engine.forward_backward(mb, scale));
  }
  engine.synchronize();
  r.stats = engine.stats();
  engine.lora_collect_grads();
  for (const TensorSpec& t : lora.layout().table.rows())
    r.grads.emplace_back(t.name, std::vector<float>(lora.grad() + t.offset / 4, lora.grad() + t.offset / 4 + t.numel()));
  return r;
}

// ||got - want||_2 / ||want||_2
inline double qlora_rel_l2(const std::vector<float>& got, const float* want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i)
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]), den += double(want[i]) * want[i];
  return std::sqrt(num / std::max(den, 1e-300));
}

// The worst tensor's relative L2 error of step s's adapter gradients against
// tests/golden/qlora_grad/<name>/<file> (the fp64 PEFT + bitsandbytes gradients).
inline double qlora_golden_error(const QloraStep& s, const std::string& name, const std::string& file) {
  SafetensorsFile want = SafetensorsFile::open(source_path("tests/golden/qlora_grad/" + name + "/" + file));
  REQUIRE(want.entries().size() == s.grads.size());
  double worst = 0;
  for (const auto& [tensor, grad] : s.grads) {
    INFO(tensor);
    const SafetensorsEntry* e = want.find(tensor);
    REQUIRE(e);
    worst = std::max(worst, qlora_rel_l2(grad, static_cast<const float*>(want.data(*e))));
  }
  return worst;
}

}  // namespace strata::testing
