// Loading a tokenizer directory's chat template and special tokens, and building the render
// context transformers' apply_chat_template builds.
#include "io/chat_template.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "io/files.h"
#include "io/jinja/template.h"
#include "src/core/error.h"

namespace strata {

namespace {

std::string read_text_file(const std::filesystem::path& p) { return file_read(p.string(), "chat template file"); }

std::string special_token(const nlohmann::json& cfg, const char* key, const std::string& path) {
  if (!cfg.contains(key) || cfg[key].is_null()) return "";
  const auto& t = cfg[key];
  if (t.is_string()) return t.get<std::string>();
  STRATA_CHECK(t.is_object() && t.contains("content") && t["content"].is_string(), path, ": \"", key,
               "\" must be a string or an object with a \"content\" string");
  return t["content"].get<std::string>();
}

std::tm parse_now(const std::string& s) {
  std::tm tm{};
  int y = 0, mo = 0, d = 0, h = 0, mi = 0, sec = 0;
  int n = std::sscanf(s.c_str(), "%d-%d-%dT%d:%d:%d", &y, &mo, &d, &h, &mi, &sec);
  STRATA_CHECK(n == 3 || n >= 5, "strata_now must look like YYYY-MM-DD or YYYY-MM-DDTHH:MM[:SS], got \"", s, "\"");
  STRATA_CHECK(mo >= 1 && mo <= 12 && d >= 1 && d <= 31 && h >= 0 && h < 24 && mi >= 0 && mi < 60 && sec >= 0 && sec < 61,
               "strata_now \"", s, "\" is not a valid date and time");
  tm.tm_year = y - 1900;
  tm.tm_mon = mo - 1;
  tm.tm_mday = d;
  tm.tm_hour = h;
  tm.tm_min = mi;
  tm.tm_sec = sec;
  std::time_t t = timegm(&tm);  // normalizes and fills weekday / day of year
  gmtime_r(&t, &tm);
  return tm;
}

}  // namespace

ChatTemplate ChatTemplate::load(const std::string& tokenizer_dir) {
  namespace fs = std::filesystem;
  fs::path dir(tokenizer_dir);
  fs::path cfg_path = dir / "tokenizer_config.json";
  fs::path jinja_path = dir / "chat_template.jinja";
  STRATA_CHECK(fs::is_directory(dir), "tokenizer directory ", tokenizer_dir, " does not exist");
  nlohmann::json cfg = nlohmann::json::object();
  if (fs::exists(cfg_path)) {
    try {
      cfg = nlohmann::json::parse(read_text_file(cfg_path));
    } catch (const nlohmann::json::parse_error& e) {
      STRATA_CHECK(false, cfg_path.string(), " is not valid JSON: ", e.what());
    }
    STRATA_CHECK(cfg.is_object(), cfg_path.string(), " must hold a JSON object");
  }
  std::string source;
  if (fs::exists(jinja_path)) {
    source = read_text_file(jinja_path);
  } else {
    STRATA_CHECK(cfg.contains("chat_template") && !cfg["chat_template"].is_null(), tokenizer_dir,
                 " has no chat template: add \"chat_template\" to tokenizer_config.json or a chat_template.jinja file");
    const auto& ct = cfg["chat_template"];
    if (ct.is_string()) {
      source = ct.get<std::string>();
    } else {
      STRATA_CHECK(ct.is_array(), cfg_path.string(), ": \"chat_template\" must be a string or a list of {name, template}");
      std::string names;
      for (const auto& entry : ct) {
        STRATA_CHECK(entry.is_object() && entry.contains("name") && entry.contains("template") &&
                         entry["name"].is_string() && entry["template"].is_string(),
                     cfg_path.string(), ": each \"chat_template\" entry must be {\"name\": ..., \"template\": ...}");
        names += (names.empty() ? "" : ", ") + entry["name"].get<std::string>();
        if (entry["name"] == "default") source = entry["template"].get<std::string>();
      }
      STRATA_CHECK(!source.empty(), cfg_path.string(), " has named chat templates (", names,
                   ") but none called \"default\"");
    }
  }
  return from_string(std::move(source), special_token(cfg, "bos_token", cfg_path.string()),
                     special_token(cfg, "eos_token", cfg_path.string()));
}

ChatTemplate ChatTemplate::from_string(std::string source, std::string bos, std::string eos) {
  ChatTemplate t;
  t.template_ = std::make_shared<const jinja::Template>(source);
  t.source_ = std::move(source);
  t.bos_ = std::move(bos);
  t.eos_ = std::move(eos);
  return t;
}

template <class J>
std::string ChatTemplate::render_impl(const J& messages, bool add_generation_prompt, const J& tools, const J& extra) const {
  STRATA_CHECK(messages.is_array(), "chat template input: \"messages\" must be a list of {role, content} objects");
  STRATA_CHECK(tools.is_null() || tools.is_array(), "chat template input: \"tools\" must be a list or null");
  STRATA_CHECK(extra.is_object(), "chat template input: extra variables must be a JSON object");
  jinja::Dict ctx;
  ctx.set("messages", jinja::value_from_json(messages));
  ctx.set("tools", jinja::value_from_json(tools));
  ctx.set("documents", jinja::Value(jinja::None{}));
  ctx.set("add_generation_prompt", jinja::Value(add_generation_prompt));
  if (!bos_.empty()) ctx.set("bos_token", jinja::Value(bos_));
  if (!eos_.empty()) ctx.set("eos_token", jinja::Value(eos_));
  jinja::RenderOptions opt;
  for (auto it = extra.begin(); it != extra.end(); ++it) {
    if (it.key() == "strata_now") {
      STRATA_CHECK(it.value().is_string(), "strata_now must be a string \"YYYY-MM-DD[THH:MM:SS]\"");
      opt.now = parse_now(it.value().template get<std::string>());
      continue;
    }
    ctx.set(it.key(), jinja::value_from_json(it.value()));
  }
  return template_->render(ctx, opt);
}

std::string ChatTemplate::render(const nlohmann::json& messages, bool add_generation_prompt, const nlohmann::json& tools,
                                 const nlohmann::json& extra) const {
  return render_impl(messages, add_generation_prompt, tools, extra);
}

std::string ChatTemplate::render_ordered(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                         const nlohmann::ordered_json& tools, const nlohmann::ordered_json& extra) const {
  return render_impl(messages, add_generation_prompt, tools, extra);
}

}  // namespace strata
