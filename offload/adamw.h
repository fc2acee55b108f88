// CPU AdamW over fp32 master weights (DESIGN §3, §6): one fused pass per element — clip scale,
// decoupled weight decay, moment updates, bias correction, master update — that also writes
// the working copy the device reads (f32 or bf16, round to nearest even). torch.optim.AdamW
// semantics, operation for operation in f32 (the order is spelt out in adamw_kernels.h; it
// reproduces Debian's torch 1.13 CPU AdamW bit for bit):
//   g = grad * clip_scale;  p *= 1 - lr wd;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   p -= lr / (1-b1^t) * m / (sqrt(v) / sqrt(1-b2^t) + eps)
// Moments are f32, or bf16 as an option (stored bf16, computed in f32, rounded back).
//
// Variants: AVX-512, AVX2 and scalar, picked at run time from what the CPU offers (the choice is
// logged once to stderr, "adamw: avx512"; STRATA_ADAMW_ISA=scalar|avx2|avx512 overrides it).
// All three give identical bits, and so does any thread count: the update is elementwise, the
// operation order is the same in every variant, and the same two multiply-adds are fused in all.
#pragma once
#include <cstdint>

#include "src/core/dtype.h"

namespace strata {

// Hyperparameters in double, as the recipe and Python hold them; the kernel rounds each derived
// constant (1 - lr wd, 1 - b1, lr / (1 - b1^t), ...) to f32 once.
struct AdamWParams {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  int64_t step = 1;          // 1-based, for bias correction
  double clip_scale = 1.0;   // global-norm clipping factor applied to the gradient
};

enum class AdamWIsa : uint8_t { scalar, avx2, avx512 };  // avx2 means AVX2 + FMA; avx512: F, BW, VL

const char* adamw_isa_name(AdamWIsa isa);     // "scalar", "avx2", "avx512"
bool adamw_isa_supported(AdamWIsa isa);       // this CPU can run the variant
AdamWIsa adamw_isa_best();                    // the widest variant this CPU can run
// The variant adamw_update uses: STRATA_ADAMW_ISA if set (an error if unknown or unsupported),
// else adamw_isa_best(). Decided and logged once, on the first call.
AdamWIsa adamw_isa_active();

// n elements: master, m, v updated in place from grad; working (dtype `working_type`, f32 or
// bf16) receives the new weights rounded to its dtype (may be null). OpenMP threads over
// static, cache-line aligned chunks when n is large.
void adamw_update(float* master, float* m, float* v, const float* grad, void* working,
                  DType working_type, int64_t n, const AdamWParams& p);

// The same with bf16 moments: m and v are read as bf16, computed in f32, rounded back.
void adamw_update_bf16_moments(float* master, bf16* m, bf16* v, const float* grad, void* working,
                               DType working_type, int64_t n, const AdamWParams& p);

// The general entry the two above call: an explicit variant (tests, the benchmark) and moments
// of `moment_type` (f32 or bf16). Throws strata::Error if the CPU cannot run `isa`.
void adamw_update_isa(AdamWIsa isa, float* master, void* m, void* v, DType moment_type,
                      const float* grad, void* working, DType working_type, int64_t n,
                      const AdamWParams& p);

// The plain fp64 reference of the same update, for tests.
void adamw_update_ref(double* master, double* m, double* v, const double* grad, int64_t n,
                      const AdamWParams& p);

// Sum of squares in double, in fixed-size chunks summed in order (thread-count independent).
double sum_of_squares(const float* x, int64_t n);

}  // namespace strata
