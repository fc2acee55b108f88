#include "src/device/host_ops.h"

#include "kernels/common/dropout_mask.h"
#include "kernels/common/zo_rng.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/zo.h"

namespace strata {

void host_embedding_backward(float* dtable, const float* dout, const int32_t* ids, int64_t n,
                             int64_t c) {
  cpu::embedding_backward(dtable, dout, ids, n, c);
}

void host_zo_perturb_f32(float* p, uint64_t seed, uint32_t tensor, uint64_t offset, float scale, int64_t n) {
  cpu::zo_perturb_f32(p, seed, tensor, offset, scale, n);
}

void host_zo_sgd_update(float* master, void* working, bool working_bf16, const uint64_t* seeds, const float* coefs,
                        int q, uint32_t tensor, uint64_t offset, float lr, float wd, int64_t n) {
  cpu::zo_sgd_update(master, working, working_bf16, seeds, coefs, q, tensor, offset, lr, wd, n);
}

uint64_t host_zo_seed(uint64_t base, uint64_t step, uint32_t perturbation) {
  return zo::zo_seed(base, step, perturbation);
}

uint64_t host_dropout_seed(uint64_t base, uint64_t step, uint64_t micro_batch) {
  return dropout::dropout_seed(base, step, micro_batch);
}

}  // namespace strata
