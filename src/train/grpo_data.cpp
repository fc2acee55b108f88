// GRPO's prompt data (src/train/grpo_data.h).
#include "src/train/grpo_data.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "io/chat_template.h"
#include "src/core/error.h"

namespace strata {
namespace {

uint64_t fnv1a(uint64_t h, const void* p, size_t n) {
  const unsigned char* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001B3ull;
  return h;
}

// One record as a prompt; throws Error(input) naming `where` for a record that is not one.
GrpoPrompt prompt_from(const std::string& line, const std::string& where, const TextEncoder& enc) {
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(line);
  } catch (const nlohmann::json::parse_error& e) {
    STRATA_CHECK(false, where, ": not valid JSON: ", e.what());
  }
  STRATA_CHECK(j.is_object() && (j.contains("prompt") != j.contains("messages")), where,
               ": expected an object with one of \"prompt\" (text or [{role, content}]) or \"messages\" "
               "([{role, content}]), plus any fields the rewards read");
  const char* key = j.contains("prompt") ? "prompt" : "messages";
  const nlohmann::ordered_json& p = j[key];
  GrpoPrompt out;
  if (p.is_string()) {
    STRATA_CHECK(key == std::string("prompt"), where, ": \"messages\" must be a list of {role, content}");
    out.text = p.get<std::string>();
    out.ids = enc.encode_text(out.text);
  } else {
    STRATA_CHECK(p.is_array() && !p.empty(), where, ": \"", key, "\" must be ",
                 key == std::string("prompt") ? "text or " : "", "a non-empty list of {role, content}");
    try {
      out.text = enc.chat_template().render_ordered(p, /*add_generation_prompt=*/true);
    } catch (const Error& e) {
      throw Error(e.kind(), str_cat(where, ": ", e.what()));
    }
    std::vector<std::pair<size_t, size_t>> offsets;  // unused
    out.ids = enc.encode_chat(out.text, &offsets);
  }
  STRATA_CHECK(!out.ids.empty(), where, ": the prompt is empty");
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it.key() != key) out.fields[it.key()] = nlohmann::json::parse(it.value().dump());
  return out;
}

}  // namespace

GrpoPromptData grpo_prompts_read(const GrpoPromptOptions& o, const TextEncoder& enc) {
  STRATA_CHECK(o.max_prompt_tokens >= 1, "data.sequence_len leaves no room for a prompt beside "
               "grpo.max_completion_length + 1: raise data.sequence_len");
  std::ifstream in(o.path);
  STRATA_CHECK_IO(in.is_open(), "cannot open ", o.path, ": ", std::strerror(errno), "; check data.path");
  GrpoPromptData d;
  d.hash = 0xCBF29CE484222325ull;
  std::string line;
  int64_t lineno = 0, truncated = 0, dropped = 0, skipped = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    GrpoPrompt p;
    try {
      p = prompt_from(line, str_cat(o.path, ":", lineno), enc);
    } catch (const Error& e) {
      if (!o.skip_bad_lines || e.kind() != ErrorKind::input) throw;
      ++skipped;
      continue;
    }
    if (int64_t(p.ids.size()) > o.max_prompt_tokens) {
      if (o.drop_overlong) {
        ++dropped;
        continue;
      }
      p.ids.erase(p.ids.begin(), p.ids.end() - o.max_prompt_tokens);  // keep the end, as TRL does
      ++truncated;
    }
    d.hash = fnv1a(d.hash, p.ids.data(), p.ids.size() * sizeof(int32_t));
    const std::string f = p.fields.dump();
    d.hash = fnv1a(d.hash, f.data(), f.size());
    d.bytes += p.ids.size() * sizeof(int32_t) + p.text.size() + f.size() + sizeof(GrpoPrompt);
    d.longest = std::max<int64_t>(d.longest, int64_t(p.ids.size()));
    d.prompts.push_back(std::move(p));
  }
  STRATA_CHECK_IO(!in.bad(), "reading ", o.path, " failed: ", std::strerror(errno));
  STRATA_CHECK(!d.prompts.empty(), o.path, " holds no prompts (data.format = \"prompt\": one {\"prompt\"} or "
               "{\"messages\"} record per line)");
  d.report = str_cat(d.prompts.size(), " prompts from ", o.path, " (longest ", d.longest, " tokens of at most ",
                     o.max_prompt_tokens, ")");
  if (truncated) d.report += str_cat("; ", truncated, " cut to their last ", o.max_prompt_tokens, " tokens");
  if (dropped) d.report += str_cat("; ", dropped, " longer ones dropped");
  if (skipped) d.report += str_cat("; ", skipped, " malformed lines skipped");
  return d;
}

}  // namespace strata
