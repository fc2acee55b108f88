// The placement plan (DESIGN §2, §8a): ONE function from the model's tensor table, the run's
// plan inputs and the budgets (device, host, NVMe) to the tier and byte count of every kind of
// state a training run holds. The trainer calls it before anything large is allocated (and
// checks what the store and the engine then allocate against it); `strata estimate` calls the
// same function and allocates nothing.
//
// Where each kind of state goes, by how often it is touched:
//   working weights (read twice per micro-batch), fp32 gradients (every micro-batch)  pinned host
//   fp32 master, AdamW moments (once per optimizer step)      host, or NVMe when RAM is short
//                                                              ("auto" with an NVMe dir) or asked
//   (zo-sgd: working weights and the master alone, in RAM; the zeroth-order engine's device rows)
//   layer-input checkpoints                                    device while the device budget
//                                                              allows, then pinned host, then NVMe
//   device slots, workspace, pinned staging                   the engine's buffer table
//                                                              (offload/stream/engine_buffers.h), read
//                                                              row by row: no second model of them
// In f32 compute mode the master copy is the working copy (one f32 array, counted once).
//
// Peaks, not sums: loading weights, resuming, saving and exporting allocate transient buffers
// at different moments, so a tier's total is its resident states plus the LARGEST transient;
// `transients` lists each phase, and one "transient buffers" state carries the largest.
// The host tiers (host + host_pinned) are the process's whole resident set at its peak: the
// process baseline (code, libraries, tokenizer: VmRSS measured at plan time), the tokenized
// rows, and on the CPU backend the device arena itself, which lives in process memory.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/model_spec.h"
#include "offload/stream/engine_buffers.h"
#include "offload/modes.h"
#include "offload/state/lora.h"
#include "offload/state/model_io.h"
#include "offload/state/store_layout.h"
#include "src/core/tensor.h"

namespace strata {

// What the plan is computed for: the recipe's placement keys and shapes, typed (the recipe's
// strings are parsed once, src/recipe/recipe_plan.h). `automatic` values are the plan's to decide.
struct PlanInputs {
  WeightsMode weights = WeightsMode::stream;            // offload.weights (automatic: the plan resolves it)
  // offload.resident_layers with weights stream (or automatic): the first N decoder layers keep
  // their own device slot, the rest stream (EngineOptions::resident_layers); -1: none with
  // stream, the search's choice with automatic.
  int64_t resident_layers = -1;
  CheckpointMode checkpoints = CheckpointMode::automatic;  // offload.checkpoints
  RecomputeMode recompute = RecomputeMode::automatic;   // offload.recompute
  StateTier optimizer = StateTier::automatic;           // offload.optimizer (master + moments)
  // optim.type. It says which host arrays exist (optimizer_state_needs, offload/state/store_layout.h:
  // zo-sgd holds no moments and no gradients) and whose buffer table the device rows come from
  // (zo-sgd: the zeroth-order engine's, offload/engine/engine_zo.h; no checkpoints).
  OptimizerKind optimizer_kind = OptimizerKind::adamw;
  DType moments = DType::f32;        // AdamW m and v
  // Rows per micro-batch as the engine sees them (a preference objective's pairs: 2 per pair).
  int64_t micro_batch = 1, sequence_len = 1;
  // offload.accumulation over gradient_accumulation_steps micro-batches per step: layer_major runs
  // them through each layer together (the engine holds g = steps of every per-micro-batch buffer
  // and g checkpoints per layer: EngineOptions::group; zo-sgd: g = zo_perturbations x steps, two
  // branches' hidden states each); micro_batch one at a time; automatic: layer_major where it
  // applies (placement_layer_major_obstacle) and fits.
  AccumulationMode accumulation = AccumulationMode::micro_batch;
  int64_t accumulation_steps = 1;
  // offload.speculative_update: with clipping, the last groups' AdamW starts as their gradients
  // land, their master and moments backed up in host RAM (RunPlan::speculate_*); automatic: where
  // the step model finds it faster and the backup fits the host budget.
  SpeculateMode speculate = SpeculateMode::automatic;
  // offload.working_weights: derived makes the decoder layers' bf16 working copy from the RAM
  // master at each upload (HostStoreOptions::derived_working); AdamW full fine-tuning in bf16 on
  // one rank only; automatic: where the step model finds it faster or it is what fits.
  WorkingMode working = WorkingMode::automatic;
  // offload.norm_pass: clipping in two passes (placement_norm_pass_obstacle says where it applies);
  // automatic: where the step model finds it faster or it is what fits.
  NormPassMode norm_pass = NormPassMode::automatic;
  int ranks = 1;                     // data-parallel ranks (layer-major: one rank only)
  // optim.max_grad_norm > 0: the update waits for every gradient of the step (the global norm);
  // false: each group's update starts as its gradient lands in the last backward (trainer.cpp).
  bool clip_grad = true;
  int64_t zo_perturbations = 1;      // optim.zo_perturbations (zo-sgd: perturbations per step)
  int64_t head_chunk_rows = 0;       // 0: the engine's default (EngineOptions::head_chunk_rows)
  DType save_dtype = DType::bf16;    // checkpoint.save_dtype: the HF export's dtype
  bool load_from_dir = false;        // weights are read from safetensors (else initialised)
  bool resume = false;               // a checkpoint's optimizer state is read at start
  // f32 compute mode: true counts the master copy as the working copy (one f32 array); false
  // counts a separate f32 master, for a host store that still keeps two.
  bool f32_master_shared = true;
  bool device_in_host_ram = false;   // the CPU backend: the device arena is process memory, and
                                     // the MFU peak is measured with GEMMs in process memory
  bool device_is_cuda = false;       // a CUDA device: its own cuBLAS and lm_head_ce workspaces
                                     // come out of the budget too (cuda_backend_workspace_bytes)
  // What the device budget loses before strata allocates: a real GPU's CUDA context, the
  // driver's and libraries' own buffers and fragmentation (kGpuContextReserve where the budget
  // is a card's nominal memory). 0 where the budget is what strata's arena may take.
  size_t device_reserve_bytes = 0;
  // train.global_batch_size: rows per optimizer step across all ranks, in micro_batch's unit
  // before pair_rows (sequences; preference pairs). 0: the split is the recipe's. When set, a
  // micro_batch / accumulation_steps the recipe did not give (micro_batch_fixed,
  // accumulation_fixed) is the plan's to choose: micro_batch x accumulation_steps x ranks =
  // global_batch.
  int64_t global_batch = 0;
  bool micro_batch_fixed = true, accumulation_fixed = true;
  int64_t pair_rows = 1;             // engine rows per unit of micro_batch's recipe value (preference: 2)
  size_t baseline_bytes = 0;         // the process before the plan's allocations (VmRSS)
  size_t data_bytes = 0;             // tokenized rows and the data order, held all run
  size_t data_rows = 0;              // rows in the data order (resume reads them back)
  // LoRA (offload/state/lora.h; r > 0): the base is frozen — its working copy alone on the host, no
  // gradient, master or moments — and the adapters' state is listed instead.
  LoraOptions lora;
  // GRPO with grpo.beta > 0 in full fine-tuning: the reference model is a frozen weights-only copy
  // of the starting working weights (offload/engine/token_scorer.h: frozen_weights_copy), pinned host
  bool reference_copy = false;
  int router_aux_loss = -1;  // EngineOptions::router_aux_loss (train.router_aux_loss: -1 auto, 0, 1)
  // train.objective = "grpo": the phases that use the device beside the training engine's buffers,
  // one at a time (src/train/grpo_step.h): each step's generator (its least placement: weights
  // streamed, the KV cache spilled as far as that saves) and, with grpo.beta > 0, the reference
  // pass's buffers (offload/engine/token_scorer.h). The device tier holds the larger.
  bool grpo = false;
  GeneratorShape grpo_generator;                           // G rows, the longest prompt, its context
  int64_t grpo_reference_rows = 0, grpo_reference_tokens = 0;  // the scorer's B, T (0: no reference pass)
};

struct PlanBudgets {
  size_t device_bytes = 0;   // the device arena; 0: not checked
  size_t host_bytes = 0;     // host + host_pinned; 0: not checked
  std::string device_origin = "device.memory", host_origin = "offload.host_memory";  // for messages
  std::string nvme_dir;      // offload.nvme_path; "": no NVMe tier
  size_t nvme_bytes = 0;     // offload.nvme_memory; 0 with a dir: not checked
};

struct PlanState {
  std::string kind;  // "working weights (bf16)", ...
  Tier tier = Tier::host;
  size_t bytes = 0;
};

// A change to the recipe, planned again with it applied alone (offload/plan/plan_search.h).
struct PlanChange {
  std::string what;          // "set offload.optimizer = \"nvme\" ...": for a person
  nlohmann::json set = nlohmann::json::object();  // the recipe overrides: {"section.key": value}
  Tier tier = Tier::host;    // the tier it lowers (host: host + host_pinned together)
  size_t saves_bytes = 0;    // what it takes off that tier (0: it only makes the step faster)
  bool fits = false;         // the run fits with it
  double step_seconds = 0;   // the step with it (0: not priced)
};

// The NVMe tier's RAM comes from the NVMe code's own sizes: nvme_state_sizes (offload/state/nvme_state.h:
// the window of master, m, v ranges and the file engine's staging) and, for checkpoints, the
// engine's kSpillRing pinned buffers plus CheckpointSpill::host_bytes().
// The HF export's conversion buffer: kExportChunkElements (offload/state/model_io.h).
// The checkpoint manifest reads files back through a buffer this large (io/checksum.cpp).
inline constexpr size_t kManifestReadBytes = size_t(4) << 20;

// A generation run (`strata generate`, offload/engine/generator.h): the generator's buffer rows
// (offload/stream/engine_buffers.h: generator_buffer_table) and where the weights and the KV
// cache go.
struct GenerationPlan {
  bool active = false;            // this plan is a generation run's (no training state)
  GeneratorShape shape;           // rows per pass (lowered to fit), longest prompt, context
  GeneratorPlacement placement;   // weights resident or streamed; layers whose KV cache stays on the device
};

// The resolved plan: every decision of the run, typed, and what each kind of state costs where.
// The host store (run_plan_store_options) and the engines (run_plan_engine_options,
// offload/plan/run_engines.h) are built from it alone.
struct RunPlan {
  // -- the decisions (no `automatic` left but the engine behaviours of CheckpointMode and
  //    RecomputeMode, offload/modes.h)
  OptimizerKind optimizer_kind = OptimizerKind::adamw;  // AdamW (LoRA: on the adapters) or ZO-SGD
  LoraOptions lora;                   // r > 0: LoRA-AdamW, the base frozen
  int router_aux_loss = -1;           // EngineOptions::router_aux_loss (train.router_aux_loss: -1 auto, 0, 1)
  WeightsMode weights = WeightsMode::stream;  // stream | device
  size_t resident_layers = 0;         // stream: layers [0, resident_layers) keep a device slot of their own
  CheckpointMode checkpoints = CheckpointMode::automatic;  // nvme when the plan spilled them there
  RecomputeMode recompute = RecomputeMode::automatic;
  DType moments = DType::f32;
  int64_t micro_batch = 1, sequence_len = 1;  // the engine's capacity (rows, tokens per row)
  int64_t accumulation_steps = 1;     // micro-batches per optimizer step (the split the plan ran at)
  int64_t group = 1;                  // micro-batches per engine pass: k layer-major, 1 micro_batch
                                      // (zo-sgd: (perturbation, micro-batch) pairs: q x k, or 1)
  int64_t head_chunk_rows = 0;        // 0: the engine's default
  GenerationPlan generation;          // a generation run's decisions (generation.active)
  // -- what each kind of state costs, and where
  std::vector<PlanState> states;      // every kind of state, transient buffers as one row per tier
  std::vector<PlanState> transients;  // each transient phase (loading, resuming, saving, exporting)
  size_t tiers[kTierCount] = {};      // per tier: the sum of its states (peak)
  size_t layers = 0;
  size_t device_checkpoints = 0, host_checkpoints = 0, nvme_checkpoints = 0;  // layer inputs
  size_t kept_activation_layers = 0;  // layers whose activations stay on the device (no recompute)
  size_t kept_logit_chunks = 0;       // lm_head chunks whose logits stay on the device likewise
  size_t kept_logit_rows = 0;         // the vocab rows of those chunks
  bool optimizer_on_nvme = false;     // master + moments on NVMe (nvme_dir below)
  // With optimizer_on_nvme: the first parameter group (offload/state/store_layout.h) whose state
  // is on NVMe; groups before it keep theirs in RAM (0: every group on NVMe).
  size_t optimizer_nvme_first_group = 0;
  // offload.speculative_update: groups [first, end) update ahead of the global norm (empty: none;
  // EngineOptions::speculate_*), their backup the "speculative update backup" host row.
  size_t speculate_first_group = 0, speculate_end_group = 0;
  // offload.working_weights = "derived": layers [0, derived_working_layers) have no working copy
  // in RAM (made from the master at upload; 0: all stored)
  bool derived_working = false;
  size_t derived_working_layers = 0;
  // each group's gradient consumed as it lands (placement_grads_in_flight): the fp32 gradient
  // buffer holds the embedding's and one slot (HostStoreOptions::grads_in_flight)
  bool grads_in_flight = false;
  // offload.norm_pass: each clipped step runs its pass twice, the norm first (StepWork::norm_pass);
  // the gradients are then in flight too
  bool norm_pass = false;
  PlanBudgets budgets;                // and with them the NVMe directory and its budget
  std::vector<std::string> problems;  // what does not fit (empty: it fits)
  std::vector<PlanChange> changes;    // what to change, each with the bytes it saves
  double step_seconds = 0;            // the step estimate the search chose it by (0: not priced)
  size_t grpo_phase_device_bytes = 0; // of tier(device): GRPO's larger phase beside the engine (PlanInputs::grpo)

  bool fits() const { return problems.empty(); }
  size_t tier(Tier t) const { return tiers[int(t)]; }
  size_t host_total() const { return tier(Tier::host) + tier(Tier::host_pinned); }
  size_t bytes_of(const std::string& kind) const;  // 0 when absent
};

// The engine's buffer shape for these inputs (the checkpoint mode before the plan moves spilled
// rows to NVMe): what the plan sizes the device and staging from, and the step estimate's
// transfer count walks.
EngineShape placement_engine_shape(const ModelSpec& spec, const HostStoreLayout& layout, const PlanInputs& in,
                                   int64_t group);

// With the weights streamed (PlanInputs::resident_layers = 0): how many leading layers could keep
// a device slot of their own in what the device budget leaves beside the engine's other rows
// (before any checkpoint or kept activation); the layer count with no device budget.
size_t placement_max_resident_layers(const ModelSpec& spec, const PlanInputs& in, int64_t group,
                                     const PlanBudgets& budgets);

// Where the optimizer state and the spilled checkpoints go: the plan's choices beyond the inputs.
struct PlanChoice {
  bool optimizer_nvme = false;        // master + moments of groups >= optimizer_first_group on NVMe
  size_t optimizer_first_group = 0;   // (offload/state/store_layout.h: HostStoreOptions::nvme_first_group)
  bool checkpoints_nvme = false;      // the layer inputs that do not stay on the device go to NVMe
  // speculated groups [first, end) (offload.speculative_update; empty: none): their master and
  // moments' backup in host RAM (speculation_backup_bytes)
  size_t speculate_first_group = 0, speculate_end_group = 0;
  // the decoder layers with RAM master make their working copy at upload (HostStoreOptions::derived_working)
  bool derive_working = false;
  bool norm_pass = false;  // clipping in two passes (placement_norm_pass_obstacle empty)
};

// Whether a step's gradients are consumed group by group as they land (HostStoreOptions::
// grads_in_flight): AdamW without LoRA, no clipping (each group updates as its gradient lands),
// one rank, and one pass per step (`group` = the step's micro-batches: layer-major, or one
// micro-batch a step), so that no group's gradient is added to twice.
bool placement_grads_in_flight(const PlanInputs& in, int64_t group, bool norm_pass = false);

// Why a norm pass (offload.norm_pass) does not apply to these inputs at `group` micro-batches a
// pass ("" when it does): no clipping, more than one pass a step, LoRA, ZO-SGD, several ranks, a
// preference or GRPO objective (their steps are their own).
std::string placement_norm_pass_obstacle(const PlanInputs& in, int64_t group);

// Why derived working weights do not apply to these inputs ("" when they do): LoRA, ZO-SGD, f32
// weights, several ranks.
std::string placement_derived_working_obstacle(const ModelSpec& spec, const PlanInputs& in);
// The state-row kinds of derived working weights: the staging their uploads convert into.
inline constexpr const char* kDerivedStagingKind = "derived working weights: upload staging";

// The host bytes of the speculation backup of groups [first, end): master, m and v of each
// (HostAdamW::speculation_backup_bytes).
size_t speculation_backup_bytes(const HostStoreLayout& layout, DType moments, size_t first, size_t end);
// The state-row kind of that backup (RunPlan::bytes_of).
inline constexpr const char* kSpeculationBackupKind = "speculative update backup";

// The plan of one candidate: the inputs with every choice made (weights device or stream, not
// automatic), `group` micro-batches per engine pass and `choice`'s tiers; `problems` filled,
// `changes` not. Bad plan inputs (an unknown mode, NVMe asked for without a directory) are
// Error(input). The search over candidates, and `placement_plan` itself: offload/plan/plan_search.h.
// `layout`: HostStore::layout(spec), when the caller has it (a search plans many candidates).
RunPlan placement_plan_at(const ModelSpec& spec, const PlanInputs& in, int64_t group, const PlanBudgets& budgets,
                          const PlanChoice& choice, const HostStoreLayout* layout = nullptr);

// The reserve of PlanInputs::device_reserve_bytes for a GPU priced at its nominal memory: a
// CUDA 12/13 context on a Hopper card takes ~0.5 GiB, NCCL and the allocator's rounding more.
inline constexpr size_t kGpuContextReserve = size_t(1) << 30;

// Why a layer-major schedule does not apply to these inputs ("" when it does): first order with
// several ranks, recompute = never, or a tied lm_head outside LoRA mode (its gradient shares the
// embedding's rows with each micro-batch's scatter, so summing it on the device would change the
// sums' order). zo-sgd: always applies (no gradients; ranks exchange loss scalars only).
std::string placement_layer_major_obstacle(const ModelSpec& spec, const PlanInputs& in);
// What one layer-major pass runs together (RunPlan::group): first order, the step's k micro-
// batches; zo-sgd, its q perturbations x k micro-batches (every perturbed pass of the step).
int64_t placement_layer_major_group(const PlanInputs& in);

// The host store's and the engine's options for a plan (the store: the optimizer's arrays, their
// tier and NVMe directory, or the weights alone for a generation plan; the engine: modes,
// capacity, schedule, LoRA).
HostStoreOptions run_plan_store_options(const RunPlan& plan);
EngineOptions run_plan_engine_options(const RunPlan& plan);

// What a generation run is planned for: the requests' shape (max_batch: the rows asked for per
// pass) and what the device holds before the generator (allocations, and the backend's
// workspace taken at its first GEMM: Device::pending_workspace_bytes).
struct GenerationInputs {
  GeneratorShape shape;
  size_t device_reserved_bytes = 0;
  bool device_in_host_ram = false;   // the CPU backend: the device arena is process memory
};

// The plan of a generation run: rows per pass halved until the least placement fits what the
// device budget leaves (not below 1), then the placement that moves fewest bytes per decoded
// token (generator_choose_placement); the weights-only host store and the generator's rows as
// states. No placement fitting is a problem (placement_plan_check).
RunPlan placement_generation_plan(const ModelSpec& spec, const GenerationInputs& in, const PlanBudgets& budgets);

// One line of "what to change": the change, what it saves on its tier, the step it gives, and
// whether the run fits with it.
std::string placement_change_text(const PlanChange& change);

// Throws Error(budget) (exit 3) when the plan does not fit: what does not fit, the plan's table
// and what to change, each with the bytes it saves.
void placement_plan_check(const RunPlan& plan);

// The table printed at training start: kind of state -> tier -> bytes, then the tier totals.
std::string placement_plan_table(const RunPlan& plan);

// plan.json: {"tiers": {"device", "host", "host_pinned", "nvme"}, "states": [{"kind", "tier", "bytes"}]}
nlohmann::json placement_plan_json(const RunPlan& plan);

// The host budget: offload.host_memory when set (bytes > 0), else the machine's MemAvailable.
// Sets budgets.host_bytes and host_origin.
void placement_host_budget(PlanBudgets& budgets, size_t host_memory_bytes, const std::string& host_memory);

}  // namespace strata
