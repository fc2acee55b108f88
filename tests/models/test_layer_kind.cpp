// The layer-kind seam (models/layer_kind.h) from outside the library: a kind defined here, which
// models/ and offload/ never see, runs through the real streaming Engine. Its layer is an MLP
// block with no attention, a non-gated MLP and a norm on the MLP's output (OLMo 2's post-norm
// pattern):
//   xn = rmsnorm(x; w_in) ; u = xn W1^T ; a = u * silu(u) ; y = a W2^T ; out = x + rmsnorm(y; w_post)
// (u * silu(u) is the device's SwiGLU with gate = up = u). A model mixes it with dense layers.
// Checked: streamed == resident and recompute == kept activations, bit for bit; its gradients
// against central finite differences of the engine's own loss; and that the dense kind's
// parameters keep today's Hugging Face names and order for llama, qwen2 and qwen3.
#include <catch2/catch.hpp>
#include <cmath>

#include "models/dense_layer.h"
#include "offload/engine/engine.h"
#include "offload/engine/engine_zo.h"
#include "offload/state/model_io.h"
#include "src/core/align.h"
#include "src/recipe/recipe_modes.h"
#include "tests/seeded_inputs.h"
#include "tests/testing.h"

namespace strata {
namespace {

// Legend as models/layer_kind.h: N tokens, C hidden, F the MLP's width.
class PostNormMlpKind final : public LayerKind {
 public:
  enum Param : size_t { kNormIn, kW1, kW2, kNormPost, kParams };

  const char* name() const override { return "test.post_norm_mlp"; }

  std::vector<LayerParam> params(const ModelConfig& cfg) const override {
    const int64_t C = cfg.hidden_size, F = cfg.intermediate_size;
    std::vector<LayerParam> p(kParams);
    p[kNormIn] = {"mlp_norm.weight", {C}, -1, true};
    p[kW1] = {"mlp.fc_in.weight", {F, C}};
    p[kW2] = {"mlp.fc_out.weight", {C, F}};
    p[kNormPost] = {"post_mlp_norm.weight", {C}, -1, true};
    return p;
  }

  size_t bytes(LayerBuffer what, const LayerDims& d) const override {
    Carve c{d, nullptr};
    if (what == LayerBuffer::workspace) c.backward_scratch();
    return c.offset;
  }

  LayerCost cost(const ModelConfig& cfg, DType, int64_t B, int64_t T) const override {
    const double N = double(B) * double(T), C = double(cfg.hidden_size), F = double(cfg.intermediate_size);
    return {8 * N * 2 * C * F, 0, 4 * 4 * (8 * N * C + 3 * N * F)};
  }

  void forward(Device& dev, float* out, const float* x, const LayerTensors& w, const TokenContext&,
               const LayerScratch& ws, const LayerDims& d, Stream s) const override {
    const Buffers b = carve(ws);
    to_y(dev, x, w, b, d, s);
    dev.rmsnorm_forward(out, b.rstd_y, b.y, f32(w, kNormPost), d.N(), d.C, d.eps, s);
    dev.add_inplace(out, x, d.N() * d.C, s);  // residual
  }

  void backward(Device& dev, float* dx, const LayerGradTensors& g, const float* dout, const float* x,
                const LayerTensors& w, const TokenContext& ctx, const LayerScratch& ws, const LayerDims& d,
                Stream s) const override {
    const Buffers b = carve(ws);
    to_y(dev, x, w, b, d, s);  // recompute
    dev.rmsnorm_forward(b.dy, b.rstd_y, b.y, f32(w, kNormPost), d.N(), d.C, d.eps, s);  // rstd_y; dy is scratch
    backward_saved(dev, dx, g, dout, x, w, ctx, ws, d, s);
  }

  void backward_saved(Device& dev, float* dx, const LayerGradTensors& g, const float* dout, const float* x,
                      const LayerTensors& w, const TokenContext&, const LayerScratch& ws, const LayerDims& d,
                      Stream s) const override {
    const Buffers b = carve(ws);
    const int64_t N = d.N(), C = d.C, F = d.F;
    dev.rmsnorm_backward(b.dy, g.param[kNormPost], dout, b.y, f32(w, kNormPost), b.rstd_y, N, C, s);
    dev.matmul(b.da, b.dy, w.param[kW2], DType::f32, N, F, C, false, false, 0.f, s);           // da = dy W2
    if (g.param[kW2]) dev.matmul(g.param[kW2], b.dy, b.a, DType::f32, C, F, N, true, false, 1.f, s);  // dW2 += dy^T a
    dev.swiglu_backward(b.dgate, b.dup, b.da, b.u, b.u, N * F, s);
    dev.add_inplace(b.dgate, b.dup, N * F, s);  // du: u is both gate and up
    dev.matmul(b.dxn, b.dgate, w.param[kW1], DType::f32, N, C, F, false, false, 0.f, s);      // dxn = du W1
    if (g.param[kW1]) dev.matmul(g.param[kW1], b.dgate, b.xn, DType::f32, F, C, N, true, false, 1.f, s);  // dW1 += du^T xn
    dev.rmsnorm_backward(dx, g.param[kNormIn], b.dxn, x, f32(w, kNormIn), b.rstd_x, N, C, s);
    dev.add_inplace(dx, dout, N * C, s);  // residual
  }

 private:
  struct Buffers {
    float *xn, *rstd_x, *u, *a, *y, *rstd_y;   // activations: (N,C), (N), (N,F), (N,F), (N,C), (N)
    float *dy, *da, *dgate, *dup, *dxn;        // backward scratch: (N,C), (N,F) x3, (N,C)
  };
  struct Carve {
    LayerDims d;
    char* base;
    size_t offset = 0;
    Buffers b{};
    float* take(int64_t count) {
      float* p = base ? reinterpret_cast<float*>(base + offset) : nullptr;
      offset += align_up(size_t(count) * sizeof(float));
      return p;
    }
    void activations() {
      const int64_t N = d.N();
      b.xn = take(N * d.C), b.rstd_x = take(N), b.u = take(N * d.F), b.a = take(N * d.F);
      b.y = take(N * d.C), b.rstd_y = take(N);
    }
    void backward_scratch() {
      const int64_t N = d.N();
      b.dy = take(N * d.C), b.da = take(N * d.F), b.dgate = take(N * d.F), b.dup = take(N * d.F), b.dxn = take(N * d.C);
    }
    Carve(const LayerDims& dims, char* at) : d(dims), base(at) { activations(); }
  };

  static Buffers carve(const LayerScratch& ws) {
    STRATA_CHECK(ws.capacity.wt == DType::f32 && ws.capacity.lora_r == 0, "the test kind runs f32 weights without LoRA");
    Carve c{ws.capacity, ws.base};
    if (ws.backward) c.backward_scratch();
    if (ws.activations) {
      Carve kept{ws.capacity, ws.activations};
      kept.b.dy = c.b.dy, kept.b.da = c.b.da, kept.b.dgate = c.b.dgate, kept.b.dup = c.b.dup, kept.b.dxn = c.b.dxn;
      return kept.b;
    }
    return c.b;
  }

  static const float* f32(const LayerTensors& w, Param p) { return static_cast<const float*>(w.param[p]); }

  // x to y (N,C): fills xn, rstd_x, u, a, y.
  static void to_y(Device& dev, const float* x, const LayerTensors& w, const Buffers& b, const LayerDims& d, Stream s) {
    const int64_t N = d.N(), C = d.C, F = d.F;
    dev.rmsnorm_forward(b.xn, b.rstd_x, x, f32(w, kNormIn), N, C, d.eps, s);
    dev.matmul(b.u, b.xn, w.param[kW1], DType::f32, N, F, C, false, true, 0.f, s);  // u = xn W1^T
    dev.swiglu_forward(b.a, b.u, b.u, N * F, s);                                   // a = u * silu(u)
    dev.matmul(b.y, b.a, w.param[kW2], DType::f32, N, C, F, false, true, 0.f, s);   // y = a W2^T
  }
};

const PostNormMlpKind kPostNormMlp;

constexpr int64_t kLayers = 3, kB = 2, kT = 19, kV = 97;

// dense, the test kind, dense: the workspace must fit both, the weight slots both layer sizes
ModelSpec mixed_spec() {
  const ModelConfig cfg = testing::tiny_llama_config({64, 96, kLayers, kV, 256, false});
  return model_spec_build(cfg, DType::f32, {&dense_layer_kind(), &kPostNormMlp, &dense_layer_kind()});
}

// The mixed model's host store with its initial weights, on a CPU device, and one micro-batch.
struct MixedModel {
  ModelSpec spec = mixed_spec();
  std::unique_ptr<Device> dev = device_create(DeviceOptions{});
  HostStore store{*dev, spec};
  MicroBatch mb = testing::strided_batch(kB, kT, kV, 3);
  MixedModel() { model_init_weights(store, 7, 0.2); }
};

EngineOptions engine_options(const std::string& weights, const std::string& recompute) {
  EngineOptions eo;
  eo.weights = weights_mode_parse(weights), eo.recompute = recompute_mode_parse(recompute);
  eo.checkpoints = CheckpointMode::device;  // every layer's input kept on the device
  eo.max_batch = kB, eo.max_tokens = kT;
  return eo;
}

struct KindRun {
  std::vector<double> losses;
  std::vector<float> grads;    // after the first backward
  std::vector<char> working;   // the weights after two optimizer steps
};

KindRun run_mixed(const std::string& weights, const std::string& recompute) {
  MixedModel m;
  const ModelSpec& spec = m.spec;
  HostStore& store = m.store;
  const MicroBatch& mb = m.mb;
  Engine engine(*m.dev, store, engine_options(weights, recompute));
  AdamWParams ap;
  ap.lr = 1e-2f;
  const float scale = 1.f / float(mb.counted());
  KindRun r;
  r.losses = {engine.forward_backward(mb, scale)};
  engine.synchronize();
  r.grads = std::vector<float>(store.grad(), store.grad() + store.f32_floats());
  engine.optimizer_step(ap, 1.0, 0.01);
  r.losses.push_back(engine.forward_backward(mb, scale));
  engine.optimizer_step(ap, 1.0, 0.01);
  r.losses.push_back(engine.forward_loss(mb));
  engine.synchronize();
  const char* working = store.working();
  r.working = std::vector<char>(working, working + HostStore::layout(spec).working.tier_bytes(Tier::host_pinned));
  return r;
}

}  // namespace

TEST_CASE("a layer kind defined in a test runs through the streaming engine, streamed == resident", "[engine][layer_kind]") {
  const KindRun resident = run_mixed("device", "always");
  for (const char* weights : {"stream", "device"})
    for (const char* recompute : {"always", "never"}) {
      if (std::string(weights) == "device" && std::string(recompute) == "always") continue;
      INFO(weights << ", recompute " << recompute);
      const KindRun r = run_mixed(weights, recompute);
      CHECK(r.losses == resident.losses);
      CHECK(r.grads == resident.grads);
      CHECK(r.working == resident.working);
    }
  CHECK(resident.losses.back() < resident.losses.front());  // it trains
}

// The gradient of each tensor of the test-kind layer (and one dense tensor beside it) along its own
// direction, against the central difference of the engine's forward loss along that direction:
// d/dh L(w + h g/|g|) = |g|. f32 activations, h = 1e-2: agreement to 0.1% of |g| (seen: at most 6e-5).
TEST_CASE("a test layer kind's gradients match finite differences of the engine's loss", "[engine][layer_kind]") {
  MixedModel m;
  const ModelSpec& spec = m.spec;
  HostStore& store = m.store;
  Device* dev = m.dev.get();
  const MicroBatch& mb = m.mb;
  const EngineOptions eo = engine_options("stream", "always");
  const double counted = double(mb.counted());
  {
    Engine engine(*dev, store, eo);
    engine.forward_backward(mb, float(1.0 / counted));
    engine.synchronize();
  }
  auto mean_loss = [&] {
    Engine engine(*dev, store, eo);
    return engine.forward_loss(mb) / counted;
  };
  const ModelLayer& mlp = spec.layers[1];
  std::vector<int64_t> rows = mlp.rows;
  rows.push_back(dense_layer_rows(spec.layers[2]).up);
  for (int64_t row : rows) {
    const TensorSpec& t = spec.params[size_t(row)];
    const size_t n = size_t(t.numel());
    std::vector<float> w(n), g(store.grad_of(size_t(row)), store.grad_of(size_t(row)) + n);
    store.get_param(size_t(row), w.data());
    double norm = 0;
    for (float x : g) norm += double(x) * double(x);
    norm = std::sqrt(norm);
    const double h = 1e-2;
    auto loss_at = [&](double step) {
      std::vector<float> moved(n);
      for (size_t i = 0; i < n; ++i) moved[i] = float(double(w[i]) + step * double(g[i]) / norm);
      store.set_param(size_t(row), moved.data());
      const double l = mean_loss();
      store.set_param(size_t(row), w.data());
      return l;
    };
    const double fd = (loss_at(h) - loss_at(-h)) / (2 * h);
    INFO(t.name << ": |g| " << norm << ", central difference " << fd);
    CHECK(norm > 1e-3);
    CHECK(std::abs(fd - norm) <= 1e-3 * norm);
  }
}

// The zeroth-order engine carves the kind's forward-only workspace and runs its forward: the
// clean loss streamed == resident bit for bit, and the training engine's within f32 rounding.
TEST_CASE("the zeroth-order engine runs a test layer kind's forward", "[zo][layer_kind]") {
  MixedModel m;
  HostStore& store = m.store;
  Device* dev = m.dev.get();
  const MicroBatch& mb = m.mb;
  const double first_order = Engine(*dev, store, engine_options("stream", "always")).forward_loss(mb);
  double zo[2];
  ZoLosses dual;
  for (int resident = 0; resident < 2; ++resident) {
    ZoEngine engine(*dev, store, engine_options(resident ? "device" : "stream", "always"));
    zo[resident] = engine.forward_loss(mb);
    dual = engine.dual_forward(mb, 5, 1e-3f);
  }
  CHECK(zo[0] == zo[1]);
  CHECK(zo[0] == Approx(first_order).epsilon(1e-6));
  CHECK(dual.plus != dual.minus);
  CHECK(dual.plus == Approx(zo[0]).epsilon(1e-2));
}

// Today's names and order, as model_spec_build wrote them before the seam.
TEST_CASE("the dense layer kind keeps the Hugging Face names and order of llama, qwen2 and qwen3", "[models][layer_kind]") {
  const std::vector<std::string> attention = {"input_layernorm.weight", "self_attn.q_proj.weight",
                                              "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                                              "self_attn.o_proj.weight"};
  const std::vector<std::string> mlp = {"post_attention_layernorm.weight", "mlp.gate_proj.weight",
                                        "mlp.up_proj.weight", "mlp.down_proj.weight"};
  struct Family {
    const char* type;
    const char* architecture;
    std::vector<std::string> extra;  // after o_proj
  };
  const Family families[] = {
      {"llama", "LlamaForCausalLM", {}},
      {"qwen2", "Qwen2ForCausalLM", {"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"}},
      {"qwen3", "Qwen3ForCausalLM", {"self_attn.q_norm.weight", "self_attn.k_norm.weight"}},
  };
  for (const Family& f : families) {
    INFO(f.type);
    const nlohmann::json j = {{"architectures", {f.architecture}}, {"model_type", f.type}, {"hidden_size", 64},
                              {"intermediate_size", 96}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
                              {"num_key_value_heads", 2}, {"head_dim", 24}, {"vocab_size", 97},
                              {"max_position_embeddings", 256}, {"tie_word_embeddings", false}};
    const ModelSpec spec = model_spec_build(hf_config_parse(j.dump(), "test config"), DType::bf16);
    std::vector<std::string> want = {"model.embed_tokens.weight"};
    for (int l = 0; l < 2; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      for (const auto* part : {&attention, &f.extra, &mlp})
        for (const std::string& s : *part) want.push_back(p + s);
    }
    want.push_back("model.norm.weight");
    want.push_back("lm_head.weight");
    std::vector<std::string> got;
    for (const TensorSpec& t : spec.params.rows()) got.push_back(t.name);
    CHECK(got == want);
    for (const ModelLayer& layer : spec.layers) {
      CHECK(layer.kind == &dense_layer_kind());
      const LayerParamRows r = dense_layer_rows(layer);
      const int64_t linears[7] = {r.q, r.k, r.v, r.o, r.gate, r.up, r.down};
      CHECK(layer.linear_row(kLayerQkv) == kAbsent);  // Phi-3's fused linears: not a dense layer's
      CHECK(layer.linear_row(kLayerGateUp) == kAbsent);
      for (int t = 0; t < 7; ++t) {  // LoRA targets: PEFT's module name ends the row's name
        const std::string& name = spec.params[size_t(layer.linear_row(t))].name;
        CHECK(layer.linear_row(t) == linears[t]);
        CHECK(name.find(std::string(layer_linear_name(t)) + ".weight") != std::string::npos);
      }
    }
  }
}

}  // namespace strata
