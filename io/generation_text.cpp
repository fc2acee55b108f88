// The model's EOS ids and generated text (io/generation_text.h).
#include "io/generation_text.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "io/files.h"
#include "io/tokenizer/tokenizer.h"
#include "src/core/error.h"

namespace strata {
namespace {

// eos_token_id of a config file's JSON: an integer, a list of integers, or null/absent.
bool eos_ids_from(const nlohmann::json& j, const std::string& origin, std::vector<int32_t>* out) {
  if (!j.is_object() || !j.contains("eos_token_id") || j["eos_token_id"].is_null()) return false;
  const nlohmann::json& e = j["eos_token_id"];
  out->clear();
  if (e.is_number_integer()) {
    out->push_back(e.get<int32_t>());
    return true;
  }
  STRATA_CHECK(e.is_array(), origin, ": eos_token_id must be an integer or a list of integers");
  for (const auto& v : e) {
    STRATA_CHECK(v.is_number_integer(), origin, ": eos_token_id must be an integer or a list of integers");
    out->push_back(v.get<int32_t>());
  }
  return true;
}

}  // namespace

std::vector<int32_t> model_eos_ids(const std::string& model_dir, const ModelConfig& cfg) {
  std::vector<int32_t> ids;
  const std::string gen_path = model_dir + "/generation_config.json";
  if (std::filesystem::exists(gen_path)) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(file_read(gen_path, "generation config", "check the model directory", ErrorKind::input));
    } catch (const nlohmann::json::parse_error& e) {
      STRATA_CHECK(false, gen_path, " is not valid JSON: ", e.what());
    }
    if (eos_ids_from(j, gen_path, &ids)) return ids;
  }
  eos_ids_from(cfg.raw, model_dir + "/config.json", &ids);
  return ids;
}

std::string decode_text(const TextEncoder& enc, const std::vector<int32_t>& ids) {
  if (const Tokenizer* tok = enc.tokenizer()) {
    // ids past the tokenizer's (a model's vocab_size padded beyond it) have no text: dropped, as
    // Hugging Face tokenizers' decode drops ids it has no token for
    std::vector<int32_t> known;
    known.reserve(ids.size());
    for (int32_t id : ids)
      if (id >= 0 && id < tok->vocab_size()) known.push_back(id);
    return tok->decode(known, /*skip_special_tokens=*/true);
  }
  std::string text;  // bytes: ids are the bytes (an id >= 256 cannot come from text; shown as U+FFFD)
  for (int32_t id : ids) text += id < 256 ? std::string(1, char(id)) : std::string("\xEF\xBF\xBD");
  return text;
}

}  // namespace strata
