#include "offload/step_estimate.h"

#include <algorithm>
#include <cctype>

#include "offload/engine_buffers.h"
#include "offload/host_store.h"
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

namespace {

// optim.type = "zo-sgd" (offload/engine_zo.h): per micro-batch and perturbation, one dual forward
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

StepEstimate step_estimate(const ModelSpec& spec, const PlanInputs& in, const PlacementPlan& plan, int64_t grad_accum,
                           const StepRates& rates, int64_t zo_perturbations) {
  STRATA_CHECK(rates.device_flops_per_s > 0 && rates.link_bytes_per_s > 0, "the estimate needs the device's FLOP/s "
               "and the link's bandwidth (--gpu NAME, or the recipe's device)");
  if (in.optim_type == "zo-sgd") return zo_step_estimate(spec, in, grad_accum, zo_perturbations, rates);
  const auto& c = spec.config;
  const double T = double(in.sequence_len), tokens = double(in.micro_batch) * T, k = double(grad_accum);
  const HostStoreLayout layout = HostStore::layout(spec);
  double layer_matmul = 0, layer_working = 0, layer_grad = 0;
  for (size_t i = 0; i < spec.layers.size(); ++i) {
    layer_working += double(layout.groups[1 + i].working_bytes);
    layer_grad += double(layout.groups[1 + i].f32_bytes);
  }
  for (auto& r : spec.params.rows())
    if (r.shape.size() == 2 && r.name.rfind("model.layers.", 0) == 0) layer_matmul += double(r.numel());
  const TensorSpec& lm = layout.working[size_t(spec.lm_head_row())];
  const double lm_working = double(lm.bytes()), lm_grad = double(lm.numel()) * 4;
  const double attn = double(c.num_hidden_layers * c.num_attention_heads * c.head_dim) * T;

  StepEstimate e;
  e.model_flops_per_token = model_flops_per_token(spec, in.sequence_len);
  // recompute in backward: every layer's forward again, and the lm_head's logits per chunk
  const double executed = e.model_flops_per_token + 2 * layer_matmul + 2 * attn + 2 * double(lm.numel());
  const double compute = tokens * executed / rates.device_flops_per_s;

  const bool stream = in.weights == "stream";
  const double act = tokens * double(c.hidden_size) * 4;
  const double spilled = double(plan.host_checkpoints) * act;
  double h2d = act + spilled;                 // x0, spilled checkpoints fetched back
  double d2h = act + spilled + layer_grad + lm_grad + double(c.hidden_size) * 4;  // dx0, spills, gradients
  if (stream) h2d += 2 * (layer_working + lm_working);
  const double link_mb = std::max(h2d, d2h) / rates.link_bytes_per_s;
  const double link_step = stream ? 0 : (layer_working + lm_working) / rates.link_bytes_per_s;  // re-upload after update
  const double nvme_ckpt = double(plan.nvme_checkpoints) * act *
                           (1 / rates.nvme_write_bytes_per_s + 1 / rates.nvme_read_bytes_per_s);
  const double params = double(spec.parameter_count());
  const double accum = 12 * params / rates.host_bytes_per_s;  // staging read, accumulation read + write
  const double optimizer = params / rates.adamw_params_per_s;
  const double state_bytes = params * (4 + 2 * double(dtype_size(in.moments)));
  const double nvme_state = plan.optimizer_on_nvme
                                ? state_bytes / rates.nvme_read_bytes_per_s + state_bytes / rates.nvme_write_bytes_per_s
                                : 0;

  // per micro-batch the streams overlap: the slowest of compute, link, NVMe checkpoints and the
  // host's accumulation sets its time; the optimizer (pipelined with NVMe) runs after the last
  // backward, overlapped with the next step's forward, so only what exceeds a forward shows
  const double mb = std::max({compute, link_mb, nvme_ckpt, accum});
  const double forward = mb * (tokens * e.model_flops_per_token / 3) / (tokens * executed);
  const double host_side = std::max(optimizer, nvme_state);
  e.seconds = k * mb + link_step + std::max(0.0, host_side - forward);
  e.components = {{"compute", k * compute}, {"link", k * link_mb + link_step}, {"nvme", k * nvme_ckpt + nvme_state},
                  {"optimizer", optimizer}, {"host", k * accum}};
  double worst = -1;
  for (const auto& [name, s] : e.components)
    if (s > worst) worst = s, e.bottleneck = name;
  e.tokens_per_s = k * tokens / e.seconds;
  e.mfu = e.tokens_per_s * e.model_flops_per_token / rates.device_flops_per_s;
  return e;
}

}  // namespace strata
