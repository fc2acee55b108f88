// Added-token matching (see added_tokens.h).
#include "io/tokenizer/added_tokens.h"

#include <algorithm>

#include "io/tokenizer/normalizers.h"
#include "io/tokenizer/text.h"

namespace strata::tok {

void AddedVocab::Trie::add(std::string_view key, int32_t token) {
  int32_t n = 0;
  for (unsigned char c : key) {
    auto& next = nodes[n].next;
    auto it = std::find_if(next.begin(), next.end(), [c](const auto& e) { return e.first == c; });
    if (it != next.end()) {
      n = it->second;
    } else {
      int32_t child = int32_t(nodes.size());
      nodes[n].next.emplace_back(c, child);
      nodes.emplace_back();
      n = child;
    }
  }
  nodes[n].token = token;
  first_byte[(unsigned char)key[0]] = true;
}

size_t AddedVocab::Trie::longest(std::string_view s, size_t p, int32_t* token) const {
  size_t best = 0;
  int32_t n = 0;
  for (size_t i = p; i < s.size(); ++i) {
    const auto& next = nodes[n].next;
    unsigned char c = s[i];
    auto it = std::find_if(next.begin(), next.end(), [c](const auto& e) { return e.first == c; });
    if (it == next.end()) break;
    n = it->second;
    if (nodes[n].token >= 0) best = i + 1 - p, *token = nodes[n].token;
  }
  return best;
}

void AddedVocab::build(std::vector<AddedToken> tokens, const Normalizer* norm) {
  tokens_ = std::move(tokens);
  raw_ = Trie{};
  normalized_ = Trie{};
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const AddedToken& t = tokens_[i];
    if (t.content.empty()) continue;
    if (!t.normalized) {
      raw_.add(t.content, int32_t(i));
      continue;
    }
    NormText nt;
    text_from_original(t.content, 0, t.content.size(), &nt);
    if (norm) norm->normalize(nt);
    if (!nt.text.empty()) normalized_.add(nt.text, int32_t(i));
  }
}

namespace {

uint32_t last_char(std::string_view s, size_t end, size_t* begin) {
  size_t p = end - 1;
  while (p > 0 && (static_cast<unsigned char>(s[p]) & 0xC0) == 0x80) --p;
  size_t len;
  *begin = p;
  return utf8_decode(s.data(), p, &len);
}

}  // namespace

void AddedVocab::split(std::string_view s, bool normalized_set, std::vector<AddedSplit>* out) const {
  out->clear();
  const Trie& trie = normalized_set ? normalized_ : raw_;
  size_t start_offset = 0;
  if (trie.nodes.size() > 1) {
    for (size_t p = 0; p < s.size();) {
      if (!trie.first_byte[(unsigned char)s[p]]) {
        ++p;
        continue;
      }
      int32_t ti = -1;
      size_t len = trie.longest(s, p, &ti);
      if (len == 0) {
        ++p;
        continue;
      }
      size_t start = p, stop = p + len;
      p = stop;  // the search resumes after the match whatever happens to it below
      const AddedToken& t = tokens_[ti];
      if (t.single_word) {
        size_t cb, clen;
        bool word_before = start > 0 && unicode_is_word(last_char(s, start, &cb));
        bool word_after = stop < s.size() && unicode_is_word(utf8_decode(s.data(), stop, &clen));
        if (word_before || word_after) continue;
      }
      if (t.lstrip) {
        size_t b = start;
        while (b > 0) {
          size_t cb;
          if (!unicode_is_whitespace(last_char(s, b, &cb))) break;
          b = cb;
        }
        start = std::max(b, start_offset);
      }
      if (t.rstrip) {
        while (stop < s.size()) {
          size_t clen;
          if (!unicode_is_whitespace(utf8_decode(s.data(), stop, &clen))) break;
          stop += clen;
        }
      }
      if (start_offset < start) out->push_back({start_offset, start, -1});
      out->push_back({start, stop, t.id});
      start_offset = stop;
    }
  }
  if (start_offset < s.size()) out->push_back({start_offset, s.size(), -1});
}

}  // namespace strata::tok
