// bitsandbytes' NF4 in a Hugging Face model dir (issue 40): what transformers writes when it saves
// a model loaded with load_in_4bit (tools/golden/make_bnb_nf4_dirs.py holds strata to transformers
// 5.24 + bitsandbytes 0.50): each quantized linear as
//   <name>.weight                                       U8   (ceil(n/2), 1)  the codes
//   <name>.weight.absmax                                U8 (double-quantized) or F32, (blocks)
//   <name>.weight.quant_map                             F32  (16)   the NF4 values
//   <name>.weight.nested_absmax, .nested_quant_map      F32  (nested blocks), (256)  double quantization only
//   <name>.weight.quant_state.bitsandbytes__nf4         U8   a JSON string: quant_type, blocksize,
//                                                            dtype, shape (nested_blocksize, nested_dtype,
//                                                            nested_offset: the absmax' mean)
// and config.json's quantization_config (quant_method "bitsandbytes", load_in_4bit,
// bnb_4bit_quant_type "nf4", bnb_4bit_use_double_quant, ...). The rest (embeddings, norms,
// lm_head) is in bf16. strata writes that (strata quantize), reads it into an NF4 store as it is,
// or into a plain store as the dequantized weights; any other quantization is refused by name.
#pragma once
#include <string>

#include "io/hf_config.h"
#include "models/lora_adapter.h"
#include "offload/state/host_store.h"

namespace strata {

// config.json's quantization_config: absent (nf4 false); bitsandbytes' 4-bit NF4 in blocks of 64
// (nf4 true, double_quant as it says); anything else an Error(input) naming its method (exit 2).
struct HfQuantization {
  bool nf4 = false;
  bool double_quant = true;
};
HfQuantization hf_quantization_of(const ModelConfig& config, const std::string& dir);

// The weights of a pre-quantized dir into the store: an NF4 store (ModelSpec::base_quant) takes the
// codes and scales as they are (its double quantization must be the dir's, else Error(input) naming
// lora.double_quant); a plain store the dequantized bf16 weights (an adapter merged in f32 first).
void nf4_hf_load(HostStore& store, const std::string& dir, const HfQuantization& q,
                 const LoraAdapter* adapter = nullptr);

// An NF4 store written as transformers saves a load_in_4bit model: the quantized rows as above,
// the others in bf16, config.json with quantization_config (bnb_4bit_compute_dtype bfloat16).
void nf4_hf_save(const HostStore& store, const std::string& dir);

}  // namespace strata
