// Plain-loop twin of cpu::geglu_forward / geglu_backward and cpu::affine (kernels/cpu/ops.h),
// templated on the element type so it runs in fp64 for checks. GeGLU is Gemma's MLP gate:
// PyTorch's gelu(approximate="tanh") ("gelu_pytorch_tanh" in transformers) of the gate, times up.
#pragma once
#include <cmath>
#include <cstdint>

namespace strata::ref {

// gelu_tanh(x) = x/2 (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3); and its derivative.
template <class T>
T gelu_tanh(T x) {
  const T c = std::sqrt(T(2) / T(3.14159265358979323846));
  return T(0.5) * x * (T(1) + std::tanh(c * (x + T(0.044715) * x * x * x)));
}
template <class T>
T gelu_tanh_grad(T x) {
  const T c = std::sqrt(T(2) / T(3.14159265358979323846));
  const T th = std::tanh(c * (x + T(0.044715) * x * x * x));
  return T(0.5) * (T(1) + th) + T(0.5) * x * (T(1) - th * th) * c * (T(1) + T(3) * T(0.044715) * x * x);
}

// out (n) = gelu_tanh(gate) * up.
template <class T>
void geglu_forward(T* out, const T* gate, const T* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = gelu_tanh(gate[i]) * up[i];
}

// dgate = dout * up * gelu_tanh'(gate); dup = dout * gelu_tanh(gate). Both written.
template <class T>
void geglu_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    dgate[i] = dout[i] * up[i] * gelu_tanh_grad(gate[i]);
    dup[i] = dout[i] * gelu_tanh(gate[i]);
  }
}

// y (n) = a x + b.
template <class T>
void affine(T* y, const T* x, T a, T b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = a * x[i] + b;
}

}  // namespace strata::ref
