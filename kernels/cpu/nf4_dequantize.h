// NF4 dequantization on the host by instruction set: the CPU backend's nf4_dequantize op (through
// kernels/cpu/nf4.h's nf4_dequantize_* entries, which take the active variant) and the variants
// by name for tests and strata-bench nf4. Every variant gives the same bits as the plain loop
// (kernels/cpu/nf4.h's header: w = bf16(NF4[code] · absmax), the product rounded to f32 first):
// per block of 64 the 16 products NF4[k] · scale are made in one vector multiply and rounded to
// bf16 by the same integer round-to-nearest-even as f32_to_bf16 (not vcvtneps2bf16, which
// flushes subnormals), then the codes pick from that 16-entry table in registers:
//   avx512  the 32 code bytes of a block spread to 64 indices in element order (a byte's high
//           nibble first); vpermw (bf16 out, two per block) or vpermps (f32 out, four per block)
//   avx2    8 indices at a time: two vpermps over the table's halves and a blend on index bit 3
//   scalar  two table loads per code byte
// A last partial block (n not a multiple of 64) always takes the scalar loop. Blocks are split
// over the OpenMP threads in chunks (one thread below kNf4SerialBelow weights).
#pragma once
#include <cstdint>

namespace strata::cpu {

enum class Nf4Isa : uint8_t { scalar, avx2, avx512 };  // avx512: F, BW, VL, DQ
// What the weights are written as: bf16; the bf16 value widened to f32 (an f32 slot of the same
// weights); or f32 unrounded (what bitsandbytes gives for an f32 quant state).
enum class Nf4Out : uint8_t { bf16, bf16_as_f32, f32 };

constexpr int64_t kNf4SerialBelow = int64_t(1) << 16;  // weights; a parallel region costs more below

const char* nf4_isa_name(Nf4Isa isa);  // "scalar", "avx2", "avx512"
bool nf4_isa_supported(Nf4Isa isa);    // this CPU can run the variant
// The variant the nf4_dequantize_* entries use: STRATA_NF4_ISA (scalar, avx2 or avx512; an unknown
// or unsupported name is an error naming it) or else the widest this CPU runs. Read once.
Nf4Isa nf4_isa_active();

// w (n, as `out` says) from the codes (ceil(n/2)) and the absmax (nf4_blocks(n)), or with qabsmax
// non-null the double-quantized absmax: qabsmax (nf4_blocks(n)), absmax = the nested absmax
// (nf4_nested_blocks(n)), offset = their mean. Throws when this CPU cannot run `isa`.
void nf4_dequantize_isa(Nf4Isa isa, Nf4Out out, void* w, const uint8_t* codes, const uint8_t* qabsmax,
                        const float* absmax, float offset, int64_t n);

}  // namespace strata::cpu
