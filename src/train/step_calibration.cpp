#include "src/train/step_calibration.h"

#include <cstdio>

#include "src/core/error.h"

namespace strata {

StepRates step_calibration_rates(const DevicePeak& peak, const LayerRates& layer, bool device_in_host_ram,
                                 double link_bytes_per_s) {
  StepRates r;  // NVMe, AdamW, host memory and checksums at their stated defaults
  r.device_flops_per_s = r.mfu_peak_flops_per_s = peak.flops_per_s;
  if (device_in_host_ram && layer.measured()) {  // as the run's plan was priced (plan_run_rates)
    r.device_flops_per_s = layer.matmul_flops_per_s;
    r.attention_flops_per_s = layer.attention_flops_per_s;
    r.elementwise_bytes_per_s = layer.elementwise_bytes_per_s;
    r.head_flops_per_s = layer.head_flops_per_s;
  }
  r.link_bytes_per_s = link_bytes_per_s;
  if (r.link_bytes_per_s > 0) return r;
  if (device_in_host_ram) {
    r.link_bytes_per_s = r.host_bytes_per_s;  // the CPU backend's copies are memcpy
    return r;
  }
  r.link_bytes_per_s = 25e9;  // a PCIe 4.0 x16 link as pinned copies measure, below its 32 GB/s nominal
  return r;
}

nlohmann::json step_calibration(const StepEstimate& e, const StepRates& rates, const StepPhases& m) {
  auto component = [&](const char* name) {
    const auto it = e.components.find(name);
    return it == e.components.end() ? 0.0 : it->second;
  };
  auto phase = [](double measured, double estimated) {
    return nlohmann::json{{"measured", measured}, {"estimated", estimated}};
  };
  nlohmann::json c = {{"step", m.step},
                      {"measured_s", m.step_s},
                      {"estimated_s", e.seconds},
                      {"ratio", e.seconds > 0 ? m.step_s / e.seconds : 0.0},
                      {"bottleneck", e.bottleneck}};
  c["phases"] = {{"compute", phase(m.compute_s, component("compute"))},
                 {"link", phase(m.link_s, component("link"))},
                 {"nvme", phase(m.nvme_s, component("nvme"))},
                 {"optimizer+host", phase(m.optimizer_s, component("optimizer") + component("host"))}};
  c["rates"] = {{"device_flops_per_s", rates.device_flops_per_s}, {"link_bytes_per_s", rates.link_bytes_per_s},
                {"nvme_read_bytes_per_s", rates.nvme_read_bytes_per_s},
                {"nvme_write_bytes_per_s", rates.nvme_write_bytes_per_s},
                {"adamw_params_per_s", rates.adamw_params_per_s}, {"host_bytes_per_s", rates.host_bytes_per_s},
                {"attention_flops_per_s", rates.attention_flops_per_s},
                {"elementwise_bytes_per_s", rates.elementwise_bytes_per_s}, {"head_flops_per_s", rates.head_flops_per_s},
                {"mfu_peak_flops_per_s", rates.mfu_peak_flops_per_s}};
  return c;
}

std::string step_calibration_line(const nlohmann::json& c) {
  char head[160];
  std::snprintf(head, sizeof head, "step model at step %ld: measured %.3g s a step, estimated %.3g s (x%.2f);",
                long(c["step"].get<int64_t>()), c["measured_s"].get<double>(), c["estimated_s"].get<double>(),
                c["ratio"].get<double>());
  std::string line = head;
  const char* order[] = {"compute", "link", "nvme", "optimizer+host"};
  for (const char* name : order) {
    const nlohmann::json& p = c["phases"][name];
    char part[96];
    std::snprintf(part, sizeof part, "%s %s %.3g/%.3g", name == order[0] ? "" : ",", name, p["measured"].get<double>(),
                  p["estimated"].get<double>());
    line += part;
  }
  return line + " (measured/estimated s)";
}

}  // namespace strata
