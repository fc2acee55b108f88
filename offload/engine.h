// The step engine (DESIGN §3): one transformer layer at a time on the device, fed from the host
// store. Written once against the asynchronous device interface:
//   - weights: two device slots; layer i+1 is copied in (h2d stream) while layer i computes
//     (compute stream); backward walks the layers in reverse, reusing what the slots still hold.
//     With weights = "device" every layer has its own resident slot instead; everything else —
//     the math, the gradient path, the order of every sum — is the same, so the two modes give
//     bit-identical results.
//   - checkpoints: the input of each layer is kept on the device while the budget allows and
//     spilled to pinned host memory beyond it; backward recomputes each layer from it.
//   - gradients: each layer's dW lands in a device slot, crosses to pinned host staging (d2h
//     stream) and is added into the host fp32 accumulation by the host queue, in a fixed order.
//   - embedding: gathered on the host and scattered back on the host (no V x C upload);
//     the head (final norm, lm_head) stays resident on the device.
//   - optimizer: after the global norm, AdamW runs group by group on the host queue while the
//     next forward streams each layer right behind its update.
// Events guard every buffer reuse.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "models/decoder_layer.h"
#include "models/micro_batch.h"
#include "offload/adamw.h"
#include "offload/host_queue.h"
#include "offload/host_store.h"

namespace strata {

struct EngineOptions {
  std::string weights = "stream";     // "stream" | "device"
  std::string checkpoints = "auto";   // "auto" (device while the budget allows) | "device" | "host"
  int64_t max_batch = 1, max_tokens = 1;
};

struct EngineStats {            // cumulative; the trainer reports per-step differences
  double compute_s = 0;         // compute stream busy
  double h2d_wait_s = 0;        // compute stream blocked waiting for weights/checkpoints
  double d2h_wait_s = 0;        // host blocked waiting for gradient/checkpoint copies
  double optimizer_s = 0;       // host queue busy (accumulation + AdamW)
  double optimizer_exposed_s = 0;  // forward blocked waiting for an optimizer update
  size_t link_bytes = 0;        // h2d + d2h
};

class Engine {
 public:
  Engine(Device& dev, HostStore& store, const EngineOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Forward, loss head, backward of one micro-batch; gradients of grad_scale * (summed loss)
  // are added into store.grad(). Returns the summed loss over counted positions.
  double forward_backward(const MicroBatch& mb, float grad_scale);
  double forward_loss(const MicroBatch& mb);  // no gradients

  // The optimizer step over the accumulated gradients: exact global norm, clip, AdamW per
  // group on the host queue (grads are zeroed as they are consumed). Returns the norm
  // before clipping. Non-blocking: later forwards wait layer by layer.
  double optimizer_step(AdamWParams params, double max_grad_norm, double weight_decay);
  void zero_grads();  // waits for pending accumulation, then zeroes store.grad()
  void synchronize();  // all queued device and host work finished

  EngineStats stats() const;
  size_t device_checkpoints() const { return device_ckpt_count_; }
  const EngineOptions& options() const { return opt_; }

 private:
  void upload_tokens(const MicroBatch& mb);
  void forward(const MicroBatch& mb);
  void loss_head(const MicroBatch& mb, bool backward, float grad_scale);
  void backward(const MicroBatch& mb);
  void ensure_layer(size_t layer);        // weights of `layer` in its slot (h2d when needed)
  void ensure_head();
  float* ckpt_device(size_t layer);  // where the input of `layer` lives on the device
  LayerWeights weights_at(const char* base, size_t layer) const;
  LayerGrads grads_at(char* base, size_t layer) const;
  void wait_optimizer(size_t group);
  void host_accumulate(size_t group_index, const float* staging, std::shared_ptr<Event> copied);

  Device& dev_;
  HostStore& store_;
  EngineOptions opt_;
  LayerDims dims_;
  size_t L_ = 0;
  bool tied_ = false;

  // device buffers
  std::vector<char*> weight_slots_;        // 2 (stream) or L (device)
  std::vector<int64_t> slot_layer_;        // which layer each slot holds (-1: none / stale)
  std::vector<std::unique_ptr<Event>> slot_loaded_, slot_free_;
  char* head_dev_ = nullptr;               // head group's working weights
  char* lm_dev_ = nullptr;                 // tied: the embedding table as lm_head
  bool head_stale_ = true;
  char* grad_slots_[2] = {};               // f32, one layer's gradients
  char* head_grad_dev_ = nullptr;          // f32 head group
  float* lm_grad_dev_ = nullptr;           // tied: lm_head gradient (V, C)
  float* x_final_ = nullptr;               // (N, C) output of the last layer
  float* x_pp_[2] = {};                    // (N, C) ping-pong for spilled checkpoints
  float* ckpt_dev_ = nullptr;              // (device_ckpt_count, N, C)
  size_t device_ckpt_count_ = 0;           // layers [L - count, L) keep their input on the device
  float *hn_ = nullptr, *rstd_final_ = nullptr, *dhn_ = nullptr, *dx_[2] = {};
  int32_t *ids_ = nullptr, *targets_ = nullptr, *pos_ = nullptr, *doc_start_ = nullptr;
  float* inv_freq_ = nullptr;
  double* loss_dev_ = nullptr;
  void* workspace_ = nullptr;
  LayerWorkspace ws_{};
  bool has_docs_ = false;

  // pinned host staging
  float* x0_host_ = nullptr;               // (N, C) embedding output = checkpoint 0 when spilled
  float* dx0_host_ = nullptr;              // (N, C)
  float* ckpt_host_ = nullptr;             // (L, N, C) spilled checkpoints
  float* grad_staging_[2] = {};            // one layer's f32 gradients
  float* head_staging_ = nullptr;          // head group f32 (+ lm grad when tied)
  double loss_host_ = 0;
  std::vector<int32_t> ids_host_;

  // events
  std::unique_ptr<Event> pp_saved_[2], x_ready_, ckpt_fetched_[2], stage_free_[2];
  std::vector<std::shared_ptr<Event>> grad_copied_;   // per layer
  std::shared_ptr<Event> head_copied_, dx0_copied_;
  std::unique_ptr<Event> loss_copied_;

  HostQueue host_;
  uint64_t staging_ticket_[2] = {};
  std::vector<uint64_t> optimizer_ticket_;   // per group
  double d2h_wait_s_ = 0, optimizer_exposed_s_ = 0;
};

}  // namespace strata
