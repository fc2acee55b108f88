// Chat templates of real models rendered byte for byte as transformers renders them
// (tests/fixtures/chat/renders.jsonl: @huggingface/jinja output, cross-checked with Python
// Jinja2), loading from tokenizer directories, and the `strata chat-template` command.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "io/chat_template.h"
#include "tests/testing.h"
#include "src/cli/commands.h"
#include "src/core/error.h"

using namespace strata;
namespace fs = std::filesystem;

namespace {

const std::string kChatDir = STRATA_SOURCE_DIR "/tests/fixtures/chat/";

using testing::TempDir;

}  // namespace

TEST_CASE("chat template: real templates render byte for byte like transformers", "[jinja]") {
  std::ifstream in(kChatDir + "renders.jsonl");
  REQUIRE(in);
  std::map<std::string, ChatTemplate> templates;
  std::string line;
  int rendered = 0, raised = 0;
  while (std::getline(in, line)) {
    auto rec = nlohmann::ordered_json::parse(line);
    std::string file = rec["template"];
    INFO(file << " / " << rec["case"].get<std::string>());
    if (!templates.count(file)) {
      std::string bos = rec["bos_token"].is_null() ? "" : rec["bos_token"].get<std::string>();
      std::string eos = rec["eos_token"].is_null() ? "" : rec["eos_token"].get<std::string>();
      templates.emplace(file, ChatTemplate::from_string(testing::read_file(kChatDir + "templates/" + file), bos, eos));
    }
    const ChatTemplate& t = templates.at(file);
    CHECK(t.bos_token() == (rec["bos_token"].is_null() ? "" : rec["bos_token"].get<std::string>()));
    if (rec.contains("expected")) {
      std::string got = t.render_ordered(rec["messages"], rec["add_generation_prompt"], rec["tools"], rec["extra"]);
      CHECK(got == rec["expected"].get<std::string>());
      ++rendered;
    } else {
      std::string err = rec["error"];
      CHECK_THROWS_WITH(t.render_ordered(rec["messages"], rec["add_generation_prompt"], rec["tools"], rec["extra"]),
                        Catch::Contains(err) && Catch::Contains("line "));
      ++raised;
    }
  }
  CHECK(templates.size() == 9);
  CHECK(rendered == 50);
  CHECK(raised == 10);
}

TEST_CASE("chat template: nlohmann::json overload renders with sorted keys", "[jinja]") {
  auto t = ChatTemplate::from_string("{{ tools[0] | tojson }}{{ messages[0].content }}", "", "");
  nlohmann::json msgs = nlohmann::json::parse(R"([{"role": "user", "content": "hi"}])");
  nlohmann::json tools = nlohmann::json::parse(R"([{"type": "function", "function": {"name": "f"}}])");
  CHECK(t.render(msgs, false, tools) == R"({"function": {"name": "f"}, "type": "function"}hi)");
  CHECK_THROWS_WITH(t.render(nlohmann::json::object(), false), Catch::Contains("\"messages\" must be a list"));
}

TEST_CASE("chat template: load reads tokenizer_config.json and chat_template.jinja", "[jinja]") {
  TempDir dir("chat_template_load");
  nlohmann::json msgs = nlohmann::json::parse(R"([{"role": "user", "content": "hi"}])");

  // String template, bos/eos as AddedToken objects.
  testing::write_file(dir.path / "tokenizer_config.json", R"({
    "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": false},
    "eos_token": "</s>",
    "chat_template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}{{ eos_token }}"})");
  auto t1 = ChatTemplate::load(dir.path.string());
  CHECK(t1.bos_token() == "<s>");
  CHECK(t1.eos_token() == "</s>");
  CHECK(t1.render(msgs, false) == "<s>[user]hi</s>");

  // A list of named templates: "default" is taken.
  testing::write_file(dir.path / "tokenizer_config.json", R"({"bos_token": null, "eos_token": "E",
    "chat_template": [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": "default:{{ messages | length }}{{ bos_token }}"}]})");
  CHECK(ChatTemplate::load(dir.path.string()).render(msgs, false) == "default:1");

  // chat_template.jinja wins over tokenizer_config.json.
  testing::write_file(dir.path / "chat_template.jinja", "file:{{ messages[0].content | upper }}{{ eos_token }}\n");
  CHECK(ChatTemplate::load(dir.path.string()).render(msgs, false) == "file:HIE");
  fs::remove(dir.path / "chat_template.jinja");

  testing::write_file(dir.path / "tokenizer_config.json", R"({"chat_template": [{"name": "rag", "template": "x"}]})");
  CHECK_THROWS_WITH(ChatTemplate::load(dir.path.string()), Catch::Contains("none called \"default\"") && Catch::Contains("rag"));
  testing::write_file(dir.path / "tokenizer_config.json", R"({"eos_token": "</s>"})");
  CHECK_THROWS_WITH(ChatTemplate::load(dir.path.string()), Catch::Contains("has no chat template"));
  testing::write_file(dir.path / "tokenizer_config.json", R"({"chat_template": "{% if %}"})");
  CHECK_THROWS_WITH(ChatTemplate::load(dir.path.string()), Catch::Contains("line 1 column"));
  CHECK_THROWS_AS(ChatTemplate::load((dir.path / "nope").string()), Error);
}

TEST_CASE("chat template: the real Qwen3 tokenizer's template loads and renders", "[jinja]") {
  const fs::path real = strata::testing::tokenizer_fixture("bpe-qwen3");
  REQUIRE(fs::exists(real / "tokenizer_config.json"));
  auto t = ChatTemplate::load(real.string());
  CHECK(t.source() == testing::read_file(kChatDir + "templates/qwen3.jinja"));
  CHECK(t.eos_token() == "<|im_end|>");
  CHECK(t.bos_token().empty());  // bos_token is null in this config
  nlohmann::json msgs = nlohmann::json::parse(R"([{"role": "user", "content": "Hello! Who are you?"}])");
  CHECK(t.render(msgs, true, nullptr, {{"enable_thinking", false}}) ==
        "<|im_start|>user\nHello! Who are you?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

TEST_CASE("chat-template command: JSON lines in, {\"text\"} lines out", "[jinja]") {
  TempDir dir("chat_template_cli");
  testing::write_file(dir.path / "tokenizer_config.json", R"({"eos_token": "<|im_end|>", "chat_template": )" +
                                                     nlohmann::json(testing::read_file(kChatDir + "templates/qwen3.jinja")).dump() + "}");
  std::string input =
      R"({"messages": [{"role": "user", "content": "Hi ✓"}], "add_generation_prompt": true})" "\n"
      "\n"
      R"({"messages": [{"role": "user", "content": "w?"}], "add_generation_prompt": false, "tools": [{"type": "function", "function": {"name": "f", "description": "d"}}]})" "\n"
      R"({"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": true, "enable_thinking": false})" "\n";
  int rc = -1;
  std::string out = strata::testing::run_cli(cmd_chat_template, {"--tokenizer", dir.path.string()}, input, &rc);
  CHECK(rc == 0);
  std::istringstream lines(out);
  std::vector<std::string> texts;
  for (std::string l; std::getline(lines, l);) texts.push_back(nlohmann::json::parse(l)["text"]);
  REQUIRE(texts.size() == 3);
  CHECK(texts[0] == "<|im_start|>user\nHi ✓<|im_end|>\n<|im_start|>assistant\n");
  // Tool schemas keep their key order (type before function), as Python's json.loads would.
  CHECK_THAT(texts[1], Catch::Contains(R"({"type": "function", "function": {"name": "f", "description": "d"}})"));
  CHECK_THAT(texts[2], Catch::EndsWith("<think>\n\n</think>\n\n"));

  CHECK_THROWS_WITH(strata::testing::run_cli(cmd_chat_template, {"--tokenizer", dir.path.string()}, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}\n{not json\n", &rc),
                    Catch::Contains("stdin line 2") && Catch::Contains("not valid JSON"));
  CHECK_THROWS_WITH(strata::testing::run_cli(cmd_chat_template, {"--tokenizer", dir.path.string()}, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}\n[1]\n", &rc),
                    Catch::Contains("stdin line 2") && Catch::Contains("expected an object"));
  CHECK_THROWS_WITH(strata::testing::run_cli(cmd_chat_template, {"--tokenizer", dir.path.string()}, "{\"messages\": [{\"role\": \"user\"}]}\n", &rc),
                    Catch::Contains("stdin line 1") && Catch::Contains("template line"));
  CHECK_THROWS_WITH(strata::testing::run_cli(cmd_chat_template, {"--tokenizer", dir.path.string()}, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"add_generation_prompt\": 1}\n", &rc),
                    Catch::Contains("stdin line 1") && Catch::Contains("add_generation_prompt"));
}
