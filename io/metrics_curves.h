// Reading metrics.jsonl back into the series `strata plot` draws: loss and lr per training step,
// eval loss per eval step. A resumed run may have written a step twice; the last record wins.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace strata {

struct MetricsCurves {
  std::vector<int64_t> steps;       // training steps, ascending, each once
  std::vector<double> loss;         // per step; NaN where the record says null (a NaN or inf loss)
  std::vector<double> lr;           // per step; NaN where absent
  std::vector<int64_t> eval_steps;  // ascending, each once
  std::vector<double> eval_loss;    // per eval step; NaN where null
  // preference objectives (TRL's names): per step and per eval step; NaN where absent
  std::vector<double> margins, accuracies;            // "rewards/margins", "rewards/accuracies"
  std::vector<double> eval_margins, eval_accuracies;  // "eval_rewards/margins", "eval_rewards/accuracies"
  bool has_preference() const;                        // any of the four is finite
  std::vector<double> reward;                         // GRPO: "reward" (the mean total reward) per step
  bool has_reward() const;                            // any finite
  // data parallel (distributed.diagnostics_steps): the "workers" record of the steps that have one
  std::vector<int64_t> worker_steps;                  // ascending, each once
  std::vector<double> worker_loss_spread, worker_grad_norm_spread, worker_cosine;  // per worker step
  int64_t skipped_torn_lines = 0;   // 1 when an unterminated, unparseable last line was skipped
};

// Lines are training records ({"step", "loss", "lr", ..., optionally "workers": {"loss_spread",
// "grad_norm_spread", "cosine", ...}}) or eval records ({"step",
// "eval_loss", ...}); other records and blank lines are passed over. A broken line is a
// strata::Error (exit 2) naming path:line, except an unterminated last line, which is what a
// run being written or killed mid-write leaves: it is skipped and counted.
MetricsCurves metrics_read_curves(const std::string& path);

}  // namespace strata
