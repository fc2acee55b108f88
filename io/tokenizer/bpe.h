// The BPE model of tokenizer.json ("model": {"type": "BPE"}): vocabulary, merges (as "a b" strings
// or ["a", "b"] pairs), ignore_merges, byte_fallback, unk_token / fuse_unk and
// continuing_subword_prefix / end_of_word_suffix. Merging follows Hugging Face's Word::merge_all
// (lowest rank first, leftmost on ties). Results per pre-token are memoized in a bounded word cache.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "io/tokenizer/flat_map.h"

namespace strata::tok {

// One token of a word: its id and how many bytes of the word it covers.
struct BpeToken {
  int32_t id;
  uint32_t len;
};

class BpeModel {
 public:
  static std::unique_ptr<BpeModel> from_json(const nlohmann::json& model);

  // Appends the tokens of one pre-token `word` to *out.
  void tokenize(std::string_view word, std::vector<BpeToken>* out) const;

  int32_t token_to_id(std::string_view token) const {
    const int32_t* id = vocab_.find(token);
    return id ? *id : -1;
  }
  // nullptr when the id is not in the vocabulary.
  const std::string* id_to_token(int32_t id) const {
    return id >= 0 && size_t(id) < vocab_r_.size() && has_id_[id] ? &vocab_r_[id] : nullptr;
  }
  int64_t max_id() const { return int64_t(vocab_r_.size()) - 1; }

 private:
  struct Merge {
    int32_t rank, new_id;
  };
  void merge_word(std::string_view word, std::vector<BpeToken>* out) const;
  void tokenize_cached(std::string_view word, std::vector<BpeToken>* out) const;
  // Long words (a SentencePiece-style file has no pre-tokenizer: the whole text is one word) are cut
  // where no merge can ever cross: between characters c1 c2 that are both vocabulary tokens and
  // never appear side by side inside any vocabulary token. BPE of the parts equals BPE of the whole.
  void tokenize_long(std::string_view word, std::vector<BpeToken>* out) const;
  bool boundary_is_safe(uint32_t c1, std::string_view s1, uint32_t c2, std::string_view s2) const;

  FlatStrMap<int32_t> vocab_;
  std::vector<std::string> vocab_r_;
  std::vector<uint8_t> has_id_;
  FlatU64Map<Merge> merges_;  // (left id << 32 | right id) -> rank, merged id
  std::string prefix_, suffix_;
  int32_t unk_id_ = -1;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  std::array<int32_t, 256> byte_ids_{};  // <0xNN> token ids for byte_fallback (-1: missing)

  // Word cache: pre-token -> (offset, count) into tokens; sharded so threads rarely contend.
  static constexpr int kCacheShards = 16;
  static constexpr size_t kCacheMaxWords = 1 << 14;  // per shard
  static constexpr size_t kCacheMaxWordBytes = 256;
  struct CacheShard {
    std::mutex mu;
    FlatStrMap<uint64_t> index;
    std::vector<BpeToken> tokens;
  };
  mutable std::unique_ptr<CacheShard[]> cache_ = std::make_unique<CacheShard[]>(kCacheShards);
  // Sorted (c1 << 32 | c2) of adjacent characters inside vocabulary tokens; built on first use.
  mutable std::once_flag pairs_once_;
  mutable std::vector<uint64_t> inner_pairs_;
  uint64_t serial_ = 0;  // tells this model's entries apart in the per-thread boundary memo
};

}  // namespace strata::tok
