// The zeroth-order step engine (DESIGN §8b; MeZO streamed as ZO2 does): forward passes only,
// over the same host store and the same streamed layers as the first-order engine (engine.h).
//   - weights: two clean slots (layer i+1 crosses on h2d while layer i computes) and one
//     perturbed slot. While layer i sits in its clean slot, every pass of the engine's run goes
//     through it: the perturbed slot is rebuilt from the clean one (d2d copy, then p += sign·ε·
//     z(seed, row, element) per tensor, in f32, bf16 rounded once) for θ + εz, layer forward on
//     the x+ of each micro-batch; rebuilt again from the clean slot for θ − εz (never θ + εz − 2εz:
//     the rounding would differ), layer forward on each x−. Each layer crosses the link once per
//     run; nothing comes back but the losses.
//   - branches: a run is a list of (micro-batch, perturbation seed) pairs, each run at the sides
//     asked (θ + εz, θ − εz, or one of them): one branch per pair and side, each with its own
//     hidden states. One pair is one dual forward (offload.accumulation = "micro_batch": a step is
//     q x k runs, each moving the weights); a layer-major engine (EngineOptions::group = g = q x k)
//     runs the step's q perturbations x k micro-batches in one run, so a step moves the weights
//     once whatever k and q. Each branch computes what it would alone, so both give the same bits.
//   - embedding: gathered on the host from the working table and perturbed there with the
//     element indices of the full table (id·C + c), for each branch; a tied lm_head is the same
//     tensor (same row index, same z), perturbed again chunk by chunk on the device.
//   - head: final norm perturbed per seed and side; lm_head streamed in chunks through two clean
//     chunk slots and one perturbed chunk slot; each chunk serves every branch's online-softmax
//     statistics, so it too crosses once per run.
//   - no gradients, no checkpoints, no moments: the device holds three layer slots, three
//     lm_head chunk slots, every branch's hidden states (2g of them and one spare the layer
//     writes into before its output replaces its input) and one layer's workspace, whatever the
//     depth. With g = 1 below the first-order engine's forward-only footprint (which keeps two
//     f32 gradient slots and its backward buffers).
//   - update: the ZO-SGD step (offload/state/zo_sgd.h) runs on the host queue group by group after the
//     losses are known; the next pass waits for a group's update only when it is about to upload
//     that group, so the update of layer i overlaps the device computing layers < i.
// The clean slots, the embedding gather, the loops and the update tickets are the layer pass's
// (layer_pass.h); this engine supplies the perturbed bodies.
// z(seed, tensor, element) is kernels/common/zo_rng.h's generator: tensor = the parameter's row
// in the model's table (ModelSpec::params), element = the index in the full tensor.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "models/layer_kind.h"
#include "models/micro_batch.h"
#include "offload/engine/engine.h"
#include "offload/engine/layer_pass.h"
#include "offload/engine/step_engine.h"
#include "src/comm/comm.h"
#include "offload/stream/engine_buffers.h"
#include "offload/stream/host_queue.h"
#include "offload/state/host_store.h"
#include "offload/stream/weight_stream.h"
#include "offload/state/zo_sgd.h"

namespace strata {

// Summed losses over counted positions of one micro-batch.
struct ZoLosses {
  double plus = 0;   // L(θ + εz)
  double minus = 0;  // L(θ − εz)
};

// The ZO engine's buffers (device rows and pinned rows), from the engine's shape; `into` may be
// null when only sizes are wanted. g = EngineShape::group: (micro-batch, perturbation) pairs one
// run holds (1: one dual forward at a time), so 2g branches; micro-batch m of a run reads token row m.
struct ZoBuffers {
  std::vector<char*> slots;          // (slot_bytes) clean layer weights, 2 (1 when L = 1)
  char* perturbed = nullptr;         // (slot_bytes) θ ± εz of the current layer
  float* norm = nullptr;             // (C) clean final norm
  float* norm_perturbed = nullptr;   // (C)
  char* head_slots[2] = {};          // (R, C) clean lm_head chunks
  char* head_perturbed = nullptr;    // (R, C)
  std::vector<double*> ce_stats;     // 2g x (N, 3) per branch
  std::vector<float*> x;             // 2g + 1 x (N, C): each branch's hidden states, and a spare
  float* rstd_final = nullptr;       // (N)
  int32_t *ids = nullptr, *targets = nullptr, *pos = nullptr, *doc_start = nullptr;  // g x (N)
  double* loss = nullptr;            // (2g) summed loss per branch
  float* inv_freq = nullptr;         // (D/2)
  void* workspace = nullptr;         // one layer's forward activations, reused by every branch
  float* x0_host[2] = {};            // pinned (N, C): embedding outputs, alternately
};
std::vector<EngineBuffer> zo_buffer_table(const EngineShape& shape, ZoBuffers* into);
// The shape the ZO engine runs with: always streamed (its weights change every step).
EngineShape zo_engine_shape(const ModelSpec& spec, EngineOptions options);

// One zeroth-order step's settings (optim.*; train.seed).
struct ZoStepOptions {
  uint64_t seed = 0;      // train.seed
  double eps = 1e-3;      // optim.zo_eps
  int perturbations = 1;  // optim.zo_perturbations (q)
};

struct ZoStepOutcome {
  double loss_plus = 0, loss_minus = 0;  // token-mean L(θ ± εz), averaged over the q perturbations
  double projected_grad = 0;             // mean over j of g_j
  std::vector<double> projected;         // g_j
  size_t comm_bytes = 0;                 // the loss scalars this rank all-reduced (0 on one rank)
  double loss() const { return 0.5 * (loss_plus + loss_minus); }  // L(θ) to O(ε²)
};

// The ε the passes perturb with (an f32 value, as the device sees it).
inline double zo_eps_used(double eps) { return double(float(eps)); }

// The ranks as sides x data groups (distributed.zo: src/train/zo_step.h lays them out).
struct ZoParallel {
  int sides = 1;   // 1: both passes on each rank; 2: one side per rank of a pair
  int side = 0;    // with sides = 2: 0 runs θ + εz, 1 runs θ − εz
  int groups = 1;  // data groups
  int group = 0;   // this rank's
};

class ZoEngine;
// The step's perturbed passes and its queued update; `step` is 1-based. Throws (bad input) when a
// loss is not finite. `micro` is this rank's share of the step (all of it on one rank); `counted`
// the labelled tokens of the whole step. Its q x micro-batches (perturbation, micro-batch) pairs,
// perturbation-major, run g at a time (the engine's group: 1, one dual forward per run; q x k,
// the whole step in one run): the same bits either way. With several ranks (comm given, layout
// `par`) each rank computes its side's summed loss of each of its micro-batches, one all-reduce
// of those scalars (q x micro-batches x 2 doubles, each filled by one rank, zeros elsewhere: the
// sum is exact) gives every rank all of them, and each sums them in the single-process order:
// the losses, the projected gradients and hence the update are bit-identical to one process
// running the whole step.
ZoStepOutcome zo_step_run(ZoEngine& engine, const ZoStepOptions& options, const std::vector<MicroBatch>& micro,
                          int64_t counted, int64_t step, double lr, double weight_decay, const ZoParallel& par = {},
                          Comm* comm = nullptr);

// One (micro-batch, perturbation) pair of a run.
struct ZoPair {
  const MicroBatch* micro = nullptr;
  uint64_t seed = 0;
};

class ZoEngine final : public StepEngine {
 public:
  // The device bytes ZoEngine allocates for this model and micro-batch capacity (for budgets
  // and the memory comparison in README.md).
  static size_t device_bytes(const ModelSpec& spec, const EngineOptions& options);
  static size_t pinned_bytes(const ModelSpec& spec, const EngineOptions& options);

  ZoEngine(Device& dev, HostStore& store, const EngineOptions& options);
  ~ZoEngine();
  ZoEngine(const ZoEngine&) = delete;
  ZoEngine& operator=(const ZoEngine&) = delete;

  // Every pair at each side of `signs` (+1: θ + εz, −1: θ − εz, each once), in one run: each
  // layer crosses once. At most g pairs (EngineShape::group), at most g distinct micro-batches.
  // Returns the summed losses, pair i's side s at [i x signs.size() + s]; each is the same bits
  // as that pair's side in a run of its own.
  std::vector<double> perturbed_forwards(const std::vector<ZoPair>& pairs, float eps, const std::vector<int>& signs);
  // Both perturbed passes of one micro-batch under perturbation seed `seed` and step eps.
  ZoLosses dual_forward(const MicroBatch& mb, uint64_t seed, float eps);
  // One of the two (sign +1: θ + εz, −1: θ − εz): its summed loss, the same bits as that side
  // of dual_forward. ZO perturbation parallel runs one side on each rank of a pair.
  double perturbed_forward(const MicroBatch& mb, uint64_t seed, float eps, int sign);
  // The clean pass (eval; zo-probe's reference loss): summed loss.
  double forward_loss(const MicroBatch& mb) override;

  // The training step (StepEngine): zo_step_run with the settings set here (before the first
  // step; the defaults are one process, train.seed 0, eps 1e-3, one perturbation).
  void set_step(const ZoStepOptions& options, const ZoParallel& par = {}, Comm* comm = nullptr);
  StepOutcome train_step(const StepWork& work) override;

  // Queues the ZO-SGD update of every group (in group order) on the host queue; the next pass
  // waits for each group just before uploading it. Non-blocking.
  void queue_update(const ZoSgdEstimate& estimate, double lr, double weight_decay);

  void synchronize() override;  // every queued device and host task finished
  EngineStats stats() const override;
  size_t pinned_bytes() const override { return engine_pinned_bytes(table_); }
  // Bytes one run uploads as weights: every layer, the final norm, the lm_head (the tied
  // embedding table when tied); the embedding is gathered on the host and never crosses.
  size_t weight_link_bytes() const;
  const EngineShape& shape() const { return shape_; }

 private:
  struct Pass {
    int sign = 0;        // +1, -1, or 0: the clean weights
    uint64_t seed = 0;   // its perturbation
    size_t micro = 0;    // its micro-batch: the run's token row
  };
  // The perturbation the perturbed slot (or chunk, or norm) holds, so that passes of the same
  // seed and side in a row rebuild it once.
  struct Built {
    int sign = 0;
    uint64_t seed = 0;
    bool holds(const Pass& p) const { return sign != 0 && sign == p.sign && seed == p.seed; }
  };
  // Runs `passes` over `micro` (at most g micro-batches; passes of one seed and side next to each
  // other rebuild its weights once); their summed losses into loss_host_[0, passes).
  void run(const std::vector<const MicroBatch*>& micro, const std::vector<Pass>& passes, float eps);
  void upload_tokens(const std::vector<const MicroBatch*>& micro);
  void embed_forward(const std::vector<const MicroBatch*>& micro, const std::vector<Pass>& passes, float eps);
  // the weights a pass reads: the clean copy, or the perturbed slot rebuilt from it
  const char* layer_weights_for(const Pass& p, const char* clean, size_t layer, float eps, Built& built);
  LayerDims dims_of(const MicroBatch& mb) const;

  Device& dev_;
  HostStore& store_;
  EngineShape shape_;
  LayerDims dims_;  // the capacity; each pass's B, T are its micro-batch's
  size_t L_ = 0;
  std::vector<EngineBuffer> table_;
  ZoBuffers buf_;
  LayerScratch ws_{};
  // the clean layer slots, lm_head chunk slots and final norm, and the updates' host queue
  std::unique_ptr<LayerPass> layer_pass_;
  std::vector<double> loss_host_;  // (2g) the run's losses, copied back
  std::unique_ptr<HostZoSgd> optimizer_;
  ZoStepOptions step_options_;
  ZoParallel par_;
  Comm* comm_ = nullptr;
};

}  // namespace strata
