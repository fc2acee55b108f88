// What generation reads beside the weights, shared by `strata generate` and GRPO's sampling
// (src/train/grpo_trainer.h): the model's EOS ids (generation_config.json when it names them,
// else config.json's eos_token_id) and generated ids back to text (the tokenizer's decode without
// special tokens, or the UTF-8 bytes).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/hf_config.h"
#include "io/text_encoder.h"

namespace strata {

// Exit 2 naming the file when eos_token_id is neither an integer nor a list of integers; empty
// when neither file names one.
std::vector<int32_t> model_eos_ids(const std::string& model_dir, const ModelConfig& cfg);

// Ids the tokenizer has no token for (a padded vocab_size) are dropped, as Hugging Face's decode
// drops them. Bytes: an id >= 256 (which no text gives) is shown as U+FFFD.
std::string decode_text(const TextEncoder& enc, const std::vector<int32_t>& ids);

}  // namespace strata
