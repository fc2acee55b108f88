// The planner's search (offload/plan/plan_search.h): the plan `auto` gets is the fastest of the
// plans every explicit override can force, under the same step model; the optimizer state's
// split puts only the overflow on NVMe; train.global_batch_size's split is searched and a fixed
// part stays fixed; "what to change" entries each say what they do when applied alone.
#include <catch2/catch.hpp>

#include <algorithm>

#include "offload/engine/engine_zo.h"
#include "offload/plan/plan_search.h"
#include "offload/plan/step_estimate.h"
#include "offload/state/host_store.h"
#include "src/core/error.h"
#include "src/device/arena.h"
#include "tests/testing.h"

namespace strata {
namespace {

// ~100M parameters (4 layers of C 1024, F 4096, V 32000): nothing is allocated.
ModelSpec search_spec() {
  return model_spec_build(testing::tiny_llama_config({1024, 4096, 4, 32000, 256, false, 8, 4}), DType::bf16);
}

PlanInputs auto_inputs() {
  PlanInputs in;
  in.weights = WeightsMode::automatic;
  in.checkpoints = CheckpointMode::automatic;
  in.recompute = RecomputeMode::automatic;
  in.optimizer = StateTier::automatic;
  in.accumulation = AccumulationMode::automatic;
  in.micro_batch = 4;
  in.sequence_len = 256;
  in.accumulation_steps = 4;
  in.device_is_cuda = true;
  return in;
}

// A GPU-like machine whose link and NVMe make the choices matter.
StepRates gpu_rates() {
  StepRates r;
  r.device_flops_per_s = 50e12;
  r.link_bytes_per_s = 4e9;
  r.nvme_read_bytes_per_s = 1e9;
  r.nvme_write_bytes_per_s = 1e9;
  return r;
}

double step_of(const ModelSpec& spec, const PlanInputs& in, const RunPlan& p, const StepRates& r) {
  return step_estimate(spec, plan_resolved_inputs(in, p), p, p.accumulation_steps, r, in.zo_perturbations).seconds;
}

// Every combination of explicit overrides of the automatic keys.
template <class F>
void for_each_forced(const PlanInputs& in, F&& f) {
  // every layer resident, every layer streamed, the first 2 of 4 resident (offload.resident_layers)
  const std::pair<WeightsMode, int64_t> weights[] = {{WeightsMode::device, -1}, {WeightsMode::stream, -1},
                                                     {WeightsMode::stream, 2}};
  for (const auto& [w, resident] : weights)
    for (AccumulationMode a : {AccumulationMode::micro_batch, AccumulationMode::layer_major})
      for (CheckpointMode c : {CheckpointMode::automatic, CheckpointMode::host, CheckpointMode::nvme})
        for (StateTier o : {StateTier::host, StateTier::nvme})
          for (NormPassMode n : {NormPassMode::off, NormPassMode::on}) {
            PlanInputs v = in;
            v.weights = w, v.resident_layers = resident, v.accumulation = a, v.checkpoints = c, v.optimizer = o;
            v.norm_pass = n;
            f(v);
          }
}

}  // namespace

TEST_CASE("auto's plan is the fastest that fits of every combination of explicit overrides", "[plan][search]") {
  const ModelSpec spec = search_spec();
  const StepRates rates = gpu_rates();
  const PlanInputs in = auto_inputs();
  const RunPlan unlimited = placement_plan(spec, in, PlanBudgets{}, rates);
  for (double host_share : {1.0, 0.8, 0.6}) {
    for (size_t device_mib : {size_t(0), size_t(600), size_t(1200)}) {
      PlanBudgets b;
      b.nvme_dir = "/nvme/strata";
      b.device_bytes = device_mib << 20;
      b.host_bytes = size_t(double(unlimited.host_total()) * host_share);
      INFO("host " << b.host_bytes << ", device " << b.device_bytes);
      const RunPlan p = placement_plan(spec, in, b, rates);
      const double chosen = step_of(spec, in, p, rates);
      CHECK(p.step_seconds == Approx(chosen).epsilon(1e-9));
      size_t fitting = 0;
      for_each_forced(in, [&](const PlanInputs& v) {
        RunPlan q;
        try {
          q = placement_plan(spec, v, b, rates);
        } catch (const Error&) {
          return;  // layer-major where it does not apply
        }
        if (!q.fits()) return;
        ++fitting;
        INFO(placement_plan_table(q));
        CHECK(chosen <= step_of(spec, v, q, rates) * (1 + 1e-9));
      });
      CHECK(p.fits() == (fitting > 0));
    }
  }
}

TEST_CASE("the optimizer state's overflow alone goes to NVMe: the fewest groups that make the host fit",
          "[plan][search][nvme]") {
  const ModelSpec spec = search_spec();
  const HostStoreLayout layout = HostStore::layout(spec);
  const size_t G = layout.groups.size();
  PlanInputs in = auto_inputs();
  in.weights = WeightsMode::stream;
  in.accumulation = AccumulationMode::micro_batch;
  in.checkpoints = CheckpointMode::host;
  const RunPlan ram = placement_plan(spec, in, PlanBudgets{});
  PlanBudgets b;
  b.nvme_dir = "/nvme/strata";
  // short by half of one layer's state (12 bytes a parameter): the last layer and the head move
  const size_t layer_state = layout.groups[1].f32_bytes * 3;
  b.host_bytes = ram.host_total() - layer_state / 2;
  const RunPlan p = placement_plan(spec, in, b);
  INFO(placement_plan_table(p));
  REQUIRE(p.fits());
  REQUIRE(p.optimizer_on_nvme);
  CHECK(p.optimizer_nvme_first_group > 0);
  CHECK(p.optimizer_nvme_first_group < G);
  // the RAM rows hold the groups before the split, the NVMe rows the rest
  const size_t prefix = f32_prefix_bytes(layout, p.optimizer_nvme_first_group);
  CHECK(p.bytes_of("fp32 master weights") == prefix);
  CHECK(p.bytes_of("AdamW moments (f32 m and v)") == 2 * prefix);
  const size_t f32 = layout.f32.tier_bytes(Tier::host);
  const std::string tail = str_cat(" (groups ", layout.groups[p.optimizer_nvme_first_group].name, " to head)");
  CHECK(p.bytes_of("fp32 master weights" + tail) == f32 - prefix);
  CHECK(p.bytes_of("AdamW moments (f32 m and v)" + tail) == 2 * (f32 - prefix));
  // fewest: one more group in RAM does not fit
  PlanChoice more;
  more.optimizer_nvme = true;
  more.optimizer_first_group = p.optimizer_nvme_first_group + 1;
  PlanInputs resolved = plan_resolved_inputs(in, p);
  if (more.optimizer_first_group < G) CHECK_FALSE(placement_plan_at(spec, resolved, 1, b, more).fits());
  // "host" keeps it all in RAM, "nvme" moves it all
  in.optimizer = StateTier::host;
  CHECK_FALSE(placement_plan(spec, in, b).fits());
  in.optimizer = StateTier::nvme;
  const RunPlan all = placement_plan(spec, in, b);
  CHECK(all.optimizer_on_nvme);
  CHECK(all.optimizer_nvme_first_group == 0);
  CHECK(all.bytes_of("fp32 master weights") == f32);
  CHECK(all.tier(Tier::nvme) > p.tier(Tier::nvme));
  // the store options carry the split
  CHECK(run_plan_store_options(p).nvme_first_group == p.optimizer_nvme_first_group);
}

TEST_CASE("train.global_batch_size: the split is searched, a part the recipe gives stays, and it is exact",
          "[plan][search]") {
  const ModelSpec spec = search_spec();
  const StepRates rates = gpu_rates();
  PlanInputs in = auto_inputs();
  in.global_batch = 16;
  in.micro_batch_fixed = in.accumulation_fixed = false;
  PlanBudgets b;
  b.device_bytes = size_t(1200) << 20;
  const RunPlan p = placement_plan(spec, in, b, rates);
  REQUIRE(p.fits());
  CHECK(p.micro_batch * p.accumulation_steps == 16);
  // no split of 16 is faster
  for (int64_t m : {1, 2, 4, 8, 16}) {
    PlanInputs v = in;
    v.global_batch = 0;
    v.micro_batch = m, v.accumulation_steps = 16 / m;
    const RunPlan q = placement_plan(spec, v, b, rates);
    if (q.fits()) CHECK(p.step_seconds <= q.step_seconds * (1 + 1e-9));
  }
  // a micro-batch the recipe gives stays; the accumulation follows
  in.micro_batch = 2;
  in.micro_batch_fixed = true;
  const RunPlan fixed = placement_plan(spec, in, b, rates);
  CHECK(fixed.micro_batch == 2);
  CHECK(fixed.accumulation_steps == 8);
  // two ranks share it; a preference micro-batch counts pairs (2 rows each)
  in.micro_batch_fixed = false;
  in.ranks = 2;
  const RunPlan two = placement_plan(spec, in, b, rates);
  CHECK(two.micro_batch * two.accumulation_steps == 8);
  in.ranks = 1;
  in.pair_rows = 2;
  in.micro_batch = 2;
  const RunPlan pairs = placement_plan(spec, in, b, rates);
  CHECK(pairs.micro_batch % 2 == 0);
  CHECK(pairs.micro_batch / 2 * pairs.accumulation_steps == 16);
  // a global batch the fixed parts cannot make is bad input naming both
  in.pair_rows = 1;
  in.micro_batch = 3;
  in.micro_batch_fixed = true;
  const std::string msg = testing::error_of([&] { placement_plan(spec, in, b, rates); }, ErrorKind::input);
  CHECK(msg.find("train.global_batch_size = 16") != std::string::npos);
  CHECK(msg.find("train.micro_batch_size = 3") != std::string::npos);
  // one that the ranks cannot share evenly likewise
  in.micro_batch_fixed = false;
  in.ranks = 3;
  const std::string ranks = testing::error_of([&] { placement_plan(spec, in, b, rates); }, ErrorKind::input);
  CHECK(ranks.find("must divide evenly among the 3 ranks") != std::string::npos);
}

TEST_CASE("what to change: each entry applied alone saves what it says, and only entries that close a gap",
          "[plan][search]") {
  const ModelSpec spec = search_spec();
  const StepRates rates = gpu_rates();
  PlanInputs in = auto_inputs();
  in.optimizer = StateTier::host;  // the state must stay in RAM: the plan cannot fit by itself
  in.working = WorkingMode::stored;  // and so must the working copy (derived would close the gap)
  in.norm_pass = NormPassMode::off;  // and every gradient (a norm pass would close it too)
  const RunPlan ram = placement_plan(spec, in, PlanBudgets{}, rates);
  PlanBudgets b;
  b.host_bytes = ram.host_total() - (size_t(64) << 20);
  const RunPlan p = placement_plan(spec, in, b, rates);
  REQUIRE_FALSE(p.fits());
  bool bf16 = false, budget = false;
  for (const PlanChange& c : p.changes) {
    INFO(placement_change_text(c));
    CHECK(!c.set.empty());
    if (c.set.contains("optim.moments_dtype")) {
      bf16 = true;
      PlanInputs v = in;
      v.moments = DType::bf16;
      const RunPlan q = placement_plan(spec, v, b, rates);
      CHECK(c.tier == Tier::host);
      CHECK(c.saves_bytes == p.host_total() - q.host_total());
      CHECK(c.fits == q.fits());
      CHECK(c.step_seconds == Approx(q.step_seconds));
    }
    if (c.set.contains("offload.host_memory")) {
      budget = true;
      CHECK(c.saves_bytes == 0);
      CHECK(c.fits);
    }
    // every listed memory change closes the gap of the tier it lowers
    if (c.saves_bytes) CHECK(p.host_total() - c.saves_bytes <= b.host_bytes);
  }
  CHECK(bf16);
  CHECK(budget);
  // a plan that fits lists faster opt-ins only, each with a faster step
  const RunPlan fits = placement_plan(spec, in, PlanBudgets{}, rates);
  for (const PlanChange& c : fits.changes) {
    CHECK(c.fits);
    CHECK(c.step_seconds < fits.step_seconds);
  }
}

}  // namespace strata

namespace strata {

TEST_CASE("zo-sgd: auto runs a step's q x k dual forwards layer-major where their hidden states fit, else one at a time", "[plan][search][zo]") {
  const ModelSpec spec = search_spec();
  const StepRates rates = gpu_rates();
  PlanInputs in = auto_inputs();
  in.optimizer_kind = OptimizerKind::zo_sgd;
  in.optimizer = StateTier::host;
  in.checkpoints = CheckpointMode::host;
  in.device_is_cuda = false;
  in.micro_batch = 1;
  in.accumulation_steps = 2;
  in.zo_perturbations = 2;
  for (int ranks : {1, 2}) {  // data parallel too: the ranks exchange loss scalars only
    INFO("ranks " << ranks);
    in.ranks = ranks;
    const RunPlan major = placement_plan(spec, in, PlanBudgets{}, rates);
    PlanInputs one_in = in;
    one_in.accumulation = AccumulationMode::micro_batch;
    const RunPlan one = placement_plan(spec, one_in, PlanBudgets{}, rates);
    CHECK(major.group == 4);
    CHECK(one.group == 1);
    // the device rows: the engine's table with 2 x 4 branches' hidden states
    EngineOptions eo = run_plan_engine_options(major);
    CHECK(major.tier(Tier::device) == ZoEngine::device_bytes(spec, eo));
    CHECK(major.tier(Tier::device) > one.tier(Tier::device));
    // the bytes: W once per step against once per dual forward (4 layers and 8 lm_head chunks
    // through 2 slots: none stays); the final norm once per step either way
    const HostStoreLayout layout = HostStore::layout(spec);
    double W = double(layout.working[size_t(spec.final_norm)].bytes() + layout.working[size_t(spec.lm_head_row())].bytes());
    for (size_t i = 0; i < spec.layers.size(); ++i) W += double(layout.groups[1 + i].working_bytes);
    const double norm = double(layout.working[size_t(spec.final_norm)].bytes());
    // each pass's embedding output; the tokens of each micro-batch once per run
    const double N = 256, x0 = 2 * N * 1024 * 4, tokens = 4 * 4 * N;
    const StepBytes b_major = step_bytes(spec, plan_resolved_inputs(in, major), major, 2);
    const StepBytes b_one = step_bytes(spec, plan_resolved_inputs(one_in, one), one, 2);
    CHECK(b_major.h2d == W + 2 * tokens + 4 * x0);
    CHECK(b_one.h2d == 4 * (W - norm) + norm + 4 * tokens + 4 * x0);
    CHECK(b_major.d2h == b_one.d2h);  // the losses
    CHECK(major.step_seconds < one.step_seconds);  // a slow link: fewer bytes, a faster step
    // a device budget that holds one dual forward's rows but not the step's: one at a time, and
    // an explicit layer_major does not fit and names the way back
    PlanBudgets tight;
    tight.device_bytes = one.tier(Tier::device);
    const RunPlan fallback = placement_plan(spec, in, tight, rates);
    CHECK(fallback.fits());
    CHECK(fallback.group == 1);
    PlanInputs forced = in;
    forced.accumulation = AccumulationMode::layer_major;
    const RunPlan refused = placement_plan(spec, forced, tight, rates);
    CHECK_FALSE(refused.fits());
    CHECK(std::any_of(refused.changes.begin(), refused.changes.end(), [](const PlanChange& c) {
      return c.set.contains("offload.accumulation") && c.set["offload.accumulation"] == "micro_batch" && c.fits;
    }));
    CHECK(placement_fits(spec, one_in, tight));
    CHECK_FALSE(placement_fits(spec, forced, tight));
  }
  // one micro-batch, one perturbation: nothing to run together
  in.ranks = 1;
  in.accumulation_steps = 1;
  in.zo_perturbations = 1;
  CHECK(placement_plan(spec, in, PlanBudgets{}, rates).group == 1);
  in.zo_perturbations = 3;  // three perturbations of one micro-batch: layer-major too
  CHECK(placement_plan(spec, in, PlanBudgets{}, rates).group == 3);
}

}  // namespace strata

namespace strata {

// offload.resident_layers: a device with room for some layers beside the engine's other rows, a
// slow link: the search keeps as many resident as fit (each saves a crossing a pass), and the
// step model prices the mix between all streamed and all resident.
TEST_CASE("plan: the first layers resident where the device holds some but not all", "[plan][search][resident]") {
  const ModelSpec spec = search_spec();
  StepRates rates = gpu_rates();
  rates.link_bytes_per_s = 1e9;
  PlanInputs in = auto_inputs();
  in.recompute = RecomputeMode::always;  // the device's room goes to weights or checkpoints alone
  in.accumulation = AccumulationMode::micro_batch;
  in.checkpoints = CheckpointMode::host;
  PlanInputs streamed = in;
  streamed.weights = WeightsMode::stream;
  const RunPlan s = placement_plan(spec, streamed, PlanBudgets{}, rates);
  const size_t layer = HostStore::layout(spec).groups[1].working_bytes;
  PlanBudgets b;
  // room for one layer and a half: one resident (with 2 of 4 left to stream, a third resident
  // would cost nothing more: the shared slots shrink as it grows)
  b.device_bytes = s.tier(Tier::device) + layer + layer / 2 + (size_t(2) << 20);
  CHECK(placement_max_resident_layers(spec, in, 1, b) == 1);
  PlanBudgets roomier = b;
  roomier.device_bytes = s.tier(Tier::device) + 2 * layer + layer / 2 + (size_t(2) << 20);
  CHECK(placement_max_resident_layers(spec, in, 1, roomier) == 4);
  const RunPlan p = placement_plan(spec, in, b, rates);
  INFO(placement_plan_table(p));
  REQUIRE(p.fits());
  CHECK(p.weights == WeightsMode::stream);
  CHECK(p.resident_layers == 1);
  CHECK(p.tier(Tier::device) == s.tier(Tier::device) + Arena::footprint(layer));
  PlanInputs all = in;
  all.weights = WeightsMode::device;
  CHECK_FALSE(placement_plan(spec, all, b, rates).fits());
  // the step is d2h-bound (each micro-batch's fp32 gradients): no slower, and fewer bytes moved
  const RunPlan forced_stream = placement_plan(spec, streamed, b, rates);
  CHECK(p.step_seconds <= forced_stream.step_seconds);
  // the resident layer crosses once a step; the streamed ones as the two slots let them
  const StepBytes mixed = step_bytes(spec, plan_resolved_inputs(in, p), p, 4);
  const StepBytes none = step_bytes(spec, plan_resolved_inputs(streamed, forced_stream), forced_stream, 4);
  CHECK(mixed.h2d < none.h2d);
  CHECK(mixed.d2h == none.d2h);
  const RunPlan wide = placement_plan(spec, in, roomier, rates);
  CHECK(wide.resident_layers == 4);  // every layer its own slot, lm_head streamed
  CHECK(step_bytes(spec, plan_resolved_inputs(in, wide), wide, 4).h2d < mixed.h2d);
  // more than the model has: refused by name
  PlanInputs too_many = in;
  too_many.resident_layers = 5;
  CHECK_THROWS_WITH(placement_plan(spec, too_many, b, rates), Catch::Contains("offload.resident_layers (5) is more than"));
}

// offload.norm_pass: with clipping the serial step holds every fp32 gradient; a host budget a
// little short of that fits only with the norm from a first pass (the gradients in flight).
TEST_CASE("plan: a norm pass where holding every gradient does not fit, priced as a second pass", "[plan][search][norm-pass]") {
  const ModelSpec spec = search_spec();
  const StepRates rates = gpu_rates();
  PlanInputs in = auto_inputs();
  in.accumulation = AccumulationMode::layer_major;
  in.working = WorkingMode::stored;      // the gradients alone decide what fits
  in.speculate = SpeculateMode::off;
  in.norm_pass = NormPassMode::off;
  const RunPlan serial = placement_plan(spec, in, PlanBudgets{}, rates);
  REQUIRE_FALSE(serial.norm_pass);
  const HostStoreLayout layout = HostStore::layout(spec);
  const size_t saved = grad_buffer_bytes(layout, false) - grad_buffer_bytes(layout, true);
  PlanBudgets b;
  b.host_bytes = serial.host_total() - saved / 2;
  CHECK_FALSE(placement_plan(spec, in, b, rates).fits());
  in.norm_pass = NormPassMode::automatic;
  const RunPlan p = placement_plan(spec, in, b, rates);
  INFO(placement_plan_table(p));
  REQUIRE(p.fits());
  CHECK(p.norm_pass);
  CHECK(p.grads_in_flight);
  CHECK(p.host_total() == serial.host_total() - saved);
  // unlimited, auto keeps the serial step: the norm pass costs a second pass
  CHECK_FALSE(placement_plan(spec, in, PlanBudgets{}, rates).norm_pass);
  // priced: the second pass's work, and the pass's transfers again (d2h exactly twice)
  const StepEstimate two = step_estimate(spec, plan_resolved_inputs(in, p), p, 4, rates);
  RunPlan once = p;
  once.norm_pass = false;
  PlanInputs no_clip = plan_resolved_inputs(in, p);
  no_clip.clip_grad = false;
  const StepEstimate one = step_estimate(spec, no_clip, once, 4, rates);
  CHECK(two.bytes.d2h == Approx(2 * one.bytes.d2h).epsilon(1e-12));
  CHECK(two.bytes.h2d > one.bytes.h2d);  // the second pass's tokens (resident weights cross once a step)
  CHECK(two.compute_parts.at("matmul") == Approx(2 * one.compute_parts.at("matmul")).epsilon(1e-12));
  CHECK(two.seconds > one.seconds * 1.5);
  CHECK(p.step_seconds == Approx(two.seconds).epsilon(1e-12));
  // "off" with that budget: what to change offers the norm pass, and it fits
  in.norm_pass = NormPassMode::off;
  const RunPlan off = placement_plan(spec, in, b, rates);
  REQUIRE_FALSE(off.fits());
  const auto it = std::find_if(off.changes.begin(), off.changes.end(),
                               [](const PlanChange& c) { return c.set.contains("offload.norm_pass"); });
  REQUIRE(it != off.changes.end());
  CHECK(it->fits);
  CHECK(it->saves_bytes == saved);
  // "on" where it does not apply: refused, naming why
  PlanInputs mb = in;
  mb.norm_pass = NormPassMode::on;
  mb.accumulation = AccumulationMode::micro_batch;
  CHECK_THROWS_WITH(placement_plan(spec, mb, b, rates), Catch::Contains("it needs one pass a step"));
}

}  // namespace strata

namespace strata {

// `strata estimate --measure` on the CPU backend (src/cli/cmd_estimate.cpp): the plan is searched at
// the run's rates (plan_run_rates, as the trainer plans) and reported at the probed ones. With
// priced_at the choices are exactly those of the search at the run's rates, the step and every
// change's step are the step model's at the probed rates, and only the opt-ins faster there are listed.
TEST_CASE("plan: priced_at keeps the plan the run's rates choose and prices it at other rates", "[plan][search]") {
  const ModelSpec spec = search_spec();
  PlanInputs in = auto_inputs();
  in.device_is_cuda = false;
  in.device_in_host_ram = true;
  PlanBudgets b;
  b.device_bytes = size_t(2) << 30;
  const StepRates run = plan_run_rates(in, 1e12, LayerRates{}, 1e9);
  CHECK(run.device_flops_per_s == 1e12);
  CHECK(run.link_bytes_per_s == 1e9);
  StepRates probed = run;
  probed.device_flops_per_s = 5e10;
  probed.attention_flops_per_s = 2e10;
  probed.elementwise_bytes_per_s = 5e9;
  const RunPlan at_run = placement_plan(spec, in, b, run);
  const RunPlan shown = placement_plan(spec, in, b, run, &probed);
  CHECK(shown.weights == at_run.weights);
  CHECK(shown.resident_layers == at_run.resident_layers);
  CHECK(shown.group == at_run.group);
  CHECK(shown.norm_pass == at_run.norm_pass);
  CHECK(shown.tier(Tier::device) == at_run.tier(Tier::device));
  CHECK(shown.host_total() == at_run.host_total());
  CHECK(shown.step_seconds == Approx(step_of(spec, in, at_run, probed)).epsilon(1e-12));
  CHECK(shown.step_seconds > at_run.step_seconds);
  // the opt-ins listed are those faster at the probed rates
  for (const PlanChange& c : shown.changes) CHECK(c.step_seconds < 0.99 * shown.step_seconds);
}

// The trainer's rates on the CPU backend: with a layer probed, every kind of work at its own rate
// and MFU against the square-GEMM peak; without one (a layer past kLayerProbeMaxBytes), every op at
// the peak and the memory-bound ones unpriced.
TEST_CASE("plan: the CPU backend's run rates are the probed layer's, the peak where none was probed",
          "[plan][search]") {
  PlanInputs in = auto_inputs();
  in.device_is_cuda = false;
  in.device_in_host_ram = true;
  const LayerRates probe{3e11, 8e10, 6e9, 2e11};
  const StepRates r = plan_run_rates(in, 5e11, probe, 0);
  CHECK(r.device_flops_per_s == 3e11);
  CHECK(r.attention_flops_per_s == 8e10);
  CHECK(r.elementwise_bytes_per_s == 6e9);
  CHECK(r.head_flops_per_s == 2e11);
  CHECK(r.mfu_peak_flops_per_s == 5e11);
  CHECK(r.link_bytes_per_s == r.host_bytes_per_s);  // no throttle: memcpy
  const StepRates peak = plan_run_rates(in, 5e11, LayerRates{}, 2e9);
  CHECK(peak.device_flops_per_s == 5e11);
  CHECK(peak.elementwise_bytes_per_s == 0);
  CHECK(peak.link_bytes_per_s == 2e9);
  // a GPU plans at the defaults whatever the CPU measured
  in.device_in_host_ram = false;
  in.device_is_cuda = true;
  CHECK(plan_run_rates(in, 5e11, probe, 0).device_flops_per_s == plan_default_rates(in).device_flops_per_s);
}

// Why the probe: a layer-major pass saves link bytes (one gradient d2h per pass) but adds every
// micro-batch's gradient after the first on the device (Engine::grad_share_add). Priced at the
// square-GEMM peak with the memory-bound ops unpriced, a throttled link makes layer-major win; with
// the device's memory-bound rate as slow as a CPU's, the adds cost more than the link saves and the
// search takes one micro-batch at a time.
TEST_CASE("plan: on the CPU backend the search weighs layer-major's gradient adds at the probed rate",
          "[plan][search]") {
  const ModelSpec spec = search_spec();
  PlanInputs in = auto_inputs();
  in.device_is_cuda = false;
  in.device_in_host_ram = true;
  in.weights = WeightsMode::device;
  in.optimizer = StateTier::host;
  PlanBudgets b;
  b.device_bytes = size_t(8) << 30;
  const double link = 2.5e8;  // a micro-batch's gradient d2h (f32, 93M parameters) takes 1.5 s
  const RunPlan at_peak = placement_plan(spec, in, b, plan_run_rates(in, 1e12, LayerRates{}, link));
  CHECK(at_peak.group == 4);  // layer-major
  const LayerRates slow_memory{1e12, 1e12, 2e9, 1e12};
  const StepRates probed = plan_run_rates(in, 1e12, slow_memory, link);
  const RunPlan at_probe = placement_plan(spec, in, b, probed);
  CHECK(at_probe.group == 1);  // one micro-batch at a time
  // and it is the faster of the two at those rates, by the adds' bytes at least
  PlanInputs major = in;
  major.accumulation = AccumulationMode::layer_major;
  const RunPlan forced = placement_plan(spec, major, b, probed);
  REQUIRE(forced.group == 4);
  CHECK(at_probe.step_seconds < forced.step_seconds);
}

}  // namespace strata
