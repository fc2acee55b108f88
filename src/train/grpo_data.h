// GRPO's prompt data (data.format = "prompt", issue 41): JSONL records holding a prompt and any
// other fields, which the reward functions see (e.g. {"prompt": "3+4=", "answer": "7"}).
//   {"prompt": "text"}                         plain text, tokenized as it is (TRL's standard format;
//                                              a tokenizer's special tokens such as BOS are added)
//   {"prompt": [{role, content}, ...]}         conversational: rendered with the chat template and
//   {"messages": [{role, content}, ...]}       add_generation_prompt, as TRL does
// A prompt longer than max_prompt_tokens (data.sequence_len - grpo.max_completion_length - 1) is
// cut to its last tokens (data.overlong = "truncate", as TRL's max_prompt_length keeps the end)
// or dropped ("drop"); either is counted and reported. A malformed line is exit 2 naming it
// (data.skip_bad_lines skips and counts it instead).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/text_encoder.h"

namespace strata {

// One prompt of the data: its rendered tokens and text, and the fields the rewards see.
struct GrpoPrompt {
  std::vector<int32_t> ids;
  std::string text;
  nlohmann::json fields = nlohmann::json::object();  // the record without "prompt" / "messages"
};

struct GrpoPromptData {
  std::vector<GrpoPrompt> prompts;
  uint64_t hash = 0;      // of every prompt's ids and fields: a resume checks it is the same data
  size_t bytes = 0;       // held in memory (the plan counts it)
  int64_t longest = 0;    // tokens of the longest prompt
  std::string report;     // one line: what was read, truncated, dropped, skipped
};

struct GrpoPromptOptions {
  std::string path;
  int64_t max_prompt_tokens = 0;
  bool drop_overlong = false, skip_bad_lines = false;
};

GrpoPromptData grpo_prompts_read(const GrpoPromptOptions& o, const TextEncoder& enc);

}  // namespace strata
