// The CUDA launcher of the NF4 dequantization (semantics in kernels/cpu/nf4.h, kernel in nf4.cu),
// in the CPU kernel's argument order: w (n) = bf16(NF4[code] · absmax[i/64]); with qabsmax
// non-null the absmax are dequantized first from the double quantization (qabsmax (n/64 blocks),
// `absmax` = the nested absmax (blocks/256), offset). `map` is the 256-entry dynamic map in device
// memory (cpu::nf4_dynamic_map() uploaded; unused without qabsmax). Bit-identical to
// cpu::nf4_dequantize_bf16. Checks its sizes (strata::Error), enqueues on `stream`, returns at once.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "src/core/bf16.h"

namespace strata::cuda {

void nf4_dequantize_bf16(bf16* w, const uint8_t* codes, const uint8_t* qabsmax, const float* absmax,
                         float offset, const float* map, int64_t n, cudaStream_t stream);
// The same weights widened to f32 (exact): w (n) = float(bf16(NF4[code] · absmax)), for an f32 base.
void nf4_dequantize_bf16_as_f32(float* w, const uint8_t* codes, const uint8_t* qabsmax, const float* absmax,
                                float offset, const float* map, int64_t n, cudaStream_t stream);

}  // namespace strata::cuda
