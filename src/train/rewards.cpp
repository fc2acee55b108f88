// The built-in GRPO rewards and their weighted total (rewards.h).
#include "src/train/rewards.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "src/core/error.h"
#include "src/train/reward_command.h"

namespace strata {
namespace {

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

bool parse_number(const std::string& s, double* x) {
  const std::string t = trim(s);
  if (t.empty()) return false;
  char* end = nullptr;
  *x = std::strtod(t.c_str(), &end);
  return end == t.c_str() + t.size() && std::isfinite(*x);
}

pcre2_code* code_of(void* p) { return static_cast<pcre2_code*>(p); }

}  // namespace

RewardRegex::RewardRegex(const std::string& pattern, const std::string& what) {
  int err = 0;
  PCRE2_SIZE off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF, &err,
                                   &off, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    STRATA_CHECK(false, what, " \"", pattern, "\" is not a valid PCRE2 pattern at offset ", off, ": ",
                 reinterpret_cast<const char*>(msg));
  }
  code_ = code;
}

RewardRegex::~RewardRegex() { pcre2_code_free(code_of(code_)); }

bool RewardRegex::matches(const std::string& s) const {
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_of(code_), nullptr);
  const int rc = pcre2_match(code_of(code_), reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), 0, 0, md, nullptr);
  pcre2_match_data_free(md);
  return rc >= 0;  // invalid UTF-8 in a completion (rc < 0): no match
}

bool RewardRegex::last_capture(const std::string& s, std::string* out) const {
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_of(code_), nullptr);
  bool found = false;
  size_t pos = 0;
  while (pos <= s.size()) {
    const int rc = pcre2_match(code_of(code_), reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), pos, 0, md, nullptr);
    if (rc < 0) break;
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const int group = rc > 1 && ov[2] != PCRE2_UNSET ? 1 : 0;
    *out = s.substr(ov[2 * group], ov[2 * group + 1] - ov[2 * group]);
    found = true;
    pos = ov[1] > ov[0] ? ov[1] : ov[0] + 1;  // past an empty match
  }
  pcre2_match_data_free(md);
  return found;
}

bool reward_answers_equal(const std::string& got, const std::string& want) {
  double a = 0, b = 0;
  if (parse_number(got, &a) && parse_number(want, &b)) return std::abs(a - b) <= 1e-9 * std::max(1.0, std::abs(b));
  return trim(got) == trim(want);
}

Rewards::Rewards(const RewardOptions& options) : o_(options) {
  names_ = o_.funcs;
  if (!o_.command.empty() && std::find(names_.begin(), names_.end(), "command") == names_.end())
    names_.push_back("command");
  STRATA_CHECK(!names_.empty(), "GRPO needs a reward: set grpo.reward_funcs (accuracy, format, json, length) or "
               "grpo.reward_command");
  STRATA_CHECK(o_.weights.empty() || o_.weights.size() == names_.size(), "grpo.reward_weights has ",
               o_.weights.size(), " entries for ", names_.size(), " reward functions (",
               names_.size() > o_.funcs.size() ? "reward_funcs and the command" : "reward_funcs", ")");
  weights_ = o_.weights.empty() ? std::vector<double>(names_.size(), 1.0) : o_.weights;
  for (const std::string& n : names_) {
    if (n == "accuracy") {
      if (!answer_) answer_ = std::make_unique<RewardRegex>(o_.answer_regex, "grpo.answer_regex");
    } else if (n == "format") {
      STRATA_CHECK(!o_.format_regex.empty(), "reward function format needs grpo.format_regex");
      if (!format_) format_ = std::make_unique<RewardRegex>(o_.format_regex, "grpo.format_regex");
    } else if (n == "command") {
      STRATA_CHECK(!o_.command.empty(), "reward function command needs grpo.reward_command");
      if (!command_) command_ = std::make_unique<RewardCommand>(o_.command, o_.timeout_s);
    } else {
      STRATA_CHECK(n == "json" || n == "length", "unknown reward function \"", n,
                   "\" in grpo.reward_funcs; use accuracy, format, json, length (or command with grpo.reward_command)");
    }
  }
  if (o_.length_buffer <= 0) o_.length_buffer = std::max<int64_t>(1, o_.max_completion_length / 4);
}

Rewards::~Rewards() = default;

double Rewards::builtin(size_t f, const RewardSample& s) const {
  const std::string& n = names_[f];
  if (n == "accuracy") {
    STRATA_CHECK(s.fields.contains(o_.answer_field), "reward function accuracy needs the field \"", o_.answer_field,
                 "\" (grpo.answer_field) in every example; an example lacks it");
    const nlohmann::json& want = s.fields[o_.answer_field];
    const std::string w = want.is_string() ? want.get<std::string>() : want.dump();
    std::string got;
    return answer_->last_capture(s.completion, &got) && reward_answers_equal(got, w) ? 1.0 : 0.0;
  }
  if (n == "format") return format_->matches(s.completion) ? 1.0 : 0.0;
  if (n == "json") {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(trim(s.completion));
    } catch (const nlohmann::json::parse_error&) {
      return 0.0;
    }
    if (!j.is_object()) return 0.0;
    for (const std::string& k : o_.json_keys)
      if (!j.contains(k)) return 0.0;
    return 1.0;
  }
  // length: DAPO's soft overlong punishment
  const double L = double(s.completion_tokens), Lmax = double(o_.max_completion_length), c = double(o_.length_buffer);
  if (L <= Lmax - c) return 0.0;
  if (L <= Lmax) return (Lmax - c - L) / c;
  return -1.0;
}

std::vector<double> Rewards::score(const std::vector<RewardSample>& samples, std::vector<std::vector<double>>* per) {
  per->assign(names_.size(), std::vector<double>(samples.size(), 0.0));
  for (size_t f = 0; f < names_.size(); ++f) {
    if (names_[f] == "command") (*per)[f] = command_->score(samples);
    else
      for (size_t i = 0; i < samples.size(); ++i) (*per)[f][i] = builtin(f, samples[i]);
  }
  std::vector<double> total(samples.size(), 0.0);
  for (size_t i = 0; i < samples.size(); ++i)
    for (size_t f = 0; f < names_.size(); ++f) total[i] += weights_[f] * (*per)[f][i];
  return total;
}

}  // namespace strata
