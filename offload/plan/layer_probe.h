// The CPU backend's device rates at a model's own shapes: one decoder layer's forward and backward
// (with the gradient slot's zeroing, as the engine runs them) at the micro-batch's B x T, and one
// lm_head chunk's statistics, loss and backward, through the Device's ops on a CPU device of their
// size, timed by the device's own per-op counters (as metrics.jsonl's op_s). The layer's GEMMs give
// the GEMM rate, its attention kernel the attention rate, its norms, RoPE, SwiGLU, adds and casts
// the memory-bound rate over DeviceWork's bytes, the chunk (its wall time) the head's rate.
//
// Two callers: a training run on the CPU backend plans at these rates (a few rounds,
// layer_probe_run_rates), and `strata estimate --measure` prices at them (rounds over a window,
// interleaved with its host probes). On a GPU the memory-bound ops are small beside the GEMMs and
// the search prices at the datasheet; a layer past kLayerProbeMaxBytes (a 405B model's) is priced
// at the square-GEMM peak instead.
#pragma once
#include <cstddef>
#include <memory>
#include <vector>

#include "models/layer_kind.h"
#include "offload/plan/placement_plan.h"
#include "offload/state/host_store.h"
#include "src/device/device.h"

namespace strata {

struct LayerRates {
  double matmul_flops_per_s = 0, attention_flops_per_s = 0, elementwise_bytes_per_s = 0, head_flops_per_s = 0;
  bool measured() const { return matmul_flops_per_s > 0; }
};

inline constexpr size_t kLayerProbeMaxBytes = size_t(2) << 30;

class LayerProbe {
 public:
  // nullptr when the layer and the chunk need more than kLayerProbeMaxBytes.
  static std::unique_ptr<LayerProbe> create(const ModelSpec& spec, const PlanInputs& in);
  // The host memory a probe takes while it runs (its device arena, and the host copy its largest
  // buffer is filled from); 0 when create gives no probe. `in.weights` may still be "auto";
  // `layout` is the model's (HostStore::layout: the plan builds it once for every candidate).
  static size_t host_bytes(const ModelSpec& spec, const HostStoreLayout& layout, const PlanInputs& in);

  void round();  // one timed round: a layer (after an untimed one), then a chunk
  LayerRates rates(const ModelSpec& spec) const;  // the median of the rounds

 private:
  enum Buffer : size_t;
  // the probe's shape and buffer sizes, nothing allocated
  struct Shape {
    LayerDims d;
    int64_t N = 0, C = 0, V = 0, R = 0;
    DType lm_type = DType::f32;
    std::vector<size_t> sizes;  // by Buffer
    size_t total_bytes = 0;     // the device arena's share of them, page-aligned
  };
  static Shape shape_of(const ModelSpec& spec, const HostStoreLayout& layout, const PlanInputs& in);
  LayerProbe(const ModelSpec& spec, const PlanInputs& in);
  void allocate(const ModelSpec& spec);
  void fill(const ModelSpec& spec);
  void fill_buffer(Buffer k, const void* value, size_t value_bytes);
  float* f(Buffer k) const { return reinterpret_cast<float*>(buf_[size_t(k)]); }
  const int32_t* ids() const;
  double op_s(OpKind k) const { return dev_->counters().op_s[int(k)]; }
  void layer();
  void head();

  HostStoreLayout layout_;
  const LayerKind* kind_;  // layer 0's: the one probed
  LayerDims d_;
  int64_t N_ = 0, C_ = 0, V_ = 0, R_ = 0;
  DType lm_type_ = DType::f32;
  std::vector<size_t> sizes_;
  size_t total_bytes_ = 0;
  std::unique_ptr<Device> dev_;
  std::vector<char*> buf_;
  LayerTensors w_{};
  LayerGradTensors lg_{};
  LayerScratch ws_{};
  std::vector<double> mm_s_, attn_s_, rest_s_, head_s_;
};

// What a training run on the CPU backend plans at: kLayerProbeRunRounds rounds of the probe after
// one that warms it (a few layers' work: well under a second for a 7B layer at 2 x 2048 tokens on
// a workstation). Not measured (all 0) past kLayerProbeMaxBytes.
inline constexpr int kLayerProbeRunRounds = 3;
LayerRates layer_probe_run_rates(const ModelSpec& spec, const PlanInputs& in);

}  // namespace strata
