// LoRA (issue 17, DESIGN §8b): low-rank adapters on the frozen, streamed base. Each targeted
// linear layer W (out, in) gets A (r, in) and B (out, r); the layer computes
//   y = x W^T + (alpha / r) · dropout(x) A^T B^T
// (PEFT's LoraLayer; dropout on the adapter path's input only, inverted, in training passes only:
// forward-only passes such as eval see x). Only A and B are trained: the base weights stay in the
// host store as their bf16 (or f32) working copy, with no master, moments or gradient.
//
// Where the adapters live, and why:
//   device  every layer's A and B (f32) and their gradients, resident for the whole run. They are
//           small (r · (in + out) per target: 42M parameters, 168 MiB, for Llama-3 8B at r = 16
//           on all seven projections), so streaming them with the layer would add link traffic
//           every micro-batch to save little memory; resident, the gradients accumulate on the
//           device over the micro-batches of a step and cross the link once per optimizer step.
//           The device copy of B holds (alpha / r) · B, so the adapter path is four plain matmuls
//           (no scaling op); the download multiplies dB back (LoraStore::unscale_b).
//   host    fp32 master, AdamW m and v (RAM), the gradient and the device image (pinned): the
//           optimizer step runs AdamW (offload/state/adamw.h) over them row by row.
// Names are PEFT's: base_model.model.<HF module>.lora_A.weight / lora_B.weight. A mixture-of-experts
// layer's router and experts are PEFT's target_parameters (models/layer_kind.h): the router
// "mlp.gate.lora_A.weight" (r, C) and lora_B (E, r); the experts' gate_up_proj and down_proj one
// pair each on "mlp.experts" (PEFT nests its wrappers: with both targeted gate_up_proj's pair is
// "mlp.experts.base_layer.lora_A/B", down_proj's "mlp.experts.lora_A/B"; alone, either is
// "mlp.experts.lora_A/B"), A (E*r, in) and B (out, E*r) with expert e's column k at k*E + e. On
// the device and in every host array strata keeps such a B expert-major, (E*out, r) (one plain
// (out, r) block per expert for the grouped GEMMs), and reorders it where PEFT tensors are read or
// written (lora_peft_tensor, lora_from_peft_tensor).
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "models/layer_kind.h"
#include "models/model_spec.h"
#include "offload/state/adamw.h"
#include "src/device/device.h"

namespace strata {

// The linear layers of a decoder layer, in PEFT's names: the seven of the Llama family, and
// Phi-3's fused qkv_proj and gate_up_proj (a model has one set or the other); then a
// mixture-of-experts layer's router and packed experts, PEFT's target_parameters.
enum class LoraTarget : uint8_t { q, k, v, o, gate, up, down, qkv, gate_up, router, experts_gate_up, experts_down };
constexpr int kLoraTargets = 12;
const char* lora_target_name(LoraTarget t);  // "q_proj", ..., "gate_up_proj", "mlp.gate.weight", "mlp.experts.gate_up_proj", ...
// The Llama family's seven (q_proj .. down_proj): the default, what an adapter naming them matches.
constexpr uint32_t kLoraAllTargets = (1u << 7) - 1;
// The targets PEFT reaches through target_parameters (router, experts' gate_up_proj, down_proj).
constexpr uint32_t kLoraParameterTargets = (1u << kLayerRouter) | (1u << kLayerExpertsGateUp) | (1u << kLayerExpertsDown);
static_assert(kLoraTargets == kLayerLinears, "LoraTarget follows the layer kinds' linears (models/layer_kind.h)");
// PEFT module names ("q_proj", ...) and target_parameters names ("mlp.experts.gate_up_proj", or a
// dotted suffix of one such as "experts.down_proj" or "gate.weight") -> a mask over LoraTarget;
// bad names: Error(input).
uint32_t lora_targets_parse(const std::vector<std::string>& names, const std::string& origin);
std::vector<std::string> lora_target_names(uint32_t mask);            // the target_modules among mask
std::vector<std::string> lora_target_parameter_names(uint32_t mask);  // the target_parameters among mask

struct LoraOptions {
  int64_t r = 0;          // rank; 0: LoRA off
  double alpha = 32;      // lora_alpha
  double dropout = 0.0;   // lora_dropout, in [0, 1)
  uint64_t seed = 0;      // the run's seed: the dropout masks' key (lora_dropout_seed)
  uint32_t targets = kLoraAllTargets;
  // lora.base_dtype = "nf4" (offload/state/nf4_layout.h): the base's decoder-layer linears held and
  // streamed as NF4; lora.double_quant its absmax double-quantized
  bool base_nf4 = false;
  bool double_quant = true;
  bool enabled() const { return r > 0; }
  float scale() const { return float(alpha / double(r)); }
};

// The adapters' table: rows A then B for each targeted linear of each layer, f32, laid out in one
// arena (the same offsets on the device and in every host array).
struct LoraLayout {
  TensorTable table;                                   // PEFT names
  std::vector<std::array<int64_t, kLoraTargets>> a_row;  // per layer: row of A (B is the next row); kAbsent
  size_t bytes = 0;                                    // the arena
  int64_t r = 0;
  float scale = 1.f;
  std::vector<size_t> b_rows;                          // every B row (scaled on the device)
  std::vector<int64_t> experts;                        // per table row: E for a MoE layer's packed expert
                                                       // A or B (B kept (E*out, r)), 0 for the others

  static LoraLayout of(const ModelSpec& spec, const LoraOptions& options);
  size_t floats() const { return bytes / 4; }
  int64_t parameter_count() const;
};

// LoRA dropout's masks (kernels/common/dropout_mask.h): one key per micro-batch of a training
// pass, from the run's seed, the optimizer step (1-based) and the micro-batch's index within the
// step in the global order (over all data-parallel ranks, so N ranks with k micro-batches each draw
// the masks one process with N·k draws); one tensor number per (layer, module). A resumed run and
// the backward's recomputation draw the same masks; so does `strata grad` (step 1, micro-batch 0).
uint64_t lora_dropout_seed(uint64_t run_seed, int64_t step, int64_t micro_batch);
// The fused projections take the number of their first part (q, gate): a layer has one or the other,
// and the Llama family's numbers stay those of seven targets per layer.
inline uint32_t lora_dropout_tensor(size_t layer, int target) {
  const int slot = target == int(LoraTarget::qkv) ? 0 : target == int(LoraTarget::gate_up) ? 4 : target;
  return uint32_t(layer) * 7 + uint32_t(slot);
}

// Host bytes of the adapters' state (offload/plan/placement_plan.h lists them).
struct LoraHostBytes {
  size_t state = 0;   // host: fp32 master, m, v
  size_t pinned = 0;  // pinned: gradient and device image
};

class LoraStore {
 public:
  static LoraHostBytes host_bytes(const LoraLayout& layout) { return {3 * layout.bytes, 2 * layout.bytes}; }

  LoraStore(Device& dev, const ModelSpec& spec, const LoraOptions& options);
  ~LoraStore();
  LoraStore(const LoraStore&) = delete;
  LoraStore& operator=(const LoraStore&) = delete;

  const LoraLayout& layout() const { return layout_; }
  const LoraOptions& options() const { return options_; }
  float* master() { return master_; }
  float* m() { return m_; }
  float* v() { return v_; }
  float* grad() { return grad_; }    // pinned: the device's gradients land here
  float* image() { return image_; }  // pinned: what the device holds (B scaled)
  const float* master() const { return master_; }
  const float* m() const { return m_; }
  const float* v() const { return v_; }
  size_t host_bytes() const { return host_bytes_; }
  size_t pinned_bytes() const { return pinned_bytes_; }

  // PEFT's default: A ~ U(-1/sqrt(in), 1/sqrt(in)) (kaiming_uniform with a = sqrt(5)), B = 0; one
  // generator per tensor from (seed, row).
  void init(uint64_t seed);
  // Reads adapter_model.safetensors of a PEFT adapter dir (adapter_config.json must agree on r
  // and the targets; a missing or misshapen tensor is one error listing them).
  void load_peft(const std::string& dir);
  // Writes adapter_config.json and adapter_model.safetensors (f32, PEFT names).
  void save_peft(const std::string& dir, const std::string& base_model) const;

  void refresh_image();  // image = master, with every B multiplied by the scale
  void unscale_b();      // grad of every B multiplied by the scale (the device computed d(scale B))
  // AdamW over every adapter row (weight decay on all: they are matrices); zeroes the gradient.
  void adamw(const AdamWParams& params, double weight_decay);

 private:
  void release();

  Device& dev_;
  LoraOptions options_;
  LoraLayout layout_;
  float *master_ = nullptr, *m_ = nullptr, *v_ = nullptr, *grad_ = nullptr, *image_ = nullptr;
  size_t host_bytes_ = 0, pinned_bytes_ = 0;
};

// A table row of `layout` as PEFT stores it: its shape, and its values from strata's (`in`, the
// row's floats) into `out` (a packed expert B reordered from (E*out, r) to (out, E*r); the others
// as they are); lora_from_peft_tensor the inverse.
Shape lora_peft_shape(const LoraLayout& layout, size_t row);
void lora_peft_tensor(const LoraLayout& layout, size_t row, const float* in, float* out);
void lora_from_peft_tensor(const LoraLayout& layout, size_t row, const float* in, float* out);

// Every base weight an adapter changes, for the merge: W (out, in) at parameter row `param_row` +=
// scale · B · A with A (r, in) at float offset a and B (out, r) at float offset b of the adapter
// arena (an expert's gate_proj and up_proj take the rows of its fused gate_up B).
struct LoraMergeTerm {
  size_t param_row = 0;
  size_t a = 0, b = 0;
  int64_t out = 0, in = 0;
};
std::vector<LoraMergeTerm> lora_merge_terms(const ModelSpec& spec, const LoraLayout& layout);

// W += (alpha / r) B A for every adapted linear, in f32, written back through set_param (a frozen
// bf16 store rounds each merged weight to bf16 once): what `lora.merge` exports.
class HostStore;
void lora_merge_into(HostStore& store, const LoraStore& lora);

// adapter_config.json as PEFT writes it.
std::string lora_adapter_config_json(const LoraOptions& options, const std::string& base_model);

}  // namespace strata
