// Added tokens of tokenizer.json ("added_tokens"): special and plain tokens that are cut out of the
// text before the model sees it. Tokens with normalized=false are matched on the original text,
// the others on the normalized text (against their normalized content). Matching is leftmost-
// longest like Hugging Face's Aho-Corasick, then single_word / lstrip / rstrip are applied.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace strata::tok {

class Normalizer;

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool single_word = false, lstrip = false, rstrip = false, normalized = true, special = false;
};

// One split of a text: [begin, end) bytes; id >= 0 when the split is an added token.
struct AddedSplit {
  size_t begin, end;
  int32_t id;
};

class AddedVocab {
 public:
  // `norm` normalizes the content of normalized tokens (may be null).
  void build(std::vector<AddedToken> tokens, const Normalizer* norm);

  // Splits s at matches of the raw (normalized=false) or normalized token set; the splits cover s.
  void split(std::string_view s, bool normalized_set, std::vector<AddedSplit>* out) const;

  const std::vector<AddedToken>& tokens() const { return tokens_; }
  bool empty() const { return tokens_.empty(); }

 private:
  struct Trie {
    struct Node {
      std::vector<std::pair<uint8_t, int32_t>> next;
      int32_t token = -1;  // index into tokens_
    };
    std::vector<Node> nodes{Node{}};
    bool first_byte[256] = {};
    void add(std::string_view key, int32_t token);
    // Length of the longest key starting at s[p] (0 when none); *token receives its index.
    size_t longest(std::string_view s, size_t p, int32_t* token) const;
  };
  std::vector<AddedToken> tokens_;
  Trie raw_, normalized_;
};

}  // namespace strata::tok
