// The engine interface the trainer holds (one, whichever the plan built): one optimizer step
// over this rank's micro-batches, the forward-only loss (eval), synchronize and the counters.
// Two implementations: the first-order engine (offload/engine/engine.h: AdamW, LoRA-AdamW,
// micro-batch or layer-major) and the zeroth-order one (offload/engine/engine_zo.h: ZO-SGD's
// perturbed passes). A preference step (offload/objective/preference_head.h) runs on the
// first-order engine with its loss objective replaced.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/micro_batch.h"
#include "offload/state/adamw.h"
#include "src/device/device.h"

namespace strata {

// Cumulative; the trainer reports per-step differences. compute_s + h2d_wait_s + d2h_wait_s +
// optimizer_exposed_s is about the wall time of the steps (the compute stream's timeline: busy,
// blocked on another stream, or out of work because the trainer thread waited on the host);
// optimizer_s overlaps compute by design and is not part of that sum.
struct EngineStats {
  double compute_s = 0;         // compute stream busy running ops
  double h2d_wait_s = 0;        // compute stream blocked on another stream: weights/checkpoints
                                // arriving, or a gradient slot still being copied out
  double d2h_wait_s = 0;        // compute stream out of work while the trainer thread waited for
                                // gradients to reach the host (staging reuse, end of backward)
  double optimizer_s = 0;       // host worker working: gradient accumulation + AdamW (its waits
                                // for device copies excluded)
  double optimizer_exposed_s = 0;  // compute stream out of work while the trainer thread waited
                                   // for an optimizer update or computed the global norm
  size_t link_bytes = 0;        // h2d + d2h
  size_t layer_upload_bytes = 0;  // of those, the decoder layers' weights uploaded (an NF4 base: its packed bytes)
  uint64_t nvme_read_bytes = 0;   // optimizer state and activation checkpoints read from NVMe
  uint64_t nvme_write_bytes = 0;  // ... and written
  double nvme_wait_s = 0;         // the optimizer's pass blocked on NVMe reads or write-backs, plus
                                  // the trainer thread blocked on checkpoint files
  double nvme_busy_s = 0;         // disk time: some NVMe transfer in flight (file_engines_busy_seconds)
  uint64_t speculated_updates = 0;  // groups updated ahead of the global norm (offload.speculative_update)
  uint64_t speculation_redos = 0;   // ... of which redone because the norm clipped
};

// The trainer thread blocks in `wait`; returns the part of that time the compute stream was
// neither busy nor blocked on another stream (it had run out of work). Only that part lengthens
// a step: the rest overlapped device work. (EngineStats' *_exposed_s and d2h_wait_s.)
double engine_exposed_wait(Device& dev, const std::function<void()>& wait);

// One optimizer step's work.
struct StepWork {
  const std::vector<MicroBatch>* micro = nullptr;  // this rank's micro-batches of the step
  int64_t counted = 0;       // labelled tokens of the whole step (every rank's); the loss is a mean over them
  int64_t step = 0;          // 1-based
  AdamWParams hyper;         // this step's lr (schedule applied), betas, eps, step
  double max_grad_norm = 0;  // clip to this (0: no clipping)
  double weight_decay = 0;   // on matrices only
  // Every gradient lands before the update (clipping needs the global norm; a shared store needs
  // every rank's); false: each group updates as its last gradient lands.
  bool gradients_first = true;
  // With clipping at one pass a step (layer-major, or one micro-batch): run the pass twice, the
  // first for the global norm alone (each gradient dropped as it lands), the second updating each
  // group as it lands, clipped (RunPlan::norm_pass: the gradients stay in flight). Bit-identical.
  bool norm_pass = false;
};

struct StepOutcome {
  // Summed loss of each of this rank's micro-batches (in order), to be summed over the ranks in
  // the global order; or, when `global`, one entry: the whole step's summed loss, the same on
  // every rank (the zeroth-order engine exchanges its loss scalars itself).
  std::vector<double> losses;
  bool global = false;
  double grad_norm = 0;      // before clipping; zeroth order: |projected gradient|
  nlohmann::json extra = nlohmann::json::object();  // the engine's own metrics for metrics.jsonl
  size_t comm_bytes = 0;     // bytes this rank exchanged for the step (zeroth order: loss scalars)
};

class StepEngine {
 public:
  virtual ~StepEngine() = default;
  virtual StepOutcome train_step(const StepWork& work) = 0;
  virtual double forward_loss(const MicroBatch& mb) = 0;  // summed loss over counted positions
  virtual void synchronize() = 0;                          // all queued device and host work finished
  virtual EngineStats stats() const = 0;
  virtual size_t pinned_bytes() const = 0;                 // the engine's own pinned host buffers
  // What the engine keeps on the device (the plan's counts; 0 for an engine without them).
  virtual size_t device_checkpoints() const { return 0; }
  virtual size_t kept_activation_layers() const { return 0; }
  virtual size_t kept_logit_chunks() const { return 0; }
};

}  // namespace strata
