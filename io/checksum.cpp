#include "io/checksum.h"

#include <array>
#include <cstring>

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

namespace strata {
namespace {

#if !defined(__SSE4_2__)
// One entry per byte value: the reflected polynomial applied eight times.
constexpr std::array<uint32_t, 256> crc32c_table_build() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kCrc32cTable = crc32c_table_build();
#endif

}  // namespace

uint32_t crc32c(const void* data, size_t bytes, uint32_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~seed;
#if defined(__SSE4_2__)
  uint64_t c64 = c;
  for (; bytes >= 8; bytes -= 8, p += 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);  // any alignment
    c64 = _mm_crc32_u64(c64, w);
  }
  c = uint32_t(c64);
  for (; bytes > 0; --bytes, ++p) c = _mm_crc32_u8(c, *p);
#else
  for (; bytes > 0; --bytes, ++p) c = (c >> 8) ^ kCrc32cTable[(c ^ *p) & 0xFFu];
#endif
  return ~c;
}

}  // namespace strata
