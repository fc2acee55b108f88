// Causal GQA attention on CUDA, flash-style (twin: kernels/cpu/ref/attention.h; map:
// kernels/cpu/attention.cpp). q (B,T,H,D), k and v (B,T,Hk,D), out (B,T,H,D), lse (B,T,H).
// Head h reads kv head h / (H/Hk). Query t sees keys s with doc_start[b,t] <= s <= t.
// f32 arithmetic, memory O(tile): scores live one 32-key tile at a time, never (T, T). With
// bf16 dots, q, k, v and dout are rounded to bf16 wherever they are read (every product then
// uses the rounded values, f32 sums), and the backward rounds P and dS to bf16 where they weight
// the sums over tokens (dV, dK, dQ), as the CPU kernel does (kernels/cpu/ops.h).
//
// Layout shared by the three kernels: blocks of 4 warps; a key tile of 32 keys sits in shared
// memory (K and V rows padded by one float so lane-per-key reads hit distinct banks); in the
// score loops lane j owns key j of the tile and walks D, in the accumulation loops lanes own
// head-dim columns (lane + 32u, u < kDPL) and probabilities are broadcast by shuffles.
// kDPL (head-dim columns per lane: 1, 2 or 4) is a template so accumulators stay in registers;
// head dims up to 128.
//
// Forward: block per (16-query tile, head, batch row); online softmax (running max m, sum l).
// Backward, FlashAttention-2 recomputation without atomics, so every output element is summed
// by one thread in a fixed order (deterministic):
//   pass 1, block per (32-key tile, kv head, batch row): dK, dV, walking the heads of the group
//           and the 8-query tiles that can see the keys;
//   pass 2, block per (8-query tile, head, batch row): dQ.
// D_i = rowsum(dout * out) is recomputed where needed (D flops per row and tile: no buffer).
// Key tiles outside [min doc start of the query tile, last query] are skipped, and query tiles
// that cannot see a key tile likewise.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace strata::cuda {
namespace {

constexpr int kAttnWarps = 4;
constexpr int kAttnThreads = kAttnWarps * kWarp;
constexpr int kKeys = 32;                             // keys per tile (one per lane)
constexpr int kFwdRows = 16;                          // queries per forward block
constexpr int kFwdRowsPerWarp = kFwdRows / kAttnWarps;
constexpr int kBwdRows = 8;                           // queries per backward step / block
constexpr int kBwdRowsPerWarp = kBwdRows / kAttnWarps;

// rows (n_rows, kD+1 padded) of head `head` of x (B,T,nh,D) from token t0; zero past d / rows;
// rounded to bf16 (nearest even) with bf16 dots.
template <int kD>
__device__ __forceinline__ void attention_load_tile(float (*rows)[kD + 1], int n_rows,
                                                    const float* x, int64_t bi, int64_t t,
                                                    int64_t t0, int64_t head, int64_t nh,
                                                    int64_t d, bool bf16_dots) {
  for (int e = int(threadIdx.x); e < n_rows * kD; e += kAttnThreads) {
    const int r = e / kD, col = e % kD;
    const int64_t tok = t0 + r;
    const float x_e = (tok < t && col < d) ? x[((bi * t + tok) * nh + head) * d + col] : 0.f;
    rows[r][col] = bf16_dots ? bf16_load_rounded(x_e) : x_e;
  }
}

template <int kD>
__device__ __forceinline__ float attention_dot(const float* a, const float* b, int64_t d) {
  float acc = 0.f;
  for (int64_t e = 0; e < d; ++e) acc += a[e] * b[e];
  return acc;
}

// D_i = sum_e dout[row, e] * out[row, e] over one (token, head) row, summed by a warp; dout
// rounded to bf16 with bf16 dots.
__device__ __forceinline__ float attention_row_di(const float* dout, const float* out, int64_t row,
                                                  int64_t d, int lane, bool bf16_dots) {
  float acc = 0.f;
  for (int64_t e = lane; e < d; e += kWarp) {
    const float g = bf16_dots ? bf16_load_rounded(dout[row * d + e]) : dout[row * d + e];
    acc += g * out[row * d + e];
  }
  return warp_sum(acc);
}

// grid (ceil(T/16), H, B), block 128.
template <int kDPL>
__global__ void attention_forward_kernel(float* out, float* lse, const float* q, const float* k,
                                         const float* v, const int32_t* doc_start, int64_t t,
                                         int64_t h, int64_t hk, int64_t d, float scale,
                                         bool bf16_dots, int64_t window, int* error_word) {
  constexpr int kD = kWarp * kDPL;
  __shared__ float sq[kFwdRows][kD + 1];  // (16, D) queries of this tile
  __shared__ float sk[kKeys][kD + 1];     // (32, D) keys of the current tile
  __shared__ float sv[kKeys][kD + 1];     // (32, D) values of the current tile
  const int lane = int(threadIdx.x) % kWarp, warp = int(threadIdx.x) / kWarp;
  const int64_t t0 = int64_t(blockIdx.x) * kFwdRows, hi = blockIdx.y, bi = blockIdx.z;
  const int64_t g = hi / (h / hk);
  const int nq = int(t - t0 < kFwdRows ? t - t0 : kFwdRows);
  attention_load_tile<kD>(sq, kFwdRows, q, bi, t, t0, hi, h, d, bf16_dots);

  float o[kFwdRowsPerWarp][kDPL];  // unnormalised output, lanes own columns lane + 32u
  float m[kFwdRowsPerWarp], l[kFwdRowsPerWarp];
  int64_t first[kFwdRowsPerWarp];
#pragma unroll
  for (int i = 0; i < kFwdRowsPerWarp; ++i) {
    const int r = warp * kFwdRowsPerWarp + i;
    m[i] = -INFINITY;
    l[i] = 0.f;
    first[i] = r < nq ? attention_first_key(doc_start, bi, t, t0 + r, window, error_word) : 0;
#pragma unroll
    for (int u = 0; u < kDPL; ++u) o[i][u] = 0.f;
  }

  const int64_t first_key = attention_tile_first_key(doc_start, bi, t, t0, nq, window);
  for (int64_t s0 = first_key / kKeys * kKeys; s0 < t0 + nq; s0 += kKeys) {
    __syncthreads();  // the previous tile is consumed (and sq is loaded)
    attention_load_tile<kD>(sk, kKeys, k, bi, t, s0, g, hk, d, bf16_dots);
    attention_load_tile<kD>(sv, kKeys, v, bi, t, s0, g, hk, d, bf16_dots);
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kFwdRowsPerWarp; ++i) {
      const int r = warp * kFwdRowsPerWarp + i;
      if (r >= nq) continue;  // warp-uniform
      const int64_t tq = t0 + r, s = s0 + lane;
      const bool visible = s >= first[i] && s <= tq;
      const float score = visible ? attention_dot<kD>(sq[r], sk[lane], d) * scale : -INFINITY;
      const float tile_max = warp_max(score);
      if (tile_max == -INFINITY) continue;  // warp-uniform: no visible key in this tile
      const float m_new = fmaxf(m[i], tile_max);
      const float alpha = expf(m[i] - m_new);  // 0 on the first visible tile
      const float p = visible ? expf(score - m_new) : 0.f;
      l[i] = l[i] * alpha + warp_sum(p);
      m[i] = m_new;
#pragma unroll
      for (int u = 0; u < kDPL; ++u) o[i][u] *= alpha;
      for (int j = 0; j < kKeys; ++j) {
        const float pj = __shfl_sync(kFullMask, p, j);
#pragma unroll
        for (int u = 0; u < kDPL; ++u) o[i][u] += pj * sv[j][lane + kWarp * u];
      }
    }
  }

#pragma unroll
  for (int i = 0; i < kFwdRowsPerWarp; ++i) {
    const int r = warp * kFwdRowsPerWarp + i;
    if (r >= nq) continue;
    const int64_t row = (bi * t + t0 + r) * h + hi;  // (token, head) row
    const float inv = 1.f / l[i];  // every query sees at least itself: l > 0
#pragma unroll
    for (int u = 0; u < kDPL; ++u) {
      const int col = lane + kWarp * u;
      if (col < d) out[row * d + col] = o[i][u] * inv;
    }
    if (lane == 0) lse[row] = m[i] + logf(l[i]);
  }
}

// Backward pass 1: grid (ceil(T/32), Hk, B), block 128. Lane j owns key j of the tile; warp w
// owns head-dim columns w + 4u (u < 8 kDPL) of dK and dV.
template <int kDPL>
__global__ void attention_backward_kv_kernel(float* dk, float* dv, const float* dout,
                                             const float* q, const float* k, const float* v,
                                             const float* out, const float* lse,
                                             const int32_t* doc_start, int64_t t, int64_t h,
                                             int64_t hk, int64_t d, float scale, bool bf16_dots,
                                             int64_t window, int* error_word) {
  constexpr int kD = kWarp * kDPL;
  constexpr int kCols = kD / kAttnWarps;  // columns per thread
  __shared__ float sk[kKeys][kD + 1];     // (32, D)
  __shared__ float sv[kKeys][kD + 1];     // (32, D)
  __shared__ float sq[kBwdRows][kD + 1];  // (8, D) queries of the current step
  __shared__ float sdo[kBwdRows][kD + 1]; // (8, D) their output gradients
  __shared__ float sp[kBwdRows][kKeys + 1];   // (8, 32) probabilities
  __shared__ float sds[kBwdRows][kKeys + 1];  // (8, 32) dS = P (dP - D_i)
  __shared__ float slse[kBwdRows], sdi[kBwdRows];
  __shared__ int64_t sfirst[kBwdRows];
  const int lane = int(threadIdx.x) % kWarp, warp = int(threadIdx.x) / kWarp;
  const int64_t s0 = int64_t(blockIdx.x) * kKeys, g = blockIdx.y, bi = blockIdx.z;
  const int64_t rep = h / hk;
  const int nk = int(t - s0 < kKeys ? t - s0 : kKeys);
  attention_load_tile<kD>(sk, kKeys, k, bi, t, s0, g, hk, d, bf16_dots);
  attention_load_tile<kD>(sv, kKeys, v, bi, t, s0, g, hk, d, bf16_dots);

  float dk_acc[kCols], dv_acc[kCols];
#pragma unroll
  for (int u = 0; u < kCols; ++u) dk_acc[u] = dv_acc[u] = 0.f;

  for (int64_t hi = g * rep; hi < (g + 1) * rep; ++hi) {
    for (int64_t t0 = s0 / kBwdRows * kBwdRows; t0 < t; t0 += kBwdRows) {
      const int nq = int(t - t0 < kBwdRows ? t - t0 : kBwdRows);
      if (attention_tile_first_key(doc_start, bi, t, t0, nq, window) > s0 + nk - 1) continue;  // uniform
      __syncthreads();  // the previous step's shared tiles are consumed
      attention_load_tile<kD>(sq, kBwdRows, q, bi, t, t0, hi, h, d, bf16_dots);
      attention_load_tile<kD>(sdo, kBwdRows, dout, bi, t, t0, hi, h, d, bf16_dots);
#pragma unroll
      for (int i = 0; i < kBwdRowsPerWarp; ++i) {
        const int r = warp * kBwdRowsPerWarp + i;
        if (r >= nq) continue;  // warp-uniform
        const int64_t row = (bi * t + t0 + r) * h + hi;
        const float di = attention_row_di(dout, out, row, d, lane, bf16_dots);
        if (lane == 0) {
          sdi[r] = di;
          slse[r] = lse[row];
          sfirst[r] = attention_first_key(doc_start, bi, t, t0 + r, window, error_word);
        }
      }
      __syncthreads();
#pragma unroll
      for (int i = 0; i < kBwdRowsPerWarp; ++i) {
        const int r = warp * kBwdRowsPerWarp + i;  // pair (r, lane)
        const int64_t s = s0 + lane;
        const bool visible = r < nq && lane < nk && s >= sfirst[r] && s <= t0 + r;
        float p = 0.f, ds = 0.f;
        if (visible) {
          p = expf(attention_dot<kD>(sq[r], sk[lane], d) * scale - slse[r]);
          ds = p * (attention_dot<kD>(sdo[r], sv[lane], d) - sdi[r]);
        }
        sp[r][lane] = bf16_dots ? bf16_load_rounded(p) : p;
        sds[r][lane] = bf16_dots ? bf16_load_rounded(ds) : ds;
      }
      __syncthreads();
      for (int r = 0; r < nq; ++r) {
        const float p = sp[r][lane], ds = sds[r][lane];
#pragma unroll
        for (int u = 0; u < kCols; ++u) {
          const int col = warp + kAttnWarps * u;
          dv_acc[u] += p * sdo[r][col];
          dk_acc[u] += ds * sq[r][col];
        }
      }
    }
  }
  if (lane < nk) {
    const int64_t row = (bi * t + s0 + lane) * hk + g;
#pragma unroll
    for (int u = 0; u < kCols; ++u) {
      const int col = warp + kAttnWarps * u;
      if (col < d) {
        dk[row * d + col] = dk_acc[u] * scale;
        dv[row * d + col] = dv_acc[u];
      }
    }
  }
}

// Backward pass 2: grid (ceil(T/8), H, B), block 128; warp w owns queries 2w, 2w+1 of the tile.
template <int kDPL>
__global__ void attention_backward_q_kernel(float* dq, const float* dout, const float* q,
                                            const float* k, const float* v, const float* out,
                                            const float* lse, const int32_t* doc_start,
                                            int64_t t, int64_t h, int64_t hk, int64_t d,
                                            float scale, bool bf16_dots, int64_t window, int* error_word) {
  constexpr int kD = kWarp * kDPL;
  __shared__ float sq[kBwdRows][kD + 1];   // (8, D)
  __shared__ float sdo[kBwdRows][kD + 1];  // (8, D)
  __shared__ float sk[kKeys][kD + 1];      // (32, D)
  __shared__ float sv[kKeys][kD + 1];      // (32, D)
  const int lane = int(threadIdx.x) % kWarp, warp = int(threadIdx.x) / kWarp;
  const int64_t t0 = int64_t(blockIdx.x) * kBwdRows, hi = blockIdx.y, bi = blockIdx.z;
  const int64_t g = hi / (h / hk);
  const int nq = int(t - t0 < kBwdRows ? t - t0 : kBwdRows);
  attention_load_tile<kD>(sq, kBwdRows, q, bi, t, t0, hi, h, d, bf16_dots);
  attention_load_tile<kD>(sdo, kBwdRows, dout, bi, t, t0, hi, h, d, bf16_dots);

  float dq_acc[kBwdRowsPerWarp][kDPL];
  float row_lse[kBwdRowsPerWarp], row_di[kBwdRowsPerWarp];
  int64_t first[kBwdRowsPerWarp];
#pragma unroll
  for (int i = 0; i < kBwdRowsPerWarp; ++i) {
    const int r = warp * kBwdRowsPerWarp + i;
    const int64_t row = (bi * t + t0 + r) * h + hi;
    row_lse[i] = r < nq ? lse[row] : 0.f;
    row_di[i] = r < nq ? attention_row_di(dout, out, row, d, lane, bf16_dots) : 0.f;
    first[i] = r < nq ? attention_first_key(doc_start, bi, t, t0 + r, window, error_word) : 0;
#pragma unroll
    for (int u = 0; u < kDPL; ++u) dq_acc[i][u] = 0.f;
  }

  const int64_t first_key = attention_tile_first_key(doc_start, bi, t, t0, nq, window);
  for (int64_t s0 = first_key / kKeys * kKeys; s0 < t0 + nq; s0 += kKeys) {
    __syncthreads();
    attention_load_tile<kD>(sk, kKeys, k, bi, t, s0, g, hk, d, bf16_dots);
    attention_load_tile<kD>(sv, kKeys, v, bi, t, s0, g, hk, d, bf16_dots);
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kBwdRowsPerWarp; ++i) {
      const int r = warp * kBwdRowsPerWarp + i;
      if (r >= nq) continue;  // warp-uniform
      const int64_t s = s0 + lane;
      float ds = 0.f;
      if (s >= first[i] && s <= t0 + r) {
        const float p = expf(attention_dot<kD>(sq[r], sk[lane], d) * scale - row_lse[i]);
        ds = p * (attention_dot<kD>(sdo[r], sv[lane], d) - row_di[i]);
        if (bf16_dots) ds = bf16_load_rounded(ds);
      }
      for (int j = 0; j < kKeys; ++j) {
        const float dsj = __shfl_sync(kFullMask, ds, j);
#pragma unroll
        for (int u = 0; u < kDPL; ++u) dq_acc[i][u] += dsj * sk[j][lane + kWarp * u];
      }
    }
  }

#pragma unroll
  for (int i = 0; i < kBwdRowsPerWarp; ++i) {
    const int r = warp * kBwdRowsPerWarp + i;
    if (r >= nq) continue;
    const int64_t row = (bi * t + t0 + r) * h + hi;
#pragma unroll
    for (int u = 0; u < kDPL; ++u) {
      const int col = lane + kWarp * u;
      if (col < d) dq[row * d + col] = dq_acc[i][u] * scale;
    }
  }
}

void attention_check(int64_t b, int64_t t, int64_t h, int64_t hk, int64_t d) {
  STRATA_CHECK(b >= 0 && t >= 0 && d > 0, "attention: sizes must be non-negative (got b=", b,
               " t=", t, " d=", d, ")");
  STRATA_CHECK(h > 0 && hk > 0 && h % hk == 0, "attention: heads (", h,
               ") must be a positive multiple of kv heads (", hk, ")");
  STRATA_CHECK(d <= kAttentionMaxHeadDim, "attention: head dim ", d,
               " is larger than the CUDA attention kernel supports (", kAttentionMaxHeadDim,
               "); use [device] backend = \"cpu\" for this model");
  STRATA_CHECK(b <= 65535 && h <= 65535 && t <= (int64_t(1) << 31),
               "attention: batch ", b, ", heads ", h, " or tokens ", t, " beyond the CUDA grid");
}

// Head-dim columns per lane for head dim d.
int attention_cols_per_lane(int64_t d) { return d <= 32 ? 1 : (d <= 64 ? 2 : 4); }

template <int kDPL>
void attention_forward_launch(float* out, float* lse, const float* q, const float* k,
                              const float* v, const int32_t* doc_start, int64_t b, int64_t t,
                              int64_t h, int64_t hk, int64_t d, float scale, bool bf16_dots,
                              int64_t window, int* error_word, cudaStream_t stream) {
  auto* kernel = attention_forward_kernel<kDPL>;
  const dim3 grid(unsigned((t + kFwdRows - 1) / kFwdRows), unsigned(h), unsigned(b));
  STRATA_LAUNCH(kernel, grid, kAttnThreads, 0, stream, out, lse, q, k, v, doc_start, t, h, hk, d,
                scale, bf16_dots, window, error_word);
  STRATA_CUDA_CHECK_LAUNCH("attention_forward");
}

template <int kDPL>
void attention_backward_launch(float* dq, float* dk, float* dv, const float* dout, const float* q,
                               const float* k, const float* v, const float* out, const float* lse,
                               const int32_t* doc_start, int64_t b, int64_t t, int64_t h,
                               int64_t hk, int64_t d, float scale, bool bf16_dots,
                               int64_t window, int* error_word, cudaStream_t stream) {
  auto* kv_kernel = attention_backward_kv_kernel<kDPL>;
  const dim3 kv_grid(unsigned((t + kKeys - 1) / kKeys), unsigned(hk), unsigned(b));
  STRATA_LAUNCH(kv_kernel, kv_grid, kAttnThreads, 0, stream, dk, dv, dout, q, k, v, out, lse,
                doc_start, t, h, hk, d, scale, bf16_dots, window, error_word);
  STRATA_CUDA_CHECK_LAUNCH("attention_backward dk dv");
  auto* q_kernel = attention_backward_q_kernel<kDPL>;
  const dim3 q_grid(unsigned((t + kBwdRows - 1) / kBwdRows), unsigned(h), unsigned(b));
  STRATA_LAUNCH(q_kernel, q_grid, kAttnThreads, 0, stream, dq, dout, q, k, v, out, lse, doc_start,
                t, h, hk, d, scale, bf16_dots, window, error_word);
  STRATA_CUDA_CHECK_LAUNCH("attention_backward dq");
}

}  // namespace

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const int32_t* doc_start, int64_t b, int64_t t, int64_t h, int64_t hk,
                       int64_t d, float scale, bool bf16_dots, int64_t window, int* error_word,
                       cudaStream_t stream) {
  attention_check(b, t, h, hk, d);
  if (b == 0 || t == 0) return;
  switch (attention_cols_per_lane(d)) {
    case 1: attention_forward_launch<1>(out, lse, q, k, v, doc_start, b, t, h, hk, d, scale, bf16_dots, window, error_word, stream); break;
    case 2: attention_forward_launch<2>(out, lse, q, k, v, doc_start, b, t, h, hk, d, scale, bf16_dots, window, error_word, stream); break;
    default: attention_forward_launch<4>(out, lse, q, k, v, doc_start, b, t, h, hk, d, scale, bf16_dots, window, error_word, stream); break;
  }
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        const int32_t* doc_start, int64_t b, int64_t t, int64_t h, int64_t hk,
                        int64_t d, float scale, bool bf16_dots, int64_t window, int* error_word,
                        cudaStream_t stream) {
  attention_check(b, t, h, hk, d);
  if (b == 0 || t == 0) return;
  switch (attention_cols_per_lane(d)) {
    case 1: attention_backward_launch<1>(dq, dk, dv, dout, q, k, v, out, lse, doc_start, b, t, h, hk, d, scale, bf16_dots, window, error_word, stream); break;
    case 2: attention_backward_launch<2>(dq, dk, dv, dout, q, k, v, out, lse, doc_start, b, t, h, hk, d, scale, bf16_dots, window, error_word, stream); break;
    default: attention_backward_launch<4>(dq, dk, dv, dout, q, k, v, out, lse, doc_start, b, t, h, hk, d, scale, bf16_dots, window, error_word, stream); break;
  }
}

}  // namespace strata::cuda
