// The optional GPU AdamW (kernels/cuda/adamw.cu) against the CPU AdamW (offload/state/adamw.h, its
// scalar variant, which all CPU variants equal bit for bit): the same master weights, moments
// and working copy to the bit, over several steps, at awkward sizes, with f32 and bf16 moments
// and f32, bf16 or no working copy. Launched directly on a stream of the test's own (the op is
// not part of the Device interface: the engine keeps AdamW on the CPU).
#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "kernels/cuda/ops.h"
#include "offload/state/adamw.h"
#include "tests/cuda/cuda_testing.h"
#include "tests/testing.h"

namespace strata {
namespace {

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Index of the first element whose bits differ (for the failure message), or -1.
template <class T>
int64_t first_difference(const std::vector<T>& a, const std::vector<T>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return int64_t(i);
  return -1;
}

// One configuration: moments f32 or bf16 (M = float or bf16), working f32 / bf16 / none.
template <class M>
void check_adamw_matches_cpu(Device& dev, cudaStream_t stream, int64_t n, DType working_type,
                             bool with_working) {
  const DType moment_type = sizeof(M) == 4 ? DType::f32 : DType::bf16;
  INFO("n=" << n << " moments " << dtype_name(moment_type) << " working "
            << (with_working ? dtype_name(working_type) : "none"));
  // Moments as a few steps of training leave them: m signed, v >= 0 and some exactly 0.
  std::vector<float> master = random_floats(size_t(n), 71, -2.f, 2.f);
  std::vector<float> m32 = random_floats(size_t(n), 72, -0.1f, 0.1f);
  std::vector<float> v32 = random_floats(size_t(n), 73, 0.f, 0.01f);
  for (int64_t i = 0; i < n; i += 7) v32[size_t(i)] = 0.f;
  std::vector<M> m(static_cast<size_t>(n)), v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (sizeof(M) == 4) {
      m[size_t(i)] = m32[size_t(i)];
      v[size_t(i)] = v32[size_t(i)];
    } else {
      m[size_t(i)] = f32_to_bf16(m32[size_t(i)]);
      v[size_t(i)] = f32_to_bf16(v32[size_t(i)]);
    }
  }
  const size_t working_bytes = size_t(n) * dtype_size(working_type);

  Buffer<float> d_master(dev, master, "adamw master");
  Buffer<M> d_m(dev, m, "adamw m"), d_v(dev, v, "adamw v");
  Buffer<float> d_grad(dev, size_t(n), "adamw grad");
  Buffer<char> d_working(dev, std::max<size_t>(working_bytes, 1), "adamw working");
  std::vector<char> cpu_working(working_bytes), gpu_working(working_bytes);

  for (int64_t step = 1; step <= 3; ++step) {
    INFO("step " << step);
    // Gradients with a wide range and a few exact zeros; clipping, decay and bias correction on.
    std::vector<float> grad = random_floats(size_t(n), 80 + uint64_t(step), -3.f, 3.f);
    for (int64_t i = 3; i < n; i += 11) grad[size_t(i)] = 0.f;
    const AdamWParams p{
        .lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .step = step, .clip_scale = 0.37};

    adamw_update_isa(AdamWIsa::scalar, master.data(), m.data(), v.data(), moment_type, grad.data(),
                     with_working ? cpu_working.data() : nullptr, working_type, n, p);

    d_grad.upload(grad);
    const AdamWConstants c = adamw_constants(p.lr, p.beta1, p.beta2, p.eps,
                                                         p.weight_decay, p.step, p.clip_scale);
    cuda::adamw_update(d_master, d_m, d_v, moment_type == DType::bf16, d_grad,
                       with_working ? static_cast<void*>(d_working.get()) : nullptr,
                       working_type == DType::bf16, n, c, stream);
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);

    const std::vector<float> got_master = d_master.download();
    const std::vector<M> got_m = d_m.download(), got_v = d_v.download();
    INFO("first differing element: master " << first_difference(got_master, master) << ", m "
         << first_difference(got_m, m) << ", v " << first_difference(got_v, v));
    CHECK(same_bits(got_master, master));
    CHECK(same_bits(got_m, m));
    CHECK(same_bits(got_v, v));
    if (with_working) {
      std::vector<char> all = d_working.download();
      gpu_working.assign(all.begin(), all.begin() + std::ptrdiff_t(working_bytes));
      CHECK(same_bits(gpu_working, cpu_working));
    }
  }
}

TEST_CASE("cuda adamw gives the CPU AdamW's bits: f32 and bf16 moments, f32 and bf16 working copies", "[cuda-emu]") {
  auto dev = cuda_testing::test_device();
  if (!dev) return;
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  for (int64_t n : {int64_t(1), int64_t(17), int64_t(4097), int64_t(70001)}) {
    check_adamw_matches_cpu<float>(*dev, stream, n, DType::bf16, true);
    check_adamw_matches_cpu<float>(*dev, stream, n, DType::f32, true);
    check_adamw_matches_cpu<float>(*dev, stream, n, DType::f32, false);
    check_adamw_matches_cpu<bf16>(*dev, stream, n, DType::bf16, true);
  }
  cudaStreamDestroy(stream);
}

TEST_CASE("cuda adamw rejects a step before the first and negative sizes", "[cuda-emu]") {
  CHECK_THROWS_WITH(adamw_constants(1e-3, 0.9, 0.999, 1e-8, 0.0, 0, 1.0),
                    Catch::Contains("steps count from 1"));
  auto dev = cuda_testing::test_device();
  if (!dev) return;
  Buffer<float> x(*dev, 4);
  const AdamWConstants c = adamw_constants(1e-3, 0.9, 0.999, 1e-8, 0.0, 1, 1.0);
  CHECK_THROWS_WITH(cuda::adamw_update(x, x, x, false, x, nullptr, false, -1, c, nullptr),
                    Catch::Contains("n >= 0"));  // checked before anything is queued
}

}  // namespace
}  // namespace strata
