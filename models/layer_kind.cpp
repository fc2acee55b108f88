// The seam's shared parts: the LoRA targets' names, the decode hook's refusals, the sizes over kinds.
#include "models/layer_kind.h"

#include <algorithm>
#include <cmath>

#include "src/core/error.h"

namespace strata {

const char* layer_linear_name(int target) {
  static const char* const names[kLayerLinears] = {"q_proj",          "k_proj",
                                                   "v_proj",          "o_proj",
                                                   "gate_proj",       "up_proj",
                                                   "down_proj",       "qkv_proj",
                                                   "gate_up_proj",    "mlp.gate.weight",
                                                   "mlp.experts.gate_up_proj", "mlp.experts.down_proj"};
  STRATA_ASSERT(target >= 0 && target < kLayerLinears);
  return names[target];
}

LayerAttention LayerKind::attention(const LayerScratch&) const {
  STRATA_CHECK(false, "a layer of kind ", name(), " has no attention to split a forward around (generation needs one)");
  return {};
}

void LayerKind::forward_qkv(Device&, const float*, const LayerTensors&, const TokenContext&, const LayerScratch& ws,
                            const LayerDims&, Stream) const {
  attention(ws);
}

void LayerKind::forward_from_attention(Device&, float*, const float*, const LayerTensors&, const LayerScratch& ws,
                                       const LayerDims&, Stream) const {
  attention(ws);
}

float LayerKind::attention_scale(const LayerDims& d) const {
  return d.attn_scale > 0 ? d.attn_scale : 1.0f / std::sqrt(float(d.D));
}

int32_t layer_dims_max_pos(const std::vector<int32_t>& pos) {
  return pos.empty() ? -1 : *std::max_element(pos.begin(), pos.end());
}

size_t layer_kinds_bytes(const std::vector<const LayerKind*>& kinds, LayerBuffer what, const LayerDims& d) {
  size_t most = 0;
  for (const LayerKind* k : kinds) most = std::max(most, k->bytes(what, d));
  return most;
}

}  // namespace strata
