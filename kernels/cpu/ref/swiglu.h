// Plain-loop twin of cpu::swiglu_forward / swiglu_backward (kernels/cpu/ops.h), templated on
// the element type so it runs in fp64 for checks.
#pragma once
#include <cmath>
#include <cstdint>

namespace strata::ref {

// out (n) = silu(gate) * up, silu(g) = g * sigmoid(g).
template <class T>
void swiglu_forward(T* out, const T* gate, const T* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    T s = T(1) / (T(1) + std::exp(-gate[i]));
    out[i] = gate[i] * s * up[i];
  }
}

// dgate = dout * up * s * (1 + g (1 - s)); dup = dout * silu(g). Both written.
template <class T>
void swiglu_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    T g = gate[i];
    T s = T(1) / (T(1) + std::exp(-g));
    dgate[i] = dout[i] * up[i] * s * (T(1) + g * (T(1) - s));
    dup[i] = dout[i] * g * s;
  }
}

}  // namespace strata::ref
