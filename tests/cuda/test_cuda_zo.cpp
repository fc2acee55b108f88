// The zeroth-order perturbation on the CUDA backend (kernels/cuda/zo.cu) against the CPU kernels
// (kernels/cpu/zo.h, equal bit for bit to their plain-loop twins, tests/kernels/test_zo.cpp):
// z, and p += scale z for f32 and bf16 device tensors, the same bits for many (seed, tensor,
// offset), offsets past 2^32 and 2^62 elements, sizes 1, 15, 17, 4097 and a larger one. Through
// the Device interface, as the engine calls them.
#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "kernels/cpu/ref/zo.h"
#include "kernels/cpu/zo.h"
#include "tests/cuda/cuda_testing.h"
#include "tests/kernels/zo_cases.h"
#include "tests/testing.h"

namespace strata {
namespace {

template <class T>
int64_t first_difference(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return int64_t(i);
  return -1;
}

using zo_testing::kWheres;
using zo_testing::Where;

}  // namespace

TEST_CASE("cuda zo: z and the perturbation equal the CPU's bits", "[cuda][zo]") {
  auto dev = cuda_testing::test_device();
  if (!dev) return;
  for (const Where& w : kWheres) {
    for (int64_t n : {int64_t(1), int64_t(15), int64_t(17), int64_t(4097)}) {
      INFO("seed " << w.seed << " tensor " << w.tensor << " offset " << w.offset << " n " << n);
      std::vector<float> z_cpu(static_cast<size_t>(n));
      cpu::zo_generate(z_cpu.data(), w.seed, w.tensor, w.offset, n);
      Buffer<float> z(*dev, size_t(n), "zo z");
      dev->zo_generate(z, w.seed, w.tensor, w.offset, n, Stream::compute);
      CHECK(first_difference(z.download(), z_cpu) == -1);

      const std::vector<float> p0 = random_floats(size_t(n), w.offset ^ 77, -2.f, 2.f);
      std::vector<float> p_cpu = p0;
      cpu::zo_perturb_f32(p_cpu.data(), w.seed, w.tensor, w.offset, 1e-3f, n);
      Buffer<float> p(*dev, p0, "zo p");
      dev->zo_perturb(p, DType::f32, w.seed, w.tensor, w.offset, 1e-3f, n, Stream::compute);
      CHECK(first_difference(p.download(), p_cpu) == -1);

      const std::vector<bf16> b0 = testing::to_bf16(p0);
      std::vector<bf16> b_cpu = b0;
      cpu::zo_perturb_bf16(b_cpu.data(), w.seed, w.tensor, w.offset, -0.03f, n);
      Buffer<bf16> b(*dev, b0, "zo p bf16");
      dev->zo_perturb(b, DType::bf16, w.seed, w.tensor, w.offset, -0.03f, n, Stream::compute);
      CHECK(first_difference(b.download(), b_cpu) == -1);
    }
  }
}

TEST_CASE("cuda zo: a large tensor in pieces, +eps then -eps, as the dual forward applies it",
          "[cuda][zo]") {
  auto dev = cuda_testing::test_device();
  if (!dev) return;
  const int64_t n = 70001;
  const uint64_t seed = 0xABCDEF, offset = 5;
  const uint32_t tensor = 9;
  const std::vector<float> p0 = random_floats(size_t(n), 4, -1.f, 1.f);
  std::vector<float> want = p0;
  ref::zo_perturb_f32(want.data(), seed, tensor, offset, 1e-3f, n);
  Buffer<float> p(*dev, p0, "zo p");
  // Two pieces on the device (a layer's tensor split at an odd element) equal one CPU call.
  const int64_t cut = 33333;
  dev->zo_perturb(p, DType::f32, seed, tensor, offset, 1e-3f, cut, Stream::compute);
  dev->zo_perturb(p.get() + cut, DType::f32, seed, tensor, offset + uint64_t(cut), 1e-3f, n - cut,
                  Stream::compute);
  const std::vector<float> plus = p.download();
  CHECK(first_difference(plus, want) == -1);
  // Then -2 eps and +eps, the MeZO sequence, against the CPU doing the same.
  std::vector<float> cpu_p = plus;
  cpu::zo_perturb_f32(cpu_p.data(), seed, tensor, offset, -2e-3f, n);
  cpu::zo_perturb_f32(cpu_p.data(), seed, tensor, offset, 1e-3f, n);
  dev->zo_perturb(p, DType::f32, seed, tensor, offset, -2e-3f, n, Stream::compute);
  dev->zo_perturb(p, DType::f32, seed, tensor, offset, 1e-3f, n, Stream::compute);
  CHECK(first_difference(p.download(), cpu_p) == -1);
}

TEST_CASE("cuda zo rejects a negative size", "[cuda][zo]") {
  auto dev = cuda_testing::test_device();
  if (!dev) return;
  Buffer<float> z(*dev, 4, "zo z");
  CHECK_THROWS_WITH(dev->zo_generate(z, 1, 0, 0, -1, Stream::compute),
                    Catch::Contains("need n >= 0"));
  CHECK_THROWS_WITH(dev->zo_perturb(z, DType::f32, 1, 0, ~0ull - 2, 0.1f, 4, Stream::compute),
                    Catch::Contains("overflows"));
}

}  // namespace strata
