// CPU AdamW: the run-time choice of variant, the f32 constants, the split over OpenMP threads,
// and the fp64 reference. The kernels themselves are in adamw_kernels_<isa>.cpp.
#include "offload/state/adamw.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string_view>
#include <vector>

#include "offload/state/adamw_kernels.h"
#include "src/core/error.h"

namespace strata {

using adamw_detail::AdamWSpan;

const char* adamw_isa_name(AdamWIsa isa) {
  constexpr const char* kNames[] = {"scalar", "avx2", "avx512"};  // AdamWIsa's order
  return size_t(isa) < std::size(kNames) ? kNames[size_t(isa)] : "?";
}

bool adamw_isa_supported(AdamWIsa isa) {
  __builtin_cpu_init();
  switch (isa) {
    case AdamWIsa::scalar: return true;
    case AdamWIsa::avx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case AdamWIsa::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl");
  }
  return false;
}

AdamWIsa adamw_isa_best() {
  if (adamw_isa_supported(AdamWIsa::avx512)) return AdamWIsa::avx512;
  if (adamw_isa_supported(AdamWIsa::avx2)) return AdamWIsa::avx2;
  return AdamWIsa::scalar;
}

AdamWIsa adamw_isa_active() {
  static AdamWIsa active = [] {
    AdamWIsa isa = adamw_isa_best();
    if (const char* env = std::getenv("STRATA_ADAMW_ISA"); env && *env) {
      const std::string_view want(env);
      bool found = false;
      for (AdamWIsa c : {AdamWIsa::scalar, AdamWIsa::avx2, AdamWIsa::avx512}) {
        if (want == adamw_isa_name(c)) {
          isa = c;
          found = true;
        }
      }
      STRATA_CHECK(found, "STRATA_ADAMW_ISA=", want, " is not a variant; use scalar, avx2 or avx512");
      STRATA_CHECK(adamw_isa_supported(isa), "STRATA_ADAMW_ISA=", want,
                   " but this CPU cannot run it; unset it or pick a narrower one");
    }
    std::fprintf(stderr, "adamw: %s\n", adamw_isa_name(isa));
    return isa;
  }();
  return active;
}

namespace {

AdamWConstants adamw_make_consts(const AdamWParams& p) {
  return adamw_constants(p.lr, p.beta1, p.beta2, p.eps, p.weight_decay, p.step, p.clip_scale);
}

using AdamWKernel = void (*)(const AdamWConstants&, const AdamWSpan&, int64_t, int64_t);

AdamWKernel adamw_kernel_for(AdamWIsa isa) {
  switch (isa) {
    case AdamWIsa::scalar: return adamw_detail::adamw_kernel_scalar;
    case AdamWIsa::avx2: return adamw_detail::adamw_kernel_avx2;
    case AdamWIsa::avx512: return adamw_detail::adamw_kernel_avx512;
  }
  return adamw_detail::adamw_kernel_scalar;
}

// Below this many elements one thread does the whole update (a parallel region costs more).
constexpr int64_t kAdamWSerialBelow = int64_t(1) << 15;
// Threads get whole blocks of this many elements: 256 bytes of f32, 128 of bf16, so no two
// threads write the same cache line (given 64-byte aligned buffers).
constexpr int64_t kAdamWBlock = 64;

}  // namespace

void adamw_update_isa(AdamWIsa isa, float* master, void* m, void* v, DType moment_type,
                      const float* grad, void* working, DType working_type, int64_t n,
                      const AdamWParams& p) {
  STRATA_CHECK(n >= 0, "AdamW over ", n, " elements");
  STRATA_CHECK(moment_type == DType::f32 || moment_type == DType::bf16,
               "AdamW moments must be f32 or bf16, not ", dtype_name(moment_type));
  STRATA_CHECK(!working || working_type == DType::f32 || working_type == DType::bf16,
               "the AdamW working copy must be f32 or bf16, not ", dtype_name(working_type));
  STRATA_CHECK(adamw_isa_supported(isa), "AdamW variant ", adamw_isa_name(isa),
               " cannot run on this CPU");
  if (n == 0) return;
  const AdamWConstants c = adamw_make_consts(p);
  const AdamWSpan s{master, m, v, grad, working, moment_type, working_type,
                    moment_type == DType::bf16 && p.stochastic_round, p.round_key_m, p.round_key_v, p.round_counter};
  const AdamWKernel kernel = adamw_kernel_for(isa);
  if (n < kAdamWSerialBelow || omp_get_max_threads() == 1) {
    kernel(c, s, 0, n);
    return;
  }
  const int64_t blocks = (n + kAdamWBlock - 1) / kAdamWBlock;
#pragma omp parallel
  {
    // static partition: thread t always gets the same range for the same n
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t begin = blocks * t / nt * kAdamWBlock;
    const int64_t end = std::min(n, blocks * (t + 1) / nt * kAdamWBlock);
    if (begin < end) kernel(c, s, begin, end);
  }
}

void adamw_update(float* master, float* m, float* v, const float* grad, void* working,
                  DType working_type, int64_t n, const AdamWParams& p) {
  adamw_update_isa(adamw_isa_active(), master, m, v, DType::f32, grad, working, working_type, n, p);
}

void adamw_update_bf16_moments(float* master, bf16* m, bf16* v, const float* grad, void* working,
                               DType working_type, int64_t n, const AdamWParams& p) {
  adamw_update_isa(adamw_isa_active(), master, m, v, DType::bf16, grad, working, working_type, n, p);
}

void adamw_round_keys(uint64_t seed, int64_t step, uint64_t row, uint32_t& key_m, uint32_t& key_v) {
  auto mix = [](uint64_t z) {  // splitmix64's finaliser
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  const uint64_t k = mix(mix(mix(seed) ^ uint64_t(step)) ^ row);
  key_m = uint32_t(k);
  key_v = uint32_t(k >> 32);
}

void adamw_update_ref(double* master, double* m, double* v, const double* grad, int64_t n,
                      const AdamWParams& p) {
  const double bc1 = 1 - std::pow(p.beta1, double(p.step));
  const double bc2 = 1 - std::pow(p.beta2, double(p.step));
  for (int64_t i = 0; i < n; ++i) {
    const double g = grad[i] * p.clip_scale;
    master[i] *= 1.0 - p.lr * p.weight_decay;
    m[i] = p.beta1 * m[i] + (1 - p.beta1) * g;
    v[i] = p.beta2 * v[i] + (1 - p.beta2) * g * g;
    const double mhat = m[i] / bc1;
    const double vhat = v[i] / bc2;
    master[i] -= p.lr * mhat / (std::sqrt(vhat) + p.eps);
  }
}

double sum_of_squares(const float* x, int64_t n) {
  constexpr int64_t kChunk = 1 << 14;
  constexpr int64_t kLanes = 32;  // element j of a chunk goes to lane j % 32: the loop vectorises
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(size_t(chunks), 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const float* xc = x + c * kChunk;
    const int64_t len = std::min(n - c * kChunk, kChunk);
    double lane[kLanes] = {};
    int64_t j = 0;
    for (; j + kLanes <= len; j += kLanes)
      for (int64_t l = 0; l < kLanes; ++l) lane[l] += double(xc[j + l]) * double(xc[j + l]);
    for (; j < len; ++j) lane[j % kLanes] += double(xc[j]) * double(xc[j]);
    double s = 0;
    for (int64_t l = 0; l < kLanes; ++l) s += lane[l];  // lanes, then chunks, in order: any thread count
    partial[size_t(c)] = s;
  }
  double total = 0;
  for (double s : partial) total += s;
  return total;
}

}  // namespace strata
