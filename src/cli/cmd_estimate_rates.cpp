// `strata estimate`'s step rates and where each comes from (estimate.h): the device (a GPU of the
// table, the CPU backend measured here, or a GPU given by its figures), a run's metrics
// (--rates-from) and the rates given on the command line. --measure's probes:
// cmd_estimate_measure.cpp.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>

#include <nlohmann/json.hpp>

#include "io/uring_file.h"
#include "src/cli/estimate.h"
#include "src/core/error.h"
#include "src/device/peak_flops.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

std::string gb_per_s(double bytes_per_s) { return str_cat(bytes_per_s / 1e9, " GB/s"); }

// What a step of the run did, as the step model counts it: the device's work by kind, and the
// parameters AdamW updates.
struct RunStepWork {
  DeviceWork device;
  double head = 0, params = 0;
  bool optimizer_on_nvme = false;
};

// --rates-from: the rates as a run of the same recipe measured them, per step: each step of its
// metrics.jsonl after the first gives a rate per kind of work, its op_s (the device's time per op
// family) over the work DeviceWork counts for the step (matmul: the layers' GEMMs; attention;
// norm + rope + elementwise: the memory-bound ops; cross_entropy: the lm_head's fused chunks).
// One step's rates together, not each kind's median apart: on a shared machine a step is slow in
// all its ops at once. Sorted by the step's device time (op_s summed). The rest from the same step:
//  - NVMe: bytes read and written over its disk-busy time (nvme_busy_s), the throughput the disk
//    gave the run's own mix of reads and writes, for both directions;
//  - the link: its bytes over the copy streams' busy time (link_busy_s: a throttled link's sleeps
//    included). Not the host's memory bandwidth: an unthrottled CPU-backend copy's memcpy runs on
//    cores the compute shares (3-5 GB/s here, against 50+ for a lone memcpy), and its cost is in
//    the op times already; the host's rate stays --measure's or the assumed one;
//  - AdamW: the parameters over the time the device waited for the update (optimizer_exposed_s)
//    less, with the state on NVMe, the update's waits for the disk (nvme_wait_s: the NVMe term's).
//    Not the host worker's whole busy time (optimizer_s): the op times above were measured while
//    it shared the cores, so they already carry its share of them, and the step model adds the
//    update to the compute on the CPU backend.
RunStepRates run_step_rates(const nlohmann::json& j, const RunStepWork& w) {
  const nlohmann::json& o = j["op_s"];
  RunStepRates r;
  r.step = j["step"].get<int64_t>();
  for (const auto& [kind, t] : o.items()) r.device_s += t.get<double>();
  // The compute stream's time beyond its ops (memsets, the copies issued on it, each task's
  // dispatch: 3-6% here) is device time the step pays too: spread over the kinds by their op time.
  const double stream = r.device_s > 0 ? std::max(1.0, j.value("compute_s", 0.0) / r.device_s) : 1.0;
  auto sec = [&](std::initializer_list<const char*> kinds) {
    double t = 0;
    for (const char* k : kinds) t += o.value(k, 0.0);
    return std::max(t * stream, 1e-9);
  };
  r.rates.matmul_flops_per_s = w.device.matmul_flops / sec({"matmul"});
  r.rates.attention_flops_per_s = w.device.attention_flops / sec({"attention"});
  r.rates.elementwise_bytes_per_s = w.device.elementwise_bytes / sec({"norm", "rope", "elementwise"});
  r.rates.head_flops_per_s = w.head / sec({"cross_entropy"});
  const double nvme_bytes = j.value("nvme_read_bytes", 0.0) + j.value("nvme_write_bytes", 0.0);
  const double nvme_busy = j.value("nvme_busy_s", 0.0);
  if (nvme_bytes > 0 && nvme_busy > 0) r.rates.nvme_bytes_per_s = nvme_bytes / nvme_busy;
  const double link_bytes = j.value("link_bytes", 0.0), link_busy = j.value("link_busy_s", 0.0);
  if (link_bytes > 0 && link_busy > 0) r.rates.link_bytes_per_s = link_bytes / link_busy;
  double exposed = j.value("optimizer_exposed_s", 0.0);
  if (w.optimizer_on_nvme) exposed -= j.value("nvme_wait_s", 0.0);
  // an update hidden behind the disk's waits says nothing about AdamW: its rate stays as it was
  if (exposed > 0.05 * j.value("optimizer_exposed_s", 0.0)) r.rates.adamw_params_per_s = w.params / exposed;
  return r;
}

std::vector<RunStepRates> rates_from_run(const std::string& path, const ModelSpec& spec, const PlanInputs& in,
                                         const RunPlan& plan, int64_t grad_accum) {
  std::error_code ec;
  const fs::path file = fs::is_directory(path, ec) ? fs::path(path) / "metrics.jsonl" : fs::path(path);
  std::ifstream f(file);
  STRATA_CHECK(f.good(), "--rates-from ", path, ": cannot read ", file.string(), " (give a run's output dir or its metrics.jsonl)");
  const int64_t N = in.micro_batch * in.sequence_len;
  RunStepWork work;
  work.device = layers_work(spec, in.micro_batch, in.sequence_len, plan.kept_activation_layers) * double(grad_accum);
  const bool lora = plan.lora.enabled() || in.lora.enabled();  // as step_estimate's passes count them
  work.device.elementwise_bytes += double(grad_accum) / double(std::max<int64_t>(1, plan.group)) *
                                   pass_gradient_bytes(spec, plan.group, lora);
  work.head = head_work(spec, N, spec.config.vocab_size, int64_t(plan.kept_logit_rows)).head_flops * double(grad_accum);
  work.params = double(spec.parameter_count());  // as step_estimate prices AdamW
  work.optimizer_on_nvme = plan.optimizer_on_nvme;
  std::vector<RunStepRates> steps;
  for (std::string line; std::getline(f, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.contains("op_s") || !j.contains("step") || j["step"].get<int64_t>() < 2) continue;
    STRATA_CHECK(j["tokens"].get<int64_t>() == N * grad_accum, "--rates-from ", file.string(), ": its steps ran ",
                 j["tokens"].get<int64_t>(), " tokens, this recipe's run ", N * grad_accum, " (estimate the recipe that run used)");
    steps.push_back(run_step_rates(j, work));
  }
  STRATA_CHECK(!steps.empty(), "--rates-from ", file.string(), ": no step after the first with op_s (run at least 2 steps)");
  std::sort(steps.begin(), steps.end(), [](const RunStepRates& x, const RunStepRates& y) { return x.device_s < y.device_s; });
  return steps;
}

// --gpu NAME: the table's memory, link and datasheet dense peak for the model's dtype; the step's
// GEMMs at the table's efficiency of that peak, MFU against the peak itself.
void table_gpu(const std::string& name, DType dtype, PlanInputs& in, PlanBudgets& budgets, EstimateRates& r) {
  const std::optional<GpuSpec> g = gpu_spec_find(name);
  std::string names;
  for (const GpuSpec& s : gpu_specs()) names += (names.empty() ? "" : ", ") + s.name;
  STRATA_CHECK(g, "--gpu ", name, " is not in the table (", names, "): give --gpu-memory and --gpu-flops instead");
  in.device_in_host_ram = false;
  in.device_is_cuda = true;
  budgets.device_bytes = g->memory_bytes;
  budgets.device_origin = "--gpu " + g->name;
  const std::optional<DevicePeak> peak = gpu_datasheet_peak(g->datasheet_name, dtype);
  STRATA_ASSERT(peak, "no datasheet peak for ", g->datasheet_name);
  r.rates.mfu_peak_flops_per_s = peak->flops_per_s;
  r.rates.device_flops_per_s = peak->flops_per_s * g->gemm_efficiency;
  r.rates.link_bytes_per_s = g->link_bytes_per_s;
  r.device_text = str_cat(g->name, " (", format_bytes(g->memory_bytes), ", ", g->link, " ", gb_per_s(g->link_bytes_per_s),
                          ", ", peak->flops_per_s / 1e12, " TFLOP/s ", dtype_name(dtype), " dense, GEMMs at ",
                          g->gemm_efficiency, " of it)");
}

// The device's source: the GPU table's peak and efficiency, or the CPU backend's measured GEMMs.
std::string device_source(const EstimateArgs& a) {
  if (a.gpu.empty()) return "measured here (CPU GEMM)";
  return str_cat("datasheet peak x ", gpu_spec_find(a.gpu)->gemm_efficiency, " (the GPU table's large-GEMM efficiency)");
}

}  // namespace

std::map<std::string, double> EstimateRates::values() const {
  std::map<std::string, double> v = {
      {"device", rates.device_flops_per_s},          {"link", rates.link_bytes_per_s},
      {"nvme_read", rates.nvme_read_bytes_per_s},     {"nvme_write", rates.nvme_write_bytes_per_s},
      {"adamw", rates.adamw_params_per_s > 0 ? rates.adamw_params_per_s : rates.host_bytes_per_s / adamw_bytes_per_param},
      {"host", rates.host_bytes_per_s},
      {"checksum", rates.checksum_bytes_per_s}};
  if (rates.elementwise_bytes_per_s > 0)  // the CPU backend's own, measured
    v.insert({{"attention", rates.attention_flops_per_s}, {"elementwise", rates.elementwise_bytes_per_s},
              {"head", rates.head_flops_per_s}});
  else if (rates.attention_flops_per_s > 0)  // a CUDA device's bf16 attention (step_device_rates)
    v.insert({"attention", rates.attention_flops_per_s});
  return v;
}

EstimateRates estimate_device(const EstimateArgs& a, const Recipe& recipe, DType dtype, PlanInputs& in,
                              PlanBudgets& budgets) {
  EstimateRates r;
  const bool cpu_backend = a.gpu.empty() && recipe.device_backend == "cpu" && a.gpu_memory.empty();
  if (!a.gpu.empty()) {
    table_gpu(a.gpu, dtype, in, budgets, r);
  } else if (cpu_backend) {
    r.rates.device_flops_per_s = cpu_measured_peak(dtype).flops_per_s;
    r.rates.link_bytes_per_s = recipe.device_link_bytes_per_s > 0 ? recipe.device_link_bytes_per_s : r.rates.host_bytes_per_s;
    r.device_text = str_cat("the CPU backend (", format_bytes(budgets.device_bytes), " arena in process memory, ",
                            r.rates.device_flops_per_s / 1e9, " GFLOP/s measured here)");
  } else {
    // whether it fits needs the memory alone; the step time needs the speeds too (estimate_missing_speeds)
    STRATA_CHECK(!a.gpu_memory.empty(), "for a GPU not in the table give --gpu-memory (and for a step time "
                 "--gpu-flops and --link-gbps), or --gpu NAME");
    in.device_in_host_ram = false;
    in.device_is_cuda = true;
    r.device_text = "a GPU given by its figures";
  }
  if (!a.gpu_memory.empty()) {
    budgets.device_bytes = parse_bytes(a.gpu_memory, "--gpu-memory");
    budgets.device_origin = "--gpu-memory " + a.gpu_memory;
  }
  // where each rate comes from: the GPU table, measured here, given, or an assumption (the
  // StepRates defaults), printed beside the step time
  const bool table = !a.gpu.empty();
  r.source = {{"device", table || cpu_backend ? device_source(a) : "not given"},
              {"link", table ? "datasheet" : "not given"}, {"nvme_read", "assumed"},
              {"nvme_write", "assumed"}, {"host", "assumed"},
              {"checksum", "assumed"}};
  // AdamW streams its arrays once: the assumed memory bandwidth over the bytes one update touches.
  // Left unset in the rates (0), so that every candidate the plan weighs — and every "what to
  // change" entry (bf16 moments) — is priced at its own bytes per parameter; reported for the
  // recipe's own state.
  r.adamw_bytes_per_param = step_adamw_bytes_per_param(dtype, in);
  r.source["adamw"] = str_cat("assumed (", r.rates.host_bytes_per_s / 1e9, " GB/s memory / ",
                              step_adamw_bytes_per_param(dtype, in), " bytes per parameter; each candidate plan at its own bytes)");
  if (cpu_backend)
    r.source["link"] = recipe.device_link_bytes_per_s > 0 ? "device.link_bandwidth (throttle)" : "memcpy (host bandwidth)";
  // the file engine sums NVMe blocks on min(4, cores) threads: this machine's for the CPU backend,
  // a GPU workstation's 4 otherwise
  r.rates.checksum_threads = cpu_backend ? file_engine_checksum_threads() : 4;
  r.source["checksum"] = str_cat("assumed (", r.rates.checksum_bytes_per_s / 1e9, " GB/s a thread, on ",
                                 r.rates.checksum_threads, " threads)");
  return r;
}

void estimate_run_rates(const StepRates& run, EstimateRates& r) {
  if (run.elementwise_bytes_per_s <= 0) return;  // no layer probed (past kLayerProbeMaxBytes): the peak prices every op
  r.rates.mfu_peak_flops_per_s = r.rates.device_flops_per_s;
  r.rates.device_flops_per_s = run.device_flops_per_s;
  r.rates.attention_flops_per_s = run.attention_flops_per_s;
  r.rates.elementwise_bytes_per_s = run.elementwise_bytes_per_s;
  r.rates.head_flops_per_s = run.head_flops_per_s;
  r.source["device"] = "measured here (a layer's GEMMs at this model's shapes, as the run plans)";
  r.source["attention"] = r.source["elementwise"] = r.source["head"] =
      "measured here (a layer and an lm_head chunk, as the run plans)";
}

std::string estimate_missing_speeds(const EstimateRates& r) {
  const bool device = r.rates.device_flops_per_s > 0, link = r.rates.link_bytes_per_s > 0;
  if (device && link) return "";
  return str_cat(device ? "" : "--gpu-flops F", !device && !link ? " and " : "", link ? "" : "--link-gbps G");
}

void estimate_rates_from(const std::string& path, const Recipe& recipe, const ModelSpec& spec, const PlanInputs& in,
                         const RunPlan& plan, EstimateRates& r) {
  STRATA_CHECK(r.source["device"].rfind("measured here", 0) == 0, "--rates-from prices the CPU backend: not with --gpu or --gpu-memory");
  r.run_steps = rates_from_run(path, spec, in, plan, plan.accumulation_steps);
  const RunStepRates& median = r.run_steps[(r.run_steps.size() - 1) / 2];
  use_run_rates(r.rates, median.rates);
  const std::string from = str_cat("from ", path, " (step ", median.step);
  r.source["device"] = r.source["attention"] = r.source["elementwise"] = r.source["head"] =
      from + ": the median device time of its steps after the first)";
  const MeasuredRates& m = median.rates;
  if (m.nvme_bytes_per_s > 0)
    r.source["nvme_read"] = r.source["nvme_write"] = from + ": NVMe bytes read + written over its disk-busy time)";
  if (m.link_bytes_per_s > 0) r.source["link"] = from + ": link bytes over the copy streams' busy time)";
  if (m.adamw_params_per_s > 0)
    r.source["adamw"] = from + ": parameters over the update's exposed time less its NVMe waits)";
}

void estimate_given_rates(const EstimateArgs& a, EstimateRates& r) {
  auto given = [&](double value, double scale, double& rate, const char* name) {
    if (value > 0) rate = value * scale, r.source[name] = "given";
  };
  given(a.gpu_flops, 1, r.rates.device_flops_per_s, "device");
  given(a.link_gbps, 1e9, r.rates.link_bytes_per_s, "link");
  given(a.nvme_read_gbps, 1e9, r.rates.nvme_read_bytes_per_s, "nvme_read");
  given(a.nvme_write_gbps, 1e9, r.rates.nvme_write_bytes_per_s, "nvme_write");
  given(a.adamw_params_per_s, 1, r.rates.adamw_params_per_s, "adamw");
}

void use_run_rates(StepRates& rates, const MeasuredRates& m) {
  if (rates.mfu_peak_flops_per_s == 0) rates.mfu_peak_flops_per_s = rates.device_flops_per_s;
  rates.device_flops_per_s = m.matmul_flops_per_s;
  rates.attention_flops_per_s = m.attention_flops_per_s;
  rates.elementwise_bytes_per_s = m.elementwise_bytes_per_s;
  rates.head_flops_per_s = m.head_flops_per_s;
  if (m.nvme_bytes_per_s > 0) rates.nvme_read_bytes_per_s = rates.nvme_write_bytes_per_s = m.nvme_bytes_per_s;
  if (m.link_bytes_per_s > 0) rates.link_bytes_per_s = m.link_bytes_per_s;
  if (m.adamw_params_per_s > 0) rates.adamw_params_per_s = m.adamw_params_per_s;
}

}  // namespace strata
