// The step model against the run that it prices (DESIGN §11: calibrate the model from a run's own
// phase times). After its first steps a training run prices its own step with
// offload/plan/step_estimate.h — its plan, its inputs, and the rates it knows without measuring
// anything more: the device's (on the CPU backend the layer's rates its plan was priced at,
// offload/plan/layer_probe.h, or its GEMM peak where no layer was probed; a GPU's datasheet), the link (device.link_bandwidth; else the host's memcpy on the CPU backend, 25 GB/s
// on a GPU: PCIe 4.0 x16 as pinned copies measure) and StepRates' stated defaults for the rest — and
// compares each phase it measured with the model's: one stderr line, and metrics.jsonl's
// "step_model". `strata estimate --rates-from RUN` then prices it again at the run's own rates.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "offload/plan/layer_probe.h"
#include "offload/plan/step_estimate.h"
#include "src/device/peak_flops.h"

namespace strata {

// One step as the run measured it (metrics.jsonl's fields of the same names).
struct StepPhases {
  int64_t step = 0;
  double step_s = 0;       // the step's wall time, a save excluded
  double compute_s = 0;    // the compute stream running ops (compute_s)
  double link_s = 0;       // the busier copy stream: h2d or d2h (a throttled link's sleeps included)
  double nvme_s = 0;       // the disk busy with some transfer (nvme_busy_s)
  double optimizer_s = 0;  // the host worker: gradient accumulation and AdamW (optimizer_s)
};

// The rates a run prices itself at (see the top); link_bytes_per_s is device.link_bandwidth (0: unset).
StepRates step_calibration_rates(const DevicePeak& peak, const LayerRates& layer, bool device_in_host_ram,
                                 double link_bytes_per_s);

// The comparison, as metrics.jsonl's "step_model": {"step", "measured_s", "estimated_s", "ratio"
// (measured / estimated), "bottleneck", "phases": {name: {"measured", "estimated"}}, "rates"}.
// Phases: compute, link, nvme, and "optimizer+host" — the host worker's time against the model's
// AdamW plus its host work (accumulation; on the CPU backend also the copies' memcpy and the NVMe
// checksums, which run elsewhere in the process).
nlohmann::json step_calibration(const StepEstimate& e, const StepRates& rates, const StepPhases& m);

// The stderr line: "step model at step 3: measured 1.23 s a step, estimated 1.10 s (x1.12); compute
// 0.80/0.70, link ..." (each phase measured/estimated).
std::string step_calibration_line(const nlohmann::json& c);

}  // namespace strata
