// cuemu.h - strata's CPU emulation of the CUDA device programming model, for tests only.
//
// kernels/cuda/*.cu are compiled by g++ with `-x c++ -include tools/cuemu/cuemu.h` and linked
// against the strata_cuemu library (the runtime, cuBLAS and cuBLASLt calls), never into the product.
// Declarations come from the real CUDA headers (cuda_runtime.h, cuda_bf16.h): if a signature the
// backend uses drifts from what cuemu defines, the build fails.
//
// Model: a launch is queued on its stream; kernels run one at a time (a legal GPU schedule), each
// block runs alone, its threads as ucontext fibers (default, fast) or as one OS thread per CUDA
// thread (CUEMU_THREADS=1, so ThreadSanitizer sees a missing barrier as a race). Because one block
// runs at a time, a function-local `static` is exactly block-shared memory: that is `__shared__`.
// Blocks run in a seeded shuffled order. Unsupported: inline PTX, __CUDA_ARCH__-only code paths
// (the emulator leaves __CUDA_ARCH__ undefined, so the fallback path runs), textures, cooperative
// groups, grid-wide sync, and blocks spinning on one another.
#pragma once

#if defined(__CUDACC__)
#error "cuemu.h is for g++ builds of .cu files; nvcc builds use the real CUDA device compiler"
#endif

#define STRATA_CUEMU 1

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

#include "tools/cuemu/cuemu_control.h"

// ---- execution-space qualifiers ----------------------------------------------------------------
// The CUDA headers define __global__/__device__/__host__ as nothing for a host compiler; __shared__
// becomes a function-local static (block-shared because blocks run one at a time).
#undef __shared__
#define __shared__ static
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif

// ---- built-in variables ------------------------------------------------------------------------
inline constexpr int warpSize = 32;
inline thread_local uint3 threadIdx{0, 0, 0};
inline thread_local uint3 blockIdx{0, 0, 0};
inline thread_local dim3 blockDim{1, 1, 1};
inline thread_local dim3 gridDim{1, 1, 1};

namespace cuemu {

namespace detail {
// Implemented by the executor (cuemu_exec.cpp); valid only inside a running kernel.
void block_sync();
int block_sync_reduce(int predicate, int kind);  // kind: 0 count, 1 and, 2 or
void warp_sync(unsigned mask);
uint64_t warp_exchange(unsigned mask, uint64_t bits, int src_lane);  // src_lane -1: keep own
unsigned warp_ballot(unsigned mask, int predicate);
unsigned lane_id();
void* dynamic_shared();

// Launch plumbing (cuemu_exec.cpp).
struct LaunchSite {
  const char* file;
  int line;
  const char* kernel_name;
  const void* kernel;
  dim3 grid;
  dim3 block;
  size_t dynamic_smem_bytes;
  cudaStream_t stream;
};
bool launch_validate(const LaunchSite& site);  // false: rejected, cudaGetLastError says why
bool launch_check_pointer(const LaunchSite& site, int arg_index, const void* p);
void launch_enqueue(const LaunchSite& site, std::function<void()> thread_body);

template <class To>
To implicit_convert(To v) {
  return v;
}
template <class Tuple, size_t... I>
bool launch_check_pointers(const LaunchSite& site, const Tuple& args, std::index_sequence<I...>) {
  bool ok = true;
  auto one = [&](int index, const auto& a) {
    if constexpr (std::is_pointer_v<std::decay_t<decltype(a)>>)
      ok = launch_check_pointer(site, index, static_cast<const void*>(a)) && ok;
  };
  (one(static_cast<int>(I), std::get<I>(args)), ...);
  return ok;
}
}  // namespace detail

inline void* dynamic_shared() { return detail::dynamic_shared(); }

// The g++ side of STRATA_LAUNCH (kernels/cuda/launch.h): checks the configuration like the CUDA
// runtime would (errors go to cudaGetLastError), then queues the grid on `stream`.
template <class... P, class... A>
void launch_kernel(const char* file, int line, const char* kernel_name, void (*kernel)(P...), dim3 grid,
                   dim3 block, size_t dynamic_smem_bytes, cudaStream_t stream, A&&... args) {
  static_assert(sizeof...(P) == sizeof...(A), "STRATA_LAUNCH: argument count differs from the kernel's");
  detail::LaunchSite site{file, line, kernel_name, reinterpret_cast<const void*>(kernel), grid, block,
                          dynamic_smem_bytes, stream};
  if (!detail::launch_validate(site)) return;
  std::tuple<std::decay_t<P>...> packed(detail::implicit_convert<std::decay_t<P>>(std::forward<A>(args))...);
  if (!detail::launch_check_pointers(site, packed, std::index_sequence_for<P...>{})) return;
  detail::launch_enqueue(site, [kernel, packed] { std::apply(kernel, packed); });
}

}  // namespace cuemu

// ---- barriers, warp intrinsics, votes ----------------------------------------------------------
inline void __syncthreads() { cuemu::detail::block_sync(); }
inline int __syncthreads_count(int p) { return cuemu::detail::block_sync_reduce(p, 0); }
inline int __syncthreads_and(int p) { return cuemu::detail::block_sync_reduce(p, 1); }
inline int __syncthreads_or(int p) { return cuemu::detail::block_sync_reduce(p, 2); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { cuemu::detail::warp_sync(mask); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline unsigned __activemask() { return 0xffffffffu; }

namespace cuemu::detail {
template <class T>
T shuffle_from(unsigned mask, T v, int src_lane) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "shuffles move at most 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = warp_exchange(mask, bits, src_lane);
  T r;
  std::memcpy(&r, &bits, sizeof(T));
  return r;
}
}  // namespace cuemu::detail

template <class T>
T __shfl_sync(unsigned mask, T v, int src_lane, int width = warpSize) {
  int lane = static_cast<int>(cuemu::detail::lane_id());
  int src = (lane & ~(width - 1)) + (src_lane & (width - 1));
  return cuemu::detail::shuffle_from(mask, v, src);
}
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = warpSize) {
  int lane = static_cast<int>(cuemu::detail::lane_id());
  int src = lane ^ lane_mask;
  return cuemu::detail::shuffle_from(mask, v, (src / width == lane / width) ? src : -1);
}
template <class T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = warpSize) {
  int lane = static_cast<int>(cuemu::detail::lane_id());
  int in_segment = (lane & (width - 1)) + static_cast<int>(delta);
  return cuemu::detail::shuffle_from(mask, v, in_segment < width ? lane + static_cast<int>(delta) : -1);
}
template <class T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = warpSize) {
  int lane = static_cast<int>(cuemu::detail::lane_id());
  int in_segment = (lane & (width - 1)) - static_cast<int>(delta);
  return cuemu::detail::shuffle_from(mask, v, in_segment >= 0 ? lane - static_cast<int>(delta) : -1);
}
inline unsigned __ballot_sync(unsigned mask, int p) { return cuemu::detail::warp_ballot(mask, p); }
inline int __any_sync(unsigned mask, int p) { return cuemu::detail::warp_ballot(mask, p) != 0; }
inline int __all_sync(unsigned mask, int p) {
  unsigned b = cuemu::detail::warp_ballot(mask, p);
  unsigned voters = cuemu::detail::warp_ballot(mask, 1);
  return b == voters;
}

// ---- atomics -----------------------------------------------------------------------------------
// Each read-modify-write atomic is one std::atomic_ref operation that returns the old value.
#define CUEMU_ATOMIC_RMW(name, op)     \
  template <class T>                   \
  T name(T* p, T v) {                  \
    return std::atomic_ref<T>(*p).op(v); \
  }
CUEMU_ATOMIC_RMW(atomicAdd, fetch_add)
CUEMU_ATOMIC_RMW(atomicSub, fetch_sub)
CUEMU_ATOMIC_RMW(atomicExch, exchange)
CUEMU_ATOMIC_RMW(atomicAnd, fetch_and)
CUEMU_ATOMIC_RMW(atomicOr, fetch_or)
CUEMU_ATOMIC_RMW(atomicXor, fetch_xor)
#undef CUEMU_ATOMIC_RMW

template <class T>
T atomicCAS(T* p, T compare, T v) {
  std::atomic_ref<T>(*p).compare_exchange_strong(compare, v);
  return compare;  // the old value, whether or not it was replaced
}
namespace cuemu::detail {
// Replaces *p by v while replaces(v, old) holds for the value there; returns the old value.
template <class T, class Replaces>
T atomic_replace_while(T* p, T v, Replaces replaces) {
  std::atomic_ref<T> a(*p);
  T old = a.load();
  while (replaces(v, old) && !a.compare_exchange_weak(old, v)) {
  }
  return old;
}
}  // namespace cuemu::detail
template <class T>
T atomicMax(T* p, T v) {
  return cuemu::detail::atomic_replace_while(p, v, [](T x, T old) { return old < x; });
}
template <class T>
T atomicMin(T* p, T v) {
  return cuemu::detail::atomic_replace_while(p, v, [](T x, T old) { return x < old; });
}

// ---- loads and math intrinsics (fast-math variants computed exactly) --------------------------
template <class T>
T __ldg(const T* p) {
  return *p;
}
template <class T>
T __ldcs(const T* p) {
  return *p;
}
template <class T>
void __stcs(T* p, T v) {
  *p = v;
}
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return std::sqrt(x); }
namespace cuemu::detail {
// A value the compiler must take as it is: nvcc never fuses __fmul_rn / __fadd_rn into an FMA,
// but g++ (-ffp-contract=fast, the GNU default) would contract a*b + c across inlined calls.
inline float fp_opaque(float x) {
#if defined(__x86_64__)
  __asm__("" : "+x"(x));
#elif defined(__aarch64__)
  __asm__("" : "+w"(x));
#else
  volatile float keep = x;
  x = keep;
#endif
  return x;
}
}  // namespace cuemu::detail
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fmul_rn(float a, float b) { return cuemu::detail::fp_opaque(a * b); }
inline float __fadd_rn(float a, float b) {
  return cuemu::detail::fp_opaque(cuemu::detail::fp_opaque(a) + cuemu::detail::fp_opaque(b));
}
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline void __sincosf(float x, float* s, float* c) {
  *s = std::sin(x);
  *c = std::cos(x);
}
inline float __tanhf(float x) { return std::tanh(x); }
inline float __powf(float a, float b) { return std::pow(a, b); }
inline float __exp10f(float x) { return std::pow(10.0f, x); }
inline float __log2f(float x) { return std::log2(x); }
inline float __saturatef(float x) { return x < 0.f ? 0.f : (x > 1.f ? 1.f : x); }
inline int __float_as_int(float x) { return std::bit_cast<int>(x); }
inline unsigned __float_as_uint(float x) { return std::bit_cast<unsigned>(x); }
inline float __int_as_float(int x) { return std::bit_cast<float>(x); }
inline float __uint_as_float(unsigned x) { return std::bit_cast<float>(x); }
inline int __float2int_rn(float x) { return static_cast<int>(std::nearbyint(x)); }
inline int __float2int_rz(float x) { return static_cast<int>(x); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline unsigned __brev(unsigned x) {
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
  return r;
}
inline int min(int a, int b) { return a < b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned min(int a, unsigned b) { return min(static_cast<unsigned>(a), b); }
inline unsigned min(unsigned a, int b) { return min(a, static_cast<unsigned>(b)); }
inline float min(float a, float b) { return std::fmin(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
inline unsigned max(int a, unsigned b) { return max(static_cast<unsigned>(a), b); }
inline unsigned max(unsigned a, int b) { return max(a, static_cast<unsigned>(b)); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }

// ---- tensor-core warp matrix ops (nvcuda::wmma) -------------------------------------------------
#include "tools/cuemu/cuemu_wmma.h"
