// The step-model tests' fixtures (tests/offload/test_step_model.cpp, test_plan_speculation.cpp):
// a 134M-parameter model, its plan inputs, and rates under which compute alone decides the step.
#pragma once
#include "io/hf_config.h"
#include "offload/plan/placement_plan.h"
#include "offload/plan/step_estimate.h"
#include "tests/testing.h"

namespace strata::step_model_fixtures {

// 4 layers of C 1024, F 4096, 8 heads of 128, V 32768 untied, bf16: 134M parameters; one
// micro-batch of 1024 tokens is ~0.8 TFLOP of device work, a quarter of it forward.
inline ModelSpec tiny_spec() {
  return model_spec_build(testing::tiny_llama_config({1024, 4096, 4, 32768, 4096, false, 8, 8}), DType::bf16);
}

inline PlanInputs tiny_inputs() {
  PlanInputs in;
  in.checkpoints = CheckpointMode::device;
  in.optimizer = StateTier::host;
  in.recompute = RecomputeMode::always;
  in.micro_batch = 1;
  in.sequence_len = 1024;
  in.head_chunk_rows = 8192;  // 4 lm_head chunks through 2 slots
  return in;
}

// Compute at 1 TFLOP/s; the link, the host's memory and NVMe free.
inline StepRates compute_rates() {
  StepRates r;
  r.device_flops_per_s = 1e12;
  r.link_bytes_per_s = 1e18;
  r.host_bytes_per_s = 1e18;
  r.nvme_read_bytes_per_s = r.nvme_write_bytes_per_s = 1e18;
  return r;
}

// One micro-batch's forward at 1 TFLOP/s: every layer's forward and the lm_head's statistics.
inline double forward_seconds(const ModelSpec& spec, const PlanInputs& in) {
  const DeviceWork f = layers_forward_work(spec, in.micro_batch, in.sequence_len);
  const double head = 2.0 * double(in.micro_batch * in.sequence_len) * 32768 * 1024;
  return (f.matmul_flops + f.attention_flops + head) / 1e12;
}

}  // namespace strata::step_model_fixtures
