// The first-order trainer: the step engine (offload/engine/engine.h) fed from packed token rows, with
// a token-mean loss over every micro-batch of an optimizer step, exact global-norm clipping,
// warmup + cosine/linear schedule, metrics.jsonl per step, eval loss on a held-out split,
// checkpoints every save_steps and at the end (src/train/checkpoint.h), bit-exact resume, and
// a Hugging Face export in output_dir/final.
//
// train_run reads as its steps: set up (inputs checked, budgets checked before any data is
// tokenized or weight initialised, data, weights), resume, then per step: next batch, step,
// record, save. Stopping by signal: src/train/signals.h (the CLI exits 130).
#pragma once
#include <string>
#include <vector>

#include "offload/plan/placement_plan.h"
#include "src/recipe/recipe.h"
#include "src/train/signals.h"

namespace strata {

struct TrainSummary {
  std::vector<double> losses;  // per optimizer step
  double tokens_per_s = 0;     // over the whole run, after the first step
  double matmul_share = 0;     // fraction of compute time spent in matmuls (sampled)
  std::string final_dir;        // set when the run finished
  std::string last_checkpoint;  // the newest checkpoint this run saved
  bool interrupted = false;     // stopped by a signal (after saving, when a step had run)
};

struct TrainOptions {
  bool resume_latest = false;  // --resume auto: the newest complete checkpoint in output_dir (step 0 when none)
  std::string resume;          // --resume DIR: that checkpoint dir ("" and not resume_latest: start at step 0)
  bool resuming() const { return resume_latest || !resume.empty(); }
  bool overwrite = false;  // a fresh run may replace the run already in output_dir
  std::vector<std::string> overrides;  // the command line's key=value, repeated in the "resume with:" hint
  int64_t stop_at_step = 0;  // > 0: behave as if a signal arrived during this step (tests)
};

TrainSummary train_run(const Recipe& recipe, const TrainOptions& options = {});

// HF-style learning-rate multiplier for 0-based step `s` of `total`.
double lr_schedule(LrSchedule type, int64_t s, int64_t total, int64_t warmup, double min_ratio);

}  // namespace strata
