// The GRPO objectives (grpo_loss.h) as the engine's loss head (loss_objective.h). After the
// head's stats pass, each counted token's log-probability log p = z_target - max - log Σ exp(z -
// max) is read from the online-softmax statistics (N, 3 doubles to the host: never T x V
// logits). offload/objective/grpo_loss turns the rows' log-probs into the loss and d loss / d logp,
// and the head's backward runs with each token's weight -d loss / d logp
// (Device::lm_head_ce_chunk_backward_weighted), as the preference head does.
// Entropy (TRL's `entropy` metric): the head's stats pass is the variant that also keeps each
// token's Σ exp(z - max) (z - max) (Device::lm_head_ce_chunk_stats_entropy, N more doubles to
// the host), so a counted token's entropy H = log Σ exp(z - max) - that / Σ exp(z - max) comes
// with its log-prob; only this head pays for it.
//
// Temperature (TRL: log-probs of logits / T): logits / T = (h / T) W^T and h = rmsnorm(x) · g, so
// the passes run with the final norm's weight g / T (GrpoTemperature, below) — the same
// function of every other parameter, no device op of its own — and d loss / d g is then the
// gradient of g / T divided by T. A norm that scales by (1 + g) (Gemma) runs with
// g' = (1 + g) / T - 1, whose gradient is likewise d loss / d g times T.
//
// Layout: one completion per micro-batch row; position i = b T + t of row b predicts token t + 1
// (HF shift), so the contract's per-token entry t + 1 (old, reference log-probs, completion mask)
// sits at position i.
#pragma once
#include <cstdint>
#include <vector>

#include "models/micro_batch.h"
#include "offload/objective/grpo_loss.h"
#include "offload/objective/loss_objective.h"
#include "offload/state/host_store.h"

namespace strata {

struct GrpoLayout {
  int64_t rows = 0, cols = 0;          // B, T of the micro-batch
  std::vector<double> advantages;      // (B)
  std::vector<double> old_logp;        // (B T) by position, or empty: the policy's own (detached)
  std::vector<double> ref_logp;        // (B T) by position, or empty (beta = 0)
  GrpoStepTotals totals;
};

// Rows of ids with a completion mask (contract: entry t says whether token t counts; entry 0
// never does) into one micro-batch: targets = ids[t + 1] where mask[t + 1], else -100; rows
// padded at their end to the longest. Per-token arrays aligned with the ids (old, ref) are moved
// to positions by grpo_by_position.
MicroBatch grpo_micro_batch(const std::vector<std::vector<int32_t>>& ids,
                            const std::vector<std::vector<int32_t>>& completion_mask);
std::vector<double> grpo_by_position(const std::vector<std::vector<double>>& per_token, int64_t cols);

// The final norm's weight in the host working copy times 1 / temperature for the passes of one
// optimizer step, and back. Hazard: the engine uploads the norm when its device copy is stale —
// at its first pass and after each update — so the scaling must come before the step's first
// pass and no other pass may run on the engine between finish() and the next update (a LoRA
// run's frozen norm is uploaded once: scaled, as every GRPO pass wants it). T = 1: nothing.
class GrpoTemperature {
 public:
  GrpoTemperature(HostStore& store, double temperature);
  ~GrpoTemperature() { restore(); }
  GrpoTemperature(const GrpoTemperature&) = delete;
  GrpoTemperature& operator=(const GrpoTemperature&) = delete;
  // After the step's passes, the engine synchronised: the weight back bit for bit, and the
  // final norm's gradient (when the store holds gradients) divided by T.
  void finish();

 private:
  void restore();
  HostStore& store_;
  float* weight_ = nullptr;   // (C) the working copy's final norm; null: T = 1
  std::vector<float> saved_;  // (C)
  float inv_t_ = 1.f;
};

class GrpoHead final : public LossObjective {
 public:
  // max_tokens: the engine's N capacity; max_group: the micro-batches of its largest pass.
  GrpoHead(Device& dev, const GrpoParams& params, int64_t max_tokens, size_t max_group = 1);
  ~GrpoHead() override;
  GrpoHead(const GrpoHead&) = delete;
  GrpoHead& operator=(const GrpoHead&) = delete;

  // The next pass's layouts and micro-batches' targets, one per micro-batch.
  void set_layouts(std::vector<GrpoLayout> layouts, const std::vector<const MicroBatch*>& mbs);
  void set_layout(GrpoLayout layout, const MicroBatch& mb);
  // After a pass: micro-batch m's per-position log-probs (N; NaN where not counted), its loss.
  const std::vector<double>& token_logps(size_t m = 0) const { return passes_.at(m).logp; }
  const GrpoLoss& result(size_t m = 0) const { return passes_.at(m).result; }
  const GrpoParams& params() const { return params_; }

  // After a pass: micro-batch m's per-position entropies (N; NaN where not counted).
  const std::vector<double>& token_entropies(size_t m = 0) const { return passes_.at(m).entropy; }

  void chunk_stats(double* stats, const HeadTensors& head, const void* w_chunk, DType w_type, int64_t v0, int64_t vc,
                   bool first, float* keep_logits, Device& dev, Stream s) override;
  void loss(double* loss_sum, const HeadTensors& head, Device& dev, Stream s) override;
  void chunk_backward(float* dh, float* dw_chunk, const HeadTensors& head, const void* w_chunk, DType w_type,
                      int64_t v0, int64_t vc, float grad_scale, float* kept_logits, Device& dev,
                      Stream s) override;

 private:
  struct MicroBatchHead {
    GrpoLayout layout;
    std::vector<int32_t> targets;  // (N) host copy
    std::vector<double> logp;      // (N)
    std::vector<double> entropy;   // (N)
    GrpoLoss result;
  };
  Device& dev_;
  GrpoParams params_;
  int64_t capacity_ = 0;
  size_t max_group_ = 1;
  float* weight_dev_ = nullptr;  // (max_group, N)
  double* ent_dev_ = nullptr;    // (max_group, N) the entropy accumulators
  std::vector<MicroBatchHead> passes_;
  std::vector<double> stats_host_;  // (N, 3)
  std::vector<double> ent_host_;    // (N)
  std::vector<float> weight_host_;  // (N), alive until the next loss() synchronises
  double loss_host_ = 0;
};

}  // namespace strata
