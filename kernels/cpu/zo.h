// Zeroth-order kernels on the CPU (DESIGN §8b): generate the perturbation z, perturb a tensor in
// place (the CPU backend's device op), and the ZO-SGD update of fp32 master weights on the host.
// z(seed, tensor, i) is kernels/common/zo_rng.h's Gaussian of element i of tensor `tensor`; a
// call covers elements [offset, offset + n) of the tensor, so a tensor may be processed in
// pieces. Outputs, then inputs, then sizes. Plain-loop twins: kernels/cpu/ref/zo.h.
//
// Fast paths: z is made by blocks of one Philox call (4 elements), vectorised, into a 256-element
// buffer, then applied in one elementwise pass; OpenMP splits the range into chunks aligned to
// the tensor's global index. Every element is a function of its index alone, so the results are
// bitwise those of the twins, whatever the thread count or the split into pieces.
// kernels/cpu/zo.cpp is compiled with -ffp-contract=off (CMakeLists.txt): no multiply-add is
// fused, as on the GPU.
#pragma once
#include <cstdint>

#include "src/core/bf16.h"

namespace strata::cpu {

// z (n) = z(seed, tensor, offset + i).
void zo_generate(float* z, uint64_t seed, uint32_t tensor, uint64_t offset, int64_t n);

// p (n) += scale * z(seed, tensor, offset + i): the product rounded to f32, then the sum rounded
// to f32 (bf16: p read as f32, the f32 result rounded to nearest even once).
void zo_perturb_f32(float* p, uint64_t seed, uint32_t tensor, uint64_t offset, float scale,
                    int64_t n);
void zo_perturb_bf16(bf16* p, uint64_t seed, uint32_t tensor, uint64_t offset, float scale,
                     int64_t n);

// The ZO-SGD step of one tensor (or a piece of it) over q perturbations:
//   gz = Σ_{j<q} coef[j] * z(seed[j], tensor, offset + i)   (in j order; coef[j] = g_j / q)
//   master (n) = master - lr * (gz + wd * master)
// working (n, f32 or bf16 when working_bf16; may be null) receives the new master weights
// rounded to its dtype. Weight decay 0 for tensors that take none.
void zo_sgd_update(float* master, void* working, bool working_bf16, const uint64_t* seeds,
                   const float* coefs, int q, uint32_t tensor, uint64_t offset, float lr,
                   float wd, int64_t n);

// The transform's pieces, exposed for the accuracy sweeps of the tests: ln(k / 2^24) for k in
// [1, 2^24], and sin, cos of 2π j / 2^24 for j in [0, 2^24).
float zo_probe_ln_unit(uint32_t k);
void zo_probe_sincos_turn(uint32_t j, float* sin_out, float* cos_out);

}  // namespace strata::cpu
