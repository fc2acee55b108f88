// The NF4 base of a QLoRA run (issue 40, DESIGN §11 "Quantized base"; lora.base_dtype = "nf4"):
// the frozen decoder layers' linear weights live in the host store's working arena as
// bitsandbytes' NF4 state (kernels/cpu/nf4.h), cross the link as those bytes and are dequantized
// to bf16 on the device into the layer's slot, where the layer's forward and backward read them
// as they read a bf16 base. Embeddings, norms, biases, lm_head
// and mixture-of-experts layers' experts and routers stay in the working dtype (what bitsandbytes does).
//
// A packed row (u8 in the working table, HostStore::layout) holds, each part from a 4-byte
// boundary:
//   codes    ceil(n/2) bytes, two 4-bit codes each (the first element in the high nibble)
//   double quantization (BaseQuant::double_quant):
//     qabsmax  ceil(n/64) bytes: the 8-bit absmax
//     absmax2  ceil(n/64/256) f32: the nested absmax
//     offset   one f32: the absmax' mean
//   else
//     absmax   ceil(n/64) f32
// A layer's device slot is [decoded: the layer in its device layout | packed: the layer's host
// block], the packed part at layer_slot_packed_at (the upload lands there; the dequantization
// writes the decoded part).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "models/model_spec.h"
#include "offload/state/store_layout.h"
#include "src/device/device.h"

namespace strata {

class HostStore;

// Turns a spec's base into NF4 (spec.base_quant): its matrices bf16 (what a recipe must ask for:
// src/recipe/recipe.cpp checks model.dtype) or f32 (the same dequantized bf16 weights widened:
// `strata grad --dtype f32`, the exact check against fp64 goldens); a bad spec is an Error(input)
// naming the key to change. Every layer kind takes it: what is quantized is what bitsandbytes
// quantizes (nf4_packed_rows).
void nf4_base_enable(ModelSpec& spec, bool double_quant);

// Per row of spec.params: stored packed (spec.base_quant.nf4 and the row is one of a decoder
// layer's nn.Linear modules in transformers: its kind's LoRA-targetable linears, Phi-3's fused ones
// included; a mixture-of-experts layer's experts and router stay in the working dtype, as
// transformers + bitsandbytes leave them).
std::vector<bool> nf4_packed_rows(const ModelSpec& spec);

// The bytes one decoding of decoder layer `layer` reads and writes on the device: each packed
// row's packed bytes and its weights in spec.matrix_dtype (the plan prices it as memory-bound).
size_t nf4_decode_bytes(const ModelSpec& spec, size_t layer);

// Byte offsets of a packed row's parts (the header's layout) for n weights.
struct Nf4RowLayout {
  int64_t n = 0;
  bool double_quant = true;
  size_t qabsmax = 0, absmax = 0, offset = 0, bytes = 0;  // codes at 0; qabsmax and offset only when double_quant
  static Nf4RowLayout of(int64_t n, bool double_quant);
};

// values (n, f32) rounded to bf16 (what bitsandbytes quantizes: the model loaded in bf16), then
// quantized into dst (Nf4RowLayout::of(n, q.double_quant).bytes) bit for bit as bitsandbytes.
void nf4_pack_row(char* dst, const float* values, int64_t n, const BaseQuant& q);
// values (n) = the row's dequantized bf16 weights, widened to f32 (exact).
void nf4_unpack_row(float* values, const char* src, int64_t n, bool double_quant);

// A layer slot's parts (the header): decoded (aligned) then the packed block; packed 0 when the
// layout is not packed (the slot is the block itself).
struct LayerSlotBytes {
  size_t decoded = 0, packed = 0;
  size_t total() const { return decoded + packed; }
};
// What one weight slot takes to hold any layer of the layout.
LayerSlotBytes layer_slot_bytes(const HostStoreLayout& layout, size_t layers);
// The same for layer `layer` alone (resident slots).
LayerSlotBytes layer_slot_bytes_of(const HostStoreLayout& layout, size_t layer);

// Enqueues on `s` the decoding of `layer`'s packed block (packed: its device copy, as uploaded)
// into decoded (the device layout): each packed row dequantized, every other row copied. The
// rows' offsets (f32 means) are read from the store's host copy.
void nf4_decode_layer(Device& dev, char* decoded, const char* packed, const HostStore& store, size_t layer,
                      Stream s);
// The same for the layer's rows [first_row, end_row) alone (the routed decode: the shared part
// before the experts).
void nf4_decode_rows(Device& dev, char* decoded, const char* packed, const HostStore& store, size_t layer,
                     size_t end_row, Stream s);

}  // namespace strata
