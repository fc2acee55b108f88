// `strata estimate`'s output (estimate.h): one JSON object with --json, else the table a person
// reads: the model and device, whether it fits and what to change, the plan, the step and its rates.
#include <algorithm>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "src/cli/estimate.h"
#include "src/core/error.h"

namespace strata {
namespace {

// Where a rate comes from ("" when nothing says).
std::string source_of(const EstimateRates& r, const std::string& name) {
  const auto it = r.source.find(name);
  return it == r.source.end() ? std::string() : it->second;
}

// --rates-from: the step whose rates are used, and each step's estimate at its own rates.
void json_run_steps(const EstimateReport& r, nlohmann::json& step) {
  const std::vector<RunStepRates>& steps = r.rates.run_steps;
  step["rates_from_step"] = steps[(steps.size() - 1) / 2].step;
  for (const RunStepRates& s : steps) {
    StepRates own = r.rates.rates;
    use_run_rates(own, s.rates);
    const StepEstimate e =
        step_estimate(r.spec, r.in, r.plan, r.plan.accumulation_steps, own, r.recipe.zo_perturbations);
    step["rates_from_steps"].push_back({{"step", s.step}, {"seconds", e.seconds}});
  }
}

// The step's time, where it goes, what it moves and the rates it was priced at.
void print_step(const EstimateReport& r) {
  if (!r.step) {
    std::printf("step: not estimated (whether it fits needs no speeds): give %s, or --gpu NAME, for a step time\n",
                r.missing_speeds.c_str());
    return;
  }
  const StepEstimate& step = *r.step;
  std::printf("step: %.4g s, %.4g tokens/s, MFU %.1f%%, bottleneck %s\n", step.seconds, step.tokens_per_s,
              100 * step.mfu, step.bottleneck.c_str());
  for (const auto& [name, s] : step.components) std::printf("  %-10s %.4g s\n", name.c_str(), s);
  std::printf("  compute by kind:");
  for (const auto& [name, s] : step.compute_parts) std::printf(" %s %.4g s", name.c_str(), s);
  std::printf("\n");
  if (r.grpo) {  // the phases beside the training step (offload/plan/grpo_estimate.h)
    const GrpoPhaseEstimate& g = *r.grpo;
    std::printf("grpo step: %.4g s = training %.4g s + sampling %.4g s + reference %.4g s\n",
                step.seconds + g.sampling_s + g.reference_s, step.seconds, g.sampling_s, g.reference_s);
    std::printf("  sampling   %.4g s: %.0f passes (a prefill and %ld decodes per prompt, %ld rows each), compute %.4g s, "
                "link %.4g s (%s; weights %s)\n", g.sampling_s, g.passes, long(g.generator.max_context -
                g.generator.max_prompt - 1), long(g.generator.max_batch), g.sampling_compute_s, g.sampling_link_s,
                format_bytes(size_t(g.sampling_link_bytes)).c_str(), g.placement.weights_resident ? "resident" : "streamed");
    if (g.reference_s > 0)
      std::printf("  reference  %.4g s: a forward per micro-batch, compute %.4g s, link %.4g s (%s)\n", g.reference_s,
                  g.reference_compute_s, g.reference_link_s, format_bytes(size_t(g.reference_link_bytes)).c_str());
    std::printf("  generator device memory %s beside the training engine's (KV cache for %ld rows x %ld positions, %zu "
                "of %zu layers on the device)%s\n", format_bytes(g.generator_device_bytes).c_str(),
                long(g.generator.max_batch), long(g.generator.max_context), g.placement.kv_device_layers,
                r.spec.layers.size(), g.placement_fits ? "" : ": does NOT fit what the training plan leaves");
  }
  std::printf("moved per step: link %s (h2d %s, d2h %s), NVMe read %s, write %s\n",
              format_bytes(size_t(step.bytes.link())).c_str(), format_bytes(size_t(step.bytes.h2d)).c_str(),
              format_bytes(size_t(step.bytes.d2h)).c_str(), format_bytes(size_t(step.bytes.nvme_read())).c_str(),
              format_bytes(size_t(step.bytes.nvme_write())).c_str());
  const char* unit[] = {"device FLOP/s", "link B/s", "NVMe read B/s", "NVMe write B/s", "AdamW params/s", "host B/s",
                        "crc32c B/s/thread", "attention FLOP/s", "memory-bound B/s", "lm_head FLOP/s"};
  const char* key[] = {"device", "link", "nvme_read", "nvme_write", "adamw", "host", "checksum", "attention", "elementwise", "head"};
  const std::map<std::string, double> rate_value = r.rates.values();
  std::printf("rates:\n");
  bool assumed = false;
  for (int i = 0; i < 10; ++i) {
    if (!rate_value.count(key[i])) continue;
    const std::string source = source_of(r.rates, key[i]);
    std::printf("  %-16s %.4g  %s\n", unit[i], rate_value.at(key[i]), source.c_str());
    assumed = assumed || source.rfind("assumed", 0) == 0;
  }
  if (assumed) std::printf("  (assumed rates are typical figures, not this machine's: --measure measures them here)\n");
}


// --model's defaults, the report's first line: the shape and dtype priced when the user set none.
std::string model_defaults_line(const EstimateReport& r) {
  const Recipe& rc = r.recipe;
  std::string dtype;
  if (r.model_defaults.contains("model.dtype"))
    dtype = str_cat(", ", rc.model_dtype, " (config.json's torch_dtype)");
  return str_cat("priced at sequence ", rc.sequence_len, ", ", rc.micro_batch_size * rc.gradient_accumulation_steps, " x ",
                 rc.sequence_len, " tokens per step (micro_batch_size ", rc.micro_batch_size, " x gradient accumulation ",
                 rc.gradient_accumulation_steps, ")", dtype, " (defaults for --model; override with data.sequence_len=..., "
                 "train.micro_batch_size=..., train.gradient_accumulation_steps=..., model.dtype=...)");
}

// The shape priced, --model's defaults and the largest micro-batch at the recipe's global batch.
void json_shape(const EstimateReport& r, nlohmann::json& out) {
  out["model_defaults"] = r.model_defaults;
  out["max_micro_batch_at_global_batch"] = {{"micro_batch_size", r.split.micro_batch_size},
                                            {"gradient_accumulation_steps", r.split.accumulation},
                                            {"global_batch", r.split.global_batch}};
}

// The largest sizes that fit: micro_batch_size with the accumulation held, micro_batch_size with
// the global batch held (the accumulation shrinking to match), sequence_len.
void print_largest(const EstimateReport& r) {
  const BatchSplit& s = r.split;
  std::printf("largest micro_batch_size that fits (sequence_len %ld, gradient accumulation %ld held): %ld\n",
              long(r.in.sequence_len), long(r.plan.accumulation_steps), long(r.max_batch));
  std::printf("largest micro_batch_size at the global batch of %ld sequences (micro_batch_size x gradient accumulation "
              "= %ld): %s\n",
              long(s.global_batch), long(s.global_batch),
              s.micro_batch_size ? str_cat(s.micro_batch_size, " (x ", s.accumulation, ")").c_str() : "none fits");
  std::printf("largest sequence_len that fits (micro_batch_size %ld): %ld\n", long(r.in.micro_batch), long(r.max_seq));
}
}  // namespace

void estimate_print_json(const EstimateReport& r) {
  const RunPlan& plan = r.plan;
  nlohmann::json j = placement_plan_json(plan);
  nlohmann::json out = {{"fits", plan.fits()}, {"tiers", j["tiers"]}, {"states", j["states"]},
                        {"accumulation", plan.group > 1 ? "layer_major" : "micro_batch"},
                        {"weights", plan.weights == WeightsMode::device ? "device" : "stream"},
                        {"resident_layers", plan.weights == WeightsMode::device ? plan.layers : plan.resident_layers},
                        {"norm_pass", plan.norm_pass},
                        {"max_micro_batch_size", r.max_batch}, {"max_sequence_len", r.max_seq}};
  json_shape(r, out);
  out["micro_batch_size"] = plan.micro_batch / std::max<int64_t>(1, r.in.pair_rows);
  out["gradient_accumulation_steps"] = plan.accumulation_steps;
  out["changes"] = nlohmann::json::array();
  for (const PlanChange& c : plan.changes)  // the step each gives: null without the speeds to price it
    out["changes"].push_back({{"set", c.set}, {"tier", c.tier == Tier::host_pinned ? "host" : tier_name(c.tier)},
                              {"saves_bytes", c.saves_bytes}, {"fits", c.fits},
                              {"step_seconds", c.step_seconds > 0 ? nlohmann::json(c.step_seconds) : nlohmann::json()},
                              {"what", c.what}});
  if (!r.step) {  // a GPU given by its memory alone: whether it fits, no step time
    out["step"] = nullptr;
    std::printf("%s\n", out.dump().c_str());
    return;
  }
  const StepEstimate& step = *r.step;
  out["step"] = {{"seconds", step.seconds}, {"tokens_per_s", step.tokens_per_s}, {"mfu", step.mfu},
                 {"bottleneck", step.bottleneck}, {"components", step.components}, {"compute_parts", step.compute_parts},
                 {"optimizer_exposed_s", step.optimizer_exposed_s}, {"optimizer_params", step.optimizer_params},
                 {"optimizer_params_per_s", step.optimizer_params_per_s},
                 {"bytes", {{"h2d", step.bytes.h2d}, {"d2h", step.bytes.d2h}, {"link", step.bytes.link()},
                            {"nvme_read", step.bytes.nvme_read()}, {"nvme_write", step.bytes.nvme_write()}}}};
  for (const auto& [name, v] : r.rates.values())
    out["step"]["rates"][name] = {{"value", v}, {"source", source_of(r.rates, name)}};
  if (r.grpo) {
    const GrpoPhaseEstimate& g = *r.grpo;
    out["step"]["grpo"] = {{"seconds", step.seconds + g.sampling_s + g.reference_s}, {"training_s", step.seconds},
                           {"sampling_s", g.sampling_s}, {"sampling_compute_s", g.sampling_compute_s},
                           {"sampling_link_s", g.sampling_link_s}, {"sampling_link_bytes", g.sampling_link_bytes},
                           {"sampling_passes", g.passes}, {"reference_s", g.reference_s},
                           {"reference_compute_s", g.reference_compute_s}, {"reference_link_s", g.reference_link_s},
                           {"reference_link_bytes", g.reference_link_bytes},
                           {"generator_device_bytes", g.generator_device_bytes},
                           {"generator_weights_resident", g.placement.weights_resident},
                           {"generator_kv_device_layers", g.placement.kv_device_layers},
                           {"generator_fits", g.placement_fits}};
  }
  if (!r.rates.run_steps.empty()) json_run_steps(r, out["step"]);
  std::printf("%s\n", out.dump().c_str());
}

void estimate_print_text(const EstimateReport& r) {
  const RunPlan& plan = r.plan;
  const PlanInputs& in = r.in;
  if (!r.model_defaults.empty()) std::printf("%s\n", model_defaults_line(r).c_str());
  const bool resident = plan.weights == WeightsMode::device;
  std::printf("strata estimate: %s, %.3gB parameters (%s); micro_batch_size %ld x sequence_len %ld, gradient "
              "accumulation %ld (%s); weights %s\ndevice: %s\nfits: %s\n",
              r.spec.config.family.c_str(), double(r.spec.parameter_count()) / 1e9, dtype_name(r.dtype),
              long(in.micro_batch), long(in.sequence_len), long(plan.accumulation_steps),
              plan.group > 1 ? (resident ? "layer-major" : "layer-major: weights cross twice per step")
                             : "one micro-batch at a time",
              resident ? "resident (they cross once per step, after the update)"
              : plan.resident_layers ? str_cat("streamed, the first ", plan.resident_layers, " of ", plan.layers,
                                               " layers resident (they cross once per step)").c_str()
                                     : "streamed",
              r.rates.device_text.c_str(), plan.fits() ? "yes" : "NO");
  if (plan.norm_pass)
    std::printf("clipping: a norm pass first (offload.norm_pass), then each group updated as its gradient lands\n");
  for (const std::string& p : plan.problems) std::printf("  %s\n", p.c_str());
  std::printf("%s", placement_plan_table(plan).c_str());
  std::printf("  (tokenized data rows are not read here: 16 bytes per token of the dataset come on top)\n");
  if (!plan.changes.empty()) {
    std::printf(plan.fits() ? "faster, if you opt in (the step is %.3g s now):\n" : "what to change:\n", plan.step_seconds);
    for (const PlanChange& c : plan.changes) std::printf("  - %s\n", placement_change_text(c).c_str());
  }
  print_largest(r);
  print_step(r);
}

}  // namespace strata
