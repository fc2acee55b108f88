// The CPU attention backward's entry: D_i, then the portable or the vdpbf16ps/AMX kernel.
#include <cstdint>
#include <vector>

#include "kernels/cpu/attention_tiles.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/vec_exp.h"

namespace strata::cpu {
namespace {

// sum_e a[e] b[e] in order. One function for both dot types, so that bf16 dots on bf16-valued
// inputs give the f32 op's bits (the compiler contracts one loop one way).
[[gnu::noinline]] float attention_row_dot(const float* a, const float* b, int64_t d) {
  float acc = 0.f;
  for (int64_t e = 0; e < d; ++e) acc += a[e] * b[e];
  return acc;
}

// D_i = rowsum(dout * out) (B,T,H), dout as the kernel reads it: the portable kernel's head-major
// values (B,H,T,D), or bf16 ones widened.
void attention_output_dots(float* di, const float* dout_hm, const bf16* dout_bf, const float* out,
                           const AttentionShape& s) {
  const int64_t rows = s.b * s.t * s.h, d = s.d;
#pragma omp parallel
  {
    std::vector<float> widened(size_t(dout_bf ? d : 0));  // (D) one dout row, bf16 widened
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t bi = r / (s.t * s.h), ti = r / s.h % s.t, head = r % s.h;
      const float* g = dout_hm ? dout_hm + ((bi * s.h + head) * s.t + ti) * d : widened.data();
      if (dout_bf)
        for (int64_t e = 0; e < d; ++e) widened[e] = bf16_to_f32(dout_bf[r * d + e]);
      di[r] = attention_row_dot(g, out + r * d, d);
    }
  }
}

}  // namespace

void attention_tile_weights(const float* lse_t, const float* di_t, int64_t nq, int64_t nk,
                            float scale, const AttentionShape& s, AttentionWorkspace& ws) {
  float* p = ws.scores.data();
  float* dp = ws.dscores.data();
  for (int64_t i = 0; i < nq; ++i) {
    float* pi = p + i * kTileK;
    float* dpi = dp + i * kTileK;
    const int64_t j0 = ws.first[i], j1 = ws.last[i];
    const float lse_i = lse_t[i], di_i = di_t[i];
    if (s.bf16) {  // the weights of the products over tokens, rounded once formed in f32
#pragma omp simd
      for (int64_t j = 0; j < nk; ++j) {
        const bool visible = j >= j0 && j <= j1;
        const float pij = exp_f32(pi[j] * scale - lse_i);
        const float dsij = pij * (dpi[j] - di_i);
        pi[j] = visible ? attention_round_bf16(pij) : 0.f;
        dpi[j] = visible ? attention_round_bf16(dsij) : 0.f;
      }
      continue;
    }
#pragma omp simd
    for (int64_t j = 0; j < nk; ++j) {
      const bool visible = j >= j0 && j <= j1;
      const float pij = exp_f32(pi[j] * scale - lse_i);
      pi[j] = visible ? pij : 0.f;
      dpi[j] = visible ? pij * (dpi[j] - di_i) : 0.f;
    }
  }
}

void attention_load_row_stats(const float* lse, const float* di, int64_t bi, int64_t hi, int64_t t0,
                              int64_t nq, const AttentionShape& s, AttentionWorkspace& ws) {
  for (int64_t i = 0; i < nq; ++i) {
    ws.row_a[i] = lse[(bi * s.t + t0 + i) * s.h + hi];
    ws.row_b[i] = di[(bi * s.t + t0 + i) * s.h + hi];
  }
}

void attention_backward_isa(float* dq, float* dk, float* dv, const float* dout, const float* q,
                            const float* k, const float* v, const float* out, const float* lse,
                            const int32_t* doc_start, int64_t b, int64_t t, int64_t h, int64_t hk,
                            int64_t d, float scale, DType dot_type, AttentionIsa isa,
                            size_t stored_ds_max_bytes, int64_t window) {
  const AttentionShape s = attention_shape(b, t, h, hk, d, dot_type, isa, window);
  attention_check_inputs(s, doc_start);
  const std::vector<int32_t> first_keys = attention_tile_first_keys(s, doc_start);  // (B, q_tiles)
  AttentionScratch& scratch = attention_scratch();
  std::vector<float> di(size_t(b * t * h));  // (B,T,H) rowsum(dout * out)
  if (!s.dpbf16) {
    const AttentionFloats in = attention_floats(q, k, v, dout, s, scratch);
    attention_output_dots(di.data(), in.dout, nullptr, out, s);
    attention_backward_portable(dq, dk, dv, in, lse, di.data(), doc_start, first_keys.data(), scale,
                                s);
    return;
  }
  AttentionStoredDs stored;  // pass 1 writes every slot pass 2 reads: stale words are never read
  stored.pairs = s.q_tiles * (s.q_tiles + 1) / 2;
  const size_t stored_bytes = attention_stored_ds_bytes(b, t, h, d, dot_type, isa);
  if (stored_bytes > 0 && stored_bytes <= stored_ds_max_bytes) {
    const size_t words = stored_bytes / sizeof(uint32_t);
    stored.words = scratch_grow(scratch.ds_words, words);
  }
  const AttentionInput qi = attention_input(q, b * t * h * d, scratch.inputs[0]);
  const AttentionInput ki = attention_input(k, b * t * hk * d, scratch.inputs[1]);
  const AttentionInput vi = attention_input(v, b * t * hk * d, scratch.inputs[2]);
  const AttentionInput doi = attention_input(dout, b * t * h * d, scratch.inputs[3]);
  attention_output_dots(di.data(), nullptr, doi.bf, out, s);
  attention_backward_dpbf16(dq, dk, dv, doi, qi, ki, vi, lse, di.data(), doc_start, first_keys.data(),
                            scale, s, stored);
}

}  // namespace strata::cpu
