// The step-time estimate of `strata estimate` (DESIGN §8c): a roofline of the schedule strata
// really runs (DESIGN §3), priced with a device's matrix FLOP/s, the host link, NVMe and the
// CPU AdamW rate. The bytes come from the placement plan (offload/placement_plan.h): which
// checkpoints spill, whether master and moments live on NVMe; the FLOPs from the model table.
//
// Per micro-batch (k of them per optimizer step):
//   compute  model FLOPs (6 per matmul parameter per token, plus causal attention) plus the
//            recompute of every layer's forward in backward (2 per layer matmul parameter,
//            plus attention's forward), at the device's dense peak
//   link     streamed weights cross host -> device twice (forward, backward), resident weights
//            once per optimizer step; each layer's f32 gradient and the lm_head's cross device
//            -> host once; spilled checkpoints go out and come back. h2d and d2h overlap
//            (the link is full duplex): the slower direction counts
//   nvme     checkpoints on NVMe: written in forward, read in backward
// Per optimizer step, on the host, overlapped with the next step's forward:
//   optimizer  CPU AdamW over every parameter, plus the host-side gradient accumulation
//   nvme       master + m + v read and written back once when they live on NVMe (pipelined
//              with AdamW: the slower of the two counts)
// step = max(k x max(compute, link, nvme checkpoints), max(optimizer, nvme state)); the
// bottleneck is the component that sets it.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "models/model_spec.h"
#include "offload/placement_plan.h"

namespace strata {

// A GPU as the estimate sees it: its datasheet dense peak (src/device/peak_flops.h's table),
// memory and host link (per direction).
struct GpuSpec {
  std::string name;            // "H100 SXM"
  std::string datasheet_name;  // the CUDA device name gpu_datasheet_peak matches
  size_t memory_bytes = 0;
  double link_bytes_per_s = 0;
  std::string link;            // "PCIe 5.0 x16"
};

const std::vector<GpuSpec>& gpu_specs();
// By name, case- and space-insensitive ("h100-sxm", "RTX 4090", "a100 80gb"); nullopt if unknown.
std::optional<GpuSpec> gpu_spec_find(const std::string& name);

struct StepRates {
  double device_flops_per_s = 0;        // dense matmul peak for the model's dtype
  double link_bytes_per_s = 0;          // host <-> device, per direction
  double nvme_read_bytes_per_s = 1.5e9;
  double nvme_write_bytes_per_s = 2.0e9;
  double adamw_params_per_s = 1.0e9;    // CPU AdamW over f32 master, m, v (and the working copy)
  double host_bytes_per_s = 50e9;       // host memory bandwidth (gradient accumulation)
};

struct StepEstimate {
  double seconds = 0, tokens_per_s = 0, mfu = 0;
  std::string bottleneck;                     // "compute" | "link" | "nvme" | "optimizer" | "host"
  std::map<std::string, double> components;   // name -> seconds per optimizer step
  double model_flops_per_token = 0;           // for MFU (no recompute)
};

// Model FLOPs of one token's forward + backward at context T (as the trainer's MFU counts them).
double model_flops_per_token(const ModelSpec& spec, int64_t T);

// in.optim_type = "zo-sgd": the zeroth-order step instead (zo_perturbations = optim.zo_perturbations):
// q x grad_accum dual forwards, each max(two forward passes, the weights once over the link),
// plus the host ZO-SGD update beyond what one dual forward hides.
StepEstimate step_estimate(const ModelSpec& spec, const PlanInputs& in, const PlacementPlan& plan,
                           int64_t grad_accum, const StepRates& rates, int64_t zo_perturbations = 1);

}  // namespace strata
