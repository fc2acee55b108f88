// NF4 dequantization on CUDA (twin: kernels/cpu/ref/nf4.h; bits: kernels/cpu/nf4.cpp): one thread
// per packed byte (two weights), the block's absmax read (or dequantized from the double
// quantization: map[q]·absmax2 + offset, each rounded on its own, __fmul_rn / __fadd_rn so nvcc
// cannot fuse them) and each weight NF4[nibble]·absmax rounded to f32, then to bf16 (ties even).
// Memory access, per warp (32 consecutive bytes = 64 weights = one absmax block): the codes are
// one contiguous 32-byte read; the absmax (or qabsmax and the nested absmax) one address for all
// 32 threads (a broadcast); the dynamic map 256 floats, cached; the two weights of a thread go
// out as one 4-byte (bf16) or 8-byte (f32) store when the output is aligned for it, so a warp
// writes one contiguous 128 (256) bytes: coalesced both ways, about 2.5 bytes moved per weight in
// bf16. Unaligned outputs (never the engine's slots) store each weight on its own.
#include <cstring>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/nf4.h"

namespace strata::cuda {
namespace {

constexpr int kThreads = 256;

// bitsandbytes' NF4 values (kernels/cpu/nf4.cpp's kNf4).
__constant__ float kNf4Code[16] = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
    -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
    0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,
    0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f};

__device__ __forceinline__ void put(__nv_bfloat16* w, float v) { *w = bf16_from(v); }
__device__ __forceinline__ void put(float* w, float v) { *w = bf16_load_rounded(v); }

// T: __nv_bfloat16, or float holding the same bf16 value widened (an f32 base of the same weights).
// kPaired: w is aligned to 2 * sizeof(T), so weights 2j and 2j + 1 go out as one store.
template <class T, bool kPaired>
__global__ void nf4_dequantize_kernel(T* w, const uint8_t* codes, const uint8_t* qabsmax,
                                      const float* absmax, float offset, const float* map, int64_t n) {
  using Word = std::conditional_t<sizeof(T) == 2, uint32_t, uint64_t>;  // two weights
  const int64_t bytes = (n + 1) / 2;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < bytes; j += stride) {
    const int64_t i = 2 * j, b = i / 64;  // both weights of a byte share a block (64 is even)
    float scale = absmax[qabsmax ? b / 256 : b];
    if (qabsmax) scale = __fadd_rn(__fmul_rn(map[qabsmax[b]], scale), offset);
    const uint8_t byte = codes[j];
    const float hi = __fmul_rn(kNf4Code[byte >> 4], scale), lo = __fmul_rn(kNf4Code[byte & 0x0f], scale);
    if (kPaired && i + 1 < n) {
      T pair[2];
      put(&pair[0], hi);
      put(&pair[1], lo);
      Word bits;
      memcpy(&bits, pair, sizeof bits);
      reinterpret_cast<Word*>(w)[j] = bits;
    } else {
      put(w + i, hi);
      if (i + 1 < n) put(w + i + 1, lo);
    }
  }
}

template <class T>
void launch(T* w, const uint8_t* codes, const uint8_t* qabsmax, const float* absmax, float offset, const float* map,
            int64_t n, cudaStream_t stream) {
  const int64_t bytes = (n + 1) / 2;
  auto* k = reinterpret_cast<uintptr_t>(w) % (2 * sizeof(T)) == 0 ? nf4_dequantize_kernel<T, true>
                                                                   : nf4_dequantize_kernel<T, false>;
  STRATA_LAUNCH(k, grid_blocks(bytes, kThreads), kThreads, 0, stream, w, codes, qabsmax, absmax, offset, map, n);
}

}  // namespace

void nf4_dequantize_bf16(bf16* w, const uint8_t* codes, const uint8_t* qabsmax, const float* absmax,
                         float offset, const float* map, int64_t n, cudaStream_t stream) {
  STRATA_CHECK(n >= 0, "nf4_dequantize_bf16: need n >= 0, got n=", n);
  STRATA_CHECK(!qabsmax || map, "nf4_dequantize_bf16: a double-quantized absmax needs the dynamic map");
  if (n == 0) return;
  launch(reinterpret_cast<__nv_bfloat16*>(w), codes, qabsmax, absmax, offset, map, n, stream);
  STRATA_CUDA_CHECK_LAUNCH("nf4_dequantize_bf16");
}

void nf4_dequantize_bf16_as_f32(float* w, const uint8_t* codes, const uint8_t* qabsmax, const float* absmax,
                                float offset, const float* map, int64_t n, cudaStream_t stream) {
  STRATA_CHECK(n >= 0, "nf4_dequantize_bf16_as_f32: need n >= 0, got n=", n);
  STRATA_CHECK(!qabsmax || map, "nf4_dequantize_bf16_as_f32: a double-quantized absmax needs the dynamic map");
  if (n == 0) return;
  launch(w, codes, qabsmax, absmax, offset, map, n, stream);
  STRATA_CUDA_CHECK_LAUNCH("nf4_dequantize_bf16_as_f32");
}

}  // namespace strata::cuda
