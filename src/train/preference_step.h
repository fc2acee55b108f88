// The trainer's preference objectives (train.objective = dpo | ipo | simpo | orpo): the pairs a
// run trains and evaluates on, their micro-batches (offload/objective/preference_head.h: chosen rows then
// rejected rows), the reference log-probs (dpo, ipo) and the TRL-named metrics. The trainer
// (trainer.cpp) keeps its loop — data order, optimizer, clipping, checkpoints, resume, export —
// and hands a step's pair indices here.
//
// Reference log-probs: before step 1, one streamed forward-only pass of the starting weights
// over every train and eval pair (a progress display while it runs) gives ρ_c, ρ_r per pair.
// They are cached in <output_dir>/reference_logps.json, keyed by a fingerprint of the model
// (model.path's config and weight files: names, sizes, modification times; or model.config with
// its init seed and std), model.dtype and the pairs' tokens. A resume, or a rerun of the same
// recipe, reuses the cache; a cache with another fingerprint is stale: the trainer says so and
// recomputes it. The pass runs on the weights as loaded, before a checkpoint is restored, so
// a resumed run recomputes from the starting weights too.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/token_rows.h"
#include "offload/state/adamw.h"
#include "offload/engine/engine.h"
#include "offload/objective/preference_head.h"
#include "src/train/progress.h"

namespace strata {

struct Recipe;

// One split's pairs: chosen[i] (prompt + chosen) pairs with rejected[i] (prompt + rejected).
struct PreferencePairs {
  std::vector<Sample> chosen, rejected;
  int64_t size() const { return int64_t(chosen.size()); }
};

bool preference_objective_enabled(const Recipe& rc);
PreferenceParams preference_params(const Recipe& rc);

// Pairs [first, first + count) of `order` (pair indices) as one micro-batch.
MicroBatch preference_pairs_micro_batch(const PreferencePairs& pairs, const std::vector<int64_t>& order,
                                        PreferenceLayout* layout);

// A step's outcome: its loss (the mean over its pairs), and TRL's metrics over its pairs.
struct PreferenceStepOutcome {
  double loss = 0;
  PreferenceMetrics metrics;  // sums; divide by metrics.pairs
  int64_t chosen_tokens = 0, rejected_tokens = 0;
};

// The metrics as metrics.jsonl names them ("rewards/chosen", ...; prefix "eval_" for eval).
nlohmann::json preference_metrics_json(const PreferenceMetrics& m, const std::string& prefix);

class PreferenceTrainer {
 public:
  // Installs the preference head in `engine` (2 x micro_batch_size rows of sequence_len).
  PreferenceTrainer(const Recipe& rc, PreferencePairs train, PreferencePairs eval, Device& dev, Engine& engine);

  int64_t train_pairs() const { return train_.size(); }
  int64_t eval_pairs() const { return eval_.size(); }
  uint64_t data_hash() const;  // the pairs' tokens and labels, train then eval

  // dpo, ipo: the reference sums, from the cache or one forward-only pass (see above).
  // Returns the pass's seconds (0 when the cache was reused or none is needed).
  double prepare_reference(Progress& progress);
  // The reference sums per train / eval pair (empty without a reference).
  const std::vector<double>& reference_train() const { return ref_train_; }

  // One step's forward and backward over micro-batches of pair indices; the optimizer runs as
  // the trainer's SFT step does (clipping needs the norm first; without it the last micro-batch
  // updates as its gradients land). *grad_norm gets the norm before clipping.
  PreferenceStepOutcome step(const std::vector<std::vector<int64_t>>& micro, const AdamWParams& params,
                             double max_grad_norm, double weight_decay, double* grad_norm);
  // Forward-only over every eval pair: eval_loss and the eval_ metrics.
  nlohmann::json evaluate();

 private:
  std::string fingerprint() const;
  // sums (P, 2) of `pairs` under the current weights, in micro-batches, forward only
  std::vector<double> sums_of(const PreferencePairs& pairs, Progress* progress, int64_t done, int64_t total);
  PreferenceLayout layout_for(const PreferencePairs& pairs, const std::vector<double>& ref,
                              const std::vector<int64_t>& idx, MicroBatch* mb) const;

  const Recipe& rc_;
  PreferenceParams params_;
  PreferencePairs train_, eval_;
  Engine& engine_;
  PreferenceHead* head_ = nullptr;  // owned by the engine
  std::vector<double> ref_train_, ref_eval_;  // (P, 2): ρ_c, ρ_r
};

}  // namespace strata
