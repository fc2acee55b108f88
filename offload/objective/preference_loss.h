// Preference objectives (DPO, IPO, SimPO, ORPO) as functions of per-sequence log-prob sums.
//
// The engine's loss head yields, for every sequence of a micro-batch, s = Σ log p(label) over its
// counted positions and n = their count (never T x V logits). Between the head's forward and its
// backward, this module turns the pairs' sums into the loss and into d loss / d s per sequence;
// the head's backward then scales each token's cross-entropy gradient by -d loss / d s of its
// sequence (d s / d logits = onehot - softmax), so a micro-batch stays one forward and one
// backward. Definitions (issue 14; per pair i, c chosen, r rejected, ρ the reference sums):
//   dpo    loss_i = -log σ(β·[(s_c - s_r) - (ρ_c - ρ_r)])
//   ipo    h_i = (s_c/n_c - s_r/n_r) - (ρ_c/n_c - ρ_r/n_r);  loss_i = (h_i - 1/(2β))²
//   simpo  loss_i = -log σ(β·(s_c/n_c - s_r/n_r) - γ)
//   orpo   p̄ = s/n;  lo_i = (p̄_c - p̄_r) - [log(1 - e^p̄_c) - log(1 - e^p̄_r)]
//          loss = -Σ_i s_c,i / Σ_i n_c,i  -  β · mean_i log σ(lo_i)
// dpo, ipo, simpo: loss = mean_i loss_i. With gradient accumulation a step's loss is the mean
// over all its pairs (orpo: the NLL over all its chosen tokens), so each micro-batch is
// normalised by the step's totals, which the trainer knows before the step from the labels.
// All arithmetic is in double.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "offload/modes.h"

namespace strata {

enum class PreferenceObjective { dpo, ipo, simpo, orpo };
inline constexpr ModeSpelling<PreferenceObjective> kPreferenceObjectives[] = {{PreferenceObjective::dpo, "dpo"},
    {PreferenceObjective::ipo, "ipo"}, {PreferenceObjective::simpo, "simpo"}, {PreferenceObjective::orpo, "orpo"}};
constexpr ModeTable<PreferenceObjective> mode_table(PreferenceObjective) {
  return mode_table_of("train.objective", kPreferenceObjectives);
}

// "dpo" | "ipo" | "simpo" | "orpo" (train.objective's spelling).
inline const char* preference_objective_name(PreferenceObjective objective) { return mode_name(objective); }
// The objective needs reference log-probs (one forward pass of the starting weights).
bool preference_needs_reference(PreferenceObjective objective);

struct PreferenceParams {
  PreferenceObjective objective = PreferenceObjective::dpo;
  double beta = 0.1;   // dpo/ipo 0.1, simpo 2.0, orpo (its λ) 0.1: preference_default_beta
  double gamma = 0.5;  // simpo's target margin
};
double preference_default_beta(PreferenceObjective objective);

// One pair's sums. ref_* are ignored by simpo and orpo.
struct PreferencePair {
  double chosen_logp = 0, rejected_logp = 0;  // s_c, s_r
  int64_t chosen_tokens = 0, rejected_tokens = 0;  // n_c, n_r (> 0)
  double ref_chosen_logp = 0, ref_rejected_logp = 0;  // ρ_c, ρ_r
};

// How the step normalises: its total pairs, and (orpo) its total chosen tokens.
struct PreferenceStepTotals {
  int64_t pairs = 0;
  int64_t chosen_tokens = 0;
};

// TRL's metrics, as sums over the pairs (the trainer divides by the step's pair count):
// rewards are β·(s - ρ) for dpo/ipo and β·s/n for simpo/orpo (TRL's CPO trainer); an accuracy
// counts a pair whose chosen reward exceeds its rejected one.
struct PreferenceMetrics {
  double rewards_chosen = 0, rewards_rejected = 0, rewards_margins = 0, accuracies = 0;
  double logps_chosen = 0, logps_rejected = 0;
  int64_t pairs = 0;
  void add(const PreferenceMetrics& other);
};

struct PreferenceLoss {
  double loss = 0;                     // this micro-batch's share of the step loss
  std::vector<double> d_chosen_logp;   // d loss / d s_c, per pair
  std::vector<double> d_rejected_logp; // d loss / d s_r, per pair
  PreferenceMetrics metrics;
};

// The loss of `pairs` as a share of a step with `totals`, and its derivatives.
PreferenceLoss preference_loss(const PreferenceParams& params, const std::vector<PreferencePair>& pairs,
                               const PreferenceStepTotals& totals);

}  // namespace strata
