// Tokenizer loading (tokenizer.json -> components) and the encode / decode pipeline (see tokenizer.h).
#include "io/tokenizer/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "io/files.h"
#include "io/json.h"
#include "io/tokenizer/added_tokens.h"
#include "io/tokenizer/bpe.h"
#include "io/tokenizer/decoders.h"
#include "io/tokenizer/normalizers.h"
#include "io/tokenizer/post_processor.h"
#include "io/tokenizer/pre_tokenizers.h"
#include "src/core/error.h"

namespace strata {

using namespace tok;

struct Tokenizer::Impl {
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<BpeModel> model;
  std::unique_ptr<PostProcessor> post_processor;
  std::unique_ptr<Decoder> decoder;
  AddedVocab added;
  FlatStrMap<int32_t> added_ids;       // added token content -> id
  std::vector<std::string> id_tokens;  // (vocab_size) model tokens, overridden by added tokens
  std::vector<uint8_t> special;        // (vocab_size) 1 for special added tokens
};

Tokenizer Tokenizer::load(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path file = path;
  if (fs::is_directory(file)) file /= "tokenizer.json";
  return from_json_text(file_read(file.string(), "tokenizer file",
                                  "pass a model directory holding tokenizer.json or the file itself"),
                        file.string());
}

Tokenizer Tokenizer::from_json_text(const std::string& json_text, const std::string& origin) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::exception& e) {
    STRATA_CHECK(false, origin, " is not valid JSON: ", e.what());
  }
  auto impl = std::make_shared<Impl>();
  try {
    STRATA_CHECK(j.is_object() && j.contains("model"), "has no \"model\"; is it a Hugging Face tokenizer.json?");
    const auto& model = j["model"];
    std::string type = model.value("type", std::string(model.contains("merges") ? "BPE" : "?"));
    STRATA_CHECK(type == "BPE", "model type \"", type, "\" is not supported (strata supports BPE models)");
    impl->normalizer = normalizer_from_json(j.value("normalizer", nlohmann::json()));
    impl->pre_tokenizer = pre_tokenizer_from_json(j.value("pre_tokenizer", nlohmann::json()));
    impl->post_processor = post_processor_from_json(j.value("post_processor", nlohmann::json()));
    impl->decoder = decoder_from_json(j.value("decoder", nlohmann::json()));
    impl->model = BpeModel::from_json(model);

    std::vector<AddedToken> added;
    int64_t max_id = impl->model->max_id();
    if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
      for (const auto& a : j["added_tokens"]) {
        AddedToken t;
        t.content = a.at("content").get<std::string>();
        t.single_word = a.value("single_word", false);
        t.lstrip = a.value("lstrip", false);
        t.rstrip = a.value("rstrip", false);
        t.special = a.value("special", false);
        t.normalized = a.value("normalized", !t.special);
        // A token the model already has keeps the model's id, as in Hugging Face.
        int32_t model_id = impl->model->token_to_id(t.content);
        t.id = model_id >= 0 ? model_id : a.at("id").get<int32_t>();
        STRATA_CHECK(t.id >= 0, "added token \"", t.content, "\" has a negative id");
        max_id = std::max<int64_t>(max_id, t.id);
        added.push_back(std::move(t));
      }
    }
    impl->id_tokens.resize(size_t(max_id + 1));
    impl->special.assign(size_t(max_id + 1), 0);
    for (int64_t id = 0; id <= impl->model->max_id(); ++id)
      if (const std::string* s = impl->model->id_to_token(int32_t(id))) impl->id_tokens[id] = *s;
    for (const AddedToken& t : added) {
      impl->id_tokens[t.id] = t.content;
      impl->special[t.id] = t.special;
      impl->added_ids.insert(t.content, t.id);
    }
    impl->added.build(std::move(added), impl->normalizer.get());
  } catch (const Error& e) {
    throw Error(e.kind(), origin + ": " + e.what());
  } catch (const nlohmann::json::exception& e) {
    STRATA_CHECK(false, origin, ": unexpected structure: ", e.what());
  }
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  return encode_impl(text, add_special_tokens, nullptr);
}

std::vector<int32_t> Tokenizer::encode_with_offsets(std::string_view text, bool add_special_tokens,
                                                    std::vector<std::pair<size_t, size_t>>* offsets) const {
  STRATA_ASSERT(offsets != nullptr);
  return encode_impl(text, add_special_tokens, offsets);
}

std::vector<int32_t> Tokenizer::encode_impl(std::string_view text, bool add_special_tokens,
                                            std::vector<std::pair<size_t, size_t>>* offsets) const {
  const Impl& m = *impl_;
  STRATA_CHECK(text.size() < (size_t(1) << 32), "text of ", text.size(), " bytes is too long to tokenize at once (4 GiB max)");
  size_t bad = utf8_find_invalid(text);
  STRATA_CHECK(bad == std::string_view::npos, "text is not valid UTF-8 (byte offset ", bad, ")");

  // 1. Added tokens on the original text, the normalizer on what lies between them, then the
  //    normalized added tokens.
  PreTokenized pt;
  pt.buf.text.reserve(text.size() + 16);
  pt.buf.align.reserve(text.size() + 16);
  std::vector<AddedSplit> raw, norm;
  m.added.split(text, false, &raw);
  NormText seg;
  for (const AddedSplit& r : raw) {
    if (r.end <= r.begin) continue;
    text_from_original(text, r.begin, r.end, &seg);
    if (r.id >= 0) {
      uint32_t b = uint32_t(pt.buf.size());
      pt.buf.append_from(seg, 0, seg.size());
      pt.pieces.push_back(Piece{b, uint32_t(pt.buf.size()), r.id});
      continue;
    }
    if (m.normalizer) m.normalizer->normalize(seg);
    m.added.split(seg.text, true, &norm);
    for (const AddedSplit& n : norm) {
      if (n.end <= n.begin) continue;
      uint32_t b = uint32_t(pt.buf.size());
      pt.buf.append_from(seg, n.begin, n.end);
      pt.pieces.push_back(Piece{b, uint32_t(pt.buf.size()), n.id});
    }
  }

  // 2. Pre-tokenizer pieces.
  if (m.pre_tokenizer) m.pre_tokenizer->pre_tokenize(pt);

  // 3. The model on every piece that is not yet a token.
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<Span> spans;
  std::vector<BpeToken> toks;
  for (const Piece& p : pt.pieces) {
    if (p.added_id >= 0) {
      ids.push_back(p.added_id);
      if (offsets) spans.push_back(Span{pt.buf.align[p.begin].begin, pt.buf.align[p.end - 1].end});
      continue;
    }
    toks.clear();
    m.model->tokenize(std::string_view(pt.buf.text).substr(p.begin, p.end - p.begin), &toks);
    uint32_t pos = p.begin;
    for (const BpeToken& t : toks) {
      ids.push_back(t.id);
      if (offsets) {
        uint32_t e = std::min<uint32_t>(pos + t.len, p.end);
        spans.push_back(e > pos ? Span{pt.buf.align[pos].begin, pt.buf.align[e - 1].end} : Span{0, 0});
        pos = e;
      }
    }
  }

  // 4. Post-processor.
  if (m.post_processor)
    m.post_processor->process(ids, offsets ? &spans : nullptr, text, add_special_tokens,
                              [this](int32_t id) -> const std::string& { return id_to_token(id); });
  if (offsets) {
    offsets->clear();
    offsets->reserve(spans.size());
    for (const Span& s : spans) offsets->emplace_back(s.begin, s.end);
  }
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  const Impl& m = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    STRATA_CHECK(id >= 0 && size_t(id) < m.id_tokens.size(), "token id ", id, " is outside the vocabulary [0, ",
                 m.id_tokens.size(), ")");
    if (skip_special_tokens && m.special[id]) continue;
    tokens.push_back(m.id_tokens[id]);
  }
  if (!m.decoder) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  m.decoder->decode_chain(tokens);
  std::string out;
  for (const auto& t : tokens) out += t;
  return out;
}

int64_t Tokenizer::vocab_size() const { return int64_t(impl_->id_tokens.size()); }

int32_t Tokenizer::token_to_id(std::string_view token) const {
  if (const int32_t* id = impl_->added_ids.find(token)) return *id;
  return impl_->model->token_to_id(token);
}

const std::string& Tokenizer::id_to_token(int32_t id) const {
  STRATA_CHECK(id >= 0 && size_t(id) < impl_->id_tokens.size(), "token id ", id, " is outside the vocabulary [0, ",
               impl_->id_tokens.size(), ")");
  return impl_->id_tokens[id];
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && size_t(id) < impl_->special.size() && impl_->special[id];
}

}  // namespace strata
