// Decoders of tokenizer.json ("decoder"): ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip,
// BPEDecoder and Sequence. Like Hugging Face's decode_chain, each maps a list of token strings to a
// new list; the final text is their concatenation.
#pragma once
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace strata::tok {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

std::unique_ptr<Decoder> decoder_from_json(const nlohmann::json& j);

}  // namespace strata::tok
