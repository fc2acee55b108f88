#include "io/checksum.h"

#include <array>
#include <cstring>

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

namespace strata {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // 0x1EDC6F41 reflected

// a * b modulo the polynomial (reflected bit order: bit 31 is x^0).
uint32_t crc32c_multmodp(uint32_t a, uint32_t b) {
  uint32_t m = 1u << 31, p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = b & 1 ? (b >> 1) ^ kPoly : b >> 1;
  }
  return p;
}

// x^(8 * bytes) modulo the polynomial: appending `bytes` bytes multiplies a crc by it.
uint32_t crc32c_x8nmodp(size_t bytes) {
  uint32_t x2k = 1u << 30;  // x^1
  uint32_t p = 1u << 31;    // x^0
  for (size_t n = bytes * 8; n; n >>= 1) {
    if (n & 1) p = crc32c_multmodp(x2k, p);
    x2k = crc32c_multmodp(x2k, x2k);
  }
  return p;
}

#if defined(__SSE4_2__)
// Three lanes of kLane bytes run side by side (the crc32 instruction has a latency of three
// cycles and a throughput of one), then join: crc(A B) = crc(A) * x^(8|B|) + crc(B).
constexpr size_t kLane = 8192;
const uint32_t kShiftLane = crc32c_x8nmodp(kLane);

uint32_t crc32c_sse42(const unsigned char* p, size_t bytes, uint32_t crc) {
  uint64_t c = ~crc;
  while (bytes >= 3 * kLane) {
    uint64_t c1 = 0xFFFFFFFFu, c2 = 0xFFFFFFFFu;
    for (size_t i = 0; i < kLane; i += 8) {
      uint64_t w0, w1, w2;
      std::memcpy(&w0, p + i, 8);
      std::memcpy(&w1, p + kLane + i, 8);
      std::memcpy(&w2, p + 2 * kLane + i, 8);
      c = _mm_crc32_u64(c, w0);
      c1 = _mm_crc32_u64(c1, w1);
      c2 = _mm_crc32_u64(c2, w2);
    }
    uint32_t r = ~uint32_t(c);
    r = crc32c_multmodp(kShiftLane, r) ^ ~uint32_t(c1);
    r = crc32c_multmodp(kShiftLane, r) ^ ~uint32_t(c2);
    c = ~r;
    p += 3 * kLane;
    bytes -= 3 * kLane;
  }
  for (; bytes >= 8; bytes -= 8, p += 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);  // any alignment
    c = _mm_crc32_u64(c, w);
  }
  uint32_t c32 = uint32_t(c);
  for (; bytes > 0; --bytes, ++p) c32 = _mm_crc32_u8(c32, *p);
  return ~c32;
}
#else
// One entry per byte value: the polynomial applied eight times.
constexpr std::array<uint32_t, 256> crc32c_table_build() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (kPoly & (0u - (c & 1u)));
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kCrc32cTable = crc32c_table_build();
#endif

}  // namespace

uint32_t crc32c(const void* data, size_t bytes, uint32_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
#if defined(__SSE4_2__)
  return crc32c_sse42(p, bytes, seed);
#else
  uint32_t c = ~seed;
  for (; bytes > 0; --bytes, ++p) c = (c >> 8) ^ kCrc32cTable[(c ^ *p) & 0xFFu];
  return ~c;
#endif
}

}  // namespace strata
