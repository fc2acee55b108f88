// offload.speculative_update in the plan and the step model (offload/plan/plan_search.cpp
// with_speculation, step_estimate.cpp's UpdateCost::ahead): which groups are speculated, the
// backup's host row to the byte, and the update it takes off the critical path — hand-worked on
// the step-model tests' 134M-parameter model, rates chosen so one effect decides each figure.
#include <catch2/catch.hpp>

#include "io/hf_config.h"
#include "offload/plan/plan_search.h"
#include "offload/plan/step_estimate.h"
#include "offload/state/host_store.h"
#include "tests/offload/step_model_fixtures.h"
#include "tests/testing.h"

namespace strata {
namespace {

ModelSpec spec_134m() { return step_model_fixtures::tiny_spec(); }

PlanInputs inputs(SpeculateMode mode) {
  PlanInputs in = step_model_fixtures::tiny_inputs();
  in.speculate = mode;
  return in;
}

using step_model_fixtures::compute_rates;
using step_model_fixtures::forward_seconds;

}  // namespace

TEST_CASE("plan: speculation takes the update off the critical path where the step model finds it faster", "[plan][speculation]") {
  const ModelSpec spec = spec_134m();
  const HostStoreLayout layout = HostStore::layout(spec);
  const size_t groups = layout.groups.size();
  const double params = double(spec.parameter_count()), emb = double(spec.params[size_t(spec.embed)].numel());
  StepRates rates = compute_rates();
  const double fwd = forward_seconds(spec, inputs(SpeculateMode::off));
  const double u = 3.8;  // the update lasts 3.8 forwards: more than the next forward hides
  rates.adamw_params_per_s = params / (u * fwd);

  const RunPlan serial = placement_plan(spec, inputs(SpeculateMode::off), PlanBudgets{}, rates);
  CHECK(serial.speculate_end_group == 0);
  CHECK(serial.bytes_of(kSpeculationBackupKind) == 0);
  const StepEstimate s = step_estimate(spec, inputs(SpeculateMode::off), serial, 1, rates);
  // serial: the update behind the next forward shows u - 1 forwards (the squares cost nothing at 1e18 B/s)
  CHECK(s.optimizer_exposed_s == Approx((u - 1) * fwd).epsilon(1e-6));

  const RunPlan ahead = placement_plan(spec, inputs(SpeculateMode::automatic), PlanBudgets{}, rates);
  REQUIRE(ahead.speculate_first_group == 1);  // every group after the embedding, the head down
  REQUIRE(ahead.speculate_end_group == groups);
  size_t backup = 0;
  for (size_t g = 1; g < groups; ++g) backup += layout.groups[g].f32_bytes * 3;  // f32 master, m, v
  CHECK(ahead.bytes_of(kSpeculationBackupKind) == backup);
  CHECK(ahead.tier(Tier::host) == serial.tier(Tier::host) + backup);
  const StepEstimate a = step_estimate(spec, inputs(SpeculateMode::automatic), ahead, 1, rates);
  // the speculated groups' update (u fwd x their share) inside the backward (3 forwards long,
  // recompute included): u (1 - e) fwd <= 3 fwd with e = the embedding's share (about 0.25); then
  // the embedding's update (u e fwd, under one forward) hidden behind the next forward
  const double share = emb / params;
  REQUIRE(u * (1 - share) <= 3.0);
  REQUIRE(u * share < 1.0);
  CHECK(a.optimizer_exposed_s == Approx(0.0).margin(1e-6 * fwd));
  CHECK(a.seconds < s.seconds);
  const EngineOptions eo = run_plan_engine_options(ahead);
  CHECK(eo.speculate_first_group == 1);
  CHECK(eo.speculate_end_group == groups);

  // "on" takes the same plan; "auto" on the CPU backend (one set of cores) none; a host budget with
  // room for the backup of the last two groups alone speculates those two
  CHECK(placement_plan(spec, inputs(SpeculateMode::on), PlanBudgets{}, rates).speculate_first_group == 1);
  PlanInputs cpu = inputs(SpeculateMode::automatic);
  cpu.device_in_host_ram = true;
  CHECK(placement_plan(spec, cpu, PlanBudgets{}, rates).speculate_end_group == 0);
  PlanBudgets tight;
  tight.host_bytes = serial.host_total() + 3 * (layout.groups[groups - 1].f32_bytes + layout.groups[groups - 2].f32_bytes) + 1;
  const RunPlan two = placement_plan(spec, inputs(SpeculateMode::automatic), tight, rates);
  CHECK(two.fits());
  CHECK(two.speculate_first_group == groups - 2);
  CHECK(two.speculate_end_group == groups);
}

TEST_CASE("plan: no speculation without clipping, under LoRA, over ranks or on NVMe-held groups", "[plan][speculation]") {
  const ModelSpec spec = spec_134m();
  StepRates rates = compute_rates();
  rates.adamw_params_per_s = double(spec.parameter_count()) / 1.0;
  PlanInputs no_clip = inputs(SpeculateMode::on);
  no_clip.clip_grad = false;
  CHECK(placement_plan(spec, no_clip, PlanBudgets{}, rates).speculate_end_group == 0);
  PlanInputs ranks = inputs(SpeculateMode::on);
  ranks.ranks = 2;
  CHECK(placement_plan(spec, ranks, PlanBudgets{}, rates).speculate_end_group == 0);
  PlanInputs lora = inputs(SpeculateMode::on);
  lora.lora.r = 4;
  CHECK(placement_plan(spec, lora, PlanBudgets{}, rates).speculate_end_group == 0);
  testing::TempDir dir("plan_speculation");
  PlanBudgets nvme;
  nvme.nvme_dir = dir.path.string();
  PlanInputs on_nvme = inputs(SpeculateMode::on);
  on_nvme.optimizer = StateTier::nvme;
  CHECK(placement_plan(spec, on_nvme, nvme, rates).speculate_end_group == 0);  // every group's state on NVMe
}

}  // namespace strata
