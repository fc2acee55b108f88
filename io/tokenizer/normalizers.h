// Normalizers of tokenizer.json ("normalizer"): NFC, NFD, NFKC, NFKD, Lowercase, Strip,
// StripAccents, Prepend, Replace and Sequence. Each rewrites a NormText in place and keeps every
// byte's alignment to the original text the way Hugging Face's NormalizedString does.
#pragma once
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "io/tokenizer/text.h"

namespace strata::tok {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(NormText& t) const = 0;
};

// Builds the normalizer described by `j` (null gives nullptr). Unsupported types throw
// strata::Error naming the type.
std::unique_ptr<Normalizer> normalizer_from_json(const nlohmann::json& j);

}  // namespace strata::tok
