// Pre-tokenizer implementations (see pre_tokenizers.h).
#include "io/tokenizer/pre_tokenizers.h"

#include <algorithm>

#include "io/tokenizer/regex.h"
#include "io/tokenizer/stage_json.h"
#include "src/core/error.h"

namespace strata::tok {

const std::vector<std::string>& byte_level_chars() {
  static const std::vector<std::string> table = [] {
    std::vector<std::string> t(256);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      uint32_t cp = printable ? uint32_t(b) : uint32_t(256 + n++);
      utf8_append(t[b], cp);
    }
    return t;
  }();
  return table;
}

void pre_tokenizer_split_piece(const Piece& p, const std::vector<std::pair<size_t, size_t>>& matches, bool invert,
                               SplitBehavior behavior, std::vector<Piece>* out) {
  struct Seg {
    size_t b, e;
    bool match;
  };
  const size_t n = p.end - p.begin;
  // Segments covering the piece: the matches and the gaps between them.
  thread_local std::vector<Seg> segs, merged;
  segs.clear();
  size_t prev = 0;
  for (auto [b, e] : matches) {
    if (b > prev) segs.push_back({prev, b, invert});
    segs.push_back({b, e, !invert});
    prev = e;
  }
  if (prev < n) segs.push_back({prev, n, invert});

  merged.clear();
  switch (behavior) {
    case SplitBehavior::isolated:
      merged = segs;
      for (auto& s : merged) s.match = false;
      break;
    case SplitBehavior::removed:
      merged = segs;
      break;
    case SplitBehavior::contiguous: {
      bool prev_match = false;
      for (const auto& s : segs) {
        if (s.match == prev_match && !merged.empty()) merged.back().e = s.e;
        else merged.push_back({s.b, s.e, false});
        prev_match = s.match;
      }
      break;
    }
    case SplitBehavior::merged_with_previous: {
      bool prev_match = false;
      for (const auto& s : segs) {
        if (s.match && !prev_match && !merged.empty()) merged.back().e = s.e;
        else merged.push_back({s.b, s.e, false});
        prev_match = s.match;
      }
      break;
    }
    case SplitBehavior::merged_with_next: {
      bool prev_match = false;
      for (size_t k = segs.size(); k-- > 0;) {
        const auto& s = segs[k];
        if (s.match && !prev_match && !merged.empty()) merged.back().b = s.b;
        else merged.push_back({s.b, s.e, false});
        prev_match = s.match;
      }
      std::reverse(merged.begin(), merged.end());
      break;
    }
  }
  for (const auto& s : merged)
    if (!s.match && s.e > s.b) out->push_back(Piece{uint32_t(p.begin + s.b), uint32_t(p.begin + s.e), -1});
}

namespace {

SplitBehavior split_behavior_from_json(const nlohmann::json& j) {
  const std::string b = j.get<std::string>();
  if (b == "Isolated") return SplitBehavior::isolated;
  if (b == "Removed") return SplitBehavior::removed;
  if (b == "MergedWithPrevious") return SplitBehavior::merged_with_previous;
  if (b == "MergedWithNext") return SplitBehavior::merged_with_next;
  if (b == "Contiguous") return SplitBehavior::contiguous;
  STRATA_CHECK(false, "tokenizer.json: split behavior \"", b, "\" is unknown");
  return SplitBehavior::isolated;
}

// Applies `find(text, n, matches)` to every piece that is not yet a token.
template <class Find>
void split_all(PreTokenized& pt, bool invert, SplitBehavior behavior, Find&& find) {
  thread_local std::vector<std::pair<size_t, size_t>> matches;
  std::vector<Piece> out;
  out.reserve(pt.pieces.size() * 2);
  for (const Piece& p : pt.pieces) {
    if (p.added_id >= 0) {
      out.push_back(p);
      continue;
    }
    matches.clear();
    find(pt.buf.text.data() + p.begin, size_t(p.end - p.begin), &matches);
    pre_tokenizer_split_piece(p, matches, invert, behavior, &out);
  }
  pt.pieces = std::move(out);
}

// Every character for which pred(cp) holds is a match of its own (Hugging Face's char patterns).
template <class Pred>
auto char_matcher(Pred pred) {
  return [pred](const char* s, size_t n, std::vector<std::pair<size_t, size_t>>* m) {
    for (size_t i = 0; i < n;) {
      size_t len;
      uint32_t cp = utf8_decode(s, i, &len);
      if (pred(cp)) m->emplace_back(i, i + len);
      i += len;
    }
  };
}

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(Regex re, SplitBehavior behavior, bool invert)
      : re_(std::move(re)), behavior_(behavior), invert_(invert) {}
  void pre_tokenize(PreTokenized& pt) const override {
    split_all(pt, invert_, behavior_,
              [&](const char* s, size_t n, std::vector<std::pair<size_t, size_t>>* m) { re_.find_all(s, n, m); });
  }

 private:
  Regex re_;
  SplitBehavior behavior_;
  bool invert_;
};

class DigitsPreTokenizer final : public PreTokenizer {
 public:
  explicit DigitsPreTokenizer(bool individual) : individual_(individual) {}
  void pre_tokenize(PreTokenized& pt) const override {
    split_all(pt, false, individual_ ? SplitBehavior::isolated : SplitBehavior::contiguous,
              char_matcher(unicode_is_numeric));
  }

 private:
  bool individual_;
};

class CharSplitPreTokenizer final : public PreTokenizer {  // WhitespaceSplit, CharDelimiterSplit
 public:
  explicit CharSplitPreTokenizer(uint32_t delim) : delim_(delim) {}
  void pre_tokenize(PreTokenized& pt) const override {
    if (delim_ == 0)
      split_all(pt, false, SplitBehavior::removed, char_matcher(unicode_is_whitespace));
    else
      split_all(pt, false, SplitBehavior::removed, char_matcher([d = delim_](uint32_t cp) { return cp == d; }));
  }

 private:
  uint32_t delim_;  // 0: any whitespace
};

// ByteLevel: optional prefix space per piece, optional GPT-2 regex split, then every byte becomes
// its printable stand-in character.
class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex) : add_prefix_space_(add_prefix_space) {
    if (use_regex)
      re_ = Regex("'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+",
                  "ByteLevel pre-tokenizer");
  }
  void pre_tokenize(PreTokenized& pt) const override {
    if (add_prefix_space_) {
      NormText nb;
      nb.text.reserve(pt.buf.size() + pt.pieces.size());
      nb.align.reserve(nb.text.capacity());
      for (Piece& p : pt.pieces) {
        uint32_t b = uint32_t(nb.size());
        if (p.added_id < 0 && pt.buf.text[p.begin] != ' ') nb.append(" ", pt.buf.align[p.begin]);
        nb.append_from(pt.buf, p.begin, p.end);
        p.begin = b, p.end = uint32_t(nb.size());
      }
      pt.buf = std::move(nb);
    }
    if (re_.valid())
      split_all(pt, false, SplitBehavior::isolated,
                [&](const char* s, size_t n, std::vector<std::pair<size_t, size_t>>* m) { re_.find_all(s, n, m); });
    const auto& chars = byte_level_chars();
    NormText nb;
    nb.text.reserve(pt.buf.size() * 2);
    nb.align.reserve(pt.buf.size() * 2);
    for (Piece& p : pt.pieces) {
      uint32_t b = uint32_t(nb.size());
      if (p.added_id >= 0) {
        nb.append_from(pt.buf, p.begin, p.end);
      } else {
        for (uint32_t i = p.begin; i < p.end; ++i) nb.append(chars[(unsigned char)pt.buf.text[i]], pt.buf.align[i]);
      }
      p.begin = b, p.end = uint32_t(nb.size());
    }
    pt.buf = std::move(nb);
  }

 private:
  bool add_prefix_space_;
  Regex re_;
};

// Metaspace: spaces become the replacement character, a replacement is prepended per
// prepend_scheme, and with `split` every replacement starts a new piece.
class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  enum class Prepend { always, first, never };
  MetaspacePreTokenizer(std::string replacement, Prepend scheme, bool split)
      : rep_(std::move(replacement)), scheme_(scheme), split_(split) {
    size_t len;
    rep_cp_ = utf8_decode(rep_.data(), 0, &len);
  }
  void pre_tokenize(PreTokenized& pt) const override {
    NormText nb;
    nb.text.reserve(pt.buf.size() + 16);
    nb.align.reserve(nb.text.capacity());
    for (Piece& p : pt.pieces) {
      uint32_t b = uint32_t(nb.size());
      if (p.added_id >= 0) {
        nb.append_from(pt.buf, p.begin, p.end);
      } else {
        bool starts_with_rep = pt.buf.text[p.begin] == ' ' || pt.buf.text.compare(p.begin, rep_.size(), rep_) == 0;
        bool prepend = scheme_ == Prepend::always ? !starts_with_rep
                       : scheme_ == Prepend::first ? !starts_with_rep && pt.buf.align[p.begin].begin == 0
                                                   : false;
        if (prepend) nb.append(rep_, pt.buf.align[p.begin]);
        for (uint32_t i = p.begin; i < p.end; ++i) {
          if (pt.buf.text[i] == ' ') nb.append(rep_, pt.buf.align[i]);
          else nb.append(std::string_view(&pt.buf.text[i], 1), pt.buf.align[i]);
        }
      }
      p.begin = b, p.end = uint32_t(nb.size());
    }
    pt.buf = std::move(nb);
    if (split_)
      split_all(pt, false, SplitBehavior::merged_with_next, char_matcher([c = rep_cp_](uint32_t cp) { return cp == c; }));
  }

 private:
  std::string rep_;
  uint32_t rep_cp_ = 0;
  Prepend scheme_;
  bool split_;
};

class SequencePreTokenizer final : public StageSequence<PreTokenizer> {
 public:
  using StageSequence::StageSequence;
  void pre_tokenize(PreTokenized& pt) const override {
    for (const auto& p : parts()) p->pre_tokenize(pt);
  }
};

Regex pattern_from_json(const nlohmann::json& pat, const std::string& what) {
  if (pat.contains("String")) return Regex::literal(pat["String"].get<std::string>(), what);
  STRATA_CHECK(pat.contains("Regex"), "tokenizer.json: ", what, " pattern needs \"String\" or \"Regex\"");
  return Regex(pat["Regex"].get<std::string>(), what);
}

}  // namespace

std::unique_ptr<PreTokenizer> pre_tokenizer_from_json(const nlohmann::json& j) {
  if (j.is_null()) return nullptr;
  const std::string type = stage_type_from_json(j, "pre_tokenizer");
  if (type == "Split")
    return std::make_unique<SplitPreTokenizer>(pattern_from_json(j.at("pattern"), "Split pre-tokenizer"),
                                               split_behavior_from_json(j.at("behavior")), j.value("invert", false));
  if (type == "ByteLevel")
    return std::make_unique<ByteLevelPreTokenizer>(j.value("add_prefix_space", true), j.value("use_regex", true));
  if (type == "Metaspace") {
    auto scheme = MetaspacePreTokenizer::Prepend::always;
    if (j.contains("prepend_scheme")) {
      std::string s = j["prepend_scheme"].get<std::string>();
      STRATA_CHECK(s == "always" || s == "first" || s == "never", "tokenizer.json: Metaspace prepend_scheme \"", s,
                   "\" is unknown");
      scheme = s == "always" ? MetaspacePreTokenizer::Prepend::always
               : s == "first" ? MetaspacePreTokenizer::Prepend::first
                              : MetaspacePreTokenizer::Prepend::never;
    } else if (j.contains("add_prefix_space") && !j["add_prefix_space"].get<bool>()) {
      scheme = MetaspacePreTokenizer::Prepend::never;  // files from before prepend_scheme existed
    }
    return std::make_unique<MetaspacePreTokenizer>(j.value("replacement", std::string("\xE2\x96\x81")), scheme,
                                                   j.value("split", true));
  }
  if (type == "Digits") return std::make_unique<DigitsPreTokenizer>(j.value("individual_digits", false));
  if (type == "WhitespaceSplit") return std::make_unique<CharSplitPreTokenizer>(0);
  if (type == "CharDelimiterSplit") {
    std::string d = j.at("delimiter").get<std::string>();
    size_t len;
    STRATA_CHECK(!d.empty(), "tokenizer.json: CharDelimiterSplit needs a delimiter");
    return std::make_unique<CharSplitPreTokenizer>(utf8_decode(d.data(), 0, &len));
  }
  if (type == "Whitespace")  // \w+|[^\w\s]+ with the regex crate's Unicode \w; the gaps are dropped
    return std::make_unique<SplitPreTokenizer>(
        Regex("[\\p{L}\\p{M}\\p{Nd}\\p{Nl}\\p{Pc}\\x{200C}\\x{200D}]+|[^\\p{L}\\p{M}\\p{Nd}\\p{Nl}\\p{Pc}\\x{200C}"
              "\\x{200D}\\s]+",
              "Whitespace pre-tokenizer"),
        SplitBehavior::removed, true);
  if (type == "Sequence")
    return stage_sequence_from_json<SequencePreTokenizer>(j.at("pretokenizers"), pre_tokenizer_from_json);
  stage_type_unsupported("pre_tokenizer", type,
                         "Split, ByteLevel, Metaspace, Digits, Whitespace, WhitespaceSplit, CharDelimiterSplit, Sequence");
}

}  // namespace strata::tok
