// The loss head's objective: what the engine's chunked lm_head computes between its forward
// (stats) pass and its backward pass (engine.h, "head"). The engine streams the lm_head chunks
// and owns every buffer; an objective turns the per-token online-softmax statistics (N, 3) into
// the summed loss, and runs the backward of one vocab chunk.
//
// Two implementations: token cross-entropy (SFT, below) and the preference head (offload/
// preference_head.h), which reads per-sequence log-prob sums from the same statistics in loss()
// and weights each sequence's tokens in the backward.
#pragma once
#include <cstdint>

#include "src/device/device.h"

namespace strata {

// The head's buffers and sizes for one micro-batch, as the objective sees them (device).
struct HeadTensors {
  const float* h = nullptr;            // (N, C) final-norm output
  const int32_t* targets = nullptr;    // (N) labels, -100 ignored
  const double* stats = nullptr;       // (N, 3) online-softmax statistics over all chunks
  int64_t n = 0, c = 0, v = 0;         // N, C, V
  size_t m = 0;                        // the micro-batch's index in the engine's pass (layer-major: 0..g-1)
};

class LossObjective {
 public:
  virtual ~LossObjective() = default;
  // One vocab chunk of the stats pass into stats (N, 3) (first: chunk 0 sets them): the plain
  // statistics; an objective that keeps more per token (GRPO's entropy) runs its variant here.
  virtual void chunk_stats(double* stats, const HeadTensors& head, const void* w_chunk, DType w_type, int64_t v0,
                           int64_t vc, bool first, float* keep_logits, Device& dev, Stream s) {
    dev.lm_head_ce_chunk_stats(stats, head.h, w_chunk, w_type, head.targets, head.n, head.c, head.v, v0, vc, first,
                               keep_logits, s);
  }
  // After the stats pass over every chunk: *loss_sum (device, zeroed) += the summed loss.
  virtual void loss(double* loss_sum, const HeadTensors& head, Device& dev, Stream s) = 0;
  // One vocab chunk's backward: dh (N, C) += and dw_chunk (vc, C) += the gradient of
  // grad_scale * loss through lm_head rows [v0, v0 + vc) held in w_chunk (dw_chunk null: dh only,
  // the head is frozen). kept_logits: the chunk's logits as the stats pass kept them (Device::
  // lm_head_ce_chunk_stats' keep_logits), consumed; null: recomputed.
  virtual void chunk_backward(float* dh, float* dw_chunk, const HeadTensors& head, const void* w_chunk,
                              DType w_type, int64_t v0, int64_t vc, float grad_scale, float* kept_logits,
                              Device& dev, Stream s) = 0;
};

// The summed token cross-entropy over counted positions (kernels/cpu/ops.h lm_head_ce_chunk_*).
class TokenCrossEntropy final : public LossObjective {
 public:
  void loss(double* loss_sum, const HeadTensors& head, Device& dev, Stream s) override {
    dev.lm_head_ce_stats_loss(loss_sum, head.stats, head.targets, head.n, head.v, s);
  }
  void chunk_backward(float* dh, float* dw_chunk, const HeadTensors& head, const void* w_chunk, DType w_type,
                      int64_t v0, int64_t vc, float grad_scale, float* kept_logits, Device& dev, Stream s) override {
    dev.lm_head_ce_chunk_backward(dh, dw_chunk, head.h, w_chunk, w_type, head.stats, head.targets, head.n,
                                  head.c, head.v, v0, vc, grad_scale, kept_logits, s);
  }
};

}  // namespace strata
