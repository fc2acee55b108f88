// The dense layer kind: its parameter list, and the seam's calls mapped onto decoder_layer.h.
#include "models/dense_layer.h"

#include <algorithm>
#include <iterator>
#include <type_traits>

#include "src/core/error.h"

namespace strata {
namespace {

// The kind's parameters, in row order (LayerParamRows' order).
enum Param : size_t { kInputNorm, kQ, kK, kV, kO, kQBias, kKBias, kVBias, kOBias, kQNorm, kKNorm, kPostNorm,
                      kGate, kUp, kDown, kParams };

LayerWorkspace carve(const LayerScratch& s) {
  LayerWorkspace ws = s.backward ? layer_workspace_carve(s.capacity, s.base)
                                 : layer_forward_workspace_carve(s.capacity, s.base);
  return s.activations ? layer_workspace_with_activations(ws, s.capacity, s.activations) : ws;
}

// layer_backward or layer_backward_saved on the seam's views.
using DenseBackward = void (*)(Device&, float*, LayerGrads&, const float*, const float*, const LayerWeights&,
                               const TokenContext&, LayerWorkspace&, const LayerDims&, Stream);
void backward_with(DenseBackward backward, Device& dev, float* dx, const LayerGradTensors& g, const float* dout,
                   const float* x, const LayerTensors& w, const TokenContext& ctx, const LayerScratch& ws,
                   const LayerDims& d, Stream s);

class DenseLayerKind final : public LayerKind {
 public:
  explicit DenseLayerKind(bool sliding) : sliding_(sliding) {}
  const char* name() const override { return sliding_ ? "dense_sliding" : "dense"; }
  int64_t attention_window(const LayerDims& d) const override { return sliding_ ? d.window : 0; }

  std::vector<LayerParam> params(const ModelConfig& cfg) const override {
    STRATA_CHECK(!cfg.mlp_bias, "config.json sets mlp_bias = true, which strata does not support yet");
    const int64_t C = cfg.hidden_size, H = cfg.num_attention_heads, Hk = cfg.num_key_value_heads;
    const int64_t D = cfg.head_dim, F = cfg.intermediate_size;
    auto when = [](bool present, Shape s) { return present ? s : Shape{}; };
    std::vector<LayerParam> p(kParams);
    p[kInputNorm] = {"input_layernorm.weight", {C}, -1, true};
    p[kQ] = {"self_attn.q_proj.weight", {H * D, C}, 0};
    p[kK] = {"self_attn.k_proj.weight", {Hk * D, C}, 1};
    p[kV] = {"self_attn.v_proj.weight", {Hk * D, C}, 2};
    p[kO] = {"self_attn.o_proj.weight", {C, H * D}, 3};
    p[kQBias] = {"self_attn.q_proj.bias", when(cfg.qkv_bias, {H * D})};
    p[kKBias] = {"self_attn.k_proj.bias", when(cfg.qkv_bias, {Hk * D})};
    p[kVBias] = {"self_attn.v_proj.bias", when(cfg.qkv_bias, {Hk * D})};
    p[kOBias] = {"self_attn.o_proj.bias", when(cfg.o_bias, {C})};
    p[kQNorm] = {"self_attn.q_norm.weight", when(cfg.qk_norm, {D}), -1, true};
    p[kKNorm] = {"self_attn.k_norm.weight", when(cfg.qk_norm, {D}), -1, true};
    p[kPostNorm] = {"post_attention_layernorm.weight", {C}, -1, true};
    p[kGate] = {"mlp.gate_proj.weight", {F, C}, 4};
    p[kUp] = {"mlp.up_proj.weight", {F, C}, 5};
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

  LayerCost cost(const ModelConfig& cfg, DType matrix_dtype, int64_t B, int64_t T) const override {
    const double N = double(B) * double(T), C = double(cfg.hidden_size), F = double(cfg.intermediate_size);
    const double H = double(cfg.num_attention_heads), Hk = double(cfg.num_key_value_heads), D = double(cfg.head_dim);
    double matrix = 0;
    for (const LayerParam& p : params(cfg))
      if (p.shape.size() == 2) matrix += double(shape_numel(p.shape));
    // causal 64 x 64 tiles (kernels/cpu/attention.cpp): query tile [q0, q1) meets keys [0, q1),
    // or with a sliding window W from q0 - W + 1 on
    const int64_t W = sliding_ ? cfg.sliding_window : 0;
    double tile_pairs = 0;
    for (int64_t q0 = 0; q0 < T; q0 += 64) {
      const int64_t q1 = std::min<int64_t>(T, q0 + 64);
      const int64_t k0 = W > 0 ? std::max<int64_t>(0, q0 - W + 1) / 64 * 64 : 0;
      tile_pairs += double(q1 - q0) * double(q1 - k0);
    }
    LayerCost w;
    w.matmul_flops = 8 * N * matrix;
    w.attention_flops = 9 * 2 * double(B) * H * tile_pairs * D;
    const double f32_elems = 10 * N * C + (cfg.qk_norm ? 4 : 2) * N * (H + Hk) * D + 3 * N * F;  // norms, adds, RoPE, SwiGLU
    const double cast_elems = matrix_dtype == DType::bf16 ? 2 * N * C + N * H * D + N * F : 0;  // matmul inputs
    w.elementwise_bytes = 4 * (4 * f32_elems + 6 * cast_elems);
    return w;
  }

  void forward(Device& dev, float* out, const float* x, const LayerTensors& w, const TokenContext& ctx,
               const LayerScratch& ws, const LayerDims& d, Stream s) const override {
    LayerWorkspace c = carve(ws);
    layer_forward(dev, out, x, dense_layer_weights(w), ctx, c, at(d), s);
  }

  void backward(Device& dev, float* dx, const LayerGradTensors& g, const float* dout, const float* x,
                const LayerTensors& w, const TokenContext& ctx, const LayerScratch& ws, const LayerDims& d,
                Stream s) const override {
    backward_with(layer_backward, dev, dx, g, dout, x, w, ctx, ws, at(d), s);
  }

  void backward_saved(Device& dev, float* dx, const LayerGradTensors& g, const float* dout, const float* x,
                      const LayerTensors& w, const TokenContext& ctx, const LayerScratch& ws, const LayerDims& d,
                      Stream s) const override {
    backward_with(layer_backward_saved, dev, dx, g, dout, x, w, ctx, ws, at(d), s);
  }

  LayerAttention attention(const LayerScratch& ws) const override {
    const LayerWorkspace c = carve(ws);
    return {c.q, c.k, c.v, c.attn};
  }

  void forward_qkv(Device& dev, const float* x, const LayerTensors& w, const TokenContext& ctx,
                   const LayerScratch& ws, const LayerDims& d, Stream s) const override {
    LayerWorkspace c = carve(ws);
    layer_forward_qkv(dev, x, dense_layer_weights(w), ctx, c, at(d), s);
  }

  void forward_from_attention(Device& dev, float* out, const float* x, const LayerTensors& w,
                              const LayerScratch& ws, const LayerDims& d, Stream s) const override {
    LayerWorkspace c = carve(ws);
    layer_forward_from_attention(dev, out, x, dense_layer_weights(w), c, at(d), s);
  }

 private:
  bool sliding_;
  // d as this kind's layers run: its window only where they slide (decoder_layer.h reads d.window).
  LayerDims at(const LayerDims& d) const {
    LayerDims e = d;
    e.window = attention_window(d);
    return e;
  }
};

// A named view (LayerParamRows, LayerWeights, LayerGrads) filled by set(field, position) in
// Param order.
template <class Named, class Set>
Named named_view(size_t count, Set set) {
  STRATA_ASSERT(count == kParams, "a dense layer's view has ", count, " tensors, not ", size_t(kParams));
  Named v;
  set(v.input_norm, kInputNorm), set(v.q, kQ), set(v.k, kK), set(v.v, kV), set(v.o, kO);
  set(v.q_bias, kQBias), set(v.k_bias, kKBias), set(v.v_bias, kVBias), set(v.o_bias, kOBias);
  set(v.q_norm, kQNorm), set(v.k_norm, kKNorm);
  set(v.post_norm, kPostNorm), set(v.gate, kGate), set(v.up, kUp), set(v.down, kDown);
  return v;
}

void backward_with(DenseBackward backward, Device& dev, float* dx, const LayerGradTensors& g, const float* dout,
                   const float* x, const LayerTensors& w, const TokenContext& ctx, const LayerScratch& ws,
                   const LayerDims& d, Stream s) {
  LayerWorkspace c = carve(ws);
  LayerGrads lg = dense_layer_grads(g);
  backward(dev, dx, lg, dout, x, dense_layer_weights(w), ctx, c, d, s);
}

}  // namespace

const LayerKind& dense_layer_kind(bool sliding) {
  static const DenseLayerKind full(false), slides(true);
  return sliding ? slides : full;
}

LayerParamRows dense_layer_rows(const ModelLayer& layer) {
  STRATA_ASSERT(layer.kind == &dense_layer_kind() || layer.kind == &dense_layer_kind(true), "layer of kind ",
                layer.kind->name(), " is not dense");
  return named_view<LayerParamRows>(layer.rows.size(), [&](int64_t& f, size_t i) { f = layer.rows[i]; });
}

LayerWeights dense_layer_weights(const LayerTensors& t) {
  LayerWeights w = named_view<LayerWeights>(t.param.size(), [&](auto& f, size_t i) {
    f = static_cast<std::remove_reference_t<decltype(f)>>(t.param[i]);
  });
  std::copy(std::begin(t.lora), std::end(t.lora), std::begin(w.lora));
  return w;
}

LayerGrads dense_layer_grads(const LayerGradTensors& t) {
  LayerGrads g = named_view<LayerGrads>(t.param.size(), [&](float*& f, size_t i) { f = t.param[i]; });
  std::copy(std::begin(t.lora), std::end(t.lora), std::begin(g.lora));
  return g;
}

}  // namespace strata
