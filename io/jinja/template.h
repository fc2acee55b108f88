// strata's Jinja interpreter, public entry: compile a template once, render it many times.
// Covers the subset chat templates use (see tests/io/test_jinja.cpp for the list); anything else
// is a strata::Error naming the template line and column.
//
//   jinja::Template t("{% for m in messages %}{{ m.role }}{% endfor %}");
//   auto ctx = std::make_shared<jinja::Dict>();
//   ctx->set("messages", jinja::value_from_json(messages_json));
//   std::string text = t.render(*ctx);
#pragma once
#include <ctime>
#include <memory>
#include <optional>
#include <string>

#include "io/jinja/value.h"

namespace strata::jinja {

struct RenderOptions {
  std::optional<std::tm> now;  // fixes strftime_now's clock (tests); nullopt: local time
};

class Template {
 public:
  // Lexes and parses with transformers' settings (trim_blocks, lstrip_blocks). Throws strata::Error.
  explicit Template(const std::string& source);
  // Renders with `context` as the template's variables. Throws strata::Error on runtime errors
  // (including raise_exception), with the line and column of the failing expression.
  std::string render(const Dict& context, const RenderOptions& opt = {}) const;

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

}  // namespace strata::jinja
