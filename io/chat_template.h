// Chat templates: the Jinja `chat_template` a Hugging Face tokenizer directory ships, rendered the
// way transformers' apply_chat_template(..., tokenize=False) renders it. The context holds
// messages, tools (None when absent), documents (None), add_generation_prompt, bos_token,
// eos_token, and any extra variables (e.g. enable_thinking).
//
// Key order: nlohmann::json sorts object keys, so `tojson` of a tool schema passed through the
// nlohmann::json overload prints keys alphabetically; render_ordered keeps the input's order as
// Python's json.loads does (the CLI uses it).
#pragma once
#include <memory>
#include <string>

#include "io/json.h"

namespace strata {

namespace jinja {
class Template;
}

struct ChatTemplate {
  // chat_template.jinja if the directory has one, else tokenizer_config.json's chat_template
  // (a string, or a list of {name, template} from which "default" is taken); bos_token and
  // eos_token from tokenizer_config.json (a string or an {"content": ...} object).
  static ChatTemplate load(const std::string& tokenizer_dir);
  static ChatTemplate from_string(std::string source, std::string bos, std::string eos);

  // messages: JSON array of {role, content, ...}; tools: JSON array or null; extra: more context
  // variables. extra["strata_now"] ("YYYY-MM-DD" or "YYYY-MM-DDTHH:MM:SS") fixes the clock
  // strftime_now reads, for reproducible renders. Throws strata::Error (template errors and
  // raise_exception name the template line and column).
  std::string render(const nlohmann::json& messages, bool add_generation_prompt,
                     const nlohmann::json& tools = nullptr,
                     const nlohmann::json& extra = nlohmann::json::object()) const;
  std::string render_ordered(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                             const nlohmann::ordered_json& tools = nullptr,
                             const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;

  const std::string& source() const { return source_; }
  const std::string& bos_token() const { return bos_; }
  const std::string& eos_token() const { return eos_; }

 private:
  template <class J>
  std::string render_impl(const J& messages, bool add_generation_prompt, const J& tools, const J& extra) const;

  std::shared_ptr<const jinja::Template> template_;
  std::string source_, bos_, eos_;
};

}  // namespace strata
