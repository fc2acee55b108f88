#include "models/decoder_layer.h"

#include <algorithm>
#include <cmath>

#include "src/core/align.h"
#include "src/core/error.h"

namespace strata {
namespace {

enum Linear { kQ, kK, kV, kO, kGate, kUp, kDown };

// The adapter's input: x, or with dropout x' = mask ⊙ x / (1 − p) written into lora_x (N,I).
const float* lora_input(Device& dev, const float* x, const LoraLinear& ad, float* lora_x, int64_t n, int64_t i,
                        Stream s) {
  if (ad.dropout == 0.0) return x;
  STRATA_ASSERT(lora_x != nullptr, "LoRA dropout without its workspace (LayerDims::lora_dropout)");
  dev.dropout_apply(lora_x, x, ad.dropout_seed, ad.dropout_tensor, ad.dropout, n * i, false, s);
  return lora_x;
}

// x's bf16 copy in `cast` for the matmuls that read it (bf16 mode: one cast however many
// projections share x); null in f32 mode, where the matmuls read x itself.
const bf16* cast_input(Device& dev, bf16* cast, const float* x, int64_t count, const LayerDims& d, Stream s) {
  if (d.wt == DType::f32) return nullptr;
  dev.cast_f32_to_bf16(cast, x, count, s);
  return cast;
}

// RMSNorm of x's N rows into xn (rstd saved), and in bf16 mode xn's bf16 copy into `cast` in
// the same pass, returned as cast_input returns it.
const bf16* norm_input(Device& dev, float* xn, bf16* cast, float* rstd, const float* x, const float* weight,
                       const LayerDims& d, Stream s) {
  if (d.wt == DType::f32) {
    dev.rmsnorm_forward(xn, rstd, x, weight, d.N(), d.C, d.eps, s);
    return nullptr;
  }
  dev.rmsnorm_forward_bf16(xn, cast, rstd, x, weight, d.N(), d.C, d.eps, s);
  return cast;
}

}  // namespace

// y (N,O) = x (N,I) W^T (+ b) (+ (x' A^T) B'^T with an adapter, x' = x or its dropout). W (O,I)
// is d.wt; in bf16 mode the matmul reads xb, x's bf16 copy (cast_input); the adapter path is f32.
void linear_forward(Device& dev, float* y, const float* x, const bf16* xb, const void* w, const float* b,
                    const LoraLinear& ad, float* lora_u, float* lora_x,
                    int64_t n, int64_t o, int64_t i, const LayerDims& d, Stream s) {
  if (d.wt == DType::f32)
    dev.matmul(y, x, w, DType::f32, n, o, i, false, true, 0.f, s);
  else
    dev.matmul(y, xb, w, DType::bf16, n, o, i, false, true, 0.f, s);
  if (ad.a) {
    const float* xa = lora_input(dev, x, ad, lora_x, n, i, s);
    dev.matmul(lora_u, xa, ad.a, DType::f32, n, d.lora_r, i, false, true, 0.f, s);  // u (N,r) = x' A^T
    dev.matmul(y, lora_u, ad.b, DType::f32, n, o, d.lora_r, false, true, 1.f, s);   // y += u B'^T
  }
  if (b) dev.bias_forward(y, b, n, o, s);
}

// dx (N,I) = dy W (written, or added when accumulate); dW (O,I) += dy^T x unless dw is null
// (frozen), in bf16 mode from xb (x's bf16 copy, cast_input into ws.cast_b) and dy's bf16 copy:
// dyb when given (made with dy, as swiglu_backward_bf16 does; then there is no bias and no
// adapter, the readers of dy itself), else cast here into ws.cast_a; db (O) += sum dy.
// With an adapter: t = dy B' (N,r); dx += t A; dA += t^T x; dB' += dy^T (x A^T); with dropout
// x' (the forward's mask, drawn again) replaces x there and dx += mask ⊙ (t A) / (1 − p).
void linear_backward(Device& dev, float* dx, float* dw, float* db, const LoraLinearGrads& gad, const float* dy,
                     const float* x, const bf16* xb, const void* w, const LoraLinear& ad, LayerWorkspace& ws,
                     int64_t n, int64_t o,
                     int64_t i, bool accumulate, const LayerDims& d, Stream s, const bf16* dyb) {
  const float beta = accumulate ? 1.f : 0.f;
  STRATA_ASSERT(!dyb || (d.wt == DType::bf16 && !db && !ad.a), "linear_backward: a bf16 dy where dy itself is read");
  if (d.wt == DType::f32) {
    dev.matmul(dx, dy, w, DType::f32, n, i, o, false, false, beta, s);
    if (dw) dev.matmul(dw, dy, x, DType::f32, o, i, n, true, false, 1.f, s);
  } else {
    if (!dyb) dev.cast_f32_to_bf16(ws.cast_a, dy, n * o, s);
    const bf16* dy_bf16 = dyb ? dyb : ws.cast_a;
    dev.matmul(dx, dy_bf16, w, DType::bf16, n, i, o, false, false, beta, s);
    if (dw) dev.matmul(dw, dy_bf16, xb, DType::bf16, o, i, n, true, false, 1.f, s);
  }
  if (db) dev.bias_backward(db, dy, n, o, s);
  if (ad.a) {
    const int64_t r = d.lora_r;
    const float* xa = lora_input(dev, x, ad, ws.lora_x, n, i, s);                 // x' (N,I)
    dev.matmul(ws.lora_t, dy, ad.b, DType::f32, n, r, o, false, false, 0.f, s);   // t (N,r) = dy B'
    if (ad.dropout == 0.0) {
      dev.matmul(dx, ws.lora_t, ad.a, DType::f32, n, i, r, false, false, 1.f, s);  // dx += t A
    }
    dev.matmul(gad.a, ws.lora_t, xa, DType::f32, r, i, n, true, false, 1.f, s);   // dA += t^T x'
    dev.matmul(ws.lora_u, xa, ad.a, DType::f32, n, r, i, false, true, 0.f, s);    // u = x' A^T
    dev.matmul(gad.b, dy, ws.lora_u, DType::f32, o, r, n, true, false, 1.f, s);   // dB' += dy^T u
    if (ad.dropout != 0.0) {  // x' is read: lora_x takes t A, and dx += its dropout
      dev.matmul(ws.lora_x, ws.lora_t, ad.a, DType::f32, n, i, r, false, false, 0.f, s);
      dev.dropout_apply(dx, ws.lora_x, ad.dropout_seed, ad.dropout_tensor, ad.dropout, n * i, true, s);
    }
  }
}

namespace {

// From d act (ws.dact) through SwiGLU and the gate and up projections to d xn2 (ws.dxn). In bf16
// mode without adapters on gate and up, SwiGLU's backward writes its gradients as the bf16
// operands of their matmuls directly (into ws.dgate and ws.dup's memory: no f32 copy is read).
void mlp_gate_up_backward(Device& dev, LayerGrads& g, const LayerWeights& w, LayerWorkspace& ws, const LayerDims& d,
                          Stream s) {
  const int64_t N = d.N(), C = d.C, F = d.F;
  const bool fused = d.wt == DType::bf16 && !w.lora[kGate].a && !w.lora[kUp].a;
  bf16* dgate_b = fused ? reinterpret_cast<bf16*>(ws.dgate) : nullptr;
  bf16* dup_b = fused ? reinterpret_cast<bf16*>(ws.dup) : nullptr;
  if (fused)
    dev.swiglu_backward_bf16(dgate_b, dup_b, ws.dact, ws.gate, ws.up, N * F, s);
  else
    dev.swiglu_backward(ws.dgate, ws.dup, ws.dact, ws.gate, ws.up, N * F, s);
  const bf16* xn2_b = cast_input(dev, ws.cast_b, ws.xn2, N * C, d, s);  // one cast for gate and up
  linear_backward(dev, ws.dxn, g.gate, nullptr, g.lora[kGate], ws.dgate, ws.xn2, xn2_b, w.gate, w.lora[kGate], ws, N,
                  F, C, false, d, s, dgate_b);
  linear_backward(dev, ws.dxn, g.up, nullptr, g.lora[kUp], ws.dup, ws.xn2, xn2_b, w.up, w.lora[kUp], ws, N, F, C, true,
                  d, s, dup_b);
}

// From the attention output to the MLP activation: fills ws (h .. act). With act_b (bf16 mode,
// the forward) SwiGLU also writes act's bf16 copy there, for the down projection; the backward's
// recompute passes null (its down projection reads dy).
// From the attention output to the MLP input: ws.h = x + attn Wo^T (+bo), ws.xn2 = rmsnorm(h), and
// in bf16 mode xn2's bf16 copy in ws.cast_a (returned; null in f32 mode).
const bf16* attention_out_to_xn2(Device& dev, const float* x, const LayerWeights& w, LayerWorkspace& ws,
                                 const LayerDims& d, Stream s) {
  const int64_t N = d.N(), C = d.C, H = d.H, D = d.D;
  const bf16* attn_b = cast_input(dev, ws.cast_a, ws.attn, N * H * D, d, s);
  linear_forward(dev, ws.h, ws.attn, attn_b, w.o, w.o_bias, w.lora[kO], ws.lora_u, ws.lora_x, N, C, H * D, d, s);
  dev.add_inplace(ws.h, x, N * C, s);  // residual
  return norm_input(dev, ws.xn2, ws.cast_a, ws.rstd2, ws.h, w.post_norm, d, s);
}

void attention_out_to_act(Device& dev, const float* x, const LayerWeights& w, LayerWorkspace& ws,
                          const LayerDims& d, Stream s, bf16* act_b = nullptr) {
  const int64_t N = d.N(), C = d.C, F = d.F;
  // one bf16 copy of xn2 for gate and up
  const bf16* xn2_b = attention_out_to_xn2(dev, x, w, ws, d, s);
  linear_forward(dev, ws.gate, ws.xn2, xn2_b, w.gate, nullptr, w.lora[kGate], ws.lora_u, ws.lora_x, N, F, C, d, s);
  linear_forward(dev, ws.up, ws.xn2, xn2_b, w.up, nullptr, w.lora[kUp], ws.lora_u, ws.lora_x, N, F, C, d, s);
  if (act_b && d.wt == DType::bf16)
    dev.swiglu_forward_bf16(ws.act, act_b, ws.gate, ws.up, N * F, s);
  else
    dev.swiglu_forward(ws.act, ws.gate, ws.up, N * F, s);
}

// Everything up to the attention output: fills ws (xn1 .. attn, lse).
void forward_to_attention(Device& dev, const float* x, const LayerWeights& w, const TokenContext& ctx,
                          LayerWorkspace& ws, const LayerDims& d, Stream s) {
  layer_forward_qkv(dev, x, w, ctx, ws, d, s);
  const float scale = d.attn_scale > 0 ? d.attn_scale : 1.0f / std::sqrt(float(d.D));
  dev.attention_forward(ws.attn, ws.lse, ws.q, ws.k, ws.v, ctx.doc_start, d.B, d.T, d.H, d.Hk, d.D, scale, d.wt, s,
                        d.window);
}

struct Carver {
  char* base;
  size_t offset = 0;
  template <class T>
  T* take(int64_t count) {
    T* p = base ? reinterpret_cast<T*>(base + offset) : nullptr;
    offset += align_up(size_t(count) * sizeof(T));
    return p;
  }
};

// The forward's activations (xn1 .. act), what layer_backward_saved reads.
void carve_activations(const LayerDims& d, Carver& c, LayerWorkspace& ws) {
  const int64_t N = d.N(), C = d.C, H = d.H, Hk = d.Hk, D = d.D, F = d.F;
  ws.xn1 = c.take<float>(N * C);
  ws.rstd1 = c.take<float>(N);
  ws.q_raw = c.take<float>(N * H * D);
  ws.k_raw = c.take<float>(N * Hk * D);
  ws.rstd_q = c.take<float>(N * H);
  ws.rstd_k = c.take<float>(N * Hk);
  ws.q = c.take<float>(N * H * D);
  ws.k = c.take<float>(N * Hk * D);
  ws.v = c.take<float>(N * Hk * D);
  ws.attn = c.take<float>(N * H * D);
  ws.lse = c.take<float>(N * H);
  ws.h = c.take<float>(N * C);
  ws.xn2 = c.take<float>(N * C);
  ws.rstd2 = c.take<float>(N);
  ws.gate = c.take<float>(N * F);
  ws.up = c.take<float>(N * F);
  ws.act = c.take<float>(N * F);
}

// with_backward false: the forward's buffers and cast_a only (layer_forward reads nothing else);
// the backward scratch and cast_b stay null.
LayerWorkspace carve(const LayerDims& d, Carver& c, bool with_backward = true) {
  const int64_t N = d.N(), C = d.C, H = d.H, Hk = d.Hk, D = d.D, F = d.F;
  const int64_t widest = std::max({C, H * D, F});
  LayerWorkspace ws{};
  carve_activations(d, c, ws);
  ws.lora_u = d.lora_r > 0 ? c.take<float>(N * d.lora_r) : nullptr;
  ws.lora_t = d.lora_r > 0 && with_backward ? c.take<float>(N * d.lora_r) : nullptr;
  ws.lora_x = d.lora_r > 0 && d.lora_dropout ? c.take<float>(N * widest) : nullptr;
  if (!with_backward) {
    ws.cast_a = c.take<bf16>(N * widest);
    ws.cast_b = nullptr;
    return ws;
  }
  ws.dh = c.take<float>(N * C);
  ws.dxn = c.take<float>(N * C);
  ws.dattn = c.take<float>(N * H * D);
  ws.dq = c.take<float>(N * H * D);
  ws.dk = c.take<float>(N * Hk * D);
  ws.dv = c.take<float>(N * Hk * D);
  ws.dact = c.take<float>(N * F);
  ws.dgate = c.take<float>(N * F);
  ws.dup = c.take<float>(N * F);
  ws.dk_raw = c.take<float>(N * Hk * D);
  ws.cast_a = c.take<bf16>(N * widest);
  ws.cast_b = c.take<bf16>(N * widest);
  return ws;
}

}  // namespace

size_t layer_workspace_bytes(const LayerDims& d) {
  Carver c{nullptr};
  carve(d, c);
  return c.offset;
}

LayerWorkspace layer_workspace_carve(const LayerDims& d, void* base) {
  STRATA_ASSERT(base != nullptr);
  Carver c{static_cast<char*>(base)};
  return carve(d, c);
}

size_t layer_forward_workspace_bytes(const LayerDims& d) {
  Carver c{nullptr};
  carve(d, c, false);
  return c.offset;
}

LayerWorkspace layer_forward_workspace_carve(const LayerDims& d, void* base) {
  STRATA_ASSERT(base != nullptr);
  Carver c{static_cast<char*>(base)};
  return carve(d, c, false);
}

size_t layer_activation_bytes(const LayerDims& d) {
  Carver c{nullptr};
  LayerWorkspace ws{};
  carve_activations(d, c, ws);
  return c.offset;
}

LayerWorkspace layer_workspace_with_activations(const LayerWorkspace& ws, const LayerDims& d, void* base) {
  STRATA_ASSERT(base != nullptr);
  Carver c{static_cast<char*>(base)};
  LayerWorkspace out = ws;
  carve_activations(d, c, out);
  return out;
}

void layer_forward_qkv(Device& dev, const float* x, const LayerWeights& w, const TokenContext& ctx,
                       LayerWorkspace& ws, const LayerDims& d, Stream s) {
  const int64_t N = d.N(), C = d.C, H = d.H, Hk = d.Hk, D = d.D;
  const bool qk_norm = w.q_norm != nullptr;
  // one bf16 copy of xn1 for q, k and v
  const bf16* xn1_b = norm_input(dev, ws.xn1, ws.cast_a, ws.rstd1, x, w.input_norm, d, s);
  linear_forward(dev, qk_norm ? ws.q_raw : ws.q, ws.xn1, xn1_b, w.q, w.q_bias, w.lora[kQ], ws.lora_u, ws.lora_x, N,
                 H * D, C, d, s);
  linear_forward(dev, qk_norm ? ws.k_raw : ws.k, ws.xn1, xn1_b, w.k, w.k_bias, w.lora[kK], ws.lora_u, ws.lora_x, N,
                 Hk * D, C, d, s);
  linear_forward(dev, ws.v, ws.xn1, xn1_b, w.v, w.v_bias, w.lora[kV], ws.lora_u, ws.lora_x, N, Hk * D, C, d, s);
  if (qk_norm) {
    dev.rmsnorm_forward(ws.q, ws.rstd_q, ws.q_raw, w.q_norm, N * H, D, d.eps, s);
    dev.rmsnorm_forward(ws.k, ws.rstd_k, ws.k_raw, w.k_norm, N * Hk, D, d.eps, s);
  }
  dev.rope_forward(ws.q, ws.q, ctx.pos, ctx.inv_freq, N, H, D, d.rotary(), s);
  dev.rope_forward(ws.k, ws.k, ctx.pos, ctx.inv_freq, N, Hk, D, d.rotary(), s);
}

void layer_forward(Device& dev, float* out, const float* x, const LayerWeights& w,
                   const TokenContext& ctx, LayerWorkspace& ws, const LayerDims& d, Stream s) {
  STRATA_ASSERT(out != x, "layer_forward: out aliases x");
  forward_to_attention(dev, x, w, ctx, ws, d, s);
  layer_forward_from_attention(dev, out, x, w, ws, d, s);
}

void layer_forward_from_attention(Device& dev, float* out, const float* x, const LayerWeights& w,
                                  LayerWorkspace& ws, const LayerDims& d, Stream s) {
  STRATA_ASSERT(out != x, "layer_forward_from_attention: out aliases x");
  // SwiGLU writes act's bf16 copy into cast_a once gate and up have read xn2's from it
  attention_out_to_act(dev, x, w, ws, d, s, ws.cast_a);
  const int64_t N = d.N();
  const bf16* act_b = d.wt == DType::bf16 ? ws.cast_a : nullptr;
  linear_forward(dev, out, ws.act, act_b, w.down, nullptr, w.lora[kDown], ws.lora_u, ws.lora_x, N, d.C, d.F, d, s);
  dev.add_inplace(out, ws.h, N * d.C, s);  // residual
}

void layer_backward(Device& dev, float* dx, LayerGrads& g, const float* dout, const float* x,
                    const LayerWeights& w, const TokenContext& ctx, LayerWorkspace& ws,
                    const LayerDims& d, Stream s) {
  forward_to_attention(dev, x, w, ctx, ws, d, s);  // recompute from the checkpoint
  attention_out_to_act(dev, x, w, ws, d, s);
  layer_backward_saved(dev, dx, g, dout, x, w, ctx, ws, d, s);
}

void layer_backward_saved(Device& dev, float* dx, LayerGrads& g, const float* dout, const float* x,
                          const LayerWeights& w, const TokenContext& ctx, LayerWorkspace& ws,
                          const LayerDims& d, Stream s) {
  STRATA_ASSERT(dx != dout && dx != x, "layer_backward: dx aliases an input");
  const int64_t N = d.N(), C = d.C, F = d.F;

  // MLP: out = h + act Wd^T
  const bf16* act_b = cast_input(dev, ws.cast_b, ws.act, N * F, d, s);
  linear_backward(dev, ws.dact, g.down, nullptr, g.lora[kDown], dout, ws.act, act_b, w.down, w.lora[kDown], ws, N, C,
                  F, false, d, s);
  mlp_gate_up_backward(dev, g, w, ws, d, s);
  layer_attention_block_backward(dev, dx, g, dout, x, w, ctx, ws, d, s);
}

void layer_attention_block_forward(Device& dev, const float* x, const LayerWeights& w, const TokenContext& ctx,
                                   LayerWorkspace& ws, const LayerDims& d, Stream s) {
  forward_to_attention(dev, x, w, ctx, ws, d, s);
  attention_out_to_xn2(dev, x, w, ws, d, s);
}

void layer_attention_out_forward(Device& dev, const float* x, const LayerWeights& w, LayerWorkspace& ws,
                                 const LayerDims& d, Stream s) {
  attention_out_to_xn2(dev, x, w, ws, d, s);
}

void layer_attention_block_backward(Device& dev, float* dx, LayerGrads& g, const float* dout, const float* x,
                                    const LayerWeights& w, const TokenContext& ctx, LayerWorkspace& ws,
                                    const LayerDims& d, Stream s) {
  STRATA_ASSERT(dx != dout && dx != x, "layer_backward: dx aliases an input");
  const int64_t N = d.N(), C = d.C, H = d.H, Hk = d.Hk, D = d.D;
  const bool qk_norm = w.q_norm != nullptr;
  dev.rmsnorm_backward(ws.dh, g.post_norm, ws.dxn, ws.h, w.post_norm, ws.rstd2, N, C, s);
  dev.add_inplace(ws.dh, dout, N * C, s);  // residual

  // attention: h = x + attn Wo^T (+ bo)
  const bf16* attn_b = cast_input(dev, ws.cast_b, ws.attn, N * H * D, d, s);
  linear_backward(dev, ws.dattn, g.o, g.o_bias, g.lora[kO], ws.dh, ws.attn, attn_b, w.o, w.lora[kO], ws, N, C, H * D,
                  false, d, s);
  const float scale = d.attn_scale > 0 ? d.attn_scale : 1.0f / std::sqrt(float(D));
  dev.attention_backward(ws.dq, ws.dk, ws.dv, ws.dattn, ws.q, ws.k, ws.v, ws.attn, ws.lse,
                         ctx.doc_start, d.B, d.T, H, Hk, D, scale, d.wt, s, d.window);
  dev.rope_backward(ws.dq, ws.dq, ctx.pos, ctx.inv_freq, N, H, D, d.rotary(), s);
  dev.rope_backward(ws.dk, ws.dk, ctx.pos, ctx.inv_freq, N, Hk, D, d.rotary(), s);
  float* dq_lin = ws.dq;
  float* dk_lin = ws.dk;
  if (qk_norm) {  // dattn is free here: it holds the pre-norm q gradient
    dev.rmsnorm_backward(ws.dattn, g.q_norm, ws.dq, ws.q_raw, w.q_norm, ws.rstd_q, N * H, D, s);
    dev.rmsnorm_backward(ws.dk_raw, g.k_norm, ws.dk, ws.k_raw, w.k_norm, ws.rstd_k, N * Hk, D, s);
    dq_lin = ws.dattn;
    dk_lin = ws.dk_raw;
  }
  const bf16* xn1_b = cast_input(dev, ws.cast_b, ws.xn1, N * C, d, s);  // one cast for q, k and v
  linear_backward(dev, ws.dxn, g.q, g.q_bias, g.lora[kQ], dq_lin, ws.xn1, xn1_b, w.q, w.lora[kQ], ws, N, H * D, C,
                  false, d, s);
  linear_backward(dev, ws.dxn, g.k, g.k_bias, g.lora[kK], dk_lin, ws.xn1, xn1_b, w.k, w.lora[kK], ws, N, Hk * D, C,
                  true, d, s);
  linear_backward(dev, ws.dxn, g.v, g.v_bias, g.lora[kV], ws.dv, ws.xn1, xn1_b, w.v, w.lora[kV], ws, N, Hk * D, C,
                  true, d, s);
  dev.rmsnorm_backward(dx, g.input_norm, ws.dxn, x, w.input_norm, ws.rstd1, N, C, s);
  dev.add_inplace(dx, ws.dh, N * C, s);  // residual
}

}  // namespace strata
