// Normalizer implementations (see normalizers.h). Unicode forms come from libutf8proc.
#include "io/tokenizer/normalizers.h"

#include <cstdlib>
#include <utf8proc.h>

#include "io/tokenizer/regex.h"
#include "io/tokenizer/stage_json.h"
#include "src/core/error.h"

namespace strata::tok {
namespace {

// Rewrites t character by character: f(cp, emit) calls emit(new_cp) zero or more times, and every
// emitted character is aligned to the character it came from.
template <class F>
void normalize_map_chars(NormText& t, F&& f) {
  NormText out;
  out.text.reserve(t.size() + 8);
  out.align.reserve(t.size() + 8);
  for (size_t i = 0; i < t.size();) {
    size_t len;
    uint32_t cp = utf8_decode(t.text.data(), i, &len);
    Span span = t.align[i];
    f(cp, [&](uint32_t c) {
      size_t before = out.text.size();
      utf8_append(out.text, c);
      out.align.insert(out.align.end(), out.text.size() - before, span);
    });
    i += len;
  }
  t = std::move(out);
}

bool text_is_ascii(const std::string& s) {
  for (unsigned char c : s)
    if (c >= 0x80) return false;
  return true;
}

std::string unicode_normalize(const char* s, size_t n, int options) {
  utf8proc_uint8_t* out = nullptr;
  utf8proc_ssize_t len = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s), utf8proc_ssize_t(n), &out,
                                      utf8proc_option_t(options | UTF8PROC_STABLE));
  STRATA_CHECK(len >= 0, "unicode normalization failed: ", utf8proc_errmsg(len));
  std::string r(reinterpret_cast<char*>(out), size_t(len));
  std::free(out);
  return r;
}

// NFC / NFD / NFKC / NFKD. The text is normalized as a whole; alignments are rebuilt per
// "unit" (a character with combining class 0 and the marks that follow it): every character a
// unit turns into is aligned to the unit's first original character, as Hugging Face aligns a
// composed character to its base.
class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(int options) : options_(options) {}
  void normalize(NormText& t) const override {
    if (text_is_ascii(t.text)) return;  // ASCII is invariant under all four forms
    std::string whole = unicode_normalize(t.text.data(), t.size(), options_);
    if (whole == t.text) return;
    NormText out;
    out.text.reserve(whole.size());
    out.align.reserve(whole.size());
    size_t unit_begin = 0;
    auto flush_unit = [&](size_t unit_end) {
      if (unit_end == unit_begin) return;
      std::string piece = unicode_normalize(t.text.data() + unit_begin, unit_end - unit_begin, options_);
      if (piece.size() == unit_end - unit_begin && piece.compare(0, piece.size(), t.text, unit_begin, piece.size()) == 0) {
        out.append_from(t, unit_begin, unit_end);
      } else {
        out.append(piece, t.align[unit_begin]);
      }
      unit_begin = unit_end;
    };
    for (size_t i = 0; i < t.size();) {
      size_t len;
      uint32_t cp = utf8_decode(t.text.data(), i, &len);
      bool hangul_vt = (cp >= 0x1161 && cp <= 0x1175) || (cp >= 0x11A8 && cp <= 0x11C2);
      if (i > 0 && utf8proc_get_property(utf8proc_int32_t(cp))->combining_class == 0 && !hangul_vt) flush_unit(i);
      i += len;
    }
    flush_unit(t.size());
    if (out.text != whole) {
      // A composition crossed a unit boundary; keep the exact text, align it coarsely.
      out.clear();
      out.append(whole, Span{t.align.front().begin, t.align.back().end});
    }
    t = std::move(out);
  }

 private:
  int options_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  void normalize(NormText& t) const override {
    normalize_map_chars(t, [](uint32_t cp, auto&& emit) {
      if (cp < 0x80) {
        emit(cp - 'A' < 26 ? cp + 32 : cp);
      } else if (cp == 0x130) {  // the one character whose full lowercase mapping has two characters
        emit('i');
        emit(0x307);
      } else {
        emit(uint32_t(utf8proc_tolower(utf8proc_int32_t(cp))));
      }
    });
  }
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void normalize(NormText& t) const override {
    size_t b = 0, e = t.size();
    while (left_ && b < e) {
      size_t len;
      if (!unicode_is_whitespace(utf8_decode(t.text.data(), b, &len))) break;
      b += len;
    }
    while (right_ && e > b) {
      size_t p = e - 1;
      while (p > b && (static_cast<unsigned char>(t.text[p]) & 0xC0) == 0x80) --p;
      size_t len;
      if (!unicode_is_whitespace(utf8_decode(t.text.data(), p, &len))) break;
      e = p;
    }
    if (b == 0 && e == t.size()) return;
    t.text = t.text.substr(b, e - b);
    t.align = std::vector<Span>(t.align.begin() + b, t.align.begin() + e);
  }

 private:
  bool left_, right_;
};

class StripAccentsNormalizer final : public Normalizer {
 public:
  void normalize(NormText& t) const override {
    normalize_map_chars(t, [](uint32_t cp, auto&& emit) {
      if (cp < 0x80 || !unicode_is_mark(cp)) emit(cp);
    });
  }
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string s) : s_(std::move(s)) {}
  void normalize(NormText& t) const override {
    if (t.text.empty()) return;
    t.text.insert(0, s_);
    t.align.insert(t.align.begin(), s_.size(), t.align.front());
  }

 private:
  std::string s_;
};

// Replace every match of a literal or a regex with `content`; the new bytes are aligned to the
// last character of the match (Hugging Face's transform_range with all characters inserted).
class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(std::string literal, Regex re, std::string content)
      : literal_(std::move(literal)), re_(std::move(re)), content_(std::move(content)) {}
  void normalize(NormText& t) const override {
    std::vector<std::pair<size_t, size_t>> matches;
    if (re_.valid()) {
      re_.find_all(t.text.data(), t.size(), &matches);
    } else if (!literal_.empty()) {
      for (size_t p = t.text.find(literal_); p != std::string::npos; p = t.text.find(literal_, p + literal_.size()))
        matches.emplace_back(p, p + literal_.size());
    }
    if (matches.empty()) return;
    NormText out;
    out.text.reserve(t.size() + matches.size() * content_.size());
    out.align.reserve(out.text.capacity());
    size_t prev = 0;
    for (auto [b, e] : matches) {
      out.append_from(t, prev, b);
      out.append(content_, t.align[e - 1]);
      prev = e;
    }
    out.append_from(t, prev, t.size());
    t = std::move(out);
  }

 private:
  std::string literal_;
  Regex re_;
  std::string content_;
};

class SequenceNormalizer final : public StageSequence<Normalizer> {
 public:
  using StageSequence::StageSequence;
  void normalize(NormText& t) const override {
    for (const auto& p : parts()) p->normalize(t);
  }
};

}  // namespace

std::unique_ptr<Normalizer> normalizer_from_json(const nlohmann::json& j) {
  if (j.is_null()) return nullptr;
  const std::string type = stage_type_from_json(j, "normalizer");
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(UTF8PROC_COMPOSE);
  if (type == "NFD") return std::make_unique<UnicodeNormalizer>(UTF8PROC_DECOMPOSE);
  if (type == "NFKC") return std::make_unique<UnicodeNormalizer>(UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
  if (type == "NFKD") return std::make_unique<UnicodeNormalizer>(UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "StripAccents") return std::make_unique<StripAccentsNormalizer>();
  if (type == "Strip")
    return std::make_unique<StripNormalizer>(j.value("strip_left", true), j.value("strip_right", true));
  if (type == "Prepend") return std::make_unique<PrependNormalizer>(j.at("prepend").get<std::string>());
  if (type == "Replace") {
    const auto& pat = j.at("pattern");
    std::string content = j.at("content").get<std::string>();
    if (pat.contains("String")) return std::make_unique<ReplaceNormalizer>(pat["String"].get<std::string>(), Regex(), content);
    STRATA_CHECK(pat.contains("Regex"), "tokenizer.json: Replace normalizer pattern needs \"String\" or \"Regex\"");
    return std::make_unique<ReplaceNormalizer>("", Regex(pat["Regex"].get<std::string>(), "Replace normalizer"), content);
  }
  if (type == "Sequence")
    return stage_sequence_from_json<SequenceNormalizer>(j.at("normalizers"), normalizer_from_json);
  stage_type_unsupported("normalizer", type,
                         "NFC, NFD, NFKC, NFKD, Lowercase, Strip, StripAccents, Prepend, Replace, Sequence");
}

}  // namespace strata::tok
