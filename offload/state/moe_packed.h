// Reading mixture-of-experts checkpoints in the packed 3-D layout transformers 5 keeps in memory
// (and that converted checkpoints hold): per MoE layer "mlp.experts.gate_up_proj" (E, 2I, C), the
// gate's I rows of each expert first, then the up projection's, and "mlp.experts.down_proj"
// (E, C, I), with the router at "mlp.gate.weight" (Mixtral's Hub names say "block_sparse_moe.").
// strata's parameter table keeps the Hub's per-expert names (what it exports); this maps each of
// them to where a packed directory holds it.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace strata {

// Where per-expert tensor `name` (Hub layout, models/moe_layer.h) lives in a packed directory:
// `tensor`'s rows [row0, row0 + rows) of expert `expert` (rows of its last dimension's length);
// an aliased router (Mixtral's gate under "mlp.") is the whole tensor (expert -1).
struct MoePackedSlice {
  std::string tensor;
  int64_t expert = -1, row0 = 0, rows = 0;
};

// nullopt when `name` is not a per-expert or router name, or `dir` holds it as it is.
std::optional<MoePackedSlice> moe_packed_slice(const SafetensorsDir& dir, const std::string& name);

// The names and shapes `dir` must hold for `expected` (a model's Hub names): each per-expert name
// the directory packs replaced by its packed tensor (once, with its shape on disk).
std::vector<ExpectedTensor> moe_packed_expected(const SafetensorsDir& dir, const std::vector<ExpectedTensor>& expected);

// Reads slice s of dir into dst (f32, rows x row length), through `packed` (the packed tensor's
// values in f32, read once per tensor and kept while consecutive slices come from it).
void moe_packed_read(const SafetensorsDir& dir, const MoePackedSlice& s, std::vector<float>& packed,
                     std::string& packed_name, float* dst);

}  // namespace strata
