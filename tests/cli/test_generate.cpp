// `strata generate` end to end: JSON lines in, one line per request out, EOS ids from
// generation_config.json, and bad input refused with exit 2 and a message naming the problem.
#include <catch2/catch.hpp>
#include <filesystem>

#include "offload/state/host_store.h"
#include "offload/state/model_io.h"
#include "tests/testing.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

std::vector<nlohmann::json> json_lines(const std::string& out) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

// The golden qwen3 model copied into `dir`, with generation_config.json holding `gen_config`.
std::string model_copy(const testing::TempDir& tmp, const std::string& gen_config) {
  const fs::path dir = tmp.path / "model";
  fs::create_directories(dir);
  for (const char* f : {"config.json", "model.safetensors"})
    fs::copy_file(testing::source_path(std::string("tests/golden/qwen3/") + f), dir / f);
  std::ofstream(dir / "generation_config.json") << gen_config;
  return dir.string();
}

TEST_CASE("strata generate: one line per request, stopping at generation_config.json's EOS", "[generate][cli]") {
  testing::TempDir tmp("generate_cli");
  const std::string input = tmp.file("in.jsonl", "{\"input_ids\": [3, 9, 14, 2]}\n\n{\"input_ids\": [5]}\n");
  const std::string args = " --dtype f32 --max-new-tokens 8 < " + input;
  // an empty EOS list: every request runs to --max-new-tokens
  std::string model = model_copy(tmp, "{\"eos_token_id\": []}");
  auto r = testing::run_strata("generate --model " + model + args, /*stdout_only=*/true);
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto free_run = json_lines(r.out);
  REQUIRE(free_run.size() == 2);
  for (const auto& j : free_run) {
    CHECK(j["finish_reason"] == "length");
    CHECK(j["tokens"] == 8);
    CHECK(j["ids"].size() == 8);
    CHECK(j["text"].is_string());
  }
  // the first request's fourth token as the EOS: it stops there
  const std::vector<int32_t> ids = free_run[0]["ids"].get<std::vector<int32_t>>();
  const int32_t eos = ids[3];
  fs::remove_all(tmp.path / "model");
  model = model_copy(tmp, "{\"eos_token_id\": [" + std::to_string(eos) + "]}");
  r = testing::run_strata("generate --model " + model + args, true);
  REQUIRE(r.code == 0);
  const auto stopped = json_lines(r.out);
  REQUIRE(stopped.size() == 2);
  const auto hit = std::find(ids.begin(), ids.end(), eos);
  CHECK(stopped[0]["finish_reason"] == "stop");
  CHECK(stopped[0]["ids"].get<std::vector<int32_t>>() == std::vector<int32_t>(ids.begin(), hit));
  CHECK(stopped[0]["tokens"] == size_t(hit - ids.begin()));
}

// {"prompt"} and {"messages"} with UTF-8 bytes as ids (a model dir without tokenizer.json): the
// same tokens as {"input_ids"} holding the bytes of the text, and of the built-in ChatML render
// with the generation prompt.
TEST_CASE("strata generate encodes prompts and renders messages", "[generate][cli]") {
  testing::TempDir tmp("generate_text");
  {
    auto dev = device_create(DeviceOptions{});
    HostStore store(*dev, model_spec_build(testing::tiny_llama_config({32, 48, 2, 300, 128, true}), DType::f32));
    model_init_weights(store, 5, 0.3);
    model_save_hf(store, (tmp.path / "model").string(), DType::f32);
  }
  const std::string chatml = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
  auto bytes_of = [](const std::string& t) {
    std::string ids;
    for (unsigned char ch : t) ids += (ids.empty() ? "" : ", ") + std::to_string(int(ch));
    return "{\"input_ids\": [" + ids + "]}\n";
  };
  const std::string in = tmp.file("in.jsonl", "{\"prompt\": \"hello\"}\n{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}\n" +
                                                    bytes_of("hello") + bytes_of(chatml));
  const auto r = testing::run_strata("generate --model " + (tmp.path / "model").string() +
                                         " --dtype f32 --max-new-tokens 5 --eos-id -1 < " + in, true);
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto lines = json_lines(r.out);
  REQUIRE(lines.size() == 4);
  CHECK(lines[0]["ids"] == lines[2]["ids"]);
  CHECK(lines[1]["ids"] == lines[3]["ids"]);
  CHECK(lines[0]["tokens"] == 5);

  // --interactive: the first turn's reply is the {"messages"} request's, printed as text; a
  // second turn (the conversation so far plus "Bye") gets a reply line too
  std::string want;
  for (int32_t id : lines[1]["ids"].get<std::vector<int32_t>>()) want += id < 256 ? std::string(1, char(id)) : "\xEF\xBF\xBD";
  const auto chat = testing::run_strata("generate --model " + (tmp.path / "model").string() +
                                            " --dtype f32 --max-new-tokens 5 --eos-id -1 --interactive --max-context 200 < " +
                                            tmp.file("chat.txt", "Hi\nBye\n"),
                                        true);
  REQUIRE(chat.code == 0);
  CHECK(chat.out.rfind(want + "\n", 0) == 0);
  CHECK(chat.out.size() > want.size() + 2);
}

// --adapter: the golden llama with the golden LoRA adapter merged at load generates, token for
// token, what torch's merged model (tools/golden/make_lora_goldens.py) generates, and not what the
// base generates.
TEST_CASE("strata generate --adapter equals the torch-merged model", "[generate][cli][lora_adapter]") {
  testing::TempDir tmp("generate_adapter");
  const std::string input = tmp.file("in.jsonl", "{\"input_ids\": [3, 9, 14, 2, 40]}\n{\"input_ids\": [50, 7]}\n"
                                                 "{\"input_ids\": [96, 1, 88]}\n");
  const std::string args = " --max-new-tokens 12 --eos-id -1 < " + input;
  const std::string base = testing::source_path("tests/golden/llama");
  auto ids_of = [&](const std::string& flags) {
    const auto r = testing::run_strata("generate --model " + flags + args, true);
    INFO(flags << "\n" << r.out);
    REQUIRE(r.code == 0);
    std::vector<std::vector<int32_t>> ids;
    for (const auto& j : json_lines(r.out)) ids.push_back(j["ids"].get<std::vector<int32_t>>());
    REQUIRE(ids.size() == 3);
    for (const auto& row : ids) CHECK(row.size() == 12);
    return ids;
  };
  const auto adapted = ids_of(base + " --adapter " + testing::source_path("tests/golden/lora/adapter"));
  CHECK(adapted == ids_of(testing::source_path("tests/golden/lora/merged")));
  CHECK(adapted != ids_of(base));  // the adapter matters
}

TEST_CASE("strata generate refuses a bad adapter with exit 2", "[generate][cli][lora_adapter]") {
  testing::TempDir tmp("generate_bad_adapter");
  const std::string model = testing::source_path("tests/golden/llama");
  const std::string good = tmp.file("good.jsonl", "{\"input_ids\": [1, 2]}\n");
  testing::check_run(testing::run_strata("generate --model " + model + " --adapter " + (tmp.path / "none").string() +
                                         " < " + good),
                     2, {"is not a directory"});
  // an adapter made for another model: the qwen3 golden's shapes differ
  const auto r = testing::run_strata("generate --model " + testing::source_path("tests/golden/qwen3") + " --adapter " +
                                     testing::source_path("tests/golden/lora/adapter") + " < " + good);
  testing::check_run(r, 2, {"does not fit the model", "expected"});
}

TEST_CASE("strata generate refuses bad input with exit 2", "[generate][cli]") {
  testing::TempDir tmp("generate_bad");
  const std::string model = testing::source_path("tests/golden/llama");
  const std::string good = tmp.file("good.jsonl", "{\"input_ids\": [1, 2]}\n");
  testing::check_run(testing::run_strata("generate --model " + (tmp.path / "missing").string() + " < " + good), 2,
                     {"config.json"});
  testing::check_run(testing::run_strata("generate --model " + model + " < " +
                                         tmp.file("bad.jsonl", "{\"input_ids\": [1]}\n{\"prompt\": \"x\"\n")),
                     2, {"stdin line 2", "not valid JSON"});
  testing::check_run(testing::run_strata("generate --model " + model + " < " + tmp.file("keys.jsonl", "{\"text\": \"x\"}\n")),
                     2, {"stdin line 1", "\"prompt\""});
  testing::check_run(testing::run_strata("generate --model " + model + " < " + tmp.file("range.jsonl", "{\"input_ids\": [1, 100000]}\n")),
                     2, {"stdin line 1", "outside the model's vocabulary"});
  testing::check_run(testing::run_strata("generate --model " + model + " --temperature -1 < " + good), 2, {"temperature"});
}

}  // namespace
}  // namespace strata
