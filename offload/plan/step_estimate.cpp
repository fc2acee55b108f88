#include "offload/plan/step_estimate.h"

#include <algorithm>
#include <cctype>

#include "offload/stream/engine_buffers.h"
#include "offload/state/host_store.h"
#include "offload/state/nvme_state.h"
#include "src/core/error.h"

namespace strata {
namespace {

constexpr size_t GiB = size_t(1) << 30;

// Host links per direction, nominal: PCIe 4.0 x16 32 GB/s, PCIe 5.0 x16 64 GB/s, NVLink-C2C
// 450 GB/s. Memory as the cards report it, in GiB.
const std::vector<GpuSpec> kGpuSpecs = {
    {"RTX 3090", "NVIDIA GeForce RTX 3090", 24 * GiB, 32e9, "PCIe 4.0 x16"},
    {"RTX 4090", "NVIDIA GeForce RTX 4090", 24 * GiB, 32e9, "PCIe 4.0 x16"},
    {"L40S", "NVIDIA L40S", 48 * GiB, 32e9, "PCIe 4.0 x16"},
    {"A100 40GB", "NVIDIA A100-SXM4-40GB", 40 * GiB, 32e9, "PCIe 4.0 x16"},
    {"A100 80GB", "NVIDIA A100-SXM4-80GB", 80 * GiB, 32e9, "PCIe 4.0 x16"},
    {"H100 PCIe", "NVIDIA H100 PCIe", 80 * GiB, 64e9, "PCIe 5.0 x16"},
    {"H100 SXM", "NVIDIA H100 80GB HBM3", 80 * GiB, 64e9, "PCIe 5.0 x16"},
    {"H200", "NVIDIA H200", 141 * GiB, 64e9, "PCIe 5.0 x16"},
    {"GH200", "NVIDIA GH200 480GB", 96 * GiB, 450e9, "NVLink-C2C"},
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
  double matmul_params = 0;
  for (auto& r : spec.params.rows())
    if (r.shape.size() == 2 && r.name != "model.embed_tokens.weight") matmul_params += double(r.numel());
  if (spec.lm_head == kAbsent) matmul_params += double(spec.params[size_t(spec.embed)].numel());
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

StepBytes step_bytes(const ModelSpec& spec, const PlanInputs& in, const RunPlan& plan, int64_t grad_accum) {
  const HostStoreLayout layout = HostStore::layout(spec);
  const EngineShape shape = placement_engine_shape(spec, layout, in, plan.group);
  const size_t L = shape.layers, first_dev = L - plan.device_checkpoints;
  const double N = double(in.micro_batch * in.sequence_len), act = double(shape.activation_bytes());
  const bool stream = shape.weights == WeightsMode::stream, spill_nvme = plan.nvme_checkpoints > 0;
  const TensorSpec& lm = layout.working[size_t(spec.lm_head_row())];
  const double norm_bytes = double(layout.working[size_t(spec.final_norm)].bytes());
  // the engine's slot caches: after an optimizer step every copy on the device is stale
  std::vector<int64_t> slot_layer(shape.slot_bytes.size(), -1), head_chunk(shape.head_slots, -1);
  bool stale = true;
  StepBytes b;
  auto ensure_layer = [&](size_t i) {
    const size_t s = stream ? i % slot_layer.size() : i;
    if (slot_layer[s] != int64_t(i)) b.h2d += double(layout.groups[1 + i].working_bytes), slot_layer[s] = int64_t(i);
  };
  auto ensure_head_chunk = [&](size_t k) {
    if (!stream) return;  // resident: uploaded whole with the final norm below
    const size_t s = k % shape.head_slots;
    const int64_t rows = std::min(shape.head_rows, shape.V - int64_t(k) * shape.head_rows);
    if (head_chunk[s] != int64_t(k)) b.h2d += double(rows) * double(shape.lm_row_bytes), head_chunk[s] = int64_t(k);
  };
  // checkpoint i (the input of layer i) leaves the device in forward and comes back in backward,
  // except the last two (still in the ping-pong buffers) and, with NVMe, layer 0's (x0 stays pinned)
  auto to_nvme = [&](size_t i) { return spill_nvme && i >= 1 && i + 2 < L; };
  // one pass per micro-batch, or (offload.accumulation = "layer_major") one pass of g = plan.group
  // micro-batches: weights and gradients once per pass, activations and tokens once per micro-batch
  const double g = double(shape.group);
  for (int64_t pass = 0; pass < grad_accum / int64_t(shape.group); ++pass) {
    b.h2d += g * (4 * 4 * N + act);  // ids, targets, positions, document starts (int32); x0
    for (size_t i = 0; i < L; ++i) {
      ensure_layer(i);
      if (i + 1 < L && i + 1 < first_dev && (!spill_nvme || to_nvme(i + 1))) {
        b.d2h += g * act;
        if (spill_nvme) b.checkpoint_write += g * act;
      }
    }
    if (stale) b.h2d += norm_bytes + (stream ? 0 : double(lm.bytes()));
    stale = false;
    for (size_t k = 0; k < shape.head_chunks; ++k) ensure_head_chunk(k);
    for (size_t k = shape.head_chunks; k-- > 0;) ensure_head_chunk(k);
    b.d2h += double(lm.numel()) * 4 + double(spec.config.hidden_size) * 4;  // lm_head and final norm gradients
    for (size_t i = L; i-- > 0;) {
      ensure_layer(i);
      if (i < first_dev && i + 2 < L) {
        b.h2d += g * act;
        if (to_nvme(i)) b.checkpoint_read += g * act;
      }
      b.d2h += double(layout.groups[1 + i].f32_bytes);
    }
    b.d2h += g * (act + 8);  // d x0, the loss
  }
  if (plan.optimizer_on_nvme) {  // master (unless it is the f32 working copy), m and v: read, updated, written,
    HostStoreOptions so;          // each group's ranges in whole blocks (offload/state/nvme_state.h): the files
    so.state_on_nvme = true;
    so.moments = in.moments;      // bf16 m, v: half the bytes
    b.state = double(nvme_state_sizes(layout, so, !(spec.matrix_dtype == DType::f32 && in.f32_master_shared)).file_bytes);
  }
  return b;
}


namespace {

// optim.type = "zo-sgd" (offload/engine/engine_zo.h): per micro-batch and perturbation, one dual forward
// (two forward passes: a third of forward + backward each) with every layer and the lm_head
// crossing once and nothing coming back; per step, the ZO-SGD update of every parameter on the
// host (z regenerated per perturbation; priced at the CPU AdamW rate per perturbation: one
// pass over master and working copy each), overlapped with the next step's first forward.
StepEstimate zo_step_estimate(const ModelSpec& spec, const PlanInputs& in, int64_t grad_accum, int64_t perturbations,
                              const StepRates& rates) {
  const double tokens = double(in.micro_batch) * double(in.sequence_len);
  const double passes = double(grad_accum) * double(std::max<int64_t>(1, perturbations));
  const HostStoreLayout layout = HostStore::layout(spec);
  double weights = double(layout.working[size_t(spec.lm_head_row())].bytes());
  for (size_t i = 0; i < spec.layers.size(); ++i) weights += double(layout.groups[1 + i].working_bytes);
  const double act = tokens * double(spec.config.hidden_size) * 4;  // each pass's embedding output
  StepEstimate e;
  e.model_flops_per_token = model_flops_per_token(spec, in.sequence_len);
  const double compute = tokens * 2.0 / 3.0 * e.model_flops_per_token / rates.device_flops_per_s;
  const double link = (weights + 2 * act) / rates.link_bytes_per_s;
  const double params = double(spec.parameter_count());
  const double optimizer = params * double(std::max<int64_t>(1, perturbations)) / rates.adamw_params_per_s;
  const double dual = std::max(compute, link);
  e.seconds = passes * dual + std::max(0.0, optimizer - dual);
  e.components = {{"compute", passes * compute}, {"link", passes * link}, {"nvme", 0}, {"optimizer", optimizer},
                  {"host", 0}};
  double worst = -1;
  for (const auto& [name, sec] : e.components)
    if (sec > worst) worst = sec, e.bottleneck = name;
  e.tokens_per_s = double(grad_accum) * tokens / e.seconds;
  // MFU as the trainer counts it for zo-sgd: the FLOPs of the forward passes run
  e.mfu = e.tokens_per_s * e.model_flops_per_token * 2.0 / 3.0 * double(std::max<int64_t>(1, perturbations)) /
          rates.device_flops_per_s;
  return e;
}

}  // namespace

StepEstimate step_estimate(const ModelSpec& spec, const PlanInputs& in, const RunPlan& plan, int64_t grad_accum,
                           const StepRates& rates, int64_t zo_perturbations) {
  STRATA_CHECK(rates.device_flops_per_s > 0 && rates.link_bytes_per_s > 0, "the estimate needs the device's FLOP/s "
               "and the link's bandwidth (--gpu NAME, or the recipe's device)");
  if (in.optimizer_kind == OptimizerKind::zo_sgd) return zo_step_estimate(spec, in, grad_accum, zo_perturbations, rates);
  const double tokens = double(in.micro_batch) * double(in.sequence_len), k = double(grad_accum);
  StepEstimate e;
  e.model_flops_per_token = model_flops_per_token(spec, in.sequence_len);
  e.bytes = step_bytes(spec, in, plan, grad_accum);
  // the device's work per micro-batch, each kind at its rate (attention and the head at the GEMM
  // rate, memory-bound ops unpriced, when the device's own rates are not known); the recompute in
  // backward is one more forward of every layer whose activations were not kept, and one more
  // logits matmul of every lm_head chunk whose logits were not (offload.recompute,
  // plan.kept_activation_layers and kept_logit_rows)
  DeviceWork layers = layers_work(spec, in.micro_batch, in.sequence_len, plan.kept_activation_layers);
  const DeviceWork head = head_work(spec, in.micro_batch * in.sequence_len, spec.config.vocab_size,
                                    int64_t(plan.kept_logit_rows));
  auto rate = [&](double r) { return r > 0 ? r : rates.device_flops_per_s; };
  auto seconds = [&](const DeviceWork& w) -> std::map<std::string, double> {
    return {{"matmul", w.matmul_flops / rates.device_flops_per_s},
            {"attention", w.attention_flops / rate(rates.attention_flops_per_s)},
            {"elementwise", rates.elementwise_bytes_per_s > 0 ? w.elementwise_bytes / rates.elementwise_bytes_per_s : 0},
            {"head", w.head_flops / rate(rates.head_flops_per_s)}};
  };
  layers += head;
  e.compute_parts = seconds(layers * k);
  double compute = 0, forward = 0;
  for (const auto& [name, sec] : e.compute_parts) compute += sec;
  // one micro-batch's forward: every layer's forward, the head's statistics (a quarter)
  DeviceWork one_forward = layers_forward_work(spec, in.micro_batch, in.sequence_len);
  one_forward += head * 0.25;
  for (const auto& [name, sec] : seconds(one_forward)) forward += sec;
  const double link = std::max(e.bytes.h2d, e.bytes.d2h) / rates.link_bytes_per_s;
  const double nvme_checkpoints = e.bytes.checkpoint_read / rates.nvme_read_bytes_per_s +
                                  e.bytes.checkpoint_write / rates.nvme_write_bytes_per_s;
  const double nvme_state = e.bytes.state / rates.nvme_read_bytes_per_s + e.bytes.state / rates.nvme_write_bytes_per_s;
  const double nvme = nvme_checkpoints + nvme_state;
  const double params = double(spec.parameter_count());
  // the host's accumulation: every f32 gradient staged, read and added (12 bytes per parameter
  // and micro-batch, once per pass of g micro-batches layer-major), zeroed (4) once per step; on
  // the CPU backend the link's copies are memcpy on the same cores
  double host = (k / double(std::max<int64_t>(1, plan.group)) * 12 + 4) * params / rates.host_bytes_per_s;
  if (in.device_in_host_ram) host += 2 * e.bytes.link() / rates.host_bytes_per_s;
  host += (e.bytes.nvme_read() + e.bytes.nvme_write()) / rates.checksum_bytes_per_s;
  const double optimizer = params / rates.adamw_params_per_s;
  if (in.device_in_host_ram) {
    // the optimizer's NVMe state streams group by group as the last micro-batch's backward lands
    // each group's gradient; the next forward starts once layer 0, the last to land, is updated:
    // what of the state pass that backward does not cover shows. The drive carries the spilled
    // checkpoints and the state both: that backward's checkpoint reads share it with the pass.
    const double backward = compute / k - forward;
    const double last_checkpoint_reads = e.bytes.checkpoint_read / k / rates.nvme_read_bytes_per_s;
    const double state_shown = nvme_state > 0 ? std::max(0.0, nvme_state + last_checkpoint_reads - backward) : 0.0;
    e.seconds = std::max({compute + host + optimizer + state_shown, link, nvme});
  } else {
    // the optimizer (pipelined with its NVMe state) runs after the last backward, overlapped with
    // the next step's forward: only what exceeds a forward shows
    const double host_side = std::max(optimizer, nvme_state);
    e.seconds = std::max({compute, link, nvme_checkpoints, host}) + std::max(0.0, host_side - forward);
  }
  e.components = {{"compute", compute}, {"link", link}, {"nvme", nvme}, {"optimizer", optimizer}, {"host", host}};
  double worst = -1;
  for (const auto& [name, s] : e.components)
    if (s > worst) worst = s, e.bottleneck = name;
  e.tokens_per_s = k * tokens / e.seconds;
  const double peak = rates.mfu_peak_flops_per_s > 0 ? rates.mfu_peak_flops_per_s : rates.device_flops_per_s;
  e.mfu = e.tokens_per_s * e.model_flops_per_token / peak;
  return e;
}

}  // namespace strata
