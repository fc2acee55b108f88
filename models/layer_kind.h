// The layer-kind seam: what one kind of decoder layer is, for everything outside models/ that
// streams, plans, checkpoints or runs layers. A kind lists its parameters (HF name suffixes,
// shapes, which are LoRA-targetable linears), sizes and carves its workspace, and runs forward,
// forward split around the attention (the generator's KV-cache decode), backward with recompute
// and backward from kept activations; it prices itself for the plan. Each ModelSpec layer points
// at its kind (models/model_spec.h); the engines hand a kind opaque views of the layer's weight
// block (pointers in the kind's parameter order) and never name a tensor of it.
//
// The dense Llama-family layer (models/dense_layer.h) is today's one kind. A new kind (a
// mixture-of-experts MLP, Gemma's extra norms, Phi-3's fused projections) is a new LayerKind:
// its parameters' names and shapes, its workspace and its math; model_spec_build picks it per
// layer from the config. tests/models/test_layer_kind.cpp plugs in a kind the library never sees.
//
// Legend: B batch, T tokens per row, N = B*T, C hidden, H heads, Hk kv heads, D head dim, F ffn.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/hf_config.h"
#include "src/core/tensor.h"
#include "src/device/device.h"

namespace strata {

// The sizes a layer runs at: the model's, and the micro-batch's B, T.
struct LayerDims {
  int64_t B = 0, T = 0, C = 0, H = 0, Hk = 0, D = 0, F = 0;
  float eps = 1e-6f;
  DType wt = DType::f32;  // 2-D weights: f32 or bf16 (then matmul inputs and attention dots bf16)
  int64_t window = 0;     // the model's sliding window (config.sliding_window; 0: none); a layer whose
                          // kind does not slide runs at dims with window 0 (LayerKind::attention_window)
  float attn_scale = 0;   // the attention scores' scale (0: 1/sqrt(D); Gemma 3: query_pre_attn_scalar^-1/2)
  int32_t max_pos = -1;   // the micro-batch's largest position (LongRoPE picks its short or long table by
                          // it, as transformers does by max(position_ids) + 1); -1: not known
  int64_t rope_dim = 0;   // the leading dims of each head RoPE rotates (partial_rotary_factor x D, even); 0: all D
  int64_t lora_r = 0;     // LoRA rank (0: no adapters); sizes the workspace's adapter scratch
  bool lora_dropout = false;  // LoRA dropout possible: the workspace holds the dropped input (lora_x)
  int64_t N() const { return B * T; }
  int64_t rotary() const { return rope_dim > 0 ? rope_dim : D; }
};

// The LoRA-targetable linears, by PEFT's module names: a kind's linear names one of these
// (LayerParam::lora_target); adapters and their dropout masks are numbered by it. 7 and 8 are
// Phi-3's fused projections (models/phi3_layer.h): one adapter each, as PEFT puts it. The last
// three are a mixture-of-experts layer's (models/moe_layer.h), which PEFT reaches through
// target_parameters (transformers 5 keeps them as parameters, not nn.Linear modules): the router
// (E, C), one adapter; the experts' packed gate_up_proj (E, 2I, C) and down_proj (E, C, I), one
// A and B per expert, the experts' adapters side by side in one A (E*r, in) and one B
// (E*out, r) (expert e's A_e (r, in) at rows e*r, its B_e (out, r) at rows e*out: PEFT's B is
// (out, E*r) with B_e's column k at k*E + e, reordered at the PEFT boundary, offload/state/lora.h).
// No layer kind lists them in LayerParam::lora_target: the MoE kind finds its router and experts
// itself (moe_kind_expert_params).
constexpr int kLayerLinears = 12;
constexpr int kLayerQkv = 7, kLayerGateUp = 8;
constexpr int kLayerRouter = 9, kLayerExpertsGateUp = 10, kLayerExpertsDown = 11;
const char* layer_linear_name(int target);  // "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                            // "down_proj", "qkv_proj", "gate_up_proj", and PEFT's
                                            // target_parameters "mlp.gate.weight",
                                            // "mlp.experts.gate_up_proj", "mlp.experts.down_proj"

struct LoraLinear {
  const float* a = nullptr;  // (r, I); null: no adapter on this linear (the experts': (E*r, I))
  const float* b = nullptr;  // (O, r), holding (alpha / r) B (the experts': (E*O, r))
  // LoRA dropout on this adapter's input: probability (0: none, as in eval) and the mask's key
  // (kernels/common/dropout_mask.h; offload/state/lora.h: lora_dropout_seed, lora_dropout_tensor).
  double dropout = 0.0;
  uint64_t dropout_seed = 0;
  uint32_t dropout_tensor = 0;
};
struct LoraLinearGrads {
  float* a = nullptr;  // (r, I) accumulated
  float* b = nullptr;  // (O, r): the gradient of the scaled B', accumulated
};

struct MoeAuxLoss;  // models/moe_aux_loss.h

// Per-token context shared by every layer of a micro-batch.
struct TokenContext {
  const int32_t* pos = nullptr;        // (N) position of each token (restarts per document)
  const int32_t* doc_start = nullptr;  // (N) or null: first token of each token's document
  const float* inv_freq = nullptr;     // (D/2)
  // The micro-batch's load-balancing loss of mixture-of-experts layers (host state: their forwards
  // add to it, their backwards read its gradient); null: none (dense models, aux loss off).
  MoeAuxLoss* moe_aux = nullptr;
};

// One parameter of a kind, in the kind's fixed order (the order of the layer's rows in the
// parameter table). 2-D parameters are matrices in the model's matrix dtype; others are f32.
struct LayerParam {
  std::string suffix;        // HF name after "model.layers.<i>.", e.g. "self_attn.q_proj.weight"
  Shape shape;               // empty: absent in this configuration (no row)
  int lora_target = -1;      // a LoRA-targetable linear: which (layer_linear_name); -1: not one
  bool always_grad = false;  // its backward always adds a gradient (a norm weight): with a frozen
                             // base it goes to scratch of max(C, D) floats
};

// One layer's weights on the device, in its kind's parameter order (null where absent), and
// its adapters by LoRA target (a null: none).
struct LayerTensors {
  std::vector<const void*> param;
  LoraLinear lora[kLayerLinears];
};
// Its gradients, f32, accumulated (+=); a null parameter gradient: not computed (frozen).
struct LayerGradTensors {
  std::vector<float*> param;
  LoraLinearGrads lora[kLayerLinears];
};

// The buffers a kind sizes: the whole workspace (forward and backward), the forward's alone
// (forward-only engines: ZO, the generator), and the activations a forward keeps for a backward
// without recompute (offload.recompute).
enum class LayerBuffer { workspace, forward_workspace, activations };

// Where a layer's workspace lives: one block of bytes(workspace) (backward) or
// bytes(forward_workspace) for `capacity`, reused by every layer in turn; its activations in
// `activations` instead (bytes(activations) for `capacity`) when a forward keeps them.
struct LayerScratch {
  char* base = nullptr;
  char* activations = nullptr;  // null: in base
  LayerDims capacity;           // the dims base was sized for (B, T the largest micro-batch)
  bool backward = true;         // base holds the backward scratch too
};

// The decode hook: the attention's buffers in a kind's workspace after forward_qkv (and after
// forward: k and v are what a KV cache keeps, after the norms and RoPE).
struct LayerAttention {
  float *q = nullptr, *k = nullptr, *v = nullptr;  // (N, H*D), (N, Hk*D), (N, Hk*D)
  float* out = nullptr;                            // (N, H*D) the caller's attention output
};

// A layer's device work for the plan (offload/plan/step_estimate.h): forward, recompute and
// backward of B x T tokens.
struct LayerCost {
  double matmul_flops = 0, attention_flops = 0, elementwise_bytes = 0;
};

class LayerKind {
 public:
  virtual ~LayerKind() = default;
  virtual const char* name() const = 0;
  // Its parameters for this config, in row order; absent ones (a bias the config has not) keep
  // their place with an empty shape. Bad configs: Error(input).
  virtual std::vector<LayerParam> params(const ModelConfig& config) const = 0;
  virtual size_t bytes(LayerBuffer what, const LayerDims& d) const = 0;
  virtual LayerCost cost(const ModelConfig& config, DType matrix_dtype, int64_t B, int64_t T) const = 0;

  // out (N,C) = layer(x (N,C)); fills the forward part of ws. out must not alias x.
  virtual void forward(Device& dev, float* out, const float* x, const LayerTensors& w, const TokenContext& ctx,
                       const LayerScratch& ws, const LayerDims& d, Stream s) const = 0;
  // dx (N,C) = d layer / d x applied to dout (N,C); grads accumulated. Recomputes the forward
  // from x first. dx must not alias dout or x.
  virtual void backward(Device& dev, float* dx, const LayerGradTensors& g, const float* dout, const float* x,
                        const LayerTensors& w, const TokenContext& ctx, const LayerScratch& ws, const LayerDims& d,
                        Stream s) const = 0;
  // backward without the recompute: ws's activations are the ones forward wrote for this x and
  // these weights (the recompute is deterministic: both give the same bits).
  virtual void backward_saved(Device& dev, float* dx, const LayerGradTensors& g, const float* dout, const float* x,
                              const LayerTensors& w, const TokenContext& ctx, const LayerScratch& ws,
                              const LayerDims& d, Stream s) const = 0;

  // forward in two halves around the attention, for a caller with its own attention (the
  // generator's decode attends over a KV cache): forward_qkv fills attention(ws).q, k, v; the
  // caller writes attention(ws).out; forward_from_attention computes out (N,C) from it. A kind
  // without attention keeps these defaults, which refuse.
  virtual LayerAttention attention(const LayerScratch& ws) const;
  virtual void forward_qkv(Device& dev, const float* x, const LayerTensors& w, const TokenContext& ctx,
                           const LayerScratch& ws, const LayerDims& d, Stream s) const;
  virtual void forward_from_attention(Device& dev, float* out, const float* x, const LayerTensors& w,
                                      const LayerScratch& ws, const LayerDims& d, Stream s) const;
  // The attention's softmax scale and sliding window at dims d (a caller with its own attention
  // uses them): d.attn_scale (or 1/sqrt(D)), and d.window where this kind's layers slide, else 0.
  virtual float attention_scale(const LayerDims& d) const;
  virtual int64_t attention_window(const LayerDims&) const { return 0; }
};

// LayerDims::max_pos of a micro-batch's positions (-1 when there are none).
int32_t layer_dims_max_pos(const std::vector<int32_t>& pos);

// The most any of `kinds` needs of `what` at dims d: one buffer serves every layer in turn.
size_t layer_kinds_bytes(const std::vector<const LayerKind*>& kinds, LayerBuffer what, const LayerDims& d);

// The kinds the library has (model_spec_build chooses among them): the dense Llama-family layer,
// one object shared by every dense layer of every model (models/dense_layer.h); `sliding`: the
// one whose attention keeps to dims.window (mistral's, and qwen's layers >= max_window_layers).
const LayerKind& dense_layer_kind(bool sliding = false);

}  // namespace strata
