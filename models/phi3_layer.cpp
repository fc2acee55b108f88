// Phi-3's layer kind: its parameter list (the fused qkv_proj and gate_up_proj), and the dense
// layer's math (models/decoder_layer.h) on row ranges of the fused tensors, with LongRoPE's table
// chosen per micro-batch. See models/phi3_layer.h.
#include "models/phi3_layer.h"

#include <deque>
#include <mutex>

#include "models/decoder_layer.h"
#include "models/dense_layer.h"
#include "src/core/error.h"

namespace strata {
namespace {

// The kind's parameters, in row order.
enum Param : size_t { kInputNorm, kQkv, kO, kPostNorm, kGateUp, kDown, kParams };
// decoder_layer.h's LoRA slots (LayerWeights::lora): q, k, v, o, gate, up, down.
enum Slot { kSlotQ, kSlotK, kSlotV, kSlotO, kSlotGate, kSlotUp, kSlotDown };

LayerWorkspace carve(const LayerScratch& s) {
  LayerWorkspace ws = s.backward ? layer_workspace_carve(s.capacity, s.base)
                                 : layer_forward_workspace_carve(s.capacity, s.base);
  return s.activations ? layer_workspace_with_activations(ws, s.capacity, s.activations) : ws;
}

// Row `row` of a (rows, cols) matrix of dtype wt at p (null stays null).
const void* rows_at(const void* p, int64_t row, int64_t cols, DType wt) {
  return p ? static_cast<const char*>(p) + size_t(row * cols) * dtype_size(wt) : nullptr;
}
float* rows_at(float* p, int64_t row, int64_t cols) { return p ? p + row * cols : nullptr; }

// An adapter on a fused linear as the adapter of its part starting at output row `row`: the same
// A (and its gradient), B's rows from `row` (B is (O, r)).
LoraLinear part_of(const LoraLinear& fused, int64_t row, int64_t r) {
  LoraLinear p = fused;
  if (p.b) p.b += row * r;
  return p;
}
LoraLinearGrads part_of(const LoraLinearGrads& fused, int64_t row, int64_t r) {
  LoraLinearGrads p = fused;
  if (p.b) p.b += row * r;
  return p;
}

class Phi3LayerKind final : public LayerKind {
 public:
  Phi3LayerKind(bool sliding, int64_t longrope_original) : sliding_(sliding), longrope_original_(longrope_original) {}
  const char* name() const override { return sliding_ ? "phi3_sliding" : "phi3"; }
  bool is(bool sliding, int64_t longrope_original) const {
    return sliding_ == sliding && longrope_original_ == longrope_original;
  }
  int64_t attention_window(const LayerDims& d) const override { return sliding_ ? d.window : 0; }

  std::vector<LayerParam> params(const ModelConfig& cfg) const override {
    const int64_t C = cfg.hidden_size, H = cfg.num_attention_heads, Hk = cfg.num_key_value_heads;
    const int64_t D = cfg.head_dim, F = cfg.intermediate_size;
    std::vector<LayerParam> p(kParams);
    p[kInputNorm] = {"input_layernorm.weight", {C}, -1, true};
    p[kQkv] = {"self_attn.qkv_proj.weight", {H * D + 2 * Hk * D, C}, kLayerQkv};
    p[kO] = {"self_attn.o_proj.weight", {C, H * D}, 3};
    p[kPostNorm] = {"post_attention_layernorm.weight", {C}, -1, true};
    p[kGateUp] = {"mlp.gate_up_proj.weight", {2 * F, C}, kLayerGateUp};
    p[kDown] = {"mlp.down_proj.weight", {C, F}, 6};
    return p;
  }

  size_t bytes(LayerBuffer what, const LayerDims& d) const override {
    switch (what) {
      case LayerBuffer::workspace: return layer_workspace_bytes(d);
      case LayerBuffer::forward_workspace: return layer_forward_workspace_bytes(d);
      case LayerBuffer::activations: return layer_activation_bytes(d);
    }
    return 0;
  }

  // The dense layer's work: the fused matrices hold the same weights as its seven.
  LayerCost cost(const ModelConfig& cfg, DType matrix_dtype, int64_t B, int64_t T) const override {
    return dense_layer_kind(sliding_).cost(cfg, matrix_dtype, B, T);
  }

  void forward(Device& dev, float* out, const float* x, const LayerTensors& w, const TokenContext& ctx,
               const LayerScratch& ws, const LayerDims& d, Stream s) const override {
    LayerWorkspace c = carve(ws);
    layer_forward(dev, out, x, weights(w, d), rope(ctx, d), c, at(d), s);
  }

  void backward(Device& dev, float* dx, const LayerGradTensors& g, const float* dout, const float* x,
                const LayerTensors& w, const TokenContext& ctx, const LayerScratch& ws, const LayerDims& d,
                Stream s) const override {
    LayerWorkspace c = carve(ws);
    LayerGrads lg = grads(g, d);
    layer_backward(dev, dx, lg, dout, x, weights(w, d), rope(ctx, d), c, at(d), s);
  }

  void backward_saved(Device& dev, float* dx, const LayerGradTensors& g, const float* dout, const float* x,
                      const LayerTensors& w, const TokenContext& ctx, const LayerScratch& ws, const LayerDims& d,
                      Stream s) const override {
    LayerWorkspace c = carve(ws);
    LayerGrads lg = grads(g, d);
    layer_backward_saved(dev, dx, lg, dout, x, weights(w, d), rope(ctx, d), c, at(d), s);
  }

  LayerAttention attention(const LayerScratch& ws) const override {
    const LayerWorkspace c = carve(ws);
    return {c.q, c.k, c.v, c.attn};
  }

  void forward_qkv(Device& dev, const float* x, const LayerTensors& w, const TokenContext& ctx,
                   const LayerScratch& ws, const LayerDims& d, Stream s) const override {
    LayerWorkspace c = carve(ws);
    layer_forward_qkv(dev, x, weights(w, d), rope(ctx, d), c, at(d), s);
  }

  void forward_from_attention(Device& dev, float* out, const float* x, const LayerTensors& w,
                              const LayerScratch& ws, const LayerDims& d, Stream s) const override {
    LayerWorkspace c = carve(ws);
    layer_forward_from_attention(dev, out, x, weights(w, d), c, at(d), s);
  }

 private:
  bool sliding_;
  int64_t longrope_original_;  // 0: no LongRoPE

  LayerDims at(const LayerDims& d) const {
    LayerDims e = d;
    e.window = attention_window(d);
    return e;
  }

  // The micro-batch's RoPE table: LongRoPE's long one when its positions pass the original length.
  TokenContext rope(const TokenContext& ctx, const LayerDims& d) const {
    if (longrope_original_ == 0) return ctx;
    STRATA_ASSERT(d.max_pos >= 0, "a LongRoPE layer needs the micro-batch's largest position (LayerDims::max_pos)");
    TokenContext c = ctx;
    if (int64_t(d.max_pos) + 1 > longrope_original_) c.inv_freq += d.rotary() / 2;
    return c;
  }

  // The dense layer's weights as row ranges of the fused ones (the adapters likewise).
  LayerWeights weights(const LayerTensors& t, const LayerDims& d) const {
    STRATA_ASSERT(t.param.size() == kParams, "a phi3 layer has ", size_t(kParams), " tensors, not ", t.param.size());
    const int64_t C = d.C, QD = d.H * d.D, KD = d.Hk * d.D, F = d.F, r = d.lora_r;
    LayerWeights w;
    w.input_norm = static_cast<const float*>(t.param[kInputNorm]);
    w.post_norm = static_cast<const float*>(t.param[kPostNorm]);
    w.q = rows_at(t.param[kQkv], 0, C, d.wt);
    w.k = rows_at(t.param[kQkv], QD, C, d.wt);
    w.v = rows_at(t.param[kQkv], QD + KD, C, d.wt);
    w.o = t.param[kO];
    w.gate = rows_at(t.param[kGateUp], 0, C, d.wt);
    w.up = rows_at(t.param[kGateUp], F, C, d.wt);
    w.down = t.param[kDown];
    const LoraLinear& qkv = t.lora[kLayerQkv];
    const LoraLinear& gu = t.lora[kLayerGateUp];
    if (qkv.a) w.lora[kSlotQ] = part_of(qkv, 0, r), w.lora[kSlotK] = part_of(qkv, QD, r),
               w.lora[kSlotV] = part_of(qkv, QD + KD, r);
    if (gu.a) w.lora[kSlotGate] = part_of(gu, 0, r), w.lora[kSlotUp] = part_of(gu, F, r);
    w.lora[kSlotO] = t.lora[kSlotO];
    w.lora[kSlotDown] = t.lora[kSlotDown];
    return w;
  }

  LayerGrads grads(const LayerGradTensors& t, const LayerDims& d) const {
    STRATA_ASSERT(t.param.size() == kParams, "a phi3 layer has ", size_t(kParams), " gradients, not ", t.param.size());
    const int64_t C = d.C, QD = d.H * d.D, KD = d.Hk * d.D, F = d.F, r = d.lora_r;
    LayerGrads g;
    g.input_norm = t.param[kInputNorm];
    g.post_norm = t.param[kPostNorm];
    g.q = rows_at(t.param[kQkv], 0, C);
    g.k = rows_at(t.param[kQkv], QD, C);
    g.v = rows_at(t.param[kQkv], QD + KD, C);
    g.o = t.param[kO];
    g.gate = rows_at(t.param[kGateUp], 0, C);
    g.up = rows_at(t.param[kGateUp], F, C);
    g.down = t.param[kDown];
    const LoraLinearGrads& qkv = t.lora[kLayerQkv];
    const LoraLinearGrads& gu = t.lora[kLayerGateUp];
    if (qkv.a) g.lora[kSlotQ] = part_of(qkv, 0, r), g.lora[kSlotK] = part_of(qkv, QD, r),
               g.lora[kSlotV] = part_of(qkv, QD + KD, r);
    if (gu.a) g.lora[kSlotGate] = part_of(gu, 0, r), g.lora[kSlotUp] = part_of(gu, F, r);
    g.lora[kSlotO] = t.lora[kSlotO];
    g.lora[kSlotDown] = t.lora[kSlotDown];
    return g;
  }
};

}  // namespace

const LayerKind& phi3_layer_kind(const ModelConfig& cfg, bool sliding) {
  STRATA_CHECK(cfg.family == "phi3", "phi3_layer_kind: config family is ", cfg.family, ", not phi3");
  const int64_t original =
      cfg.rope_scaling.type == "longrope" ? cfg.rope_scaling.original_max_position_embeddings : 0;
  static std::mutex mu;
  static std::deque<Phi3LayerKind> kinds;  // never shrinks: layers point at them
  std::lock_guard lock(mu);
  for (const Phi3LayerKind& k : kinds)
    if (k.is(sliding, original)) return k;
  return kinds.emplace_back(sliding, original);
}

}  // namespace strata
