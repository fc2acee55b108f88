#include "offload/plan/step_estimate.h"

#include <algorithm>
#include <optional>
#include <cctype>
#include <cmath>

#include "offload/stream/engine_buffers.h"
#include "offload/state/host_store.h"
#include "offload/state/nf4_layout.h"
#include "offload/state/nvme_state.h"
#include "src/core/error.h"

namespace strata {
namespace {

constexpr size_t GiB = size_t(1) << 30;

// Host links per direction, nominal: PCIe 4.0 x16 32 GB/s, PCIe 5.0 x16 64 GB/s, NVLink-C2C
// 450 GB/s. Memory as the cards report it, in GiB.
// GEMM efficiency: the share of the datasheet dense bf16 peak that cuBLAS reaches on large GEMMs
// (M = N = K >= 4096), assumed per family, rounded down from published cuBLAS benchmarks rather
// than measured by strata: the datasheet figure is at the boost clock, and under sustained
// tensor-core load the data-center parts run at their power limit, below it. Hopper (H100, H200,
// GH200) ~0.75 (about 740 of 989 TFLOP/s on an H100 SXM; the PCIe card, at 350 W, ~0.70);
// Ampere A100 ~0.80; the GeForce and Ada cards (RTX 3090, RTX 4090) ~0.80; the L40S, held to
// 350 W, ~0.70. The layers' GEMMs at a micro-batch of a few thousand tokens are that large; a
// measured or given --gpu-flops replaces the product.
const std::vector<GpuSpec> kGpuSpecs = {
    {"RTX 3090", "NVIDIA GeForce RTX 3090", 24 * GiB, 32e9, "PCIe 4.0 x16", 0.80},
    {"RTX 4090", "NVIDIA GeForce RTX 4090", 24 * GiB, 32e9, "PCIe 4.0 x16", 0.80},
    {"L40S", "NVIDIA L40S", 48 * GiB, 32e9, "PCIe 4.0 x16", 0.70},
    {"A100 40GB", "NVIDIA A100-SXM4-40GB", 40 * GiB, 32e9, "PCIe 4.0 x16", 0.80},
    {"A100 80GB", "NVIDIA A100-SXM4-80GB", 80 * GiB, 32e9, "PCIe 4.0 x16", 0.80},
    {"H100 PCIe", "NVIDIA H100 PCIe", 80 * GiB, 64e9, "PCIe 5.0 x16", 0.70},
    {"H100 SXM", "NVIDIA H100 80GB HBM3", 80 * GiB, 64e9, "PCIe 5.0 x16", 0.75},
    {"H200", "NVIDIA H200", 141 * GiB, 64e9, "PCIe 5.0 x16", 0.75},
    {"GH200", "NVIDIA GH200 480GB", 96 * GiB, 450e9, "NVLink-C2C", 0.75},
};

std::string squash(const std::string& s) {
  std::string out;
  for (char c : s)
    if (std::isalnum(static_cast<unsigned char>(c))) out += char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

const std::vector<GpuSpec>& gpu_specs() { return kGpuSpecs; }

std::optional<GpuSpec> gpu_spec_find(const std::string& name) {
  const std::string want = squash(name);
  for (const GpuSpec& g : kGpuSpecs)
    if (squash(g.name) == want) return g;
  return std::nullopt;
}

double model_flops_per_token(const ModelSpec& spec, int64_t T) {
  // the matrices a token goes through: each layer's as its kind prices one token (8 x: forward,
  // recompute, backward) — every 2-D parameter of a dense layer, the router and k experts of a
  // mixture-of-experts one (active, not total, parameters) — and lm_head
  double matmul_params = 0;
  for (const ModelLayer& l : spec.layers) matmul_params += l.kind->cost(spec.config, spec.matrix_dtype, 1, 1).matmul_flops / 8;
  matmul_params += double(spec.params[size_t(spec.lm_head_row())].numel());
  const auto& c = spec.config;
  return 6.0 * matmul_params + 6.0 * double(c.num_hidden_layers * c.num_attention_heads * c.head_dim) * double(T);
}

DeviceWork& DeviceWork::operator+=(const DeviceWork& o) {
  matmul_flops += o.matmul_flops, attention_flops += o.attention_flops;
  elementwise_bytes += o.elementwise_bytes, head_flops += o.head_flops;
  return *this;
}

DeviceWork DeviceWork::operator*(double s) const {
  return {matmul_flops * s, attention_flops * s, elementwise_bytes * s, head_flops * s};
}

DeviceWork layer_work(const ModelSpec& spec, size_t layer, int64_t B, int64_t T) {
  const LayerCost c = spec.layers[layer].kind->cost(spec.config, spec.matrix_dtype, B, T);
  DeviceWork w;
  w.matmul_flops = c.matmul_flops;
  w.attention_flops = c.attention_flops;
  w.elementwise_bytes = c.elementwise_bytes;
  // an NF4 base: each upload of the layer is dequantized on the device (packed bytes read, the
  // weights written), about twice a micro-batch (forward and backward; once a layer-major pass)
  if (spec.base_quant.nf4) w.elementwise_bytes += 2.0 * double(nf4_decode_bytes(spec, layer));
  return w;
}

// layer_work counts forward, recompute, dX and dW: the forward is a quarter of the GEMMs and
// memory-bound bytes, 2 of attention's 9 products
DeviceWork layer_forward_work(const DeviceWork& layer) {
  return {layer.matmul_flops / 4, layer.attention_flops * 2 / 9, layer.elementwise_bytes / 4, 0};
}

namespace {

// Each kind's layer work once, with how many layers are of it, and how many of those are among
// the last `kept_layers` (whose activations stay on the device).
struct KindWork {
  DeviceWork layer;
  double layers = 0, kept = 0;
};

std::vector<KindWork> kinds_work(const ModelSpec& spec, int64_t B, int64_t T, size_t kept_layers) {
  std::vector<const LayerKind*> kinds = spec.layer_kinds();
  std::vector<KindWork> out(kinds.size());
  const size_t L = spec.layers.size();
  for (size_t l = 0; l < L; ++l) {
    const size_t k = size_t(std::find(kinds.begin(), kinds.end(), spec.layers[l].kind) - kinds.begin());
    if (out[k].layers == 0) out[k].layer = layer_work(spec, l, B, T);
    out[k].layers += 1;
    out[k].kept += l + kept_layers >= L ? 1 : 0;
  }
  return out;
}

}  // namespace

double pass_gradient_bytes(const ModelSpec& spec, int64_t group, bool lora) {
  if (lora) return 0;  // the adapters' gradients: a few MiB
  const double g = double(std::max<int64_t>(1, group));
  const double untied_embedding = spec.lm_head == kAbsent ? 0 : double(spec.params[size_t(spec.embed)].numel());
  return (4 * g + 12 * (g - 1)) * (double(spec.parameter_count()) - untied_embedding);
}

DeviceWork layers_work(const ModelSpec& spec, int64_t B, int64_t T, size_t kept_layers) {
  DeviceWork all;
  for (const KindWork& k : kinds_work(spec, B, T, kept_layers)) all += k.layer * k.layers;
  for (const KindWork& k : kinds_work(spec, B, T, kept_layers)) all += layer_forward_work(k.layer) * -k.kept;
  return all;
}

DeviceWork layers_forward_work(const ModelSpec& spec, int64_t B, int64_t T) {
  DeviceWork all;
  for (const KindWork& k : kinds_work(spec, B, T, 0)) all += layer_forward_work(k.layer) * k.layers;
  return all;
}

DeviceWork head_work(const ModelSpec& spec, int64_t N, int64_t rows, int64_t kept_rows) {
  DeviceWork w;
  w.head_flops = (8 * double(rows) - 2 * double(kept_rows)) * double(N) * double(spec.config.hidden_size);
  return w;
}

namespace {

// The engine's transfers walked in its order, with its slot caches (offload/engine/layer_pass.h):
// a weight upload is skipped when its slot still holds that layer (or lm_head chunk) and no
// update has made the device copies stale since.
struct TransferWalk {
  const HostStoreLayout& layout;
  const EngineShape& shape;
  double lm_bytes = 0, norm_bytes = 0;
  std::vector<int64_t> slot_layer, head_chunk;
  bool stale = true;  // the final norm and a resident lm_head: uploaded again after an update
  size_t derived = 0;  // layers [0, derived) are made from the master before each upload
  StepBytes b;

  TransferWalk(const ModelSpec& spec, const HostStoreLayout& l, const EngineShape& s)
      : layout(l), shape(s), slot_layer(s.slot_bytes.size(), -1), head_chunk(s.head_slots, -1) {
    lm_bytes = double(layout.working[size_t(spec.lm_head_row())].bytes());
    norm_bytes = double(layout.working[size_t(spec.final_norm)].bytes());
  }
  bool streamed() const { return shape.weights == WeightsMode::stream; }
  void invalidate() {  // an update: no device copy is current (LayerPass::mark_stale)
    std::fill(slot_layer.begin(), slot_layer.end(), -1);
    std::fill(head_chunk.begin(), head_chunk.end(), -1);
    stale = true;
  }
  void layer(size_t i) {
    const size_t s = shape.layer_slot(i);
    if (slot_layer[s] == int64_t(i)) return;
    b.h2d += double(layout.groups[1 + i].working_bytes), slot_layer[s] = int64_t(i);
    if (i < derived) b.derived_h2d += double(layout.groups[1 + i].working_bytes);
  }
  void norm_and_resident_head() {
    if (stale) b.h2d += norm_bytes + (streamed() ? 0 : lm_bytes);
    stale = false;
  }
  void head(size_t k) {
    if (!streamed()) return;  // resident: uploaded whole with the final norm
    const size_t s = k % shape.head_slots;
    const int64_t rows = std::min(shape.head_rows, shape.V - int64_t(k) * shape.head_rows);
    if (head_chunk[s] != int64_t(k)) b.h2d += double(rows) * double(shape.lm_row_bytes), head_chunk[s] = int64_t(k);
  }
};

// What one first-order step moves (StepBytes), and the transfers of the passes the update
// overlaps: the first pass's forward (the next step's first forward, in steady state) and the
// last pass's backward.
struct FirstOrderTransfers {
  StepBytes bytes;
  double first_forward_h2d = 0, last_backward_h2d = 0, last_backward_d2h = 0;
};

// One pass of g = plan.group micro-batches (offload/engine/engine.cpp run_pass): weights once per
// pass, tokens, activations and the loss once per micro-batch; LoRA (frozen) sends no gradient.
void walk_pass(TransferWalk& w, const ModelSpec& spec, const PlanInputs& in, const RunPlan& plan, bool frozen,
               FirstOrderTransfers* mark) {
  const EngineShape& shape = w.shape;
  const size_t L = shape.layers, first_dev = L - plan.device_checkpoints;
  const double N = double(in.micro_batch * in.sequence_len), act = double(shape.activation_bytes());
  const double g = double(shape.group);
  const bool spill_nvme = plan.nvme_checkpoints > 0;
  StepBytes& b = w.b;
  // checkpoint i (the input of layer i) leaves the device in forward and comes back in backward,
  // except the last two (still in the ping-pong buffers) and, with NVMe, layer 0's (x0 stays pinned)
  auto to_nvme = [&](size_t i) { return spill_nvme && i >= 1 && i + 2 < L; };
  const double h2d0 = b.h2d;
  b.h2d += g * (4 * 4 * N + act);  // ids, targets, positions, document starts (int32); x0
  for (size_t i = 0; i < L; ++i) {
    w.layer(i);
    if (i + 1 < L && i + 1 < first_dev && (!spill_nvme || to_nvme(i + 1))) {
      b.d2h += g * act;
      if (spill_nvme) b.checkpoint_write += g * act;
    }
  }
  w.norm_and_resident_head();
  for (size_t k = 0; k < shape.head_chunks; ++k) w.head(k);
  if (mark) mark->first_forward_h2d = b.h2d - h2d0;
  const double h2d1 = b.h2d, d2h1 = b.d2h;
  for (size_t k = shape.head_chunks; k-- > 0;) w.head(k);
  if (!frozen) b.d2h += double(w.layout.working[size_t(spec.lm_head_row())].numel()) * 4 +
                        double(spec.config.hidden_size) * 4;  // lm_head and final norm gradients
  for (size_t i = L; i-- > 0;) {
    w.layer(i);
    if (i < first_dev && i + 2 < L) {
      b.h2d += g * act;
      if (to_nvme(i)) b.checkpoint_read += g * act;
    }
    if (!frozen) b.d2h += double(w.layout.groups[1 + i].f32_bytes);
  }
  b.d2h += g * ((frozen ? 0 : act) + 8);  // d x0 (the embedding's backward; frozen: none), the loss
  if (frozen && in.ranks > 1) b.d2h += g * double(shape.lora_bytes);  // each micro-batch's adapter gradients
  if (mark) mark->last_backward_h2d = b.h2d - h2d1, mark->last_backward_d2h = b.d2h - d2h1;
}

// The optimizer state on NVMe: master (unless it is the f32 working copy), m and v of the groups
// from plan.optimizer_nvme_first_group on, each group's ranges in whole blocks
// (offload/state/nvme_state.h): those groups' file bytes, read once and written once per step.
double nvme_state_bytes(const ModelSpec& spec, const PlanInputs& in, const RunPlan& plan, const HostStoreLayout& layout) {
  if (!plan.optimizer_on_nvme || plan.lora.enabled() || in.lora.enabled()) return 0;
  const size_t first = plan.optimizer_nvme_first_group;  // only the groups on NVMe: their files alone
  if (first >= layout.groups.size()) return 0;
  HostStoreOptions so;
  so.state_on_nvme = true;
  so.nvme_first_group = first;
  so.moments = in.moments;  // bf16 m, v: half the bytes
  return double(nvme_state_sizes(layout, so, !(spec.matrix_dtype == DType::f32 && in.f32_master_shared)).file_bytes);
}

FirstOrderTransfers first_order_transfers(const ModelSpec& spec, const HostStoreLayout& layout, const PlanInputs& in,
                                          const RunPlan& plan, int64_t grad_accum) {
  const EngineShape shape = placement_engine_shape(spec, layout, in, plan.group);
  const bool frozen = shape.frozen();
  const int64_t passes = grad_accum / int64_t(shape.group);
  TransferWalk w(spec, layout, shape);
  w.derived = plan.derived_working_layers;
  FirstOrderTransfers t;
  // after an optimizer step every device copy is stale; LoRA's frozen base never is, so its
  // caches carry over from the step before: one step walked to fill them, the next one counted
  if (frozen) {
    for (int64_t p = 0; p < passes; ++p) walk_pass(w, spec, in, plan, frozen, nullptr);
    w.b = StepBytes{};
  }
  // a norm pass (plan.norm_pass) runs the step's one pass twice, no update between: the slots
  // keep what the first left
  const int64_t walked = passes + (plan.norm_pass ? 1 : 0);
  for (int64_t p = 0; p < walked; ++p) {
    FirstOrderTransfers mark;
    walk_pass(w, spec, in, plan, frozen, &mark);
    if (p == 0) t.first_forward_h2d = mark.first_forward_h2d;
    if (p + 1 == walked) t.last_backward_h2d = mark.last_backward_h2d, t.last_backward_d2h = mark.last_backward_d2h;
  }
  if (frozen) {  // the step's adapter gradients down (one process: accumulated on the device), the adapters up
    if (in.ranks <= 1) w.b.d2h += double(shape.lora_bytes);
    w.b.h2d += double(shape.lora_bytes);
  }
  w.b.state = nvme_state_bytes(spec, in, plan, layout);
  t.bytes = w.b;
  return t;
}

// optim.type = "zo-sgd" (offload/engine/engine_zo.cpp run): q x k (perturbation, micro-batch)
// pairs, perturbation-major, run g = `group` at a time (1, or all of them layer-major); per run
// every layer and lm_head chunk the slot cache does not hold and the tokens of each of its
// micro-batches (min(run, k) of them), the final norm once per step (stale after the update); per
// pair both passes' embedding output (gathered and perturbed on the host) and the two losses back.
StepBytes zo_step_bytes(const ModelSpec& spec, const PlanInputs& in, int64_t k, int64_t q, int64_t group) {
  const HostStoreLayout layout = HostStore::layout(spec);
  const EngineShape shape = placement_engine_shape(spec, layout, in, group);
  const double N = double(in.micro_batch * in.sequence_len), act = double(shape.activation_bytes());
  const int64_t pairs = k * q;
  TransferWalk w(spec, layout, shape);
  for (int64_t first = 0; first < pairs; first += group) {
    const int64_t run = std::min(group, pairs - first);
    w.b.h2d += double(std::min(run, k)) * 4 * 4 * N + double(run) * 2 * act;
    for (size_t i = 0; i < shape.layers; ++i) w.layer(i);
    w.norm_and_resident_head();
    for (size_t c = 0; c < shape.head_chunks; ++c) w.head(c);
    w.b.d2h += double(run) * 2 * sizeof(double);
  }
  return w.b;
}

}  // namespace

StepBytes step_bytes(const ModelSpec& spec, const PlanInputs& in, const RunPlan& plan, int64_t grad_accum) {
  if (in.optimizer_kind == OptimizerKind::zo_sgd)
    return zo_step_bytes(spec, in, grad_accum, std::max<int64_t>(1, in.zo_perturbations),
                         std::clamp<int64_t>(plan.group, 1, grad_accum * std::max<int64_t>(1, in.zo_perturbations)));
  return first_order_transfers(spec, HostStore::layout(spec), in, plan, grad_accum).bytes;
}

double step_adamw_bytes_per_param(DType matrix_dtype, const PlanInputs& in) {
  if (in.lora.enabled()) return 8 + 8 + 8 + 4 + 4;  // f32 master, m, v read + written; gradient read; image written
  const double moment = in.moments == DType::bf16 ? 2 : 4;
  const bool in_place = matrix_dtype == DType::f32 && in.f32_master_shared;
  const double working = in_place ? 0 : double(dtype_size(matrix_dtype));
  return 2 * 4 + 2 * 2 * moment + 4 + working;
}

double step_adamw_params_per_s(DType matrix_dtype, const PlanInputs& in, const StepRates& rates) {
  if (rates.adamw_params_per_s > 0) return rates.adamw_params_per_s;
  return rates.host_bytes_per_s / step_adamw_bytes_per_param(matrix_dtype, in);
}

double step_zo_bytes_per_param(DType matrix_dtype, const PlanInputs& in) {
  const bool in_place = matrix_dtype == DType::f32 && in.f32_master_shared;
  return 2 * 4 + (in_place ? 0 : double(dtype_size(matrix_dtype)));
}

namespace {

// The largest component names the bottleneck.
void name_bottleneck(StepEstimate& e) {
  double worst = -1;
  for (const auto& [name, sec] : e.components)
    if (sec > worst) worst = sec, e.bottleneck = name;
}

double mfu_peak(const StepRates& rates) {
  return rates.mfu_peak_flops_per_s > 0 ? rates.mfu_peak_flops_per_s : rates.device_flops_per_s;
}

// Seconds of device work, by kind, each at its rate (attention and the head at the GEMM rate,
// memory-bound ops unpriced, when the device's own rates are not known).
std::map<std::string, double> work_seconds(const DeviceWork& w, const StepRates& rates) {
  auto rate = [&](double r) { return r > 0 ? r : rates.device_flops_per_s; };
  return {{"matmul", w.matmul_flops / rates.device_flops_per_s},
          {"attention", w.attention_flops / rate(rates.attention_flops_per_s)},
          {"elementwise", rates.elementwise_bytes_per_s > 0 ? w.elementwise_bytes / rates.elementwise_bytes_per_s : 0},
          {"head", w.head_flops / rate(rates.head_flops_per_s)}};
}

double total_seconds(const DeviceWork& w, const StepRates& rates) {
  double s = 0;
  for (const auto& [name, sec] : work_seconds(w, rates)) s += sec;
  return s;
}

}  // namespace

double step_work_seconds(const DeviceWork& w, const StepRates& rates) { return total_seconds(w, rates); }

StepRates step_device_rates(const ModelSpec& spec, const PlanInputs& in, const StepRates& rates) {
  StepRates r = rates;
  if (in.device_is_cuda && !in.device_in_host_ram && spec.matrix_dtype == DType::bf16 && r.attention_flops_per_s <= 0)
    r.attention_flops_per_s = kCudaAttentionGemmFraction * r.device_flops_per_s;
  return r;
}

namespace {

// The zeroth-order step (offload/engine/engine_zo.h): q x grad_accum dual forwards, each two
// forward passes of one micro-batch (the layers' forward and the head's statistics, twice), run
// `group` at a time (plan.group: 1, or all of them layer-major) with the weights once over the
// link per run; then the ZO-SGD update on the host (step_zo_bytes_per_param), queued group by
// group, which the next step's first run follows group by group: what of it exceeds one run
// shows (on the CPU backend it shares the cores: all of it).
StepEstimate zo_step_estimate(const ModelSpec& spec, const PlanInputs& in, int64_t grad_accum, int64_t q,
                              int64_t group, const StepRates& given) {
  const StepRates rates = step_device_rates(spec, in, given);
  const double tokens = double(in.micro_batch) * double(in.sequence_len);
  const double passes = double(grad_accum) * double(q);
  const int64_t pairs = grad_accum * q;
  group = std::clamp<int64_t>(group, 1, pairs);
  const double runs = double((pairs + group - 1) / group);
  StepEstimate e;
  e.model_flops_per_token = model_flops_per_token(spec, in.sequence_len);
  e.bytes = zo_step_bytes(spec, in, grad_accum, q, group);
  DeviceWork dual = layers_forward_work(spec, in.micro_batch, in.sequence_len);
  dual.head_flops = 2 * tokens * double(spec.config.vocab_size) * double(spec.config.hidden_size);
  dual = dual * 2.0;
  e.compute_parts = work_seconds(dual * passes, rates);
  const double compute = total_seconds(dual * passes, rates);
  const double link = std::max(e.bytes.h2d, e.bytes.d2h) / rates.link_bytes_per_s;
  const double params = double(spec.parameter_count());
  e.optimizer_params = params;
  e.optimizer_params_per_s = step_adamw_params_per_s(spec.matrix_dtype, in, rates) *
                             step_adamw_bytes_per_param(spec.matrix_dtype, in) /
                             (step_zo_bytes_per_param(spec.matrix_dtype, in) * double(q));
  const double update = params / e.optimizer_params_per_s;
  double host = 0;
  if (in.device_in_host_ram) {  // the device's copies are memcpy on the same cores, and so is the update
    host = 2 * e.bytes.link() / rates.host_bytes_per_s;
    e.optimizer_exposed_s = update;
    e.seconds = std::max(compute + host + update, link);
  } else {
    const double run_s = std::max(compute, link) / runs;
    e.optimizer_exposed_s = std::max(0.0, update - run_s);
    e.seconds = runs * run_s + e.optimizer_exposed_s;
  }
  e.components = {{"compute", compute}, {"link", link}, {"nvme", 0}, {"checksum", 0}, {"optimizer", update}, {"host", host}};
  name_bottleneck(e);
  e.tokens_per_s = double(grad_accum) * tokens / e.seconds;
  // MFU as the trainer counts it for zo-sgd: the FLOPs of the forward passes run
  e.mfu = e.tokens_per_s * e.model_flops_per_token * 2.0 / 3.0 * double(q) / mfu_peak(rates);
  return e;
}

// LoRA's adapters: their parameters in every layer, and in the last `kept_layers` (whose
// activations are kept: no recompute). active: a MoE layer's packed expert adapters counted by the
// share of them a token runs through (k of E), as the FLOPs see them.
std::pair<double, double> lora_adapter_params(const ModelSpec& spec, const LoraOptions& lora, size_t kept_layers,
                                              bool active = false) {
  const LoraLayout l = LoraLayout::of(spec, lora);
  const size_t L = spec.layers.size();
  double all = 0, kept = 0;
  for (size_t i = 0; i < L; ++i)
    for (int t = 0; t < kLoraTargets; ++t) {
      const int64_t a = l.a_row[i][size_t(t)];
      if (a == kAbsent) continue;
      const bool experts = t == kLayerExpertsGateUp || t == kLayerExpertsDown;
      const double share = active && experts ? double(spec.config.num_experts_per_tok) / double(spec.config.num_experts)
                                             : 1.0;
      const double n = share * double(l.table[size_t(a)].numel() + l.table[size_t(a) + 1].numel());  // A, then B
      all += n;
      kept += i + kept_layers >= L ? n : 0;
    }
  return {all, kept};
}

// The device's work of one pass of g micro-batches, and of that pass's forward alone (every
// layer's forward, the head's statistics: 2 FLOPs per lm_head parameter and token). LoRA: the
// frozen base computes no weight gradients (2 of its 8 FLOPs per matrix parameter and token, as
// many as its forward; the lm_head's likewise), and each adapter A (r, in), B (out, r) adds
// 8 FLOPs per adapter parameter and token (x A^T then B^T forward, again in the recompute, dX
// and dW through both), 6 in a layer whose activations are kept.
struct PassWork {
  DeviceWork pass, forward;
};

PassWork first_order_work(const ModelSpec& spec, const PlanInputs& in, const RunPlan& plan, const LoraOptions& lora) {
  const int64_t B = in.micro_batch, T = in.sequence_len;
  const double N = double(B) * double(T), g = double(plan.group);
  DeviceWork layers = layers_work(spec, B, T, plan.kept_activation_layers);
  DeviceWork forward = layers_forward_work(spec, B, T);
  DeviceWork head = head_work(spec, B * T, spec.config.vocab_size, int64_t(plan.kept_logit_rows));
  const double head_forward = 2 * N * double(spec.config.vocab_size) * double(spec.config.hidden_size);
  if (lora.enabled()) {
    layers.matmul_flops -= forward.matmul_flops;
    head.head_flops -= head_forward;
    const auto [all, kept] = lora_adapter_params(spec, lora, plan.kept_activation_layers, true);
    layers.matmul_flops += N * (8 * all - 2 * kept);
    forward.matmul_flops += N * 2 * all;
  }
  forward.head_flops = head_forward;
  layers += head;
  DeviceWork pass = layers * g;
  pass.elementwise_bytes += pass_gradient_bytes(spec, plan.group, lora.enabled());
  return {pass, forward * g};
}

// The share of the NVMe state's writes the update waits for. The file engine serves requests in
// order on one thread (io/uring_file.h), and each range's write-back is queued before the read
// that refills its buffer (offload/state/nvme_state.cpp release): past the first window of
// buffers every read waits behind the writes queued before it, so the last range's update comes
// after every read and the writes of all ranges but the last window - 1, which drain behind the
// rest of the step. ~1 for a large model (a 32B one has ~2000 ranges of 64 MiB), less for few.
double nvme_state_write_share(const ModelSpec& spec, const PlanInputs& in, const RunPlan& plan,
                              const HostStoreLayout& layout) {
  const size_t first = plan.optimizer_nvme_first_group;
  if (first >= layout.groups.size()) return 0;
  HostStoreOptions so;
  so.state_on_nvme = true;
  so.nvme_first_group = first;
  so.moments = in.moments;
  const size_t chunk = nvme_state_sizes(layout, so, !(spec.matrix_dtype == DType::f32 && in.f32_master_shared)).chunk_bytes;
  double ranges = 0;
  for (size_t gi = first; gi < layout.groups.size(); ++gi) ranges += std::ceil(double(layout.groups[gi].f32_bytes) / double(chunk));
  const double ahead = double(std::max(so.nvme_window, 3) - 1);  // reads issued before the first write
  return ranges > 0 ? std::max(0.0, ranges - ahead) / ranges : 0;
}

// The optimizer's host work per step (engine.cpp optimizer_step / update_group_when_landed /
// lora_optimizer_step), split as its schedule needs it.
struct UpdateCost {
  double params = 0, rate = 0;
  double norm = 0;          // clipping: the global norm's squares over every f32 gradient (4 bytes each),
                            // each group's behind its last landing of the step (engine.cpp *_last)
  double norm_group0 = 0;   // of which the embedding group's (the last to land)
  double ram = 0, nvme = 0;  // the update of the groups whose state is in RAM, on NVMe
  double group0 = 0;        // of which the embedding group's (the last to land without clipping)
  double state_disk = 0;    // the NVMe groups' state read and written: the disk's time
  double state_io = 0;      // of which on the update's path (nvme_state_path_share)
  double state_crc = 0;     // the state's checksums
  // speculation (RunPlan::speculate_*): the speculated groups' update (part of ram) runs inside
  // the last backward, after copying their master and moments to the backup; once the norm is
  // known each is committed (its gradient zeroed). Priced for a step whose norm does not clip
  // (a clipping step redoes them after the norm: the serial schedule plus the copies back).
  double ahead = 0, ahead_copy = 0, commit = 0;
  double update() const { return ram + nvme; }
  // the update with its NVMe state streaming through it: the RAM groups, then the NVMe groups at
  // the pace of the slowest of their update, the disk and the checksums
  double pipeline() const { return ram + std::max({nvme, state_io, state_crc}); }
};

UpdateCost update_cost(const ModelSpec& spec, const HostStoreLayout& layout, const PlanInputs& in, const RunPlan& plan,
                       const StepBytes& bytes, const LoraOptions& lora, const StepRates& rates) {
  UpdateCost u;
  PlanInputs priced = in;
  priced.lora = lora;
  u.rate = step_adamw_params_per_s(spec.matrix_dtype, priced, rates);
  // without clipping (or after a norm pass) each group's update first sums its gradient's squares
  // (the norm reported)
  const bool gathered = in.clip_grad && !plan.norm_pass;
  const double per_param = 1 / u.rate + (gathered || lora.enabled() ? 0 : 4 / rates.host_bytes_per_s);
  if (lora.enabled()) {
    u.params = lora_adapter_params(spec, lora, 0).first;
    u.ram = u.params * per_param;
    u.norm = 4 * u.params / rates.host_bytes_per_s;  // always: lora_optimizer_step sums it
    return u;
  }
  // A derived working row (plan.derived_working_layers) writes no working copy: with the rate
  // derived from the memory bandwidth (none measured or given) it is priced at its own bytes,
  // 28 per parameter for bf16 weights with f32 moments instead of 30.
  const double derived_per_param =
      rates.adamw_params_per_s > 0 ? per_param
                                   : per_param - double(dtype_size(spec.matrix_dtype)) / rates.host_bytes_per_s;
  const size_t first_nvme = plan.optimizer_on_nvme ? plan.optimizer_nvme_first_group : layout.groups.size();
  for (size_t gi = 0; gi < layout.groups.size(); ++gi) {
    const double n = double(layout.groups[gi].f32_bytes) / 4;
    const bool derived = gi >= 1 && gi - 1 < size_t(plan.derived_working_layers);
    const double per = derived ? derived_per_param : per_param;
    u.params += n;
    (gi >= first_nvme ? u.nvme : u.ram) += n * per;
    if (gi == 0) u.group0 = n * per;
    if (gi >= plan.speculate_first_group && gi < plan.speculate_end_group) {
      u.ahead += n * per;
      u.ahead_copy += double(speculation_backup_bytes(layout, in.moments, gi, gi + 1)) / rates.host_bytes_per_s;
      u.commit += 4 * n / rates.host_bytes_per_s;
    }
  }
  if (in.clip_grad) {  // gathered in the last backward, or in the norm pass
    u.norm = 4 * u.params / rates.host_bytes_per_s;
    u.norm_group0 = double(layout.groups[0].f32_bytes) / rates.host_bytes_per_s;
  }
  const double read = bytes.state / rates.nvme_read_bytes_per_s, write = bytes.state / rates.nvme_write_bytes_per_s;
  u.state_disk = read + write;
  u.state_io = read + write * nvme_state_write_share(spec, in, plan, layout);
  u.state_crc = 2 * bytes.state / (rates.checksum_bytes_per_s * std::max(1, rates.checksum_threads));
  return u;
}

}  // namespace

namespace {

// A first-order step's parts, in seconds (per step unless said per pass).
struct StepParts {
  double compute = 0, forward = 0, backward = 0;  // the step's device work; one pass's forward and backward
  double link = 0, checkpoint_disk = 0, checkpoint_crc = 0, nvme = 0;
  double host = 0, accumulation_pass = 0;          // the host's accumulation: the step's, one pass's
  double link_bytes_per_s = 0;
  double h2d_stretch = 1;  // derived working weights: h2d's time with their conversions, over the copies'
};

// On a GPU: the device, the link, the disk, the checksum threads and the host queue overlap; the
// update overlaps as the engine schedules it (step_estimate.h). *exposed: what of it shows.
double gpu_step_seconds(const StepParts& p, const UpdateCost& u, const FirstOrderTransfers& t, bool clip, bool lora,
                        double* exposed) {
  const double main = std::max({p.compute, p.link, p.checkpoint_disk, p.checkpoint_crc, p.host});
  // the passes the update runs beside last as long as their device work or their transfers
  const double forward = std::max(p.forward, p.h2d_stretch * t.first_forward_h2d / p.link_bytes_per_s);
  const double backward = std::max({p.backward, p.h2d_stretch * t.last_backward_h2d / p.link_bytes_per_s,
                                    t.last_backward_d2h / p.link_bytes_per_s});
  if (lora)  // synchronous: the adapters' gradients down, their norm and AdamW, the adapters up
    *exposed = u.norm + u.update() + 2 * 4 * u.params / p.link_bytes_per_s;
  else if (clip)  // each group's squares as it lands in the last backward (behind that pass's
                  // accumulation), the embedding's after it; then every group's update behind the
                  // next step's first forward (the speculated groups': in the backward, committed after)
    *exposed = std::max(0.0, p.accumulation_pass + u.norm - u.norm_group0 + u.ahead + u.ahead_copy - backward) +
               u.norm_group0 + std::max(0.0, u.pipeline() - u.ahead + u.commit - forward);
  else  // each group as it lands in the last backward (the host queue also adds that pass's
        // gradients); the embedding's last, after it, and the next forward waits for it
    *exposed = std::max(0.0, p.accumulation_pass + u.pipeline() - u.group0 - backward) + u.group0;
  // the host queue runs the accumulation and the updates one after the other; the disk carries
  // the checkpoints and the state both
  return std::max({main + *exposed, p.host + u.norm + u.pipeline() + u.ahead_copy + u.commit, p.nvme});
}

// On the CPU backend the device is the host's cores: compute, accumulation, the update, the
// norm, the checksums and the copies add up. The disk overlaps: the NVMe state streams while the
// update and the pass beside it (the next forward with clipping, the last backward without, whose
// checkpoint reads share the disk) run on the cores; what of it they do not cover shows.
double cpu_step_seconds(const StepParts& p, const UpdateCost& u, double checkpoint_read_s_last_pass, bool clip,
                        bool lora, double* exposed) {
  const double serial = p.compute + p.host + p.checkpoint_crc + u.norm + u.update() + u.state_crc + u.ahead_copy + u.commit;
  double shown = 0;
  if (!lora && u.state_io > 0) {
    const double beside = u.update() + (clip ? p.forward : p.backward);
    shown = std::max(0.0, u.state_io + (clip ? 0 : checkpoint_read_s_last_pass) - beside);
  }
  *exposed = u.norm + u.update() + u.state_crc + u.ahead_copy + u.commit + shown;
  return std::max({serial + shown, p.link, p.nvme});
}

}  // namespace

StepEstimate step_estimate(const ModelSpec& spec, const PlanInputs& in, const RunPlan& plan, int64_t grad_accum,
                           const StepRates& given, int64_t zo_perturbations, const HostStoreLayout* store_layout) {
  STRATA_CHECK(given.device_flops_per_s > 0 && given.link_bytes_per_s > 0, "the estimate needs the device's FLOP/s "
               "and the link's bandwidth (--gpu NAME, or the recipe's device)");
  if (in.optimizer_kind == OptimizerKind::zo_sgd)
    return zo_step_estimate(spec, in, grad_accum, std::max<int64_t>({1, zo_perturbations, in.zo_perturbations}),
                            plan.group, given);
  const StepRates rates = step_device_rates(spec, in, given);
  const LoraOptions& lora = plan.lora.enabled() ? plan.lora : in.lora;
  const double tokens = double(in.micro_batch) * double(in.sequence_len), k = double(grad_accum);
  const double passes = k / double(std::max<int64_t>(1, plan.group));
  // a norm pass: the step's one pass run first for the norm (its gradients staged, added and
  // squared on the host, nothing updated), then again with the updates as without clipping
  const double run = passes + (plan.norm_pass ? 1 : 0);
  const bool clip = in.clip_grad && !plan.norm_pass;
  StepEstimate e;
  e.model_flops_per_token = model_flops_per_token(spec, in.sequence_len);
  std::optional<HostStoreLayout> own;  // the caller's when it has one: the search prices many candidates
  const HostStoreLayout& layout = store_layout ? *store_layout : own.emplace(HostStore::layout(spec));
  const FirstOrderTransfers t = first_order_transfers(spec, layout, in, plan, grad_accum);
  e.bytes = t.bytes;
  const PassWork work = first_order_work(spec, in, plan, lora);
  e.compute_parts = work_seconds(work.pass * run, rates);
  StepParts p;
  p.link_bytes_per_s = rates.link_bytes_per_s;
  p.compute = total_seconds(work.pass * run, rates);
  p.forward = total_seconds(work.forward, rates);
  p.backward = p.compute / run - p.forward;
  // derived working weights: each upload's conversion (4 bytes read, 2 written per bf16 weight)
  // before its copy, on the host's memory bandwidth
  const double derive_s = 3 * e.bytes.derived_h2d / rates.host_bytes_per_s;
  const double h2d_s = e.bytes.h2d / rates.link_bytes_per_s;
  if (h2d_s > 0) p.h2d_stretch = (h2d_s + derive_s) / h2d_s;
  p.link = std::max(h2d_s + derive_s, e.bytes.d2h / rates.link_bytes_per_s);
  p.checkpoint_disk = e.bytes.checkpoint_read / rates.nvme_read_bytes_per_s +
                      e.bytes.checkpoint_write / rates.nvme_write_bytes_per_s;
  const double crc_bytes_per_s = rates.checksum_bytes_per_s * std::max(1, rates.checksum_threads);
  p.checkpoint_crc = (e.bytes.checkpoint_read + e.bytes.checkpoint_write) / crc_bytes_per_s;
  const UpdateCost u = update_cost(spec, layout, in, plan, e.bytes, lora, rates);
  p.nvme = p.checkpoint_disk + u.state_disk;
  // the host's accumulation: every f32 gradient staged, read and added (12 bytes per parameter
  // and pass), zeroed (4) once per step; LoRA on one process: none (the adapters' gradients
  // accumulate on the device); on the CPU backend the link's copies are memcpy on the same cores
  const double grad_params = lora.enabled() ? (in.ranks > 1 ? u.params : 0) : double(spec.parameter_count());
  p.accumulation_pass = 12 * grad_params / rates.host_bytes_per_s;
  p.host = (run * 12 + 4 * (plan.norm_pass ? 2 : 1)) * grad_params / rates.host_bytes_per_s;
  if (in.device_in_host_ram) p.host += 2 * e.bytes.link() / rates.host_bytes_per_s;
  p.host += derive_s;
  e.optimizer_params = u.params;
  e.optimizer_params_per_s = u.rate;
  if (in.device_in_host_ram)
    e.seconds = cpu_step_seconds(p, u, e.bytes.checkpoint_read / run / rates.nvme_read_bytes_per_s, clip,
                                 lora.enabled(), &e.optimizer_exposed_s);
  else
    e.seconds = gpu_step_seconds(p, u, t, clip, lora.enabled(), &e.optimizer_exposed_s);
  if (plan.norm_pass && !in.device_in_host_ram) {
    // the second pass starts once the norm is known: the norm pass's last landing (the
    // embedding's accumulation and squares) shows; the other squares ride the host queue
    const double tail = u.norm_group0 * (1 + 3);  // its squares (4 bytes a parameter) and accumulation (12)
    e.seconds += tail;
    e.optimizer_exposed_s += tail;
  }
  e.components = {{"compute", p.compute}, {"link", p.link}, {"nvme", p.nvme},
                  {"checksum", p.checkpoint_crc + u.state_crc}, {"optimizer", u.norm + u.update()}, {"host", p.host}};
  name_bottleneck(e);
  e.tokens_per_s = k * tokens / e.seconds;
  e.mfu = e.tokens_per_s * e.model_flops_per_token / mfu_peak(rates);
  return e;
}

}  // namespace strata
