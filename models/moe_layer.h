// The mixture-of-experts layer kind (qwen3_moe, mixtral): the dense layer's attention half
// (models/decoder_layer.h: RMSNorm, attention with Qwen3's q/k norms where the config has them,
// the residual, RMSNorm) and a sparse MoE block in place of the MLP:
//
//   logits = xn2 Wr^T (N,E) ; routing on the host (models/moe_routing.h): top k of softmax(logits)
//   xg = xn2[row_token] (M,C), rows expert by expert ; for each expert x with rows [o0, o1):
//     act = silu(xg Wg_x^T) * (xg Wu_x^T) (rows, I) ; y = act Wd_x^T (rows, C)   (one GEMM each)
//   out = h + sum_j w[t,j] y[token_row[t,j]]                        (device moe_combine_forward)
//
// The backward recomputes the forward from x (the routing again from the recomputed logits: the
// same bits, so the same experts), then: dy, dw (moe_combine_backward), the experts' GEMMs
// backward per expert, d xn2 = the rows scattered back to tokens, the router's gradient through
// the renormalisation and the softmax on the host (plus the load-balancing loss's, when the
// micro-batch carries one: models/moe_aux_loss.h), then the attention half's backward.
//
// Parameters, in the kind's order: the dense attention half's 12 (input norm, q, k, v, o, their
// biases, q/k norms), post_attention_layernorm, the router, then per expert gate, up, down. HF
// names: Qwen3-MoE "mlp.gate.weight", "mlp.experts.{x}.{gate,up,down}_proj.weight"; Mixtral
// "block_sparse_moe.gate.weight", "block_sparse_moe.experts.{x}.{w1,w3,w2}.weight". LoRA: the
// attention projections (LayerTensors::lora's q, k, v, o), and PEFT's target_parameters, the router
// (logits += (xn2 A^T) B'^T, so the routing follows the adapted logits and the gradient reaches A
// and B through the softmax as the router's does) and the experts (expert x's gate and up rows add
// (xg A_x^T) B_x'^T with its fused gate_up B_x's first and last I rows, its down rows
// (act A_x^T) B_x'^T; the adapters of the experts a token skipped see none of its gradient).
//
// Legend: N tokens, C hidden, E experts, k experts per token, M = N*k routed rows, I the
// experts' intermediate size.
#pragma once
#include <functional>
#include <vector>

#include "models/layer_kind.h"

namespace strata {

// The MoE kind for this config's expert sizes (one object per distinct (E, k, I, norm_topk_prob,
// naming), kept for the program's life). config.num_experts must be > 0.
const LayerKind& moe_layer_kind(const ModelConfig& config);

// ---- the generator's routed decode (offload/engine/routed_decode.h) -------------------------
// A decode step reads only the experts its tokens were routed to, so it uploads only those.

// Where a MoE kind's experts sit in its parameter order: expert x's parameters are
// [first + x * per_expert, first + (x + 1) * per_expert) (gate, up, down); the ones before
// `first` (the attention half, the norms, the router) are read by every step.
struct MoeExpertParams {
  size_t first = 0, per_expert = 0;
  int64_t experts = 0;
  size_t router = 0;  // the router's place (E, C)
};
// kind is a MoE kind: its experts' places (into *out). Not one: false.
bool moe_kind_expert_params(const LayerKind& kind, MoeExpertParams* out);

// The experts a step routed its tokens to, ascending; the callee makes their weights current
// where `w` points at them (the compute stream waiting for them) before it returns.
using MoeExpertFetch = std::function<void(const std::vector<int32_t>& experts)>;

// LayerKind::forward_from_attention of a MoE kind, the router first, then fetch(the experts
// that received rows), then the experts' GEMMs: the same ops in the same order, so the same bits,
// as forward_from_attention. Experts no token chose are never read (their weights may be stale).
void moe_forward_from_attention_routed(const LayerKind& kind, Device& dev, float* out, const float* x,
                                       const LayerTensors& w, const LayerScratch& ws, const LayerDims& d, Stream s,
                                       const MoeExpertFetch& fetch);

}  // namespace strata
