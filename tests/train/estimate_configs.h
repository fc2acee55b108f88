// The configurations `strata estimate` is validated on against real CPU-backend runs (issue 13):
// tests/train/test_plan_rss.cpp checks their bytes, tests/train/test_estimate_step.cpp their step
// time. Streamed and resident weights; checkpoints on the device, pinned host and NVMe; master and
// moments on NVMe; gradient accumulation 2 and 3; the link throttled to 1 and 2 GB/s; a Llama
// shape (the recipe's model) and a Qwen3 shape (`qwen3_config`). Each test adds its sixth.
// Each names its weights' placement and accumulation: "auto" decides them from rates the run
// probes (offload/plan/layer_probe.h), and a near tie could otherwise go one way in the run and the
// other in the estimate.
#pragma once
#include <string>
#include <vector>

namespace strata::testing {

struct EstimateConfig {
  std::string name;
  std::vector<std::string> overrides;  // section.key=value
};

inline std::vector<EstimateConfig> estimate_validation_configs(const std::string& qwen3_config, const std::string& nvme_dir) {
  const std::string qwen3 = "model.config=" + qwen3_config, on_nvme = "offload.nvme_path=" + nvme_dir;
  return {
      {"llama stream f32 ckpt=device", {"model.dtype=f32", "offload.weights=stream", "offload.checkpoints=device"}},
      {"llama resident bf16 ckpt=host accum 2",
       {"model.dtype=bf16", "offload.weights=device", "offload.checkpoints=host", "train.gradient_accumulation_steps=2",
        "offload.accumulation=micro_batch"}},
      {"llama stream bf16 nvme ckpt+optim link 2GB/s",
       {"model.dtype=bf16", "offload.weights=stream", "offload.checkpoints=nvme", "offload.optimizer=nvme", on_nvme,
        "device.link_bandwidth=2GB/s"}},
      {"qwen3 stream bf16 ckpt=host accum 3 link 1GB/s",
       {qwen3, "model.dtype=bf16", "offload.weights=stream", "offload.checkpoints=host",
        "train.gradient_accumulation_steps=3", "offload.accumulation=micro_batch", "device.link_bandwidth=1GB/s"}},
      {"qwen3 stream f32 ckpt=nvme optim=nvme accum 2",
       {qwen3, "model.dtype=f32", "offload.weights=stream", "offload.checkpoints=nvme", "offload.optimizer=nvme", on_nvme,
        "train.gradient_accumulation_steps=2", "offload.accumulation=micro_batch"}},
  };
}

}  // namespace strata::testing
