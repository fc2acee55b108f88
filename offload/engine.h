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
//   - embedding: gathered on the host and scattered back on the host (no V x C upload).
//   - head: the final norm is resident; lm_head (or the tied embedding table as lm_head) is
//     streamed in chunks of vocab rows through two device chunk slots (one when one chunk holds
//     the whole vocabulary), so the head's device footprint scales with the chunk, not with V
//     (V x C is often the largest tensor: 1 GiB of bf16 weights and 2 GiB of f32 gradient for
//     Llama-3 8B). The loss takes two passes
//     over the chunks: forward (chunk k+1 prefetched on h2d while chunk k computes) keeps each
//     token's online-softmax statistics; backward walks the chunks in reverse (the two chunks
//     still in the slots are reused), recomputes each chunk's logits, adds dlogits · W_chunk
//     into d(hidden) and stages dW_chunk device -> host through two gradient chunk slots, where
//     it is added into the lm_head (or embedding) gradient in a fixed order.
//     Chunk size: kHeadChunkRows (4096) vocab rows, or V when smaller. The rule depends on
//     nothing else — not the budget, not offload.weights — so every configuration of one model
//     does the same arithmetic; at C = 4096 in bf16 the head then costs 2 x 32 MiB of weight
//     slots and 2 x 64 MiB of gradient slots on the device whatever V is. With weights =
//     "device" the whole lm_head is resident instead and the chunks are read in place: the
//     same chunks, the same math, bit-identical results.
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

// Vocab rows per lm_head chunk (see above).
constexpr int64_t kHeadChunkRows = 4096;

struct EngineOptions {
  std::string weights = "stream";     // "stream" | "device"
  std::string checkpoints = "auto";   // "auto" (device while the budget allows) | "device" | "host"
  int64_t max_batch = 1, max_tokens = 1;
  int64_t head_chunk_rows = 0;        // 0: kHeadChunkRows (tests set it to compare chunkings)
};

// The pinned host memory an engine allocates (offload/host_budget.h checks it before anything
// is allocated).
struct EngineHostBytes {
  size_t staging = 0;      // activations, one layer's gradients (x2), lm_head gradient chunks (x2, or 1)
  size_t checkpoints = 0;  // spilled layer inputs: every layer unless checkpoints = "device"
                           // (an upper bound for "auto", which keeps what the device budget allows)
};

// Cumulative; the trainer reports per-step differences. compute_s + h2d_wait_s + d2h_wait_s +
// optimizer_exposed_s is about the wall time of the steps (the compute stream's timeline: busy,
// blocked on another stream, or out of work because the trainer thread waited on the host);
// optimizer_s overlaps compute by design and is not part of that sum.
struct EngineStats {
  double compute_s = 0;         // compute stream busy running ops
  double h2d_wait_s = 0;        // compute stream blocked on another stream: weights/checkpoints
                                // arriving, or a gradient slot still being copied out
  double d2h_wait_s = 0;        // compute stream out of work while the trainer thread waited for
                                // gradients to reach the host (staging reuse, end of backward)
  double optimizer_s = 0;       // host worker working: gradient accumulation + AdamW (its waits
                                // for device copies excluded)
  double optimizer_exposed_s = 0;  // compute stream out of work while the trainer thread waited
                                   // for an optimizer update or computed the global norm
  size_t link_bytes = 0;        // h2d + d2h
};

class Engine {
 public:
  static EngineHostBytes host_bytes(const ModelSpec& spec, const EngineOptions& options);
  static int64_t head_chunk_rows(const ModelSpec& spec, const EngineOptions& options);

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

  // With clipping off, the last micro-batch of a step can update as it goes: forward_backward,
  // and each group's AdamW update queued on the host right behind the last addition into its
  // gradient (the head first, then layers L-1..0, the embedding last), so the updates run
  // inside backward instead of after it. Bit-identical to forward_backward + optimizer_step
  // with max_grad_norm = 0. landed_update_norm() waits for the updates and returns the
  // gradient norm they saw (sum of per-group squares, in group order).
  double forward_backward_update(const MicroBatch& mb, float grad_scale, AdamWParams params, double weight_decay);
  double landed_update_norm();
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
  void ensure_final_norm();
  const void* ensure_head_chunk(size_t chunk);  // lm_head rows of `chunk` on the device
  void release_head_chunk(size_t chunk);        // the compute stream is done reading it
  size_t lm_group() const { return tied_ ? 0 : store_.groups().size() - 1; }
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
  float* norm_dev_ = nullptr;               // (C) final norm weight
  float* norm_grad_dev_ = nullptr;          // (C) its gradient
  bool norm_stale_ = true;
  int64_t head_rows_ = 0;                  // vocab rows per lm_head chunk
  size_t head_chunks_ = 0;                 // ceil(V / head_rows_)
  size_t head_slot_count_ = 0;             // min(2, head_chunks_): weight and gradient chunk slots
  char* lm_resident_ = nullptr;            // weights = "device": (V, C) lm_head
  bool lm_resident_stale_ = true;
  char* head_slots_[2] = {};               // weights = "stream": (head_rows, C) lm_head chunks
  int64_t head_slot_chunk_[2] = {-1, -1};  // which chunk each slot holds (-1: none / stale)
  std::unique_ptr<Event> head_slot_loaded_[2], head_slot_free_[2];
  float* head_grad_slots_[2] = {};         // (head_rows, C) f32 lm_head gradient chunks
  double* ce_stats_ = nullptr;             // (N, 3) per-token online-softmax statistics
  char* grad_slots_[2] = {};               // f32, one layer's gradients
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
  float* norm_grad_staging_ = nullptr;     // (C) final norm gradient
  float* head_grad_staging_[2] = {};       // (head_rows, C) lm_head gradient chunks
  double loss_host_ = 0;
  std::vector<int32_t> ids_host_;

  // events
  std::unique_ptr<Event> pp_saved_[2], x_ready_, ckpt_fetched_[2], stage_free_[2];
  std::vector<std::shared_ptr<Event>> grad_copied_;   // per layer
  std::shared_ptr<Event> norm_grad_copied_, dx0_copied_, head_grad_copied_[2];
  std::unique_ptr<Event> loss_copied_;

  HostQueue host_;
  uint64_t staging_ticket_[2] = {}, head_staging_ticket_[2] = {};
  std::vector<uint64_t> optimizer_ticket_;   // per group
  struct LandedUpdate {
    bool active = false;
    AdamWParams params;
    double weight_decay = 0;
  } landed_;                                 // forward_backward_update's pending updates
  std::vector<double> group_sq_;             // per group: sum of squared gradients it updated with
  void update_group_when_landed(size_t group);
  void adamw_group(size_t group, const AdamWParams& params, double weight_decay);
  template <class F>
  void exposed_wait(double* exposed, F&& wait);
  double d2h_wait_s_ = 0, optimizer_exposed_s_ = 0;
};

}  // namespace strata
