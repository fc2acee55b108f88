// One Llama-family decoder layer on a Device: forward, and the hand-written backward that
// recomputes from the layer input or reads the activations its forward kept (no autograd). Shared by llama, mistral, qwen2 (q/k/v bias)
// and qwen3 (per-head q_norm/k_norm, head_dim independent of hidden/heads). The math of the
// dense layer kind (models/dense_layer.h); code outside models/ reaches it through the
// LayerKind seam (models/layer_kind.h), not through these structs.
//
// Legend: B batch, T tokens per row, N = B*T, C hidden, H heads, Hk kv heads, D head dim,
// F ffn. All buffers are device pointers, row-major.
//
//   xn1 = rmsnorm(x) ; q,k,v = xn1 Wq^T (+bq), ... ; [q,k = per-head rmsnorm] ; rope(q,k)
//   a = attention(q,k,v) ; h = x + a Wo^T (+bo)
//   xn2 = rmsnorm(h) ; out = h + (silu(xn2 Wg^T) * xn2 Wu^T) Wd^T
//
// LoRA (offload/state/lora.h): a linear with an adapter adds (x A^T) B'^T to its output, where A is
// (r, I) and B' = (alpha / r) B is (O, r), both f32; its backward adds (dy B') A into dx and
// accumulates dA += (dy B')^T x, dB' += dy^T (x A^T). With LoRA dropout (PEFT's lora_dropout) the
// adapter path reads x' = mask ⊙ x / (1 − p) instead of x (kernels/common/dropout_mask.h: the mask
// is a function of the adapter's seed, its tensor number and the element, so backward draws it
// again): y += (x' A^T) B'^T; dx += mask ⊙ ((dy B') A) / (1 − p); dA += (dy B')^T x'. A layer whose base weights are frozen has
// null base gradients (LayerGrads): no dW is computed; the norm weights' gradients still need
// somewhere to go (the kernels add into them) and are pointed at scratch.
#pragma once
#include <cstdint>

#include "models/layer_kind.h"

namespace strata {

// Weights of one layer on the device. Matrices are `wt`; vectors f32; absent ones null.
struct LayerWeights {
  const void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  const void *gate = nullptr, *up = nullptr, *down = nullptr;
  const float *input_norm = nullptr, *post_norm = nullptr, *q_norm = nullptr, *k_norm = nullptr;
  const float *q_bias = nullptr, *k_bias = nullptr, *v_bias = nullptr, *o_bias = nullptr;
  LoraLinear lora[kLayerLinears];  // q, k, v, o, gate, up, down
};

// Gradients of one layer, f32, accumulated (+=); null where the weight is absent.
struct LayerGrads {
  float *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  float *gate = nullptr, *up = nullptr, *down = nullptr;
  float *input_norm = nullptr, *post_norm = nullptr, *q_norm = nullptr, *k_norm = nullptr;
  float *q_bias = nullptr, *k_bias = nullptr, *v_bias = nullptr, *o_bias = nullptr;
  LoraLinearGrads lora[kLayerLinears];
};

// The activation workspace of one layer: saved by forward, read by backward, reused by every
// layer in turn. Sized by layer_workspace_bytes; carved from one device allocation.
struct LayerWorkspace {
  float *xn1, *rstd1;          // (N, C), (N)
  float *q_raw, *k_raw;        // (N, H*D), (N, Hk*D) before per-head norm (qk_norm only)
  float *rstd_q, *rstd_k;      // (N*H), (N*Hk)
  float *q, *k, *v;            // (N, H*D), (N, Hk*D), (N, Hk*D) as attention sees them
  float *attn, *lse;           // (N, H*D), (N, H)
  float *h, *xn2, *rstd2;      // (N, C), (N, C), (N)
  float *gate, *up, *act;      // (N, F) each
  // backward scratch
  float *dh, *dxn;             // (N, C)
  float *dattn, *dq, *dk, *dv; // (N, H*D), (N, H*D), (N, Hk*D), (N, Hk*D)
  float *dact, *dgate, *dup;   // (N, F)
  float *dk_raw;               // (N, Hk*D) gradient before the per-head k norm (qk_norm only)
  bf16 *cast_a, *cast_b;       // (N, max(C, H*D, F)) bf16 copies of matmul inputs (bf16 mode)
  float *lora_u, *lora_t;      // (N, r) x A^T and dy B' (lora_r > 0; else null)
  float *lora_x;               // (N, max(C, H*D, F)) the dropped adapter input, then (dy B') A
                               // (lora_dropout; else null)
};

size_t layer_workspace_bytes(const LayerDims& d);
LayerWorkspace layer_workspace_carve(const LayerDims& d, void* base);
// The forward's part alone (backward scratch null): enough for layer_forward, not for
// layer_backward. The zeroth-order engine (offload/engine/engine_zo.h) runs forwards only.
size_t layer_forward_workspace_bytes(const LayerDims& d);
LayerWorkspace layer_forward_workspace_carve(const LayerDims& d, void* base);

// out (N,C) = layer(x (N,C)); fills the forward part of ws. out must not alias x.
void layer_forward(Device& dev, float* out, const float* x, const LayerWeights& w,
                   const TokenContext& ctx, LayerWorkspace& ws, const LayerDims& d, Stream s);

// layer_forward in two halves around the attention, for a caller with its own attention (the
// generator's decode step attends over a KV cache): layer_forward_qkv fills ws.xn1 .. ws.v (q
// and k after the per-head norms and RoPE); the caller writes ws.attn (N, H*D); then
// layer_forward_from_attention computes out (N,C) from it, as layer_forward does.
void layer_forward_qkv(Device& dev, const float* x, const LayerWeights& w, const TokenContext& ctx,
                       LayerWorkspace& ws, const LayerDims& d, Stream s);
void layer_forward_from_attention(Device& dev, float* out, const float* x, const LayerWeights& w,
                                  LayerWorkspace& ws, const LayerDims& d, Stream s);

// dx (N,C) = d layer / d x applied to dout (N,C); grads accumulated. Recomputes the forward
// from x first. dx must not alias dout or x.
void layer_backward(Device& dev, float* dx, LayerGrads& g, const float* dout, const float* x,
                    const LayerWeights& w, const TokenContext& ctx, LayerWorkspace& ws,
                    const LayerDims& d, Stream s);
// layer_backward without the recompute: ws's activations (xn1 .. act) are the ones layer_forward
// wrote for this x and these weights. The recompute is deterministic, so both give the same bits.
void layer_backward_saved(Device& dev, float* dx, LayerGrads& g, const float* dout, const float* x,
                          const LayerWeights& w, const TokenContext& ctx, LayerWorkspace& ws,
                          const LayerDims& d, Stream s);

// The linears every kind with these projections shares (models/gemma_layer.cpp too).
// y (N,O) = x (N,I) W^T (+ b) (+ the adapter's (x' A^T) B'^T, x' = x or its dropout into
// lora_x); W (O,I) is d.wt, in bf16 mode the matmul reads xb (x's bf16 copy); lora_u (N,r).
void linear_forward(Device& dev, float* y, const float* x, const bf16* xb, const void* w, const float* b,
                    const LoraLinear& ad, float* lora_u, float* lora_x, int64_t n, int64_t o, int64_t i,
                    const LayerDims& d, Stream s);
// dx (N,I) = dy W (written, or added when accumulate); dW (O,I) += dy^T x unless dw is null; in
// bf16 mode from xb and dy's bf16 copy (dyb, or cast here into ws.cast_a); db += sum dy; the
// adapter's gradients through ws.lora_t, lora_u, lora_x.
void linear_backward(Device& dev, float* dx, float* dw, float* db, const LoraLinearGrads& gad, const float* dy,
                     const float* x, const bf16* xb, const void* w, const LoraLinear& ad, LayerWorkspace& ws,
                     int64_t n, int64_t o, int64_t i, bool accumulate, const LayerDims& d, Stream s,
                     const bf16* dyb = nullptr);
// The attention half alone, for kinds that keep it and replace the MLP (models/moe_layer.h):
// forward fills ws (xn1 .. xn2, rstd2): h = x + attention, xn2 = rmsnorm(h), and in bf16 mode
// xn2's bf16 copy in ws.cast_a. The backward takes ws.dxn = d loss / d xn2 from the caller's MLP
// and dout = d loss / d out (the residual path out = h + mlp(xn2)) and finishes dx (N,C) and the
// attention's gradients; ws holds the forward's activations.
void layer_attention_block_forward(Device& dev, const float* x, const LayerWeights& w, const TokenContext& ctx,
                                   LayerWorkspace& ws, const LayerDims& d, Stream s);
// Its second half, from ws.attn (a decode step's own attention): ws.h, ws.xn2 (and cast_a).
void layer_attention_out_forward(Device& dev, const float* x, const LayerWeights& w, LayerWorkspace& ws,
                                 const LayerDims& d, Stream s);
void layer_attention_block_backward(Device& dev, float* dx, LayerGrads& g, const float* dout, const float* x,
                                    const LayerWeights& w, const TokenContext& ctx, LayerWorkspace& ws,
                                    const LayerDims& d, Stream s);

// Keeping a layer's activations from its forward to its backward (offload.recompute): the bytes
// of one layer's xn1 .. act, and a workspace whose activations live in `base` (that many bytes,
// carved for the same dims) while its scratch (casts, adapter and backward buffers) stays ws's.
size_t layer_activation_bytes(const LayerDims& d);
LayerWorkspace layer_workspace_with_activations(const LayerWorkspace& ws, const LayerDims& d, void* base);

}  // namespace strata
