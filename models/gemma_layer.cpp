// The sandwich layer kinds (gemma_layer.h): parameters, workspace, forward and backward.
#include "models/gemma_layer.h"

#include <algorithm>
#include <cmath>

#include "models/decoder_layer.h"
#include "src/core/align.h"
#include "src/core/bf16.h"
#include "src/core/error.h"

namespace strata {
namespace {

enum Linear { kLq, kLk, kLv, kLo, kLgate, kLup, kLdown };
// The kinds' parameters, in row order; OLMo 2 has no input and no pre-feed-forward norm.
enum Param : size_t { kInputNorm, kQ, kK, kV, kO, kQNorm, kKNorm, kPostAttn, kPreFf, kPostFf, kGate, kUp, kDown,
                      kParams };

struct Variant {
  bool gemma;    // Gemma 3 (else OLMo 2)
  bool sliding;  // a local layer: the window and the local RoPE table
  bool first;    // layer 0: scales the embedding
};

// One layer's buffers (gemma_layer.h's names). Activations (what backward_saved reads) first.
struct Workspace {
  float *xs, *xn1, *rstd1;          // (N,C) x0 = x·√C (first), (N,C) norm_in(x0), (N)
  float *q_raw, *k_raw;             // (N,H*D), (N,Hk*D) projections before the q/k norms
  float *rstd_q, *rstd_k;           // (N*H), (N*Hk) per head; OLMo 2 (N), (N)
  float *q, *k, *v, *attn, *lse;    // (N,H*D), (N,Hk*D), (N,Hk*D), (N,H*D), (N,H)
  float *o, *rstd_o;                // (N,C) attention's projection before its norm, (N)
  float *h, *xn2, *rstd2;           // (N,C) after the attention, (N,C) norm_pre_ff(h), (N)
  float *gate, *up, *act;           // (N,F)
  float *y, *rstd_y;                // (N,C) the MLP's output before its norm, (N)
  // scratch
  float* wn;                        // the (1 + w) norm weights: input, q, k, post_attn, pre_ff, post_ff
  bf16 *cast_a, *cast_b;            // (N, max(C, H*D, F)) bf16 copies of matmul inputs (bf16 mode)
  float *lora_u, *lora_t, *lora_x;  // as LayerWorkspace's
  // backward
  float *dh, *dxn, *do_, *dattn, *dq, *dk, *dv, *dq_raw, *dk_raw;  // (N,C) x3, (N,H*D) x3, (N,Hk*D) x4
  float *dact, *dgate, *dup, *dy;                                   // (N,F) x3, (N,C)
};

struct Carver {
  char* base;
  size_t offset = 0;
  float* f(int64_t count) { return take<float>(count); }
  template <class T>
  T* take(int64_t count) {
    T* p = base ? reinterpret_cast<T*>(base + offset) : nullptr;
    offset += align_up(size_t(count) * sizeof(T));
    return p;
  }
};

void carve_activations(const LayerDims& d, Carver& c, Workspace& w) {
  const int64_t N = d.N(), C = d.C, HD = d.H * d.D, KD = d.Hk * d.D, F = d.F;
  w.xs = c.f(N * C), w.xn1 = c.f(N * C), w.rstd1 = c.f(N);
  w.q_raw = c.f(N * HD), w.k_raw = c.f(N * KD), w.rstd_q = c.f(N * d.H), w.rstd_k = c.f(N * d.Hk);
  w.q = c.f(N * HD), w.k = c.f(N * KD), w.v = c.f(N * KD), w.attn = c.f(N * HD), w.lse = c.f(N * d.H);
  w.o = c.f(N * C), w.rstd_o = c.f(N), w.h = c.f(N * C), w.xn2 = c.f(N * C), w.rstd2 = c.f(N);
  w.gate = c.f(N * F), w.up = c.f(N * F), w.act = c.f(N * F), w.y = c.f(N * C), w.rstd_y = c.f(N);
}

// Activations in `acts` when not null (kept from forward to backward), else in `scratch` first.
Workspace carve(const LayerDims& d, char* scratch, char* acts, bool backward) {
  const int64_t N = d.N(), C = d.C, HD = d.H * d.D, KD = d.Hk * d.D, F = d.F;
  Workspace w{};
  Carver c{scratch};
  if (acts) {
    Carver a{acts};
    carve_activations(d, a, w);
  } else {
    carve_activations(d, c, w);
  }
  const int64_t widest = std::max({C, HD, F});
  w.wn = c.f(4 * C + HD + KD);
  w.cast_a = c.take<bf16>(N * widest);
  w.cast_b = backward ? c.take<bf16>(N * widest) : nullptr;
  w.lora_u = d.lora_r > 0 ? c.f(N * d.lora_r) : nullptr;
  w.lora_t = d.lora_r > 0 && backward ? c.f(N * d.lora_r) : nullptr;
  w.lora_x = d.lora_r > 0 && d.lora_dropout ? c.f(N * widest) : nullptr;
  if (!backward) return w;
  w.dh = c.f(N * C), w.dxn = c.f(N * C), w.do_ = c.f(N * C);
  w.dattn = c.f(N * HD), w.dq = c.f(N * HD), w.dq_raw = c.f(N * HD);
  w.dk = c.f(N * KD), w.dv = c.f(N * KD), w.dk_raw = c.f(N * KD);
  w.dact = c.f(N * F), w.dgate = c.f(N * F), w.dup = c.f(N * F), w.dy = c.f(N * C);
  return w;
}

size_t carve_bytes(const LayerDims& d, bool backward) {
  Carver c{nullptr};
  Workspace w{};
  carve_activations(d, c, w);
  const int64_t N = d.N(), C = d.C, HD = d.H * d.D, KD = d.Hk * d.D, F = d.F, widest = std::max({C, HD, F});
  size_t bytes = c.offset + align_up(size_t(4 * C + HD + KD) * 4) + align_up(size_t(N * widest) * 2) * (backward ? 2 : 1);
  if (d.lora_r > 0) bytes += align_up(size_t(N * d.lora_r) * 4) * (backward ? 2 : 1);
  if (d.lora_r > 0 && d.lora_dropout) bytes += align_up(size_t(N * widest) * 4);
  if (backward)
    bytes += 4 * align_up(size_t(N * C) * 4) + 3 * align_up(size_t(N * HD) * 4) + 3 * align_up(size_t(N * KD) * 4) +
             3 * align_up(size_t(N * F) * 4);
  return bytes;
}

// The layer's norm weights as its math reads them: Gemma's 1 + w (made into ws.wn), OLMo 2's w.
struct Norms {
  const float *in = nullptr, *q = nullptr, *k = nullptr, *post_attn = nullptr, *pre_ff = nullptr, *post_ff = nullptr;
};

class SandwichLayerKind final : public LayerKind {
 public:
  explicit SandwichLayerKind(Variant v) : v_(v) {}

  const char* name() const override {
    if (!v_.gemma) return "olmo2";
    return v_.sliding ? (v_.first ? "gemma3_sliding_first" : "gemma3_sliding") : (v_.first ? "gemma3_first" : "gemma3");
  }

  std::vector<LayerParam> params(const ModelConfig& cfg) const override {
    STRATA_CHECK(!cfg.qkv_bias && !cfg.o_bias, "config.json sets attention_bias = true for ", cfg.family,
                 ", which strata does not support: its ", cfg.family, " layers have no biases");
    const int64_t C = cfg.hidden_size, H = cfg.num_attention_heads, Hk = cfg.num_key_value_heads;
    const int64_t D = cfg.head_dim, F = cfg.intermediate_size;
    auto when = [](bool present, Shape s) { return present ? s : Shape{}; };
    std::vector<LayerParam> p(kParams);
    p[kInputNorm] = {"input_layernorm.weight", when(v_.gemma, {C}), -1, true};
    p[kQ] = {"self_attn.q_proj.weight", {H * D, C}, kLq};
    p[kK] = {"self_attn.k_proj.weight", {Hk * D, C}, kLk};
    p[kV] = {"self_attn.v_proj.weight", {Hk * D, C}, kLv};
    p[kO] = {"self_attn.o_proj.weight", {C, H * D}, kLo};
    p[kQNorm] = {"self_attn.q_norm.weight", {v_.gemma ? D : H * D}, -1, true};
    p[kKNorm] = {"self_attn.k_norm.weight", {v_.gemma ? D : Hk * D}, -1, true};
    p[kPostAttn] = {"post_attention_layernorm.weight", {C}, -1, true};
    p[kPreFf] = {"pre_feedforward_layernorm.weight", when(v_.gemma, {C}), -1, true};
    p[kPostFf] = {"post_feedforward_layernorm.weight", {C}, -1, true};
    p[kGate] = {"mlp.gate_proj.weight", {F, C}, kLgate};
    p[kUp] = {"mlp.up_proj.weight", {F, C}, kLup};
    p[kDown] = {"mlp.down_proj.weight", {C, F}, kLdown};
    return p;
  }

  size_t bytes(LayerBuffer what, const LayerDims& d) const override {
    switch (what) {
      case LayerBuffer::workspace: return carve_bytes(d, true);
      case LayerBuffer::forward_workspace: return carve_bytes(d, false);
      case LayerBuffer::activations: {
        Carver c{nullptr};
        Workspace w{};
        carve_activations(d, c, w);
        return c.offset;
      }
    }
    return 0;
  }

  LayerCost cost(const ModelConfig& cfg, DType matrix_dtype, int64_t B, int64_t T) const override {
    const double N = double(B) * double(T), C = double(cfg.hidden_size), F = double(cfg.intermediate_size);
    const double H = double(cfg.num_attention_heads), Hk = double(cfg.num_key_value_heads), D = double(cfg.head_dim);
    double matrix = 0;
    for (const LayerParam& p : params(cfg))
      if (p.shape.size() == 2) matrix += double(shape_numel(p.shape));
    const int64_t W = v_.sliding ? cfg.sliding_window : 0;
    double tile_pairs = 0;  // as the dense kind counts them
    for (int64_t q0 = 0; q0 < T; q0 += 64) {
      const int64_t q1 = std::min<int64_t>(T, q0 + 64);
      const int64_t k0 = W > 0 ? std::max<int64_t>(0, q0 - W + 1) / 64 * 64 : 0;
      tile_pairs += double(q1 - q0) * double(q1 - k0);
    }
    LayerCost w;
    w.matmul_flops = 8 * N * matrix;
    w.attention_flops = 9 * 2 * double(B) * H * tile_pairs * D;
    const double f32_elems = 16 * N * C + 4 * N * (H + Hk) * D + 3 * N * F;  // 4 norms, adds, RoPE, q/k norms, GeGLU
    const double cast_elems = matrix_dtype == DType::bf16 ? 2 * N * C + N * H * D + N * F : 0;
    w.elementwise_bytes = 4 * (4 * f32_elems + 6 * cast_elems);
    return w;
  }

  int64_t attention_window(const LayerDims& d) const override { return v_.sliding ? d.window : 0; }

  void forward(Device& dev, float* out, const float* x, const LayerTensors& w, const TokenContext& ctx,
               const LayerScratch& ws, const LayerDims& d, Stream s) const override {
    STRATA_ASSERT(out != x, "sandwich layer forward: out aliases x");
    Workspace c = carve(ws.capacity, ws.base, ws.activations, ws.backward);
    const Norms n = norms(dev, w, c, d, s);
    to_attention(dev, x, w, n, ctx, c, d, s);
    attend(dev, ctx, c, d, s);
    from_attention(dev, out, x, w, n, c, d, s);
  }

  void backward(Device& dev, float* dx, const LayerGradTensors& g, const float* dout, const float* x,
                const LayerTensors& w, const TokenContext& ctx, const LayerScratch& ws, const LayerDims& d,
                Stream s) const override {
    Workspace c = carve(ws.capacity, ws.base, ws.activations, true);
    const Norms n = norms(dev, w, c, d, s);
    to_attention(dev, x, w, n, ctx, c, d, s);  // recompute from the checkpoint
    attend(dev, ctx, c, d, s);
    from_attention(dev, c.dy, x, w, n, c, d, s);  // dy is scratch until the backward writes it
    backward_from(dev, dx, g, dout, x, w, n, ctx, c, d, s);
  }

  void backward_saved(Device& dev, float* dx, const LayerGradTensors& g, const float* dout, const float* x,
                      const LayerTensors& w, const TokenContext& ctx, const LayerScratch& ws, const LayerDims& d,
                      Stream s) const override {
    Workspace c = carve(ws.capacity, ws.base, ws.activations, true);
    const Norms n = norms(dev, w, c, d, s);
    backward_from(dev, dx, g, dout, x, w, n, ctx, c, d, s);
  }

  LayerAttention attention(const LayerScratch& ws) const override {
    const Workspace c = carve(ws.capacity, ws.base, ws.activations, ws.backward);
    return {c.q, c.k, c.v, c.attn};
  }

  void forward_qkv(Device& dev, const float* x, const LayerTensors& w, const TokenContext& ctx,
                   const LayerScratch& ws, const LayerDims& d, Stream s) const override {
    Workspace c = carve(ws.capacity, ws.base, ws.activations, ws.backward);
    to_attention(dev, x, w, norms(dev, w, c, d, s), ctx, c, d, s);
  }

  void forward_from_attention(Device& dev, float* out, const float* x, const LayerTensors& w,
                              const LayerScratch& ws, const LayerDims& d, Stream s) const override {
    Workspace c = carve(ws.capacity, ws.base, ws.activations, ws.backward);
    from_attention(dev, out, x, w, norms(dev, w, c, d, s), c, d, s);
  }

 private:
  Variant v_;

  // Gemma: 1 + w into ws.wn, once per call; OLMo 2: the weights themselves.
  Norms norms(Device& dev, const LayerTensors& w, Workspace& c, const LayerDims& d, Stream s) const {
    auto p = [&](Param i) { return static_cast<const float*>(w.param[i]); };
    Norms n{p(kInputNorm), p(kQNorm), p(kKNorm), p(kPostAttn), p(kPreFf), p(kPostFf)};
    if (!v_.gemma) return n;
    float* at = c.wn;
    auto plus_one = [&](const float*& wt, int64_t count) {
      dev.affine(at, wt, 1.f, 1.f, count, s);
      wt = at;
      at += count;
    };
    plus_one(n.in, d.C), plus_one(n.q, d.D), plus_one(n.k, d.D);
    plus_one(n.post_attn, d.C), plus_one(n.pre_ff, d.C), plus_one(n.post_ff, d.C);
    return n;
  }

  // x's bf16 copy into cast for the matmuls that read it (bf16 mode); null in f32 mode.
  static const bf16* cast(Device& dev, bf16* cast, const float* x, int64_t count, const LayerDims& d, Stream s) {
    if (d.wt == DType::f32) return nullptr;
    dev.cast_f32_to_bf16(cast, x, count, s);
    return cast;
  }
  static LayerWorkspace linear_ws(const Workspace& c) {
    LayerWorkspace lw{};
    lw.cast_a = c.cast_a, lw.cast_b = c.cast_b, lw.lora_u = c.lora_u, lw.lora_t = c.lora_t, lw.lora_x = c.lora_x;
    return lw;
  }
  static const void* mat(const LayerTensors& w, Param i) { return w.param[i]; }

  const float* x0_of(const float* x, const Workspace& c) const { return v_.first ? c.xs : x; }
  const float* attn_in(const float* x, const Workspace& c) const { return v_.gemma ? c.xn1 : x0_of(x, c); }
  const float* mlp_in(const Workspace& c) const { return v_.gemma ? c.xn2 : c.h; }
  const float* inv_freq(const TokenContext& ctx, const LayerDims& d) const {
    return v_.gemma && v_.sliding ? ctx.inv_freq + d.D / 2 : ctx.inv_freq;
  }
  // q/k norms: Gemma per head (rows N*H of D), OLMo 2 over the projection (rows N of H*D).
  int64_t qk_rows(int64_t N, int64_t heads) const { return v_.gemma ? N * heads : N; }
  int64_t qk_cols(int64_t heads, int64_t D) const { return v_.gemma ? D : heads * D; }

  void to_attention(Device& dev, const float* x, const LayerTensors& w, const Norms& n, const TokenContext& ctx,
                    Workspace& c, const LayerDims& d, Stream s) const {
    const int64_t N = d.N(), C = d.C, H = d.H, Hk = d.Hk, D = d.D;
    if (v_.first) dev.affine(c.xs, x, gemma_embed_scale(C, d.wt), 0.f, N * C, s);
    if (v_.gemma) dev.rmsnorm_forward(c.xn1, c.rstd1, x0_of(x, c), n.in, N, C, d.eps, s);
    const float* a = attn_in(x, c);
    const bf16* ab = cast(dev, c.cast_a, a, N * C, d, s);
    linear_forward(dev, c.q_raw, a, ab, mat(w, kQ), nullptr, w.lora[kLq], c.lora_u, c.lora_x, N, H * D, C, d, s);
    linear_forward(dev, c.k_raw, a, ab, mat(w, kK), nullptr, w.lora[kLk], c.lora_u, c.lora_x, N, Hk * D, C, d, s);
    linear_forward(dev, c.v, a, ab, mat(w, kV), nullptr, w.lora[kLv], c.lora_u, c.lora_x, N, Hk * D, C, d, s);
    dev.rmsnorm_forward(c.q, c.rstd_q, c.q_raw, n.q, qk_rows(N, H), qk_cols(H, D), d.eps, s);
    dev.rmsnorm_forward(c.k, c.rstd_k, c.k_raw, n.k, qk_rows(N, Hk), qk_cols(Hk, D), d.eps, s);
    dev.rope_forward(c.q, c.q, ctx.pos, inv_freq(ctx, d), N, H, D, D, s);
    dev.rope_forward(c.k, c.k, ctx.pos, inv_freq(ctx, d), N, Hk, D, D, s);
  }

  void attend(Device& dev, const TokenContext& ctx, Workspace& c, const LayerDims& d, Stream s) const {
    dev.attention_forward(c.attn, c.lse, c.q, c.k, c.v, ctx.doc_start, d.B, d.T, d.H, d.Hk, d.D, attention_scale(d),
                          d.wt, s, attention_window(d));
  }

  void from_attention(Device& dev, float* out, const float* x, const LayerTensors& w, const Norms& n,
                      Workspace& c, const LayerDims& d, Stream s) const {
    const int64_t N = d.N(), C = d.C, HD = d.H * d.D, F = d.F;
    const bf16* ab = cast(dev, c.cast_a, c.attn, N * HD, d, s);
    linear_forward(dev, c.o, c.attn, ab, mat(w, kO), nullptr, w.lora[kLo], c.lora_u, c.lora_x, N, C, HD, d, s);
    dev.rmsnorm_forward(c.h, c.rstd_o, c.o, n.post_attn, N, C, d.eps, s);
    dev.add_inplace(c.h, x0_of(x, c), N * C, s);  // residual
    if (v_.gemma) dev.rmsnorm_forward(c.xn2, c.rstd2, c.h, n.pre_ff, N, C, d.eps, s);
    const float* m = mlp_in(c);
    const bf16* mb = cast(dev, c.cast_a, m, N * C, d, s);
    linear_forward(dev, c.gate, m, mb, mat(w, kGate), nullptr, w.lora[kLgate], c.lora_u, c.lora_x, N, F, C, d, s);
    linear_forward(dev, c.up, m, mb, mat(w, kUp), nullptr, w.lora[kLup], c.lora_u, c.lora_x, N, F, C, d, s);
    if (v_.gemma)
      dev.geglu_forward(c.act, c.gate, c.up, N * F, s);
    else
      dev.swiglu_forward(c.act, c.gate, c.up, N * F, s);
    const bf16* actb = cast(dev, c.cast_a, c.act, N * F, d, s);
    linear_forward(dev, c.y, c.act, actb, mat(w, kDown), nullptr, w.lora[kLdown], c.lora_u, c.lora_x, N, C, F, d, s);
    dev.rmsnorm_forward(out, c.rstd_y, c.y, n.post_ff, N, C, d.eps, s);
    dev.add_inplace(out, c.h, N * C, s);  // residual
  }

  void backward_from(Device& dev, float* dx, const LayerGradTensors& gt, const float* dout, const float* x,
                     const LayerTensors& w, const Norms& n, const TokenContext& ctx, Workspace& c,
                     const LayerDims& d, Stream s) const {
    STRATA_ASSERT(dx != dout && dx != x, "sandwich layer backward: dx aliases an input");
    const int64_t N = d.N(), C = d.C, H = d.H, Hk = d.Hk, D = d.D, F = d.F;
    LayerWorkspace lw = linear_ws(c);
    auto g = [&](Param i) { return gt.param[i]; };
    // MLP: out = h + norm_post_ff(y), y = act Wd^T
    dev.rmsnorm_backward(c.dy, g(kPostFf), dout, c.y, n.post_ff, c.rstd_y, N, C, s);
    const bf16* actb = cast(dev, c.cast_b, c.act, N * F, d, s);
    linear_backward(dev, c.dact, g(kDown), nullptr, gt.lora[kLdown], c.dy, c.act, actb, mat(w, kDown), w.lora[kLdown],
                    lw, N, C, F, false, d, s);
    if (v_.gemma)
      dev.geglu_backward(c.dgate, c.dup, c.dact, c.gate, c.up, N * F, s);
    else
      dev.swiglu_backward(c.dgate, c.dup, c.dact, c.gate, c.up, N * F, s);
    const float* m = mlp_in(c);
    const bf16* mb = cast(dev, c.cast_b, m, N * C, d, s);
    linear_backward(dev, c.dxn, g(kGate), nullptr, gt.lora[kLgate], c.dgate, m, mb, mat(w, kGate), w.lora[kLgate], lw,
                    N, F, C, false, d, s);
    linear_backward(dev, c.dxn, g(kUp), nullptr, gt.lora[kLup], c.dup, m, mb, mat(w, kUp), w.lora[kLup], lw, N, F, C,
                    true, d, s);
    if (v_.gemma)
      dev.rmsnorm_backward(c.dh, g(kPreFf), c.dxn, c.h, n.pre_ff, c.rstd2, N, C, s);
    else
      dev.copy_d2d(c.dh, c.dxn, size_t(N * C) * sizeof(float), s);
    dev.add_inplace(c.dh, dout, N * C, s);  // residual
    // attention: h = x0 + norm_post_attn(o), o = attn Wo^T
    dev.rmsnorm_backward(c.do_, g(kPostAttn), c.dh, c.o, n.post_attn, c.rstd_o, N, C, s);
    const bf16* ab = cast(dev, c.cast_b, c.attn, N * H * D, d, s);
    linear_backward(dev, c.dattn, g(kO), nullptr, gt.lora[kLo], c.do_, c.attn, ab, mat(w, kO), w.lora[kLo], lw, N, C,
                    H * D, false, d, s);
    dev.attention_backward(c.dq, c.dk, c.dv, c.dattn, c.q, c.k, c.v, c.attn, c.lse, ctx.doc_start, d.B, d.T, H, Hk, D,
                           attention_scale(d), d.wt, s, attention_window(d));
    dev.rope_backward(c.dq, c.dq, ctx.pos, inv_freq(ctx, d), N, H, D, D, s);
    dev.rope_backward(c.dk, c.dk, ctx.pos, inv_freq(ctx, d), N, Hk, D, D, s);
    dev.rmsnorm_backward(c.dq_raw, g(kQNorm), c.dq, c.q_raw, n.q, c.rstd_q, qk_rows(N, H), qk_cols(H, D), s);
    dev.rmsnorm_backward(c.dk_raw, g(kKNorm), c.dk, c.k_raw, n.k, c.rstd_k, qk_rows(N, Hk), qk_cols(Hk, D), s);
    const float* a = attn_in(x, c);
    const bf16* a_b = cast(dev, c.cast_b, a, N * C, d, s);
    linear_backward(dev, c.dxn, g(kQ), nullptr, gt.lora[kLq], c.dq_raw, a, a_b, mat(w, kQ), w.lora[kLq], lw, N, H * D,
                    C, false, d, s);
    linear_backward(dev, c.dxn, g(kK), nullptr, gt.lora[kLk], c.dk_raw, a, a_b, mat(w, kK), w.lora[kLk], lw, N,
                    Hk * D, C, true, d, s);
    linear_backward(dev, c.dxn, g(kV), nullptr, gt.lora[kLv], c.dv, a, a_b, mat(w, kV), w.lora[kLv], lw, N, Hk * D,
                    C, true, d, s);
    if (v_.gemma)
      dev.rmsnorm_backward(dx, g(kInputNorm), c.dxn, x0_of(x, c), n.in, c.rstd1, N, C, s);
    else
      dev.copy_d2d(dx, c.dxn, size_t(N * C) * sizeof(float), s);
    dev.add_inplace(dx, c.dh, N * C, s);  // residual
    if (v_.first) dev.affine(dx, dx, gemma_embed_scale(C, d.wt), 0.f, N * C, s);  // x0 = x·√C
  }
};

}  // namespace

float gemma_embed_scale(int64_t hidden, DType embed_dtype) {
  const float s = float(std::sqrt(double(hidden)));  // hidden_size**0.5, then torch.tensor's f32
  return embed_dtype == DType::bf16 ? bf16_to_f32(f32_to_bf16(s)) : s;
}

const LayerKind& gemma_layer_kind(bool sliding, bool first) {
  static const SandwichLayerKind kinds[4] = {SandwichLayerKind({true, false, false}),
                                             SandwichLayerKind({true, false, true}),
                                             SandwichLayerKind({true, true, false}),
                                             SandwichLayerKind({true, true, true})};
  return kinds[(sliding ? 2 : 0) + (first ? 1 : 0)];
}

const LayerKind& olmo2_layer_kind() {
  static const SandwichLayerKind kind({false, false, false});
  return kind;
}

}  // namespace strata
