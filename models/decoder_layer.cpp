#include "models/decoder_layer.h"

#include <algorithm>
#include <cmath>

#include "src/core/error.h"

namespace strata {
namespace {

// y (N,O) = x (N,I) W^T (+ b). W (O,I) is d.wt; in bf16 mode x is rounded into `cast` first.
void linear_forward(Device& dev, Stream s, const LayerDims& d, bf16* cast, float* y,
                    const float* x, const void* w, const float* b, int64_t n, int64_t o,
                    int64_t i) {
  if (d.wt == DType::f32) {
    dev.matmul(s, y, x, w, DType::f32, n, o, i, false, true, 0.f);
  } else {
    dev.cast_f32_to_bf16(s, cast, x, n * i);
    dev.matmul(s, y, cast, w, DType::bf16, n, o, i, false, true, 0.f);
  }
  if (b) dev.bias_forward(s, y, b, n, o);
}

// dx (N,I) = dy W (written, or added when accumulate); dW (O,I) += dy^T x; db (O) += sum dy.
void linear_backward(Device& dev, Stream s, const LayerDims& d, LayerWorkspace& ws, float* dx,
                     float* dw, float* db, const float* dy, const float* x, const void* w,
                     int64_t n, int64_t o, int64_t i, bool accumulate) {
  const float beta = accumulate ? 1.f : 0.f;
  if (d.wt == DType::f32) {
    dev.matmul(s, dx, dy, w, DType::f32, n, i, o, false, false, beta);
    dev.matmul(s, dw, dy, x, DType::f32, o, i, n, true, false, 1.f);
  } else {
    dev.cast_f32_to_bf16(s, ws.cast_a, dy, n * o);
    dev.matmul(s, dx, ws.cast_a, w, DType::bf16, n, i, o, false, false, beta);
    dev.cast_f32_to_bf16(s, ws.cast_b, x, n * i);
    dev.matmul(s, dw, ws.cast_a, ws.cast_b, DType::bf16, o, i, n, true, false, 1.f);
  }
  if (db) dev.bias_backward(s, db, dy, n, o);
}

// Everything up to the MLP activation: fills ws (xn1 .. act).
void forward_to_act(Device& dev, Stream s, const LayerDims& d, const LayerWeights& w,
                    const TokenContext& ctx, LayerWorkspace& ws, const float* x) {
  const int64_t N = d.N(), C = d.C, H = d.H, Hk = d.Hk, D = d.D, F = d.F;
  const bool qk_norm = w.q_norm != nullptr;
  dev.rmsnorm_forward(s, ws.xn1, ws.rstd1, x, w.input_norm, N, C, d.eps);
  linear_forward(dev, s, d, ws.cast_a, qk_norm ? ws.q_raw : ws.q, ws.xn1, w.q, w.q_bias, N, H * D, C);
  linear_forward(dev, s, d, ws.cast_a, qk_norm ? ws.k_raw : ws.k, ws.xn1, w.k, w.k_bias, N, Hk * D, C);
  linear_forward(dev, s, d, ws.cast_a, ws.v, ws.xn1, w.v, w.v_bias, N, Hk * D, C);
  if (qk_norm) {
    dev.rmsnorm_forward(s, ws.q, ws.rstd_q, ws.q_raw, w.q_norm, N * H, D, d.eps);
    dev.rmsnorm_forward(s, ws.k, ws.rstd_k, ws.k_raw, w.k_norm, N * Hk, D, d.eps);
  }
  dev.rope_forward(s, ws.q, ws.q, ctx.pos, ctx.inv_freq, N, H, D);
  dev.rope_forward(s, ws.k, ws.k, ctx.pos, ctx.inv_freq, N, Hk, D);
  const float scale = 1.0f / std::sqrt(float(D));
  dev.attention_forward(s, ws.attn, ws.lse, ws.q, ws.k, ws.v, ctx.doc_start, d.B, d.T, H, Hk, D, scale);
  linear_forward(dev, s, d, ws.cast_a, ws.h, ws.attn, w.o, w.o_bias, N, C, H * D);
  dev.add_inplace(s, ws.h, x, N * C);  // residual
  dev.rmsnorm_forward(s, ws.xn2, ws.rstd2, ws.h, w.post_norm, N, C, d.eps);
  linear_forward(dev, s, d, ws.cast_a, ws.gate, ws.xn2, w.gate, nullptr, N, F, C);
  linear_forward(dev, s, d, ws.cast_a, ws.up, ws.xn2, w.up, nullptr, N, F, C);
  dev.swiglu_forward(s, ws.act, ws.gate, ws.up, N * F);
}

struct Carver {
  char* base;
  size_t offset = 0;
  template <class T>
  T* take(int64_t count) {
    T* p = base ? reinterpret_cast<T*>(base + offset) : nullptr;
    offset += (size_t(count) * sizeof(T) + 255) / 256 * 256;
    return p;
  }
};

LayerWorkspace carve(const LayerDims& d, Carver& c) {
  const int64_t N = d.N(), C = d.C, H = d.H, Hk = d.Hk, D = d.D, F = d.F;
  const int64_t widest = std::max({C, H * D, F});
  LayerWorkspace ws;
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

void layer_forward(Device& dev, Stream s, const LayerDims& d, const LayerWeights& w,
                   const TokenContext& ctx, LayerWorkspace& ws, float* out, const float* x) {
  STRATA_ASSERT(out != x, "layer_forward: out aliases x");
  forward_to_act(dev, s, d, w, ctx, ws, x);
  const int64_t N = d.N();
  linear_forward(dev, s, d, ws.cast_a, out, ws.act, w.down, nullptr, N, d.C, d.F);
  dev.add_inplace(s, out, ws.h, N * d.C);  // residual
}

void layer_backward(Device& dev, Stream s, const LayerDims& d, const LayerWeights& w,
                    LayerGrads& g, const TokenContext& ctx, LayerWorkspace& ws, float* dx,
                    const float* dout, const float* x) {
  STRATA_ASSERT(dx != dout && dx != x, "layer_backward: dx aliases an input");
  const int64_t N = d.N(), C = d.C, H = d.H, Hk = d.Hk, D = d.D, F = d.F;
  const bool qk_norm = w.q_norm != nullptr;
  forward_to_act(dev, s, d, w, ctx, ws, x);  // recompute from the checkpoint

  // MLP: out = h + act Wd^T
  linear_backward(dev, s, d, ws, ws.dact, g.down, nullptr, dout, ws.act, w.down, N, C, F, false);
  dev.swiglu_backward(s, ws.dgate, ws.dup, ws.dact, ws.gate, ws.up, N * F);
  linear_backward(dev, s, d, ws, ws.dxn, g.gate, nullptr, ws.dgate, ws.xn2, w.gate, N, F, C, false);
  linear_backward(dev, s, d, ws, ws.dxn, g.up, nullptr, ws.dup, ws.xn2, w.up, N, F, C, true);
  dev.rmsnorm_backward(s, ws.dh, g.post_norm, ws.dxn, ws.h, w.post_norm, ws.rstd2, N, C);
  dev.add_inplace(s, ws.dh, dout, N * C);  // residual

  // attention: h = x + attn Wo^T (+ bo)
  linear_backward(dev, s, d, ws, ws.dattn, g.o, g.o_bias, ws.dh, ws.attn, w.o, N, C, H * D, false);
  const float scale = 1.0f / std::sqrt(float(D));
  dev.attention_backward(s, ws.dq, ws.dk, ws.dv, ws.dattn, ws.q, ws.k, ws.v, ws.attn, ws.lse,
                         ctx.doc_start, d.B, d.T, H, Hk, D, scale);
  dev.rope_backward(s, ws.dq, ws.dq, ctx.pos, ctx.inv_freq, N, H, D);
  dev.rope_backward(s, ws.dk, ws.dk, ctx.pos, ctx.inv_freq, N, Hk, D);
  float* dq_lin = ws.dq;
  float* dk_lin = ws.dk;
  if (qk_norm) {  // dattn is free here: it holds the pre-norm q gradient
    dev.rmsnorm_backward(s, ws.dattn, g.q_norm, ws.dq, ws.q_raw, w.q_norm, ws.rstd_q, N * H, D);
    dev.rmsnorm_backward(s, ws.dk_raw, g.k_norm, ws.dk, ws.k_raw, w.k_norm, ws.rstd_k, N * Hk, D);
    dq_lin = ws.dattn;
    dk_lin = ws.dk_raw;
  }
  linear_backward(dev, s, d, ws, ws.dxn, g.q, g.q_bias, dq_lin, ws.xn1, w.q, N, H * D, C, false);
  linear_backward(dev, s, d, ws, ws.dxn, g.k, g.k_bias, dk_lin, ws.xn1, w.k, N, Hk * D, C, true);
  linear_backward(dev, s, d, ws, ws.dxn, g.v, g.v_bias, ws.dv, ws.xn1, w.v, N, Hk * D, C, true);
  dev.rmsnorm_backward(s, dx, g.input_norm, ws.dxn, x, w.input_norm, ws.rstd1, N, C);
  dev.add_inplace(s, dx, ws.dh, N * C);  // residual
}

}  // namespace strata
