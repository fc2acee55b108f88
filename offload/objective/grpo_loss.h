// The GRPO family of losses on the host (TRL 1.16's GRPOTrainer._compute_loss, token-level
// importance sampling): from each completion token's log-probability under the policy (from the
// engine's head statistics, logits divided by the temperature), the old policy's and the
// reference's, and each row's advantage A:
//   r = exp(logp - old)          clipped  r' = clamp(r, 1 - epsilon, 1 + epsilon_high)
//   per-token loss  l = -min(r A, r' A) + beta (exp(ref - logp) - (ref - logp) - 1)   (k3 KL)
// normalised as loss_type says, over a step of `micro_batches` micro-batches (gradient
// accumulation; each micro-batch's share is what TRL's loss / normaliser is):
//   grpo     mean over rows of (Σ_row l / max(1, n_row)), / micro_batches
//   bnpo     Σ l / max(1, n_tokens of the micro-batch), / micro_batches
//   dr_grpo  Σ l / (rows · max_completion_length), / micro_batches
//   dapo     Σ l / max(1, n_tokens of the whole step)
// and d loss / d logp per token, with torch's subgradients (min splits a tie evenly, clamp
// passes its bounds), so the gradient is autograd's. Shapes: per-token arrays hold the counted
// tokens of a row in order.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace strata {

enum class GrpoLossType { grpo, bnpo, dr_grpo, dapo };
GrpoLossType grpo_loss_type_parse(const std::string& name);  // exit 2 naming the valid ones
const char* grpo_loss_type_name(GrpoLossType t);

struct GrpoParams {
  GrpoLossType loss_type = GrpoLossType::dapo;  // TRL's default
  double beta = 0;                              // KL coefficient; 0: no reference
  double epsilon = 0.2, epsilon_high = 0.2;     // clipping: [1 - epsilon, 1 + epsilon_high]
  double temperature = 1;                       // log-probs of logits / temperature
  int64_t max_completion_length = 0;            // dr_grpo's constant denominator
};

// One completion row of a micro-batch: its counted tokens' log-probs.
struct GrpoRow {
  double advantage = 0;
  std::vector<double> logp;      // (n_row) the policy's, being differentiated
  std::vector<double> old_logp;  // (n_row) or empty: logp itself (detached)
  std::vector<double> ref_logp;  // (n_row), required when beta > 0
};

// What normalises a micro-batch within its step.
struct GrpoStepTotals {
  int64_t micro_batches = 1;  // gradient accumulation steps
  int64_t tokens = 0;         // counted tokens of the whole step (dapo)
};

// Sums for TRL's metrics, added over micro-batches; means are sum / tokens.
struct GrpoMetricSums {
  int64_t tokens = 0;
  double clip_low = 0, clip_high = 0, clip_region = 0;  // counted tokens clipped
  double kl = 0;                                         // Σ per-token KL (beta > 0)
  double entropy = 0;  // Σ per-token entropy of softmax(logits / T) (the GRPO head's, grpo_head.h)
  void add(const GrpoMetricSums& o) {
    tokens += o.tokens, clip_low += o.clip_low, clip_high += o.clip_high, clip_region += o.clip_region, kl += o.kl;
    entropy += o.entropy;
  }
};

struct GrpoLoss {
  double loss = 0;                    // this micro-batch's share of the step loss
  std::vector<std::vector<double>> d_logp;  // (rows, n_row) d loss / d logp
  GrpoMetricSums metrics;
};

GrpoLoss grpo_loss(const GrpoParams& p, const std::vector<GrpoRow>& rows, const GrpoStepTotals& totals);

}  // namespace strata
