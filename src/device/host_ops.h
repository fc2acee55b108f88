// Host-side ops: math the engine runs on host memory (on its host queue) rather than on a
// device stream, with the CPU kernels whatever the device backend is. The embedding lives
// here: its (V, C) table and gradient stay on the host (no V x C upload), so its backward is a
// scatter-add into the host gradient. So does zeroth-order training's host math: the
// embedding rows perturbed on the host, the ZO-SGD update of the host master, and the per-step
// seeds (kernels/cpu/zo.h, kernels/common/zo_rng.h: the same numbers the device's zo_perturb makes).
#pragma once
#include <cstdint>

namespace strata {

// dtable (V,C) += scatter of dout (N,C) by ids (N), in token order (kernels/cpu/ops.h).
void host_embedding_backward(float* dtable, const float* dout, const int32_t* ids, int64_t n,
                             int64_t c);

// p (n) += scale * z(seed, tensor, offset + i), in f32 (kernels/cpu/zo.h: zo_perturb_f32).
void host_zo_perturb_f32(float* p, uint64_t seed, uint32_t tensor, uint64_t offset, float scale, int64_t n);

// The ZO-SGD step of one tensor piece over q perturbations (kernels/cpu/zo.h: zo_sgd_update).
void host_zo_sgd_update(float* master, void* working, bool working_bf16, const uint64_t* seeds, const float* coefs,
                        int q, uint32_t tensor, uint64_t offset, float lr, float wd, int64_t n);

// The key of perturbation j of step `step` of a run seeded with `base` (kernels/common/zo_rng.h).
uint64_t host_zo_seed(uint64_t base, uint64_t step, uint32_t perturbation);

// The key of LoRA dropout's masks for one micro-batch of one step (kernels/common/dropout_mask.h:
// the masks the device's dropout_apply draws from it).
uint64_t host_dropout_seed(uint64_t base, uint64_t step, uint64_t micro_batch);

}  // namespace strata
