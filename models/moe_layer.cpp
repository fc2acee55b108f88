// The mixture-of-experts layer kind (models/moe_layer.h): parameters, workspace, and the sparse
// block's forward and backward around the dense attention half (models/decoder_layer.h).
#include "models/moe_layer.h"

#include <algorithm>
#include <deque>
#include <iterator>
#include <mutex>

#include "models/decoder_layer.h"
#include "models/dense_layer.h"
#include "models/moe_aux_loss.h"
#include "models/moe_routing.h"
#include "src/core/align.h"
#include "src/core/error.h"

namespace strata {
namespace {

// The attention half's parameters (the dense kind's first 12, same order), then ours.
enum Param : size_t { kInputNorm, kQ, kK, kV, kO, kQBias, kKBias, kVBias, kOBias, kQNorm, kKNorm, kPostNorm,
                      kRouter, kExperts };
constexpr size_t kPerExpert = 3;  // gate, up, down

struct MoeShape {
  int64_t E = 0, K = 0, I = 0;
  bool norm_topk = false, mixtral = false;
  bool operator==(const MoeShape& o) const {
    return E == o.E && K == o.K && I == o.I && norm_topk == o.norm_topk && mixtral == o.mixtral;
  }
};

// The sparse block's buffers (device), after the attention half's.
struct MoeWorkspace {
  // activations (kept by a forward for backward_saved)
  float* logits;        // (N, E)
  int32_t* row_token;   // (M)
  int32_t* token_row;   // (N, k)
  float* row_weight;    // (M)
  float *xg, *y;        // (M, C)
  float *gate, *up, *act;  // (M, I)
  // scratch
  bf16* cast;           // (M, max(C, I)) bf16 copies of matmul inputs (bf16 mode)
  float *dy, *dxg;      // (M, C)
  float *dact, *dgate, *dup;  // (M, I)
  float* dw;            // (M)
  float* dlogits;       // (N, E)
  bf16* cast_b;         // (M, max(C, I, E)) bf16 copies of gradients (bf16 mode)
  float *lora_u, *lora_t;  // (M, r) x A^T and dy B' of the router's and experts' adapters (lora_r > 0)
};

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

void carve_moe_activations(const MoeShape& m, const LayerDims& d, Carver& c, MoeWorkspace& w) {
  const int64_t N = d.N(), M = N * m.K, C = d.C, I = m.I;
  w.logits = c.take<float>(N * m.E);
  w.row_token = c.take<int32_t>(M);
  w.token_row = c.take<int32_t>(M);
  w.row_weight = c.take<float>(M);
  w.xg = c.take<float>(M * C);
  w.y = c.take<float>(M * C);
  w.gate = c.take<float>(M * I);
  w.up = c.take<float>(M * I);
  w.act = c.take<float>(M * I);
}

void carve_moe_scratch(const MoeShape& m, const LayerDims& d, Carver& c, MoeWorkspace& w, bool backward) {
  const int64_t N = d.N(), M = N * m.K, C = d.C, I = m.I;
  w.cast = c.take<bf16>(M * std::max(C, I));
  w.lora_u = d.lora_r > 0 ? c.take<float>(M * d.lora_r) : nullptr;
  if (!backward) return;
  w.lora_t = d.lora_r > 0 ? c.take<float>(M * d.lora_r) : nullptr;
  w.dy = c.take<float>(M * C);
  w.dxg = c.take<float>(M * C);
  w.dact = c.take<float>(M * I);
  w.dgate = c.take<float>(M * I);
  w.dup = c.take<float>(M * I);
  w.dw = c.take<float>(M);
  w.dlogits = c.take<float>(N * m.E);
  w.cast_b = c.take<bf16>(std::max(M * std::max(C, I), N * m.E));
}

// The attention half runs at the layer's dims with no dense MLP (F = 0), over the whole context
// (no window: a config that slides a MoE layer is refused, io/hf_config.cpp).
LayerDims attention_dims(const LayerDims& d) {
  LayerDims a = d;
  a.F = 0;
  a.window = 0;
  return a;
}

// Both halves carved from a LayerScratch: the attention half's LayerWorkspace first (as the dense
// kind carves it), then ours; kept activations (ws.activations) likewise, the attention half's first.
struct Carved {
  LayerWorkspace att;
  MoeWorkspace moe;
};

size_t attention_bytes(LayerBuffer what, const LayerDims& a) {
  switch (what) {
    case LayerBuffer::workspace: return layer_workspace_bytes(a);
    case LayerBuffer::forward_workspace: return layer_forward_workspace_bytes(a);
    case LayerBuffer::activations: return layer_activation_bytes(a);
  }
  return 0;
}

Carved carve(const MoeShape& m, const LayerScratch& s) {
  const LayerDims a = attention_dims(s.capacity);
  Carved c{};
  c.att = s.backward ? layer_workspace_carve(a, s.base) : layer_forward_workspace_carve(a, s.base);
  Carver rest{s.base, attention_bytes(s.backward ? LayerBuffer::workspace : LayerBuffer::forward_workspace, a)};
  if (s.activations) {
    c.att = layer_workspace_with_activations(c.att, a, s.activations);
    Carver kept{s.activations, layer_activation_bytes(a)};
    carve_moe_activations(m, s.capacity, kept, c.moe);
    MoeWorkspace unused{};
    carve_moe_activations(m, s.capacity, rest, unused);  // the same layout as without kept activations
  } else {
    carve_moe_activations(m, s.capacity, rest, c.moe);
  }
  carve_moe_scratch(m, s.capacity, rest, c.moe, s.backward);
  return c;
}

size_t moe_bytes(const MoeShape& m, LayerBuffer what, const LayerDims& d) {
  const LayerDims a = attention_dims(d);
  Carver c{nullptr, attention_bytes(what, a)};
  MoeWorkspace w{};
  carve_moe_activations(m, d, c, w);
  if (what != LayerBuffer::activations) carve_moe_scratch(m, d, c, w, what == LayerBuffer::workspace);
  return c.offset;
}

// The attention half's named views from the kind's positional ones (no MLP weights).
LayerWeights attention_weights(const LayerTensors& t) {
  LayerWeights w;
  auto m = [&](size_t i) { return t.param[i]; };
  auto v = [&](size_t i) { return static_cast<const float*>(t.param[i]); };
  w.input_norm = v(kInputNorm), w.q = m(kQ), w.k = m(kK), w.v = m(kV), w.o = m(kO);
  w.q_bias = v(kQBias), w.k_bias = v(kKBias), w.v_bias = v(kVBias), w.o_bias = v(kOBias);
  w.q_norm = v(kQNorm), w.k_norm = v(kKNorm), w.post_norm = v(kPostNorm);
  std::copy(std::begin(t.lora), std::end(t.lora), std::begin(w.lora));
  return w;
}
LayerGrads attention_grads(const LayerGradTensors& t) {
  LayerGrads g;
  auto p = [&](size_t i) { return t.param[i]; };
  g.input_norm = p(kInputNorm), g.q = p(kQ), g.k = p(kK), g.v = p(kV), g.o = p(kO);
  g.q_bias = p(kQBias), g.k_bias = p(kKBias), g.v_bias = p(kVBias), g.o_bias = p(kOBias);
  g.q_norm = p(kQNorm), g.k_norm = p(kKNorm), g.post_norm = p(kPostNorm);
  std::copy(std::begin(t.lora), std::end(t.lora), std::begin(g.lora));
  return g;
}

// The host side of the routing. HAZARD: the staging vectors are rewritten only right after a
// synchronize of the stream that reads them (the d2h of the logits), so an h2d from them enqueued
// by the previous call on that stream has finished; a caller that interleaves two devices on one
// thread without synchronizing would break this.
struct HostStaging {
  std::vector<float> logits, dw, dlogits;
  std::vector<int32_t> ints;
  std::vector<float> floats;
};
HostStaging& staging() {
  thread_local HostStaging s;
  return s;
}

// Reads the logits back (a synchronize of s) and routes them.
MoeRouting route_on_host(Device& dev, const MoeShape& m, const float* logits, int64_t n, Stream s) {
  HostStaging& st = staging();
  st.logits.resize(size_t(n * m.E));
  dev.copy_d2h(st.logits.data(), logits, st.logits.size() * sizeof(float), s);
  dev.stream_synchronize(s);
  return moe_route(st.logits.data(), n, m.E, m.K, m.norm_topk);
}

class MoeLayerKind final : public LayerKind {
 public:
  explicit MoeLayerKind(const MoeShape& m) : m_(m) {}
  const MoeShape& shape() const { return m_; }
  const char* name() const override { return "moe"; }

  std::vector<LayerParam> params(const ModelConfig& cfg) const override {
    STRATA_CHECK(cfg.num_experts == m_.E && cfg.num_experts_per_tok == m_.K && cfg.moe_intermediate_size == m_.I,
                 "the MoE layer kind was made for another config's expert sizes");
    std::vector<LayerParam> p = dense_layer_kind().params(cfg);
    p.resize(kRouter);  // the attention half and post_attention_layernorm
    const int64_t C = cfg.hidden_size, E = m_.E, I = m_.I;
    const std::string block = m_.mixtral ? "block_sparse_moe." : "mlp.";
    p.push_back({block + "gate.weight", {E, C}});
    for (int64_t x = 0; x < E; ++x) {
      const std::string e = block + "experts." + std::to_string(x) + ".";
      p.push_back({e + (m_.mixtral ? "w1.weight" : "gate_proj.weight"), {I, C}});
      p.push_back({e + (m_.mixtral ? "w3.weight" : "up_proj.weight"), {I, C}});
      p.push_back({e + (m_.mixtral ? "w2.weight" : "down_proj.weight"), {C, I}});
    }
    return p;
  }

  size_t bytes(LayerBuffer what, const LayerDims& d) const override { return moe_bytes(m_, what, d); }

  LayerCost cost(const ModelConfig& cfg, DType matrix_dtype, int64_t B, int64_t T) const override {
    // the attention half as the dense kind prices it with no MLP, plus the active experts: each
    // token runs the router and k experts' three matrices (forward, recompute and backward: 8 N x)
    ModelConfig att = cfg;
    att.intermediate_size = 0;
    LayerCost c = dense_layer_kind().cost(att, matrix_dtype, B, T);
    const double N = double(B) * double(T), C = double(cfg.hidden_size), E = double(m_.E);
    const double K = double(m_.K), I = double(m_.I);
    c.matmul_flops += 8 * N * (E * C + K * 3 * I * C);
    const double f32_elems = 4 * N * K * C + 3 * N * K * I + 4 * N * E;  // gather, combine, SwiGLU, routing
    c.elementwise_bytes += 4 * 4 * f32_elems + (matrix_dtype == DType::bf16 ? 4 * 6 * (N * K * (C + I)) : 0);
    return c;
  }

  void forward(Device& dev, float* out, const float* x, const LayerTensors& w, const TokenContext& ctx,
               const LayerScratch& ws, const LayerDims& d, Stream s) const override {
    STRATA_ASSERT(out != x, "MoE layer forward: out aliases x");
    Carved c = carve(m_, ws);
    layer_attention_block_forward(dev, x, attention_weights(w), ctx, c.att, attention_dims(d), s);
    sparse_forward(dev, w, c, d, s, ctx.moe_aux);
    combine(dev, out, c, d, s);
  }

  void backward(Device& dev, float* dx, const LayerGradTensors& g, const float* dout, const float* x,
                const LayerTensors& w, const TokenContext& ctx, const LayerScratch& ws, const LayerDims& d,
                Stream s) const override {
    Carved c = carve(m_, ws);
    layer_attention_block_forward(dev, x, attention_weights(w), ctx, c.att, attention_dims(d), s);  // recompute
    const MoeRouting r = sparse_forward(dev, w, c, d, s, nullptr);
    backward_from(dev, dx, g, dout, x, w, ctx, c, r, d, s);
  }

  void backward_saved(Device& dev, float* dx, const LayerGradTensors& g, const float* dout, const float* x,
                      const LayerTensors& w, const TokenContext& ctx, const LayerScratch& ws, const LayerDims& d,
                      Stream s) const override {
    Carved c = carve(m_, ws);
    const MoeRouting r = route_on_host(dev, m_, c.moe.logits, d.N(), s);  // the forward's, again
    backward_from(dev, dx, g, dout, x, w, ctx, c, r, d, s);
  }

  LayerAttention attention(const LayerScratch& ws) const override {
    const Carved c = carve(m_, ws);
    return {c.att.q, c.att.k, c.att.v, c.att.attn};
  }
  void forward_qkv(Device& dev, const float* x, const LayerTensors& w, const TokenContext& ctx,
                   const LayerScratch& ws, const LayerDims& d, Stream s) const override {
    Carved c = carve(m_, ws);
    layer_forward_qkv(dev, x, attention_weights(w), ctx, c.att, attention_dims(d), s);
  }
  void forward_from_attention(Device& dev, float* out, const float* x, const LayerTensors& w,
                              const LayerScratch& ws, const LayerDims& d, Stream s) const override {
    forward_from_attention_routed(dev, out, x, w, ws, d, s, nullptr);
  }
  // fetch (may be null): told the routed experts before their weights are read
  void forward_from_attention_routed(Device& dev, float* out, const float* x, const LayerTensors& w,
                                     const LayerScratch& ws, const LayerDims& d, Stream s,
                                     const MoeExpertFetch* fetch) const {
    STRATA_ASSERT(out != x, "MoE layer forward: out aliases x");
    Carved c = carve(m_, ws);
    layer_attention_out_forward(dev, x, attention_weights(w), c.att, attention_dims(d), s);
    sparse_forward(dev, w, c, d, s, nullptr, fetch);
    combine(dev, out, c, d, s);
  }

 private:
  const void* expert(const LayerTensors& w, int64_t x, size_t which) const {
    return w.param[kExperts + size_t(x) * kPerExpert + which];
  }
  float* expert_grad(const LayerGradTensors& g, int64_t x, size_t which) const {
    return g.param[kExperts + size_t(x) * kPerExpert + which];
  }

  // c (rows, n) = a (rows, k) W^T with W (n, k) of dtype wt; a f32 at `a`, or its bf16 copy at ab.
  static void linear(Device& dev, float* c, const float* a, const bf16* ab, const void* w, int64_t rows, int64_t n,
                     int64_t k, const LayerDims& d, Stream s) {
    if (d.wt == DType::f32) dev.matmul(c, a, w, DType::f32, rows, n, k, false, true, 0.f, s);
    else dev.matmul(c, ab, w, DType::bf16, rows, n, k, false, true, 0.f, s);
  }

  // y (n, o) += (x A^T) B'^T for an adapter (none: nothing) whose A (r, i) and B' (o, r) sit at
  // float offsets a_at and b_at of ad's (an expert's, in the packed experts' A and B); f32, u (n, r).
  static void adapter_forward(Device& dev, float* y, const float* x, const LoraLinear& ad, int64_t a_at, int64_t b_at,
                              float* u, int64_t n, int64_t o, int64_t i, int64_t r, Stream s) {
    if (!ad.a) return;
    dev.matmul(u, x, ad.a + a_at, DType::f32, n, r, i, false, true, 0.f, s);      // u (n,r) = x A^T
    dev.matmul(y, u, ad.b + b_at, DType::f32, n, o, r, false, true, 1.f, s);      // y += u B'^T
  }
  // Its backward from dy (n, o), the same adapter and x: dx (n, i) += (dy B') A ; dA += (dy B')^T x ;
  // dB' += dy^T (x A^T); t, u (n, r) scratch.
  static void adapter_backward(Device& dev, float* dx, const LoraLinearGrads& g, const float* dy, const float* x,
                               const LoraLinear& ad, int64_t a_at, int64_t b_at, float* t, float* u, int64_t n,
                               int64_t o, int64_t i, int64_t r, Stream s) {
    if (!ad.a) return;
    dev.matmul(t, dy, ad.b + b_at, DType::f32, n, r, o, false, false, 0.f, s);    // t (n,r) = dy B'
    dev.matmul(dx, t, ad.a + a_at, DType::f32, n, i, r, false, false, 1.f, s);    // dx += t A
    dev.matmul(g.a + a_at, t, x, DType::f32, r, i, n, true, false, 1.f, s);       // dA += t^T x
    dev.matmul(u, x, ad.a + a_at, DType::f32, n, r, i, false, true, 0.f, s);      // u = x A^T
    dev.matmul(g.b + b_at, dy, u, DType::f32, o, r, n, true, false, 1.f, s);      // dB' += dy^T u
  }

  // From xn2 (in c.att) to the experts' outputs y (M, C): the router, the routing (uploaded into
  // the workspace), the gather, and the grouped GEMMs. With aux, the forward adds the layer's
  // counts and probability sums to the micro-batch's load-balancing loss.
  MoeRouting sparse_forward(Device& dev, const LayerTensors& w, Carved& c, const LayerDims& d, Stream s,
                            MoeAuxLoss* aux, const MoeExpertFetch* fetch = nullptr) const {
    const int64_t N = d.N(), C = d.C, E = m_.E, I = m_.I, M = N * m_.K;
    MoeWorkspace& mw = c.moe;
    const bf16* xn2_b = d.wt == DType::bf16 ? c.att.cast_a : nullptr;  // left there by the attention half
    linear(dev, mw.logits, c.att.xn2, xn2_b, w.param[kRouter], N, E, C, d, s);
    adapter_forward(dev, mw.logits, c.att.xn2, w.lora[kLayerRouter], 0, 0, mw.lora_u, N, E, C, d.lora_r, s);
    MoeRouting r = route_on_host(dev, m_, mw.logits, N, s);
    HostStaging& st = staging();
    st.ints.assign(r.row_token.begin(), r.row_token.end());
    st.ints.insert(st.ints.end(), r.token_row.begin(), r.token_row.end());
    st.floats = r.row_weight;
    dev.copy_h2d(mw.row_token, st.ints.data(), size_t(M) * sizeof(int32_t), s);
    dev.copy_h2d(mw.token_row, st.ints.data() + M, size_t(M) * sizeof(int32_t), s);
    dev.copy_h2d(mw.row_weight, st.floats.data(), size_t(M) * sizeof(float), s);
    if (aux) {
      STRATA_ASSERT(aux->experts == E, "the load-balancing loss was sized for ", aux->experts, " experts, not ", E);
      for (int32_t x : r.expert) aux->count[size_t(x)] += 1;
      for (int64_t t = 0; t < N; ++t)
        for (int64_t x = 0; x < E; ++x) aux->prob_sum[size_t(x)] += r.probs[size_t(t * E + x)];
      aux->rows += double(N);
    }
    if (fetch) {  // the routed decode: only these experts' weights are uploaded, now
      std::vector<int32_t> used;
      for (int64_t x = 0; x < E; ++x)
        if (r.expert_rows(x) > 0) used.push_back(int32_t(x));
      (*fetch)(used);
    }

    dev.embedding_forward(mw.xg, c.att.xn2, DType::f32, mw.row_token, M, C, s);  // xg (M,C) = xn2 rows
    if (d.wt == DType::bf16) dev.cast_f32_to_bf16(mw.cast, mw.xg, M * C, s);
    for (int64_t x = 0; x < E; ++x) {
      const int64_t o = r.offsets[size_t(x)], rows = r.expert_rows(x);
      if (rows == 0) continue;
      linear(dev, mw.gate + o * I, mw.xg + o * C, mw.cast + o * C, expert(w, x, 0), rows, I, C, d, s);
      linear(dev, mw.up + o * I, mw.xg + o * C, mw.cast + o * C, expert(w, x, 1), rows, I, C, d, s);
      if (const LoraLinear& gu = w.lora[kLayerExpertsGateUp]; gu.a) {  // u = xg A_x^T ; gate += u Bg^T ; up += u Bu^T
        const int64_t r = d.lora_r;
        const float* a = gu.a + x * r * C;
        const float* b = gu.b + x * 2 * I * r;  // (2I, r): gate's rows, then up's
        float* u = mw.lora_u + o * r;
        dev.matmul(u, mw.xg + o * C, a, DType::f32, rows, r, C, false, true, 0.f, s);
        dev.matmul(mw.gate + o * I, u, b, DType::f32, rows, I, r, false, true, 1.f, s);
        dev.matmul(mw.up + o * I, u, b + I * r, DType::f32, rows, I, r, false, true, 1.f, s);
      }
    }
    if (d.wt == DType::bf16) dev.swiglu_forward_bf16(mw.act, mw.cast, mw.gate, mw.up, M * I, s);
    else dev.swiglu_forward(mw.act, mw.gate, mw.up, M * I, s);
    for (int64_t x = 0; x < E; ++x) {
      const int64_t o = r.offsets[size_t(x)], rows = r.expert_rows(x);
      if (rows == 0) continue;
      linear(dev, mw.y + o * C, mw.act + o * I, mw.cast + o * I, expert(w, x, 2), rows, C, I, d, s);
      adapter_forward(dev, mw.y + o * C, mw.act + o * I, w.lora[kLayerExpertsDown], x * d.lora_r * I,
                      x * C * d.lora_r, mw.lora_u + o * d.lora_r, rows, C, I, d.lora_r, s);
    }
    return r;
  }

  // out (N,C) = h + the routed rows weighted back to their tokens.
  void combine(Device& dev, float* out, Carved& c, const LayerDims& d, Stream s) const {
    const int64_t N = d.N(), C = d.C;
    dev.copy_d2d(out, c.att.h, size_t(N * C) * sizeof(float), s);
    dev.moe_combine_forward(out, c.moe.y, c.moe.row_weight, c.moe.token_row, N, m_.K, C, s);
  }

  // dx from dout with the forward's activations in c and its routing r.
  void backward_from(Device& dev, float* dx, const LayerGradTensors& g, const float* dout, const float* x,
                     const LayerTensors& w, const TokenContext& ctx, Carved& c, const MoeRouting& r,
                     const LayerDims& d, Stream s) const {
    STRATA_ASSERT(dx != dout && dx != x, "MoE layer backward: dx aliases an input");
    const int64_t N = d.N(), C = d.C, E = m_.E, I = m_.I, M = N * m_.K;
    const bool bf = d.wt == DType::bf16;
    const DType wt = d.wt;
    MoeWorkspace& mw = c.moe;
    // dy (M,C) = w dout[token], dw (M) = dout[token] . y
    dev.moe_combine_backward(mw.dy, mw.dw, dout, mw.y, mw.row_weight, mw.row_token, M, C, s);

    // down: dact = dy Wd ; dWd += dy^T act
    if (bf) {
      dev.cast_f32_to_bf16(mw.cast_b, mw.dy, M * C, s);
      dev.cast_f32_to_bf16(mw.cast, mw.act, M * I, s);
    }
    for (int64_t e = 0; e < E; ++e) {
      const int64_t o = r.offsets[size_t(e)], rows = r.expert_rows(e);
      if (rows == 0) continue;
      const void* dy = bf ? static_cast<const void*>(mw.cast_b + o * C) : mw.dy + o * C;
      const void* act = bf ? static_cast<const void*>(mw.cast + o * I) : mw.act + o * I;
      dev.matmul(mw.dact + o * I, dy, expert(w, e, 2), wt, rows, I, C, false, false, 0.f, s);
      if (float* gd = expert_grad(g, e, 2)) dev.matmul(gd, dy, act, wt, C, I, rows, true, false, 1.f, s);
      const int64_t rank = d.lora_r;  // the adapter reads the f32 dy and act
      adapter_backward(dev, mw.dact + o * I, g.lora[kLayerExpertsDown], mw.dy + o * C, mw.act + o * I,
                       w.lora[kLayerExpertsDown], e * rank * I, e * C * rank, mw.lora_t + o * rank,
                       mw.lora_u + o * rank, rows, C, I, rank, s);
    }
    dev.swiglu_backward(mw.dgate, mw.dup, mw.dact, mw.gate, mw.up, M * I, s);
    // gate and up: dxg = dgate Wg + dup Wu ; dWg += dgate^T xg ; dWu += dup^T xg
    if (bf) dev.cast_f32_to_bf16(mw.cast, mw.xg, M * C, s);
    for (size_t which : {size_t(0), size_t(1)}) {
      float* dz = which == 0 ? mw.dgate : mw.dup;
      if (bf) dev.cast_f32_to_bf16(mw.cast_b, dz, M * I, s);
      for (int64_t e = 0; e < E; ++e) {
        const int64_t o = r.offsets[size_t(e)], rows = r.expert_rows(e);
        if (rows == 0) continue;
        const void* dze = bf ? static_cast<const void*>(mw.cast_b + o * I) : dz + o * I;
        const void* xg = bf ? static_cast<const void*>(mw.cast + o * C) : mw.xg + o * C;
        dev.matmul(mw.dxg + o * C, dze, expert(w, e, which), wt, rows, C, I, false, false, which == 0 ? 0.f : 1.f,
                   s);
        if (float* gw = expert_grad(g, e, which)) dev.matmul(gw, dze, xg, wt, I, C, rows, true, false, 1.f, s);
      }
    }
    // the experts' fused gate_up adapters: t = dgate Bg' + dup Bu' ; dxg += t A ; dA += t^T xg ;
    // u = xg A^T ; dBg' += dgate^T u ; dBu' += dup^T u (f32, per expert)
    if (const LoraLinear& gu = w.lora[kLayerExpertsGateUp]; gu.a) {
      const LoraLinearGrads& gg = g.lora[kLayerExpertsGateUp];
      const int64_t rank = d.lora_r;
      for (int64_t e = 0; e < E; ++e) {
        const int64_t o = r.offsets[size_t(e)], rows = r.expert_rows(e);
        if (rows == 0) continue;
        const float* a = gu.a + e * rank * C;            // A_e (r, C)
        const float* bg = gu.b + e * 2 * I * rank;       // B_e's gate rows (I, r), then its up rows
        const float* bu = bg + I * rank;
        float* t = mw.lora_t + o * rank;                 // (rows, r)
        float* u = mw.lora_u + o * rank;                 // (rows, r)
        const float* xg = mw.xg + o * C;
        dev.matmul(t, mw.dgate + o * I, bg, DType::f32, rows, rank, I, false, false, 0.f, s);   // t = dgate Bg'
        dev.matmul(t, mw.dup + o * I, bu, DType::f32, rows, rank, I, false, false, 1.f, s);     // t += dup Bu'
        dev.matmul(mw.dxg + o * C, t, a, DType::f32, rows, C, rank, false, false, 1.f, s);      // dxg += t A
        dev.matmul(gg.a + e * rank * C, t, xg, DType::f32, rank, C, rows, true, false, 1.f, s); // dA += t^T xg
        dev.matmul(u, xg, a, DType::f32, rows, rank, C, false, true, 0.f, s);                  // u = xg A^T
        float* gbg = gg.b + e * 2 * I * rank;
        dev.matmul(gbg, mw.dgate + o * I, u, DType::f32, I, rank, rows, true, false, 1.f, s);  // dBg' += dgate^T u
        dev.matmul(gbg + I * rank, mw.dup + o * I, u, DType::f32, I, rank, rows, true, false, 1.f, s);
      }
    }
    // d xn2 (N,C): the rows scattered back to their tokens (unweighted: the weights are in dy)
    dev.memset_zero(c.att.dxn, size_t(N * C) * sizeof(float), s);
    dev.moe_combine_forward(c.att.dxn, mw.dxg, nullptr, mw.token_row, N, m_.K, C, s);

    // the router: dw back on the host, through the renormalisation and the softmax
    HostStaging& st = staging();
    st.dw.resize(size_t(M));
    dev.copy_d2h(st.dw.data(), mw.dw, size_t(M) * sizeof(float), s);
    dev.stream_synchronize(s);
    st.dlogits.resize(size_t(N * E));
    const std::vector<double> aux_dprob = ctx.moe_aux ? ctx.moe_aux->dprob() : std::vector<double>{};
    moe_route_backward(st.dlogits.data(), r, st.dw.data(), ctx.moe_aux ? aux_dprob.data() : nullptr);
    dev.copy_h2d(mw.dlogits, st.dlogits.data(), st.dlogits.size() * sizeof(float), s);
    const void* dl = mw.dlogits;
    const void* xn2 = c.att.xn2;
    if (bf) {
      dev.cast_f32_to_bf16(mw.cast_b, mw.dlogits, N * E, s);
      dev.cast_f32_to_bf16(mw.cast, c.att.xn2, N * C, s);
      dl = mw.cast_b;
      xn2 = mw.cast;
    }
    dev.matmul(c.att.dxn, dl, w.param[kRouter], wt, N, C, E, false, false, 1.f, s);            // dxn2 += dl Wr
    if (float* gr = g.param[kRouter]) dev.matmul(gr, dl, xn2, wt, E, C, N, true, false, 1.f, s);  // dWr += dl^T xn2
    adapter_backward(dev, c.att.dxn, g.lora[kLayerRouter], mw.dlogits, c.att.xn2, w.lora[kLayerRouter], 0, 0,
                     mw.lora_t, mw.lora_u, N, E, C, d.lora_r, s);  // the router's adapter (f32)

    LayerGrads ag = attention_grads(g);
    layer_attention_block_backward(dev, dx, ag, dout, x, attention_weights(w), ctx, c.att, attention_dims(d), s);
  }

  MoeShape m_;
};

}  // namespace

bool moe_kind_expert_params(const LayerKind& kind, MoeExpertParams* out) {
  const auto* moe = dynamic_cast<const MoeLayerKind*>(&kind);
  if (!moe) return false;
  *out = MoeExpertParams{kExperts, kPerExpert, moe->shape().E, kRouter};
  return true;
}

void moe_forward_from_attention_routed(const LayerKind& kind, Device& dev, float* out, const float* x,
                                       const LayerTensors& w, const LayerScratch& ws, const LayerDims& d, Stream s,
                                       const MoeExpertFetch& fetch) {
  const auto* moe = dynamic_cast<const MoeLayerKind*>(&kind);
  STRATA_ASSERT(moe, "a routed forward of a layer kind that is not mixture-of-experts (", kind.name(), ")");
  moe->forward_from_attention_routed(dev, out, x, w, ws, d, s, &fetch);
}

const LayerKind& moe_layer_kind(const ModelConfig& cfg) {
  STRATA_CHECK(cfg.num_experts > 0, "config has no experts: not a mixture-of-experts model");
  const MoeShape want{cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size, cfg.norm_topk_prob,
                      cfg.family == "mixtral"};
  static std::mutex mu;
  static std::deque<MoeLayerKind> kinds;  // never shrinks: layers point at them
  std::lock_guard lock(mu);
  for (const MoeLayerKind& k : kinds)
    if (k.shape() == want) return k;
  return kinds.emplace_back(want);
}

}  // namespace strata
