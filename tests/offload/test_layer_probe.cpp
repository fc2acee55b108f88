// The CPU backend's layer probe (offload/plan/layer_probe.h): the rates a CPU training run plans
// at, what the plan counts for it, and where it gives way to the square-GEMM peak.
#include <catch2/catch.hpp>

#include <cmath>

#include "offload/plan/layer_probe.h"
#include "offload/plan/placement_plan.h"
#include "offload/plan/plan_search.h"
#include "offload/plan/step_estimate.h"
#include "tests/testing.h"

namespace strata {
namespace {

PlanInputs probe_inputs_cpu() {
  PlanInputs in;
  in.device_in_host_ram = true;
  in.device_is_cuda = false;
  in.micro_batch = 2;
  in.sequence_len = 64;
  return in;
}

}  // namespace

TEST_CASE("layer probe: every kind of a layer's work gets a finite positive rate", "[plan][probe]") {
  for (DType dtype : {DType::f32, DType::bf16}) {
    // odd sizes on purpose: C 200 (head_dim 40), F 536, a vocabulary that is no power of two
    const ModelSpec spec = model_spec_build(testing::tiny_llama_config({200, 536, 2, 1001, 128, false, 5, 5}), dtype);
    const LayerRates r = layer_probe_run_rates(spec, probe_inputs_cpu());
    INFO(dtype_name(dtype));
    CHECK(r.measured());
    for (double rate : {r.matmul_flops_per_s, r.attention_flops_per_s, r.elementwise_bytes_per_s, r.head_flops_per_s}) {
      CHECK(std::isfinite(rate));
      CHECK(rate > 0);
    }
  }
}

TEST_CASE("layer probe: the plan counts the probe's memory as a transient of the CPU backend only", "[plan][probe]") {
  const ModelSpec spec = model_spec_build(testing::tiny_llama_config({256, 704, 2, 4096, 128, false, 4, 2}), DType::bf16);
  PlanInputs in = probe_inputs_cpu();
  const HostStoreLayout layout = HostStore::layout(spec);
  const size_t probe = LayerProbe::host_bytes(spec, layout, in);
  // at least the layer's weights and f32 gradient slot, its activations and one lm_head chunk
  CHECK(probe > layout.groups[1].device_bytes + layout.groups[1].f32_bytes + size_t(4 * 2 * 64 * 256));
  auto probe_transient = [](const RunPlan& p) -> size_t {
    for (const PlanState& t : p.transients)
      if (t.kind.rfind("probing a layer's rates", 0) == 0) return t.bytes;
    return 0;
  };
  CHECK(probe_transient(placement_plan(spec, in, PlanBudgets{})) == probe);
  in.device_in_host_ram = false;
  in.device_is_cuda = true;
  CHECK(probe_transient(placement_plan(spec, in, PlanBudgets{})) == 0);
}

TEST_CASE("layer probe: a layer past 2 GiB is not probed and its run plans at the square-GEMM peak", "[plan][probe]") {
  // one Llama-3.1-405B layer: C 16384, F 53248 (3.2 GiB of bf16 weights, 6.5 GiB of f32 gradient)
  const ModelSpec spec =
      model_spec_build(testing::tiny_llama_config({16384, 53248, 2, 128256, 256, false, 128, 8}), DType::bf16);
  const PlanInputs in = probe_inputs_cpu();
  CHECK(LayerProbe::host_bytes(spec, HostStore::layout(spec), in) == 0);
  CHECK(LayerProbe::create(spec, in) == nullptr);
  const LayerRates none = layer_probe_run_rates(spec, in);
  CHECK_FALSE(none.measured());
  const StepRates r = plan_run_rates(in, 7e11, none, 0);
  CHECK(r.device_flops_per_s == 7e11);
  CHECK(r.elementwise_bytes_per_s == 0);
}

}  // namespace strata
