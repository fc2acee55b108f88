// Plain-loop twin of the NF4 dequantization (kernels/cpu/nf4.h, kernels/cuda/nf4.cu): one element
// at a time, templated on the output type so it also runs in fp64 (the value NF4[code]·absmax
// before any rounding to the output). It takes the absmax already dequantized
// (cpu::nf4_absmax_dequantize): the double quantization's bits are held to bitsandbytes' by the
// goldens (tests/kernels/test_nf4.cpp), not by this twin.
#pragma once
#include <cstdint>

namespace strata::ref {

// w (n) = code[nibble i] · absmax[i/64], nibble i = the high nibble of codes[i/2] when i is even,
// the low one when odd.
template <class T>
void nf4_dequantize(T* w, const uint8_t* codes, const float* absmax, const float* code, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t byte = codes[i / 2];
    const int nibble = (i % 2 == 0) ? (byte >> 4) : (byte & 0x0f);
    w[i] = T(code[nibble]) * T(absmax[i / 64]);
  }
}

}  // namespace strata::ref
