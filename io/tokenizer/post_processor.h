// Post-processors of tokenizer.json ("post_processor"): TemplateProcessing (BOS/EOS around a single
// sequence when special tokens are requested), ByteLevel (trims spaces out of offsets) and Sequence.
// RobertaProcessing / BertProcessing are rejected as unsupported.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "io/tokenizer/text.h"

namespace strata::tok {

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  // ids and (when not null) their byte spans in `original`, same length, are rewritten in place.
  // token_text(id) returns the token's string.
  virtual void process(std::vector<int32_t>& ids, std::vector<Span>* spans, std::string_view original,
                       bool add_special_tokens,
                       const std::function<const std::string&(int32_t)>& token_text) const = 0;
};

std::unique_ptr<PostProcessor> post_processor_from_json(const nlohmann::json& j);

}  // namespace strata::tok
