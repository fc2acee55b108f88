// Attention of new queries against a KV cache, for generation (offload/engine/generator.h): the decode
// step's one query per row, or any block of queries that continues a row. Causal by position:
// query i of row b sits at position start[b] + i and sees cache positions [0, start[b] + i]
// (the caller has written its own key and value there first), or with a sliding window
// (window > 0) only the last `window` of them, [start[b] + i - window + 1, start[b] + i], as the
// training kernel's window (ops.h: attention_forward). Head h reads kv head h / (H/Hk).
//   out (B,Tq,H,D); q (B,Tq,H,D); k_cache, v_cache (B,Tcap,Hk,D); start (B).
// dot_type bf16 (as the training kernel's, ops.h: attention_forward): q, k and v are rounded to
// bf16 as they are read, products of the rounded values summed in f32 (so decode rounds as the
// bf16 prefill does); f32: read as they are.
// Twin: kernels/cpu/ref/attention_cached.h (on inputs rounded by the caller for bf16). Forward
// only: generation has no backward.
#pragma once
#include <cstdint>

#include "src/core/dtype.h"

namespace strata::cpu {

void attention_cached_forward(float* out, const float* q, const float* k_cache, const float* v_cache,
                              const int32_t* start, int64_t b, int64_t tq, int64_t tcap, int64_t h, int64_t hk,
                              int64_t d, float scale, DType dot_type, int64_t window = 0);

}  // namespace strata::cpu
