// The CUDA launchers of Gemma's elementwise ops (kernels in geglu.cu; twins in
// kernels/cpu/ref/geglu.h, semantics in kernels/cpu/ops.h), in kernels/cuda/ops.h's argument
// order: GeGLU out = gelu_tanh(gate) * up and its backward, and y = a x + b. Check their sizes
// (strata::Error), enqueue on `stream` and return at once.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace strata::cuda {

void geglu_forward(float* out, const float* gate, const float* up, int64_t n, cudaStream_t stream);
void geglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n,
                    cudaStream_t stream);
void affine(float* y, const float* x, float a, float b, int64_t n, cudaStream_t stream);

}  // namespace strata::cuda
