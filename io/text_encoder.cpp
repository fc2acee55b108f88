// TextEncoder: a tokenizer directory or UTF-8 bytes, and the chat template (see io/text_encoder.h).
#include "io/text_encoder.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "io/chat_template.h"
#include "io/files.h"
#include "io/json.h"
#include "io/tokenizer/tokenizer.h"
#include "src/core/error.h"

namespace strata {

struct TextEncoder::State {
  std::string dir;  // "" for bytes
  std::unique_ptr<Tokenizer> tokenizer;
  std::once_flag chat_once;
  std::unique_ptr<ChatTemplate> chat;
  bool chat_builtin = false;
};

const char* TextEncoder::chatml_source() {
  return R"({%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %})";
}

TextEncoder TextEncoder::bytes() {
  TextEncoder e;
  e.s_ = std::make_shared<State>();
  return e;
}

TextEncoder TextEncoder::from_dir(const std::string& dir) {
  TextEncoder e;
  e.s_ = std::make_shared<State>();
  e.s_->dir = dir;
  e.s_->tokenizer = std::make_unique<Tokenizer>(Tokenizer::load(dir));
  return e;
}

TextEncoder TextEncoder::from_tokenizer(const Tokenizer& t) {
  TextEncoder e;
  e.s_ = std::make_shared<State>();
  e.s_->tokenizer = std::make_unique<Tokenizer>(t);
  return e;
}

TextEncoder TextEncoder::resolve(const std::string& setting, const std::string& model_path) {
  if (setting == "bytes") return bytes();
  if (setting == "auto") {
    if (!model_path.empty() && std::filesystem::exists(std::filesystem::path(model_path) / "tokenizer.json"))
      return from_dir(model_path);
    return bytes();
  }
  STRATA_CHECK(std::filesystem::exists(std::filesystem::path(setting) / "tokenizer.json"), "data.tokenizer = \"",
               setting, "\" holds no tokenizer.json: name a Hugging Face tokenizer directory, \"bytes\" or \"auto\"");
  return from_dir(setting);
}

bool TextEncoder::is_bytes() const { return !s_->tokenizer; }
const std::string& TextEncoder::dir() const { return s_->dir; }
int64_t TextEncoder::vocab_size() const { return s_->tokenizer ? s_->tokenizer->vocab_size() : 256; }
const Tokenizer* TextEncoder::tokenizer() const { return s_->tokenizer.get(); }

std::vector<int32_t> TextEncoder::encode_text(std::string_view text) const {
  if (s_->tokenizer) return s_->tokenizer->encode(text, true);
  return std::vector<int32_t>(reinterpret_cast<const unsigned char*>(text.data()),
                              reinterpret_cast<const unsigned char*>(text.data()) + text.size());
}

std::vector<int32_t> TextEncoder::encode_chat(std::string_view text, std::vector<std::pair<size_t, size_t>>* offsets) const {
  if (s_->tokenizer) return s_->tokenizer->encode_with_offsets(text, false, offsets);
  offsets->resize(text.size());
  for (size_t i = 0; i < text.size(); ++i) (*offsets)[i] = {i, i + 1};
  return encode_text(text);
}

namespace {

// True when the directory ships a chat template (a missing one is not an error: ChatML is used).
bool dir_has_chat_template(const std::string& dir) {
  namespace fs = std::filesystem;
  if (fs::exists(fs::path(dir) / "chat_template.jinja")) return true;
  fs::path cfg = fs::path(dir) / "tokenizer_config.json";
  if (!fs::exists(cfg)) return false;
  nlohmann::json j = nlohmann::json::parse(file_read(cfg.string(), "tokenizer config"), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return true;  // ChatTemplate::load says what is wrong
  return j.contains("chat_template") && !j["chat_template"].is_null();
}

}  // namespace

const ChatTemplate& TextEncoder::chat_template() const {
  std::call_once(s_->chat_once, [&] {
    if (!s_->dir.empty() && dir_has_chat_template(s_->dir)) {
      s_->chat = std::make_unique<ChatTemplate>(ChatTemplate::load(s_->dir));
      return;
    }
    s_->chat = std::make_unique<ChatTemplate>(ChatTemplate::from_string(chatml_source(), "", ""));
    s_->chat_builtin = true;
    std::fprintf(stderr, "strata: %s: rendering chat samples with the built-in ChatML template "
                         "(<|im_start|>role\\ncontent<|im_end|>\\n)\n",
                 !s_->tokenizer ? "byte tokenizer"
                 : s_->dir.empty() ? "tokenizer without a directory"
                                   : (s_->dir + " has no chat template").c_str());
  });
  return *s_->chat;
}

bool TextEncoder::chat_template_is_builtin() const {
  chat_template();
  return s_->chat_builtin;
}

}  // namespace strata
