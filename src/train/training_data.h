// The trainer's data: a recipe's data.* keys turned into io's plain options (io/datasets.h,
// io/token_shards.h), the tokenizer resolved and checked against the model, and the rows the
// training loop reads. io knows nothing of recipes; this module is the glue.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "io/datasets.h"
#include "io/text_encoder.h"
#include "io/token_rows.h"

namespace strata {

struct Recipe;

// data.path, data.eval_path, data.eval_split, data.format, data.train_on, data.sequence_len,
// data.packing, data.overlong and data.skip_bad_lines as io's options.
SamplesOptions samples_options(const Recipe& rc);

// data.tokenizer resolved (io/text_encoder.h), its vocabulary checked against the model's.
TextEncoder training_encoder(const Recipe& rc, int64_t vocab_size);

// The recipe's samples before packing (io's samples_read); what `strata prepare` stores.
TrainingSamples training_samples_read(const Recipe& rc, const TextEncoder& encoder,
                                      const std::function<void(const DatasetProgress&)>& progress = {});

// The fingerprint of the recipe's samples (io's prepared_fingerprint).
nlohmann::json prepared_fingerprint(const Recipe& rc, const TextEncoder& encoder);

// The trainer's entry point: resolves data.tokenizer, checks it against the model's vocab_size,
// reads data.prepared_dir's shards when they are there (revalidated; stale or corrupt shards are
// an error saying to rerun `strata prepare`), else tokenizes data.path, then packs rows.
// Prints the report on stderr. Deterministic.
struct TrainingData {
  TokenRows train, eval;      // eval.rows() == 0 without data.eval_path / data.eval_split
  // With a preference objective (train.objective != "sft") the pairs, unpacked (one sequence per
  // row, src/train/preference_step.h), and the rows above stay empty: chosen[i] pairs with rejected[i].
  std::vector<Sample> train_chosen, train_rejected, eval_chosen, eval_rejected;
  std::string report;         // what was printed
  std::string tokenizer_dir;  // "" for bytes
};
TrainingData training_data_load(const Recipe& rc, int64_t vocab_size);

}  // namespace strata
