// NF4: bitsandbytes' 4-bit NormalFloat quantization of a frozen base (issue 40, DESIGN §11), on
// the host, bit for bit as bitsandbytes 0.50 computes it on the CPU (the goldens of
// tools/golden/make_nf4_goldens.py hold it to that):
//   codes    blocks of 64 elements; absmax = max |x| of the block; each x·(1/absmax) (the last,
//            partial block: x / absmax, its absmax clamped to 1e-38) is clamped to [-1, 1] and
//            given the index of the nearest NF4 value (a tie goes to the lower index); two codes
//            per byte, the first element in the high nibble; an odd count pads one code (7, 0.0).
//   double   (lora.double_quant) the absmax minus their mean (torch's float32 sum, see
//   quant    nf4_torch_sum) quantized to 8 bits in blocks of 256 against the dynamic map
//            (bitsandbytes' 65536-entry lookup table, nf4_blockwise8_quantize); the dequantized
//            absmax is map[q]·absmax2 + mean, each operation rounded to f32.
//   dequant  w = bf16(NF4[code] · absmax), the product rounded to f32 then to bf16 (ties even).
// Raw pointers and sizes only. The plain-loop twin of the dequantization (the device op) is
// kernels/cpu/ref/nf4.h; the CUDA kernel is kernels/cuda/nf4.cu.
#pragma once
#include <cstdint>

#include "src/core/bf16.h"

namespace strata::cpu {

constexpr int64_t kNf4Block = 64;         // elements per absmax
constexpr int64_t kNf4NestedBlock = 256;  // absmax per nested absmax (double quantization)

// The 16 NF4 values (bitsandbytes' get_4bit_type("nf4")), ascending, -1 .. 1.
const float* nf4_code();
// bitsandbytes' create_dynamic_map() (signed, 7 exponent bits): 256 ascending values, -0.993 .. 1.
const float* nf4_dynamic_map();

inline int64_t nf4_blocks(int64_t n) { return (n + kNf4Block - 1) / kNf4Block; }
inline int64_t nf4_nested_blocks(int64_t n) {
  return (nf4_blocks(n) + kNf4NestedBlock - 1) / kNf4NestedBlock;
}
inline int64_t nf4_code_bytes(int64_t n) { return (n + 1) / 2; }
// The bytes of one tensor's NF4 state, what the host keeps and the link would carry: the codes
// and the f32 absmax, or with double quantization the codes, the 8-bit absmax, the f32 nested
// absmax and the f32 mean.
inline int64_t nf4_state_bytes(int64_t n, bool double_quant) {
  return double_quant ? nf4_code_bytes(n) + nf4_blocks(n) + 4 * nf4_nested_blocks(n) + 4
                      : nf4_code_bytes(n) + 4 * nf4_blocks(n);
}

// codes (ceil(n/2)), absmax (nf4_blocks(n)) from x (n), f32 or bf16. A NaN or an infinity in x
// throws strata::Error naming its block (bitsandbytes would quietly give NaN scales).
void nf4_quantize(uint8_t* codes, float* absmax, const float* x, int64_t n);
void nf4_quantize(uint8_t* codes, float* absmax, const bf16* x, int64_t n);

// torch.sum of a contiguous float32 tensor on the CPU, bit for bit: the cascade of
// aten/src/ATen/native/cpu/SumKernel.cpp (8-wide vectors, 4 accumulators, 4 levels), and above
// 32768 elements at::parallel_for's split into `torch_threads` chunks summed in order. The mean
// bitsandbytes subtracts is this sum / n in f32, so it depends on torch's thread count there.
float nf4_torch_sum(const float* x, int64_t n, int torch_threads);

// bitsandbytes' quantize_blockwise on the CPU (blocks of `block`, the 256-entry dynamic map):
// q (n), absmax2 (ceil(n/block)). A block whose absmax is 0 gets codes 0.
void nf4_blockwise8_quantize(uint8_t* q, float* absmax2, const float* v, int64_t n, int64_t block);

// Double quantization of `blocks` absmax: qabsmax (blocks), absmax2 (ceil(blocks/256)), *offset.
void nf4_double_quantize(uint8_t* qabsmax, float* absmax2, float* offset, const float* absmax,
                         int64_t blocks, int torch_threads);
// absmax (blocks) = map[qabsmax]·absmax2[b/256] + offset (two f32 roundings).
void nf4_absmax_dequantize(float* absmax, const uint8_t* qabsmax, const float* absmax2,
                           float offset, int64_t blocks);

// The device op's CPU body: w (n) = bf16(NF4[code] · absmax[i/64]); with qabsmax non-null the
// absmax are first dequantized from (qabsmax, absmax2 = `absmax`, offset) as above.
void nf4_dequantize_bf16(bf16* w, const uint8_t* codes, const uint8_t* qabsmax,
                         const float* absmax, float offset, int64_t n);
// The bf16 weights widened to f32 (exact): an f32 base of the same weights (the device op's f32 slot).
void nf4_dequantize_bf16_as_f32(float* w, const uint8_t* codes, const uint8_t* qabsmax,
                                const float* absmax, float offset, int64_t n);
// The same into f32 (no bf16 rounding): what bitsandbytes gives for an f32 quant state.
void nf4_dequantize_f32(float* w, const uint8_t* codes, const uint8_t* qabsmax,
                        const float* absmax, float offset, int64_t n);

}  // namespace strata::cpu
