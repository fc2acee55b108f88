// LoRA dropout on the CUDA backend (kernels/cuda/dropout.cu) against the CPU kernel (kernels/cpu/dropout.h,
// equal to its plain-loop twin, tests/kernels/test_dropout.cpp): the same bits for several keys,
// probabilities and sizes (1, 15, 17, 4097, 70001), written and accumulated, through the Device
// interface as the decoder layer calls it.
#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "kernels/cpu/dropout.h"
#include "tests/cuda/cuda_testing.h"
#include "tests/testing.h"

namespace strata {

TEST_CASE("cuda dropout: the mask and the values equal the CPU's bits", "[cuda][dropout]") {
  auto dev = cuda_testing::test_device();
  if (!dev) return;
  struct Key {
    uint64_t seed;
    uint32_t tensor;
    double p;
  };
  for (const Key k : {Key{1, 0, 0.1}, Key{0xFEDCBA9876543210ull, 13, 0.5}, Key{77, 6, 0.0}, Key{5, 1u << 20, 0.95}}) {
    for (int64_t n : {int64_t(1), int64_t(15), int64_t(17), int64_t(4097), int64_t(70001)}) {
      for (bool accumulate : {false, true}) {
        INFO("seed " << k.seed << " tensor " << k.tensor << " p " << k.p << " n " << n << " accumulate " << accumulate);
        const std::vector<float> in = random_floats(size_t(n), uint64_t(n) * 3 + 1, -2.f, 2.f);
        const std::vector<float> out0 = random_floats(size_t(n), uint64_t(n) * 3 + 2, -1.f, 1.f);
        std::vector<float> want = out0;
        cpu::dropout_apply(want.data(), in.data(), k.seed, k.tensor, k.p, n, accumulate);
        Buffer<float> d_in(*dev, in, "dropout in"), d_out(*dev, out0, "dropout out");
        dev->dropout_apply(d_out, d_in, k.seed, k.tensor, k.p, n, accumulate, Stream::compute);
        const std::vector<float> got = d_out.download();
        CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0);
      }
    }
  }
}

}  // namespace strata
