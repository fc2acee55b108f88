// The preference objectives (DPO, IPO, SimPO, ORPO) as the engine's loss head (offload/
// loss_objective.h). After the head's stats pass, the per-token log-probs are reduced on the
// device into per-sequence sums s and counts n (Device::lm_head_ce_stats_seq_sums, never T x V
// logits); those few numbers come to the host, offload/objective/preference_loss turns the pairs' sums
// into the loss and d loss / d s, each token gets the weight w_t = -d loss / d s of its
// sequence, and the head's backward runs with d loss / d logits_t = w_t · (softmax - onehot)
// (Device::lm_head_ce_chunk_backward_weighted). A micro-batch stays one forward and one backward;
// a layer-major pass (offload.accumulation) runs several, each with its own layout and weights.
//
// Layout: a micro-batch holds whole pairs, one sequence per row: rows [0, P) the chosen
// sequences, rows [P, 2P) the rejected ones (preference_micro_batch), each row padded at its end
// (ids 0, labels -100) to the longer side.
#pragma once
#include <cstdint>
#include <vector>

#include "models/micro_batch.h"
#include "offload/objective/loss_objective.h"
#include "offload/objective/preference_loss.h"

namespace strata {

// Which sequence each token belongs to and which sequences make the pairs, for one micro-batch.
struct PreferenceLayout {
  std::vector<int32_t> seq;               // (N) each token's sequence, -1: none
  int64_t num_seqs = 0;
  std::vector<int32_t> chosen, rejected;  // (P) each pair's two sequences
  // (P) the reference sums ρ_c, ρ_r (dpo, ipo); empty: the model's own sums (as at step 1)
  std::vector<double> ref_chosen, ref_rejected;
  PreferenceStepTotals totals;            // the step this micro-batch belongs to
};

// Pairs as rows of token ids and labels (HF convention, -100 ignored; one side's rows of equal
// length) into one micro-batch: chosen rows then rejected rows, padded to the longer side.
// *layout gets seq, num_seqs, chosen and rejected.
MicroBatch preference_micro_batch(const std::vector<std::vector<int32_t>>& chosen_ids,
                                  const std::vector<std::vector<int32_t>>& chosen_labels,
                                  const std::vector<std::vector<int32_t>>& rejected_ids,
                                  const std::vector<std::vector<int32_t>>& rejected_labels,
                                  PreferenceLayout* layout);

// The step totals of micro-batches: pairs, and chosen tokens counted (orpo's NLL denominator).
PreferenceStepTotals preference_layout_totals(const MicroBatch& mb, const PreferenceLayout& layout);

class PreferenceHead final : public LossObjective {
 public:
  // max_tokens: the engine's N capacity (max_batch x max_tokens); max_group: the micro-batches
  // of its largest pass (EngineOptions::group). Device buffers: seq ids (N), token weights
  // (max_group, N), sequence sums (N, 2).
  PreferenceHead(Device& dev, const PreferenceParams& params, int64_t max_tokens, size_t max_group = 1);
  ~PreferenceHead() override;
  PreferenceHead(const PreferenceHead&) = delete;
  PreferenceHead& operator=(const PreferenceHead&) = delete;

  // The next pass's layouts, one per micro-batch (before Engine::step or forward_backward_group).
  void set_layouts(std::vector<PreferenceLayout> layouts);
  void set_layout(PreferenceLayout layout);  // a pass of one micro-batch
  // After a pass: micro-batch m's pairs' sums (s, n, ρ as used) and loss with its derivatives.
  const std::vector<PreferencePair>& pairs(size_t m = 0) const { return passes_.at(m).pairs; }
  const PreferenceLoss& result(size_t m = 0) const { return passes_.at(m).result; }
  const PreferenceParams& params() const { return params_; }

  void loss(double* loss_sum, const HeadTensors& head, Device& dev, Stream s) override;
  void chunk_backward(float* dh, float* dw_chunk, const HeadTensors& head, const void* w_chunk, DType w_type,
                      int64_t v0, int64_t vc, float grad_scale, float* kept_logits, Device& dev,
                      Stream s) override;

 private:
  struct MicroBatchHead {  // one micro-batch of the pass
    PreferenceLayout layout;
    std::vector<PreferencePair> pairs;
    PreferenceLoss result;
  };
  Device& dev_;
  PreferenceParams params_;
  int64_t capacity_ = 0;
  size_t max_group_ = 1;
  int32_t* seq_dev_ = nullptr;        // (N)
  float* weight_dev_ = nullptr;       // (max_group, N): micro-batch m's token weights at m * N
  double* sums_dev_ = nullptr;        // (N, 2)
  std::vector<MicroBatchHead> passes_;
  // host sides of the copies: alive until the next loss() has synchronised the stream
  std::vector<double> sums_host_;     // (S, 2)
  std::vector<float> weight_host_;    // (N)
  double loss_host_ = 0;
};

}  // namespace strata
