#include "offload/plan/placement_plan.h"

#include "offload/plan/layer_probe.h"

#include "offload/stream/checkpoint_spill.h"
#include "offload/state/nvme_state.h"

#include <algorithm>
#include <cstdio>
#include <optional>

#include "offload/stream/engine_buffers.h"
#include "offload/engine/engine_zo.h"
#include "offload/engine/generator.h"
#include "offload/engine/token_scorer.h"
#include "offload/state/host_store.h"
#include "offload/state/optimizer.h"
#include "src/core/error.h"
#include "src/core/process_memory.h"
#include "src/core/threads.h"
#include "src/device/arena.h"
#include "src/device/device.h"
#include "src/device/peak_flops.h"

namespace strata {
namespace {

// The engine keeps this much of the device budget free when "auto" fills it with checkpoints
// (offload/engine/engine.cpp, device_checkpoint_count).
constexpr size_t kDeviceMargin = size_t(1) << 20;

// The device rows of the engine's table, gathered into the kinds the plan prints.
const char* device_kind(const std::string& row) {
  auto starts = [&](const char* p) { return row.rfind(p, 0) == 0; };
  if (starts("layer weight slot") || starts("perturbed layer")) return "device layer weight slots";
  if (starts("perturbed")) return "device head weights (final norm, lm_head)";  // zo-sgd's perturbed copies
  if (starts("layer forward workspace")) return "device layer workspace";
  if (starts("lm_head gradient") || starts("layer gradient slot") || starts("final norm gradient"))
    return "device gradient slots";
  if (starts("lm_head") || starts("final norm weight")) return "device head weights (final norm, lm_head)";
  if (starts("layer workspace")) return "device layer workspace";
  if (starts("LoRA")) return "device LoRA adapters and their gradients";
  if (starts("KV cache")) return "device KV cache (layers and cache slots)";
  return "device activations and token buffers";
}

void check_inputs(const PlanInputs& in, const PlanBudgets& b) {
  STRATA_CHECK(in.micro_batch >= 1 && in.sequence_len >= 1, "micro_batch_size (", in.micro_batch,
               ") and sequence_len (", in.sequence_len, ") must be at least 1");
  STRATA_CHECK(in.moments == DType::f32 || in.moments == DType::bf16, "AdamW moments are f32 or bf16, not ",
               dtype_name(in.moments));
  STRATA_CHECK(in.save_dtype == DType::f32 || in.save_dtype == DType::bf16, "the export dtype is f32 or bf16, not ",
               dtype_name(in.save_dtype));
  STRATA_CHECK(optimizer_state_needs(in.optimizer_kind).moments || in.optimizer != StateTier::nvme,
               "offload.optimizer = \"nvme\" places AdamW moments, and optim.type = \"",
               optimizer_kind_name(in.optimizer_kind), "\" keeps none (its fp32 master stays in RAM): set "
               "offload.optimizer = \"host\"");
  const char* nvme_dir = " = \"nvme\" needs offload.nvme_path: a directory on an NVMe drive where strata may keep its files";
  STRATA_CHECK(in.optimizer != StateTier::nvme || !b.nvme_dir.empty(), "offload.optimizer", nvme_dir);
  STRATA_CHECK(in.checkpoints != CheckpointMode::nvme || !b.nvme_dir.empty(), "offload.checkpoints", nvme_dir);
}

// The decisions the inputs make at group g (weights resolved), before the tiers are chosen.
RunPlan plan_decisions(const PlanInputs& in, int64_t group, const PlanBudgets& budgets) {
  RunPlan p;
  p.budgets = budgets;
  p.optimizer_kind = in.optimizer_kind;
  p.lora = in.lora;
  p.router_aux_loss = in.router_aux_loss;
  // the zeroth-order engine always streams (its weights change every step)
  p.weights = in.optimizer_kind == OptimizerKind::zo_sgd ? WeightsMode::stream : in.weights;
  p.resident_layers = p.weights == WeightsMode::stream && in.optimizer_kind != OptimizerKind::zo_sgd
                          ? size_t(std::max<int64_t>(0, in.resident_layers))
                          : 0;
  p.checkpoints = in.checkpoints;
  p.recompute = in.recompute;
  p.moments = in.moments;
  p.micro_batch = in.micro_batch;
  p.sequence_len = in.sequence_len;
  p.accumulation_steps = in.accumulation_steps;
  p.group = group;
  p.head_chunk_rows = in.head_chunk_rows;
  return p;
}

}  // namespace

EngineShape placement_engine_shape(const ModelSpec& spec, const HostStoreLayout& layout, const PlanInputs& in,
                                   int64_t group) {
  EngineOptions eo = run_plan_engine_options(plan_decisions(in, group, PlanBudgets{}));
  if (eo.checkpoints == CheckpointMode::nvme) eo.checkpoints = CheckpointMode::host;  // spilled rows, then moved by the plan
  // zo-sgd runs its own engine (offload/engine/engine_zo.h): forward passes only, no checkpoints
  return in.optimizer_kind == OptimizerKind::zo_sgd ? zo_engine_shape(spec, eo) : EngineShape::of(spec, layout, eo);
}

namespace {

// What every part of one plan reads: the store's tables and the engine's buffer table (the
// same functions the allocation runs), and the plan being filled.
struct PlanParts {
  const ModelSpec& spec;
  const PlanInputs& in;
  RunPlan& p;
  const HostStoreLayout& layout;
  OptimizerStateNeeds needs;
  bool zo = false;  // its own engine: forward passes only, no checkpoints
  EngineShape shape;
  std::vector<EngineBuffer> table, ckpt;  // the engine's rows; the layer checkpoints' rows
  size_t L = 0, act = 0;
  void add(std::string kind, Tier tier, size_t bytes) { p.states.push_back({std::move(kind), tier, bytes}); }
};

// The device bytes outside the engine's table a CUDA device takes: its own workspaces at the first
// GEMM and loss; the engine leaves them free (Engine::device_bytes_left), so the plan counts them
// before the checkpoints and kept rows.
size_t device_outside_table(const PlanInputs& in, const EngineShape& shape) {
  return in.device_is_cuda ? cuda_backend_workspace_bytes(shape.C, shape.head_rows) : 0;
}

// -- device: the engine's rows, then the checkpoints the engine keeps there, then kept activations
// and logits from what the budget leaves. Fills x.ckpt.
void plan_device(PlanParts& x, const PlanBudgets& budgets) {
  RunPlan& p = x.p;
  const EngineShape& shape = x.shape;
  const size_t L = x.L, act = x.act;
  const bool zo = x.zo;
  std::vector<std::pair<std::string, size_t>> device_rows;
  for (const EngineBuffer& b : x.table) {
    if (b.memory != Memory::device) continue;
    const std::string kind = device_kind(b.name);
    auto it = std::find_if(device_rows.begin(), device_rows.end(), [&](auto& r) { return r.first == kind; });
    if (it == device_rows.end()) device_rows.emplace_back(kind, 0), it = device_rows.end() - 1;
    it->second += Arena::footprint(b.bytes);
  }
  const size_t backend_ws = device_outside_table(x.in, shape);
  if (backend_ws) device_rows.emplace_back("CUDA backend workspaces (cuBLAS, lm_head loss)", backend_ws);
  if (x.in.device_reserve_bytes)
    device_rows.emplace_back("GPU context reserve (CUDA context, driver and library buffers)", x.in.device_reserve_bytes);
  const size_t device_fixed = engine_device_bytes(x.table) + backend_ws + x.in.device_reserve_bytes;
  if (zo) {
    // no layer checkpoints: nothing goes back
  } else if (shape.checkpoints == CheckpointMode::device) {
    p.device_checkpoints = L;
  } else if (shape.checkpoints == CheckpointMode::automatic) {
    const size_t used = device_fixed + kDeviceMargin;
    const size_t left = budgets.device_bytes == 0 ? SIZE_MAX : budgets.device_bytes > used ? budgets.device_bytes - used : 0;
    p.device_checkpoints = std::min<size_t>(L, left / (shape.group * Arena::footprint(act)));  // a layer's g inputs
  }
  x.ckpt = zo ? std::vector<EngineBuffer>{} : engine_checkpoint_table(shape, p.device_checkpoints, nullptr);
  const std::vector<EngineBuffer>& ckpt = x.ckpt;
  for (auto& [kind, bytes] : device_rows) x.add(kind, Tier::device, bytes);
  if (p.device_checkpoints) x.add("layer checkpoints (device)", Tier::device, engine_device_bytes(ckpt));
  if (!zo) {  // offload.recompute: activations kept from what the budget leaves after the checkpoints
    const size_t used = device_fixed + engine_device_bytes(ckpt) + kDeviceMargin;
    const size_t left = budgets.device_bytes == 0 ? SIZE_MAX : budgets.device_bytes > used ? budgets.device_bytes - used : 0;
    p.kept_activation_layers = engine_kept_activation_layers(shape, left);
    const size_t kept = engine_device_bytes(engine_kept_activation_table(shape, p.kept_activation_layers, nullptr));
    if (kept) x.add("kept layer activations (device, no recompute)", Tier::device, kept);
    p.kept_logit_chunks = engine_kept_logit_chunks(shape, left > kept ? left - kept : 0);
    if (p.kept_logit_chunks) {
      const size_t first = shape.head_chunks - p.kept_logit_chunks;
      p.kept_logit_rows = size_t(shape.V) - first * size_t(shape.head_rows);
      x.add("kept lm_head logits (device, no recompute)", Tier::device,
          engine_device_bytes(engine_kept_logits_table(shape, p.kept_logit_chunks, nullptr)));
    }
  }

}

// -- host: the process, the data, the store's arrays, the engine's pinned buffers, NVMe's own.
void plan_host(PlanParts& x, const PlanChoice& choice) {
  RunPlan& p = x.p;
  const ModelSpec& spec = x.spec;
  const PlanInputs& in = x.in;
  const EngineShape& shape = x.shape;
  const OptimizerStateNeeds& needs = x.needs;
  const HostStoreLayout& layout = x.layout;
  const size_t L = x.L, act = x.act;
  size_t device_total = 0;
  for (const PlanState& s : p.states) device_total += s.bytes;
  x.add("process baseline (code, libraries, tokenizer)", Tier::host, in.baseline_bytes);
  x.add("tokenized data rows and order", Tier::host, in.data_bytes);
  if (in.device_in_host_ram) {
    x.add("device arena (CPU backend: process memory)", Tier::host, device_total);
    const LayerDims& d = shape.layer_capacity;
    const size_t scratch = cpu_backend_scratch_bytes({d.B, d.T, d.H, d.Hk, d.D, shape.C, shape.head_rows, d.F, d.wt});
    if (scratch) x.add("CPU kernel scratch (attention inputs, dS, loss tiles, GEMM tiles)", Tier::host, scratch);
  }
  const size_t f32_bytes = layout.f32.tier_bytes(Tier::host);
  const bool frozen = in.lora.enabled();
  const bool aliased = spec.matrix_dtype == DType::f32 && in.f32_master_shared;
  // a split: the groups before the first on NVMe keep their state in RAM (all of them without NVMe)
  const size_t first = choice.optimizer_nvme ? choice.optimizer_first_group : layout.groups.size();
  HostStoreOptions derived;  // the store's own count of the layers it derives
  derived.derived_working = choice.derive_working;
  derived.state_on_nvme = choice.optimizer_nvme;
  derived.nvme_first_group = first;
  p.derived_working = choice.derive_working;
  p.derived_working_layers = derived_working_layers(layout, derived);
  const size_t working_bytes =
      layout.working.tier_bytes(Tier::host_pinned) - derived_working_bytes(layout, p.derived_working_layers);
  if (layout.packed) {  // an NF4 base (offload/state/nf4_layout.h): the decoder layers apart from the rest
    size_t layers = 0;
    for (size_t l = 0; l < L; ++l) layers += layout.groups[1 + l].working_bytes;
    x.add(str_cat("working weights: decoder layers (NF4", spec.base_quant.double_quant ? ", double-quantized" : "",
                  "; norms ", dtype_name(DType::f32), ")"), Tier::host_pinned, layers);
    x.add(str_cat("working weights: embeddings, final norm, lm_head (", dtype_name(spec.matrix_dtype), ")"),
          Tier::host_pinned, working_bytes - layers);
  } else {
    x.add(str_cat("working weights (", dtype_name(spec.matrix_dtype), ")"), Tier::host_pinned, working_bytes);
  }
  if (in.reference_copy)
    x.add(str_cat("GRPO reference weights (frozen copy of the start, ", dtype_name(spec.matrix_dtype), ")"),
          Tier::host_pinned, layout.working.tier_bytes(Tier::host_pinned));
  if (p.derived_working_layers)
    x.add(kDerivedStagingKind, Tier::host_pinned, derived_staging_bytes(layout, p.derived_working_layers));
  const size_t ram_f32 = f32_prefix_bytes(layout, first), nvme_f32 = f32_bytes - ram_f32;
  auto moments_of = [&](size_t f32) { return needs.moments && !frozen ? 2 * (f32 / 4) * dtype_size(in.moments) : 0; };
  const std::string moments_kind = str_cat("AdamW moments (", dtype_name(in.moments), " m and v)");
  const std::string on_nvme =
      first == 0 || !choice.optimizer_nvme ? "" : str_cat(" (groups ", layout.groups[first].name, " to head)");
  if (frozen) {  // LoRA: nothing for the base beyond its working copy
    const LoraHostBytes lb = LoraStore::host_bytes(LoraLayout::of(spec, in.lora));
    x.add("LoRA adapters: fp32 master, AdamW m and v", Tier::host, lb.state);
    x.add("LoRA adapters: gradient and device image", Tier::host_pinned, lb.pinned);
  } else {
    if (needs.grads) x.add("fp32 gradient accumulation", Tier::host_pinned, grad_buffer_bytes(layout, p.grads_in_flight));
    if (aliased) {
      x.add("fp32 master weights (the f32 working copy)", first == 0 ? Tier::nvme : Tier::host, 0);
    } else {
      if (first > 0) x.add("fp32 master weights", Tier::host, ram_f32);
      if (choice.optimizer_nvme) x.add("fp32 master weights" + on_nvme, Tier::nvme, nvme_f32);
    }
    if (needs.moments) {
      if (first > 0) x.add(moments_kind, Tier::host, moments_of(ram_f32));
      if (choice.optimizer_nvme) x.add(moments_kind + on_nvme, Tier::nvme, moments_of(nvme_f32));
    }
  }
  x.add(x.zo ? "pinned staging (embedding outputs)" : "pinned staging (activations, gradients)", Tier::host_pinned,
      engine_pinned_bytes(x.table));
  const size_t spilled = engine_pinned_bytes(x.ckpt);
  const bool ckpt_nvme = in.checkpoints == CheckpointMode::nvme || choice.checkpoints_nvme;
  if (spilled) {
    (ckpt_nvme ? p.nvme_checkpoints : p.host_checkpoints) = L - p.device_checkpoints;
    x.add(ckpt_nvme ? "layer checkpoints (NVMe)" : "layer checkpoints (pinned host)", ckpt_nvme ? Tier::nvme : Tier::host_pinned,
        spilled);
    if (ckpt_nvme) {  // the engine's ring of pinned buffers and the spill's file-engine staging
      x.add(str_cat("NVMe checkpoint staging (", kSpillRing, " x activations)"), Tier::host_pinned, kSpillRing * act);
      x.add("NVMe checkpoint file staging", Tier::host, CheckpointSpill::host_bytes());
    }
  }
  if (choice.speculate_end_group > choice.speculate_first_group)
    x.add(kSpeculationBackupKind, Tier::host,
          speculation_backup_bytes(layout, in.moments, choice.speculate_first_group, choice.speculate_end_group));
  if (choice.optimizer_nvme) {  // the placement's own sizes (offload/state/nvme_state.h): files, window, staging
    HostStoreOptions so;
    so.state_on_nvme = true;
    so.nvme_first_group = first;
    so.moments = in.moments;
    const NvmeStateSizes ns = nvme_state_sizes(layout, so, !aliased);
    x.add("NVMe optimizer pipeline (window of master, m, v ranges; file staging)", Tier::host, ns.host_bytes);
    const size_t listed = (aliased ? 0 : nvme_f32) + moments_of(nvme_f32);
    if (ns.file_bytes > listed) x.add("NVMe files: each group rounded to whole blocks", Tier::nvme, ns.file_bytes - listed);
  }

}

// -- transients: one phase at a time, so the tier holds the largest.
void plan_transients(PlanParts& x) {
  RunPlan& p = x.p;
  const ModelSpec& spec = x.spec;
  const PlanInputs& in = x.in;
  size_t max_numel = 0;
  for (const TensorSpec& r : spec.params.rows()) max_numel = std::max(max_numel, size_t(r.numel()));
  const size_t tensor_f32 = max_numel * 4;
  // loading: one tensor converted to f32, plus its mapped file pages (released per tensor; f32
  // on disk at most)
  if (in.load_from_dir) p.transients.push_back({"reading the model dir (one tensor)", Tier::host, 2 * tensor_f32});
  else p.transients.push_back({"weight initialisation (one tensor)", Tier::host, tensor_f32});
  if (in.resume)  // the same per tensor, plus data_order.bin read whole and its check's bitmap
    p.transients.push_back({"resuming (one tensor, the data order)", Tier::host,
                            2 * tensor_f32 + in.data_rows * 8 + in.data_rows / 8 + 8});
  if (in.device_in_host_ram) {  // the CPU backend measures its GEMM peak (src/device/peak_flops.h)
    const size_t n2 = size_t(kCpuPeakGemmSize) * kCpuPeakGemmSize;
    p.transients.push_back({"measuring the CPU GEMM peak (3 matrices)", Tier::host,
                            n2 * 12 + (spec.matrix_dtype == DType::bf16 ? n2 * 4 : 0)});
    // and its rates at the model's shapes, which the plan is priced at (offload/plan/layer_probe.h)
    if (const size_t probe = LayerProbe::host_bytes(spec, x.layout, in))
      p.transients.push_back({"probing a layer's rates (one layer, one lm_head chunk)", Tier::host, probe});
  }
  const size_t export_bytes =
      tensor_f32 + (in.save_dtype == DType::f32 ? 0 : std::min(max_numel, kExportChunkElements) * dtype_size(in.save_dtype));
  p.transients.push_back({"exporting the HF model (one tensor)", Tier::host, export_bytes});
  p.transients.push_back({"saving a checkpoint (export, then the manifest)", Tier::host,
                          std::max(export_bytes, kManifestReadBytes)});
  const auto largest = std::max_element(p.transients.begin(), p.transients.end(),
                                        [](const PlanState& a, const PlanState& b) { return a.bytes < b.bytes; });
  x.add(str_cat("transient buffers (largest: ", largest->kind.substr(0, largest->kind.find(" (")), ")"), Tier::host,
      largest->bytes);

}

// -- GRPO's phases beside the engine (PlanInputs::grpo): one at a time, the tier holds the larger.
// Counted after the engine's rows: the kept activations and logits are what the budget leaves the
// engine (as Engine::device_bytes_left decides them at run time), so a budget they fill leaves the
// phases no room, and the plan says so (or the search takes a variant that keeps fewer).
// {sampling, reference} device bytes (0, 0 without GRPO).
std::pair<size_t, size_t> grpo_phase_bytes(const ModelSpec& spec, const PlanInputs& in) {
  if (!in.grpo) return {0, 0};
  size_t gen = generator_min_device_bytes(spec, in.grpo_generator);
  if (in.lora.enabled())
    gen += Generator::lora_device_bytes(spec, in.grpo_generator, {in.lora.r, LoraLayout::of(spec, in.lora).bytes});
  const size_t ref = in.grpo_reference_rows > 0
                         ? token_scorer_device_bytes(spec, in.grpo_reference_rows, in.grpo_reference_tokens) : 0;
  return {gen, ref};
}

void plan_grpo_phases(PlanParts& x) {
  if (!x.in.grpo) return;
  RunPlan& p = x.p;
  const auto [gen, ref] = grpo_phase_bytes(x.spec, x.in);
  p.transients.push_back({"GRPO sampling: the generator (weights streamed, KV cache spilled)", Tier::device, gen});
  if (ref) p.transients.push_back({"GRPO reference pass: its buffers", Tier::device, ref});
  p.grpo_phase_device_bytes = std::max(gen, ref);
  x.add(str_cat("GRPO phases beside the engine (largest: ", gen >= ref ? "sampling" : "the reference pass", ")"),
        Tier::device, p.grpo_phase_device_bytes);
}

// -- what does not fit.
void plan_problems(RunPlan& p, const PlanBudgets& budgets) {
  const auto& b = budgets;
  if (b.device_bytes && p.tier(Tier::device) > b.device_bytes)
    p.problems.push_back(str_cat("the device budget of ", format_bytes(b.device_bytes), " (", b.device_origin,
                                 ") is too small: this model and micro-batch need at least ",
                                 format_bytes(p.tier(Tier::device))));
  if (b.host_bytes && p.host_total() > b.host_bytes)
    p.problems.push_back(str_cat("host memory needs ", format_bytes(p.host_total()), " (", format_bytes(p.tier(Tier::host_pinned)),
                                 " of it pinned), more than the budget of ", format_bytes(b.host_bytes), " (",
                                 b.host_origin, ")"));
  if (b.nvme_bytes && p.tier(Tier::nvme) > b.nvme_bytes)
    p.problems.push_back(str_cat("NVMe needs ", format_bytes(p.tier(Tier::nvme)), ", more than offload.nvme_memory (",
                                 format_bytes(b.nvme_bytes), ")"));
}


}  // namespace


bool placement_grads_in_flight(const PlanInputs& in, int64_t group, bool norm_pass) {
  return in.optimizer_kind == OptimizerKind::adamw && !in.lora.enabled() && (!in.clip_grad || norm_pass) &&
         in.ranks == 1 && group == std::max<int64_t>(1, in.accumulation_steps);
}

std::string placement_norm_pass_obstacle(const PlanInputs& in, int64_t group) {
  if (!in.clip_grad) return "without clipping (optim.max_grad_norm = 0) every group updates as it lands already";
  if (in.optimizer_kind != OptimizerKind::adamw) return "zo-sgd keeps no gradients";
  if (in.lora.enabled()) return "LoRA's adapters take their norm in one piece (they are small)";
  if (in.ranks > 1) return "several ranks reduce each micro-batch's gradients through the host store";
  if (in.pair_rows > 1 || in.grpo) return "a preference or GRPO objective runs its own step";
  if (group != std::max<int64_t>(1, in.accumulation_steps))
    return "it needs one pass a step: offload.accumulation = \"layer_major\", or one micro-batch a step";
  return "";
}

std::string placement_derived_working_obstacle(const ModelSpec& spec, const PlanInputs& in) {
  if (in.lora.enabled()) return "LoRA keeps the frozen base's working copy alone (no master to make it from)";
  if (in.optimizer_kind != OptimizerKind::adamw) return "zo-sgd perturbs and updates the working copy itself";
  if (spec.matrix_dtype != DType::bf16) return "with f32 weights the master is the working copy already";
  if (in.ranks > 1) return "several ranks share or reduce through the host store";
  return "";
}

size_t speculation_backup_bytes(const HostStoreLayout& layout, DType moments, size_t first, size_t end) {
  size_t bytes = 0;
  for (size_t g = first; g < end && g < layout.groups.size(); ++g)
    bytes += layout.groups[g].f32_bytes / 4 * (4 + 2 * dtype_size(moments));
  return bytes;
}

RunPlan placement_plan_at(const ModelSpec& spec, const PlanInputs& in, int64_t group, const PlanBudgets& budgets,
                          const PlanChoice& choice, const HostStoreLayout* layout) {
  std::optional<HostStoreLayout> own;
  if (!layout) layout = &own.emplace(HostStore::layout(spec));
  check_inputs(in, budgets);
  STRATA_ASSERT(in.weights != WeightsMode::automatic, "placement_plan_at needs the weights decided");
  RunPlan p = plan_decisions(in, group, budgets);
  p.optimizer_on_nvme = choice.optimizer_nvme;
  p.optimizer_nvme_first_group = choice.optimizer_nvme ? choice.optimizer_first_group : 0;
  if (choice.speculate_end_group > choice.speculate_first_group) {
    STRATA_ASSERT(choice.speculate_first_group >= 1 && in.optimizer_kind == OptimizerKind::adamw && !in.lora.enabled() &&
                      (!choice.optimizer_nvme || choice.speculate_end_group <= choice.optimizer_first_group),
                  "speculation covers RAM groups after the embedding, AdamW, not LoRA");
    p.speculate_first_group = choice.speculate_first_group;
    p.speculate_end_group = choice.speculate_end_group;
  }
  STRATA_ASSERT(!choice.derive_working || placement_derived_working_obstacle(spec, in).empty(),
                "derived working weights where they do not apply: ", placement_derived_working_obstacle(spec, in));
  STRATA_ASSERT(!choice.norm_pass || placement_norm_pass_obstacle(in, group).empty(),
                "a norm pass where it does not apply: ", placement_norm_pass_obstacle(in, group));
  p.norm_pass = choice.norm_pass;
  p.grads_in_flight = placement_grads_in_flight(in, group, choice.norm_pass);
  PlanParts x{spec, in, p, *layout, optimizer_state_needs(in.optimizer_kind)};
  x.zo = in.optimizer_kind == OptimizerKind::zo_sgd;
  x.shape = placement_engine_shape(spec, x.layout, in, group);
  x.table = x.zo ? zo_buffer_table(x.shape, nullptr) : engine_buffer_table(x.shape, nullptr);
  x.L = x.shape.layers;
  x.act = x.shape.activation_bytes();
  p.layers = x.L;
  plan_device(x, budgets);
  plan_host(x, choice);
  plan_transients(x);
  plan_grpo_phases(x);
  for (const PlanState& s : p.states) p.tiers[int(s.tier)] += s.bytes;
  plan_problems(p, budgets);
  if (p.nvme_checkpoints > 0) p.checkpoints = CheckpointMode::nvme;  // what the plan spilled there
  return p;
}

namespace {

std::string padded(std::string s, size_t width) {
  if (s.size() < width) s.resize(width, ' ');
  return s;
}

}  // namespace

size_t RunPlan::bytes_of(const std::string& kind) const {
  for (const PlanState& s : states)
    if (s.kind == kind) return s.bytes;
  return 0;
}

std::string placement_layer_major_obstacle(const ModelSpec& spec, const PlanInputs& in) {
  if (in.optimizer_kind == OptimizerKind::zo_sgd) return "";  // no gradients: only the branches' hidden states
  if (in.ranks > 1) return "data parallel runs all-reduce each micro-batch's gradient (one rank only in this version)";
  if (spec.lm_head == kAbsent && !in.lora.enabled())
    return "a tied lm_head's gradient shares the embedding's rows with every micro-batch's scatter-add, so a sum "
           "over the step on the device would change the order of the additions";
  if (in.recompute == RecomputeMode::never)
    return "offload.recompute = \"never\" keeps one micro-batch's activations per layer, and a layer-major pass "
           "runs several through each layer";
  return "";
}

int64_t placement_layer_major_group(const PlanInputs& in) {
  if (in.optimizer_kind == OptimizerKind::zo_sgd) return in.accumulation_steps * std::max<int64_t>(1, in.zo_perturbations);
  return in.accumulation_steps;
}

HostStoreOptions run_plan_store_options(const RunPlan& plan) {
  HostStoreOptions so;
  if (plan.generation.active) {  // nothing trains: the working copy alone
    so.weights_only = true;
    return so;
  }
  so.needs = optimizer_state_needs(plan.optimizer_kind);  // zo-sgd: no moments, no gradients
  so.moments = plan.moments;
  so.weights_only = plan.lora.enabled();  // LoRA: the base keeps its working copy alone
  so.state_on_nvme = plan.optimizer_on_nvme;
  so.nvme_first_group = plan.optimizer_nvme_first_group;
  so.nvme_path = plan.budgets.nvme_dir;
  so.nvme_budget_bytes = plan.budgets.nvme_bytes;
  so.derived_working = plan.derived_working;
  so.grads_in_flight = plan.grads_in_flight;
  return so;
}

size_t placement_max_resident_layers(const ModelSpec& spec, const PlanInputs& in, int64_t group,
                                     const PlanBudgets& budgets) {
  PlanInputs s = in;
  s.weights = WeightsMode::stream;
  s.resident_layers = 0;
  const HostStoreLayout layout = HostStore::layout(spec);
  const EngineShape shape = placement_engine_shape(spec, layout, s, group);
  if (budgets.device_bytes == 0) return shape.layers;
  const size_t fixed = engine_device_bytes(engine_buffer_table(shape, nullptr)) + device_outside_table(s, shape) +
                       s.device_reserve_bytes + kDeviceMargin;
  size_t room = budgets.device_bytes > fixed ? budgets.device_bytes - fixed : 0, n = 0;
  // a resident layer's slot is its own (sized as the engine sizes it with every layer resident);
  // the streamed ones keep min(2, the rest) shared slots
  s.resident_layers = int64_t(shape.layers);
  const EngineShape all = placement_engine_shape(spec, layout, s, group);
  const size_t max_w = shape.slot_bytes.empty() ? 0 : shape.slot_bytes.front();
  for (; n < shape.layers; ++n) {
    size_t add = Arena::footprint(all.slot_bytes[n]);
    if (shape.layers - n <= 2) add -= std::min(add, Arena::footprint(max_w));  // one shared slot fewer
    if (add > room) break;
    room -= add;
  }
  return n;
}

EngineOptions run_plan_engine_options(const RunPlan& plan) {
  EngineOptions eo;
  eo.weights = plan.weights;
  eo.resident_layers = plan.weights == WeightsMode::stream ? plan.resident_layers : 0;
  eo.checkpoints = plan.checkpoints;
  eo.recompute = plan.recompute;
  eo.nvme_dir = plan.budgets.nvme_dir;
  eo.nvme_budget_bytes = plan.budgets.nvme_bytes;
  eo.max_batch = plan.micro_batch;
  eo.max_tokens = plan.sequence_len;
  eo.head_chunk_rows = plan.head_chunk_rows;
  eo.lora = plan.lora;
  eo.router_aux_loss = plan.router_aux_loss;
  eo.group = plan.group;
  eo.speculate_first_group = plan.speculate_first_group;
  eo.speculate_end_group = plan.speculate_end_group;
  return eo;
}

std::string placement_plan_table(const RunPlan& p) {
  size_t width = 56;  // the kind column, as wide as its longest entry (and a space)
  for (const PlanState& s : p.states) width = std::max(width, s.kind.size() + 1);
  std::string out = str_cat(padded("  kind of state", width + 2), padded("tier", 13), "bytes\n");
  for (const PlanState& s : p.states)
    out += str_cat("  ", padded(s.kind, width), padded(tier_name(s.tier), 13), format_bytes(s.bytes), "\n");
  out += "  transient phases (one at a time):";
  for (const PlanState& t : p.transients) out += str_cat(" ", t.kind, " ", format_bytes(t.bytes), ";");
  out.back() = '\n';
  auto of = [](size_t budget) { return budget ? str_cat(" of ", format_bytes(budget)) : std::string(); };
  out += str_cat("  totals: device ", format_bytes(p.tier(Tier::device)), of(p.budgets.device_bytes), ", host ",
                 format_bytes(p.host_total()), of(p.budgets.host_bytes), " (", format_bytes(p.tier(Tier::host_pinned)),
                 " pinned), nvme ", format_bytes(p.tier(Tier::nvme)), of(p.budgets.nvme_bytes), "\n");
  out += str_cat("  layer checkpoints: ", p.device_checkpoints, " on the device, ", p.host_checkpoints, " in pinned host, ",
                 p.nvme_checkpoints, " on NVMe (of ", p.layers, "); activations kept (no recompute) for ",
                 p.kept_activation_layers, " layers, lm_head logits for ", p.kept_logit_chunks, " chunks\n");
  return out;
}

namespace {
std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g s", s);
  return buf;
}
}  // namespace

std::string placement_change_text(const PlanChange& c) {
  std::string t = c.what;
  const char* of = c.tier == Tier::device ? " of device memory" : c.tier == Tier::nvme ? " of NVMe" : " of host memory";
  if (c.saves_bytes) t += str_cat(": saves ", format_bytes(c.saves_bytes), of);
  if (c.step_seconds > 0) t += str_cat(c.saves_bytes ? ", " : ": ", "a step of ", seconds_text(c.step_seconds));
  if (!c.fits) t += " (not enough alone)";
  return t;
}

void placement_plan_check(const RunPlan& p) {
  if (p.fits()) return;
  std::string msg = "the run does not fit:";
  for (const std::string& problem : p.problems) msg += "\n  " + problem;
  msg += "\nThe plan:\n" + placement_plan_table(p) + "What to change:";
  for (const PlanChange& c : p.changes) msg += "\n  - " + placement_change_text(c);
  STRATA_CHECK_BUDGET(false, msg);
}

nlohmann::json placement_plan_json(const RunPlan& p) {
  nlohmann::json tiers = nlohmann::json::object();
  for (Tier t : {Tier::device, Tier::host, Tier::host_pinned, Tier::nvme}) tiers[tier_name(t)] = p.tier(t);
  nlohmann::json states = nlohmann::json::array();
  for (const PlanState& s : p.states) states.push_back({{"kind", s.kind}, {"tier", tier_name(s.tier)}, {"bytes", s.bytes}});
  return {{"tiers", tiers}, {"states", states}};
}

void placement_host_budget(PlanBudgets& b, size_t host_memory_bytes, const std::string& host_memory) {
  if (host_memory_bytes > 0) {
    b.host_bytes = host_memory_bytes;
    b.host_origin = str_cat("offload.host_memory = \"", host_memory, "\"");
  } else {
    b.host_bytes = host_memory_available();
    b.host_origin = "the machine's available memory (MemAvailable in /proc/meminfo; offload.host_memory is unset)";
  }
}

// ---- a generation run ----------------------------------------------------------------------

namespace {

// The generator's rows as the plan's states: device rows by kind, the CPU backend's arena in
// process memory, the working weights and the pinned rows (spilled KV cache, embedding output).
void generation_states(RunPlan& p, const ModelSpec& spec, const GenerationInputs& in) {
  const std::vector<EngineBuffer> table =
      generator_buffer_table(spec, p.generation.shape, p.generation.placement, nullptr);
  std::vector<std::pair<std::string, size_t>> device_rows;
  for (const EngineBuffer& b : table) {
    if (b.memory != Memory::device) continue;
    const std::string kind = device_kind(b.name);
    auto it = std::find_if(device_rows.begin(), device_rows.end(), [&](auto& r) { return r.first == kind; });
    if (it == device_rows.end()) device_rows.emplace_back(kind, 0), it = device_rows.end() - 1;
    it->second += Arena::footprint(b.bytes);
  }
  for (auto& [kind, bytes] : device_rows) p.states.push_back({kind, Tier::device, bytes});
  if (in.device_reserved_bytes)
    p.states.push_back({"device: held before generation, backend workspaces", Tier::device, in.device_reserved_bytes});
  if (in.device_in_host_ram)
    p.states.push_back({"device arena (CPU backend: process memory)", Tier::host, engine_device_bytes(table)});
  const HostStoreLayout layout = HostStore::layout(spec);
  p.states.push_back({str_cat("working weights (", dtype_name(spec.matrix_dtype), ")"), Tier::host_pinned,
                      layout.working.tier_bytes(Tier::host_pinned)});
  p.states.push_back({"generator pinned buffers (spilled KV cache, embedding output)", Tier::host_pinned,
                      engine_pinned_bytes(table)});
  for (const PlanState& st : p.states) p.tiers[int(st.tier)] += st.bytes;
}

}  // namespace

RunPlan placement_generation_plan(const ModelSpec& spec, const GenerationInputs& in, const PlanBudgets& budgets) {
  const GeneratorShape& asked = in.shape;
  STRATA_CHECK(asked.max_batch >= 1 && asked.max_prompt >= 1 && asked.max_context > asked.max_prompt,
               "generation needs at least one row, a prompt token and a position to generate");
  RunPlan p;
  p.budgets = budgets;
  p.layers = spec.layers.size();
  p.micro_batch = asked.max_batch;
  p.sequence_len = asked.max_prompt;
  p.generation.active = true;
  p.generation.shape = asked;
  GeneratorShape& shape = p.generation.shape;
  const size_t budget = budgets.device_bytes ? budgets.device_bytes : SIZE_MAX;
  const size_t left = budget > in.device_reserved_bytes ? budget - in.device_reserved_bytes : 0;
  while (shape.max_batch > 1 && generator_min_device_bytes(spec, shape) > left)
    shape.max_batch /= 2;  // fewer rows per pass before giving up
  if (!generator_choose_placement(spec, shape, left, &p.generation.placement)) {
    p.generation.placement = GeneratorPlacement{false, 0};  // the least, priced below
    const size_t least = generator_min_device_bytes(spec, shape) + in.device_reserved_bytes;
    p.problems.push_back(str_cat("generation needs ", format_bytes(least), " of device memory (weights streamed "
                                 "through two slots, the KV cache of ", shape.max_batch, " rows x ", shape.max_context,
                                 " positions spilled to host memory through two layer slots, ",
                                 format_bytes(in.device_reserved_bytes), " held before), the budget (",
                                 budgets.device_origin, ") is ", format_bytes(budgets.device_bytes)));
    p.changes.push_back({str_cat("raise ", budgets.device_origin, " to at least ", format_bytes(least),
                                 ", or lower --max-new-tokens, --batch-size or the prompt length"), 0});
  }
  p.micro_batch = shape.max_batch;
  p.weights = p.generation.placement.weights_resident ? WeightsMode::device : WeightsMode::stream;
  generation_states(p, spec, in);
  return p;
}

}  // namespace strata
