// LoRA dropout's mask (issue 17, offload/state/lora.h): a counter-based function (seed, tensor, element)
// -> keep or drop, written once for the CPU (g++), the GPU (nvcc) and the CUDA emulator, so both
// backends, the backward's recomputation and a resumed run all draw the same mask, and the
// golden script (tools/golden/make_lora_grad_goldens.py) reproduces it in python.
//
//   word   = Philox4x32-10 word (element % 4) of block element / 4 under (seed, tensor): the
//            words of kernels/common/zo_rng.h (zo_block_words)
//   keep   = word >= threshold, threshold = floor(p · 2^32) (p in [0, 1): drop probability p
//            to within 2^-32)
//   out    = keep ? in · scale : 0, scale = f32(1 / (1 − p)) (inverted dropout, PEFT's
//            nn.Dropout), or with accumulate out + that; each operation rounded once (the CPU
//            file is compiled without contraction, the GPU uses __fmul_rn / __fadd_rn)
// The seed of one micro-batch is dropout_seed(run seed, step, micro-batch); tensor names the
// layer and the module (offload/state/lora.h: lora_dropout_tensor).
#pragma once
#include <cstdint>

#include "kernels/common/zo_rng.h"

namespace strata::dropout {
inline namespace STRATA_ZO_NS {

// Keeps the key of LoRA dropout apart from the zeroth-order perturbations' (zo_seed).
constexpr uint64_t kDropoutSalt = 0x4C6F526144726F70ull;  // "LoRaDrop"

STRATA_ZO_FN uint64_t dropout_seed(uint64_t run_seed, uint64_t step, uint64_t micro_batch) {
  return zo::zo_mix64(zo::zo_mix64(zo::zo_mix64(run_seed ^ kDropoutSalt) ^ step) ^ micro_batch);
}

// floor(p · 2^32) for p in [0, 1) (exact: a power-of-two product, truncated), and f32(1 / (1 − p)).
STRATA_ZO_FN uint32_t dropout_threshold(double p) { return uint32_t(p * 4294967296.0); }
STRATA_ZO_FN float dropout_scale(double p) { return float(1.0 / (1.0 - p)); }

// The four keep bits of block `block` (elements 4 block .. 4 block + 3) as bits 0..3.
STRATA_ZO_FN uint32_t dropout_keep4(uint64_t seed, uint32_t tensor, uint64_t block, uint32_t threshold) {
  uint32_t w0, w1, w2, w3;
  zo::zo_block_words(seed, tensor, block, w0, w1, w2, w3);
  return uint32_t(w0 >= threshold) | uint32_t(w1 >= threshold) << 1 | uint32_t(w2 >= threshold) << 2 |
         uint32_t(w3 >= threshold) << 3;
}

}  // namespace STRATA_ZO_NS
}  // namespace strata::dropout
