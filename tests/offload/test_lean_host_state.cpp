// The leaner exact host state (offload/state/store_layout.h), each checked against the full one
// to the bit (losses, norms, master, m, v) and its memory against what the plan counts:
//  - derived working weights (offload.working_weights = "derived"; HostStoreOptions::
//    derived_working): the decoder layers whose master is in RAM keep no bf16 working copy; each
//    upload converts the master into a pinned staging buffer first; the layers' working bytes a
//    stored run holds must equal what derive_working makes;
//  - gradients in flight (HostStoreOptions::grads_in_flight, chosen by the plan without clipping
//    at one pass a step): the embedding's gradient and one slot the other groups take in turn.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <string>

#include "offload/plan/placement_plan.h"
#include "offload/plan/plan_search.h"
#include "tests/offload/engine_step_rig.h"

namespace strata {
namespace {

using engine_step_rig::kLayers;
using engine_step_rig::same_bits;

struct DerivedRun {
  bool derived = false;
  double clip = 1.0;
  bool layer_major = false;
  size_t nvme_first = 0;  // > 0: groups from it on keep their state on NVMe (and their working copy)
  const char* weights = "stream";
  size_t speculate_first = 0, speculate_end = 0;
  bool grads_in_flight = false;
  bool norm_pass = false;       // clipping's norm from a first pass (offload.norm_pass)
  size_t resident_layers = 0;   // with weights "stream": the first layers resident
};

struct Result : engine_step_rig::Result {
  std::vector<std::vector<char>> layer_working;  // each layer's working bytes (stored, or derived now)
  size_t derived_layers = 0, pinned = 0, estimate_working = 0, estimate_grads = 0, grad_floats = 0;
};

ModelConfig config() { return testing::tiny_llama_config({32, 48, kLayers, 300, 64, false}); }

Result run(const DerivedRun& c, const std::string& tag) {
  engine_step_rig::Options o;
  o.store.derived_working = c.derived;
  o.store.grads_in_flight = c.grads_in_flight;
  o.store.state_on_nvme = c.nvme_first > 0;
  o.store.nvme_first_group = c.nvme_first;
  o.weights = c.weights;
  o.layer_major = c.layer_major;
  o.speculate_first = c.speculate_first;
  o.speculate_end = c.speculate_end;
  o.clip = c.clip;
  o.gradients_first = c.clip > 0 && !c.norm_pass;  // as the trainer: without clipping (or after a norm
                                                    // pass) each group updates as it lands
  o.norm_pass = c.norm_pass;
  o.resident_layers = c.resident_layers;
  Result r;
  static_cast<engine_step_rig::Result&>(r) = engine_step_rig::run(o, "derived_" + tag, [&](const HostStore& store) {
    for (size_t l = 0; l < size_t(kLayers); ++l) {
      const ParamGroup& g = store.layer_group(l);
      std::vector<char> bytes(g.working_bytes);
      if (store.layer_derived(l)) store.derive_working(l, bytes.data());
      else std::memcpy(bytes.data(), store.working() + g.working_offset, g.working_bytes);
      r.layer_working.push_back(std::move(bytes));
    }
    r.derived_layers = store.derived_layers();
    r.pinned = store.pinned_bytes();
    r.estimate_working = HostStore::estimate(store.spec(), o.store).working;
    r.estimate_grads = HostStore::estimate(store.spec(), o.store).grads;
    r.grad_floats = store.grad_floats();
  });
  return r;
}

// Two runs that must train to the same bits: losses, norms, master, m, v, a forward on the last weights.
void check_same_training(const Result& a, const Result& b) {
  CHECK(a.losses == b.losses);
  CHECK(a.norms == b.norms);
  CHECK(same_bits(a.master, b.master));
  CHECK(a.m == b.m);
  CHECK(a.v == b.v);
  CHECK(a.final_loss == b.final_loss);
}

// The gradient buffer with the gradients in flight: the embedding's group and one slot as large as
// the largest other group.
size_t in_flight_grad_bytes(const HostStoreLayout& layout) {
  size_t largest_other = 0;
  for (size_t g = 1; g < layout.groups.size(); ++g) largest_other = std::max(largest_other, layout.groups[g].f32_bytes);
  return layout.groups[0].f32_bytes + largest_other;
}

// A named configuration, and each case's pair of runs: `pair(a, b)` makes the two from its
// configuration, they must train to the same bits, and `more(ra, rb)` checks the pair further.
struct Case {
  const char* what;
  DerivedRun base;
};
template <class Pair, class More>
void each_pair(std::initializer_list<Case> cases, const std::string& tag, Pair&& pair, More&& more) {
  int n = 0;
  for (const Case& k : cases) {
    INFO(k.what);
    DerivedRun a = k.base, b = k.base;
    pair(a, b);
    const Result ra = run(a, str_cat(tag, "a", n)), rb = run(b, str_cat(tag, "b", n));
    ++n;
    check_same_training(rb, ra);
    more(ra, rb);
  }
}

}  // namespace

TEST_CASE("derived working weights train bit for bit like a stored working copy", "[engine][derived]") {
  const size_t groups = kLayers + 2;
  struct Case {
    const char* what;
    DerivedRun base;
    size_t derived_layers;  // what the store derives
  };
  const Case cases[] = {
      {"micro-batch, clipping", {}, kLayers},
      {"micro-batch, no clipping (updates as gradients land)", {false, 0.0}, kLayers},
      {"layer-major, clipping", {false, 1.0, true}, kLayers},
      {"layer-major, no clipping", {false, 0.0, true}, kLayers},
      {"resident weights (uploaded once per step)", {false, 1.0, false, 0, "device"}, kLayers},
      {"NVMe state from layer 2 on (layers 0 and 1 derived)", {false, 1.0, false, 3}, 2},
      {"speculated updates redone", {false, 1e-3, false, 0, "stream", 2, groups}, kLayers},
  };
  int n = 0;
  for (const Case& k : cases) {
    INFO(k.what);
    DerivedRun stored = k.base, derived = k.base;
    derived.derived = true;
    const Result s = run(stored, "s" + std::to_string(n)), d = run(derived, "d" + std::to_string(n));
    ++n;
    CHECK(s.derived_layers == 0);
    CHECK(d.derived_layers == k.derived_layers);
    check_same_training(d, s);
    CHECK(d.layer_working == s.layer_working);  // what derive_working makes is the stored copy's bytes
    // the store holds what its estimate counts: less each derived layer's working bytes
    const HostStoreLayout layout = HostStore::layout(model_spec_build(config(), DType::bf16));
    CHECK(d.estimate_working == s.estimate_working - derived_working_bytes(layout, k.derived_layers));
    CHECK(s.pinned - d.pinned == derived_working_bytes(layout, k.derived_layers));
  }
}

TEST_CASE("gradients in flight train bit for bit like the whole gradient buffer", "[engine][lean-grads]") {
  const HostStoreLayout layout = HostStore::layout(model_spec_build(config(), DType::bf16));
  // no clipping, one pass a step: micro-batch steps of one micro-batch are not what run() does
  // (two a step), so the micro-batch case here is layer-major's sibling with the same pass count
  each_pair({{"layer-major", {false, 0.0, true}},
             {"layer-major, resident weights", {false, 0.0, true, 0, "device"}},
             {"layer-major, NVMe state from layer 2 on", {false, 0.0, true, 3}},
             {"layer-major, derived working weights too", {true, 0.0, true}}},
            "g",
            [](DerivedRun& full, DerivedRun& lean) {
              full.derived = false;
              lean.grads_in_flight = true;
            },
            [&](const Result& f, const Result& l) {
              const size_t lean_bytes = in_flight_grad_bytes(layout);
              CHECK(l.grad_floats * 4 == lean_bytes);
              CHECK(l.estimate_grads == lean_bytes);
              CHECK(f.grad_floats * 4 == layout.f32.tier_bytes(Tier::host));
              CHECK(lean_bytes < layout.f32.tier_bytes(Tier::host) / 2);
            });
}

// offload.norm_pass: the step's one pass run first for the norm alone (each gradient squared and
// dropped as it lands), then again updating each group as it lands with the clip known. Against the
// serial clipped step (every gradient held, the norm gathered as they land): the same bits, with
// the gradient buffer of the no-clipping path.
TEST_CASE("a norm pass trains bit for bit like the serial clipped step, its gradients in flight", "[engine][norm-pass]") {
  const HostStoreLayout layout = HostStore::layout(model_spec_build(config(), DType::bf16));
  each_pair({{"layer-major, clipping every step", {false, 1e-3, true}},
             {"layer-major, a norm that never clips", {false, 1e3, true}},
             {"layer-major, resident weights", {false, 1e-3, true, 0, "device"}},
             {"layer-major, the first 2 layers resident", {false, 1e-3, true, 0, "stream", 0, 0, false, false, 2}},
             {"layer-major, NVMe state from layer 2 on", {false, 1e-3, true, 3}},
             {"layer-major, derived working weights", {true, 1e-3, true}}},
            "n",
            [](DerivedRun&, DerivedRun& two) {
              two.norm_pass = true;
              two.grads_in_flight = true;
            },
            [&](const Result& s, const Result& t) {
              CHECK(t.grad_floats * 4 == in_flight_grad_bytes(layout));
              CHECK(s.grad_floats * 4 == layout.f32.tier_bytes(Tier::host));
              // a second pass: twice the device's work, and its transfers
              CHECK(t.stats.link_bytes > s.stats.link_bytes * 3 / 2);
            });
  // the clip mattered: a clipping norm moved the weights less than one that never clips
  const Result clipped = run({false, 1e-3, true, 0, "stream", 0, 0, true, true}, "nc");
  const Result free = run({false, 1e3, true, 0, "stream", 0, 0, true, true}, "nf");
  CHECK_FALSE(same_bits(clipped.master, free.master));
  // one micro-batch at a time with two a step: two passes, no norm pass
  CHECK_THROWS_WITH(run({false, 1e-3, false, 0, "stream", 0, 0, false, true}, "nm"),
                    Catch::Contains("a norm pass needs one pass a step"));
}

// offload.resident_layers: the first layers keep a slot of their own, the rest stream; the same
// bits as every layer streamed or resident, and fewer bytes over the link than streamed.
TEST_CASE("layers resident and streamed in one run train bit for bit like either", "[engine][resident]") {
  for (bool derived : {false, true}) {  // a derived layer's resident slot is filled from the master too
    const Result streamed = run({derived, 1.0, true}, "rs"), resident = run({derived, 1.0, true, 0, "device"}, "rd");
    for (size_t r : {size_t(1), size_t(2), size_t(3)}) {
      INFO(r << " of " << kLayers << " layers resident" << (derived ? ", derived" : ""));
      const Result mixed = run({derived, 1.0, true, 0, "stream", 0, 0, false, false, r}, "rm" + std::to_string(r));
      CHECK(mixed.losses == streamed.losses);
      CHECK(mixed.norms == streamed.norms);
      CHECK(same_bits(mixed.master, streamed.master));
      CHECK(mixed.final_loss == resident.final_loss);
      CHECK(mixed.stats.link_bytes < streamed.stats.link_bytes);
    }
  }
}

TEST_CASE("derived working weights refuse what they cannot derive from", "[engine][derived]") {
  auto dev = device_create(DeviceOptions{});
  HostStoreOptions so;
  so.derived_working = true;
  SECTION("f32 weights: the master is the working copy") {
    CHECK_THROWS_WITH(HostStore(*dev, model_spec_build(config(), DType::f32), so),
                      Catch::Contains("offload.working_weights = \"stored\""));
  }
  SECTION("zo-sgd: no moments, and the update writes the working copy") {
    so.needs = optimizer_state_needs(OptimizerKind::zo_sgd);
    CHECK_THROWS_WITH(HostStore(*dev, model_spec_build(config(), DType::bf16), so),
                      Catch::Contains("optim.type = \"adamw\""));
  }
  SECTION("every layer's state on NVMe: nothing derived, all stored") {
    testing::TempDir dir("derived_all_nvme_" + std::to_string(::getpid()));
    so.state_on_nvme = true;
    so.nvme_first_group = 0;
    so.nvme_path = dir.path.string();
    so.nvme_block_bytes = 4096;
    so.nvme_chunk_bytes = 8192;
    HostStore store(*dev, model_spec_build(config(), DType::bf16), so);
    CHECK(store.derived_layers() == 0);
    CHECK(store.derived_staging_bytes() == 0);
  }
}

TEST_CASE("the plan counts derived working weights and the search takes them when they fit best", "[plan][derived]") {
  const ModelSpec spec = model_spec_build(testing::tiny_llama_config({64, 96, 6, 512, 64, false}), DType::bf16);
  const HostStoreLayout layout = HostStore::layout(spec);
  PlanInputs in;
  in.micro_batch = 2;
  in.sequence_len = 32;
  in.accumulation_steps = 2;
  in.weights = WeightsMode::stream;
  in.device_in_host_ram = true;
  PlanBudgets unlimited;
  PlanChoice stored, derived;
  derived.derive_working = true;
  const RunPlan s = placement_plan_at(spec, in, 1, unlimited, stored);
  const RunPlan d = placement_plan_at(spec, in, 1, unlimited, derived);
  const size_t L = spec.layers.size();
  CHECK(d.derived_working_layers == L);
  CHECK(d.bytes_of("working weights (bf16)") == s.bytes_of("working weights (bf16)") - derived_working_bytes(layout, L));
  CHECK(d.bytes_of(kDerivedStagingKind) == derived_staging_bytes(layout, L));
  CHECK(s.bytes_of(kDerivedStagingKind) == 0);
  CHECK(s.host_total() - d.host_total() == derived_working_bytes(layout, L) - derived_staging_bytes(layout, L));
  CHECK(run_plan_store_options(d).derived_working);
  CHECK_FALSE(run_plan_store_options(s).derived_working);

  StepRates rates = plan_default_rates(in);
  SECTION("no budget: the conversion only costs, so auto keeps the stored copy") {
    const RunPlan p = placement_plan(spec, in, unlimited, rates);
    CHECK(p.derived_working_layers == 0);
  }
  SECTION("a host budget between the two: auto derives, \"stored\" does not fit and says what to change") {
    PlanBudgets tight;
    tight.host_bytes = (s.host_total() + d.host_total()) / 2;
    const RunPlan p = placement_plan(spec, in, tight, rates);
    CHECK(p.fits());
    CHECK(p.derived_working_layers == L);
    PlanInputs keep = in;
    keep.working = WorkingMode::stored;
    const RunPlan q = placement_plan(spec, keep, tight, rates);
    CHECK_FALSE(q.fits());
    bool suggested = false;
    for (const PlanChange& c : q.changes)
      suggested = suggested || (c.set.contains("offload.working_weights") && c.fits);
    CHECK(suggested);
  }
  SECTION("derived where it cannot apply is bad input naming why") {
    PlanInputs lora = in;
    lora.working = WorkingMode::derived;
    lora.lora.r = 4;
    CHECK_THROWS_WITH(placement_plan(spec, lora, unlimited, rates), Catch::Contains("LoRA"));
    PlanInputs ranks = in;
    ranks.working = WorkingMode::derived;
    ranks.ranks = 2;
    CHECK_THROWS_WITH(placement_plan(spec, ranks, unlimited, rates), Catch::Contains("ranks"));
  }
  SECTION("gradients in flight: planned without clipping at one pass a step, and counted as allocated") {
    PlanInputs v = in;
    v.clip_grad = false;
    const RunPlan lm = placement_plan_at(spec, v, 2, unlimited, stored);  // layer-major: the step's 2 together
    CHECK(lm.grads_in_flight);
    CHECK(run_plan_store_options(lm).grads_in_flight);
    CHECK(lm.bytes_of("fp32 gradient accumulation") == grad_buffer_bytes(layout, true));
    CHECK(grad_buffer_bytes(layout, true) < layout.f32.tier_bytes(Tier::host) / 2);
    CHECK_FALSE(placement_plan_at(spec, v, 1, unlimited, stored).grads_in_flight);  // 2 passes add into each group
    CHECK_FALSE(placement_plan_at(spec, in, 2, unlimited, stored).grads_in_flight);  // clipping needs them all
    PlanInputs ranks = v;
    ranks.ranks = 2;
    CHECK_FALSE(placement_grads_in_flight(ranks, 2));
    PlanInputs lora = v;
    lora.lora.r = 4;
    CHECK_FALSE(placement_grads_in_flight(lora, 2));
  }
  SECTION("derived asked for with every group's state on NVMe: the stored plan, nothing derived") {
    PlanInputs v = in;
    v.working = WorkingMode::derived;
    v.optimizer = StateTier::nvme;
    PlanBudgets b;
    b.nvme_dir = "/nvme/strata";
    const RunPlan p = placement_plan(spec, v, b, rates);
    CHECK(p.optimizer_on_nvme);
    CHECK(p.derived_working_layers == 0);
    CHECK(p.bytes_of("working weights (bf16)") == s.bytes_of("working weights (bf16)"));
    CHECK(p.step_seconds > 0);
  }
  SECTION("the step model prices each upload's conversion") {
    PlanInputs v = plan_resolved_inputs(in, s);
    const StepEstimate es = step_estimate(spec, v, s, 2, rates);
    const StepEstimate ed = step_estimate(spec, v, d, 2, rates);
    CHECK(es.bytes.derived_h2d == 0);
    CHECK(ed.bytes.derived_h2d > 0);
    CHECK(ed.bytes.h2d == es.bytes.h2d);  // the same bytes cross
    CHECK(ed.components.at("host") - es.components.at("host") ==
          Approx(3 * ed.bytes.derived_h2d / rates.host_bytes_per_s).epsilon(1e-9));
    CHECK(ed.seconds > es.seconds);
  }
}

}  // namespace strata
