// GRPO's prompt data (src/train/grpo_data.h, data.format = "prompt"): plain prompts tokenized as
// they are, conversational ones rendered with the tokenizer's chat template and its generation
// prompt, the other fields kept for the rewards; overlong prompts cut to their end or dropped;
// malformed lines named (or skipped and counted); the data hash sees the fields too.
#include <catch2/catch.hpp>

#include "src/core/error.h"
#include "io/generation_text.h"
#include "src/train/grpo_data.h"
#include "tests/testing.h"

namespace strata {
namespace {

std::string data_file(const char* name, const std::string& text) {
  const std::string path = testing::process_dir("strata_grpo_data") + "/" + name + ".jsonl";
  testing::write_file(path, text);
  return path;
}

}  // namespace

TEST_CASE("GRPO prompt data: plain and conversational prompts with their fields", "[grpo][data]") {
  const TextEncoder tiny = TextEncoder::from_dir(testing::source_path("recipes/sft-tiny/models/tiny"));
  const std::string path = data_file("kinds",
      "{\"prompt\": \"7+1=\", \"answer\": \"8\", \"level\": 2}\n"
      "\n"
      "{\"messages\": [{\"role\": \"user\", \"content\": \"2+2=\"}], \"answer\": 4}\n"
      "{\"prompt\": [{\"role\": \"user\", \"content\": \"2+2=\"}], \"answer\": 4}\n");
  const GrpoPromptData d = grpo_prompts_read({path, 64}, tiny);
  REQUIRE(d.prompts.size() == 3);
  CHECK(d.prompts[0].text == "7+1=");
  CHECK(d.prompts[0].ids == tiny.encode_text("7+1="));
  CHECK(d.prompts[0].fields == nlohmann::json{{"answer", "8"}, {"level", 2}});
  const std::string rendered = "<|im_start|>user\n2+2=<|im_end|>\n<|im_start|>assistant\n";
  CHECK(d.prompts[1].text == rendered);
  std::vector<std::pair<size_t, size_t>> offsets;
  CHECK(d.prompts[1].ids == tiny.encode_chat(rendered, &offsets));
  CHECK(d.prompts[1].ids.front() == 593);  // <|im_start|>, one special token
  CHECK(d.prompts[1].fields == nlohmann::json{{"answer", 4}});
  CHECK(d.prompts[2].ids == d.prompts[1].ids);  // {"prompt": [messages]} is conversational too
  CHECK(d.longest == int64_t(d.prompts[1].ids.size()));
  // the hash covers the fields: another answer is other data
  const std::string other = data_file("other",
      "{\"prompt\": \"7+1=\", \"answer\": \"9\", \"level\": 2}\n"
      "{\"messages\": [{\"role\": \"user\", \"content\": \"2+2=\"}], \"answer\": 4}\n"
      "{\"prompt\": [{\"role\": \"user\", \"content\": \"2+2=\"}], \"answer\": 4}\n");
  CHECK(grpo_prompts_read({other, 64}, tiny).hash != d.hash);
  CHECK(grpo_prompts_read({path, 64}, tiny).hash == d.hash);
}

TEST_CASE("GRPO prompt data: overlong prompts cut or dropped, bad lines named or skipped", "[grpo][data]") {
  const TextEncoder bytes = TextEncoder::bytes();
  const std::string path = data_file("long", "{\"prompt\": \"abcdef\"}\n{\"prompt\": \"xy\"}\n");
  const GrpoPromptData cut = grpo_prompts_read({path, 3}, bytes);
  REQUIRE(cut.prompts.size() == 2);
  CHECK(cut.prompts[0].ids == std::vector<int32_t>{'d', 'e', 'f'});  // the end kept, as TRL's max_prompt_length
  CHECK(testing::contains(cut.report, "1 cut to their last 3 tokens"));
  const GrpoPromptData dropped = grpo_prompts_read({path, 3, /*drop_overlong=*/true}, bytes);
  REQUIRE(dropped.prompts.size() == 1);
  CHECK(dropped.prompts[0].text == "xy");
  CHECK(testing::contains(dropped.report, "1 longer ones dropped"));

  const std::string bad = data_file("bad", "{\"prompt\": \"ok\"}\n{\"text\": \"no prompt\"}\n{\"prompt\": \"ok too\"}\n");
  const std::string msg = testing::error_of([&] { grpo_prompts_read({bad, 16}, bytes); });
  CHECK(testing::contains(msg, bad + ":2"));
  CHECK(testing::contains(msg, "\"prompt\""));
  const GrpoPromptData skipped = grpo_prompts_read({bad, 16, false, /*skip_bad_lines=*/true}, bytes);
  CHECK(skipped.prompts.size() == 2);
  CHECK(testing::contains(skipped.report, "1 malformed lines skipped"));
  CHECK(testing::contains(testing::error_of([&] { grpo_prompts_read({data_file("json", "{\"prompt\": \n"), 16}, bytes); }),
                          ":1: not valid JSON"));
  CHECK(testing::contains(testing::error_of([&] { grpo_prompts_read({data_file("empty", "\n"), 16}, bytes); }),
                          "holds no prompts"));
}

}  // namespace strata

namespace strata {

// A model's vocab_size may pad past its tokenizer (the tiny model: 640 rows, 595 tokens), and a
// sampled completion may hold such an id: decoding drops it, as Hugging Face's decode does.
TEST_CASE("generated ids past the tokenizer's vocabulary decode to nothing", "[grpo][data]") {
  const TextEncoder tiny = TextEncoder::from_dir(testing::source_path("recipes/sft-tiny/models/tiny"));
  REQUIRE(tiny.vocab_size() == 595);
  const std::vector<int32_t> ids = tiny.encode_text("7+1=8");
  std::vector<int32_t> padded = {626};
  padded.insert(padded.end(), ids.begin(), ids.end());
  padded.push_back(639);
  CHECK(decode_text(tiny, padded) == "7+1=8");
  CHECK(decode_text(tiny, ids) == "7+1=8");
  CHECK(decode_text(TextEncoder::bytes(), {'o', 'k', 300}) == "ok\xEF\xBF\xBD");  // bytes: U+FFFD
}

}  // namespace strata
