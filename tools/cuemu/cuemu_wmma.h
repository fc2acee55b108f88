// cuemu_wmma.h - nvcuda::wmma (tensor-core warp matrix ops) for cuemu; included by cuemu.h.
//
// The CUDA API leaves each fragment's element-to-lane mapping unspecified, and so does this
// emulation - on purpose with a mapping unlike any GPU's: element e of lane l is entry
// f = l + 32 e of the fragment's logical matrix taken row by row (A: M x K, B: K x N, accumulator:
// M x N), whatever the memory layout it was loaded with. A kernel that assumes the hardware's
// mapping (reading x[e] as a known row or column) computes wrong answers here; a kernel that
// only applies the same elementwise operation to every x[e], or combines fragments of the same
// type element by element, is right on both.
//
// Every op is warp-collective as on a GPU: all 32 lanes of the warp must call it (a rendezvous
// on entry checks that; a missing lane deadlocks and is reported). As on a GPU, a lane reading
// what other lanes stored needs a __syncwarp() (or __syncthreads()) after store_matrix_sync: the
// fiber executor runs a lane on until its next rendezvous, so a missing one reads stale data. mma_sync publishes each lane's
// fragment addresses in one rendezvous, computes its own elements of D = A B + C from all
// lanes' fragments (products of the A and B element types, exact in double, summed in double
// in k order, plus C, rounded once to the accumulator type), and writes D only after a second
// rendezvous, so D may alias A, B or C of any lane. Shapes: any M, N, K with M N, M K and K N
// multiples of 32 (m16n16k16, m32n8k16, m8n32k16); element types: __nv_bfloat16, __half, float.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace cuemu::detail {
// One rendezvous of the lanes of `mask`: all[l] = lane l's `bits` for every lane l of the mask.
void warp_gather(unsigned mask, uint64_t bits, uint64_t* all);
}  // namespace cuemu::detail

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

namespace detail {
// Logical rows and columns of a fragment's matrix.
template <class Use, int M, int N, int K>
struct frag_shape;
template <int M, int N, int K>
struct frag_shape<matrix_a, M, N, K> {
  static constexpr int rows = M, cols = K;
};
template <int M, int N, int K>
struct frag_shape<matrix_b, M, N, K> {
  static constexpr int rows = K, cols = N;
};
template <int M, int N, int K>
struct frag_shape<accumulator, M, N, K> {
  static constexpr int rows = M, cols = N;
};

inline float to_float(float x) { return x; }
inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
inline float to_float(__half x) { return __half2float(x); }
template <class T>
T from_float(float x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __float2bfloat16_rn(x);
  else if constexpr (std::is_same_v<T, __half>) return __float2half_rn(x);
  else return x;
}
}  // namespace detail

template <class Use, int M, int N, int K, class T, class Layout = void>
class fragment {
 public:
  using shape = detail::frag_shape<Use, M, N, K>;
  static_assert(shape::rows * shape::cols % 32 == 0, "cuemu wmma: fragment size not a multiple of 32");
  using element_type = T;
  static constexpr int num_elements = shape::rows * shape::cols / 32;
  T x[num_elements];
};

namespace detail {
// Entry (row, col) of the logical matrix for element e of the calling lane.
template <class Frag>
inline void frag_entry(int e, int& row, int& col) {
  const int f = int(cuemu::detail::lane_id()) + 32 * e;
  row = f / Frag::shape::cols;
  col = f % Frag::shape::cols;
}
inline void warp_collective() { cuemu::detail::warp_sync(0xffffffffu); }
}  // namespace detail

template <class Use, int M, int N, int K, class T, class Layout, class V>
void fill_fragment(fragment<Use, M, N, K, T, Layout>& a, const V& v) {
  detail::warp_collective();
  for (int e = 0; e < a.num_elements; ++e) a.x[e] = T(v);
}

// A or B with the layout in the type: entry (r, c) at p[r ldm + c] (row_major) or p[c ldm + r].
template <class Use, int M, int N, int K, class T, class Layout, class P>
void load_matrix_sync(fragment<Use, M, N, K, T, Layout>& a, const P* p, unsigned ldm) {
  static_assert(!std::is_same_v<Use, accumulator>, "cuemu wmma: an accumulator load takes a layout_t");
  static_assert(std::is_same_v<Layout, row_major> || std::is_same_v<Layout, col_major>,
                "cuemu wmma: matrix_a / matrix_b fragments need row_major or col_major");
  detail::warp_collective();
  using F = fragment<Use, M, N, K, T, Layout>;
  for (int e = 0; e < F::num_elements; ++e) {
    int r, c;
    detail::frag_entry<F>(e, r, c);
    a.x[e] = std::is_same_v<Layout, row_major> ? p[size_t(r) * ldm + c] : p[size_t(c) * ldm + r];
  }
}

template <int M, int N, int K, class T>
void load_matrix_sync(fragment<accumulator, M, N, K, T>& a, const T* p, unsigned ldm, layout_t layout) {
  detail::warp_collective();
  using F = fragment<accumulator, M, N, K, T>;
  for (int e = 0; e < F::num_elements; ++e) {
    int r, c;
    detail::frag_entry<F>(e, r, c);
    a.x[e] = layout == mem_row_major ? p[size_t(r) * ldm + c] : p[size_t(c) * ldm + r];
  }
}

template <int M, int N, int K, class T>
void store_matrix_sync(T* p, const fragment<accumulator, M, N, K, T>& a, unsigned ldm, layout_t layout) {
  detail::warp_collective();
  using F = fragment<accumulator, M, N, K, T>;
  for (int e = 0; e < F::num_elements; ++e) {
    int r, c;
    detail::frag_entry<F>(e, r, c);
    (layout == mem_row_major ? p[size_t(r) * ldm + c] : p[size_t(c) * ldm + r]) = a.x[e];
  }
}

template <int M, int N, int K, class TA, class LA, class TB, class LB, class TC>
void mma_sync(fragment<accumulator, M, N, K, TC>& d, const fragment<matrix_a, M, N, K, TA, LA>& a,
              const fragment<matrix_b, M, N, K, TB, LB>& b, const fragment<accumulator, M, N, K, TC>& c,
              bool satf = false) {
  using FA = fragment<matrix_a, M, N, K, TA, LA>;
  using FB = fragment<matrix_b, M, N, K, TB, LB>;
  using FC = fragment<accumulator, M, N, K, TC>;
  // Every lane's A and B fragment addresses, in one rendezvous.
  uint64_t pa[32], pb[32];
  cuemu::detail::warp_gather(0xffffffffu, reinterpret_cast<uintptr_t>(&a), pa);
  cuemu::detail::warp_gather(0xffffffffu, reinterpret_cast<uintptr_t>(&b), pb);
  auto entry_a = [&](int r, int k) {  // A (M x K) entry: lane f % 32, element f / 32
    const int f = r * K + k;
    return double(detail::to_float(reinterpret_cast<const FA*>(pa[f % 32])->x[f / 32]));
  };
  auto entry_b = [&](int k, int col) {
    const int f = k * N + col;
    return double(detail::to_float(reinterpret_cast<const FB*>(pb[f % 32])->x[f / 32]));
  };
  TC out[FC::num_elements];
  for (int e = 0; e < FC::num_elements; ++e) {
    int r, col;
    detail::frag_entry<FC>(e, r, col);
    double acc = 0.0;
    for (int k = 0; k < K; ++k) acc += entry_a(r, k) * entry_b(k, col);
    float v = float(acc + double(detail::to_float(c.x[e])));
    if (satf) v = v != v ? 0.f : (v < 0.f ? 0.f : (v > 1.f ? 1.f : v));
    out[e] = detail::from_float<TC>(v);
  }
  detail::warp_collective();  // every lane has read the others' A and B before D is written
  for (int e = 0; e < FC::num_elements; ++e) d.x[e] = out[e];
}

}  // namespace nvcuda::wmma
