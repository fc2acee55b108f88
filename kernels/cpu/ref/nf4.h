// Plain-loop twin of the NF4 dequantization (kernels/cpu/nf4.h, kernels/cuda/nf4.cu): one element
// at a time, the nested absmax recomputed per element, templated on the output type so it also
// runs in fp64 (the value NF4[code]·absmax before any rounding to the output).
#pragma once
#include <cstdint>

namespace strata::ref {

// w (n) = code[nibble i] · absmax_i, nibble i = high nibble of codes[i/2] when i is even, low when
// odd; absmax_i = absmax[i/64], or, with qabsmax, map[qabsmax[i/64]]·absmax[i/64/256] + offset
// (each rounded to f32, as bitsandbytes stores them).
template <class T>
void nf4_dequantize(T* w, const uint8_t* codes, const uint8_t* qabsmax, const float* absmax,
                    float offset, const float* code, const float* map, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t byte = codes[i / 2];
    const int nibble = (i % 2 == 0) ? (byte >> 4) : (byte & 0x0f);
    const int64_t b = i / 64;
    float scale = absmax[b];
    if (qabsmax) {
      const float scaled = map[qabsmax[b]] * absmax[b / 256];
      scale = scaled + offset;
    }
    w[i] = T(code[nibble]) * T(scale);
  }
}

}  // namespace strata::ref
