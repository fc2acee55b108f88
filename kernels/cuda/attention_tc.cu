// Causal GQA attention on tensor cores for bf16 dots (FlashAttention-2's algorithm with the
// CUDA WMMA API; twin: kernels/cpu/ref/attention.h; the f32 CUDA-core kernel is attention.cu).
// q (B,T,H,D), k and v (B,T,Hk,D), out (B,T,H,D), lse (B,T,H), all f32 in device memory: tiles
// are rounded to bf16 (nearest even) as they are copied into shared memory, products of bf16
// pairs are summed in f32 by mma_sync, softmax, lse, P and dS are formed in f32, and P and dS
// are rounded to bf16 where they weight the sums over tokens: O = P V in the forward (as
// FlashAttention-2 does; the CPU kernel keeps the forward's P in f32), dV = P^T dO, dK = dS^T Q
// and dQ = dS K in the backward. Head h reads kv head h / (H/Hk). Query tq sees keys s with
// first(tq) <= s <= tq, first(tq) = max(doc_start[b,tq], tq - window + 1) (window <= 0: no
// window). Memory O(tile): scores live one tile at a time in shared memory, never (T, T).
//
// WMMA leaves each fragment's element-to-lane mapping unspecified, so nothing here reads a
// fragment element as a known row or column: scores go through shared memory for the softmax,
// and the per-row rescaling of output accumulators reads each element's row from a fragment of
// row numbers loaded the same way (row_of: element e of any accumulator fragment lies in row
// row_of.x[e] of its tile). cuemu (tools/cuemu/cuemu_wmma.h) uses a mapping unlike the
// hardware's, so the emulated tests would catch a kernel that assumed one.
//
// The head dim is padded with zeros to kD in {64, 80, 128, 256} (any d <= 256). Tiles (rows of
// queries x keys), warps and shared memory per kD are in FwdTiles / BwdKvTiles / BwdQTiles below:
// all fit the 99 KiB an sm_89 block may take, and each warp holds at most 8 accumulator
// fragments (64 f32 registers) so nothing spills. Every output element is summed by one warp in
// a fixed order, with no atomics: results are bitwise deterministic.
//   forward:  block per (64-query tile, head, batch row); per key tile, S = Q K^T (warps take
//             16x16 tiles round-robin) -> shared; online softmax by rows (2 or 4 threads a row)
//             -> P (bf16), alpha; each warp rescales its O tiles by alpha and adds P V.
//   backward: pass 1, block per (key tile, kv head, batch row): dK, dV over the heads of the
//             group and the query tiles that can see the keys; pass 2, block per (query tile,
//             head, batch row): dQ. D_i = rowsum(bf16(dO) * O) is computed once, before both,
//             by a warp per (token, head), and staged in dq's first column.
// On an H200 (B 1, H 32 / 8, D 128; strata-bench attention, 2026-12-01) forward + backward ran
// 16.3 TFLOP/s at T 4096 before the batched tile loads, the staged D_i and the shared-memory
// pointers (below) and 24.6 after (SDPA: 219): ncu puts every kernel at 12% occupancy (2 blocks
// of 4 warps an SM, by registers and shared memory) issuing 1.3-1.5 instructions a cycle, bound
// by instruction count and latency, not by the tensor cores. Not yet done: loads are synchronous
// (no cp.async / bulk-copy double buffering), scores take a round trip through shared memory,
// most wmma.load_matrix_sync calls still compile to generic loads, and sm_90 runs the same
// m16n16k16 HMMA path as sm_80 (wgmma needs sm_90a and a fragment layout WMMA does not expose).
// Longer than a leaf (three kernels, their tile tables and launchers), as attention.cu is.
#include <cuda_bf16.h>
#include <mma.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace strata::cuda {
namespace {

namespace wmma = nvcuda::wmma;
using bf16 = __nv_bfloat16;
constexpr int kTc = 16;  // WMMA tile edge (m16n16k16)
using FragA = wmma::fragment<wmma::matrix_a, kTc, kTc, kTc, bf16, wmma::row_major>;
using FragAt = wmma::fragment<wmma::matrix_a, kTc, kTc, kTc, bf16, wmma::col_major>;
using FragB = wmma::fragment<wmma::matrix_b, kTc, kTc, kTc, bf16, wmma::row_major>;
using FragBt = wmma::fragment<wmma::matrix_b, kTc, kTc, kTc, bf16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, kTc, kTc, kTc, float>;

// Carves a block's dynamic shared memory into arrays, each 128-byte aligned (load_matrix_sync
// wants 32); with base null it only measures, and the measure includes the up to 112 bytes the
// first array may skip to align a 16-byte aligned base, so the launcher's byte count comes from
// the same code as the kernel's pointers. The arrays are offsets from base by pointer arithmetic,
// never through an integer: then the compiler still sees shared memory and emits shared loads and
// stores (ld.shared, wmma.load.shared); a pointer made from an integer is generic, and every
// access of the kernels went through generic loads and stores (PTX of sm_90, counted).
struct SmemCarver {
  unsigned char* base;
  size_t at;
  __host__ __device__ explicit SmemCarver(void* p)
      : base(static_cast<unsigned char*>(p)), at(p ? (128 - reinterpret_cast<uintptr_t>(p) % 128) % 128 : 112) {}
  template <class T>
  __host__ __device__ T* take(size_t n) {
#ifdef __CUDA_ARCH__
    T* r = reinterpret_cast<T*>(base + at);  // a kernel's carve (base is never null): no select with null,
#else                                        // which would make the pointer generic again
    T* r = base ? reinterpret_cast<T*>(base + at) : nullptr;
#endif
    at += (n * sizeof(T) + 127) / 128 * 128;
    return r;
  }
};

// Row strides: bf16 token rows padded by 8 (16 bytes: ldm stays a multiple of 8 elements and
// 16-row tiles start 32-byte aligned, as load_matrix_sync requires), f32 score rows by 4.
template <int kD>
constexpr int kTcLdx = kD + 8;

// Forward: 64 queries x 64 keys (32 keys and 8 warps at kD 256).
template <int kD>
struct FwdTiles {
  static constexpr int kWarps = kD <= 128 ? 4 : 8, kRows = 64, kKeys = kD <= 128 ? 64 : 32;
  static constexpr int kLdx = kTcLdx<kD>, kLds = kKeys + 4, kLdp = kKeys + 8;
  bf16 *q, *k, *v, *p;  // (64, D), (keys, D) x 2, (64, keys)
  float *s, *m, *l, *alpha, *row_of, *stage;  // (64, keys), (64) x 3, (16, 16), warps x (16, 16)
  int64_t* first;                             // (64) first visible key of each query
  __host__ __device__ size_t carve(void* base) {
    SmemCarver c(base);
    q = c.take<bf16>(kRows * kLdx);
    k = c.take<bf16>(kKeys * kLdx);
    v = c.take<bf16>(kKeys * kLdx);
    p = c.take<bf16>(kRows * kLdp);
    s = c.take<float>(kRows * kLds);
    m = c.take<float>(kRows);
    l = c.take<float>(kRows);
    alpha = c.take<float>(kRows);
    row_of = c.take<float>(kTc * kTc);
    stage = c.take<float>(kWarps * kTc * kTc);
    first = c.take<int64_t>(kRows);
    return c.at;
  }
};

// Backward pass 1: 4096 / kD keys (64, 48, 32, 16) x 64 queries a step (32 at kD 256).
template <int kD>
struct BwdKvTiles {
  static constexpr int kWarps = 4, kKeys = 4096 / kD / kTc * kTc, kRows = kD <= 128 ? 64 : 32;
  static constexpr int kLdx = kTcLdx<kD>, kLds = kKeys + 4, kLdp = kKeys + 8;
  bf16 *k, *v, *q, *dout, *p, *ds;  // (keys, D) x 2, (rows, D) x 2, (rows, keys) x 2
  float *s, *dp, *lse, *di, *stage;  // (rows, keys) x 2, (rows) x 2, warps x (16, 16)
  int64_t* first;
  __host__ __device__ size_t carve(void* base) {
    SmemCarver c(base);
    k = c.take<bf16>(kKeys * kLdx);
    v = c.take<bf16>(kKeys * kLdx);
    q = c.take<bf16>(kRows * kLdx);
    dout = c.take<bf16>(kRows * kLdx);
    p = c.take<bf16>(kRows * kLdp);
    ds = c.take<bf16>(kRows * kLdp);
    s = c.take<float>(kRows * kLds);
    dp = c.take<float>(kRows * kLds);
    lse = c.take<float>(kRows);
    di = c.take<float>(kRows);
    stage = c.take<float>(kWarps * kTc * kTc);
    first = c.take<int64_t>(kRows);
    return c.at;
  }
};

// Backward pass 2: 64 queries (32 at kD 256) x 64 keys a step (32 above kD 80).
template <int kD>
struct BwdQTiles {
  static constexpr int kWarps = 4, kRows = kD <= 128 ? 64 : 32, kKeys = kD <= 80 ? 64 : 32;
  static constexpr int kLdx = kTcLdx<kD>, kLds = kKeys + 4, kLdp = kKeys + 8;
  bf16 *q, *dout, *k, *v, *ds;
  float *s, *dp, *lse, *di, *stage;
  int64_t* first;
  __host__ __device__ size_t carve(void* base) {
    SmemCarver c(base);
    q = c.take<bf16>(kRows * kLdx);
    dout = c.take<bf16>(kRows * kLdx);
    k = c.take<bf16>(kKeys * kLdx);
    v = c.take<bf16>(kKeys * kLdx);
    ds = c.take<bf16>(kRows * kLdp);
    s = c.take<float>(kRows * kLds);
    dp = c.take<float>(kRows * kLds);
    lse = c.take<float>(kRows);
    di = c.take<float>(kRows);
    stage = c.take<float>(kWarps * kTc * kTc);
    first = c.take<int64_t>(kRows);
    return c.at;
  }
};

// rows (kN, kD) bf16 at row stride kLdx <- head `head` of x (B,T,nh,d) from token t0; zero past
// t and past d. Four columns a thread and iteration, in groups of up to 4 iterations whose loads
// are all issued before the group's first store. A plain load-store loop waited out a global
// load's latency per iteration: its stores went through generic pointers (SmemCarver's, before
// they were shared ones) that the compiler could not tell from x. The groups keep the loads in
// flight whatever the compiler proves. Groups of 8 spilled the kD 128 and 256 kernels' registers
// (ptxas, sm_90); groups of 4 spill none. Each four bf16 go out as one 8-byte store.
template <int kD, int kThreads, int kN>
__device__ __forceinline__ void tc_load_tile(bf16* rows, const float* __restrict__ x, int64_t bi, int64_t t,
                                             int64_t t0, int64_t head, int64_t nh, int64_t d) {
  constexpr int kLdx = kTcLdx<kD>, kQuads = kD / 4, kCount = kN * kQuads;
  constexpr int kIters = (kCount + kThreads - 1) / kThreads, kGroup = kIters < 4 ? kIters : 4;
  const bool vec = d % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  const auto bits = [](float lo, float hi) {
    return uint32_t(__bfloat16_as_ushort(bf16_from(lo))) | uint32_t(__bfloat16_as_ushort(bf16_from(hi))) << 16;
  };
#pragma unroll
  for (int i0 = 0; i0 < kIters; i0 += kGroup) {
    float4 f[kGroup];
#pragma unroll
    for (int i = 0; i < kGroup; ++i) {
      const int e = int(threadIdx.x) + (i0 + i) * kThreads, r = e / kQuads, col = e % kQuads * 4;
      const int64_t tok = t0 + r;
      f[i] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (i0 + i < kIters && e < kCount && tok < t && col < d) {
        const float* src = x + ((bi * t + tok) * nh + head) * d + col;
        if (vec) {
          f[i] = __ldg(reinterpret_cast<const float4*>(src));
        } else {
          f[i].x = __ldg(src);
          f[i].y = col + 1 < d ? __ldg(src + 1) : 0.f;
          f[i].z = col + 2 < d ? __ldg(src + 2) : 0.f;
          f[i].w = col + 3 < d ? __ldg(src + 3) : 0.f;
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kGroup; ++i) {
      const int e = int(threadIdx.x) + (i0 + i) * kThreads, r = e / kQuads, col = e % kQuads * 4;
      if (i0 + i < kIters && e < kCount)
        *reinterpret_cast<uint2*>(rows + r * kLdx + col) = make_uint2(bits(f[i].x, f[i].y), bits(f[i].z, f[i].w));
    }
  }
}

// c (16,16) f32 at ldc = a (16, kD) · b (16, kD)^T, both bf16 rows at stride kLdx.
template <int kD>
__device__ __forceinline__ void tc_tile_abt(float* c, int ldc, const bf16* a, const bf16* b) {
  constexpr int kLdx = kTcLdx<kD>;
  FragC acc;
  wmma::fill_fragment(acc, 0.f);
#pragma unroll 4
  for (int d0 = 0; d0 < kD; d0 += kTc) {
    FragA fa;
    FragBt fb;
    wmma::load_matrix_sync(fa, a + d0, kLdx);
    wmma::load_matrix_sync(fb, b + d0, kLdx);
    wmma::mma_sync(acc, fa, fb, acc);
  }
  wmma::store_matrix_sync(c, acc, unsigned(ldc), wmma::mem_row_major);
}

// acc += a (16, key tiles x 16) · b (key tiles x 16, 16): a's row tile of the (rows, keys)
// weights (P or dS, bf16 at lda), b's column tile of the key block's rows (V or K, bf16 at ldb),
// key tiles 0.. until the first one wholly past the tile's last query (causal; warp-uniform):
// key tile kb starts at key first_key + 16 kb, the tile's last query is last_query.
__device__ __forceinline__ void tc_accumulate_keys(FragC& acc, const bf16* a, int lda, const bf16* b, int ldb,
                                                   int key_tiles, int64_t first_key, int64_t last_query) {
  for (int kb = 0; kb < key_tiles; ++kb) {
    if (first_key + kb * kTc > last_query) break;
    FragA fa;
    FragB fb;
    wmma::load_matrix_sync(fa, a + kb * kTc, unsigned(lda));
    wmma::load_matrix_sync(fb, b + kb * kTc * ldb, unsigned(ldb));
    wmma::mma_sync(acc, fa, fb, acc);
  }
}

// The warp's (16,16) tile acc, times `scale`, into rows [row0, row0 + n_rows) and columns
// [col0, col0 + 16) of x (tokens, nh, d) head `head` (columns past d dropped), via stage.
__device__ __forceinline__ void tc_store_tile(float* x, const FragC& acc, float* stage,
                                              int64_t row0, int n_rows, int col0, int64_t bi,
                                              int64_t t, int64_t head, int64_t nh, int64_t d) {
  wmma::store_matrix_sync(stage, acc, kTc, wmma::mem_row_major);
  __syncwarp();
  const int lane = int(threadIdx.x) % kWarp;
  for (int e = lane; e < kTc * kTc; e += kWarp) {
    const int r = e / kTc, col = col0 + e % kTc;
    if (r < n_rows && col < d) x[((bi * t + row0 + r) * nh + head) * d + col] = stage[e];
  }
  __syncwarp();  // stage is free for the next tile
}

// ---- forward ------------------------------------------------------------------------------------
// grid (ceil(T/64), H, B), block 32 * FwdTiles<kD>::kWarps, dynamic shared memory FwdTiles.
template <int kD>
__global__ void __launch_bounds__(FwdTiles<kD>::kWarps * kWarp)
attention_tc_forward_kernel(float* out, float* lse, const float* q, const float* k,
                            const float* v, const int32_t* doc_start, int64_t t, int64_t h,
                            int64_t hk, int64_t d, float scale, int64_t window, int* error_word) {
  using Tiles = FwdTiles<kD>;
  constexpr int kWarps = Tiles::kWarps, kThreads = kWarps * kWarp, kRows = Tiles::kRows;
  constexpr int kKeys = Tiles::kKeys, kLdx = Tiles::kLdx, kLds = Tiles::kLds, kLdp = Tiles::kLdp;
  constexpr int kColTiles = kD / kTc, kOTiles = kRows / kTc * kColTiles;
  constexpr int kOPerWarp = (kOTiles + kWarps - 1) / kWarps;
  constexpr int kThreadsPerRow = kThreads / kRows, kColsPerThread = kKeys / kThreadsPerRow;
  STRATA_DYN_SHARED(unsigned char, smem);
  Tiles sh;
  sh.carve(smem);
  const int tid = int(threadIdx.x), warp = tid / kWarp;
  const int64_t t0 = int64_t(blockIdx.x) * kRows, hi = blockIdx.y, bi = blockIdx.z;
  const int64_t g = hi / (h / hk);
  const int nq = int(t - t0 < kRows ? t - t0 : kRows);

  tc_load_tile<kD, kThreads, kRows>(sh.q, q, bi, t, t0, hi, h, d);
  for (int r = tid; r < kRows; r += kThreads) {
    sh.m[r] = -INFINITY;
    sh.l[r] = 0.f;
    sh.first[r] = r < nq ? attention_first_key(doc_start, bi, t, t0 + r, window, error_word) : 0;
  }
  for (int e = tid; e < kTc * kTc; e += kThreads) sh.row_of[e] = float(e / kTc);
  __syncthreads();
  FragC row_of;  // element e of every accumulator fragment lies in row row_of.x[e] of its tile
  wmma::load_matrix_sync(row_of, sh.row_of, kTc, wmma::mem_row_major);
  FragC o[kOPerWarp];  // unnormalised output tiles warp + kWarps j of the (64, D) block
#pragma unroll
  for (int j = 0; j < kOPerWarp; ++j) wmma::fill_fragment(o[j], 0.f);

  const int64_t first_key = attention_tile_first_key(doc_start, bi, t, t0, nq, window);
  for (int64_t s0 = first_key / kKeys * kKeys; s0 < t0 + nq; s0 += kKeys) {
    __syncthreads();  // the previous tile's K, V and P are consumed
    tc_load_tile<kD, kThreads, kKeys>(sh.k, k, bi, t, s0, g, hk, d);
    tc_load_tile<kD, kThreads, kKeys>(sh.v, v, bi, t, s0, g, hk, d);
    __syncthreads();
    // S = Q K^T, 16x16 tiles round-robin over warps; tiles wholly after their queries skipped.
    for (int job = warp; job < kRows / kTc * (kKeys / kTc); job += kWarps) {
      const int rb = job / (kKeys / kTc), kb = job % (kKeys / kTc);
      if (s0 + kb * kTc > t0 + rb * kTc + kTc - 1) continue;  // warp-uniform
      tc_tile_abt<kD>(sh.s + rb * kTc * kLds + kb * kTc, kLds, sh.q + rb * kTc * kLdx,
                      sh.k + kb * kTc * kLdx);
    }
    __syncthreads();
    {  // online softmax: kThreadsPerRow neighbouring lanes own a row, kColsPerThread keys each
      const int r = tid / kThreadsPerRow, c0 = tid % kThreadsPerRow * kColsPerThread;
      const int64_t tq = t0 + r, first = sh.first[r];
      const float m_old = sh.m[r];
      float mx = -INFINITY;
      for (int c = c0; c < c0 + kColsPerThread; ++c) {
        const int64_t s = s0 + c;
        if (r < nq && s >= first && s <= tq) mx = fmaxf(mx, sh.s[r * kLds + c] * scale);
      }
#pragma unroll
      for (int off = 1; off < kThreadsPerRow; off *= 2)
        mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, off));
      const float m_new = fmaxf(m_old, mx);
      const bool any = m_new != -INFINITY;  // some key seen so far
      const float alpha = any ? expf(m_old - m_new) : 1.f;
      float sum = 0.f;
      for (int c = c0; c < c0 + kColsPerThread; ++c) {
        const int64_t s = s0 + c;
        const bool visible = r < nq && s >= first && s <= tq;
        const float p = visible ? expf(sh.s[r * kLds + c] * scale - m_new) : 0.f;
        sum += p;
        sh.p[r * kLdp + c] = bf16_from(p);
      }
#pragma unroll
      for (int off = 1; off < kThreadsPerRow; off *= 2) sum += __shfl_xor_sync(kFullMask, sum, off);
      if (tid % kThreadsPerRow == 0) {
        sh.m[r] = m_new;
        sh.l[r] = sh.l[r] * alpha + sum;
        sh.alpha[r] = alpha;
      }
    }
    __syncthreads();
    // O = alpha O + P V on each warp's tiles; key blocks wholly after the row block skipped.
#pragma unroll
    for (int j = 0; j < kOPerWarp; ++j) {
      const int job = warp + kWarps * j;
      if (job >= kOTiles) break;  // warp-uniform
      const int rb = job / kColTiles, cb = job % kColTiles;
#pragma unroll
      for (int e = 0; e < FragC::num_elements; ++e)
        o[j].x[e] *= sh.alpha[rb * kTc + int(row_of.x[e])];
      tc_accumulate_keys(o[j], sh.p + rb * kTc * kLdp, kLdp, sh.v + cb * kTc, kLdx, kKeys / kTc, s0,
                         t0 + rb * kTc + kTc - 1);
    }
  }

  // out = O / l (every query sees at least itself: l > 0 on rows < nq); lse = m + log l.
  float* stage = sh.stage + warp * kTc * kTc;
#pragma unroll
  for (int j = 0; j < kOPerWarp; ++j) {
    const int job = warp + kWarps * j;
    if (job >= kOTiles) break;
    const int rb = job / kColTiles, cb = job % kColTiles;
#pragma unroll
    for (int e = 0; e < FragC::num_elements; ++e) {
      const float l = sh.l[rb * kTc + int(row_of.x[e])];
      o[j].x[e] *= l > 0.f ? 1.f / l : 0.f;
    }
    tc_store_tile(out, o[j], stage, t0 + rb * kTc, nq - rb * kTc, cb * kTc, bi, t, hi, h, d);
  }
  for (int r = tid; r < nq; r += kThreads) lse[(bi * t + t0 + r) * h + hi] = sh.m[r] + logf(sh.l[r]);
}

// ---- backward -----------------------------------------------------------------------------------
// D_i = rowsum(bf16(dO) * O) of every (token, head), once per backward, into dq's first column
// (dq[row, 0]): both passes read it from there, and pass 2 reads a query tile's values before it
// writes that tile's dq. A warp per (token, head), columns strided over lanes. grid ceil(B T H / 8),
// block 256.
constexpr int kDiWarps = 8;
__global__ void __launch_bounds__(kDiWarps * kWarp)
attention_tc_di_kernel(float* dq, const float* __restrict__ dout, const float* __restrict__ out, int64_t rows,
                       int64_t d) {
  const int lane = int(threadIdx.x) % kWarp;
  const int64_t row = int64_t(blockIdx.x) * kDiWarps + int(threadIdx.x) / kWarp;
  if (row >= rows) return;  // warp-uniform
  float di = 0.f;
  for (int64_t e = lane; e < d; e += kWarp)
    di += bf16_load_rounded(__ldg(dout + row * d + e)) * __ldg(out + row * d + e);
  di = warp_sum(di);
  if (lane == 0) dq[row * d] = di;
}

// Per query step of both passes: lse, D_i (staged in dq by attention_tc_di_kernel) and the first
// visible key of rows [0, nq) of the step (a thread per row, the loads of all rows at once), zeros
// past nq.
template <int kRows, int kThreads>
__device__ __forceinline__ void tc_row_stats(float* s_lse, float* s_di, int64_t* s_first, const float* dq_di,
                                             const float* lse, const int32_t* doc_start, int64_t bi,
                                             int64_t t, int64_t t0, int nq, int64_t hi, int64_t h,
                                             int64_t d, int64_t window, int* error_word) {
  for (int r = int(threadIdx.x); r < kRows; r += kThreads) {
    const int64_t row = (bi * t + t0 + r) * h + hi;
    s_di[r] = r < nq ? dq_di[row * d] : 0.f;
    s_lse[r] = r < nq ? lse[row] : 0.f;
    s_first[r] = r < nq ? attention_first_key(doc_start, bi, t, t0 + r, window, error_word) : t;
  }
}

// S = Q K^T and dP = dO V^T on the (rows, keys) step, 16x16 tiles round-robin over warps (tiles
// whose keys all follow their queries skipped), then P = exp(scale S - lse) and
// dS = P (dP - D_i), both rounded to bf16, zero where masked. Ends with __syncthreads.
template <int kD, int kRows, int kKeys, int kWarps, bool kWantP>
__device__ __forceinline__ void tc_probs_step(bf16* s_p, bf16* s_ds, float* s_s, float* s_dp,
                                              const bf16* s_q, const bf16* s_dout,
                                              const bf16* s_k, const bf16* s_v,
                                              const float* s_lse, const float* s_di,
                                              const int64_t* s_first, int64_t t0, int nq,
                                              int64_t s0, int nk, float scale) {
  constexpr int kLdx = kTcLdx<kD>, kLds = kKeys + 4, kLdp = kKeys + 8;
  constexpr int kThreads = kWarps * kWarp, kTiles = kRows / kTc * (kKeys / kTc);
  const int warp = int(threadIdx.x) / kWarp;
  for (int job = warp; job < 2 * kTiles; job += kWarps) {
    const int which = job / kTiles, rb = job % kTiles / (kKeys / kTc), kb = job % (kKeys / kTc);
    if (s0 + kb * kTc > t0 + rb * kTc + kTc - 1) continue;  // warp-uniform
    if (which == 0)
      tc_tile_abt<kD>(s_s + rb * kTc * kLds + kb * kTc, kLds, s_q + rb * kTc * kLdx, s_k + kb * kTc * kLdx);
    else
      tc_tile_abt<kD>(s_dp + rb * kTc * kLds + kb * kTc, kLds, s_dout + rb * kTc * kLdx, s_v + kb * kTc * kLdx);
  }
  __syncthreads();
  for (int e = int(threadIdx.x); e < kRows * kKeys; e += kThreads) {
    const int r = e / kKeys, c = e % kKeys;
    const int64_t s = s0 + c;
    float p = 0.f, ds = 0.f;
    if (r < nq && c < nk && s >= s_first[r] && s <= t0 + r) {
      p = expf(s_s[r * kLds + c] * scale - s_lse[r]);
      ds = p * (s_dp[r * kLds + c] - s_di[r]);
    }
    if (kWantP) s_p[r * kLdp + c] = bf16_from(p);
    s_ds[r * kLdp + c] = bf16_from(ds);
  }
  __syncthreads();
}

// Pass 1: grid (ceil(T/keys), Hk, B), block 128, dynamic shared memory BwdKvTiles<kD>.
template <int kD>
__global__ void __launch_bounds__(BwdKvTiles<kD>::kWarps * kWarp)
attention_tc_backward_kv_kernel(float* dk, float* dv, const float* dout, const float* q,
                                const float* k, const float* v, const float* di,
                                const float* lse, const int32_t* doc_start, int64_t t, int64_t h,
                                int64_t hk, int64_t d, float scale, int64_t window,
                                int* error_word) {
  using Tiles = BwdKvTiles<kD>;
  constexpr int kWarps = Tiles::kWarps, kThreads = kWarps * kWarp, kRows = Tiles::kRows;
  constexpr int kKeys = Tiles::kKeys, kLdx = Tiles::kLdx, kLdp = Tiles::kLdp;
  constexpr int kColTiles = kD / kTc, kHalf = kKeys / kTc * kColTiles;  // dV tiles, then dK
  constexpr int kPerWarp = (2 * kHalf + kWarps - 1) / kWarps;
  STRATA_DYN_SHARED(unsigned char, smem);
  Tiles sh;
  sh.carve(smem);
  const int warp = int(threadIdx.x) / kWarp;
  const int64_t s0 = int64_t(blockIdx.x) * kKeys, g = blockIdx.y, bi = blockIdx.z;
  const int64_t rep = h / hk;
  const int nk = int(t - s0 < kKeys ? t - s0 : kKeys);
  const int64_t last_key = s0 + nk - 1;
  // Queries that can see a key of the tile: from the tile on, and within the window of its last.
  const int64_t t_end = window > 0 && last_key + window < t ? last_key + window : t;
  tc_load_tile<kD, kThreads, kKeys>(sh.k, k, bi, t, s0, g, hk, d);
  tc_load_tile<kD, kThreads, kKeys>(sh.v, v, bi, t, s0, g, hk, d);

  FragC acc[kPerWarp];  // tiles warp + kWarps j: dV (keys, D) then dK (keys, D)
#pragma unroll
  for (int j = 0; j < kPerWarp; ++j) wmma::fill_fragment(acc[j], 0.f);

  for (int64_t hi = g * rep; hi < (g + 1) * rep; ++hi) {
    for (int64_t t0 = s0 / kRows * kRows; t0 < t_end; t0 += kRows) {
      const int nq = int(t - t0 < kRows ? t - t0 : kRows);
      if (attention_tile_first_key(doc_start, bi, t, t0, nq, window) > last_key) continue;  // uniform
      __syncthreads();  // the previous step's tiles are consumed
      tc_load_tile<kD, kThreads, kRows>(sh.q, q, bi, t, t0, hi, h, d);
      tc_load_tile<kD, kThreads, kRows>(sh.dout, dout, bi, t, t0, hi, h, d);
      tc_row_stats<kRows, kThreads>(sh.lse, sh.di, sh.first, di, lse, doc_start, bi, t, t0, nq, hi, h, d,
                                    window, error_word);
      __syncthreads();
      tc_probs_step<kD, kRows, kKeys, kWarps, true>(sh.p, sh.ds, sh.s, sh.dp, sh.q, sh.dout, sh.k,
                                                    sh.v, sh.lse, sh.di, sh.first, t0, nq, s0, nk,
                                                    scale);
      // dV += P^T dO, dK += dS^T Q; query blocks wholly before the key block or past T skipped.
#pragma unroll
      for (int j = 0; j < kPerWarp; ++j) {
        const int job = warp + kWarps * j;
        if (job >= 2 * kHalf) break;  // warp-uniform
        const bool is_dk = job >= kHalf;
        const int kb = job % kHalf / kColTiles, cb = job % kColTiles;
        const bf16* weights = is_dk ? sh.ds : sh.p;
        const bf16* rows = is_dk ? sh.q : sh.dout;
        for (int rb = 0; rb < kRows / kTc; ++rb) {
          if (rb * kTc >= nq) break;
          if (t0 + rb * kTc + kTc - 1 < s0 + kb * kTc) continue;
          FragAt fw;
          FragB fr;
          wmma::load_matrix_sync(fw, weights + rb * kTc * kLdp + kb * kTc, kLdp);
          wmma::load_matrix_sync(fr, rows + rb * kTc * kLdx + cb * kTc, kLdx);
          wmma::mma_sync(acc[j], fw, fr, acc[j]);
        }
      }
    }
  }

  float* stage = sh.stage + warp * kTc * kTc;
#pragma unroll
  for (int j = 0; j < kPerWarp; ++j) {
    const int job = warp + kWarps * j;
    if (job >= 2 * kHalf) break;
    const bool is_dk = job >= kHalf;
    const int kb = job % kHalf / kColTiles, cb = job % kColTiles;
    if (is_dk) {
#pragma unroll
      for (int e = 0; e < FragC::num_elements; ++e) acc[j].x[e] *= scale;
    }
    tc_store_tile(is_dk ? dk : dv, acc[j], stage, s0 + kb * kTc, nk - kb * kTc, cb * kTc, bi, t, g,
                  hk, d);
  }
}

// Pass 2: grid (ceil(T/rows), H, B), block 128, dynamic shared memory BwdQTiles<kD>.
template <int kD>
__global__ void __launch_bounds__(BwdQTiles<kD>::kWarps * kWarp)
attention_tc_backward_q_kernel(float* dq, const float* dout, const float* q, const float* k,
                               const float* v, const float* lse,
                               const int32_t* doc_start, int64_t t, int64_t h, int64_t hk,
                               int64_t d, float scale, int64_t window, int* error_word) {
  using Tiles = BwdQTiles<kD>;
  constexpr int kWarps = Tiles::kWarps, kThreads = kWarps * kWarp, kRows = Tiles::kRows;
  constexpr int kKeys = Tiles::kKeys, kLdx = Tiles::kLdx, kLdp = Tiles::kLdp;
  constexpr int kColTiles = kD / kTc, kTiles = kRows / kTc * kColTiles;
  constexpr int kPerWarp = (kTiles + kWarps - 1) / kWarps;
  STRATA_DYN_SHARED(unsigned char, smem);
  Tiles sh;
  sh.carve(smem);
  const int warp = int(threadIdx.x) / kWarp;
  const int64_t t0 = int64_t(blockIdx.x) * kRows, hi = blockIdx.y, bi = blockIdx.z;
  const int64_t g = hi / (h / hk);
  const int nq = int(t - t0 < kRows ? t - t0 : kRows);
  tc_load_tile<kD, kThreads, kRows>(sh.q, q, bi, t, t0, hi, h, d);
  tc_load_tile<kD, kThreads, kRows>(sh.dout, dout, bi, t, t0, hi, h, d);
  tc_row_stats<kRows, kThreads>(sh.lse, sh.di, sh.first, dq, lse, doc_start, bi, t, t0, nq, hi, h, d,
                                window, error_word);

  FragC acc[kPerWarp];  // dQ tiles warp + kWarps j of the (rows, D) block
#pragma unroll
  for (int j = 0; j < kPerWarp; ++j) wmma::fill_fragment(acc[j], 0.f);

  const int64_t first_key = attention_tile_first_key(doc_start, bi, t, t0, nq, window);
  for (int64_t s0 = first_key / kKeys * kKeys; s0 < t0 + nq; s0 += kKeys) {
    const int nk = int(t - s0 < kKeys ? t - s0 : kKeys);
    __syncthreads();  // the previous step's K, V and dS are consumed (and the stats written)
    tc_load_tile<kD, kThreads, kKeys>(sh.k, k, bi, t, s0, g, hk, d);
    tc_load_tile<kD, kThreads, kKeys>(sh.v, v, bi, t, s0, g, hk, d);
    __syncthreads();
    tc_probs_step<kD, kRows, kKeys, kWarps, false>(nullptr, sh.ds, sh.s, sh.dp, sh.q, sh.dout,
                                                   sh.k, sh.v, sh.lse, sh.di, sh.first, t0, nq,
                                                   s0, nk, scale);
#pragma unroll
    for (int j = 0; j < kPerWarp; ++j) {
      const int job = warp + kWarps * j;
      if (job >= kTiles) break;  // warp-uniform
      const int rb = job / kColTiles, cb = job % kColTiles;
      tc_accumulate_keys(acc[j], sh.ds + rb * kTc * kLdp, kLdp, sh.k + cb * kTc, kLdx, kKeys / kTc, s0,
                         t0 + rb * kTc + kTc - 1);
    }
  }

  float* stage = sh.stage + warp * kTc * kTc;
#pragma unroll
  for (int j = 0; j < kPerWarp; ++j) {
    const int job = warp + kWarps * j;
    if (job >= kTiles) break;
    const int rb = job / kColTiles, cb = job % kColTiles;
#pragma unroll
    for (int e = 0; e < FragC::num_elements; ++e) acc[j].x[e] *= scale;
    tc_store_tile(dq, acc[j], stage, t0 + rb * kTc, nq - rb * kTc, cb * kTc, bi, t, hi, h, d);
  }
}

// ---- launchers ----------------------------------------------------------------------------------
void attention_tc_check(int64_t b, int64_t t, int64_t h, int64_t hk, int64_t d) {
  STRATA_CHECK(b >= 0 && t >= 0 && d > 0, "attention (tensor cores): sizes must be non-negative (got b=",
               b, " t=", t, " d=", d, ")");
  STRATA_CHECK(h > 0 && hk > 0 && h % hk == 0, "attention (tensor cores): heads (", h,
               ") must be a positive multiple of kv heads (", hk, ")");
  STRATA_CHECK(d <= kAttentionTcMaxHeadDim, "attention: head dim ", d,
               " is larger than the CUDA tensor-core attention kernel supports (",
               kAttentionTcMaxHeadDim, "); use [device] backend = \"cpu\" for this model");
  STRATA_CHECK(b <= 65535 && h <= 65535 && t <= (int64_t(1) << 31), "attention: batch ", b,
               ", heads ", h, " or tokens ", t, " beyond the CUDA grid");
}

// The kernel's padded head dim for head dim d.
int attention_tc_padded_dim(int64_t d) { return d <= 64 ? 64 : (d <= 80 ? 80 : (d <= 128 ? 128 : 256)); }

// Dynamic shared memory of `kernel`, raised above 48 KiB where the tiles need it (59 to 93 KiB:
// forward 59, 65, 83, 90; dK dV 93, 84, 84, 62; dQ 84, 92, 79, 82 at kD 64, 80, 128, 256).
template <class Kernel>
void attention_tc_allow_smem(Kernel* kernel, size_t bytes) {
  STRATA_ASSERT(bytes <= size_t(99) << 10, "attention_tc: tiles of ", bytes,
                " bytes of shared memory exceed the 99 KiB an sm_89 block may take");
  STRATA_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

template <int kD>
void attention_tc_forward_launch(float* out, float* lse, const float* q, const float* k,
                                 const float* v, const int32_t* doc_start, int64_t b, int64_t t,
                                 int64_t h, int64_t hk, int64_t d, float scale, int64_t window,
                                 int* error_word, cudaStream_t stream) {
  using Tiles = FwdTiles<kD>;
  auto* kernel = attention_tc_forward_kernel<kD>;
  const size_t smem = Tiles().carve(nullptr);
  attention_tc_allow_smem(kernel, smem);
  const dim3 grid(unsigned((t + Tiles::kRows - 1) / Tiles::kRows), unsigned(h), unsigned(b));
  STRATA_LAUNCH(kernel, grid, Tiles::kWarps * kWarp, smem, stream, out, lse, q, k, v, doc_start,
                t, h, hk, d, scale, window, error_word);
  STRATA_CUDA_CHECK_LAUNCH("attention_tc_forward");
}

template <int kD>
void attention_tc_backward_launch(float* dq, float* dk, float* dv, const float* dout,
                                  const float* q, const float* k, const float* v,
                                  const float* out, const float* lse, const int32_t* doc_start,
                                  int64_t b, int64_t t, int64_t h, int64_t hk, int64_t d,
                                  float scale, int64_t window, int* error_word,
                                  cudaStream_t stream) {
  STRATA_LAUNCH(attention_tc_di_kernel, unsigned((b * t * h + kDiWarps - 1) / kDiWarps), kDiWarps * kWarp, 0, stream,
                dq, dout, out, b * t * h, d);
  STRATA_CUDA_CHECK_LAUNCH("attention_tc_backward D_i");
  using KvTiles = BwdKvTiles<kD>;
  auto* kv_kernel = attention_tc_backward_kv_kernel<kD>;
  const size_t kv_smem = KvTiles().carve(nullptr);
  attention_tc_allow_smem(kv_kernel, kv_smem);
  const dim3 kv_grid(unsigned((t + KvTiles::kKeys - 1) / KvTiles::kKeys), unsigned(hk), unsigned(b));
  STRATA_LAUNCH(kv_kernel, kv_grid, KvTiles::kWarps * kWarp, kv_smem, stream, dk, dv, dout, q, k,
                v, dq, lse, doc_start, t, h, hk, d, scale, window, error_word);
  STRATA_CUDA_CHECK_LAUNCH("attention_tc_backward dk dv");
  using QTiles = BwdQTiles<kD>;
  auto* q_kernel = attention_tc_backward_q_kernel<kD>;
  const size_t q_smem = QTiles().carve(nullptr);
  attention_tc_allow_smem(q_kernel, q_smem);
  const dim3 q_grid(unsigned((t + QTiles::kRows - 1) / QTiles::kRows), unsigned(h), unsigned(b));
  STRATA_LAUNCH(q_kernel, q_grid, QTiles::kWarps * kWarp, q_smem, stream, dq, dout, q, k, v, lse,
                doc_start, t, h, hk, d, scale, window, error_word);
  STRATA_CUDA_CHECK_LAUNCH("attention_tc_backward dq");
}

}  // namespace

void attention_tc_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                          const int32_t* doc_start, int64_t b, int64_t t, int64_t h, int64_t hk,
                          int64_t d, float scale, int64_t window, int* error_word,
                          cudaStream_t stream) {
  attention_tc_check(b, t, h, hk, d);
  if (b == 0 || t == 0) return;
  switch (attention_tc_padded_dim(d)) {
    case 64: attention_tc_forward_launch<64>(out, lse, q, k, v, doc_start, b, t, h, hk, d, scale, window, error_word, stream); break;
    case 80: attention_tc_forward_launch<80>(out, lse, q, k, v, doc_start, b, t, h, hk, d, scale, window, error_word, stream); break;
    case 128: attention_tc_forward_launch<128>(out, lse, q, k, v, doc_start, b, t, h, hk, d, scale, window, error_word, stream); break;
    default: attention_tc_forward_launch<256>(out, lse, q, k, v, doc_start, b, t, h, hk, d, scale, window, error_word, stream); break;
  }
}

void attention_tc_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                           const float* k, const float* v, const float* out, const float* lse,
                           const int32_t* doc_start, int64_t b, int64_t t, int64_t h, int64_t hk,
                           int64_t d, float scale, int64_t window, int* error_word,
                           cudaStream_t stream) {
  attention_tc_check(b, t, h, hk, d);
  if (b == 0 || t == 0) return;
  // dq stages D_i before the dK dV pass reads its inputs, so it must share no bytes with them
  const int64_t nq = b * t * h * d, nk = b * t * hk * d;
  const auto apart = [&](const float* x, int64_t n) {
    const uintptr_t lo = reinterpret_cast<uintptr_t>(dq), hi = lo + uintptr_t(nq) * 4;
    const uintptr_t xlo = reinterpret_cast<uintptr_t>(x), xhi = xlo + uintptr_t(n) * 4;
    return hi <= xlo || xhi <= lo;
  };
  STRATA_CHECK(apart(dout, nq) && apart(q, nq) && apart(k, nk) && apart(v, nk) && apart(out, nq) &&
                   apart(lse, b * t * h),
               "attention (tensor cores): dq overlaps an input of the backward (dout, q, k, v, out or lse); the "
               "backward stages D_i in dq, so give dq a buffer of its own");
  switch (attention_tc_padded_dim(d)) {
    case 64: attention_tc_backward_launch<64>(dq, dk, dv, dout, q, k, v, out, lse, doc_start, b, t, h, hk, d, scale, window, error_word, stream); break;
    case 80: attention_tc_backward_launch<80>(dq, dk, dv, dout, q, k, v, out, lse, doc_start, b, t, h, hk, d, scale, window, error_word, stream); break;
    case 128: attention_tc_backward_launch<128>(dq, dk, dv, dout, q, k, v, out, lse, doc_start, b, t, h, hk, d, scale, window, error_word, stream); break;
    default: attention_tc_backward_launch<256>(dq, dk, dv, dout, q, k, v, out, lse, doc_start, b, t, h, hk, d, scale, window, error_word, stream); break;
  }
}

}  // namespace strata::cuda
