// The placement plan (offload/plan/placement_plan.h): every kind of state's bytes against hand-worked
// figures and against what the store, the engine and the device really allocate; the tier
// decisions (a tight host budget with an NVMe dir moves the overflow of master and moments to NVMe; without
// one it is an exit-3 error whose changes each say what they save); f32 mode counting one f32
// copy; the host budget's origin; and the fallback to pageable memory when pinning fails (one
// warning stating the cost, the bytes counted as host, results unchanged).
#include <unistd.h>

#include <catch2/catch.hpp>
#include <thread>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "offload/plan/plan_search.h"
#include "kernels/cpu/ops.h"
#include "src/recipe/recipe_modes.h"
#include "src/core/threads.h"
#include "offload/engine/engine.h"
#include "offload/engine/engine_zo.h"
#include "offload/state/model_io.h"
#include "offload/plan/placement_plan.h"
#include "offload/stream/checkpoint_spill.h"
#include "offload/state/nvme_state.h"
#include "src/core/align.h"
#include "src/device/arena.h"
#include "src/core/process_memory.h"
#include "src/recipe/recipe.h"
#include "src/core/error.h"
#include "tests/seeded_inputs.h"
#include "tests/testing.h"

namespace strata {
namespace {

// Every tensor a multiple of 256 bytes in both tables, so no alignment padding: C 64, kv 2 x 16,
// F 128, V 256. Matrices 4096 (q, o), 2048 (k, v), 8192 (gate, up, down) elements; 256 x 64 for
// embed and lm_head; norms 64 floats.
ModelSpec budget_spec(bool tied) {
  return model_spec_build(testing::tiny_llama_config({64, 128, 3, 256, 256, tied}), DType::bf16);
}

EngineOptions budget_engine(const std::string& checkpoints) {
  EngineOptions eo;
  eo.weights = WeightsMode::stream;
  eo.checkpoints = checkpoint_mode_parse(checkpoints);
  eo.recompute = RecomputeMode::always;  // as plan_inputs
  eo.max_batch = 2;
  eo.max_tokens = 16;
  return eo;
}

// What an engine built on a device of device_bytes keeps there (budget_engine's shapes).
struct EngineFootprint {
  size_t device_checkpoints = 0, kept_layers = 0, used_bytes = 0, kept_chunks = 0;
};
EngineFootprint engine_footprint(const ModelSpec& spec, size_t device_bytes, const std::string& weights,
                                 const std::string& checkpoints, const std::string& recompute) {
  DeviceOptions dopt;
  dopt.memory_bytes = device_bytes;
  auto dev = device_create(dopt);
  HostStore hs(*dev, spec);
  EngineOptions eo = budget_engine(checkpoints);
  eo.weights = weights_mode_parse(weights);
  eo.recompute = recompute_mode_parse(recompute);
  Engine engine(*dev, hs, eo);
  return {engine.device_checkpoints(), engine.kept_activation_layers(), dev->used_bytes(), engine.kept_logit_chunks()};
}

// Captures what is written to file descriptor 2 while it lives.
class StderrCapture {
 public:
  StderrCapture() {
    std::fflush(stderr);
    saved_ = dup(2);
    file_ = std::tmpfile();
    dup2(fileno(file_), 2);
  }
  std::string finish() {
    std::fflush(stderr);
    dup2(saved_, 2);
    close(saved_);
    saved_ = -1;
    std::rewind(file_);
    std::string text;
    char buf[4096];
    size_t got;
    while ((got = std::fread(buf, 1, sizeof buf, file_)) > 0) text.append(buf, got);
    std::fclose(file_);
    file_ = nullptr;
    return text;
  }
  ~StderrCapture() {
    if (saved_ >= 0) finish();
  }

 private:
  int saved_ = -1;
  FILE* file_ = nullptr;
};

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}


PlanInputs plan_inputs(const std::string& checkpoints, const std::string& recompute = "always") {
  PlanInputs in;
  in.weights = WeightsMode::stream;
  in.checkpoints = checkpoint_mode_parse(checkpoints);
  in.recompute = recompute_mode_parse(recompute);
  in.optimizer = StateTier::host;
  // the working copy stays stored: these tests make the host short to see the other moves
  // (derived working weights: tests/offload/test_derived_working.cpp), and so does every gradient
  // of a clipped step (a norm pass: tests/offload/test_plan_search.cpp)
  in.working = WorkingMode::stored;
  in.norm_pass = NormPassMode::off;
  in.micro_batch = 2;
  in.sequence_len = 16;
  return in;
}

// A model large enough that NVMe's own buffers (32 MiB of I/O staging) are small beside its
// optimizer state: 4 layers of C 1024, F 4096, V 32000 (~100M parameters). Nothing is allocated.
ModelSpec big_spec() {
  return model_spec_build(testing::tiny_llama_config({1024, 4096, 4, 32000, 256, false, 8, 4}), DType::bf16);
}

}  // namespace

TEST_CASE("the plan's bytes are hand-worked and equal what the store, engine and device allocate", "[plan]") {
  for (bool tied : {false, true}) {
    INFO((tied ? "tied" : "untied"));
    const ModelSpec spec = budget_spec(tied);
    // per layer: 2 x 4096 + 2 x 2048 + 3 x 8192 matrix elements, 2 x 64 norm floats
    const size_t layer_matrix = 2 * 4096 + 2 * 2048 + 3 * 8192, layer_norm = 2 * 64;
    const size_t matrix = 3 * layer_matrix + (tied ? 1 : 2) * 256 * 64, norm = 3 * layer_norm + 64;
    const size_t params = matrix + norm;
    REQUIRE(size_t(spec.parameter_count()) == params);
    PlanInputs in = plan_inputs("host");
    in.baseline_bytes = 1000;
    in.data_bytes = 24;
    const RunPlan p = placement_plan(spec, in, PlanBudgets{});
    CHECK(p.fits());
    CHECK(p.bytes_of("working weights (bf16)") == matrix * 2 + norm * 4);  // bf16 matrices, f32 norms
    CHECK(p.bytes_of("fp32 master weights") == params * 4);
    CHECK(p.bytes_of("AdamW moments (f32 m and v)") == params * 8);
    CHECK(p.bytes_of("fp32 gradient accumulation") == params * 4);
    const size_t act = 2 * 16 * 64 * 4, layer_grad = (layer_matrix + layer_norm) * 4;
    // x0, dx0, two layer gradient stagings, the final norm gradient, one lm_head gradient chunk
    // (all 256 rows: one chunk, so one slot)
    CHECK(p.bytes_of("pinned staging (activations, gradients)") == 2 * act + 2 * layer_grad + 64 * 4 + 256 * 64 * 4);
    CHECK(p.bytes_of("layer checkpoints (pinned host)") == 3 * act);
    CHECK(p.host_checkpoints == 3);
    CHECK(p.device_checkpoints == 0);
    // two streamed slots of one layer's bf16 working weights (74240 bytes: 256-aligned already)
    CHECK(p.bytes_of("device layer weight slots") == 2 * (layer_matrix * 2 + layer_norm * 4));
    // transients: the largest tensor is the 256 x 64 embedding (65536 bytes of f32); saving
    // reads its manifest back through 4 MiB, more than the export's 65536 + 16384 x 2
    REQUIRE(p.transients.size() == 3);
    CHECK(p.transients[0].bytes == 256 * 64 * 4);                 // initialising
    CHECK(p.transients[1].bytes == 256 * 64 * 4 + 256 * 64 * 2);  // exporting (bf16)
    CHECK(p.transients[2].bytes == kManifestReadBytes);            // saving
    CHECK(p.bytes_of("transient buffers (largest: saving a checkpoint)") == kManifestReadBytes);
    CHECK(p.bytes_of("process baseline (code, libraries, tokenizer)") == 1000);
    CHECK(p.bytes_of("tokenized data rows and order") == 24);
    CHECK(p.tier(Tier::host_pinned) == matrix * 2 + norm * 4 + params * 4 + 2 * act + 2 * layer_grad + 64 * 4 +
                                           256 * 64 * 4 + 3 * act);
    CHECK(p.tier(Tier::host) == 1000 + 24 + params * 12 + kManifestReadBytes);
    CHECK(p.tier(Tier::nvme) == 0);
    // the tier totals are the sums of the states, and plan.json says the same
    const nlohmann::json j = placement_plan_json(p);
    size_t sum[kTierCount] = {};
    for (const auto& s : j["states"]) {
      for (int t = 0; t < kTierCount; ++t)
        if (s["tier"] == tier_name(Tier(t))) sum[t] += s["bytes"].get<size_t>();
    }
    for (int t = 0; t < kTierCount; ++t) CHECK(j["tiers"][tier_name(Tier(t))].get<size_t>() == sum[t]);
    CHECK(j["tiers"].size() == 4);

    // what the store and the engine allocate is what the plan says, device and host
    auto dev = device_create(DeviceOptions{});
    HostStore hs(*dev, spec);
    CHECK(hs.pinned_bytes() == p.bytes_of("working weights (bf16)") + p.bytes_of("fp32 gradient accumulation"));
    CHECK(hs.host_bytes() == p.bytes_of("fp32 master weights") + p.bytes_of("AdamW moments (f32 m and v)"));
    EngineOptions eo;
    eo.weights = WeightsMode::stream;
    eo.checkpoints = CheckpointMode::host;
    eo.recompute = RecomputeMode::always;
    eo.max_batch = 2;
    eo.max_tokens = 16;
    Engine engine(*dev, hs, eo);
    CHECK(dev->used_bytes() == p.tier(Tier::device));
  }
}

TEST_CASE("checkpoints on the device: the plan keeps as many as the engine does, for every budget", "[plan]") {
  const ModelSpec spec = budget_spec(false);
  const RunPlan host = placement_plan(spec, plan_inputs("host"), PlanBudgets{});
  const size_t act = Arena::footprint(2 * 16 * 64 * 4);
  for (const std::string weights : {"stream", "device"}) {
    PlanInputs in = plan_inputs("auto");
    in.weights = weights_mode_parse(weights);
    const size_t fixed = placement_plan(spec, in, PlanBudgets{}).tier(Tier::device) - 3 * act;  // unlimited: all 3
    for (size_t extra : {size_t(0), (size_t(1) << 20) + act - 1, (size_t(1) << 20) + act, (size_t(1) << 20) + 2 * act + 7,
                         (size_t(1) << 20) + 5 * act}) {
      PlanBudgets b;
      b.device_bytes = fixed + extra;
      const RunPlan p = placement_plan(spec, in, b);
      INFO(weights << " budget " << b.device_bytes);
      CHECK(p.fits());
      const EngineFootprint e = engine_footprint(spec, b.device_bytes, weights, "auto", "always");
      CHECK(e.device_checkpoints == p.device_checkpoints);
      CHECK(e.used_bytes == p.tier(Tier::device));
      CHECK(p.host_checkpoints == 3 - p.device_checkpoints);
      CHECK(p.bytes_of("layer checkpoints (pinned host)") == p.host_checkpoints * 2 * 16 * 64 * 4);
    }
  }
  // "device": all of them, and a budget too small for them is a plan that does not fit
  PlanBudgets small;
  small.device_bytes = host.tier(Tier::device) + act;
  const RunPlan dev_ckpt = placement_plan(spec, plan_inputs("device"), small);
  CHECK(dev_ckpt.device_checkpoints == 3);
  CHECK_FALSE(dev_ckpt.fits());
  // "auto" keeps none of them within the 1 MiB margin the engine leaves: all 3 spill
  size_t saves = 0;
  for (const PlanChange& c : dev_ckpt.changes)
    if (c.what.rfind("set offload.checkpoints = \"auto\"", 0) == 0) saves = c.saves_bytes;
  CHECK(saves == 3 * act);
}

TEST_CASE("offload.weights = auto: resident or streamed, whichever step is faster", "[plan]") {
  const ModelSpec spec = budget_spec(false);
  PlanInputs in = plan_inputs("auto", "auto");
  in.weights = WeightsMode::automatic;
  const StepRates rates = plan_default_rates(in);
  auto with = [&](const std::string& weights) {
    PlanInputs r = in;
    r.weights = weights_mode_parse(weights);
    return r;
  };
  auto step = [&](const PlanInputs& v, const RunPlan& p) {
    return step_estimate(spec, plan_resolved_inputs(v, p), p, p.accumulation_steps, rates).seconds;
  };
  // no device budget: everything fits either way, and only the updates cross the link resident
  CHECK(placement_plan(spec, in, PlanBudgets{}).weights == WeightsMode::device);
  const RunPlan stream = placement_plan(spec, with("stream"), PlanBudgets{});
  const RunPlan resident = placement_plan(spec, with("device"), PlanBudgets{});
  REQUIRE(resident.tier(Tier::device) > stream.tier(Tier::device));  // a third layer slot
  // budgets where residency costs kept activations, or does not fit at all: the faster of the two
  for (size_t extra : {size_t(1) << 20, resident.tier(Tier::device) - stream.tier(Tier::device) + (size_t(1) << 20)}) {
    PlanBudgets b;
    b.device_bytes = stream.tier(Tier::device) + extra;
    const RunPlan s = placement_plan(spec, with("stream"), b), d = placement_plan(spec, with("device"), b);
    const RunPlan p = placement_plan(spec, in, b);
    REQUIRE(s.fits());
    // the fastest of the two; of two equally fast, the one that moves fewer bytes (resident)
    CHECK(p.step_seconds <= step(with("stream"), s) * (1 + 1e-9));
    if (d.fits()) CHECK(p.step_seconds <= step(with("device"), d) * (1 + 1e-9));
    if (d.fits() && step(with("device"), d) <= step(with("stream"), s)) CHECK(p.weights == WeightsMode::device);
  }
  // explicit modes are left alone; zo-sgd streams (its engine has no resident mode)
  CHECK(placement_plan(spec, with("stream"), PlanBudgets{}).weights == WeightsMode::stream);
  PlanInputs zo = in;
  zo.optimizer_kind = OptimizerKind::zo_sgd;
  zo.optimizer = StateTier::host;
  CHECK(placement_plan(spec, zo, PlanBudgets{}).weights == WeightsMode::stream);
}

TEST_CASE("kept activations and logits: the plan keeps as many as the engine does, after the checkpoints", "[plan][recompute]") {
  const ModelSpec spec = budget_spec(false);
  const RunPlan always = placement_plan(spec, plan_inputs("device", "always"), PlanBudgets{});
  const RunPlan never = placement_plan(spec, plan_inputs("device", "never"), PlanBudgets{});
  CHECK(always.kept_activation_layers == 0);
  CHECK(never.kept_activation_layers == 3);
  const size_t kept3 = never.bytes_of("kept layer activations (device, no recompute)");
  // and the logits of the one lm_head chunk (V 256) at N = 32 tokens, which "always" does not keep
  const size_t logits = never.bytes_of("kept lm_head logits (device, no recompute)");
  CHECK(logits == 32 * 256 * 4);
  CHECK(always.kept_logit_chunks == 0);
  CHECK(never.kept_logit_chunks == 1);
  CHECK(never.kept_logit_rows == 256);
  CHECK(kept3 + logits == never.tier(Tier::device) - always.tier(Tier::device));
  CHECK(never.device_checkpoints == 3);
  // one layer's xn1 .. act at N = 32 tokens (C 64, H 4 x D 16, Hk 2, F 128), each buffer 256-aligned
  const size_t N = 32;
  const size_t per_layer = align_up(N * 64 * 4) * 3 + align_up(N * 4) * 2 + align_up(N * 64 * 4) * 3 +
                           align_up(N * 32 * 4) * 3 + align_up(N * 4 * 4) * 2 + align_up(N * 2 * 4) +
                           align_up(N * 128 * 4) * 3;
  CHECK(kept3 == 3 * per_layer);
  for (const std::string weights : {"stream", "device"}) {
    for (size_t extra : {size_t(0), (size_t(1) << 20) + per_layer - 1, (size_t(1) << 20) + per_layer,
                         (size_t(1) << 20) + 2 * per_layer + 7, (size_t(1) << 20) + 5 * per_layer}) {
      PlanInputs in = plan_inputs("device", "always");
      in.weights = weights_mode_parse(weights);
      PlanBudgets b;
      b.device_bytes = placement_plan(spec, in, PlanBudgets{}).tier(Tier::device) + extra;
      in.recompute = RecomputeMode::automatic;
      const RunPlan p = placement_plan(spec, in, b);
      INFO(weights << " budget " << b.device_bytes);
      CHECK(p.device_checkpoints == 3);
      const EngineFootprint e = engine_footprint(spec, b.device_bytes, weights, "device", "auto");
      CHECK(e.kept_layers == p.kept_activation_layers);
      CHECK(e.kept_chunks == p.kept_logit_chunks);
      CHECK(e.used_bytes == p.tier(Tier::device));
      CHECK(p.fits());
      if (extra == (size_t(1) << 20) + per_layer - 1) CHECK(p.kept_activation_layers == 0);
      if (extra == (size_t(1) << 20) + 2 * per_layer + 7) CHECK(p.kept_activation_layers == 2);
      // the logits (32 KiB) from what the activations leave: a layer's less a byte, or two layers'
      const bool room = extra == (size_t(1) << 20) + per_layer - 1 || extra == (size_t(1) << 20) + 5 * per_layer;
      CHECK(p.kept_logit_chunks == (room ? 1u : 0u));
    }
  }
  // "never" on a budget without room for them: a plan that does not fit
  PlanBudgets small;
  small.device_bytes = always.tier(Tier::device) + 2 * per_layer;
  CHECK_FALSE(placement_plan(spec, plan_inputs("device", "never"), small).fits());
  CHECK(placement_plan(spec, plan_inputs("device", "auto"), small).kept_activation_layers == 0);  // the 1 MiB margin
}

TEST_CASE("zo-sgd: the store holds working weights and master alone, as the plan counts, device rows too", "[plan][zo]") {
  // The optimizer says what it needs (HostZoSgd::kState): no moments, no gradients. bf16: working
  // (bf16 matrices, f32 norms) + an f32 master; f32: the working copy is the master, 4 B/param.
  for (DType dtype : {DType::bf16, DType::f32}) {
    for (bool tied : {false, true}) {
      INFO(dtype_name(dtype) << (tied ? " tied" : " untied"));
      const ModelSpec spec = model_spec_build(testing::tiny_llama_config({64, 128, 3, 256, 256, tied}), dtype);
      const size_t layer_matrix = 2 * 4096 + 2 * 2048 + 3 * 8192, layer_norm = 2 * 64;
      const size_t matrix = 3 * layer_matrix + (tied ? 1 : 2) * 256 * 64, norm = 3 * layer_norm + 64;
      const size_t params = matrix + norm;
      REQUIRE(size_t(spec.parameter_count()) == params);
      const size_t working = dtype == DType::bf16 ? matrix * 2 + norm * 4 : params * 4;
      const size_t master = dtype == DType::bf16 ? params * 4 : 0;  // f32: the working copy

      HostStoreOptions so;
      so.needs = HostZoSgd::kState;
      const HostMemoryEstimate e = HostStore::estimate(spec, so);
      CHECK(e.working == working);
      CHECK(e.master == master);
      CHECK(e.moments == 0);
      CHECK(e.grads == 0);
      auto dev = device_create(DeviceOptions{});
      HostStore hs(*dev, spec, so);
      CHECK(hs.bytes() == working + master);  // exactly weights + master
      CHECK(hs.m() == nullptr);
      CHECK(hs.v() == nullptr);
      CHECK(hs.grad() == nullptr);
      CHECK_FALSE(hs.holds(StateArray::m));
      // AdamW's store of the same model: moments and gradients on top (16 B/param more in bf16)
      HostStore adamw(*dev, spec);
      CHECK(adamw.bytes() - hs.bytes() == params * 12);

      PlanInputs in = plan_inputs("host");
      in.optimizer_kind = OptimizerKind::zo_sgd;
      const RunPlan p = placement_plan(spec, in, PlanBudgets{});
      CHECK(p.fits());
      CHECK(p.bytes_of(str_cat("working weights (", dtype_name(dtype), ")")) == working);
      CHECK(p.bytes_of("fp32 master weights") == master);
      for (const PlanState& st : p.states) {
        INFO(st.kind);
        CHECK(st.kind.find("AdamW") == std::string::npos);
        CHECK(st.kind.find("gradient") == std::string::npos);
        CHECK(st.kind.find("checkpoints") == std::string::npos);
      }
      // the device rows and the pinned staging are the zeroth-order engine's table
      ZoEngine engine(*dev, hs, budget_engine("host"));
      CHECK(dev->used_bytes() == p.tier(Tier::device));
      CHECK(p.tier(Tier::device) == ZoEngine::device_bytes(spec, budget_engine("host")));
      CHECK(p.bytes_of("pinned staging (embedding outputs)") == ZoEngine::pinned_bytes(spec, budget_engine("host")));
      CHECK(p.bytes_of("pinned staging (embedding outputs)") == 2 * 2 * 16 * 64 * 4);  // x0 of each pass
      // and a plan for AdamW on the same model counts what that store holds
      const RunPlan pa = placement_plan(spec, plan_inputs("host"), PlanBudgets{});
      CHECK(pa.host_total() > p.host_total());
    }
  }
  // zo-sgd keeps no moments to place on NVMe: asking for it is bad input naming the fix
  PlanInputs in = plan_inputs("host");
  in.optimizer_kind = OptimizerKind::zo_sgd;
  in.optimizer = StateTier::nvme;
  PlanBudgets b;
  b.nvme_dir = "/tmp";
  CHECK_THROWS_WITH(placement_plan(budget_spec(false), in, b), Catch::Contains("set offload.optimizer = \"host\""));
}

TEST_CASE("f32 compute mode counts one f32 copy: the master is the working copy", "[plan]") {
  const ModelSpec spec = model_spec_build(testing::tiny_llama_config({64, 128, 3, 256, 256, false}), DType::f32);
  const size_t params = size_t(spec.parameter_count());
  PlanInputs in = plan_inputs("host");
  const RunPlan one = placement_plan(spec, in, PlanBudgets{});
  CHECK(one.bytes_of("working weights (f32)") == params * 4);
  CHECK(one.bytes_of("fp32 master weights (the f32 working copy)") == 0);
  CHECK(one.bytes_of("fp32 master weights") == 0);
  // 4 (working = master) + 8 (m, v) + 4 (gradients) bytes per parameter in the store
  CHECK(one.bytes_of("working weights (f32)") + one.bytes_of("AdamW moments (f32 m and v)") +
            one.bytes_of("fp32 gradient accumulation") == params * 16);
  in.f32_master_shared = false;  // a store that still keeps two f32 copies
  const RunPlan two = placement_plan(spec, in, PlanBudgets{});
  CHECK(two.bytes_of("fp32 master weights") == params * 4);
  CHECK(two.host_total() - one.host_total() == params * 4);
}

TEST_CASE("the CPU backend's kernel scratch is host memory in the plan, a CUDA device has none", "[plan][scratch]") {
  // budget_spec: C 64, 4 heads of 16, 2 kv heads, V 256 in one chunk; micro-batches of 2 x 16
  const std::string row = "CPU kernel scratch (attention inputs, dS, loss tiles, GEMM tiles)";
  for (const DType dt : {DType::bf16, DType::f32}) {
    INFO(dtype_name(dt));
    const ModelSpec spec = model_spec_build(testing::tiny_llama_config({64, 128, 3, 256, 256, false}), dt);
    PlanInputs in = plan_inputs("host");
    in.device_in_host_ram = true;
    const RunPlan cpu = placement_plan(spec, in, PlanBudgets{});
    // every kernel thread's GEMM tile buffers, for the longest sum (the vocab chunk, 256, here)
    const size_t gemm = size_t(cpu_threads_count()) * cpu::matmul_scratch_bytes(256, dt);
    const size_t want = cpu::attention_scratch_bytes(2, 16, 4, 2, 16, dt, cpu::attention_isa_active()) +
                        cpu::lm_head_ce_scratch_bytes(2 * 16, 64, 256, dt) + gemm;
    CHECK(want > 0);
    CHECK(cpu.bytes_of(row) == want);
    in.device_in_host_ram = false;
    in.device_is_cuda = true;
    const RunPlan cuda = placement_plan(spec, in, PlanBudgets{});
    CHECK(cuda.bytes_of(row) == 0);
  }
}

TEST_CASE("more kernel threads than cores: a plan short of RAM names device.cpu_threads and what it saves",
          "[plan][scratch]") {
  // issue 43: device.cpu_threads = 100000 asked for GiBs of GEMM scratch and the advice never named it
  const ModelSpec spec = model_spec_build(testing::tiny_llama_config({64, 128, 3, 256, 256, false}), DType::f32);
  PlanInputs in = plan_inputs("host");
  in.device_in_host_ram = true;
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  const int keep = cpu_threads_count();
  cpu_threads_set(cores + 1000);
  PlanBudgets b;
  b.host_bytes = placement_plan(spec, in, b).host_total() - 1;
  const RunPlan p = placement_plan(spec, in, b);
  cpu_threads_set(keep);
  REQUIRE_FALSE(p.fits());
  const PlanChange* named = nullptr;
  for (const PlanChange& c : p.changes)
    if (c.what.find("lower device.cpu_threads to " + std::to_string(cores)) != std::string::npos) named = &c;
  REQUIRE(named);
  CHECK(named->saves_bytes == 1000 * cpu::matmul_scratch_bytes(256, DType::f32));  // the vocab chunk's sum is the longest
  // at or below the core count the change is not offered
  cpu_threads_set(cores);
  const RunPlan q = placement_plan(spec, in, b);
  cpu_threads_set(keep);
  for (const PlanChange& c : q.changes) CHECK(c.what.find("device.cpu_threads") == std::string::npos);
}

TEST_CASE("a tight host budget with an NVMe dir moves the overflow of master and moments to NVMe", "[plan]") {
  const ModelSpec spec = big_spec();
  const size_t params = size_t(spec.parameter_count());
  const HostStoreLayout layout = HostStore::layout(spec);
  PlanInputs in = plan_inputs("auto");
  in.optimizer = StateTier::automatic;
  PlanBudgets b;
  const RunPlan ram = placement_plan(spec, in, b);
  CHECK_FALSE(ram.optimizer_on_nvme);
  CHECK(ram.tier(Tier::nvme) == 0);
  b.host_bytes = ram.host_total() - 1;  // one byte short
  b.nvme_dir = "/nvme/strata";
  const RunPlan p = placement_plan(spec, in, b);
  INFO(placement_plan_table(p));
  CHECK(p.fits());
  REQUIRE(p.optimizer_on_nvme);
  // one byte short: only the last groups (updated first) move, as few as cover the NVMe window
  CHECK(p.optimizer_nvme_first_group > 0);
  PlanChoice fewer;
  fewer.optimizer_nvme = true;
  fewer.optimizer_first_group = p.optimizer_nvme_first_group + 1;
  CHECK_FALSE(placement_plan_at(spec, plan_resolved_inputs(in, p), p.group, b, fewer).fits());
  // the NVMe placement's own sizes for that split (files: fp32 master + m + v of those groups,
  // block-rounded; RAM: its window)
  HostStoreOptions so;
  so.state_on_nvme = true;
  so.nvme_first_group = p.optimizer_nvme_first_group;
  const NvmeStateSizes ns = nvme_state_sizes(layout, so, /*master_on_nvme=*/true);
  const size_t moved = layout.f32.tier_bytes(Tier::host) - f32_prefix_bytes(layout, p.optimizer_nvme_first_group);
  CHECK(ns.file_bytes >= moved * 3);
  CHECK(p.tier(Tier::nvme) == ns.file_bytes);
  CHECK(p.bytes_of("NVMe optimizer pipeline (window of master, m, v ranges; file staging)") == ns.host_bytes);
  CHECK(p.host_total() == ram.host_total() - moved * 3 + ns.host_bytes);
  // the working weights and gradients stay in pinned RAM
  CHECK(p.tier(Tier::host_pinned) == ram.tier(Tier::host_pinned));
  // offload.optimizer = "nvme" moves it all
  so.nvme_first_group = 0;
  const NvmeStateSizes all = nvme_state_sizes(layout, so, /*master_on_nvme=*/true);
  CHECK(all.file_bytes >= params * 12);
  // "host" keeps them in RAM whatever the budget: then it does not fit
  in.optimizer = StateTier::host;
  CHECK_FALSE(placement_plan(spec, in, b).fits());
  // an NVMe budget too small for them is a problem naming offload.nvme_memory
  in.optimizer = StateTier::nvme;
  b.nvme_bytes = all.file_bytes - 1;
  const RunPlan small = placement_plan(spec, in, b);
  REQUIRE(small.problems.size() == 1);
  CHECK(small.problems[0].find("offload.nvme_memory") != std::string::npos);
  in.optimizer = StateTier::automatic;
  // still short after the move: spilled checkpoints follow (a device budget with no room for them)
  b.nvme_bytes = 0;
  in.micro_batch = 64;
  in.sequence_len = 256;  // 4 layers x 64 MiB of checkpoints
  const size_t act = size_t(64) * 256 * 1024 * 4, pipeline = all.host_bytes;
  PlanInputs host_ckpt = in;
  host_ckpt.checkpoints = CheckpointMode::host;
  b.device_bytes = placement_plan(spec, host_ckpt, PlanBudgets{}).tier(Tier::device) + (1 << 20);
  PlanBudgets no_limit = b;
  no_limit.host_bytes = 0;
  const RunPlan big = placement_plan(spec, in, no_limit);
  CHECK(big.host_checkpoints == 4);
  // after both moves: the state and the checkpoints off; the pipeline, the checkpoint ring and its staging on
  b.host_bytes = big.host_total() - params * 12 + pipeline - 4 * act + kSpillRing * act + CheckpointSpill::host_bytes();
  const RunPlan both = placement_plan(spec, in, b);
  INFO(placement_plan_table(both));
  CHECK(both.fits());
  CHECK(both.optimizer_on_nvme);
  CHECK(both.nvme_checkpoints == 4);
  CHECK(both.host_total() == b.host_bytes);
  CHECK(both.optimizer_nvme_first_group == 0);
  CHECK(both.tier(Tier::nvme) == all.file_bytes + 4 * act);
}

TEST_CASE("without an NVMe dir a plan that does not fit is exit 3 naming what to change and what it saves", "[plan]") {
  const ModelSpec spec = big_spec();
  PlanInputs in = plan_inputs("host");
  in.optimizer = StateTier::automatic;
  in.micro_batch = 8;
  PlanBudgets b;
  b.host_bytes = placement_plan(spec, in, b).host_total() - 1;
  b.host_origin = "offload.host_memory = \"test\"";
  const RunPlan p = placement_plan(spec, in, b);
  REQUIRE_FALSE(p.fits());
  CHECK_FALSE(p.optimizer_on_nvme);
  {  // exit 3 (a budget error) for a budget one byte short
    const std::string msg = testing::error_of([&] { placement_plan_check(p); }, ErrorKind::budget);
    INFO(msg);
    CHECK(msg.find("offload.host_memory = \"test\"") != std::string::npos);
    CHECK(msg.find(format_bytes(p.host_total())) != std::string::npos);
    for (const char* kind : {"working weights (bf16)", "fp32 master weights", "AdamW moments (f32 m and v)",
                             "fp32 gradient accumulation", "pinned staging", "layer checkpoints (pinned host)"})
      CHECK(msg.find(kind) != std::string::npos);
    CHECK(msg.find("set offload.optimizer = \"nvme\" with offload.nvme_path") != std::string::npos);
    CHECK(msg.find("lower train.micro_batch_size to 4") != std::string::npos);
    CHECK(msg.find("raise offload.host_memory") != std::string::npos);
  }
  // each change's saving is the difference of the two plans' host totals
  const size_t params = size_t(spec.parameter_count());
  REQUIRE(p.changes.size() >= 4);
  HostStoreOptions so;
  so.state_on_nvme = true;
  CHECK(p.changes[0].saves_bytes == params * 12 - nvme_state_sizes(HostStore::layout(spec), so, true).host_bytes);
  PlanInputs half = in;
  half.micro_batch = 4;
  bool found = false;
  for (const PlanChange& c : p.changes)
    if (c.what.rfind("lower train.micro_batch_size to 4", 0) == 0) {
      found = true;
      CHECK(c.tier == Tier::host);  // the tier over its budget, though the device's total drops too
      CHECK(c.saves_bytes == p.host_total() - placement_plan(spec, half, PlanBudgets{}).host_total());
    }
  CHECK(found);
  // NVMe asked for without a directory is bad input (exit 2)
  in.optimizer = StateTier::nvme;
  CHECK_THROWS_WITH(placement_plan(spec, in, PlanBudgets{}), Catch::Contains("offload.nvme_path"));
  // an unknown tier is refused where the recipe's strings are parsed, once
  CHECK_THROWS_WITH(state_tier_parse("disk"), Catch::Contains("\"auto\", \"host\" or \"nvme\""));
}

TEST_CASE("the largest micro-batch and sequence length that fit are found by the plan", "[plan]") {
  const ModelSpec spec = big_spec();
  PlanInputs in = plan_inputs("host");
  PlanBudgets b;
  in.micro_batch = 6;
  b.host_bytes = placement_plan(spec, in, b).host_total();
  CHECK(placement_max_micro_batch(spec, in, b) == 6);
  in.micro_batch = 2;
  CHECK(placement_max_sequence_len(spec, in, b) == 48);  // 2 x 48 tokens = 6 x 16
  b.host_bytes = 1;
  CHECK(placement_max_micro_batch(spec, in, b) == 0);
}

TEST_CASE("the host budget comes from offload.host_memory, else from MemAvailable", "[plan]") {
  const Recipe rc = recipe_parse("[model]\nconfig = \"c.json\"\n[data]\npath = \"d.txt\"\n[train]\nmax_steps = 1\n",
                                 "test.toml", {"offload.host_memory=24GiB"});
  PlanBudgets set;
  placement_host_budget(set, rc.host_memory_bytes, rc.host_memory);
  CHECK(set.host_bytes == (size_t(24) << 30));
  CHECK(set.host_origin == "offload.host_memory = \"24GiB\"");
  // parsed when the recipe loads: a bad size stops there, naming the key
  CHECK_THROWS_WITH(recipe_parse("[model]\nconfig = \"c.json\"\n[data]\npath = \"d.txt\"\n[train]\nmax_steps = 1\n",
                                 "test.toml", {"offload.host_memory=lots"}),
                    Catch::Contains("offload.host_memory") && Catch::Contains("is not a size"));
  // MemAvailable as /proc/meminfo states it (kB meaning KiB)
  std::ifstream f("/proc/meminfo");
  std::string line;
  size_t kib = 0;
  while (std::getline(f, line))
    if (line.rfind("MemAvailable:", 0) == 0) kib = std::stoull(line.substr(13));
  REQUIRE(kib > 0);
  PlanBudgets unset;
  placement_host_budget(unset, 0, "");
  CHECK(unset.host_origin.find("MemAvailable") != std::string::npos);
  // the machine's free memory moves between the two reads: within 1 GiB
  CHECK(std::llabs((long long)unset.host_bytes - (long long)(kib * 1024)) < (1ll << 30));
  // this process's resident set: there, and its high-water mark at least as large
  const size_t rss = process_rss_bytes(), peak = process_rss_peak_bytes();
  CHECK(rss > (1u << 20));
  CHECK(peak >= rss);
  std::vector<char> touch(size_t(64) << 20, 1);  // 64 MiB more, touched
  CHECK(process_rss_peak_bytes() >= rss + (size_t(60) << 20));
  CHECK(touch[12345] == 1);
}

TEST_CASE("a failed pinned allocation falls back to pageable memory with one warning, counted as host", "[pinned]") {
  const ModelSpec spec = budget_spec(true);
  const RunPlan e = placement_plan(spec, plan_inputs("host"), PlanBudgets{});
  const size_t working = e.bytes_of("working weights (bf16)"), grads = e.bytes_of("fp32 gradient accumulation"),
               state = e.bytes_of("fp32 master weights") + e.bytes_of("AdamW moments (f32 m and v)"),
               staging = e.bytes_of("pinned staging (activations, gradients)"),
               checkpoints = e.bytes_of("layer checkpoints (pinned host)");
  const MicroBatch mb = testing::strided_batch(2, 16, 256, 37);
  auto run = [&](bool fail, std::string* warning, size_t* pinned, size_t* host, size_t* fallback) {
    if (fail) setenv("STRATA_FAKE_PINNED_FAIL", "1", 1);
    StderrCapture capture;
    auto dev = device_create(DeviceOptions{});
    unsetenv("STRATA_FAKE_PINNED_FAIL");  // read once, when the device is made
    std::vector<float> grads;
    double loss;
    {
      HostStore store(*dev, spec);
      model_init_weights(store, 5);
      Engine engine(*dev, store, budget_engine("host"));
      loss = engine.forward_backward(mb, 1.f / float(mb.counted()));
      engine.synchronize();
      grads.assign(store.grad(), store.grad() + store.f32_floats());
      *pinned = store.pinned_bytes();
      *host = store.host_bytes();
      *fallback = dev->pageable_fallback_bytes();
    }
    CHECK(dev->pageable_fallback_bytes() == 0);  // all freed
    *warning = capture.finish();
    return std::make_pair(loss, grads);
  };
  std::string warn_pinned, warn_fallback;
  size_t pinned = 0, host = 0, fallback = 0;
  const auto normal = run(false, &warn_pinned, &pinned, &host, &fallback);
  CHECK(pinned == working + grads);
  CHECK(host == state);
  CHECK(fallback == 0);
  CHECK(warn_pinned.find("pageable") == std::string::npos);

  const auto fell_back = run(true, &warn_fallback, &pinned, &host, &fallback);
  INFO(warn_fallback);
  CHECK(pinned == 0);
  CHECK(host == working + grads + state);
  // the store's two arrays, the engine's staging and its spilled checkpoints
  CHECK(fallback == working + grads + staging + checkpoints);
  CHECK(count_of(warn_fallback, "warning: cannot pin") == 1);  // said once, not per allocation
  CHECK(warn_fallback.find("cannot pin " + format_bytes(working) + " of host memory") != std::string::npos);
  CHECK(warn_fallback.find("about half the bandwidth") != std::string::npos);
  CHECK(warn_fallback.find("block the host thread") != std::string::npos);
  // the memory is slower, not different: the same results to the bit
  CHECK(std::memcmp(&normal.first, &fell_back.first, sizeof(double)) == 0);
  CHECK(std::memcmp(normal.second.data(), fell_back.second.data(), normal.second.size() * 4) == 0);
}

}  // namespace strata

namespace strata {

TEST_CASE("bf16 moments: the plan counts 4 B/param as the store allocates, and a plan short of RAM suggests them",
          "[plan][bf16-moments]") {
  const ModelSpec spec = budget_spec(false);
  const size_t params = size_t(spec.parameter_count());
  PlanInputs in = plan_inputs("host");
  in.moments = DType::bf16;
  const RunPlan p = placement_plan(spec, in, PlanBudgets{});
  CHECK(p.bytes_of("AdamW moments (bf16 m and v)") == params * 4);
  auto dev = device_create(DeviceOptions{});
  HostStoreOptions so;
  so.moments = DType::bf16;
  HostStore hs(*dev, spec, so);
  CHECK(hs.host_bytes() == p.bytes_of("fp32 master weights") + p.bytes_of("AdamW moments (bf16 m and v)"));
  // f32 moments one byte over the host budget: the suggestion saves the moments' other half
  const ModelSpec big = big_spec();
  const size_t big_params = size_t(big.parameter_count());
  PlanInputs f = plan_inputs("host");
  PlanBudgets b;
  b.host_bytes = placement_plan(big, f, b).host_total() - 1;
  const RunPlan q = placement_plan(big, f, b);
  REQUIRE_FALSE(q.fits());
  bool found = false;
  for (const PlanChange& c : q.changes)
    if (c.what.rfind("set optim.moments_dtype = \"bf16\"", 0) == 0) {
      found = true;
      CHECK(c.saves_bytes == big_params * 4);
    }
  CHECK(found);
  // zo-sgd keeps no moments: nothing to suggest
  f.optimizer_kind = OptimizerKind::zo_sgd;
  b.host_bytes = placement_plan(big, f, PlanBudgets{}).host_total() - 1;
  for (const PlanChange& c : placement_plan(big, f, b).changes) CHECK(c.what.find("moments_dtype") == std::string::npos);
}

}  // namespace strata
