// Post-processor implementations (see post_processor.h).
#include "io/tokenizer/post_processor.h"

#include <algorithm>

#include "io/tokenizer/stage_json.h"
#include "src/core/error.h"

namespace strata::tok {
namespace {

// The single-sequence template: special-token ids before and after sequence A.
class TemplateProcessor final : public PostProcessor {
 public:
  TemplateProcessor(std::vector<int32_t> before, std::vector<int32_t> after)
      : before_(std::move(before)), after_(std::move(after)) {}
  void process(std::vector<int32_t>& ids, std::vector<Span>* spans, std::string_view original, bool add_special_tokens,
               const std::function<const std::string&(int32_t)>&) const override {
    if (!add_special_tokens) return;
    ids.insert(ids.begin(), before_.begin(), before_.end());
    if (spans) spans->insert(spans->begin(), before_.size(), Span{0, 0});
    ids.insert(ids.end(), after_.begin(), after_.end());
    if (spans) spans->insert(spans->end(), after_.size(), Span{0, 0});
  }

 private:
  std::vector<int32_t> before_, after_;
};

// ByteLevel with trim_offsets: offsets lose the leading/trailing spaces ('Ġ') of their token.
class ByteLevelProcessor final : public PostProcessor {
 public:
  ByteLevelProcessor(bool trim_offsets, bool add_prefix_space)
      : trim_(trim_offsets), add_prefix_space_(add_prefix_space) {}
  void process(std::vector<int32_t>& ids, std::vector<Span>* spans, std::string_view original, bool,
               const std::function<const std::string&(int32_t)>& token_text) const override {
    if (!trim_ || !spans) return;
    auto is_space = [](uint32_t cp) { return cp == 0x120 || unicode_is_whitespace(cp); };
    for (size_t i = 0; i < ids.size(); ++i) {
      const std::string& t = token_text(ids[i]);
      std::vector<uint32_t> cps;
      for (size_t p = 0; p < t.size();) {
        size_t len;
        cps.push_back(utf8_decode(t.data(), p, &len));
        p += len;
      }
      size_t lead = 0, trail = 0;
      while (lead < cps.size() && is_space(cps[lead])) ++lead;
      while (trail < cps.size() && is_space(cps[cps.size() - 1 - trail])) ++trail;
      if (lead == 0 && trail == 0) continue;
      // Hugging Face trims in character offsets: step over whole characters of the original.
      Span& s = (*spans)[i];
      if (lead > 0) {
        bool is_first = i == 0 || s.begin == 0;
        if (is_first && add_prefix_space_ && lead == 1) lead = 0;
        for (; lead > 0 && s.begin < s.end; --lead) s.begin += uint32_t(utf8_char_len((unsigned char)original[s.begin]));
        s.begin = std::min(s.begin, s.end);
      }
      if (trail > 0) {
        uint32_t e = s.end;
        size_t k = 0;
        for (; k < trail && e > 0; ++k) {
          --e;
          while (e > 0 && ((unsigned char)original[e] & 0xC0) == 0x80) --e;
        }
        if (k == trail) s.end = std::max(e, s.begin);
      }
    }
  }

 private:
  bool trim_, add_prefix_space_;
};

class SequenceProcessor final : public StageSequence<PostProcessor> {
 public:
  using StageSequence::StageSequence;
  void process(std::vector<int32_t>& ids, std::vector<Span>* spans, std::string_view original, bool add_special_tokens,
               const std::function<const std::string&(int32_t)>& token_text) const override {
    for (const auto& p : parts()) p->process(ids, spans, original, add_special_tokens, token_text);
  }
};

}  // namespace

std::unique_ptr<PostProcessor> post_processor_from_json(const nlohmann::json& j) {
  if (j.is_null()) return nullptr;
  const std::string type = stage_type_from_json(j, "post_processor");
  if (type == "ByteLevel")
    return std::make_unique<ByteLevelProcessor>(j.value("trim_offsets", true), j.value("add_prefix_space", true));
  if (type == "TemplateProcessing") {
    const auto& specials = j.contains("special_tokens") ? j["special_tokens"] : nlohmann::json::object();
    std::vector<int32_t> before, after;
    bool seen_a = false;
    const auto& single = j.at("single");
    STRATA_CHECK(single.is_array(), "tokenizer.json: TemplateProcessing \"single\" must be an array");
    for (const auto& piece : single) {
      if (piece.contains("Sequence")) {
        std::string seq = piece["Sequence"].value("id", std::string("A"));
        STRATA_CHECK(seq == "A", "tokenizer.json: TemplateProcessing single template uses sequence \"", seq,
                     "\"; only A exists for one text");
        seen_a = true;
      } else {
        STRATA_CHECK(piece.contains("SpecialToken"), "tokenizer.json: TemplateProcessing piece is neither "
                                                     "Sequence nor SpecialToken");
        std::string name = piece["SpecialToken"].at("id").get<std::string>();
        STRATA_CHECK(specials.contains(name), "tokenizer.json: TemplateProcessing uses special token \"", name,
                     "\" missing from its special_tokens");
        for (const auto& id : specials[name].at("ids")) (seen_a ? after : before).push_back(id.get<int32_t>());
      }
    }
    return std::make_unique<TemplateProcessor>(std::move(before), std::move(after));
  }
  if (type == "Sequence")
    return stage_sequence_from_json<SequenceProcessor>(j.at("processors"), post_processor_from_json);
  stage_type_unsupported("post_processor", type, "TemplateProcessing, ByteLevel, Sequence");
}

}  // namespace strata::tok
