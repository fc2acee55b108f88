// The step engine (DESIGN §3): one transformer layer at a time on the device, fed from the host
// store. Written once against the asynchronous device interface:
//   - weights: two device slots (offload/stream/weight_stream.h); layer i+1 is copied in (h2d stream)
//     while layer i computes (compute stream); backward walks the layers in reverse, reusing
//     what the slots still hold. With weights = "device" every layer has its own resident slot
//     instead (uploaded once after each update); everything else —
//     the math, the gradient path, the order of every sum — is the same, so the two modes give
//     bit-identical results.
//   - checkpoints: the input of each layer is kept on the device while the budget allows and
//     spilled to pinned host memory beyond it (or, with checkpoints = "nvme", to a file through
//     a ring of pinned buffers: offload/stream/checkpoint_spill.h); backward recomputes each layer from it.
//   - gradients: each layer's dW lands in a device slot, crosses to pinned host staging (d2h
//     stream) and is added into the host fp32 accumulation by the host queue, in a fixed order.
//   - embedding: gathered on the host and scattered back on the host (no V x C upload).
//   - head: the final norm is resident; lm_head (or the tied embedding table as lm_head) is
//     streamed in chunks of vocab rows through two device chunk slots (one when one chunk holds
//     the whole vocabulary), so the head's device footprint scales with the chunk, not with V
//     (V x C is often the largest tensor: 1 GiB of bf16 weights and 2 GiB of f32 gradient for
//     Llama-3 8B). The loss takes two passes over the chunks: forward (chunk k+1 prefetched on
//     h2d while chunk k computes) keeps each token's online-softmax statistics; then the loss
//     objective (offload/objective/loss_objective.h) reads them; backward walks the chunks in reverse
//     (the two chunks still in the slots are reused), recomputes each chunk's logits (or reads
//     the ones the forward kept, offload.recompute, while the budget allows), adds
//     dlogits · W_chunk into d(hidden) and stages dW_chunk device -> host through two gradient
//     chunk slots, where it is added into the lm_head (or embedding) gradient in a fixed order.
//     Chunk size: kHeadChunkRows (4096) vocab rows, or V when smaller. The rule depends on
//     nothing else — not the budget, not offload.weights — so every configuration of one model
//     does the same arithmetic; at C = 4096 in bf16 the head then costs 2 x 32 MiB of weight
//     slots and 2 x 64 MiB of gradient slots on the device whatever V is. With weights =
//     "device" the whole lm_head is resident instead and the chunks are read in place: the
//     same chunks, the same math, bit-identical results.
//   - optimizer: after the global norm, the group optimizer (offload/state/optimizer.h: AdamW over
//     the store's state placement, RAM or NVMe) runs group by group on the host queue while the
//     next forward streams each layer right behind its update; the placement is told the order
//     first, so NVMe reads ahead of the updates (offload/state/nvme_state.h).
// Every buffer is a row of one table (offload/stream/engine_buffers.h); events guard every buffer
// reuse (the table of events is in engine.cpp). The weights' slots, the embedding gather, the layer
// and chunk loops and the optimizer's per-group tickets are the layer pass's (layer_pass.h); this
// engine supplies the bodies: checkpoint + forward, recompute + backward, the loss head.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "models/layer_kind.h"
#include "models/micro_batch.h"
#include "models/moe_aux_loss.h"
#include "offload/state/adamw.h"
#include "offload/stream/checkpoint_spill.h"
#include "offload/stream/engine_buffers.h"
#include "offload/engine/layer_pass.h"
#include "offload/engine/step_engine.h"
#include "offload/reduce/grad_reduction.h"
#include "offload/stream/host_queue.h"
#include "offload/state/host_store.h"
#include "offload/objective/loss_objective.h"
#include "offload/state/optimizer.h"
#include "offload/stream/weight_stream.h"

namespace strata {

// The pinned host memory an engine allocates (offload/plan/placement_plan.h counts it before anything
// is allocated).
struct EngineHostBytes {
  size_t staging = 0;      // activations, one layer's gradients (x2), lm_head gradient chunks (x2, or 1)
  size_t checkpoints = 0;  // spilled layer inputs: every layer unless checkpoints = "device"
                           // (an upper bound for "auto", which keeps what the device budget allows)
};

// What one pass over a micro-batch does: forward only (eval) and forward + backward. The
// zeroth-order dual forward (θ + εz and θ − εz side by side) is its own engine over the same host
// store, buffer shapes and streams, without gradient or checkpoint buffers: offload/engine/engine_zo.h.
enum class StepKind : uint8_t { forward_only, forward_backward };

class Engine final : public StepEngine {
 public:
  static EngineHostBytes host_bytes(const ModelSpec& spec, const EngineOptions& options);
  static int64_t head_chunk_rows(const ModelSpec& spec, const EngineOptions& options) {
    return engine_head_chunk_rows(spec, options);
  }

  // LoRA mode (options.lora.enabled()): `lora` holds the adapters; the store is frozen (no
  // gradients, master or moments for the base: HostStoreOptions::weights_only).
  Engine(Device& dev, HostStore& store, const EngineOptions& options, LoraStore* lora = nullptr);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // One pass over a micro-batch. forward_backward: gradients of grad_scale * (summed loss) are
  // added into store.grad(). Returns the summed loss over counted positions.
  double step(const MicroBatch& mb, StepKind kind, float grad_scale);
  double forward_backward(const MicroBatch& mb, float grad_scale) {
    return step(mb, StepKind::forward_backward, grad_scale);
  }
  double forward_loss(const MicroBatch& mb) override { return step(mb, StepKind::forward_only, 1.f); }
  // One optimizer step over this rank's micro-batches (StepEngine): every gradient first, then
  // the clipped update (work.gradients_first), or the last micro-batch (layer-major: the pass)
  // updating each group as its gradient lands; layer-major when options().group > 1.
  StepOutcome train_step(const StepWork& work) override;
  // Layer-major (options.group = g > 1; engine.cpp top): up to g micro-batches in one pass, each
  // layer and lm_head chunk on the device once for all of them. Gradients as forward_backward on
  // each in turn, to the bit; returns each micro-batch's summed loss.
  std::vector<double> forward_backward_group(const std::vector<MicroBatch>& mbs, float grad_scale);

  // The step's last pass (a micro-batch, or the layer-major pass): forward_backward(_group), and
  // each group's sum of squared gradients computed on the host queue right behind the last
  // addition into its gradient, inside backward; optimizer_step then finds the global norm
  // gathered instead of reading the whole gradient after backward. Bit-identical either way.
  // With `speculate` (the step's hyperparameters, as optimizer_step will get them) and the
  // options' speculated groups, each of those groups' AdamW also starts as it lands (clip scale
  // 1, master and moments backed up); optimizer_step commits or redoes it (engine.cpp
  // "Speculation"). Bit-identical either way.
  double forward_backward_last(const MicroBatch& mb, float grad_scale, const AdamWParams* speculate = nullptr,
                               double weight_decay = 0);
  std::vector<double> forward_backward_group_last(const std::vector<MicroBatch>& mbs, float grad_scale,
                                                  const AdamWParams* speculate = nullptr, double weight_decay = 0);
  // The speculated groups [first, end) from now on (first >= end: none), their backup allocated
  // again: between steps only (the trainer's plan with the data counted may leave room for fewer).
  void set_speculated_groups(size_t first, size_t end);
  // Speculation so far: groups updated ahead of the norm, and of those redone because it clipped.
  size_t speculated_updates() const { return spec_.updates; }
  size_t speculation_redos() const { return spec_.redos; }
  size_t speculation_backup_bytes() const { return spec_.bytes; }

  // The optimizer step over the accumulated gradients: exact global norm (the per-group sums of
  // squares, added in group order: gathered by a *_last pass, else computed here), clip, the
  // group optimizer per group on the host queue in forward order (grads are zeroed as they are
  // consumed). Returns the norm before clipping. Non-blocking: later forwards wait layer by layer.
  double optimizer_step(AdamWParams params, double max_grad_norm, double weight_decay);

  // With clipping off, the last micro-batch of a step can update as it goes: forward_backward,
  // and each group's update queued on the host right behind the last addition into its
  // gradient (the head first, then layers L-1..0, the embedding last), so the updates run
  // inside backward instead of after it. Bit-identical to forward_backward + optimizer_step
  // with max_grad_norm = 0. landed_update_norm() waits for the updates and returns the
  // gradient norm they saw (sum of per-group squares, in group order).
  double forward_backward_update(const MicroBatch& mb, float grad_scale, AdamWParams params, double weight_decay);
  // ... and the whole layer-major pass as the last "micro-batch" (every group's update queued
  // behind its one landing of the pass's gradient).
  std::vector<double> forward_backward_group_update(const std::vector<MicroBatch>& mbs, float grad_scale,
                                                    AdamWParams params, double weight_decay);
  // params.clip_scale applies to those updates: a norm pass (below) gave the norm first.
  double landed_update_norm();
  // Clipping in two passes (StepWork::norm_pass): the step's one pass run for the norm alone, each
  // group's gradient squared and dropped as it lands (no update; the gradients may be in flight:
  // HostStoreOptions::grads_in_flight). landed_update_norm() then returns the exact norm, and the
  // same pass run again with forward_backward(_group)_update and the clip scale updates each group
  // as it lands: bit-identical to the serial clipped step. Not with LoRA.
  std::vector<double> forward_backward_group_norm(const std::vector<MicroBatch>& mbs, float grad_scale);
  void zero_grads();   // waits for pending accumulation, then zeroes store.grad()
  void synchronize() override;  // all queued device and host work finished

  // Data parallel (offload/reduce/comm_reduction.h): replaces the one-process NoGradReduction. Call
  // between steps, with nothing queued.
  void set_grad_reduction(std::unique_ptr<GradReduction> reduction);
  // The loss head's objective (offload/objective/loss_objective.h): token cross-entropy unless replaced,
  // e.g. by the preference head (offload/objective/preference_head.h). Between steps only.
  void set_loss_objective(std::unique_ptr<LossObjective> objective);

  // LoRA mode: the adapters' gradients accumulated so far, brought to lora.grad() (dB unscaled)
  // and zeroed on the device. optimizer_step does it itself; `strata grad --lora` calls it.
  void lora_collect_grads();
  // LoRA mode: the adapters' device copy from lora.image(), after they were set on the host
  // (initialised, loaded from a PEFT dir or a checkpoint). Synchronous.
  void lora_upload();
  // LoRA dropout (lora.dropout > 0): the training passes that follow belong to optimizer step
  // `step`; the first is micro-batch `first` of the step in the global order, the next first +
  // stride, ... (stride: the data-parallel ranks). Each forward_backward draws its masks from
  // lora_dropout_seed(options.lora.seed, step, its micro-batch) (a layer-major pass: each of its
  // micro-batches, next in turn); forward-only passes draw none.
  void lora_dropout_begin_step(int64_t step, int64_t first = 0, int64_t stride = 1);

  EngineStats stats() const override;
  size_t device_checkpoints() const override { return device_ckpt_count_; }
  size_t kept_activation_layers() const override { return kept_layers_; }  // offload.recompute: layers not recomputed
  size_t kept_logit_chunks() const override { return kept_chunks_; }        // offload.recompute: lm_head chunks likewise
  size_t pinned_bytes() const override { return engine_pinned_bytes(table_); }  // staging, spilled checkpoints
  const EngineOptions& options() const { return opt_; }

 private:
  // set-up (engine.cpp, top)
  void allocate(std::vector<EngineBuffer>& table);
  size_t device_checkpoint_count() const;
  size_t device_bytes_left() const;  // the budget minus what is allocated and the margin
  void keep_activations();
  void keep_logits();
  float* kept_logits(size_t chunk, size_t m) const;  // the chunk's kept logits of micro-batch m; null: none
  void create_events();
  // weights
  LayerTensors layer_weights_at(size_t layer, const char* slot) const;  // + the LoRA adapters' views
  LayerTensors for_micro_batch(const LayerTensors& w, size_t m) const;  // m's LoRA dropout masks
  LayerGradTensors frozen_grads_at(size_t layer) const;   // LoRA: adapters' gradients, norms' to scratch
  void lora_grads_land();                           // LoRA: the micro-batch's adapter gradients into G
  double lora_optimizer_step(AdamWParams params, double max_grad_norm, double weight_decay);
  // one pass over the micro-batches pass_ (one, or g layer-major); landed: the pass's landed_ mode
  struct LandedUpdate;
  std::vector<double> run_pass(const MicroBatch* mbs, size_t g, StepKind kind, float grad_scale,
                               const LandedUpdate* landed = nullptr);
  std::vector<double> pass_update(const MicroBatch* mbs, size_t g, float grad_scale, AdamWParams params,
                                  double weight_decay);
  void upload_tokens(const MicroBatch* mbs, size_t g);
  void forward();
  void embed_forward();
  float* ckpt_device(size_t layer, size_t m);  // where the input of `layer` for micro-batch m lives on the device
  void spill_checkpoint(size_t layer, size_t m, const float* out);
  void head_forward();
  void head_backward(float grad_scale);
  void final_norm_backward();
  void backward();
  void layer_backward_one(size_t layer, size_t m, const LayerTensors& w, char* grad_slot, const float* dout, float* dx);
  void* grad_share(size_t m, void* total, void* share, size_t bytes);
  void grad_share_add(void* total, const void* computed_in, size_t bytes);
  void fetch_checkpoint(size_t layer, size_t m);
  bool spilled_to_nvme(size_t layer) const;
  size_t spill_index(size_t layer, size_t m) const;
  void spill_read_ahead(size_t index);
  void layer_grad_to_host(size_t layer, char* grad_slot);
  void embed_backward(const std::vector<float*>& dx0);
  std::vector<double> finish_step(StepKind kind);
  // micro-batch m's rows of the per-micro-batch buffers (engine_buffers.h: g x ...)
  size_t act_floats() const { return size_t(shape_.tokens * shape_.C); }
  float* act(float* base, size_t m) const { return base + m * act_floats(); }
  double* ce_stats(size_t m) const { return buf_.ce_stats + 3 * m * size_t(shape_.tokens); }
  TokenContext token_context(size_t m) const;
  HeadTensors head_tensors(size_t m) const;
  Event* pp_saved(size_t layer, size_t m) { return ev_.pp_saved[(layer % 2) * shape_.group + m].get(); }
  Event* ckpt_fetched(size_t layer, size_t m) { return ev_.ckpt_fetched[(layer % 2) * shape_.group + m].get(); }
  Event* stage_free(size_t layer, size_t m) { return ev_.stage_free[(layer % 2) * shape_.group + m].get(); }
  // staging: device -> pinned host -> a task on the host queue
  uint64_t stage_to_host(const GradLanding& landing, void* staging, void* src, size_t bytes,
                         const std::shared_ptr<Event>& copied, uint64_t reuse, std::function<void()> task);
  // optimizer
  void begin_optimizer_pass(bool landed);
  void update_group_when_landed(size_t group);

  Device& dev_;
  HostStore& store_;
  LoraStore* lora_ = nullptr;  // LoRA mode: the adapters (the base is frozen)
  double lora_landed_norm_ = 0;
  bool lora_host_accumulation_ = false;  // data parallel: the adapters' step gradient sums on the host
  struct LoraDropoutPass {
    int64_t step = 1, next = 0, stride = 1;  // the next training pass's first micro-batch: next
    std::vector<uint64_t> seeds;             // this pass's keys, one per micro-batch
    double p = 0;                            // 0: none (forward-only)
  } lora_dropout_;
  EngineOptions opt_;
  EngineShape shape_;     // capacities: what every buffer is sized for
  size_t L_ = 0;
  struct PassMicroBatch {
    LayerDims dims;               // its shape (B, T set by upload_tokens)
    bool has_docs = false;
    std::vector<int32_t> ids;     // the embedding gather and scatter read them
    int64_t counted = 0;          // its counted tokens
    // its load-balancing loss (EngineOptions::router_aux_loss on an MoE model; host state the MoE
    // layers' forwards fill and their backwards read: TokenContext::moe_aux)
    mutable std::optional<MoeAuxLoss> aux;
  };
  std::vector<PassMicroBatch> pass_;  // the current pass's micro-batches

  // buffers: the table's rows, and where they are (engine_buffers.h)
  std::vector<EngineBuffer> table_;
  EngineBuffers buf_;
  LayerScratch ws_{};
  size_t device_ckpt_count_ = 0;   // layers [L - count, L) keep their input on the device
  size_t kept_layers_ = 0;         // layers [L - count, L) keep their forward activations
  size_t kept_chunks_ = 0;         // lm_head chunks [K - count, K) keep their logits
  std::vector<LayerScratch> kept_ws_;  // (L) ws_, or ws_ with the layer's kept activations

  // the weights on the device, the layer and chunk loops and the group updates' host queue
  // (layer_pass.h): every layer streamed through slots, lm_head in chunks through its own slots
  // (or resident with weights = "device"), the final norm resident
  std::unique_ptr<LayerPass> layer_pass_;

  // events (engine.cpp has the table: who records, who waits, what reuse each guards)
  struct Events {
    // per (layer parity, micro-batch of the pass): index (layer % 2) x g + m
    std::vector<std::unique_ptr<Event>> pp_saved, ckpt_fetched, stage_free;
    std::unique_ptr<Event> compute_done;
    std::vector<std::shared_ptr<Event>> grad_copied;              // per layer
    std::shared_ptr<Event> norm_grad_copied, dx0_copied, head_grad_copied[2], lora_grad_copied;
    std::unique_ptr<Event> loss_copied;
  } ev_;

  // the host side (the host queue is layer_pass_->host(); it holds each group's update ticket)
  uint64_t staging_ticket_[2] = {}, head_staging_ticket_[2] = {};  // host tasks reading staging
  uint64_t scatter_ticket_ = 0;              // the last embedding scatter (reads pass_[m].ids, dx0_host)
  uint64_t lora_staging_ticket_ = 0;         // data-parallel LoRA: the task reading lora_grad_staging

  // seams (one implementation each today)
  std::unique_ptr<LossObjective> objective_;
  std::unique_ptr<GroupOptimizer> optimizer_;
  std::unique_ptr<GradReduction> reduction_;

  struct LandedUpdate {
    bool active = false;
    bool update = true;                      // false: each landed group's sum of squares only (*_last)
    bool drop = false;                       // with update false: the gradient zeroed after its square (a norm pass)
    AdamWParams params;
    double weight_decay = 0;
    bool speculate = false;                  // *_last: the speculated groups' updates start too
  } landed_;                                 // forward_backward_update's pending updates
  // Speculation (engine.cpp): the backup of the speculated groups' master, m and v (offset[g],
  // SIZE_MAX: g not speculated), which groups hold an update waiting for the norm, and the
  // hyperparameters it ran with.
  struct Speculation {
    std::unique_ptr<char[]> backup;
    size_t bytes = 0;
    std::vector<size_t> offset;
    std::vector<uint8_t> pending;
    AdamWParams params;
    double weight_decay = 0;
    bool allowed = true;                     // false once data parallel reduces the gradients
    size_t updates = 0, redos = 0;
  } spec_;
  HostAdamW* adamw_ = nullptr;               // optimizer_, typed (null in LoRA mode)
  bool speculation_pending() const;
  void optimizer_queue_speculated(size_t group, const AdamWParams& params, double weight_decay);
  std::vector<double> group_sq_;             // per group: sum of squared gradients (it updated with)
  bool group_sq_gathered_ = false;           // a *_last pass gathered group_sq_ for the gradients now held
  std::vector<double> landed_pass(const MicroBatch* mbs, size_t g, float grad_scale, const LandedUpdate& mode);
  double global_norm();                      // sqrt of group_sq_ summed in group order; finite or exit
  double group_sum_of_squares(size_t group) const;  // of its gradient in store_.grad()
  template <class F>
  void exposed_wait(double* exposed, F&& wait);  // the trainer thread waits; adds what the device did not hide
  double d2h_wait_s_ = 0;
  double nvme_exposed_s_ = 0;                // the trainer thread waited on checkpoint files
  std::unique_ptr<CheckpointSpill> spill_;   // checkpoints = "nvme"
  bool spill_pass_ = false;                  // this pass writes checkpoints (a backward follows)
  bool backward_pass_ = false;               // a backward follows this pass's forward
};

}  // namespace strata
