// The CUDA launcher of the cached attention (generation; semantics in
// kernels/cpu/attention_cached.h, kernel in attention_cached.cu). Declared beside kernels/cuda/ops.h
// in the same argument order: q (B,Tq,H,D), k_cache and v_cache (B,Tcap,Hk,D), start (B) device
// ints; d <= 256; window > 0: a sliding window (the query at position p sees p - window + 1 .. p);
// bf16_dots: q, k, v rounded to bf16 as read. Checks its sizes (strata::Error), enqueues on `stream` and returns at once.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace strata::cuda {

void attention_cached_forward(float* out, const float* q, const float* k_cache, const float* v_cache,
                              const int32_t* start, int64_t b, int64_t tq, int64_t tcap, int64_t h, int64_t hk,
                              int64_t d, float scale, bool bf16_dots, int64_t window, cudaStream_t stream);

}  // namespace strata::cuda
