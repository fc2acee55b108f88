// GRPO's sampling and reference phases priced (grpo_estimate.h).
#include "offload/plan/grpo_estimate.h"

#include <algorithm>

#include "src/core/error.h"

namespace strata {
namespace {

// One pass's seconds: on a GPU the device and the link run side by side; on the CPU backend the
// link is a memcpy on the same cores (read and written: 2 x bytes at host bandwidth), so they add.
double pass_seconds(double compute_s, double link_bytes, const StepRates& rates, bool device_in_host_ram) {
  if (device_in_host_ram) return compute_s + 2 * link_bytes / rates.host_bytes_per_s;
  return std::max(compute_s, link_bytes / rates.link_bytes_per_s);
}

double link_seconds(double link_bytes, const StepRates& rates, bool device_in_host_ram) {
  return device_in_host_ram ? 2 * link_bytes / rates.host_bytes_per_s : link_bytes / rates.link_bytes_per_s;
}

}  // namespace

double grpo_layer_weight_bytes(const ModelSpec& spec, size_t layer) {
  double b = 0;
  for (int64_t row : spec.layers[layer].rows)
    if (row != kAbsent) b += double(spec.params[size_t(row)].bytes());  // absent: a bias the family has not
  return b;
}

std::map<std::string, double> GrpoPhaseEstimate::rows() const {
  return {{"sampling", sampling_s}, {"reference", reference_s}};
}

GrpoPhaseEstimate grpo_phase_estimate(const ModelSpec& spec, const GrpoPhaseShape& s, size_t device_left_bytes,
                                      const StepRates& rates) {
  STRATA_ASSERT(s.prompts >= 0 && s.generations >= 1 && s.prompt_tokens >= 1 && s.completion_tokens >= 1,
                "a GRPO phase estimate without a shape");
  const ModelConfig& c = spec.config;
  const double G = double(s.generations), C = double(c.hidden_size), V = double(c.vocab_size);
  const size_t L = spec.layers.size();
  GrpoPhaseEstimate e;
  e.generator = {s.generations, s.prompt_tokens, s.prompt_tokens + s.completion_tokens};
  e.placement_fits = generator_choose_placement(spec, e.generator, device_left_bytes, &e.placement);
  if (!e.placement_fits) e.placement = {false, 0};  // the least: streamed weights, the cache spilled
  e.generator_device_bytes = generator_device_bytes(spec, e.generator, e.placement);

  // the weights a pass streams: every decoder layer, the lm_head and the final norm
  double layer_bytes = 0;
  for (size_t i = 0; i < L; ++i) layer_bytes += grpo_layer_weight_bytes(spec, i);
  const double head_bytes = double(spec.params[size_t(spec.lm_head_row())].bytes()) +
                            double(spec.params[size_t(spec.final_norm)].bytes());
  const double weights = layer_bytes + head_bytes;

  // ---- sampling: per prompt one prefill (G x Tp) and Tc - 1 decode passes (G x 1); the first
  // completion token comes from the prefill's logits
  const double decode_passes = double(s.completion_tokens - 1);
  e.passes = double(s.prompts) * (1 + decode_passes);
  DeviceWork prefill = layers_forward_work(spec, s.generations, s.prompt_tokens);
  prefill.head_flops = 2 * G * V * C;  // logits of each row's last position
  DeviceWork decode = layers_forward_work(spec, s.generations, 1);
  decode.head_flops = 2 * G * V * C;
  // attention over the cache at the decode passes' mean context (Q K^T and P V: 4 H D per cached
  // position, row and layer), instead of a one-token causal block's
  const double mean_context = double(s.prompt_tokens) + double(s.completion_tokens) / 2;
  decode.attention_flops = 4 * double(L) * double(c.num_attention_heads) * double(c.head_dim) * mean_context * G;
  const double spilled = double(L - std::min(L, e.placement.kv_device_layers));
  const double kv_bytes = 2 * G * mean_context * double(c.num_key_value_heads) * double(c.head_dim) * 4;  // k and v
  const double pass_link = (e.placement.weights_resident ? 0 : weights) + spilled * kv_bytes;
  const double prefill_s = pass_seconds(step_work_seconds(prefill, rates), pass_link, rates, s.device_in_host_ram);
  const double decode_s = pass_seconds(step_work_seconds(decode, rates), pass_link, rates, s.device_in_host_ram);
  const double once = e.placement.weights_resident ? weights : 0;  // the generator is built each step
  e.sampling_link_bytes = once + e.passes * pass_link;
  e.sampling_compute_s =
      double(s.prompts) * (step_work_seconds(prefill, rates) + decode_passes * step_work_seconds(decode, rates));
  e.sampling_link_s = link_seconds(e.sampling_link_bytes, rates, s.device_in_host_ram);
  e.sampling_s = link_seconds(once, rates, s.device_in_host_ram) + double(s.prompts) * (prefill_s + decode_passes * decode_s);

  // ---- the reference pass: one streamed forward per micro-batch
  if (s.reference && s.micro_batches > 0) {
    DeviceWork fwd = layers_forward_work(spec, s.micro_batch_rows, s.micro_batch_tokens);
    fwd.head_flops = 2 * double(s.micro_batch_rows * s.micro_batch_tokens) * V * C;  // the statistics
    const double mb = double(s.micro_batches);
    e.reference_link_bytes = mb * weights;
    e.reference_compute_s = mb * step_work_seconds(fwd, rates);
    e.reference_link_s = link_seconds(e.reference_link_bytes, rates, s.device_in_host_ram);
    e.reference_s = mb * pass_seconds(step_work_seconds(fwd, rates), weights, rates, s.device_in_host_ram);
  }
  return e;
}

}  // namespace strata
