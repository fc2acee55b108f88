// Datasets: files of pretraining text, instructions, chats and preference pairs turned into
// samples (token ids + which tokens are trained on), split for eval and packed into rows.
//
// Formats (data.format; "auto" picks by extension, and for .jsonl by the fields of the first
// valid record, in this order):
//   prompt + chosen + rejected  preference: each a string or a message list (a string prompt is
//                               one user message, a string answer one assistant message); SFT
//                               trains on prompt + chosen, `rejected` keeps prompt + rejected
//   messages                    messages: [{role, content, ...}], roles system/user/assistant/tool;
//                               a record's "tools" list reaches the template
//   conversations               sharegpt: [{from, value}]; from human/user, gpt/assistant/model,
//                               system, tool/observation/function; an optional "system" string
//   instruction + output        alpaca: user = instruction (+ "\n\n" + input when non-empty),
//                               assistant = output, optional system
//   text                        "jsonl": pretraining text
//   .txt                        "text": documents separated by blank lines
//   .json                       "tokens": {"input_ids": [[...], ...]}, pre-tokenized pretraining
// Chat formats are rendered with the tokenizer's chat template (io/text_encoder.h) and tokenized
// without added special tokens; loss masks come from the render (io/chat_masks.h) per
// data.train_on (for preference data, only the chosen side's turns). Pretraining text gets the
// tokenizer's special tokens and every token is trained on.
//
// Length: a chat, instruction or preference sample longer than sequence_len is truncated (the
// first sequence_len tokens kept) or dropped per data.overlong; pretraining text is too when
// packing is off (with packing it continues into the next row). A sample left with no trained
// token is dropped. All of it is counted in DatasetStats and reported on one line.
//
// Bad input is an error naming path:line and the field; data.skip_bad_lines skips a bad record
// (malformed JSON, a missing or ill-typed field, an unknown role, a template error), counts it and
// names the first few on stderr; none left is an error with the counts. Non-text files are refused.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "io/chat_masks.h"
#include "io/text_encoder.h"
#include "io/token_rows.h"

namespace strata {

struct DatasetProgress {
  std::string path;  // the file being read
  int64_t bytes_read = 0, bytes_total = 0, samples = 0, tokens = 0;
};

struct DatasetOptions {
  std::string format = "auto";
  TrainOn train_on = TrainOn::assistant;
  int64_t sequence_len = 256;
  bool packing = true;
  bool drop_overlong = false;  // data.overlong = "drop" (else "truncate")
  bool skip_bad_lines = false;
  std::function<void(const DatasetProgress&)> progress;  // called every few thousand records
};

struct DatasetStats {
  int64_t samples = 0, tokens = 0, labelled = 0;  // kept samples; their tokens and trained tokens
  int64_t skipped_lines = 0, truncated = 0, dropped_overlong = 0, dropped_unlabelled = 0;
};

struct Dataset {
  std::string path, format;      // format as resolved: "text", "jsonl", "alpaca", ...
  std::vector<Sample> samples;   // preference: prompt + chosen
  std::vector<Sample> rejected;  // preference only: prompt + rejected, rejected[i] pairs with samples[i]
  DatasetStats stats;
};

// The format "auto" resolves to for `path` (reads up to the first valid .jsonl record).
std::string dataset_detect_format(const std::string& path, bool skip_bad_lines);
// Whether data.format `format` (for "auto": as detected in `path`; "" path: unknown) renders chat
// samples through a chat template (alpaca, sharegpt, messages, preference).
bool dataset_format_renders_chat(const std::string& format, const std::string& path, bool skip_bad_lines);

// Reads and tokenizes a dataset; deterministic (records are processed in parallel, kept in order).
Dataset dataset_read(const std::string& path, const DatasetOptions& opt, const TextEncoder& encoder);

// "NAME (FORMAT): 300 samples, 9120 tokens, 4200 trained on; skipped 0 bad lines, truncated 0, dropped 0 (...)"
std::string dataset_stats_line(const Dataset& d);

// Holds out every sample i with floor((i+1)·fraction) > floor(i·fraction), i.e. evenly spaced
// (fraction 0.1: samples 9, 19, 29, ...); no randomness, so the split never changes. Both sides
// must keep at least one sample.
Dataset dataset_split_eval(Dataset* train, double fraction);

// Where a run's samples come from, as plain settings (src/train/training_data.h fills it from a
// recipe's data.* keys).
struct SamplesOptions {
  std::string path;       // the training data (data.path)
  std::string eval_path;  // held-out data (data.eval_path); "" = none
  double eval_split = 0;  // else this fraction of `path` is held out (data.eval_split); 0 = none
  DatasetOptions dataset;
};

// A run's samples before packing: `path` (minus the eval split) and the eval samples
// (eval_path, or the split; empty without either). This is what `strata prepare` stores.
struct TrainingSamples {
  Dataset train, eval;
  std::string report;  // the dataset lines
};
TrainingSamples samples_read(const SamplesOptions& options, const TextEncoder& encoder,
                             const std::function<void(const DatasetProgress&)>& progress = {});

// Every id below vocab_size, else an error naming the dataset and sample.
void training_samples_check_vocab(const TrainingSamples& s, int64_t vocab_size);

}  // namespace strata
