// NF4 (issue 40): strata's quantization against bitsandbytes 0.50's, bit for bit
// (tests/golden/nf4/nf4_cases.json from tools/golden/make_nf4_goldens.py): codes, absmax, the
// double quantization (mean, 8-bit codes, nested absmax, dequantized absmax) and the dequantized
// weights in bf16 and f32, by every instruction-set variant this CPU runs; the fast dequantization
// against its plain-loop twin in fp64 and against a plain loop of its own arithmetic bit for bit.
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "io/json.h"
#include "kernels/cpu/nf4.h"
#include "kernels/cpu/nf4_dequantize.h"
#include "kernels/cpu/ref/nf4.h"
#include "tests/testing.h"

namespace {

using strata::bf16;
namespace cpu = strata::cpu;

nlohmann::json golden() {
  std::ifstream in(strata::testing::source_path("tests/golden/nf4/nf4_cases.json"));
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

std::vector<uint8_t> hex_bytes(const std::string& s) {
  std::vector<uint8_t> out(s.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) out[i] = uint8_t(std::stoul(s.substr(2 * i, 2), nullptr, 16));
  return out;
}

std::vector<uint32_t> f32_bits(const nlohmann::json& a) {
  std::vector<uint32_t> out;
  for (const auto& h : a) out.push_back(uint32_t(std::stoul(h.get<std::string>(), nullptr, 16)));
  return out;
}

std::vector<uint16_t> bf16_bits(const std::string& s) {
  std::vector<uint16_t> out(s.size() / 4);
  for (size_t i = 0; i < out.size(); ++i) out[i] = uint16_t(std::stoul(s.substr(4 * i, 4), nullptr, 16));
  return out;
}

template <class T>
std::vector<uint32_t> bits_of(const std::vector<T>& v) {
  std::vector<uint32_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if constexpr (std::is_same_v<T, float>)
      std::memcpy(&out[i], &v[i], 4);
    else
      out[i] = v[i].bits;
  }
  return out;
}

std::vector<uint32_t> widen(const std::vector<uint16_t>& v) { return {v.begin(), v.end()}; }

uint64_t fnv1a64(const void* p, size_t n) {
  uint64_t h = 0xCBF29CE484222325ull;
  const auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001B3ull;
  return h;
}

std::string hex64(uint64_t h) {
  char s[17];
  std::snprintf(s, sizeof s, "%016llx", static_cast<unsigned long long>(h));
  return s;
}

// The same bits as make_nf4_goldens.py's hash_input.
std::vector<bf16> hash_input(int64_t n) {
  std::vector<bf16> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t h = (uint64_t(i) * 2654435761ull) & 0xFFFFFFFFull;
    const uint64_t sign = (h >> 20) & 1, exp = 110 + ((h >> 28) & 7) + (uint64_t(i) / 64) % 13,
                   mant = (h >> 21) & 127;
    x[size_t(i)] = bf16{uint16_t((sign << 15) | (exp << 7) | mant)};
  }
  return x;
}

std::vector<cpu::Nf4Isa> supported_isas() {
  std::vector<cpu::Nf4Isa> out;
  for (cpu::Nf4Isa isa : {cpu::Nf4Isa::scalar, cpu::Nf4Isa::avx2, cpu::Nf4Isa::avx512})
    if (cpu::nf4_isa_supported(isa)) out.push_back(isa);
  return out;
}

struct Quantized {
  std::vector<uint8_t> codes;
  std::vector<float> absmax;
};

Quantized quantize_case(const nlohmann::json& c, int64_t n) {
  Quantized q{std::vector<uint8_t>(size_t(cpu::nf4_code_bytes(n))),
              std::vector<float>(size_t(cpu::nf4_blocks(n)))};
  if (c["input_dtype"] == "bf16") {
    auto bits = bf16_bits(c["input"].get<std::string>());
    REQUIRE(int64_t(bits.size()) == n);
    std::vector<bf16> x(bits.size());
    for (size_t i = 0; i < bits.size(); ++i) x[i] = bf16{bits[i]};
    cpu::nf4_quantize(q.codes.data(), q.absmax.data(), x.data(), n);
  } else {
    auto bits = f32_bits(c["input"]);
    REQUIRE(int64_t(bits.size()) == n);
    std::vector<float> x(bits.size());
    std::memcpy(x.data(), bits.data(), bits.size() * 4);
    cpu::nf4_quantize(q.codes.data(), q.absmax.data(), x.data(), n);
  }
  return q;
}

}  // namespace

TEST_CASE("nf4 tables equal bitsandbytes' NF4 code and dynamic map", "[nf4]") {
  const auto g = golden();
  std::vector<float> code(cpu::nf4_code(), cpu::nf4_code() + 16);
  std::vector<float> map(cpu::nf4_dynamic_map(), cpu::nf4_dynamic_map() + 256);
  CHECK(bits_of(code) == f32_bits(g["nf4_code"]));
  CHECK(bits_of(map) == f32_bits(g["dynamic_map"]));
}

TEST_CASE("nf4 quantization equals bitsandbytes bit for bit", "[nf4]") {
  const auto g = golden();
  for (const auto& c : g["cases"]) {
    int64_t n = 1;
    for (const auto& d : c["shape"]) n *= d.get<int64_t>();
    INFO("case " << c["name"].get<std::string>() << " n=" << n);
    const Quantized q = quantize_case(c, n);
    CHECK(q.codes == hex_bytes(c["codes"].get<std::string>()));
    CHECK(bits_of(q.absmax) == f32_bits(c["absmax"]));

    std::vector<bf16> w(static_cast<size_t>(n));
    std::vector<float> wf(static_cast<size_t>(n));
    cpu::nf4_dequantize_bf16(w.data(), q.codes.data(), nullptr, q.absmax.data(), 0.f, n);
    cpu::nf4_dequantize_f32(wf.data(), q.codes.data(), nullptr, q.absmax.data(), 0.f, n);
    CHECK(bits_of(w) == widen(bf16_bits(c["dequant_bf16"].get<std::string>())));
    CHECK(bits_of(wf) == f32_bits(c["dequant_f32"]));
    for (cpu::Nf4Isa isa : supported_isas()) {  // every variant this CPU runs, not only the active one
      INFO("variant " << cpu::nf4_isa_name(isa));
      std::fill(w.begin(), w.end(), bf16{0x5a5a});
      std::fill(wf.begin(), wf.end(), 0.5f);
      cpu::nf4_dequantize_isa(isa, cpu::Nf4Out::bf16, w.data(), q.codes.data(), nullptr, q.absmax.data(), 0.f, n);
      cpu::nf4_dequantize_isa(isa, cpu::Nf4Out::f32, wf.data(), q.codes.data(), nullptr, q.absmax.data(), 0.f, n);
      CHECK(bits_of(w) == widen(bf16_bits(c["dequant_bf16"].get<std::string>())));
      CHECK(bits_of(wf) == f32_bits(c["dequant_f32"]));
    }

    // Double quantization.
    const auto& nested = c["nested"];
    const int64_t blocks = cpu::nf4_blocks(n);
    std::vector<uint8_t> qabsmax(static_cast<size_t>(blocks));
    std::vector<float> absmax2(size_t(cpu::nf4_nested_blocks(n))), absmax(static_cast<size_t>(blocks));
    float offset = 0;
    cpu::nf4_double_quantize(qabsmax.data(), absmax2.data(), &offset, q.absmax.data(), blocks, 1);
    CHECK(qabsmax == hex_bytes(nested["qabsmax"].get<std::string>()));
    CHECK(bits_of(absmax2) == f32_bits(nested["absmax2"]));
    CHECK(bits_of(std::vector<float>{offset}) == f32_bits(nlohmann::json::array({nested["offset"]})));
    cpu::nf4_absmax_dequantize(absmax.data(), qabsmax.data(), absmax2.data(), offset, blocks);
    CHECK(bits_of(absmax) == f32_bits(nested["absmax"]));
    cpu::nf4_dequantize_bf16(w.data(), q.codes.data(), qabsmax.data(), absmax2.data(), offset, n);
    CHECK(bits_of(w) == widen(bf16_bits(nested["dequant_bf16"].get<std::string>())));
    for (cpu::Nf4Isa isa : supported_isas()) {
      INFO("variant " << cpu::nf4_isa_name(isa));
      std::fill(w.begin(), w.end(), bf16{0x5a5a});
      cpu::nf4_dequantize_isa(isa, cpu::Nf4Out::bf16, w.data(), q.codes.data(), qabsmax.data(), absmax2.data(), offset, n);
      CHECK(bits_of(w) == widen(bf16_bits(nested["dequant_bf16"].get<std::string>())));
    }
  }
}

TEST_CASE("nf4 over 32768 blocks follows torch's per-thread mean", "[nf4]") {
  const auto g = golden();
  const auto& big = g["large"];
  const int64_t n = big["n"].get<int64_t>();
  const auto x = hash_input(n);
  const int64_t blocks = cpu::nf4_blocks(n);
  std::vector<uint8_t> codes(size_t(cpu::nf4_code_bytes(n)));
  std::vector<float> absmax(static_cast<size_t>(blocks));
  cpu::nf4_quantize(codes.data(), absmax.data(), x.data(), n);
  CHECK(hex64(fnv1a64(codes.data(), codes.size())) == big["codes_fnv64"].get<std::string>());
  CHECK(hex64(fnv1a64(absmax.data(), absmax.size() * 4)) == big["absmax_fnv64"].get<std::string>());
  std::vector<bf16> w(static_cast<size_t>(n));
  cpu::nf4_dequantize_bf16(w.data(), codes.data(), nullptr, absmax.data(), 0.f, n);
  CHECK(hex64(fnv1a64(w.data(), w.size() * 2)) == big["dequant_bf16_fnv64"].get<std::string>());

  std::string offsets[2];
  for (int threads : {1, 2}) {
    INFO("torch threads " << threads);
    const auto& want = big["nested"][std::to_string(threads)];
    std::vector<uint8_t> qabsmax(static_cast<size_t>(blocks));
    std::vector<float> absmax2(size_t(cpu::nf4_nested_blocks(n))), deq(static_cast<size_t>(blocks));
    float offset = 0;
    cpu::nf4_double_quantize(qabsmax.data(), absmax2.data(), &offset, absmax.data(), blocks, threads);
    CHECK(bits_of(std::vector<float>{offset}) == f32_bits(nlohmann::json::array({want["offset"]})));
    CHECK(hex64(fnv1a64(qabsmax.data(), qabsmax.size())) == want["qabsmax_fnv64"].get<std::string>());
    CHECK(bits_of(absmax2) == f32_bits(want["absmax2"]));
    cpu::nf4_absmax_dequantize(deq.data(), qabsmax.data(), absmax2.data(), offset, blocks);
    CHECK(hex64(fnv1a64(deq.data(), deq.size() * 4)) == want["absmax_fnv64"].get<std::string>());
    offsets[threads - 1] = want["offset"].get<std::string>();
  }
  // The case is chosen so the thread count matters (else the second half would test nothing).
  CHECK(offsets[0] != offsets[1]);
}

TEST_CASE("nf4 dequantization matches its plain-loop twin", "[nf4]") {
  for (int64_t n : {1, 15, 17, 64, 129, 4097, 70001}) {
    INFO("n=" << n);
    auto x = strata::testing::random_floats(n, uint64_t(n) + 7, -3.f, 3.f);
    const int64_t blocks = cpu::nf4_blocks(n);
    std::vector<uint8_t> codes(size_t(cpu::nf4_code_bytes(n))), qabsmax(static_cast<size_t>(blocks));
    std::vector<float> absmax(static_cast<size_t>(blocks)), absmax2(size_t(cpu::nf4_nested_blocks(n))),
        deq(static_cast<size_t>(blocks));
    float offset = 0;
    cpu::nf4_quantize(codes.data(), absmax.data(), x.data(), n);
    cpu::nf4_double_quantize(qabsmax.data(), absmax2.data(), &offset, absmax.data(), blocks, 1);
    cpu::nf4_absmax_dequantize(deq.data(), qabsmax.data(), absmax2.data(), offset, blocks);

    std::vector<double> want(static_cast<size_t>(n)), plain(static_cast<size_t>(n));
    strata::ref::nf4_dequantize(want.data(), codes.data(), deq.data(), cpu::nf4_code(), n);
    strata::ref::nf4_dequantize(plain.data(), codes.data(), absmax.data(), cpu::nf4_code(), n);
    std::vector<float> wf(static_cast<size_t>(n));
    std::vector<bf16> wb(static_cast<size_t>(n));
    cpu::nf4_dequantize_f32(wf.data(), codes.data(), qabsmax.data(), absmax2.data(), offset, n);
    cpu::nf4_dequantize_bf16(wb.data(), codes.data(), qabsmax.data(), absmax2.data(), offset, n);
    double worst_f = 0, worst_b = 0, worst_q = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double r = want[size_t(i)], a = std::fabs(r) + 1e-30;
      worst_f = std::max(worst_f, std::fabs(wf[size_t(i)] - r) / a);
      worst_b = std::max(worst_b, std::fabs(strata::bf16_to_f32(wb[size_t(i)]) - r) / a);
      // The quantization error itself (plain absmax): within half the widest NF4 gap,
      // (-0.6961928 - -1) / 2 = 0.1519036 of the block's absmax.
      worst_q = std::max(worst_q, std::fabs(plain[size_t(i)] - x[size_t(i)]) / absmax[size_t(i) / 64]);
    }
    // f32: one rounding of the product (2^-24); bf16: one more (2^-9).
    CHECK(worst_f <= 6e-8);
    CHECK(worst_b <= 0.00391);
    CHECK(worst_q <= 0.151904);
  }
}

// The vector variants (kernels/cpu/nf4_dequantize.h) against a plain per-weight loop of the same
// arithmetic, bf16(NF4[code] * scale) with the scale made as nf4_absmax_dequantize makes it, bit
// for bit: lengths around the 64-weight block and the vectors' widths (a last partial block, an
// odd count), past kNf4SerialBelow (the threaded split, with a partial chunk), blocks of zeros
// and an outlier, plain and double-quantized, into bf16, widened bf16 and f32.
TEST_CASE("nf4 dequantization gives the plain loop's bits on every instruction set", "[nf4]") {
  const int64_t threaded = cpu::kNf4SerialBelow + 64 * 300 + 37;
  for (int64_t n : {int64_t(1), int64_t(2), int64_t(15), int64_t(17), int64_t(63), int64_t(64), int64_t(65),
                    int64_t(127), int64_t(128), int64_t(129), int64_t(4097), int64_t(70001), threaded}) {
    auto x = strata::testing::random_floats(n, uint64_t(n) + 11, -2.f, 2.f);
    if (n > 300) {
      std::fill(x.begin() + 64, x.begin() + 128, 0.f);  // a block of zeros: absmax 0, every weight 0
      x[200] = 3e4f;                                     // an outlier: its block's other codes near 0
    }
    const int64_t blocks = cpu::nf4_blocks(n);
    std::vector<uint8_t> codes(size_t(cpu::nf4_code_bytes(n))), qabsmax(static_cast<size_t>(blocks));
    std::vector<float> absmax(static_cast<size_t>(blocks)), absmax2(size_t(cpu::nf4_nested_blocks(n))),
        deq(static_cast<size_t>(blocks));
    float offset = 0;
    cpu::nf4_quantize(codes.data(), absmax.data(), x.data(), n);
    cpu::nf4_double_quantize(qabsmax.data(), absmax2.data(), &offset, absmax.data(), blocks, 1);
    cpu::nf4_absmax_dequantize(deq.data(), qabsmax.data(), absmax2.data(), offset, blocks);
    for (const bool dq : {false, true}) {
      const float* scale = dq ? deq.data() : absmax.data();
      std::vector<uint32_t> want[3];  // Nf4Out's order: bf16, bf16 widened, f32
      for (int64_t i = 0; i < n; ++i) {
        const uint8_t byte = codes[size_t(i / 2)];
        const float v = cpu::nf4_code()[i % 2 ? byte & 0x0f : byte >> 4] * scale[i / 64];
        const bf16 h = strata::f32_to_bf16(v);
        want[0].push_back(h.bits);
        want[1].push_back(uint32_t(h.bits) << 16);
        want[2].push_back(std::bit_cast<uint32_t>(v));
      }
      for (cpu::Nf4Isa isa : supported_isas()) {
        INFO("n=" << n << " double quant " << dq << " variant " << cpu::nf4_isa_name(isa));
        std::vector<bf16> wb(size_t(n) + 1, bf16{0x5a5a});
        std::vector<float> wf(size_t(n) + 1, 0.5f), ww(size_t(n) + 1, 0.5f);
        const uint8_t* q = dq ? qabsmax.data() : nullptr;
        const float* a = dq ? absmax2.data() : absmax.data();
        cpu::nf4_dequantize_isa(isa, cpu::Nf4Out::bf16, wb.data(), codes.data(), q, a, offset, n);
        cpu::nf4_dequantize_isa(isa, cpu::Nf4Out::bf16_as_f32, ww.data(), codes.data(), q, a, offset, n);
        cpu::nf4_dequantize_isa(isa, cpu::Nf4Out::f32, wf.data(), codes.data(), q, a, offset, n);
        CHECK(wb.back().bits == 0x5a5a);  // nothing written past n
        CHECK(wf.back() == 0.5f);
        wb.pop_back(), wf.pop_back(), ww.pop_back();
        CHECK(bits_of(wb) == want[0]);
        CHECK(bits_of(ww) == want[1]);
        CHECK(bits_of(wf) == want[2]);
      }
    }
  }
  // the entries the device op calls take the active variant: STRATA_NF4_ISA's, else the widest
  const std::vector<cpu::Nf4Isa> isas = supported_isas();
  if (!std::getenv("STRATA_NF4_ISA")) CHECK(cpu::nf4_isa_active() == isas.back());
  CHECK(cpu::nf4_isa_supported(cpu::Nf4Isa::scalar));
}

TEST_CASE("nf4 state bytes per weight of Llama-shaped linears", "[nf4]") {
  // q_proj of Llama 3.1 8B and 70B, an odd 33 x 65 matrix: bytes of codes + scales per weight.
  struct Shape {
    int64_t out, in;
  };
  for (const Shape s : {Shape{4096, 4096}, Shape{8192, 8192}, Shape{14336, 4096}, Shape{33, 65}}) {
    const int64_t n = s.out * s.in;
    const double dq = double(cpu::nf4_state_bytes(n, true)) / double(n);
    const double plain = double(cpu::nf4_state_bytes(n, false)) / double(n);
    INFO(s.out << " x " << s.in << ": " << dq << " B/weight double-quantized, " << plain << " plain");
    // Codes alone are 0.5 B; scales add 1/64 B (u8) or 4/64 B (f32), the nested absmax 4/16384.
    CHECK(dq >= 0.5);
    CHECK(plain >= 0.5625);
    if (n > 1 << 20) {
      CHECK(dq < 0.5160);
      CHECK(plain < 0.5626);
      CHECK(dq / 2.0 < 0.3);  // against bf16's 2 B per weight over the link
    }
  }
  // Exact for the 33 x 65 case: 1073 code bytes, 34 blocks, 1 nested block.
  CHECK(cpu::nf4_state_bytes(33 * 65, true) == 1073 + 34 + 4 + 4);
  CHECK(cpu::nf4_state_bytes(33 * 65, false) == 1073 + 34 * 4);
}

TEST_CASE("nf4 quantization refuses a NaN or an infinity, naming its block", "[nf4]") {
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    std::vector<float> x(200, 0.5f);
    x[130] = bad;
    std::vector<uint8_t> codes(size_t(cpu::nf4_code_bytes(200)));
    std::vector<float> absmax(size_t(cpu::nf4_blocks(200)));
    CHECK_THROWS_WITH(cpu::nf4_quantize(codes.data(), absmax.data(), x.data(), 200),
                      Catch::Contains("elements [128, 192)"));
  }
}
