// How a dataset's text becomes token ids: a Hugging Face tokenizer directory (tokenizer.json, and
// the chat template of tokenizer_config.json / chat_template.jinja), or UTF-8 bytes as ids.
// Chat data is rendered with the directory's chat template; with bytes, or a directory without
// a chat template, with a built-in ChatML template (<|im_start|>role\ncontent<|im_end|>\n),
// which is said once on stderr. Copies share state; encoding is thread-safe.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace strata {

class Tokenizer;
struct ChatTemplate;

class TextEncoder {
 public:
  static TextEncoder bytes();
  static TextEncoder from_dir(const std::string& dir);  // a directory holding tokenizer.json
  static TextEncoder from_tokenizer(const Tokenizer& t);  // no directory: chat data gets ChatML
  // data.tokenizer: "bytes", a directory, or "auto" (model_path's tokenizer.json when it has
  // one, else bytes).
  static TextEncoder resolve(const std::string& setting, const std::string& model_path);
  // Whether a data.tokenizer setting names a directory (not "bytes" or "auto").
  static bool setting_is_dir(const std::string& setting) { return setting != "bytes" && setting != "auto"; }

  bool is_bytes() const;
  const std::string& dir() const;  // "" for bytes
  int64_t vocab_size() const;      // 256 for bytes
  const Tokenizer* tokenizer() const;  // null for bytes

  // Pretraining text: with the tokenizer's special tokens (e.g. BOS), or the bytes.
  std::vector<int32_t> encode_text(std::string_view text) const;
  // Rendered chat text, without added special tokens (as apply_chat_template(tokenize=True)),
  // and each token's byte range in `text`.
  std::vector<int32_t> encode_chat(std::string_view text, std::vector<std::pair<size_t, size_t>>* offsets) const;
  // The chat template, loaded on first use.
  const ChatTemplate& chat_template() const;
  bool chat_template_is_builtin() const;  // loads it if needed

  // The built-in ChatML template's source.
  static const char* chatml_source();

  struct State;

 private:
  std::shared_ptr<State> s_;
};

}  // namespace strata
