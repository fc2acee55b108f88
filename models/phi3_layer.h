// Phi-3's layer kind (phi3: Phi3ForCausalLM in transformers 5.24): the dense Llama-family layer
// with its projections fused as the checkpoint stores them, and LongRoPE. model_spec_build picks it
// for a phi3 config (models/model_spec.h); outside models/ it is reached only as a LayerKind.
//
// Legend: B batch, T tokens per row, N = B*T, C hidden, H heads, Hk kv heads, D head dim, F ffn.
//
//   qkv = rmsnorm(x) Wqkv^T          Wqkv (H*D + 2*Hk*D, C): rows [0, H*D) q, then k, then v
//   q, k = RoPE(q, k) ; a = attention(q, k, v) ; h = x + a Wo^T
//   gu = rmsnorm(h) Wgu^T            Wgu (2F, C): rows [0, F) gate, [F, 2F) up
//   out = h + (silu(gate) * up) Wd^T
//
// The fused matrices are one tensor each (one row of the parameter table, the checkpoint's name),
// and the math is the dense layer's (models/decoder_layer.h) run on row ranges of them: q, k and v
// are views at row offsets of Wqkv (and their gradients of dWqkv), gate and up of Wgu. LoRA puts one
// adapter on each fused linear, as PEFT does (target_modules "qkv_proj", "gate_up_proj"): A (r, C)
// is shared by the parts and B (O, r) split by the same row ranges, so q += (x A^T) B_q^T, ... add up
// to PEFT's (x A^T) B^T; the parts' dA contributions accumulate into the one dA, and LoRA dropout
// draws the same mask for all of them (one tensor number), PEFT's one dropout of x.
//
// LongRoPE (rope_scaling type "longrope"): TokenContext::inv_freq holds the short factors' table
// then the long ones' (model_rope_inv_freq); a micro-batch whose largest position + 1 exceeds
// original_max_position_embeddings (LayerDims::max_pos) uses the long table, as transformers'
// longrope_frequency_update does per forward. cos and sin scaled by attention_factor scale q and k
// by it: model_attention_scale folds its square into the scores' scale.
// Not done: when generation crosses original_max_position_embeddings, transformers'
// Phi3ForCausalLM.prepare_inputs_for_generation drops the KV cache and recomputes the whole sequence
// with the long table; strata's generator keeps the cached keys (short table) and decodes on with
// the long one, so tokens after the crossing can differ. A prompt already past it matches.
#pragma once
#include "models/layer_kind.h"

namespace strata {

// Phi-3's layer for this config: sliding (every layer when config.sliding_window is set), and
// LongRoPE's original_max_position_embeddings (0: no LongRoPE). One object per combination.
const LayerKind& phi3_layer_kind(const ModelConfig& config, bool sliding);

}  // namespace strata
