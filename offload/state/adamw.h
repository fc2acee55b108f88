// CPU AdamW over fp32 master weights (DESIGN §3, §6): one fused pass per element — clip scale,
// decoupled weight decay, moment updates, bias correction, master update — that also writes
// the working copy the device reads (f32 or bf16, round to nearest even). torch.optim.AdamW
// semantics, operation for operation in f32 (the order is spelt out in adamw_kernels.h; it
// reproduces Debian's torch 1.13 CPU AdamW bit for bit):
//   g = grad * clip_scale;  p *= 1 - lr wd;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   p -= lr / (1-b1^t) * m / (sqrt(v) / sqrt(1-b2^t) + eps)
// Moments are f32, or bf16 as an option (optim.moments_dtype: stored bf16, computed in f32,
// rounded back). bf16 moments are rounded back either to nearest even or stochastically
// (AdamWParams::stochastic_round): with beta2 = 0.999 one step moves v by 0.1% of (g^2 - v),
// below half a bf16 ulp (2^-9 relative), so under round-to-nearest v stops following g^2 once
// it is within ~3x of it (and m likewise for beta1 > 0.996). Stochastic rounding keeps every
// stored moment unbiased (E[round(x)] = x). Its random bits are counter based: element i of
// a call draws adamw_round_bits(key, counter + i), with the key from (step, parameter row,
// array) — no generator state, so the bits do not depend on the ISA, the thread split, how
// NVMe cuts a row into ranges, or a resume.
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
  // bf16 moments only: round them back stochastically (else to nearest even). Element i of the
  // call uses counter round_counter + i (mod 2^32) under keys round_key_m (m) and round_key_v (v).
  bool stochastic_round = false;
  uint32_t round_key_m = 0, round_key_v = 0;
  uint32_t round_counter = 0;
};

// The keys of one parameter row's stochastic rounding at `step` (m and v differ): a splitmix64
// of (seed, step, row). The caller then counts elements from the row's first (round_counter).
void adamw_round_keys(uint64_t seed, int64_t step, uint64_t row, uint32_t& key_m, uint32_t& key_v);

// The 32 random bits of element `counter` under `key` (lowbias32 of counter ^ key); a
// stochastic rounding to bf16 adds the top 16 to the f32 bits and truncates.
inline uint32_t adamw_round_bits(uint32_t key, uint32_t counter) {
  uint32_t x = counter ^ key;
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

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

// Sum of squares in double, in fixed-size chunks summed in order (thread-count independent),
// each chunk over 32 lanes combined in lane order.
double sum_of_squares(const float* x, int64_t n);

}  // namespace strata
