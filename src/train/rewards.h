// GRPO's verifiable rewards without Python in the loop (issue 41): built-in reward functions
// named by `grpo.reward_funcs`, weighted by `grpo.reward_weights` (TRL's names), and the
// external reward command (src/train/reward_command.h) as one more function named "command".
//   accuracy  1 when the answer extracted from the completion equals the example's field
//             `grpo.answer_field` ("answer"): the last match of the PCRE2 pattern
//             `grpo.answer_regex` (its first capture group when it has one); numbers compare as
//             numbers (|a - b| <= 1e-9 max(1, |b|): "42.0" equals "42"), other text exactly
//             after trimming; else 0.
//   format    1 when the completion matches `grpo.format_regex` (PCRE2, anywhere unless
//             anchored), else 0.
//   json      1 when the completion (trimmed) is a JSON object holding every key of
//             `grpo.json_keys`, else 0.
//   length    DAPO's soft overlong punishment on completion tokens L with the maximum Lmax =
//             max_completion_length and the buffer c = `grpo.length_buffer`: 0 when L <= Lmax - c,
//             (Lmax - c - L) / c within the buffer, -1 beyond.
// TRL sums the functions' rewards times their weights: the total of a completion.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace strata {

// A compiled PCRE2 pattern (UTF): exit 2 naming `what` when it does not compile.
class RewardRegex {
 public:
  RewardRegex(const std::string& pattern, const std::string& what);
  ~RewardRegex();
  RewardRegex(const RewardRegex&) = delete;
  RewardRegex& operator=(const RewardRegex&) = delete;
  bool matches(const std::string& s) const;
  // The last match's first capture group (the whole match without groups); false: no match.
  bool last_capture(const std::string& s, std::string* out) const;

 private:
  void* code_ = nullptr;  // pcre2_code*
};

// One completion as the rewards see it.
struct RewardSample {
  std::string prompt, completion;
  int64_t completion_tokens = 0;
  nlohmann::json fields = nlohmann::json::object();  // the example's extra fields
};

struct RewardOptions {
  std::vector<std::string> funcs = {"accuracy"};
  std::vector<double> weights;  // empty: 1 each
  std::string answer_field = "answer";
  std::string answer_regex = "(-?[0-9]+(?:\\.[0-9]+)?)";
  std::string format_regex;
  std::vector<std::string> json_keys;
  int64_t max_completion_length = 256;
  int64_t length_buffer = 0;  // 0: max_completion_length / 4
  std::string command;        // grpo.reward_command
  double timeout_s = 60;      // grpo.reward_timeout, per batch
};

class RewardCommand;

// The reward functions of a run: rewards(samples) (n_funcs, n) and their weighted totals.
class Rewards {
 public:
  explicit Rewards(const RewardOptions& options);
  ~Rewards();
  const std::vector<std::string>& names() const { return names_; }
  // per[f][i]: function f's reward of sample i; returns the weighted totals (n).
  std::vector<double> score(const std::vector<RewardSample>& samples, std::vector<std::vector<double>>* per);

 private:
  double builtin(size_t f, const RewardSample& s) const;
  RewardOptions o_;
  std::vector<std::string> names_;
  std::vector<double> weights_;
  std::unique_ptr<RewardRegex> answer_, format_;
  std::unique_ptr<RewardCommand> command_;
};

// Numeric when both parse fully as numbers, else trimmed text equality.
bool reward_answers_equal(const std::string& got, const std::string& want);

}  // namespace strata
