// End to end on the CUDA backend: the step engine (offload/engine/engine.h) streaming a model layer by
// layer through the CUDA device's h2d / compute / d2h streams and events, with every op of a
// decoder layer, the chunked lm_head loss and the gradient path. Checked against the fp64
// torch goldens of tests/golden (tolerances of tests/models/test_golden_grad.cpp) and against
// the CPU backend running the same schedule: in f32, in bf16, and with packed documents; and
// with optimizer state and activation checkpoints on NVMe, bit-identical to RAM on CUDA too.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "tests/cuda/cuda_testing.h"
#include "tests/seeded_inputs.h"
#include "tests/offload/engine_step_rig.h"
#include "tests/testing.h"

namespace strata {
namespace {

using testing::Golden;
using testing::GoldenStep;

// One forward_backward with streamed weights and host-spilled checkpoints (the schedule with
// the most cross-stream traffic), on golden g's model and batch.
GoldenStep run_step(Device& dev, const Golden& g, DType dtype) {
  EngineOptions eo;
  eo.weights = WeightsMode::stream;
  eo.checkpoints = CheckpointMode::host;
  return testing::golden_step(dev, g, dtype, eo);
}

// Checks every tensor of got against want within tol; returns the worst.
testing::TensorError check_tensors(const GoldenStep& got, const std::vector<float>& want, double tol) {
  const auto errors = testing::tensor_errors(got.table, got.grads, want);
  for (const auto& e : errors) {
    INFO(e.name);
    CHECK(e.error <= tol);
  }
  return testing::worst_tensor_error(errors);
}

}  // namespace

TEST_CASE("the streaming engine on the CUDA backend matches the fp64 goldens and the CPU backend", "[cuda-emu]") {
  auto cuda = cuda_testing::test_device();
  if (!cuda) return;
  auto cpu = device_create(DeviceOptions{});
  testing::for_each_golden([&](const char* name, const Golden& g) {
    const GoldenStep on_cuda = run_step(*cuda, g, DType::f32);
    const GoldenStep on_cpu = run_step(*cpu, g, DType::f32);
    // The golden test's tolerances (f32 vs fp64 torch): loss 2e-6 relative, gradients 2e-5.
    CHECK(std::abs(on_cuda.loss - g.loss) <= 2e-6 * std::abs(g.loss));
    const auto worst = check_tensors(on_cuda, g.grads(on_cuda.table, on_cuda.grads.size()), 2e-5);
    std::printf("cuda-emu engine %-8s f32 loss %.9f (want %.9f) worst grad rel err %.2e (%s)\n",
                name, on_cuda.loss, g.loss, worst.error, worst.name.c_str());
    // And the two backends agree at least as closely as either does with fp64.
    CHECK(std::abs(on_cuda.loss - on_cpu.loss) <= 2e-6 * std::abs(on_cpu.loss));
    check_tensors(on_cuda, on_cpu.grads, 2e-5);
  });
}

TEST_CASE("the streaming engine on the CUDA backend in bf16 and with packed documents tracks the CPU backend", "[cuda-emu]") {
  auto cuda = cuda_testing::test_device();
  if (!cuda) return;
  auto cpu = device_create(DeviceOptions{});
  const Golden g = Golden::load("qwen3");

  SECTION("bf16 weights and matmul inputs") {
    const GoldenStep on_cuda = run_step(*cuda, g, DType::bf16);
    const GoldenStep on_cpu = run_step(*cpu, g, DType::bf16);
    const double want_loss = g.loss;
    // As the golden bf16 test: loss within 1%, gradients within 10% of the tensor's max; the
    // two backends round the same values to bf16, so they agree more closely.
    CHECK(std::abs(on_cuda.loss - want_loss) <= 1e-2 * std::abs(want_loss));
    check_tensors(on_cuda, g.grads(on_cuda.table, on_cuda.grads.size()), 0.1);
    CHECK(std::abs(on_cuda.loss - on_cpu.loss) <= 1e-3 * std::abs(on_cpu.loss));
    check_tensors(on_cuda, on_cpu.grads, 2e-2);
  }
  SECTION("packed documents: doc_start masks and per-document positions") {
    Golden packed = g;
    MicroBatch& mb = packed.batch;
    mb.doc_start.assign(mb.ids.size(), 0);
    for (int64_t b = 0; b < mb.B; ++b) {
      const int64_t split = 1 + (b * 3 + 4) % (mb.T - 1);  // a second document starts here
      for (int64_t t = 0; t < mb.T; ++t) {
        const size_t at = size_t(b * mb.T + t);
        mb.doc_start[at] = t < split ? 0 : int32_t(split);
        mb.pos[at] = int32_t(t - mb.doc_start[at]);
      }
    }
    const GoldenStep on_cuda = run_step(*cuda, packed, DType::f32);
    const GoldenStep on_cpu = run_step(*cpu, packed, DType::f32);
    const GoldenStep unpacked = run_step(*cpu, g, DType::f32);
    CHECK(std::abs(on_cpu.loss - unpacked.loss) > 1e-4);  // the packing does change the result
    CHECK(std::abs(on_cuda.loss - on_cpu.loss) <= 2e-6 * std::abs(on_cpu.loss));
    check_tensors(on_cuda, on_cpu.grads, 2e-5);
  }
}

namespace {

// Two optimizer steps of a 6-layer model (layers 1..3 spill their checkpoints) on `dev`: the
// losses, then the master weights after them. Each step accumulates `accum` micro-batches, one
// at a time or (layer_major) in one layer-major pass (offload/engine/engine.h).
// nvme_first_group > 0: only the state of groups from it on is on NVMe (the plan's split).
// gathered: the step's last pass gathers the clipped step's norm as gradients land (train_step's
// forward_backward_last / forward_backward_group_last); clip: optim.max_grad_norm.
// speculate_first > 0 (with gathered): groups from it to the RAM part's end update ahead of the
// norm (offload.speculative_update), committed or redone once it is known.
// derived: the layers with RAM state make their bf16 working copy from the master at each upload
// (offload.working_weights = "derived"). landing (layer-major, no clipping): each group updates as
// its gradient lands; in_flight: with the store's gradients in flight (one slot, taken in turn).
std::pair<std::vector<double>, std::vector<float>> nvme_run(Device& dev, bool on_nvme, int accum = 1,
                                                            bool layer_major = false, size_t nvme_first_group = 0,
                                                            bool gathered = false, double clip = 1.0,
                                                            size_t speculate_first = 0, bool derived = false,
                                                            bool landing = false, bool in_flight = false) {
  nlohmann::json j = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"},
                      {"hidden_size", 32}, {"intermediate_size", 48}, {"num_hidden_layers", 6},
                      {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"vocab_size", 300},
                      {"max_position_embeddings", 64}};
  const std::string dir = (std::filesystem::temp_directory_path() / "strata_cuda_nvme").string();
  std::filesystem::create_directories(dir);
  HostStoreOptions so;
  so.state_on_nvme = on_nvme;
  so.nvme_first_group = nvme_first_group;
  so.nvme_path = dir;
  so.nvme_block_bytes = 4096;
  so.nvme_chunk_bytes = 8192;
  so.derived_working = derived;
  so.grads_in_flight = in_flight;
  HostStore store(dev, model_spec_build(hf_config_parse(j.dump(), "test"), DType::bf16), so);
  REQUIRE(store.derived_layers() == (!derived ? 0 : !on_nvme ? 6 : nvme_first_group > 1 ? nvme_first_group - 1 : 0));
  model_init_weights(store, 4);
  EngineOptions eo;
  eo.checkpoints = on_nvme ? CheckpointMode::nvme : CheckpointMode::host;
  eo.nvme_dir = dir;
  eo.max_batch = 2;
  eo.max_tokens = 16;
  eo.group = layer_major ? accum : 1;
  if (speculate_first > 0) {
    eo.speculate_first_group = speculate_first;
    eo.speculate_end_group = on_nvme ? nvme_first_group : store.groups().size();
  }
  Engine engine(dev, store, eo);
  const MicroBatch mb = testing::strided_batch(2, 16, 300, 37);
  std::vector<MicroBatch> mbs;
  int64_t counted = 0;
  for (int a = 0; a < accum; ++a) mbs.push_back(testing::strided_batch(2, 16 - a, 300, 37 + a, 5 * a)), counted += mbs.back().counted();
  std::vector<double> losses;
  for (int step = 1; step <= 2; ++step) {
    const float scale = 1.f / float(counted);
    AdamWParams ap;
    ap.lr = 1e-3;
    ap.step = step;
    const AdamWParams* ahead = speculate_first > 0 ? &ap : nullptr;
    if (landing) {
      for (double l : engine.forward_backward_group_update(mbs, scale, ap, 0.0)) losses.push_back(l);
      losses.push_back(engine.landed_update_norm());
      continue;
    }
    if (layer_major) {
      for (double l : gathered ? engine.forward_backward_group_last(mbs, scale, ahead, 0.0) : engine.forward_backward_group(mbs, scale))
        losses.push_back(l);
    } else {
      for (size_t a = 0; a < mbs.size(); ++a)
        losses.push_back(gathered && a + 1 == mbs.size() ? engine.forward_backward_last(mbs[a], scale, ahead, 0.0)
                                                         : engine.forward_backward(mbs[a], scale));
    }
    losses.push_back(engine.optimizer_step(ap, clip, 0.0));  // the norm
  }
  losses.push_back(engine.forward_loss(mb));
  engine.synchronize();
  std::vector<float> master;
  for (size_t r = 0; r < store.spec().params.size(); ++r) {
    std::vector<float> row(size_t(store.f32_table()[r].numel()));
    store.get_param(r, row.data());
    master.insert(master.end(), row.begin(), row.end());
  }
  return {losses, master};
}

}  // namespace

TEST_CASE("the CUDA backend with optimizer state and checkpoints on NVMe equals RAM bit for bit", "[cuda-emu]") {
  auto cuda = cuda_testing::test_device();
  if (!cuda) return;
  const auto ram = nvme_run(*cuda, false), nvme = nvme_run(*cuda, true);
  CHECK(nvme.first == ram.first);
  REQUIRE(nvme.second.size() == ram.second.size());
  CHECK(std::memcmp(nvme.second.data(), ram.second.data(), ram.second.size() * 4) == 0);
  // the state split between RAM (embed, layers 0..2) and NVMe (layers 3..5, the head): the same bits
  const auto split = nvme_run(*cuda, true, 1, false, 4);
  CHECK(split.first == ram.first);
  REQUIRE(split.second.size() == ram.second.size());
  CHECK(std::memcmp(split.second.data(), ram.second.data(), ram.second.size() * 4) == 0);
}

TEST_CASE("the CUDA backend: the clipped step's norm gathered as gradients land equals the serial norm bit for bit", "[cuda-emu]") {
  auto cuda = cuda_testing::test_device();
  if (!cuda) return;
  for (double clip : {1e-3, 1e6})  // clipping every step, and never
    for (bool on_nvme : {false, true})
      for (bool layer_major : {false, true}) {
        INFO("clip " << clip << (on_nvme ? " NVMe" : " RAM") << (layer_major ? " layer-major" : " micro-batch"));
        const auto after = nvme_run(*cuda, on_nvme, 2, layer_major, 0, false, clip);
        const auto gathered = nvme_run(*cuda, on_nvme, 2, layer_major, 0, true, clip);
        CHECK(gathered.first == after.first);  // losses and norms
        REQUIRE(gathered.second.size() == after.second.size());
        CHECK(std::memcmp(gathered.second.data(), after.second.data(), after.second.size() * 4) == 0);
      }
  // the clip mattered: clipping every step moved the weights less than never clipping
  CHECK(nvme_run(*cuda, false, 2, false, 0, true, 1e-3).second != nvme_run(*cuda, false, 2, false, 0, true, 1e6).second);
}

TEST_CASE("the CUDA backend: speculative updates equal the serial clipped step bit for bit", "[cuda-emu][speculation]") {
  auto cuda = cuda_testing::test_device();
  if (!cuda) return;
  // every speculated update redone (one at a time), and every one committed (layer-major)
  for (const auto& [clip, layer_major] : {std::pair{1e-3, false}, std::pair{1e6, true}}) {
    INFO("clip " << clip << (layer_major ? " layer-major" : " micro-batch"));
    const auto serial = nvme_run(*cuda, false, 2, layer_major, 0, true, clip);
    const auto ahead = nvme_run(*cuda, false, 2, layer_major, 0, true, clip, 1);
    CHECK(ahead.first == serial.first);  // losses, norms, and a forward on the last weights
    REQUIRE(ahead.second.size() == serial.second.size());
    CHECK(std::memcmp(ahead.second.data(), serial.second.data(), serial.second.size() * 4) == 0);
  }
  // the state split: groups 3.. on NVMe, speculation over RAM groups 1, 2
  const auto serial = nvme_run(*cuda, true, 2, false, 3, true, 1e-3);
  const auto ahead = nvme_run(*cuda, true, 2, false, 3, true, 1e-3, 1);
  CHECK(ahead.first == serial.first);
  CHECK(std::memcmp(ahead.second.data(), serial.second.data(), serial.second.size() * 4) == 0);
}

// offload.resident_layers on the CUDA backend (tests/offload/engine_step_rig.h's three steps of a
// 3-layer model, layer-major, derived working weights): the first 2 layers resident, the last one
// streamed through the one shared slot it needs, against every layer streamed, bit for bit, its
// weights' uploads fewer.
TEST_CASE("the CUDA backend: layers resident and streamed in one run equal all streamed bit for bit", "[cuda-emu][resident]") {
  auto cuda = cuda_testing::test_device();
  if (!cuda) return;
  engine_step_rig::Options streamed;
  streamed.layer_major = true;
  streamed.store.derived_working = true;
  streamed.device = cuda.get();
  engine_step_rig::Options mixed = streamed;
  mixed.resident_layers = 2;
  const engine_step_rig::Result s = engine_step_rig::run(streamed, "cuda_rs"), m = engine_step_rig::run(mixed, "cuda_rm");
  CHECK(m.losses == s.losses);
  CHECK(m.norms == s.norms);
  CHECK(engine_step_rig::same_bits(m.master, s.master));
  CHECK(m.final_loss == s.final_loss);
  // the layers' weights cross less (all link bytes also count checkpoints, which the third
  // slot may push off this device's budget)
  CHECK(m.stats.layer_upload_bytes < s.stats.layer_upload_bytes);
}

// offload.norm_pass on the CUDA backend (tests/offload/engine_step_rig.h's three steps, layer-major):
// the norm from a first pass, the updates as the gradients land in a second, the gradients in
// flight, against the serial clipped step on the same device, bit for bit; and the first step's
// norm against the CPU backend's within 1e-4 relative.
TEST_CASE("the CUDA backend: a norm pass trains bit for bit like the serial clipped step", "[cuda-emu][norm-pass]") {
  auto cuda = cuda_testing::test_device();
  if (!cuda) return;
  for (double clip : {1e-3, 1e3}) {
    INFO("max_grad_norm " << clip);
    engine_step_rig::Options serial;
    serial.layer_major = true;
    serial.clip = clip;
    serial.device = cuda.get();
    engine_step_rig::Options two = serial;
    two.norm_pass = true;
    two.gradients_first = false;
    two.store.grads_in_flight = true;
    two.resident_layers = 1;  // and the first layer resident
    const engine_step_rig::Result s = engine_step_rig::run(serial, "cuda_ns"), t = engine_step_rig::run(two, "cuda_nt");
    CHECK(t.losses == s.losses);
    CHECK(t.norms == s.norms);
    CHECK(engine_step_rig::same_bits(t.master, s.master));
    CHECK(t.m == s.m);
    CHECK(t.v == s.v);
    if (clip > 1) continue;
    engine_step_rig::Options on_cpu = two;
    on_cpu.device = nullptr;
    const engine_step_rig::Result c = engine_step_rig::run(on_cpu, "cpu_nt");
    // the first step's norm (later steps start from weights the backends' last bits already moved)
    REQUIRE(c.norms.size() == t.norms.size());
    CHECK(std::abs(t.norms[0] - c.norms[0]) <= 1e-4 * c.norms[0]);
  }
}

TEST_CASE("the CUDA backend: layer-major accumulation equals the micro-batch schedule bit for bit", "[cuda-emu]") {
  auto cuda = cuda_testing::test_device();
  if (!cuda) return;
  for (bool on_nvme : {false, true}) {
    INFO((on_nvme ? "NVMe" : "host") << " checkpoints, 3 micro-batches per step");
    const auto per_mb = nvme_run(*cuda, on_nvme, 3, false), lm = nvme_run(*cuda, on_nvme, 3, true);
    CHECK(lm.first == per_mb.first);
    REQUIRE(lm.second.size() == per_mb.second.size());
    CHECK(std::memcmp(lm.second.data(), per_mb.second.data(), per_mb.second.size() * 4) == 0);
  }
}

}  // namespace strata

namespace strata {
namespace {

// LoRA (offload/state/lora.h) on golden `name`'s model: a frozen store, the adapters of
// tests/golden/lora_grad/<name>, one forward_backward with streamed weights and host checkpoints;
// returns the loss per counted token and the adapters' gradients (PEFT names, dB unscaled). With
// dropout, the golden's LoRA dropout (p, seed; step 1, micro-batch 0: the engine's first pass).
// With accum > 0: that many strided micro-batches of the golden's shape instead (each with its
// own masks), one at a time or in one layer-major pass; the losses per micro-batch too.
struct LoraStep {
  double loss = 0;
  std::vector<double> losses;
  std::vector<std::pair<std::string, std::vector<float>>> grads;
};
LoraStep lora_step(Device& dev, const std::string& name, bool dropout = false, int accum = 0, bool layer_major = false) {
  const testing::Golden g = testing::Golden::load(name);
  const std::string dir = testing::source_path("tests/golden/lora_grad/" + name);
  const nlohmann::json expected = nlohmann::json::parse(testing::read_file(dir + "/expected.json"));
  const ModelSpec spec = model_spec_build(hf_config_load(g.dir), DType::f32);
  HostStoreOptions so;
  so.weights_only = true;
  HostStore store(dev, spec, so);
  model_load_weights(store, g.dir);
  LoraOptions lo;
  lo.r = expected["r"].get<int64_t>();
  lo.alpha = expected["alpha"].get<double>();
  lo.targets = lora_targets_parse(expected["targets"].get<std::vector<std::string>>(), "expected.json");
  if (dropout) {
    lo.dropout = expected["dropout"].get<double>();
    lo.seed = expected["dropout_seed"].get<uint64_t>();
  }
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
  LoraStep r;
  if (accum == 0) {
    r.loss = engine.forward_backward(g.batch, float(1.0 / double(g.batch.counted()))) / double(g.batch.counted());
  } else {
    std::vector<MicroBatch> mbs;
    int64_t counted = 0;
    for (int a = 0; a < accum; ++a)
      mbs.push_back(testing::strided_batch(g.batch.B, g.batch.T - a, spec.config.vocab_size, 37 + a, 5 * a)), counted += mbs.back().counted();
    const float scale = float(1.0 / double(counted));
    if (layer_major) r.losses = engine.forward_backward_group(mbs, scale);
    else
      for (const MicroBatch& mb : mbs) r.losses.push_back(engine.forward_backward(mb, scale));
  }
  engine.synchronize();
  engine.lora_collect_grads();
  for (const TensorSpec& t : lora.layout().table.rows())
    r.grads.emplace_back(t.name, std::vector<float>(lora.grad() + t.offset / 4, lora.grad() + t.offset / 4 + t.numel()));
  return r;
}

double rel_l2(const std::vector<float>& a, const float* b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]), den += double(b[i]) * b[i];
  return std::sqrt(num / std::max(den, 1e-300));
}

}  // namespace

TEST_CASE("LoRA on the CUDA backend: adapter gradients match the torch goldens and the CPU backend", "[cuda-emu][lora]") {
  auto cuda = cuda_testing::test_device();
  if (!cuda) return;
  auto cpu = device_create(DeviceOptions{});
  for (const char* name : {"llama", "qwen3"}) {
    for (bool dropout : {false, true}) {  // with dropout: the same masks on both backends
      INFO(name << (dropout ? " with dropout" : ""));
      const LoraStep on_cuda = lora_step(*cuda, name, dropout), on_cpu = lora_step(*cpu, name, dropout);
      SafetensorsFile want = SafetensorsFile::open(testing::source_path("tests/golden/lora_grad/") + name +
                                                   (dropout ? "/grads_dropout.safetensors" : "/grads.safetensors"));
      REQUIRE(want.entries().size() == on_cuda.grads.size());
      double worst = 0, worst_cpu = 0;
      for (size_t i = 0; i < on_cuda.grads.size(); ++i) {
        const auto& [tensor, grad] = on_cuda.grads[i];
        INFO(tensor);
        const SafetensorsEntry* e = want.find(tensor);
        REQUIRE(e);
        worst = std::max(worst, rel_l2(grad, static_cast<const float*>(want.data(*e))));
        worst_cpu = std::max(worst_cpu, rel_l2(grad, on_cpu.grads[i].second.data()));
      }
      std::printf("cuda-emu lora %-6s%s loss %.9f (cpu %.9f) worst adapter grad rel L2 %.2e vs torch, %.2e vs cpu\n",
                  name, dropout ? " dropout" : "", on_cuda.loss, on_cpu.loss, worst, worst_cpu);
      CHECK(worst <= 1e-4);
      CHECK(worst_cpu <= 1e-4);
      CHECK(std::abs(on_cuda.loss - on_cpu.loss) <= 2e-6 * on_cpu.loss);
    }
  }
}

TEST_CASE("LoRA on the CUDA backend: a layer-major pass equals the micro-batch schedule bit for bit, dropout masks included",
          "[cuda-emu][lora][layer_major]") {
  auto cuda = cuda_testing::test_device();
  if (!cuda) return;
  for (bool dropout : {false, true}) {
    INFO("3 micro-batches" << (dropout ? ", LoRA dropout" : ""));
    const LoraStep mb = lora_step(*cuda, "llama", dropout, 3, false), lm = lora_step(*cuda, "llama", dropout, 3, true);
    REQUIRE(mb.losses.size() == 3);
    CHECK(lm.losses == mb.losses);
    REQUIRE(lm.grads.size() == mb.grads.size());
    for (size_t i = 0; i < mb.grads.size(); ++i) {
      INFO(mb.grads[i].first);
      CHECK(lm.grads[i].second == mb.grads[i].second);
    }
  }
}

TEST_CASE("the CUDA backend: derived working weights train bit for bit like a stored working copy", "[cuda-emu][derived]") {
  auto cuda = cuda_testing::test_device();
  if (!cuda) return;
  for (bool layer_major : {false, true})
    for (double clip : {1e-3, 0.0}) {
      INFO((layer_major ? "layer-major" : "micro-batch") << ", clip " << clip);
      const auto stored = nvme_run(*cuda, false, 2, layer_major, 0, clip > 0, clip);
      const auto derived = nvme_run(*cuda, false, 2, layer_major, 0, clip > 0, clip, 0, true);
      CHECK(derived.first == stored.first);  // losses, norms, and a forward on the last weights
      REQUIRE(derived.second.size() == stored.second.size());
      CHECK(std::memcmp(derived.second.data(), stored.second.data(), stored.second.size() * 4) == 0);
    }
  // the state split (groups 4.. on NVMe): layers 0..2 derived, the rest stored
  const auto stored = nvme_run(*cuda, true, 1, false, 4);
  const auto derived = nvme_run(*cuda, true, 1, false, 4, false, 1.0, 0, true);
  CHECK(derived.first == stored.first);
  CHECK(std::memcmp(derived.second.data(), stored.second.data(), stored.second.size() * 4) == 0);
}

TEST_CASE("the CUDA backend: gradients in flight train bit for bit like the whole gradient buffer", "[cuda-emu][lean-grads]") {
  auto cuda = cuda_testing::test_device();
  if (!cuda) return;
  for (bool derived : {false, true}) {
    INFO((derived ? "derived working weights" : "stored working weights"));
    const auto full = nvme_run(*cuda, false, 2, true, 0, false, 0.0, 0, derived, true, false);
    const auto lean = nvme_run(*cuda, false, 2, true, 0, false, 0.0, 0, derived, true, true);
    CHECK(lean.first == full.first);  // losses, norms, and a forward on the last weights
    REQUIRE(lean.second.size() == full.second.size());
    CHECK(std::memcmp(lean.second.data(), full.second.data(), full.second.size() * 4) == 0);
  }
}

}  // namespace strata
