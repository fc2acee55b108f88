#include "offload/adamw.h"

#include <cmath>
#include <vector>

namespace strata {

void adamw_update(float* master, float* m, float* v, const float* grad, void* working,
                  DType working_type, int64_t n, const AdamWParams& p) {
  const float b1 = p.beta1, b2 = p.beta2;
  const float bc1 = float(1.0 - std::pow(double(b1), double(p.step)));
  const float bc2_sqrt = float(std::sqrt(1.0 - std::pow(double(b2), double(p.step))));
  const float step_size = p.lr / bc1;
  const float decay = 1.f - p.lr * p.weight_decay;
  const float clip = p.clip_scale, eps = p.eps;
  float* wf = working_type == DType::f32 ? static_cast<float*>(working) : nullptr;
  bf16* wb = working_type == DType::bf16 ? static_cast<bf16*>(working) : nullptr;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float g = grad[i] * clip;
    float mi = b1 * m[i] + (1.f - b1) * g;
    float vi = b2 * v[i] + (1.f - b2) * g * g;
    float denom = std::sqrt(vi) / bc2_sqrt + eps;
    float w = master[i] * decay - step_size * mi / denom;
    m[i] = mi;
    v[i] = vi;
    master[i] = w;
    if (wf) wf[i] = w;
    if (wb) wb[i] = f32_to_bf16(w);
  }
}

void adamw_update_ref(double* master, double* m, double* v, const double* grad, int64_t n,
                      const AdamWParams& p) {
  for (int64_t i = 0; i < n; ++i) {
    double g = grad[i] * p.clip_scale;
    master[i] *= 1.0 - double(p.lr) * p.weight_decay;
    m[i] = p.beta1 * m[i] + (1 - double(p.beta1)) * g;
    v[i] = p.beta2 * v[i] + (1 - double(p.beta2)) * g * g;
    double mhat = m[i] / (1 - std::pow(double(p.beta1), double(p.step)));
    double vhat = v[i] / (1 - std::pow(double(p.beta2), double(p.step)));
    master[i] -= p.lr * mhat / (std::sqrt(vhat) + p.eps);
  }
}

double sum_of_squares(const float* x, int64_t n) {
  constexpr int64_t kChunk = 1 << 14;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(size_t(chunks), 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    double s = 0;
    const int64_t end = std::min(n, (c + 1) * kChunk);
    for (int64_t i = c * kChunk; i < end; ++i) s += double(x[i]) * double(x[i]);
    partial[size_t(c)] = s;
  }
  double total = 0;
  for (double s : partial) total += s;
  return total;
}

}  // namespace strata
