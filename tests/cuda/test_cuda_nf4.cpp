// NF4 dequantization on the CUDA backend (kernels/cuda/nf4.cu) against the CPU kernel
// (kernels/cpu/nf4.h, itself bitsandbytes' bits, tests/kernels/test_nf4.cpp): the same bf16 bits
// for awkward sizes (1, 15, 17, 64, 129, 4097, 70001: a pad nibble, partial blocks, more than 256
// blocks so the nested absmax index moves), with the absmax plain and double-quantized, and for
// a block of zeros and large outliers.
#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "kernels/cpu/nf4.h"
#include "kernels/cuda/nf4.h"
#include "tests/cuda/cuda_testing.h"
#include "tests/testing.h"

namespace strata {

TEST_CASE("cuda nf4 dequantization equals the CPU kernel's bits", "[cuda][nf4]") {
  auto dev = cuda_testing::test_device();
  if (!dev) return;
  std::vector<float> map(cpu::nf4_dynamic_map(), cpu::nf4_dynamic_map() + 256);
  cuda_testing::Buffer<float> d_map(*dev, map, "nf4 map");
  for (int64_t n : {int64_t(1), int64_t(15), int64_t(17), int64_t(64), int64_t(129), int64_t(4097), int64_t(70001)}) {
    std::vector<float> x = random_floats(size_t(n), uint64_t(n) * 5 + 3, -2.f, 2.f);
    for (int64_t i = 0; i < std::min<int64_t>(n, 64); ++i) x[size_t(i)] = 0.f;  // a zero block
    if (n > 100) x[100] = 3.0e4f, x[size_t(n) - 1] = -1.0e3f;                    // outliers
    const int64_t blocks = cpu::nf4_blocks(n);
    std::vector<uint8_t> codes(size_t(cpu::nf4_code_bytes(n))), qabsmax(static_cast<size_t>(blocks));
    std::vector<float> absmax(static_cast<size_t>(blocks)), absmax2(size_t(cpu::nf4_nested_blocks(n)));
    float offset = 0;
    cpu::nf4_quantize(codes.data(), absmax.data(), x.data(), n);
    cpu::nf4_double_quantize(qabsmax.data(), absmax2.data(), &offset, absmax.data(), blocks, 1);
    for (bool nested : {false, true}) {
      INFO("n " << n << " double quantization " << nested);
      std::vector<bf16> want(static_cast<size_t>(n));
      cpu::nf4_dequantize_bf16(want.data(), codes.data(), nested ? qabsmax.data() : nullptr,
                               nested ? absmax2.data() : absmax.data(), offset, n);
      cuda_testing::Buffer<uint8_t> d_codes(*dev, codes, "nf4 codes"), d_q(*dev, qabsmax, "nf4 qabsmax");
      cuda_testing::Buffer<float> d_absmax(*dev, nested ? absmax2 : absmax, "nf4 absmax");
      cuda_testing::Buffer<bf16> d_w(*dev, size_t(n), "nf4 weights");
      cuda::nf4_dequantize_bf16(d_w, d_codes, nested ? d_q.get() : nullptr, d_absmax, offset, d_map,
                                n, nullptr);
      const std::vector<bf16> got = d_w.download();
      CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(bf16)) == 0);
    }
  }
}

}  // namespace strata
