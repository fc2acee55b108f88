// Quantizing an NF4 base at load is threaded (issue 40, part 3): the bf16 <-> f32 conversions of
// src/core/dtype.cpp, the blocks of kernels/cpu/nf4.cpp and a packed row of
// offload/state/nf4_layout.h give the same bytes at 1, 2, 3 and 4 threads (the double
// quantization's mean follows torch's thread count, BaseQuant::torch_threads, never ours).
#include <catch2/catch.hpp>
#include <omp.h>

#include <cstring>
#include <vector>

#include "kernels/cpu/nf4.h"
#include "offload/state/nf4_layout.h"
#include "src/core/dtype.h"
#include "src/core/threads.h"
#include "tests/testing.h"

namespace strata {
namespace {

// Everything a load computes from x (n), as bytes: the bf16 rounding and its widening back, the
// codes and absmax, the double quantization, the dequantized weights (bf16, f32, widened bf16)
// and a packed row of each layout.
std::vector<std::vector<uint8_t>> nf4_outputs(const std::vector<float>& x) {
  const int64_t n = int64_t(x.size()), blocks = cpu::nf4_blocks(n);
  std::vector<std::vector<uint8_t>> out;
  auto keep = [&](const void* p, size_t bytes) {
    const auto* b = static_cast<const uint8_t*>(p);
    out.emplace_back(b, b + bytes);
  };
  std::vector<bf16> w(x.size());
  std::vector<float> wide(x.size());
  dtype_convert(w.data(), DType::bf16, x.data(), DType::f32, x.size());
  dtype_convert(wide.data(), DType::f32, w.data(), DType::bf16, x.size());
  keep(w.data(), w.size() * 2);
  keep(wide.data(), wide.size() * 4);
  std::vector<uint8_t> codes(size_t(cpu::nf4_code_bytes(n))), q(static_cast<size_t>(blocks));
  std::vector<float> absmax(static_cast<size_t>(blocks)), absmax2(size_t(cpu::nf4_nested_blocks(n)));
  float offset = 0;
  cpu::nf4_quantize(codes.data(), absmax.data(), w.data(), n);
  cpu::nf4_double_quantize(q.data(), absmax2.data(), &offset, absmax.data(), blocks, 1);
  keep(codes.data(), codes.size());
  keep(absmax.data(), absmax.size() * 4);
  keep(q.data(), q.size());
  keep(absmax2.data(), absmax2.size() * 4);
  keep(&offset, 4);
  std::vector<bf16> deq(x.size());
  std::vector<float> deq_f(x.size()), deq_wide(x.size());
  cpu::nf4_dequantize_bf16(deq.data(), codes.data(), q.data(), absmax2.data(), offset, n);
  cpu::nf4_dequantize_f32(deq_f.data(), codes.data(), nullptr, absmax.data(), 0.f, n);
  cpu::nf4_dequantize_bf16_as_f32(deq_wide.data(), codes.data(), q.data(), absmax2.data(), offset, n);
  keep(deq.data(), deq.size() * 2);
  keep(deq_f.data(), deq_f.size() * 4);
  keep(deq_wide.data(), deq_wide.size() * 4);
  for (bool dq : {true, false}) {
    std::vector<char> row(Nf4RowLayout::of(n, dq).bytes);
    BaseQuant bq;
    bq.nf4 = true;
    bq.double_quant = dq;
    nf4_pack_row(row.data(), x.data(), n, bq);
    keep(row.data(), row.size());
  }
  return out;
}

}  // namespace

TEST_CASE("NF4 quantization at load gives the same bytes at any thread count", "[nf4][qlora]") {
  // 2^20 + 17 weights: over the conversions' parallel threshold, a last partial block of 17; a zero
  // block, outliers and exact midpoints of the NF4 table among them
  for (int64_t n : {int64_t(70001), (int64_t(1) << 20) + 17}) {
    INFO("n " << n);
    std::vector<float> x = testing::random_floats(size_t(n), uint64_t(n) * 3 + 1, -0.2f, 0.2f);
    std::fill(x.begin() + 640, x.begin() + 704, 0.f);
    x[5000] = 30.f;
    x[n - 3] = -1e30f;
    for (int i = 0; i < 15; ++i) x[size_t(7000 + i)] = (cpu::nf4_code()[i] + cpu::nf4_code()[i + 1]) / 2.0f;
    x[7063] = 1.f;  // the midpoints' block has absmax 1, so they are quantized as they are
    omp_set_num_threads(1);
    const auto one = nf4_outputs(x);
    for (int threads : {2, 3, 4}) {
      INFO("threads " << threads);
      omp_set_num_threads(threads);
      const auto got = nf4_outputs(x);
      REQUIRE(got.size() == one.size());
      for (size_t i = 0; i < got.size(); ++i) {
        INFO("output " << i);
        CHECK(got[i] == one[i]);
      }
    }
    cpu_threads_apply();
  }
}

}  // namespace strata
