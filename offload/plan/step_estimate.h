// The step-time estimate of `strata estimate` (DESIGN §8c): a roofline of the schedule strata
// really runs (DESIGN §3), priced with a device's matrix FLOP/s, the host link, NVMe and the
// CPU AdamW rate. The bytes come from the placement plan (offload/plan/placement_plan.h): which
// checkpoints spill, whether master and moments live on NVMe; the FLOPs from the model table.
//
// Bytes per optimizer step (step_bytes): the engine's transfers walked in its order
// (offload/engine/engine.cpp) — token ids, the embedding output, every weight upload the engine's slot
// cache does not skip (streamed weights twice per pass — one micro-batch, or the step's k with
// offload.accumulation = "layer_major" (PlanInputs::group) — less the two layers still in
// their slots at the turn, resident weights once per optimizer step), checkpoints spilled and
// fetched back, each layer's f32 gradient, the lm_head gradient, d x0 and the loss; NVMe: the
// spilled checkpoints written and read, master + m + v of the groups on NVMe read and written once
// per step. LoRA: the frozen base sends no gradient back (no layer, head, norm or d x0 copies);
// its device copies are never stale, so resident weights cross once per run and streamed ones
// keep the slot cache from one step to the next; the adapters' gradients come back and the
// adapters go up once per step (each micro-batch's gradients with several ranks). ZO-SGD: per
// dual forward the tokens, both passes' embedding output and the two losses back; every weight
// the slot cache does not hold once per run of plan.group dual forwards (1; or the step's q x k,
// layer-major: the weights once per step), the final norm once per step; nothing on NVMe.
//
// Time per optimizer step (k micro-batches, passes of g = plan.group: 1, or k layer-major):
//   compute    the device's work per micro-batch (DeviceWork: the GEMMs with the backward's
//              recompute, attention, memory-bound ops, the lm_head), each kind at its rate; LoRA
//              (plan.lora): no weight-gradient GEMMs of the frozen base, the adapters' own GEMMs
//   link       the slower direction's bytes over the link (h2d and d2h overlap: full duplex)
//   nvme       the disk's time: spilled checkpoints, and master + m + v of the groups on NVMe
//   checksum   the crc32c of every NVMe block written or read, on rates.checksum_threads threads
//   optimizer  the host's update: AdamW over every parameter (LoRA: the adapters; ZO-SGD: its own
//              update), and with clipping (in.clip_grad) the global norm's pass over the gradients
//   host       the host's gradient accumulation (and, on the CPU backend, the link's memcpy);
//              with derived working weights (plan.derived_working_layers) also each upload's
//              conversion of the master (4 bytes read, 2 written per bf16 weight), which runs
//              on the thread that queues the uploads, before each: it stretches h2d as well
// How the update overlaps is the engine's schedule (offload/engine/engine.cpp, train_step):
//   - clipping: in the step's last pass each group's squares are summed on the host queue as its
//     gradient lands (behind that pass's accumulation; the embedding's last, after the backward,
//     shows), the norm is their sum, then the groups
//     update in order 0..G-1 on the host queue while the next step's first pass runs its forward
//     (one micro-batch, or the whole layer-major pass of g), each layer waiting for its group:
//     what of the update exceeds that forward shows;
//   - no clipping: in the step's last pass each group updates as its gradient lands (G-1 first:
//     the head, the layers from the last), behind the rest of that backward; the embedding's
//     group (0) lands last, after the backward, and the next forward's embedding gather waits
//     for it, so its update always shows, and what of the others exceeds the backward;
//   - LoRA: the adapters' gradients come back, their norm and AdamW run, the adapters go up
//     again, all while the device waits (they are small);
//   - the NVMe state (groups >= plan.optimizer_nvme_first_group) streams through its update:
//     those groups take max(their update, their checksums, their reads and the writes queued
//     before the last of them: all but the last window's, the file engine serving in order).
// On a GPU the device, the link, NVMe, the checksum threads and the host queue run side by side:
// step = max(k x compute, link, nvme, checksum, host) + what of the update shows, and at least
// the host queue's own work (accumulation + update) and the disk's. On the CPU backend the device
// IS the host's cores: compute, accumulation, the update, the norm, the checksums and the
// copies' memcpy share them and add up; a throttled link and NVMe still overlap, the NVMe state
// with the update and the pass it runs beside. Compute is the device's work by kind (DeviceWork),
// each at its rate: on the CPU backend every kind has its own (strata estimate --measure measures
// them at the model's shapes, --rates-from takes them from a run's op_s).
// The bottleneck is the largest component.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "models/model_spec.h"
#include "offload/plan/placement_plan.h"

namespace strata {

// A GPU as the estimate sees it: its datasheet dense peak (src/device/peak_flops.h's table),
// memory, host link (per direction), and the share of that peak large bf16 GEMMs reach.
struct GpuSpec {
  std::string name;            // "H100 SXM"
  std::string datasheet_name;  // the CUDA device name gpu_datasheet_peak matches
  size_t memory_bytes = 0;
  double link_bytes_per_s = 0;
  std::string link;            // "PCIe 5.0 x16"
  // The step's GEMM rate is gemm_efficiency x the datasheet peak (MFU keeps the peak as its
  // denominator); an assumption per GPU family (step_estimate.cpp says where it comes from),
  // replaced by a measured or given --gpu-flops.
  double gemm_efficiency = 1;
};

const std::vector<GpuSpec>& gpu_specs();
// By name, case- and space-insensitive ("h100-sxm", "RTX 4090", "a100 80gb"); nullopt if unknown.
std::optional<GpuSpec> gpu_spec_find(const std::string& name);

// What the device executes, by the kind of work each rate of StepRates prices: the layers'
// GEMMs, their causal attention, their memory-bound ops, the lm_head's fused logits +
// cross-entropy. Counted for the forward, the backward's recompute of it, and the backward.
struct DeviceWork {
  double matmul_flops = 0;       // 8 per matrix parameter per token: 2 forward, 2 recompute, 2 dX, 2 dW
  double attention_flops = 0;    // the CPU kernel's products over its 64 x 64 causal tiles: Q K^T and P V
                                 // forward (twice, with the recompute), then Q K^T, dO V^T, dV, dK and
                                 // dQ in the portable backward's one pass (the two-pass backwards,
                                 // 7 products, run at a rate a measurement folds this count into)
  double elementwise_bytes = 0;  // norms, RoPE, SwiGLU, residual adds, bf16 casts: f32 bytes read and
                                 // written forward, counted 4 times (forward, recompute, backward ~2x)
  double head_flops = 0;         // lm_head logits: 2 forward (statistics), 2 recompute, 2 dX, 2 dW per parameter
  DeviceWork& operator+=(const DeviceWork& o);
  DeviceWork operator*(double s) const;
};
// Decoder layer `layer` on a micro-batch of B rows of T tokens, as its kind prices it
// (LayerKind::cost, models/layer_kind.h).
DeviceWork layer_work(const ModelSpec& spec, size_t layer, int64_t B, int64_t T);
// The forward's share of a layer's work (what a layer whose activations are kept does not recompute).
DeviceWork layer_forward_work(const DeviceWork& layer);
// Every layer's work, less the recompute of the `kept_layers` whose activations stay on the device
// (offload.recompute, RunPlan::kept_activation_layers).
DeviceWork layers_work(const ModelSpec& spec, int64_t B, int64_t T, size_t kept_layers);
// The device's gradient bookkeeping in one pass of `group` micro-batches, in memory-bound bytes:
// every group's gradient but an untied embedding's (the host adds its rows) zeroed for each
// micro-batch (4 bytes a parameter) and, in a layer-major pass, each micro-batch's after the
// first added into the pass's total (12: two read, one written; Engine::grad_share). 0 for LoRA.
double pass_gradient_bytes(const ModelSpec& spec, int64_t group, bool lora);
// Every layer's forward alone (one forward pass of the stack).
DeviceWork layers_forward_work(const ModelSpec& spec, int64_t B, int64_t T);
// The lm_head over `rows` vocab rows at N tokens.
// kept_rows of the rows keep their logits from the statistics pass (offload.recompute,
// RunPlan::kept_logit_rows): 6 FLOPs per parameter per token instead of 8.
DeviceWork head_work(const ModelSpec& spec, int64_t N, int64_t rows, int64_t kept_rows);

struct StepRates;
// Seconds of device work, each kind at its rate (attention and the head at the GEMM rate, memory-
// bound ops unpriced, when the device's own rates are not known): the step's compute.
double step_work_seconds(const DeviceWork& w, const StepRates& rates);

// The defaults are assumptions (a PCIe 4 NVMe drive, one CPU socket's memory bandwidth);
// `strata estimate --measure` replaces them with this host's figures.
struct StepRates {
  double device_flops_per_s = 0;        // the rate the GEMMs run at (a GPU: its datasheet peak x
                                        // GpuSpec::gemm_efficiency, or measured, or given)
  double link_bytes_per_s = 0;          // host <-> device, per direction
  double nvme_read_bytes_per_s = 1.5e9;
  double nvme_write_bytes_per_s = 2.0e9;
  // CPU AdamW, parameters updated per second (f32 master, m, v, the gradient, the working copy);
  // 0: derived from the memory bandwidth, host_bytes_per_s / step_adamw_bytes_per_param (AdamW is
  // memory-bound: it streams every array once and does a few FLOPs per element)
  double adamw_params_per_s = 0;
  double host_bytes_per_s = 50e9;       // host memory bandwidth (accumulation, memcpy, AdamW when derived)
  double checksum_bytes_per_s = 8e9;    // crc32c on one core: every NVMe block is summed when written, checked when read
  int checksum_threads = 1;             // the file engine's threads that compute them (io/uring_file.h)
  double mfu_peak_flops_per_s = 0;      // MFU's denominator (a GPU: the datasheet peak); 0: device_flops_per_s
  // The CPU backend's own rates, measured at the model's shapes (strata estimate --measure runs a
  // layer's forward and backward and an lm_head chunk on a CPU device): device_flops_per_s is then
  // its GEMMs' rate. 0: attention and the head at device_flops_per_s, memory-bound ops unpriced
  // (on a GPU they are small beside the GEMMs).
  // On a CUDA device with bf16 weights 0 prices attention at kCudaAttentionGemmFraction of the
  // GEMM rate instead (step_device_rates).
  double attention_flops_per_s = 0;
  double head_flops_per_s = 0;
  double elementwise_bytes_per_s = 0;
};

// strata's CUDA tensor-core attention (kernels/cuda/attention_tc.cu) against the GEMMs of the same
// GPU, in this step model's attention FLOPs: on an H200, 1.99e14 of them in the 3B scale check's
// step took 7.30 s (27.3 TFLOP/s) where an 8192^3 bf16 GEMM ran 800 TFLOP/s (docs/benchmarks.md,
// "On a GPU (H200)", 2026-12-01). Priced at the GEMM rate, attention looked 30x cheaper than it is
// and the estimate of that step was 3.2 s against 11.0 measured. f32 attention runs on CUDA
// cores, like f32 GEMMs, and stays at the GEMM rate.
constexpr double kCudaAttentionGemmFraction = 0.034;

// `rates` as the step model prices them for this device: on a CUDA device with bf16 weights and no
// attention rate of its own, attention at kCudaAttentionGemmFraction of device_flops_per_s.
StepRates step_device_rates(const ModelSpec& spec, const PlanInputs& in, const StepRates& rates);

// What one optimizer step moves, in bytes (the engine's counters: metrics.jsonl's link_bytes =
// h2d + d2h, nvme_read_bytes, nvme_write_bytes).
struct StepBytes {
  double h2d = 0, d2h = 0;
  double checkpoint_write = 0, checkpoint_read = 0;  // activation checkpoints on NVMe
  double state = 0;                                  // master, m, v on NVMe: read once, written once
  double derived_h2d = 0;  // of h2d: derived layers' weights (offload.working_weights), made from the master first
  double link() const { return h2d + d2h; }
  double nvme_read() const { return checkpoint_read + state; }
  double nvme_write() const { return checkpoint_write + state; }
};

StepBytes step_bytes(const ModelSpec& spec, const PlanInputs& in, const RunPlan& plan, int64_t grad_accum);

struct StepEstimate {
  double seconds = 0, tokens_per_s = 0, mfu = 0;
  std::string bottleneck;                     // "compute" | "link" | "nvme" | "checksum" | "optimizer" | "host"
  std::map<std::string, double> components;   // name -> seconds per optimizer step
  std::map<std::string, double> compute_parts;  // compute by kind: matmul, attention, elementwise, head
  double model_flops_per_token = 0;           // for MFU (no recompute)
  // The update as priced: the parameters it runs over (LoRA: the adapters), at what rate (AdamW's,
  // or ZO-SGD's own), and the seconds of the step spent waiting for it (the global norm, the
  // update and its NVMe state beyond what the pass beside it hides; all of it on the CPU backend,
  // where it shares the cores).
  double optimizer_params = 0, optimizer_params_per_s = 0, optimizer_exposed_s = 0;
  StepBytes bytes;
};

// The bytes one parameter's AdamW update touches in host memory: f32 master, m and v each read
// and written (bf16 moments: 2 bytes each way), the f32 gradient read, the working copy written
// (bf16: 2, a separate f32 copy: 4, none when the f32 master is the working copy). bf16 weights
// with f32 moments: 30. LoRA's adapters (f32 master, moments, gradient and device image): 32.
double step_adamw_bytes_per_param(DType matrix_dtype, const PlanInputs& in);
// The AdamW rate the step is priced at: rates.adamw_params_per_s, or (0) host_bytes_per_s /
// step_adamw_bytes_per_param.
double step_adamw_params_per_s(DType matrix_dtype, const PlanInputs& in, const StepRates& rates);
// ZO-SGD's update per parameter and perturbation, in AdamW-equivalent bytes: the master read and
// written and the working copy written (10 for bf16 weights, 8 when the f32 master is the working
// copy), with z regenerated from its seed once per perturbation. Priced as a ratio of the AdamW
// rate (both stream their arrays once): seconds = params x q x this / (AdamW rate x AdamW's bytes).
double step_zo_bytes_per_param(DType matrix_dtype, const PlanInputs& in);

// Model FLOPs of one token's forward + backward at context T (as the trainer's MFU counts them).
double model_flops_per_token(const ModelSpec& spec, int64_t T);

// in.optimizer_kind = zo_sgd: the zeroth-order step instead (q perturbations: the larger of
// zo_perturbations and in.zo_perturbations, both optim.zo_perturbations): q x grad_accum dual
// forwards in runs of plan.group, each run max(its forward passes, its transfers), plus the host
// ZO-SGD update beyond what one run hides (on the CPU backend all of it).
// store_layout: HostStore::layout(spec), when the caller has built it (else it is built here).
StepEstimate step_estimate(const ModelSpec& spec, const PlanInputs& in, const RunPlan& plan,
                           int64_t grad_accum, const StepRates& rates, int64_t zo_perturbations = 1,
                           const HostStoreLayout* store_layout = nullptr);

}  // namespace strata
