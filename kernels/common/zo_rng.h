// The perturbation generator of zeroth-order training (DESIGN §8b, issue 15): a counter-based
// map (seed, tensor, element) -> one Gaussian f32, written once here for the CPU (g++), the GPU
// (nvcc) and the CUDA emulator (g++ with tools/cuemu/cuemu.h), with the same bits on all three.
// z is never stored: every consumer regenerates it from its index.
//
//   words  = Philox4x32-10(counter = {block lo, block hi, tensor, 0}, key = {seed lo, seed hi}),
//            block = element / 4 (Random123's algorithm; its known-answer vectors are tested)
//   pairs  = (words[0], words[1]) -> z[4b], z[4b+1];  (words[2], words[3]) -> z[4b+2], z[4b+3]
//   z      = Box–Muller of a pair (a, b): u = ((a >> 8) + 1) / 2^24 in (0, 1],
//            angle = 2π (b >> 8) / 2^24;  z0 = sqrt(-2 ln u) cos(angle), z1 = ... sin(angle).
//            |z| <= sqrt(48 ln 2) = 5.768 (u >= 2^-24): the normal's tail beyond it, 8e-9, is cut.
//
// Same bits everywhere: Philox is integer arithmetic; ln, sin and cos are this file's own
// polynomials evaluated with single IEEE operations in a written order (zo_mul, zo_add,
// zo_div, zo_sqrt: correctly rounded on every target), with no fused multiply-add: on the GPU
// the __fmul_rn / __fadd_rn intrinsics, which nvcc never contracts; under the emulator the
// same intrinsics (cuemu keeps them opaque to g++); on the host plain operators in a
// translation unit compiled with -ffp-contract=off, which the build marks by defining
// STRATA_ZO_NO_CONTRACT (CMakeLists.txt, kernels/cpu/zo.cpp). A host file without that mark
// gets the integer part only (Philox, the seed mixer): the float transform is not declared, so
// it cannot be evaluated with contraction by accident. No library transcendental is called.
// Constants are hex float literals: exact float values, so no compiler can round a decimal
// literal twice.
// Accuracy against fp64 (tests/kernels/test_zo.cpp measures it over dense sweeps): ln u within
// 1.5e-7 relative (5.0e-7 absolute) over all 2^24 inputs, sin and cos within 9.7e-8 absolute, z
// within 5.8e-7 absolute over 2^22 elements.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define STRATA_ZO_FN __host__ __device__ __forceinline__
#define STRATA_ZO_NS nvcc
#elif defined(STRATA_CUEMU)
#define STRATA_ZO_FN inline
#define STRATA_ZO_NS cuemu
#else
#define STRATA_ZO_FN inline
#define STRATA_ZO_NS host
#endif
#if !defined(STRATA_CUEMU)
#include <bit>
#include <cmath>
#endif

// The float transform is defined where its operations are known to round one by one.
#if defined(__CUDACC__) || defined(STRATA_CUEMU) || defined(STRATA_ZO_NO_CONTRACT)
#define STRATA_ZO_HAVE_TRANSFORM 1
#endif

namespace strata::zo {
// One inline namespace per compilation mode: the emulated kernels and the host kernels are
// linked into one test binary, and their inline functions must not be merged across modes.
inline namespace STRATA_ZO_NS {

// ---- Philox4x32-10 (Salmon et al., SC'11; Random123) ----------------------------------------
constexpr uint32_t kPhiloxM0 = 0xD2511F53u, kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u, kPhiloxW1 = 0xBB67AE85u;

// hi, lo = the 64-bit product a * b (on the host one widening multiply, which g++ vectorises).
STRATA_ZO_FN void zo_mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
#if defined(__CUDA_ARCH__)
  hi = __umulhi(a, b);
  lo = a * b;
#else
  const uint64_t p = uint64_t(a) * uint64_t(b);
  hi = uint32_t(p >> 32);
  lo = uint32_t(p);
#endif
}

// The four output words of counter c (in place) under key (k0, k1).
STRATA_ZO_FN void zo_philox4x32_10(uint32_t& c0, uint32_t& c1, uint32_t& c2, uint32_t& c3,
                                   uint32_t k0, uint32_t k1) {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
#if !defined(__CUDACC__) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC unroll 10
#endif
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    zo_mulhilo(kPhiloxM0, c0, hi0, lo0);
    zo_mulhilo(kPhiloxM1, c2, hi1, lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
}

// The Philox words of block `block` (elements 4*block .. 4*block+3) of tensor `tensor`.
// (Outputs by reference to scalars, not an array: g++ vectorises loops over blocks then.)
STRATA_ZO_FN void zo_block_words(uint64_t seed, uint32_t tensor, uint64_t block, uint32_t& w0,
                                 uint32_t& w1, uint32_t& w2, uint32_t& w3) {
  w0 = uint32_t(block);
  w1 = uint32_t(block >> 32);
  w2 = tensor;
  w3 = 0;
  zo_philox4x32_10(w0, w1, w2, w3, uint32_t(seed), uint32_t(seed >> 32));
}

// A 64-bit mix (SplitMix64's finaliser) for deriving per-step seeds: zo_seed(base, step, j) is
// the key of perturbation j of step `step` of a run seeded with `base`. Distinct (step, j)
// give unrelated keys; Philox keys need no further conditioning.
STRATA_ZO_FN uint64_t zo_mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
STRATA_ZO_FN uint64_t zo_seed(uint64_t base, uint64_t step, uint32_t perturbation) {
  return zo_mix64(zo_mix64(zo_mix64(base) ^ step) ^ perturbation);
}

#if defined(STRATA_ZO_HAVE_TRANSFORM)
// ---- single IEEE operations, never fused ----------------------------------------------------
#if defined(__CUDA_ARCH__) || defined(STRATA_CUEMU)
STRATA_ZO_FN float zo_mul(float a, float b) { return __fmul_rn(a, b); }
STRATA_ZO_FN float zo_add(float a, float b) { return __fadd_rn(a, b); }
STRATA_ZO_FN float zo_div(float a, float b) { return __fdiv_rn(a, b); }
STRATA_ZO_FN float zo_sqrt(float a) { return __fsqrt_rn(a); }
STRATA_ZO_FN uint32_t zo_float_bits(float x) { return __float_as_uint(x); }
STRATA_ZO_FN float zo_bits_float(uint32_t u) { return __uint_as_float(u); }
#else  // the host's IEEE operations (kernels/cpu/zo.cpp is compiled with -ffp-contract=off)
STRATA_ZO_FN float zo_mul(float a, float b) { return a * b; }
STRATA_ZO_FN float zo_add(float a, float b) { return a + b; }
STRATA_ZO_FN float zo_div(float a, float b) { return a / b; }
STRATA_ZO_FN float zo_sqrt(float a) { return std::sqrt(a); }
STRATA_ZO_FN uint32_t zo_float_bits(float x) { return std::bit_cast<uint32_t>(x); }
STRATA_ZO_FN float zo_bits_float(uint32_t u) { return std::bit_cast<float>(u); }
#endif
STRATA_ZO_FN float zo_sub(float a, float b) { return zo_add(a, -b); }

// ---- ln u for u = k / 2^24, k in [1, 2^24] ---------------------------------------------------
// k = 2^e m with m in [sqrt(1/2), sqrt(2)) (exponent and mantissa taken from k's exact float
// bits); ln m = 2 atanh(s), s = (m - 1) / (m + 1) = f / (2 + f), |s| <= 0.1716, by its series to
// s^11; ln u = (e - 24) ln 2 + ln m with ln 2 split in a 16-bit head (exact products) and a tail.
STRATA_ZO_FN float zo_ln_unit(uint32_t k) {
  const uint32_t bits = zo_float_bits(float(k));  // exact: k <= 2^24
  const uint32_t mant = bits & 0x007FFFFFu;
  const bool high = mant > 0x003504F3u;           // m > sqrt(2): use m / 2 and e + 1
  const int32_t e = int32_t(bits >> 23) - 127 + (high ? 1 : 0);
  const float m = zo_bits_float(mant | (high ? 0x3F000000u : 0x3F800000u));
  const float f = zo_sub(m, 1.0f);  // exact (Sterbenz)
  const float s = zo_div(f, zo_add(2.0f, f));
  const float s2 = zo_mul(s, s);
  float p = 0x1.745d18p-3f;                         // 2/11
  p = zo_add(zo_mul(p, s2), 0x1.c71c72p-3f);        // 2/9
  p = zo_add(zo_mul(p, s2), 0x1.24924ap-2f);        // 2/7
  p = zo_add(zo_mul(p, s2), 0x1.99999ap-2f);        // 2/5
  p = zo_add(zo_mul(p, s2), 0x1.555556p-1f);        // 2/3
  const float ln_m = zo_add(zo_mul(2.0f, s), zo_mul(zo_mul(s, s2), p));
  const float t = float(e - 24);
  constexpr float kLn2Hi = 0.693145751953125f;      // 0x3F317200
  constexpr float kLn2Lo = 0x1.7f7d1cp-20f;         // ln 2 - kLn2Hi
  return zo_add(zo_mul(t, kLn2Hi), zo_add(zo_mul(t, kLn2Lo), ln_m));
}

// ---- sin and cos of 2π j / 2^24, j in [0, 2^24) ----------------------------------------------
// Reduction in integers (exact): q = the nearest quarter turn, w = j - q 2^22 in [-2^21, 2^21),
// phi = w π / 2^23 in [-π/4, π/4); Taylor polynomials of sin to phi^11 and cos to phi^12
// (truncation below 7e-12), then the quadrant's exact sign swap.
STRATA_ZO_FN void zo_sincos_turn(uint32_t j, float* sin_out, float* cos_out) {
  const uint32_t qq = (j + (1u << 21)) >> 22;  // 0..4
  const int32_t w = int32_t(j) - int32_t(qq << 22);
  const uint32_t q = qq & 3u;
  constexpr float kPiOver2p23 = 0x1.921fb6p-22f;    // π / 2^23
  const float phi = zo_mul(float(w), kPiOver2p23);
  const float x2 = zo_mul(phi, phi);
  float ps = -0x1.ae6456p-26f;                      // -1/11!
  ps = zo_add(zo_mul(ps, x2), 0x1.71de3ap-19f);     //  1/9!
  ps = zo_add(zo_mul(ps, x2), -0x1.a01a02p-13f);    // -1/7!
  ps = zo_add(zo_mul(ps, x2), 0x1.111112p-7f);      //  1/5!
  ps = zo_add(zo_mul(ps, x2), -0x1.555556p-3f);     // -1/3!
  const float s = zo_add(phi, zo_mul(zo_mul(phi, x2), ps));
  float pc = 0x1.1eed8ep-29f;                       //  1/12!
  pc = zo_add(zo_mul(pc, x2), -0x1.27e4fcp-22f);    // -1/10!
  pc = zo_add(zo_mul(pc, x2), 0x1.a01a02p-16f);     //  1/8!
  pc = zo_add(zo_mul(pc, x2), -0x1.6c16c2p-10f);    // -1/6!
  pc = zo_add(zo_mul(pc, x2), 0x1.555556p-5f);      //  1/4!
  pc = zo_add(zo_mul(pc, x2), -0.5f);               // -1/2!
  const float c = zo_add(1.0f, zo_mul(x2, pc));
  // angle = q π/2 + phi
  const float sin_v = (q & 1u) ? c : s, cos_v = (q & 1u) ? s : c;
  *sin_out = (q >= 2u) ? -sin_v : sin_v;
  *cos_out = (q == 1u || q == 2u) ? -cos_v : cos_v;
}

// ---- Gaussians --------------------------------------------------------------------------------
// Box–Muller of one pair of Philox words.
STRATA_ZO_FN void zo_gaussian_pair(uint32_t a, uint32_t b, float* z0, float* z1) {
  const float r = zo_sqrt(zo_mul(-2.0f, zo_ln_unit((a >> 8) + 1u)));
  float s, c;
  zo_sincos_turn(b >> 8, &s, &c);
  *z0 = zo_mul(r, c);
  *z1 = zo_mul(r, s);
}

// z of elements 4*block .. 4*block+3 of tensor `tensor` under `seed`.
STRATA_ZO_FN void zo_gaussian4(uint64_t seed, uint32_t tensor, uint64_t block, float& z0,
                               float& z1, float& z2, float& z3) {
  uint32_t w0, w1, w2, w3;
  zo_block_words(seed, tensor, block, w0, w1, w2, w3);
  zo_gaussian_pair(w0, w1, &z0, &z1);
  zo_gaussian_pair(w2, w3, &z2, &z3);
}

// z of one element.
STRATA_ZO_FN float zo_gaussian(uint64_t seed, uint32_t tensor, uint64_t element) {
  float z0, z1, z2, z3;
  zo_gaussian4(seed, tensor, element >> 2, z0, z1, z2, z3);
  const uint32_t lane = uint32_t(element & 3u);
  return lane == 0 ? z0 : lane == 1 ? z1 : lane == 2 ? z2 : z3;
}

// p + scale z, the perturbation of one f32 value (a multiply, then an add: never fused).
STRATA_ZO_FN float zo_perturbed(float p, float scale, float z) {
  return zo_add(p, zo_mul(scale, z));
}

// The ZO-SGD update of one master weight, given gz = Σ_j c_j z_j:
// master - lr (gz + wd master), in this order.
STRATA_ZO_FN float zo_sgd_updated(float master, float gz, float lr, float wd) {
  return zo_sub(master, zo_mul(lr, zo_add(gz, zo_mul(wd, master))));
}
#endif  // STRATA_ZO_HAVE_TRANSFORM

}  // namespace STRATA_ZO_NS
}  // namespace strata::zo
