// A causal LM resident in the device arena: weights, gradients, layer-boundary checkpoints
// and one layer's workspace. Forward keeps each layer input x_i as a checkpoint; backward
// recomputes each layer from x_i and runs the hand-written backward (DESIGN §3). Streaming
// the layers from host memory instead (issue 4) reuses layer_forward / layer_backward.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "models/decoder_layer.h"
#include "models/micro_batch.h"
#include "models/model_spec.h"
#include "src/device/device.h"

namespace strata {

class CausalLM {
 public:
  CausalLM(Device& dev, ModelSpec spec, int64_t max_batch, int64_t max_tokens);
  ~CausalLM();
  CausalLM(const CausalLM&) = delete;
  CausalLM& operator=(const CausalLM&) = delete;

  const ModelSpec& spec() const { return spec_; }
  Device& device() { return dev_; }

  // Host-side weights: a pinned mirror of the device weights in their device dtype.
  void set_param(size_t row, const float* values);  // converts into the mirror
  void get_param(size_t row, float* values) const;  // from the mirror
  void upload_weights();                            // mirror -> device (synchronous)
  // The mirror's storage of one parameter (dtype spec().params[row].dtype), for in-place
  // optimizer updates followed by upload_weights().
  void* host_param(size_t row) { return weights_host_ + spec_.params[row].offset; }

  void zero_grads();
  // Forward + backward of one micro-batch; gradients of grad_scale * (summed loss) are
  // accumulated. Returns the summed loss over counted positions.
  double forward_backward(const MicroBatch& mb, float grad_scale);
  double forward_loss(const MicroBatch& mb);
  // Device gradients -> host (f32, same row order as spec().params); synchronous.
  void download_grads(std::vector<float>& out);  // concatenated in the grad table layout
  const TensorTable& grad_table() const { return grad_table_; }

 private:
  void upload_tokens(const MicroBatch& mb);
  void forward(const MicroBatch& mb);
  LayerWeights layer_weights(size_t layer) const;
  LayerGrads layer_grads(size_t layer);
  const void* weight(int64_t row) const;
  float* grad(int64_t row);

  Device& dev_;
  ModelSpec spec_;
  TensorTable grad_table_;
  int64_t max_batch_, max_tokens_;
  LayerDims dims_;
  char* weights_ = nullptr;      // device, spec_.params layout
  char* weights_host_ = nullptr; // pinned mirror
  char* grads_ = nullptr;        // device, grad_table_ layout
  float* checkpoints_ = nullptr; // (L+1, N, C)
  float *hn_ = nullptr, *rstd_final_ = nullptr, *dhn_ = nullptr, *dx_a_ = nullptr, *dx_b_ = nullptr;
  int32_t *ids_ = nullptr, *targets_ = nullptr, *pos_ = nullptr, *doc_start_ = nullptr;
  float* inv_freq_ = nullptr;
  double* loss_ = nullptr;
  void* workspace_ = nullptr;
  LayerWorkspace ws_{};
  bool has_docs_ = false;
};

}  // namespace strata
