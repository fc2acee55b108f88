// CPU causal GQA attention: the call's shape and inputs, the ISA choice, and the scratch sizes.
// The kernel's design and its other files: attention_tiles.h.
#include <algorithm>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "kernels/cpu/amx.h"
#include "kernels/cpu/attention_tiles.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/scratch.h"
#include "src/core/error.h"

namespace strata::cpu {

void attention_check_inputs(const AttentionShape& s, const int32_t* doc_start) {
  STRATA_CHECK(s.b >= 0 && s.t >= 0 && s.d > 0,
               "attention: sizes must be non-negative (got b=", s.b, " t=", s.t, " d=", s.d, ")");
  STRATA_CHECK(s.h > 0 && s.hk > 0 && s.h % s.hk == 0, "attention: heads (", s.h,
               ") must be a positive multiple of kv heads (", s.hk, ")");
  if (!doc_start) return;
  for (int64_t bi = 0; bi < s.b; ++bi)
    for (int64_t ti = 0; ti < s.t; ++ti) {
      const int32_t ds = doc_start[bi * s.t + ti];
      STRATA_CHECK(ds >= 0 && ds <= ti, "attention: doc_start[", bi, ",", ti, "] = ", ds,
                   " must lie in [0, ", ti, "] (the start of the token's document)");
    }
}

std::vector<int32_t> attention_tile_first_keys(const AttentionShape& s, const int32_t* doc_start) {
  std::vector<int32_t> first(size_t(s.b * s.q_tiles), 0);
  if (!doc_start && s.window <= 0) return first;
  for (int64_t bi = 0; bi < s.b; ++bi)
    for (int64_t qt = 0; qt < s.q_tiles; ++qt) {
      const int64_t t0 = qt * kTileQ, t1 = std::min(s.t, t0 + kTileQ);
      int64_t m = attention_query_first_key(doc_start, bi, t0, s);
      for (int64_t ti = t0 + 1; ti < t1; ++ti) m = std::min(m, attention_query_first_key(doc_start, bi, ti, s));
      first[bi * s.q_tiles + qt] = int32_t(m);
    }
  return first;
}

AttentionScratch& attention_scratch() {
  static thread_local AttentionScratch scratch;
  return scratch;
}

AttentionInput attention_input(const float* x, int64_t n, LineVector<bf16>& storage) {
  bf16* dst = scratch_grow(storage, size_t(n));
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(x[i]);
  return {dst};
}

namespace {

// x (B, T, nh, D) head-major into `storage` (B, nh, T, D), with bf16 dots rounded to bf16 (kept
// as f32).
const float* attention_head_major(const float* x, int64_t nh, const AttentionShape& s,
                                  LineVector<float>& storage) {
  const int64_t d = s.d;
  float* xh = scratch_grow(storage, size_t(s.b * s.t * nh * d));
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t bi = 0; bi < s.b; ++bi)
    for (int64_t ti = 0; ti < s.t; ++ti)
      for (int64_t head = 0; head < nh; ++head) {
        const float* src = x + ((bi * s.t + ti) * nh + head) * d;
        float* row = xh + ((bi * nh + head) * s.t + ti) * d;
        if (s.bf16)
          for (int64_t e = 0; e < d; ++e) row[e] = attention_round_bf16(src[e]);
        else
          std::copy(src, src + d, row);
      }
  return xh;
}

// xt (B, nh, D, tp) = the head-major xh (B, nh, T, D) by head and dimension, tokens along the
// rows, zero past T (up to tp), a key tile of 64 tokens at a time.
void attention_transpose_heads(float* xt, const float* xh, int64_t nh, int64_t tp,
                               const AttentionShape& s) {
  const int64_t d = s.d, tiles = s.k_tiles;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t bh = 0; bh < s.b * nh; ++bh)
    for (int64_t tile = 0; tile < tiles; ++tile) {
      const int64_t t0 = tile * kTileK, n = std::min(kTileK, s.t - t0);
      const float* src = xh + (bh * s.t + t0) * d;
      float* dst = xt + bh * d * tp + t0;
      for (int64_t e = 0; e < d; ++e) {
        float* row = dst + e * tp;
        for (int64_t j = 0; j < n; ++j) row[j] = src[j * d + e];
        std::fill(row + n, row + (tile + 1 == tiles ? tp - t0 : kTileK), 0.f);
      }
    }
}

}  // namespace

AttentionFloats attention_floats(const float* q, const float* k, const float* v, const float* dout,
                                 const AttentionShape& s, AttentionScratch& scratch) {
  AttentionFloats in;
  in.tp = attention_cols_stride(s);
  in.q = attention_head_major(q, s.h, s, scratch.inputs_f32[0]);
  in.k = attention_head_major(k, s.hk, s, scratch.inputs_f32[1]);
  in.v = attention_head_major(v, s.hk, s, scratch.inputs_f32[2]);
  if (dout) in.dout = attention_head_major(dout, s.h, s, scratch.inputs_f32[3]);
  const size_t cols = size_t(s.b * s.hk * s.d * in.tp);
  float* kt = scratch_grow(scratch.kt, cols);
  attention_transpose_heads(kt, in.k, s.hk, in.tp, s);
  in.kt = kt;
  if (!dout) return in;
  float* vt = scratch_grow(scratch.vt, cols);
  attention_transpose_heads(vt, in.v, s.hk, in.tp, s);
  in.vt = vt;
  return in;
}

AttentionShape attention_shape(int64_t b, int64_t t, int64_t h, int64_t hk, int64_t d,
                               DType dot_type, AttentionIsa isa, int64_t window) {
  STRATA_CHECK(dot_type == DType::f32 || dot_type == DType::bf16,
               "attention: dot products run in f32 or bf16 (got ", dtype_name(dot_type), ")");
  STRATA_CHECK(attention_isa_supported(isa), "attention: this CPU cannot run the ",
               attention_isa_name(isa), " kernel");
  const bool bf16 = dot_type == DType::bf16;
  AttentionShape s{b,
                   t,
                   h,
                   hk,
                   d,
                   hk > 0 ? h / hk : 0,
                   (t + kTileQ - 1) / kTileQ,
                   (t + kTileK - 1) / kTileK,
                   bf16,
                   bf16 && isa != AttentionIsa::portable,
                   bf16 && isa == AttentionIsa::amx_bf16,
                   (d + 1) / 2 * 2,
                   bf16 && isa != AttentionIsa::portable ? (d + 15) / 16 * 16 : d,
                   window > 0 ? window : 0};
  return s;
}

const char* attention_isa_name(AttentionIsa isa) {
  switch (isa) {
    case AttentionIsa::avx512_bf16: return "avx512_bf16";
    case AttentionIsa::amx_bf16: return "amx_bf16";
    case AttentionIsa::portable: break;
  }
  return "portable";
}

bool attention_isa_supported(AttentionIsa isa) {
  if (isa == AttentionIsa::portable) return true;
  __builtin_cpu_init();
  // every CPU with AMX has AVX512-BF16; asking for both keeps the ISAs a ladder
  const bool avx512_bf16 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
  return isa == AttentionIsa::amx_bf16 ? avx512_bf16 && amx_bf16_available() : avx512_bf16;
}

AttentionIsa attention_isa_best() {
  static const AttentionIsa best = [] {
    for (AttentionIsa isa : {AttentionIsa::amx_bf16, AttentionIsa::avx512_bf16})
      if (attention_isa_supported(isa)) return isa;
    return AttentionIsa::portable;
  }();
  return best;
}

AttentionIsa attention_isa_choose(const char* want) {
  if (!want || !*want) return attention_isa_best();
  const std::string_view name(want);
  for (AttentionIsa isa : {AttentionIsa::portable, AttentionIsa::avx512_bf16, AttentionIsa::amx_bf16}) {
    if (name != attention_isa_name(isa)) continue;
    STRATA_CHECK(attention_isa_supported(isa), "STRATA_ATTENTION_ISA=", name,
                 " but this CPU (or OS) cannot run it; unset it or pick portable");
    return isa;
  }
  throw Error(ErrorKind::input, str_cat("STRATA_ATTENTION_ISA=", name,
                                        " is not a variant; use portable, avx512_bf16 or amx_bf16"));
}

AttentionIsa attention_isa_active() {
  static const AttentionIsa active = attention_isa_choose(std::getenv("STRATA_ATTENTION_ISA"));
  return active;
}

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const int32_t* doc_start, int64_t b, int64_t t, int64_t h, int64_t hk,
                       int64_t d, float scale, DType dot_type, int64_t window) {
  attention_forward_isa(out, lse, q, k, v, doc_start, b, t, h, hk, d, scale, dot_type,
                        attention_isa_active(), window);
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        const int32_t* doc_start, int64_t b, int64_t t, int64_t h, int64_t hk,
                        int64_t d, float scale, DType dot_type, int64_t window) {
  attention_backward_isa(dq, dk, dv, dout, q, k, v, out, lse, doc_start, b, t, h, hk, d, scale,
                         dot_type, attention_isa_active(), kAttentionStoredDsMaxBytes, window);
}

size_t attention_scratch_bytes(int64_t b, int64_t t, int64_t h, int64_t hk, int64_t d, DType dot_type,
                               AttentionIsa isa, size_t stored_ds_max_bytes) {
  const AttentionShape s = attention_shape(b, t, h, hk, d, dot_type, isa);
  if (!s.dpbf16)  // the transposes kt and vt, the inputs head-major
    return size_t(2 * b * hk * d * attention_cols_stride(s) + 2 * b * t * h * d + 2 * b * t * hk * d) *
           sizeof(float);
  const size_t inputs = size_t(2 * b * t * h * d + 2 * b * t * hk * d) * sizeof(bf16);  // q, dout; k, v
  const size_t ds = attention_stored_ds_bytes(b, t, h, d, dot_type, isa);
  return inputs + (ds <= stored_ds_max_bytes ? ds : 0);
}

size_t attention_scratch_held_bytes() {
  const AttentionScratch& s = attention_scratch();
  size_t bytes = s.ds_words.capacity() * sizeof(uint32_t);
  for (const auto& v : s.inputs) bytes += v.capacity() * sizeof(bf16);
  for (const auto& v : s.inputs_f32) bytes += v.capacity() * sizeof(float);
  return bytes + (s.kt.capacity() + s.vt.capacity()) * sizeof(float);
}

size_t attention_stored_ds_bytes(int64_t b, int64_t t, int64_t h, int64_t d, DType dot_type, AttentionIsa isa) {
  const AttentionShape s = attention_shape(b, t, h, h, d, dot_type, isa);
  return s.dpbf16 ? size_t(s.b * s.h * (s.q_tiles * (s.q_tiles + 1) / 2)) * (kTileQ * kTileK / 2) * sizeof(uint32_t) : 0;
}

}  // namespace strata::cpu
