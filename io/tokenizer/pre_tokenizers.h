// Pre-tokenizers of tokenizer.json ("pre_tokenizer"): Split (the file's regex or a literal, with
// every split behaviour and invert), ByteLevel, Metaspace, Digits, Whitespace, WhitespaceSplit,
// CharDelimiterSplit and Sequence. They cut the normalized text into pieces that the model
// tokenizes independently; pieces that are already tokens (added tokens) pass through untouched.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <utility>
#include <vector>

#include "io/tokenizer/text.h"

namespace strata::tok {

// A piece of PreTokenized::buf: bytes [begin, end); added_id >= 0 when it is already a token.
struct Piece {
  uint32_t begin = 0, end = 0;
  int32_t added_id = -1;
};

struct PreTokenized {
  NormText buf;
  std::vector<Piece> pieces;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void pre_tokenize(PreTokenized& pt) const = 0;
};

std::unique_ptr<PreTokenizer> pre_tokenizer_from_json(const nlohmann::json& j);

// The GPT-2 byte -> character table: byte_level_chars()[b] is the UTF-8 of byte b's character.
const std::vector<std::string>& byte_level_chars();

enum class SplitBehavior { isolated, removed, merged_with_previous, merged_with_next, contiguous };

// Cuts piece `p` of length n at the sorted, non-overlapping `matches` (offsets within the piece)
// following Hugging Face's NormalizedString::split, and appends the resulting non-empty pieces.
void pre_tokenizer_split_piece(const Piece& p, const std::vector<std::pair<size_t, size_t>>& matches, bool invert,
                               SplitBehavior behavior, std::vector<Piece>* out);

}  // namespace strata::tok
