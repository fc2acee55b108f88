// The step model against the engine's schedule (issue 37, item 2): offload/plan/step_estimate.h
// priced on hand-worked cases, each assertion one the earlier model failed. The optimizer's
// overlap with and without clipping and over a layer-major pass; LoRA's adapters-only update,
// transfers and GEMMs; ZO-SGD's update and bytes; NVMe checksums on several threads; the state of
// only the groups on NVMe; AdamW's default from the memory bandwidth; the GPU table's GEMM
// efficiency, with MFU against the datasheet peak.
//
// Rates are set so that one effect decides each figure: a link or host bandwidth of 1e18 makes
// that part vanish (well below the tolerances), a stated AdamW rate sets the update's length
// against the forward's. Tolerances are relative, 1e-9 (sums of a few doubles), unless said.
#include <catch2/catch.hpp>
#include <cmath>
#include <optional>
#include <nlohmann/json.hpp>

#include "io/hf_config.h"
#include "offload/plan/plan_search.h"
#include "offload/plan/step_estimate.h"
#include "offload/state/host_store.h"
#include "offload/state/lora.h"
#include "tests/offload/step_model_fixtures.h"
#include "tests/testing.h"

namespace strata {
namespace {

using namespace step_model_fixtures;

double embedding_params(const ModelSpec& spec) { return double(spec.params[size_t(spec.embed)].numel()); }

}  // namespace

TEST_CASE("step model: the update overlaps the next forward with clipping, the last backward without", "[estimate][step-model]") {
  const ModelSpec spec = tiny_spec();
  PlanInputs in = tiny_inputs();
  const RunPlan plan = placement_plan(spec, in, PlanBudgets{});
  REQUIRE(plan.group == 1);
  const double params = double(spec.parameter_count()), fwd = forward_seconds(spec, in);
  StepRates rates = compute_rates();
  rates.adamw_params_per_s = params / (2 * fwd);  // the update lasts two forwards, less than a backward
  const StepEstimate clip = step_estimate(spec, in, plan, 3, rates);
  const double compute = clip.components.at("compute");
  REQUIRE(clip.bottleneck == "compute");
  // clipping: each group's squares as it lands in the backward (4 bytes per parameter at 1e18
  // B/s), the embedding's, the last, after it; then the update behind the next step's first forward
  const double norm0 = 4 * embedding_params(spec) / 1e18;
  CHECK(clip.optimizer_exposed_s == Approx(norm0 + fwd).epsilon(1e-9));
  CHECK(clip.seconds == Approx(compute + fwd).epsilon(1e-9));
  // no clipping: each group as its gradient lands, behind that backward (3 forwards long); the
  // embedding's, the last, after it: the next forward's gather waits for it
  in.clip_grad = false;
  const StepEstimate landed = step_estimate(spec, in, plan, 3, rates);
  const double embedding_update = embedding_params(spec) / rates.adamw_params_per_s;
  CHECK(landed.optimizer_exposed_s == Approx(embedding_update).epsilon(1e-6));  // + the groups' sums of squares at 1e18 B/s
  CHECK(landed.seconds == Approx(compute + embedding_update).epsilon(1e-6));
  // a slower update (4 backwards long) overflows the backward: the rest of it shows
  rates.adamw_params_per_s = params / (12 * fwd);
  const StepEstimate slow = step_estimate(spec, in, plan, 3, rates);
  const double backward = compute / 3 - fwd, update = params / rates.adamw_params_per_s;
  CHECK(slow.optimizer_exposed_s == Approx(update - backward).epsilon(1e-6));
  // clipping's global norm: a pass over every f32 gradient at the host's bandwidth, each group's
  // behind its landing in the backward; only the embedding's (the last to land) shows
  in.clip_grad = true;
  rates.adamw_params_per_s = params / (2 * fwd);
  rates.host_bytes_per_s = 1e10;
  const StepEstimate normed = step_estimate(spec, in, plan, 3, rates);
  REQUIRE(4 * params / 1e10 < compute / 3 - fwd);  // the squares fit in the backward
  CHECK(normed.optimizer_exposed_s == Approx(4 * embedding_params(spec) / 1e10 + fwd).epsilon(1e-9));
  CHECK(normed.components.at("optimizer") == Approx(4 * params / 1e10 + 2 * fwd).epsilon(1e-9));
}

TEST_CASE("step model: a layer-major pass hides the update behind its whole forward", "[estimate][step-model]") {
  const ModelSpec spec = tiny_spec();
  PlanInputs in = tiny_inputs();
  in.accumulation_steps = 4;
  const double params = double(spec.parameter_count()), fwd = forward_seconds(spec, in);
  StepRates rates = compute_rates();
  rates.adamw_params_per_s = params / (2 * fwd);  // two micro-batches' forwards
  const StepEstimate one = step_estimate(spec, in, placement_plan(spec, in, PlanBudgets{}), 4, rates);
  in.accumulation = AccumulationMode::layer_major;
  const RunPlan major = placement_plan(spec, in, PlanBudgets{});
  REQUIRE(major.group == 4);
  const StepEstimate four = step_estimate(spec, in, major, 4, rates);
  // micro_batch: the next step's first forward is one micro-batch's: half the update shows
  CHECK(one.optimizer_exposed_s == Approx(4 * embedding_params(spec) / 1e18 + fwd).epsilon(1e-9));  // the embedding's squares, then half the update
  CHECK(one.seconds == Approx(one.components.at("compute") + fwd).epsilon(1e-9));
  // layer-major: the next forward runs all four micro-batches through each layer: all hidden
  // (the norm's pass at 1e18 B/s aside)
  CHECK(four.optimizer_exposed_s == Approx(0).margin(1e-6));
  CHECK(four.seconds == Approx(four.components.at("compute")).epsilon(1e-6));
}

TEST_CASE("step model: the device's gradient zeroing and a layer-major pass's adds are memory-bound work", "[estimate][step-model]") {
  // Engine::grad_share: every micro-batch zeroes the gradient it computes into (4 bytes a
  // parameter); in a layer-major pass each after the first is added into the pass's total (12)
  const ModelSpec spec = tiny_spec();
  PlanInputs in = tiny_inputs();
  in.accumulation_steps = 4;
  StepRates rates = compute_rates();
  rates.elementwise_bytes_per_s = 1e10;
  // the layers' (4 x 1024^2 attention + 3 x 1024 x 4096 MLP + 2 norms), the final norm's and the
  // untied lm_head's; the embedding's rows are added on the host
  const double device_grads = 4 * (4.0 * 1024 * 1024 + 3.0 * 1024 * 4096 + 2 * 1024) + 1024 + 32768.0 * 1024;
  const RunPlan one_plan = placement_plan(spec, in, PlanBudgets{});
  REQUIRE(one_plan.group == 1);
  const StepEstimate one = step_estimate(spec, in, one_plan, 4, rates);
  in.accumulation = AccumulationMode::layer_major;
  const RunPlan major = placement_plan(spec, in, PlanBudgets{});
  REQUIRE(major.group == 4);
  const StepEstimate four = step_estimate(spec, in, major, 4, rates);
  // the same layers' and head's work per micro-batch, and the same zeroing: the adds are the difference
  CHECK(four.compute_parts.at("elementwise") - one.compute_parts.at("elementwise") ==
        Approx(3 * 12 * device_grads / 1e10).epsilon(1e-9));
  CHECK(pass_gradient_bytes(spec, 1, false) == 4 * device_grads);
  CHECK(pass_gradient_bytes(spec, 4, false) == (16 + 36) * device_grads);
  CHECK(pass_gradient_bytes(spec, 4, true) == 0);  // LoRA: the adapters' own, a few MiB
  // a tied lm_head is the embedding: its gradient is the device's (the head's chunks)
  const ModelSpec tied = model_spec_build(testing::tiny_llama_config({1024, 4096, 4, 32768, 4096, true, 8, 8}), DType::bf16);
  CHECK(pass_gradient_bytes(tied, 1, false) == 4 * double(tied.parameter_count()));
}

TEST_CASE("step model: LoRA prices the adapters' update, no base gradients, no base dW GEMMs", "[estimate][step-model][lora]") {
  // 405B (Llama-3.1 shape), r = 16 on all seven projections
  const ModelSpec big = model_spec_build(hf_config_load(testing::source_path("recipes/configs/llama-3.1-405b/config.json")), DType::bf16);
  PlanInputs in;
  in.micro_batch = 1;
  in.sequence_len = 4096;
  in.lora.r = 16;
  StepRates rates;
  rates.device_flops_per_s = 742e12;
  rates.link_bytes_per_s = 64e9;  // AdamW from the default 50 GB/s: 32 bytes per adapter parameter
  const StepEstimate e16 = step_estimate(big, in, placement_plan(big, in, PlanBudgets{}), 16, rates);
  const double adapters = double(LoraLayout::of(big, in.lora).parameter_count());
  CHECK(adapters < 1e9);
  CHECK(e16.optimizer_params == adapters);
  // AdamW (32 bytes each) and the norm (4) over the adapters, nothing over the 405B frozen ones
  CHECK(e16.components.at("optimizer") == Approx(adapters * 36 / 50e9).epsilon(1e-9));
  CHECK(e16.components.at("optimizer") < 1.0);
  CHECK(e16.components.at("host") == 0);  // one process: the adapters' gradients add up on the device
  in.lora.r = 32;  // twice the adapters, twice the update
  const StepEstimate e32 = step_estimate(big, in, placement_plan(big, in, PlanBudgets{}), 16, rates);
  CHECK(e32.components.at("optimizer") == Approx(2 * e16.components.at("optimizer")).epsilon(1e-9));

  // the small model: what crosses and what the device computes
  const ModelSpec spec = tiny_spec();
  PlanInputs full = tiny_inputs();
  PlanInputs lora = full;
  lora.lora.r = 8;
  StepRates c = compute_rates();
  c.host_bytes_per_s = 1e10;  // AdamW over the adapters at 1e10 / 32 parameters/s
  const StepEstimate f = step_estimate(spec, full, placement_plan(spec, full, PlanBudgets{}), 3, c);
  const StepEstimate l = step_estimate(spec, lora, placement_plan(spec, lora, PlanBudgets{}), 3, c);
  const double n = 1024, p = double(LoraLayout::of(spec, lora.lora).parameter_count());
  CHECK(p == 4 * 8 * (4 * (1024 + 1024) + 3 * (1024 + 4096)));  // r (in + out) per target: q k v o, gate up down
  // back: the losses, then the step's adapter gradients; up: the adapters once per step
  CHECK(l.bytes.d2h == 3 * 8 + 4 * p);
  CHECK(l.bytes.h2d < f.bytes.h2d);
  // the base's GEMMs without dW (6 of 8 FLOPs per matrix parameter and token), the adapters' 8
  CHECK(l.compute_parts.at("matmul") == Approx(f.compute_parts.at("matmul") * 3 / 4 + 3 * 8 * n * p / 1e12).epsilon(1e-9));
  CHECK(l.compute_parts.at("head") == Approx(f.compute_parts.at("head") * 3 / 4).epsilon(1e-9));
  CHECK(l.compute_parts.at("attention") == f.compute_parts.at("attention"));
  // the update is synchronous: the device waits for all of it (the adapters' two crossings at 1e18 B/s aside)
  CHECK(l.components.at("optimizer") == Approx(p * 36 / 1e10).epsilon(1e-9));
  CHECK(l.seconds == Approx(l.components.at("compute") + l.components.at("optimizer")).epsilon(1e-9));
}

TEST_CASE("step model: ZO-SGD moves the weights once per dual forward and updates at a third of AdamW's bytes", "[estimate][step-model][zo]") {
  const ModelSpec spec = tiny_spec();
  PlanInputs in = tiny_inputs();
  in.optimizer_kind = OptimizerKind::zo_sgd;
  const RunPlan plan = placement_plan(spec, in, PlanBudgets{});
  StepRates rates = compute_rates();
  rates.adamw_params_per_s = 1e9;
  const StepEstimate q2 = step_estimate(spec, in, plan, 3, rates, 2);
  // per dual forward (3 micro-batches x 2 perturbations): 4 int32 token arrays, both passes' x0,
  // every layer and lm_head chunk (4 of each through 2 slots: none still there), the final norm
  // once per step; the two losses back
  const double layer_w = (4.0 * 1024 * 1024 + 3.0 * 1024 * 4096) * 2 + 2 * 1024 * 4, lm_w = 32768.0 * 1024 * 2;
  const double act = 1024.0 * 1024 * 4;
  CHECK(q2.bytes.h2d == 6 * (16 * 1024 + 2 * act + 4 * layer_w + lm_w) + 1024 * 4);
  CHECK(q2.bytes.d2h == 6 * 16);
  CHECK(q2.bytes.nvme_read() == 0);
  // the update: master read and written, the bf16 working copy written (10 bytes) per
  // perturbation, against AdamW's 30 at the same rate
  const double params = double(spec.parameter_count());
  CHECK(q2.optimizer_params_per_s == Approx(1e9 * 30 / (10 * 2)).epsilon(1e-12));
  CHECK(q2.components.at("optimizer") == Approx(params * 2 * 10 / 30 / 1e9).epsilon(1e-9));
  const StepEstimate q1 = step_estimate(spec, in, plan, 3, rates, 1);
  PlanInputs adamw = tiny_inputs();
  const StepEstimate a = step_estimate(spec, adamw, placement_plan(spec, adamw, PlanBudgets{}), 3, rates);
  CHECK(q1.components.at("optimizer") == Approx(a.components.at("optimizer") / 3).epsilon(1e-6));  // AdamW's norm at 1e18 B/s aside
  // two forward passes per dual forward: the layers' forward and the head's statistics, twice
  CHECK(q2.components.at("compute") == Approx(6 * 2 * forward_seconds(spec, in)).epsilon(1e-9));
}

TEST_CASE("step model: NVMe checksums on the file engine's threads, the state of only the groups on NVMe", "[estimate][step-model]") {
  const ModelSpec spec = tiny_spec();
  PlanInputs in = tiny_inputs();
  in.optimizer = StateTier::nvme;
  PlanBudgets budgets;
  budgets.nvme_dir = "/nonexistent-nvme";  // the plan only names it
  RunPlan plan = placement_plan(spec, in, budgets);
  REQUIRE(plan.optimizer_on_nvme);
  StepRates rates = compute_rates();
  rates.adamw_params_per_s = 1e18;
  rates.checksum_bytes_per_s = 1e8;  // slow checksums decide the step
  const StepEstimate one = step_estimate(spec, in, plan, 1, rates);
  rates.checksum_threads = 2;
  const StepEstimate two = step_estimate(spec, in, plan, 1, rates);
  // master, m and v of every group: each group in whole 1 MiB blocks, read once, written once
  const HostStoreLayout layout = HostStore::layout(spec);
  auto blocks = [](double bytes) { return std::ceil(bytes / (1 << 20)) * (1 << 20); };
  double state = 0;
  for (const ParamGroup& g : layout.groups) state += 3 * blocks(double(g.f32_bytes));
  REQUIRE(one.bytes.state == state);
  CHECK(one.components.at("checksum") == Approx(2 * state / 1e8).epsilon(1e-12));
  CHECK(two.components.at("checksum") == Approx(state / 1e8).epsilon(1e-12));
  // on a GPU the checksums stream with the update behind the next forward: half of them less
  CHECK(one.seconds - two.seconds == Approx(state / 1e8).epsilon(1e-9));
  // on the CPU backend they share the cores with the rest and add up: the same saving
  in.device_in_host_ram = true;
  rates.checksum_threads = 1;
  const StepEstimate cpu_one = step_estimate(spec, in, plan, 1, rates);
  rates.checksum_threads = 2;
  const StepEstimate cpu_two = step_estimate(spec, in, plan, 1, rates);
  CHECK(cpu_one.seconds - cpu_two.seconds == Approx(state / 1e8).epsilon(1e-9));
  // the disk at 1 GB/s each way: the update waits for every read and for the writes the file
  // engine queued before the last read (all but the last 2 of its 64 MiB ranges: 2 buffers are
  // read ahead); the rest drain behind the step. Clipping: what exceeds the next forward shows.
  in.device_in_host_ram = false;
  rates.checksum_bytes_per_s = 1e18;
  rates.nvme_read_bytes_per_s = rates.nvme_write_bytes_per_s = 1e9;
  double ranges = 0;
  for (const ParamGroup& g : layout.groups) ranges += std::ceil(double(g.f32_bytes) / (64 << 20));
  REQUIRE(ranges == 13);  // the embedding 2, each layer 2 (a few KiB over 64 MiB), the head 3 (the final norm too)
  const StepEstimate disk = step_estimate(spec, in, plan, 1, rates);
  const double fwd = forward_seconds(spec, in), norm = 4 * double(spec.parameter_count()) / 1e18;
  CHECK(disk.components.at("nvme") == Approx(2 * state / 1e9).epsilon(1e-12));
  CHECK(disk.optimizer_exposed_s == Approx(norm + state / 1e9 * (1 + 11.0 / 13) - fwd).epsilon(1e-9));
  // groups 3.. (layers 2 and 3, the head) on NVMe, 0..2 in RAM: only their state moves
  plan.optimizer_nvme_first_group = 3;
  double tail = 0;
  for (size_t g = 3; g < layout.groups.size(); ++g) tail += 3 * blocks(double(layout.groups[g].f32_bytes));
  CHECK(step_bytes(spec, in, plan, 1).state == tail);
  CHECK(tail < state);
}

TEST_CASE("step model: AdamW's default rate is the memory bandwidth over the bytes it touches", "[estimate][step-model]") {
  const ModelSpec spec = tiny_spec();
  PlanInputs in = tiny_inputs();
  StepRates rates = compute_rates();
  rates.host_bytes_per_s = 50e9;
  REQUIRE(rates.adamw_params_per_s == 0);  // derived unless measured or given
  // bf16 weights, f32 moments: master, m, v read and written (24), gradient read (4), bf16 copy written (2)
  CHECK(step_adamw_bytes_per_param(DType::bf16, in) == 30);
  CHECK(step_estimate(spec, in, placement_plan(spec, in, PlanBudgets{}), 1, rates).optimizer_params_per_s ==
        Approx(50e9 / 30).epsilon(1e-12));
  in.moments = DType::bf16;  // m and v 2 bytes each way
  CHECK(step_adamw_bytes_per_param(DType::bf16, in) == 22);
  in.moments = DType::f32;
  CHECK(step_adamw_bytes_per_param(DType::f32, in) == 28);  // f32: the master is the working copy
  in.f32_master_shared = false;
  CHECK(step_adamw_bytes_per_param(DType::f32, in) == 32);
  rates.adamw_params_per_s = 2e9;  // measured or given wins
  CHECK(step_adamw_params_per_s(DType::bf16, in, rates) == 2e9);
  // the CLI states it as assumed, with its derivation; a given rate is "given"
  const std::string model = "--model " + testing::source_path("recipes/configs/llama-3.1-8b/config.json") +
                            " model.dtype=bf16 --gpu 'H100 SXM' --host-memory 2TiB";
  const nlohmann::json j = testing::estimate_json(model);
  CHECK(j["step"]["rates"]["adamw"]["value"].get<double>() == Approx(50e9 / 30).epsilon(1e-12));
  CHECK(j["step"]["rates"]["adamw"]["source"] ==
        "assumed (50 GB/s memory / 30 bytes per parameter; each candidate plan at its own bytes)");
  const nlohmann::json g = testing::estimate_json(model + " --adamw-params-per-s 2e9");
  CHECK(g["step"]["rates"]["adamw"]["value"].get<double>() == 2e9);
  CHECK(g["step"]["rates"]["adamw"]["source"] == "given");
}

// The derived default is each candidate's own: a layer whose working copy is derived
// (offload.working_weights) writes none, 28 bytes a parameter, not 30; a measured or given rate
// is the same for every row. Before, the CLI fixed the recipe's rate for every candidate, so the
// bf16-moments entry of "what to change" was priced at f32 moments' rate.
TEST_CASE("step model: derived working rows are priced at their own AdamW bytes when the rate is derived", "[estimate][step-model]") {
  const ModelSpec spec = tiny_spec();
  PlanInputs in = tiny_inputs();
  in.clip_grad = true;  // the update priced alone, no norm summed into it
  StepRates rates = compute_rates();
  rates.host_bytes_per_s = 50e9;
  REQUIRE(rates.adamw_params_per_s == 0);
  const RunPlan stored = placement_plan(spec, in, PlanBudgets{});
  RunPlan derived = stored;
  derived.derived_working_layers = size_t(spec.config.num_hidden_layers);
  const HostStoreLayout layout = HostStore::layout(spec);
  double layer_params = 0;
  for (size_t g = 1; g <= size_t(spec.config.num_hidden_layers); ++g) layer_params += double(layout.groups[g].f32_bytes) / 4;
  const double saved = layer_params * double(dtype_size(spec.matrix_dtype)) / 50e9;
  REQUIRE(saved > 0);
  const double opt_stored = step_estimate(spec, in, stored, 1, rates).components.at("optimizer");
  const double opt_derived = step_estimate(spec, in, derived, 1, rates).components.at("optimizer");
  CHECK(opt_stored - opt_derived == Approx(saved).epsilon(1e-9));
  rates.adamw_params_per_s = 2e9;  // measured or given: one rate for every row
  CHECK(step_estimate(spec, in, stored, 1, rates).components.at("optimizer") ==
        Approx(step_estimate(spec, in, derived, 1, rates).components.at("optimizer")).epsilon(1e-12));
}

TEST_CASE("step model: a GPU's GEMMs at the table's efficiency, MFU against the datasheet peak", "[estimate][step-model]") {
  const std::string config = testing::source_path("recipes/configs/llama-3.1-8b/config.json");
  const std::string model = "--model " + config + " model.dtype=bf16 data.sequence_len=2048 --gpu 'H100 SXM' --host-memory 2TiB";
  const double per_token = model_flops_per_token(model_spec_build(hf_config_load(config), DType::bf16), 2048);
  const std::optional<GpuSpec> h100 = gpu_spec_find("H100 SXM");
  REQUIRE(h100);
  CHECK(h100->gemm_efficiency == 0.75);
  for (const GpuSpec& g : gpu_specs()) CHECK((g.gemm_efficiency >= 0.5 && g.gemm_efficiency <= 0.95));
  const nlohmann::json table = testing::estimate_json(model);
  CHECK(table["step"]["rates"]["device"]["value"].get<double>() == Approx(0.75 * 989e12).epsilon(1e-12));
  CHECK(table["step"]["mfu"].get<double>() ==
        Approx(table["step"]["tokens_per_s"].get<double>() * per_token / 989e12).epsilon(1e-9));
  // --gpu-flops: the rate the GEMMs run at; MFU still against the datasheet's 989 TFLOP/s
  const nlohmann::json given = testing::estimate_json(model + " --gpu-flops 700e12");
  CHECK(given["step"]["rates"]["device"]["value"].get<double>() == 700e12);
  CHECK(given["step"]["rates"]["device"]["source"] == "given");
  CHECK(given["step"]["mfu"].get<double>() ==
        Approx(given["step"]["tokens_per_s"].get<double>() * per_token / 989e12).epsilon(1e-9));
}

TEST_CASE("step model: a CUDA device's bf16 attention at its measured share of the GEMM rate", "[estimate][step-model]") {
  const ModelSpec spec = tiny_spec();  // bf16
  PlanInputs in = tiny_inputs();
  const RunPlan plan = placement_plan(spec, in, PlanBudgets{});
  const StepRates rates = step_model_fixtures::compute_rates();
  const StepEstimate host = step_estimate(spec, in, plan, 3, rates);  // not a CUDA device: the GEMM rate
  in.device_is_cuda = true;
  const StepEstimate cuda = step_estimate(spec, in, plan, 3, rates);
  REQUIRE(host.compute_parts.at("attention") > 0);
  CHECK(cuda.compute_parts.at("attention") ==
        Approx(host.compute_parts.at("attention") / kCudaAttentionGemmFraction).epsilon(1e-12));
  CHECK(cuda.compute_parts.at("matmul") == host.compute_parts.at("matmul"));
  CHECK(cuda.compute_parts.at("head") == host.compute_parts.at("head"));
  CHECK(cuda.components.at("compute") ==
        Approx(host.components.at("compute") + cuda.compute_parts.at("attention") - host.compute_parts.at("attention"))
            .epsilon(1e-12));
  // an attention rate of its own (measured, given) is kept
  StepRates own = rates;
  own.attention_flops_per_s = 5e11;
  CHECK(step_device_rates(spec, in, own).attention_flops_per_s == 5e11);
  // f32 weights: attention on CUDA cores, like the GEMMs: at the GEMM rate
  const ModelSpec f32 = model_spec_build(testing::tiny_llama_config({1024, 4096, 4, 32768, 4096, false, 8, 8}), DType::f32);
  CHECK(step_device_rates(f32, in, rates).attention_flops_per_s == 0);
  // strata estimate --gpu: the rate stated beside the others, the attention priced at it
  const std::string config = testing::source_path("recipes/configs/llama-3.1-8b/config.json");
  const nlohmann::json e = testing::estimate_json("--model " + config + " model.dtype=bf16 --gpu H200 --host-memory 2TiB");
  const double device = e["step"]["rates"]["device"]["value"].get<double>();
  CHECK(e["step"]["rates"]["attention"]["value"].get<double>() == Approx(kCudaAttentionGemmFraction * device).epsilon(1e-12));
  CHECK(e["step"]["rates"]["attention"]["source"].get<std::string>().find("H200") != std::string::npos);
}

}  // namespace strata
