// Decoder implementations (see decoders.h).
#include "io/tokenizer/decoders.h"

#include "io/tokenizer/pre_tokenizers.h"
#include "io/tokenizer/text.h"
#include "io/tokenizer/stage_json.h"
#include "src/core/error.h"

namespace strata::tok {
namespace {

// Byte-level characters back to bytes; a token with any other character is kept as its UTF-8
// bytes. The bytes of all tokens are joined and invalid UTF-8 becomes U+FFFD.
class ByteLevelDecoder final : public Decoder {
 public:
  ByteLevelDecoder() {
    const auto& chars = byte_level_chars();
    for (int b = 0; b < 256; ++b) {
      size_t len;
      byte_of_[utf8_decode(chars[b].data(), 0, &len)] = uint8_t(b);
    }
  }
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const std::string& t : tokens) {
      size_t start = bytes.size();
      bool ok = true;
      for (size_t i = 0; i < t.size();) {
        size_t len;
        uint32_t cp = utf8_decode(t.data(), i, &len);
        if (cp >= 0x200 || !has(cp)) {
          ok = false;
          break;
        }
        bytes.push_back(char(byte_of_[cp]));
        i += len;
      }
      if (!ok) bytes.resize(start), bytes += t;
    }
    tokens.assign(1, utf8_lossy(bytes));
  }

  // Like Rust's String::from_utf8_lossy: each maximal invalid subsequence becomes one U+FFFD.
  static std::string utf8_lossy(const std::string& b) {
    if (utf8_find_invalid(b) == std::string::npos) return b;
    std::string out;
    size_t i = 0;
    while (i < b.size()) {
      size_t bad = utf8_find_invalid(std::string_view(b).substr(i));
      if (bad == std::string::npos) {
        out.append(b, i, std::string::npos);
        break;
      }
      out.append(b, i, bad);
      i += bad;
      // Length of the invalid prefix: the longest prefix of a valid sequence, at least one byte.
      unsigned char c = b[i];
      size_t need = utf8_char_len(c);
      size_t k = 1;
      if (need > 1) {
        unsigned char lo = 0x80, hi = 0xBF;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
        bool lead_ok = (c >= 0xC2 && c <= 0xF4);
        if (lead_ok && i + 1 < b.size() && (unsigned char)b[i + 1] >= lo && (unsigned char)b[i + 1] <= hi) {
          k = 2;
          while (k < need && i + k < b.size() && ((unsigned char)b[i + k] & 0xC0) == 0x80) ++k;
        }
      }
      out += "\xEF\xBF\xBD";
      i += k;
    }
    return out;
  }

 private:
  bool has(uint32_t cp) const {
    const auto& chars = byte_level_chars();
    size_t len;
    return utf8_decode(chars[byte_of_[cp]].data(), 0, &len) == cp;
  }
  uint8_t byte_of_[0x200] = {};
};

class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(std::string rep, bool prepend) : rep_(std::move(rep)), prepend_(prepend) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      const std::string& t = tokens[i];
      for (size_t p = 0; p < t.size();) {
        if (t.compare(p, rep_.size(), rep_) == 0) {
          if (!(i == 0 && prepend_)) out.push_back(' ');
          p += rep_.size();
        } else {
          out.push_back(t[p++]);
        }
      }
      tokens[i] = std::move(out);
    }
  }

 private:
  std::string rep_;
  bool prepend_;
};

// Every occurrence of `from` (not empty) in t replaced by `to`, left to right.
void replace_every(std::string& t, const std::string& from, std::string_view to) {
  if (t.find(from) == std::string::npos) return;
  std::string out;
  size_t prev = 0;
  for (size_t p = t.find(from); p != std::string::npos; p = t.find(from, prev)) {
    out.append(t, prev, p - prev);
    out += to;
    prev = p + from.size();
  }
  out.append(t, prev, std::string::npos);
  t = std::move(out);
}

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(std::string from, std::string to) : from_(std::move(from)), to_(std::move(to)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    if (from_.empty()) return;
    for (std::string& t : tokens) replace_every(t, from_, to_);
  }

 private:
  std::string from_, to_;
};

// <0xNN> tokens back to bytes; a run that is not valid UTF-8 gives one U+FFFD per byte.
class ByteFallbackDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string pending;
    size_t pending_n = 0;
    auto flush = [&] {
      if (pending_n == 0) return;
      if (utf8_find_invalid(pending) == std::string::npos) {
        out.push_back(pending);
      } else {
        for (size_t k = 0; k < pending_n; ++k) out.emplace_back("\xEF\xBF\xBD");
      }
      pending.clear();
      pending_n = 0;
    };
    for (std::string& t : tokens) {
      int byte = -1;
      if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') {
        auto hex = [](char c) {
          return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        };
        int hi = hex(t[3]), lo = hex(t[4]);
        if (hi >= 0 && lo >= 0) byte = hi * 16 + lo;
      }
      if (byte >= 0) {
        pending.push_back(char(byte));
        ++pending_n;
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens = std::move(out);
  }
};

class FuseDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

// Removes up to `start` leading and `stop` trailing copies of one character from every token.
class StripDecoder final : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop) : c_(std::move(content)), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    if (c_.empty()) return;
    for (std::string& t : tokens) {
      size_t b = 0, e = t.size();
      for (size_t k = 0; k < start_ && b + c_.size() <= e && t.compare(b, c_.size(), c_) == 0; ++k) b += c_.size();
      for (size_t k = 0; k < stop_ && e >= b + c_.size() && t.compare(e - c_.size(), c_.size(), c_) == 0; ++k)
        e -= c_.size();
      t = t.substr(b, e - b);
    }
  }

 private:
  std::string c_;
  size_t start_, stop_;
};

// Classic BPE: the end-of-word suffix becomes a space (nothing after the last token).
class BpeDecoder final : public Decoder {
 public:
  explicit BpeDecoder(std::string suffix) : suffix_(std::move(suffix)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    if (suffix_.empty()) return;
    for (size_t i = 0; i < tokens.size(); ++i) replace_every(tokens[i], suffix_, i + 1 == tokens.size() ? "" : " ");
  }

 private:
  std::string suffix_;
};

class SequenceDecoder final : public StageSequence<Decoder> {
 public:
  using StageSequence::StageSequence;
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& p : parts()) p->decode_chain(tokens);
  }
};

}  // namespace

std::unique_ptr<Decoder> decoder_from_json(const nlohmann::json& j) {
  if (j.is_null()) return nullptr;
  const std::string type = stage_type_from_json(j, "decoder");
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Metaspace") {
    bool prepend = true;
    if (j.contains("prepend_scheme")) prepend = j["prepend_scheme"].get<std::string>() != "never";
    else if (j.contains("add_prefix_space")) prepend = j["add_prefix_space"].get<bool>();
    return std::make_unique<MetaspaceDecoder>(j.value("replacement", std::string("\xE2\x96\x81")), prepend);
  }
  if (type == "Replace") {
    const auto& pat = j.at("pattern");
    STRATA_CHECK(pat.contains("String"), "tokenizer.json: Replace decoder with a Regex pattern is not supported");
    return std::make_unique<ReplaceDecoder>(pat["String"].get<std::string>(), j.at("content").get<std::string>());
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip")
    return std::make_unique<StripDecoder>(j.at("content").get<std::string>(), j.value("start", size_t(0)),
                                          j.value("stop", size_t(0)));
  if (type == "BPEDecoder") return std::make_unique<BpeDecoder>(j.value("suffix", std::string("</w>")));
  if (type == "Sequence")
    return stage_sequence_from_json<SequenceDecoder>(j.at("decoders"), decoder_from_json);
  stage_type_unsupported("decoder", type,
                         "ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, BPEDecoder, Sequence");
}

}  // namespace strata::tok
