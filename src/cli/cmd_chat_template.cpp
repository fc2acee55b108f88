// `strata chat-template --tokenizer DIR`: renders the tokenizer's chat template for each JSON line
// {"messages": [...], "add_generation_prompt": bool, "tools": [...]} on standard input and writes
// {"text": "..."} per line, equal to transformers' apply_chat_template(..., tokenize=False).
// Any other keys of a line are passed to the template as extra variables (e.g. enable_thinking).
#include <cstdio>
#include <iostream>
#include <string>

#include "io/chat_template.h"
#include "io/json.h"
#include "src/core/cli_args.h"
#include "src/cli/commands.h"
#include "src/core/error.h"

namespace strata {

int cmd_chat_template(const std::vector<std::string>& args) {
  CLI::App app{"Render a tokenizer's chat template for JSON lines of conversations", "strata chat-template"};
  std::string dir;
  app.add_option("--tokenizer", dir, "Hugging Face tokenizer directory (tokenizer_config.json or chat_template.jinja)")
      ->required();
  int rc = 0;
  if (!parse_args(app, args, &rc)) return rc;

  ChatTemplate tmpl = ChatTemplate::load(dir);
  cli_for_each_stdin_line([&](const std::string& line, size_t line_no) {
    nlohmann::ordered_json j;
    try {
      j = nlohmann::ordered_json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      STRATA_CHECK(false, "stdin line ", line_no, ": not valid JSON: ", e.what());
    }
    STRATA_CHECK(j.is_object() && j.contains("messages"), "stdin line ", line_no,
                 ": expected an object {\"messages\": [...], \"add_generation_prompt\": bool, \"tools\": [...]}");
    bool agp = false;
    if (j.contains("add_generation_prompt")) {
      STRATA_CHECK(j["add_generation_prompt"].is_boolean(), "stdin line ", line_no,
                   ": \"add_generation_prompt\" must be true or false");
      agp = j["add_generation_prompt"].get<bool>();
    }
    nlohmann::ordered_json tools = j.contains("tools") ? j["tools"] : nlohmann::ordered_json(nullptr);
    nlohmann::ordered_json extra = nlohmann::ordered_json::object();
    for (auto it = j.begin(); it != j.end(); ++it)
      if (it.key() != "messages" && it.key() != "add_generation_prompt" && it.key() != "tools") extra[it.key()] = it.value();
    std::string text;
    try {
      text = tmpl.render_ordered(j["messages"], agp, tools, extra);
    } catch (const Error& e) {
      throw Error(e.kind(), str_cat("stdin line ", line_no, ": ", e.what()));
    }
    nlohmann::ordered_json out = {{"text", text}};
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
  });
  std::cout.flush();
  STRATA_CHECK_IO(std::cout.good(), "writing to standard output failed");
  return 0;
}

}  // namespace strata
