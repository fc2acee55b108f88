// Locating assistant turns in a rendered chat template (see io/chat_masks.h).
#include "io/chat_masks.h"

#include <string_view>

#include "io/chat_template.h"
#include "src/core/error.h"

namespace strata {

using Json = nlohmann::ordered_json;

TrainOn train_on_parse(const std::string& s) {
  if (s == "assistant") return TrainOn::assistant;
  if (s == "last") return TrainOn::last;
  if (s == "all") return TrainOn::all;
  STRATA_CHECK(false, "data.train_on must be \"assistant\", \"last\" or \"all\", not \"", s, "\"");
}

namespace {

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

// The last character of a message's content, whitespace aside: a rewritten turn must still hold
// it (templates trim content, or drop reasoning that comes before the answer).
std::string content_anchor(const Json& message) {
  auto it = message.find("content");
  if (it == message.end() || !it->is_string()) return "";
  std::string_view c = it->get_ref<const std::string&>();
  size_t e = c.find_last_not_of(" \t\r\n");
  if (e == std::string_view::npos) return "";
  size_t b = e;
  while (b > 0 && (static_cast<unsigned char>(c[b]) & 0xC0) == 0x80) --b;  // a whole UTF-8 character
  return std::string(c.substr(b, e + 1 - b));
}

size_t common_prefix(std::string_view a, std::string_view b) {
  size_t n = std::min(a.size(), b.size()), i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

// Where assistant message k sits in `full` at or after `cursor`; false when it cannot be found.
bool locate_turn(const ChatTemplate& tmpl, const Json& messages, const Json& tools, const Json& extra,
                 size_t k, const std::string& full, size_t cursor, TurnSpan* span) {
  Json head = Json::array();
  for (size_t i = 0; i < k; ++i) head.push_back(messages[i]);
  const std::string P = tmpl.render_ordered(head, true, tools, extra);
  std::string Q;
  if (k + 1 == messages.size()) {
    Q = full;
  } else {
    head.push_back(messages[k]);
    Q = tmpl.render_ordered(head, false, tools, extra);
  }
  if (!starts_with(Q, P)) return false;
  const std::string_view turn = std::string_view(Q).substr(P.size());
  if (P.size() >= cursor && starts_with(full, Q)) {  // the usual case: later turns leave this one as it was
    *span = {P.size(), Q.size(), true};
    return true;
  }
  if (P.size() >= cursor && starts_with(full, P)) {
    // Rewritten: turn = X + T + Y with T what the full render holds at len(P): X dropped (e.g.
    // reasoning), Y what the template appends only at the end of a conversation (e.g. an EOS,
    // so the full render ends with it too). Take the longest T, the leftmost on ties.
    const std::string_view rest = std::string_view(full).substr(P.size());
    const std::string anchor = content_anchor(messages[k]);
    size_t best_j = 0, best_len = 0;
    for (size_t j = 0; j < turn.size() && turn.size() - j > best_len; ++j) {
      if (rest.empty() || turn[j] != rest[0]) continue;
      const size_t len = common_prefix(turn.substr(j), rest);
      const std::string_view t = turn.substr(j, len), y = turn.substr(j + len);
      if (len <= best_len || (anchor.size() && t.find(anchor) == std::string_view::npos)) continue;
      if (!y.empty() && !(full.size() >= y.size() && full.compare(full.size() - y.size(), y.size(), y.data(), y.size()) == 0))
        continue;
      best_j = j;
      best_len = len;
    }
    if (best_len > 0) {
      // With a Y the end may run into the next turn's marker by a shared character or two
      // ("</s>" against "<|user|>"): a token straddling it is then not labelled.
      *span = {P.size(), P.size() + best_len, best_j + best_len == turn.size()};
      return true;
    }
  }
  if (!turn.empty()) {  // something earlier changed: the turn as rendered last, after the previous one
    size_t at = full.find(turn, cursor);
    if (at != std::string::npos) {
      *span = {at, at + turn.size(), true};
      return true;
    }
  }
  return false;
}

}  // namespace

ChatRender chat_render_spans(const ChatTemplate& tmpl, const Json& messages, const Json& tools, TrainOn train_on,
                             size_t first_turn) {
  STRATA_ASSERT(messages.is_array());
  static const Json extra = {{"strata_now", "2024-07-26"}};
  ChatRender out;
  out.text = tmpl.render_ordered(messages, false, tools, extra);
  if (train_on == TrainOn::all) return out;
  std::vector<size_t> turns;
  for (size_t k = first_turn; k < messages.size(); ++k) {
    auto it = messages[k].find("role");
    if (it != messages[k].end() && it->is_string() && it->get_ref<const std::string&>() == "assistant") turns.push_back(k);
  }
  if (train_on == TrainOn::last && turns.size() > 1) turns.erase(turns.begin(), turns.end() - 1);
  size_t cursor = 0;
  for (size_t k : turns) {
    TurnSpan span;
    STRATA_CHECK(locate_turn(tmpl, messages, tools, extra, k, out.text, cursor, &span),
                 "cannot locate assistant message ", k, " in the rendered chat template (the template rewrites it "
                 "once later turns follow): set data.train_on = \"last\" or \"all\", or use another template");
    if (span.end > span.begin) out.assistant_spans.push_back(span);
    cursor = span.end;
  }
  return out;
}

std::vector<uint8_t> chat_labels_from_spans(const std::vector<ByteSpan>& offsets, const std::vector<TurnSpan>& spans) {
  std::vector<uint8_t> labels(offsets.size(), 0);
  size_t j = 0;
  for (size_t i = 0; i < offsets.size(); ++i) {
    const auto [b, e] = offsets[i];
    while (j < spans.size() && spans[j].end <= b) ++j;
    if (j == spans.size()) break;
    const TurnSpan& s = spans[j];
    if (e > b)
      labels[i] = b < s.end && e > s.begin && (s.exact_end || e <= s.end);
    else
      labels[i] = s.begin <= b && b < s.end;
  }
  if (!labels.empty()) labels[0] = 0;
  return labels;
}

}  // namespace strata
