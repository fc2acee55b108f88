// Forward-only per-token log-probabilities of fixed rows over a host store: GRPO's reference
// model (issue 41, grpo.beta > 0). Under LoRA the reference is the frozen base with the adapters
// off, i.e. the training store read without adapters (no extra host memory); in full fine-tuning
// it is a frozen copy of the starting weights (frozen_weights_copy below). Either way one more
// streamed forward per micro-batch of a generation batch: embedding (gathered on the host),
// every layer through its kind's forward (the training forward, as the generator's prefill),
// the final norm, and the lm_head chunks' online-softmax statistics
// (Device::lm_head_ce_chunk_stats: the engine's own head op, same chunks), so a token's log p =
// z_target - max - log Σ exp(z - max) as GrpoHead reads it from the training pass. Never T x V
// logits on the host.
//
// Device buffers (a table like the generator's, allocated for the scorer's life: GrpoStep builds
// it after sampling and frees it before the training passes): the forward workspace and two
// hidden-state buffers for N = max_tokens, positions, the final norm's output and rstd (N), the
// targets (N), the statistics (N, 3 doubles), two streamed layer weight slots (one when L = 1),
// min(2, K) lm_head chunk slots. Temperature: as the engine's passes, through the final norm's
// weight (GrpoTemperature on the store, offload/objective/grpo_head.h), which the scorer uploads at
// its first pass.
// Legend: B rows, T tokens per row, N = B x T, C hidden, V vocab, R lm_head rows per chunk, K chunks.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "models/micro_batch.h"
#include "offload/engine/layer_pass.h"
#include "offload/state/host_store.h"
#include "offload/stream/engine_buffers.h"

namespace strata {

// Where the scorer keeps its buffers; device pointers unless marked.
struct TokenScorerBuffers {
  void* workspace = nullptr;                   // one layer's forward activations (B, T)
  float *x_a = nullptr, *x_b = nullptr;        // (N, C) a pass's input and output, ping-pong
  float *hn = nullptr, *rstd = nullptr;        // (N, C), (N) the final norm's output
  int32_t *pos = nullptr, *targets = nullptr;  // (N)
  float* inv_freq = nullptr;                   // (D/2)
  float* final_norm = nullptr;                 // (C)
  double* stats = nullptr;                     // (N, 3) online-softmax statistics
  std::vector<char*> weight_slots, head_slots; // two streamed layer slots (one when L = 1), min(2, K) chunks
  float* x_host = nullptr;                     // pinned (N, C): the embedding gathered
};
// Every device row, then the pinned row, for passes of up to B rows x T tokens; rows bind into
// `into` (null: sizes only). token_scorer_device_bytes: their device bytes as the arena rounds them.
std::vector<EngineBuffer> token_scorer_buffer_table(const ModelSpec& spec, int64_t B, int64_t T,
                                                    TokenScorerBuffers* into);
size_t token_scorer_device_bytes(const ModelSpec& spec, int64_t B, int64_t T);

class TokenScorer {
 public:
  // Buffers for micro-batches of up to B rows x T tokens.
  TokenScorer(Device& dev, HostStore& store, int64_t B, int64_t T);
  ~TokenScorer();
  TokenScorer(const TokenScorer&) = delete;
  TokenScorer& operator=(const TokenScorer&) = delete;

  // (N) by position: log p(mb.targets[i] | mb.ids of its row up to i); NaN where targets[i] is
  // -100 (not counted). The micro-batch's rows have no document starts (GRPO's rows).
  std::vector<double> token_logps(const MicroBatch& mb);
  double seconds() const { return seconds_; }  // time in token_logps so far

 private:
  Device& dev_;
  HostStore& store_;
  LayerDims capacity_;  // the B, T the buffers hold
  TokenScorerBuffers buf_;
  std::vector<EngineBuffer> table_;
  std::unique_ptr<LayerPass> layer_pass_;
  std::vector<double> stats_host_;
  double seconds_ = 0;
};

// Full fine-tuning's reference: a frozen weights-only copy of `store`'s working weights as they
// are now (the starting model), in the same dtypes (bf16 with bf16 weights: 2 bytes a
// parameter), the layers a derived working copy keeps none of made from the master.
std::unique_ptr<HostStore> frozen_weights_copy(Device& dev, const HostStore& store);

}  // namespace strata
