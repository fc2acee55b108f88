// Cached attention on CUDA, for generation (twin: kernels/cpu/ref/attention_cached.h; semantics:
// kernels/cpu/attention_cached.h). q (B,Tq,H,D), k_cache and v_cache (B,Tcap,Hk,D), start (B):
// query i of row b sits at position start[b] + i and sees cache positions [0, start[b] + i], or
// with a sliding window (window > 0) the last `window` of them.
//
// One warp per (row, query, head), four warps per block. Lanes own head-dim columns
// (lane + 32u, u < 8: D <= 256) of q and of the output accumulator, so each key's row is read
// coalesced and its score is a warp sum; keys go in tiles of 32 (lane j keeps key j's score)
// with an online softmax (running max m, sum l); probabilities reach every lane by shuffles.
// With bf16 dots q, k and v are rounded to bf16 (nearest even) as they are read, products of
// the rounded values summed in f32, as the training kernel does (attention.cu).
// Fixed order everywhere: deterministic. The decode step has Tq = 1: B*H warps, each walking the
// cache once; memory O(1) per warp.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/attention_cached.h"
#include "kernels/cuda/ops.h"

namespace strata::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kCols = 8;  // head-dim columns per lane: D <= 256 (Gemma 3's head dim)

__global__ void attention_cached_forward_kernel(float* out, const float* q, const float* k_cache,
                                                const float* v_cache, const int32_t* start, int64_t b,
                                                int64_t tq, int64_t tcap, int64_t h, int64_t hk, int64_t d,
                                                float scale, bool bf16_dots, int64_t window) {
  const int lane = int(threadIdx.x) % kWarp;
  const int64_t task = int64_t(blockIdx.x) * kWarps + int64_t(threadIdx.x) / kWarp;
  if (task >= b * tq * h) return;  // a whole warp leaves together
  const int64_t hi = task % h, i = (task / h) % tq, bi = task / (h * tq);
  const int64_t g = hi / (h / hk), kv_stride = hk * d;
  const int64_t last = int64_t(start[bi]) + i;
  const int64_t first = window > 0 && last - window + 1 > 0 ? last - window + 1 : 0;
  const float* kb = k_cache + bi * tcap * kv_stride + g * d;
  const float* vb = v_cache + bi * tcap * kv_stride + g * d;
  float qr[kCols], acc[kCols];
  for (int u = 0; u < kCols; ++u) {
    const int64_t e = lane + kWarp * u;
    qr[u] = e < d ? (bf16_dots ? bf16_load_rounded(q[task * d + e]) : q[task * d + e]) : 0.f;
    acc[u] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  for (int64_t j0 = first; j0 <= last; j0 += kWarp) {
    const int n = int(last + 1 - j0 < kWarp ? last + 1 - j0 : kWarp);
    float mine = -INFINITY;  // lane j: the score of key j0 + j
    for (int j = 0; j < n; ++j) {
      const float* kj = kb + (j0 + j) * kv_stride;
      float part = 0.f;
      for (int u = 0; u < kCols; ++u) {
        const int64_t e = lane + kWarp * u;
        if (e < d) part += qr[u] * (bf16_dots ? bf16_load_rounded(kj[e]) : kj[e]);
      }
      const float s = scale * warp_sum(part);
      if (lane == j) mine = s;
    }
    const float m_new = fmaxf(m, warp_max(mine));
    const float correction = expf(m - m_new);  // 0 on the first tile (m = -inf)
    const float p = lane < n ? expf(mine - m_new) : 0.f;
    l = l * correction + warp_sum(p);
    for (int u = 0; u < kCols; ++u) acc[u] *= correction;
    for (int j = 0; j < n; ++j) {
      const float pj = __shfl_sync(kFullMask, p, j);
      const float* vj = vb + (j0 + j) * kv_stride;
      for (int u = 0; u < kCols; ++u) {
        const int64_t e = lane + kWarp * u;
        if (e < d) acc[u] += pj * (bf16_dots ? bf16_load_rounded(vj[e]) : vj[e]);
      }
    }
    m = m_new;
  }
  const float inv = 1.f / l;
  for (int u = 0; u < kCols; ++u) {
    const int64_t e = lane + kWarp * u;
    if (e < d) out[task * d + e] = acc[u] * inv;
  }
}

}  // namespace

void attention_cached_forward(float* out, const float* q, const float* k_cache, const float* v_cache,
                              const int32_t* start, int64_t b, int64_t tq, int64_t tcap, int64_t h, int64_t hk,
                              int64_t d, float scale, bool bf16_dots, int64_t window, cudaStream_t stream) {
  STRATA_CHECK(b >= 1 && tq >= 1 && tcap >= tq && h >= 1 && hk >= 1 && h % hk == 0 && d >= 1 &&
                   d <= kWarp * kCols,
               "attention_cached_forward: need b, tq >= 1, tcap >= tq, h a multiple of hk, 1 <= d <= ",
               kWarp * kCols, "; got b=", b, " tq=", tq, " tcap=", tcap, " h=", h, " hk=", hk, " d=", d);
  const int64_t tasks = b * tq * h;
  STRATA_CHECK((tasks + kWarps - 1) / kWarps <= int64_t(INT32_MAX), "attention_cached_forward: too many queries");
  STRATA_LAUNCH(attention_cached_forward_kernel, unsigned((tasks + kWarps - 1) / kWarps), kWarps * kWarp, 0, stream,
                out, q, k_cache, v_cache, start, b, tq, tcap, h, hk, d, scale, bf16_dots, window);
  STRATA_CUDA_CHECK_LAUNCH("attention_cached_forward");
}

}  // namespace strata::cuda
