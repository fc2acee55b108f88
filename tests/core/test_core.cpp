// Core: bf16/f16 rounding, the tensor table's layout, the arena's budget and reuse, byte parsing.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>

#include "src/core/error.h"
#include "src/core/tensor.h"
#include "src/device/arena.h"
#include "src/device/device.h"
#include "src/recipe/recipe.h"

namespace strata {

static float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST_CASE("f32 to bf16 rounds to nearest, ties to even, against an fp64 reference", "[core]") {
  // Reference: among the two bf16 neighbours (truncation and truncation + 1 ulp), take the one
  // closer in fp64; on a tie the one with an even mantissa.
  uint64_t checked = 0;
  for (uint64_t u = 0; u < (1ull << 32); u += 65537 * 3) {
    float f = from_bits(uint32_t(u));
    if (std::isnan(f) || std::isinf(f)) continue;
    uint32_t lo = uint32_t(u) & 0xffff0000u, hi = lo + 0x10000u;
    double dl = std::abs(double(from_bits(lo)) - double(f));
    double dh = std::isinf(from_bits(hi)) ? INFINITY : std::abs(double(from_bits(hi)) - double(f));
    if (std::isinf(from_bits(hi))) dh = std::abs(std::ldexp(1.0, 128) * (f < 0 ? -1 : 1) - double(f));
    uint32_t want = dl < dh ? lo : dh < dl ? hi : (((lo >> 16) & 1) ? hi : lo);
    REQUIRE(f32_to_bf16(f).bits == uint16_t(want >> 16));
    ++checked;
  }
  CHECK(checked > 20000);
  CHECK(f32_to_bf16(1.0f).bits == 0x3f80);
  CHECK(f32_to_bf16(from_bits(0x3f808000u)).bits == 0x3f80);  // tie, even stays
  CHECK(f32_to_bf16(from_bits(0x3f818000u)).bits == 0x3f82);  // tie, odd rounds up
  CHECK(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  CHECK(std::isinf(bf16_to_f32(f32_to_bf16(INFINITY))));
  CHECK(std::isinf(bf16_to_f32(f32_to_bf16(3.4028235e38f))));  // max f32 rounds to inf in bf16
}

TEST_CASE("f16 conversions round-trip every half value", "[core]") {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    float f = f16_to_f32(uint16_t(h));
    if (std::isnan(f)) continue;
    REQUIRE(f32_to_f16(f) == uint16_t(h));
  }
  CHECK(f16_to_f32(0x3c00) == 1.0f);
  CHECK(f16_to_f32(0x0001) == std::ldexp(1.0f, -24));  // smallest subnormal
}

TEST_CASE("tensor table lays out each tier aligned and in order", "[core]") {
  TensorTable t;
  t.add({"a", {3, 5}, DType::f32, Tier::device});
  t.add({"b", {7}, DType::bf16, Tier::host});
  t.add({"c", {1}, DType::f32, Tier::device});
  CHECK(t.layout(Tier::device) == 2 * TensorTable::kAlignment);
  CHECK(t[0].offset == 0);
  CHECK(t[2].offset == TensorTable::kAlignment);
  CHECK(t.layout(Tier::host) == TensorTable::kAlignment);
  CHECK(t.find("b")->bytes() == 14);
  CHECK(t.find("zz") == nullptr);
  CHECK(t.summary().find("device") != std::string::npos);
}

TEST_CASE("arena enforces its budget, names the tensor, reuses and coalesces", "[core]") {
  std::vector<char> block(4096);
  Arena a(block.data(), 4096, "device");
  char* p = a.alloc(1000, "x");
  char* q = a.alloc(1000, "y");
  CHECK(a.used_bytes() == 2048);
  try {
    a.alloc(3000, "big tensor");
    FAIL("expected a budget error");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::budget);
    CHECK(std::string(e.what()).find("big tensor") != std::string::npos);
  }
  a.free(p);
  a.free(q);
  CHECK(a.used_bytes() == 0);
  CHECK(a.peak_bytes() == 2048);
  char* r = a.alloc(4096, "everything");  // only possible if the two frees coalesced
  CHECK(r == block.data());
}

TEST_CASE("sizes and bandwidths parse with units, bad text is an input error", "[core]") {
  CHECK(parse_bytes("512MiB", "m") == 512ull << 20);
  CHECK(parse_bytes("2GiB", "m") == 2ull << 30);
  CHECK(parse_bytes("1.5GB", "m") == 1500000000ull);
  CHECK(parse_bytes("4096", "m") == 4096);
  CHECK(parse_bandwidth("16GB/s", "b") == 16e9);
  CHECK_THROWS_AS(parse_bytes("lots", "m"), Error);
  CHECK_THROWS_AS(parse_bytes("5 parsecs", "m"), Error);
  CHECK_THROWS_AS(parse_bandwidth("16GB", "b"), Error);
}

}  // namespace strata
