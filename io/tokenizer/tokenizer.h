// strata::Tokenizer: reads a Hugging Face tokenizer.json and turns text into exactly the ids the
// Hugging Face `tokenizers` library produces (and back). The file is read generally, component by
// component (normalizer, pre_tokenizer, BPE model, added_tokens, post_processor, decoder); see
// io/tokenizer/*.h for what each supports. A component the file names but strata does not implement
// is a load-time strata::Error naming its type. "truncation" and "padding" are ignored: strata
// applies its own sequence-length policy.
//
// Pipeline per text: added tokens matched on the original text -> normalizer on the rest ->
// normalized added tokens -> pre-tokenizer pieces -> BPE per piece (word cache) -> post-processor.
// Thread-safe: encode/decode are const and may run concurrently.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace strata {

class Tokenizer {
 public:
  // `path` is a directory holding tokenizer.json, or the file itself.
  static Tokenizer load(const std::string& path);
  // From the text of a tokenizer.json; `origin` names it in error messages.
  static Tokenizer from_json_text(const std::string& json_text, const std::string& origin);

  // Token ids of `text` (valid UTF-8, else strata::Error). add_special_tokens applies the
  // post-processor's template (e.g. BOS), like Hugging Face's encode(text, add_special_tokens).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const;
  // Same, plus per-token byte spans [begin, end) into `text` ((0, 0) for template tokens).
  std::vector<int32_t> encode_with_offsets(std::string_view text, bool add_special_tokens,
                                           std::vector<std::pair<size_t, size_t>>* offsets) const;
  // Text of `ids` through the file's decoder; ids outside the vocabulary are a strata::Error.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;

  int64_t vocab_size() const;  // max id + 1 over the model vocabulary and the added tokens
  int32_t token_to_id(std::string_view token) const;  // -1 if absent
  const std::string& id_to_token(int32_t id) const;   // "" for an id no token has; throws outside [0, vocab_size)
  bool is_special(int32_t id) const;                  // an added token marked special

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::vector<int32_t> encode_impl(std::string_view text, bool add_special_tokens,
                                   std::vector<std::pair<size_t, size_t>>* offsets) const;
  std::shared_ptr<const Impl> impl_;
};

}  // namespace strata
