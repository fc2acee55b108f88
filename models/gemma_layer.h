// The "sandwich" layer kinds: Gemma 3 (gemma3_text) and OLMo 2 (olmo2), whose layers normalise a
// sublayer's output before the residual add. model_spec_build picks them from the config's family
// (models/model_spec.h); outside models/ they are reached only through the LayerKind seam.
//
// Legend: B batch, T tokens per row, N = B*T, C hidden, H heads, Hk kv heads, D head dim, F ffn.
//
// Gemma 3 (transformers' modeling_gemma3.py), every RMSNorm scaling by (1 + w):
//   x0 = x · √C (layer 0 only: the embedding scale, rounded to the weights' dtype)
//   q, k, v = norm_in(x0) Wq^T, Wk^T, Wv^T ; q, k = per-head norms (D) ; RoPE
//     (the sliding layers: the local base's table, TokenContext::inv_freq + D/2)
//   a = attention(q, k, v; scale query_pre_attn_scalar^-1/2; sliding layers: the window)
//   h = x0 + norm_post_attn(a Wo^T)
//   out = h + norm_post_ff(down(gelu_tanh(norm_pre_ff(h) Wg^T) * norm_pre_ff(h) Wu^T))
// OLMo 2 (modeling_olmo2.py), plain RMSNorms, no norm before either sublayer:
//   q, k, v = x Wq^T, Wk^T, Wv^T ; q, k = norms over the whole projection (H*D, Hk*D) ; RoPE
//   h = x + norm_post_attn(attention(q, k, v) Wo^T)
//   out = h + norm_post_ff(down(silu(h Wg^T) * h Wu^T))
// The (1 + w) weights are made on the device at each forward and backward (Device::affine);
// d(1 + w)/dw = 1, so the norms' backward accumulates w's gradient directly.
#pragma once
#include "models/layer_kind.h"

namespace strata {

// Gemma 3's layer: sliding (a local layer: the window and the local RoPE table), first (layer 0:
// it scales the embedding by √C). One object per combination, shared by every model.
const LayerKind& gemma_layer_kind(bool sliding, bool first);
// OLMo 2's layer.
const LayerKind& olmo2_layer_kind();

// Gemma 3's embedding scale: √C as transformers keeps it (an f32 tensor), rounded to the
// embedding's dtype (bf16 weights: a bf16 scale) as Gemma3TextScaledWordEmbedding does.
float gemma_embed_scale(int64_t hidden, DType embed_dtype);

}  // namespace strata
