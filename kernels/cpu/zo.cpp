// Zeroth-order kernels, fast CPU paths and their f32 plain-loop twins (kernels/cpu/zo.h,
// kernels/cpu/ref/zo.h). Compiled with -ffp-contract=off and STRATA_ZO_NO_CONTRACT defined
// (CMakeLists.txt), which is what lets kernels/common/zo_rng.h define its float transform here.
#include "kernels/cpu/zo.h"

#include <algorithm>
#include <type_traits>

#include "kernels/common/zo_rng.h"
#include "kernels/cpu/ref/zo.h"
#include "src/core/error.h"

#if !defined(STRATA_ZO_NO_CONTRACT)
#error "kernels/cpu/zo.cpp must be compiled with -ffp-contract=off -DSTRATA_ZO_NO_CONTRACT"
#endif

namespace strata::cpu {
namespace {

constexpr int64_t kChunk = 256;            // elements per buffer of z; a multiple of 4
constexpr int64_t kParallelMin = 1 << 14;  // elements; fewer are not worth waking threads
constexpr int kMaxPerturbations = 64;      // q of one update call

void zo_check(uint64_t offset, int64_t n, const char* what) {
  STRATA_CHECK(n >= 0, what, ": need n >= 0, got n=", n);
  STRATA_CHECK(offset <= UINT64_MAX - uint64_t(n) - kChunk, what, ": element range [", offset,
               ", ", offset, " + ", n, ") overflows the 64-bit element index");
}

// buf[4 j + l] = z of element 4 (b0 + j) + l, for j < nb. One Philox call per iteration; the
// loop is vectorised across blocks (integer Philox, then the branch-free transform).
void gaussian_blocks(float* buf, uint64_t seed, uint32_t tensor, uint64_t b0, int64_t nb) {
#pragma omp simd
  for (int64_t j = 0; j < nb; ++j) {
    float z0, z1, z2, z3;
    zo::zo_gaussian4(seed, tensor, b0 + uint64_t(j), z0, z1, z2, z3);
    buf[4 * j + 0] = z0;
    buf[4 * j + 1] = z1;
    buf[4 * j + 2] = z2;
    buf[4 * j + 3] = z3;
  }
}

// Calls body(buf, b0, nb, skip, i0, len) for consecutive pieces of [0, n), each given a buffer of
// kChunk floats: the piece covers elements offset + i0 .. offset + i0 + len of the tensor, which
// lie in Philox blocks b0 .. b0 + nb; once gaussian_blocks(buf, ..., b0, nb) has filled the
// buffer, element offset + i0 sits at buf[skip]. Pieces follow kChunk-aligned global indices
// (so no piece depends on the thread count) and are spread over OpenMP threads when n is large.
template <class Body>
void for_each_chunk(uint64_t offset, int64_t n, Body body) {
  if (n == 0) return;
  const uint64_t first = offset / kChunk, last = (offset + uint64_t(n) - 1) / kChunk;
  const int64_t chunks = int64_t(last - first) + 1;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t c = 0; c < chunks; ++c) {
    alignas(64) float buf[kChunk];
    const uint64_t g0 = std::max<uint64_t>(offset, (first + uint64_t(c)) * kChunk);
    const uint64_t g1 =
        std::min<uint64_t>(offset + uint64_t(n), (first + uint64_t(c) + 1) * kChunk);
    const uint64_t b0 = g0 / 4, b1 = (g1 + 3) / 4;
    body(buf, b0, int64_t(b1 - b0), g0 - 4 * b0, int64_t(g0 - offset), int64_t(g1 - g0));
  }
}

}  // namespace

void zo_generate(float* z, uint64_t seed, uint32_t tensor, uint64_t offset, int64_t n) {
  zo_check(offset, n, "zo_generate");
  for_each_chunk(offset, n,
                 [&](float* buf, uint64_t b0, int64_t nb, uint64_t skip, int64_t i0, int64_t len) {
                   gaussian_blocks(buf, seed, tensor, b0, nb);
                   std::copy(buf + skip, buf + skip + len, z + i0);
                 });
}

namespace {

// p (n, f32 or bf16) += scale * z: read as f32, computed in f32, stored back (bf16: rounded once).
template <class T>
void zo_perturb(T* p, uint64_t seed, uint32_t tensor, uint64_t offset, float scale, int64_t n) {
  zo_check(offset, n, "zo_perturb");
  for_each_chunk(offset, n,
                 [&](float* buf, uint64_t b0, int64_t nb, uint64_t skip, int64_t i0, int64_t len) {
                   gaussian_blocks(buf, seed, tensor, b0, nb);
                   const float* zc = buf + skip;
                   T* pc = p + i0;
#pragma omp simd
                   for (int64_t i = 0; i < len; ++i) {
                     if constexpr (std::is_same_v<T, bf16>)
                       pc[i] = f32_to_bf16(zo::zo_perturbed(bf16_to_f32(pc[i]), scale, zc[i]));
                     else
                       pc[i] = zo::zo_perturbed(pc[i], scale, zc[i]);
                   }
                 });
}

}  // namespace

void zo_perturb_f32(float* p, uint64_t seed, uint32_t tensor, uint64_t offset, float scale,
                    int64_t n) {
  zo_perturb(p, seed, tensor, offset, scale, n);
}

void zo_perturb_bf16(bf16* p, uint64_t seed, uint32_t tensor, uint64_t offset, float scale,
                     int64_t n) {
  zo_perturb(p, seed, tensor, offset, scale, n);
}

void zo_sgd_update(float* master, void* working, bool working_bf16, const uint64_t* seeds,
                   const float* coefs, int q, uint32_t tensor, uint64_t offset, float lr,
                   float wd, int64_t n) {
  zo_check(offset, n, "zo_sgd_update");
  STRATA_CHECK(q >= 1 && q <= kMaxPerturbations, "zo_sgd_update: the number of perturbations must "
               "be in [1, ", kMaxPerturbations, "], got ", q);
  auto* work_f32 = working_bf16 ? nullptr : static_cast<float*>(working);
  auto* work_bf16 = working_bf16 ? static_cast<bf16*>(working) : nullptr;
  for_each_chunk(offset, n,
                 [&](float* buf, uint64_t b0, int64_t nb, uint64_t skip, int64_t i0, int64_t len) {
                   alignas(64) float gz[kChunk];
                   for (int j = 0; j < q; ++j) {
                     gaussian_blocks(buf, seeds[j], tensor, b0, nb);
                     const float* zc = buf + skip;
                     const float c = coefs[j];
                     if (j == 0) {
#pragma omp simd
                       for (int64_t i = 0; i < len; ++i) gz[i] = zo::zo_mul(c, zc[i]);
                     } else {
#pragma omp simd
                       for (int64_t i = 0; i < len; ++i)
                         gz[i] = zo::zo_add(gz[i], zo::zo_mul(c, zc[i]));
                     }
                   }
                   float* m = master + i0;
#pragma omp simd
                   for (int64_t i = 0; i < len; ++i) m[i] = zo::zo_sgd_updated(m[i], gz[i], lr, wd);
                   if (work_f32) std::copy(m, m + len, work_f32 + i0);
                   if (work_bf16) {
#pragma omp simd
                     for (int64_t i = 0; i < len; ++i) work_bf16[i0 + i] = f32_to_bf16(m[i]);
                   }
                 });
}

float zo_probe_ln_unit(uint32_t k) { return zo::zo_ln_unit(k); }
void zo_probe_sincos_turn(uint32_t j, float* sin_out, float* cos_out) {
  zo::zo_sincos_turn(j, sin_out, cos_out);
}

}  // namespace strata::cpu

// ---- the f32 twins: one element at a time ------------------------------------------------------
namespace strata::ref {

void zo_generate(float* z, uint64_t seed, uint32_t tensor, uint64_t offset, int64_t n) {
  for (int64_t i = 0; i < n; ++i) z[i] = zo::zo_gaussian(seed, tensor, offset + uint64_t(i));
}

void zo_perturb_f32(float* p, uint64_t seed, uint32_t tensor, uint64_t offset, float scale,
                    int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    p[i] = zo::zo_perturbed(p[i], scale, zo::zo_gaussian(seed, tensor, offset + uint64_t(i)));
}

void zo_perturb_bf16(bf16* p, uint64_t seed, uint32_t tensor, uint64_t offset, float scale,
                     int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float z = zo::zo_gaussian(seed, tensor, offset + uint64_t(i));
    p[i] = f32_to_bf16(zo::zo_perturbed(bf16_to_f32(p[i]), scale, z));
  }
}

void zo_sgd_update(float* master, void* working, bool working_bf16, const uint64_t* seeds,
                   const float* coefs, int q, uint32_t tensor, uint64_t offset, float lr,
                   float wd, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float gz = 0;
    for (int j = 0; j < q; ++j) {
      const float t = zo::zo_mul(coefs[j], zo::zo_gaussian(seeds[j], tensor, offset + uint64_t(i)));
      gz = j == 0 ? t : zo::zo_add(gz, t);
    }
    master[i] = zo::zo_sgd_updated(master[i], gz, lr, wd);
    if (working && working_bf16) static_cast<bf16*>(working)[i] = f32_to_bf16(master[i]);
    if (working && !working_bf16) static_cast<float*>(working)[i] = master[i];
  }
}

}  // namespace strata::ref
