#include "io/checksum.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "src/core/error.h"

namespace strata {
namespace {

constexpr uint32_t kPoly = 0x82f63b78u;  // CRC-32C, reflected

// Slicing-by-8 tables: table[0] is the classic byte table; table[k][b] advances it k more bytes.
struct Tables {
  std::array<std::array<uint32_t, 256>, 8> t{};
  Tables() {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t c = b;
      for (int i = 0; i < 8; ++i) c = (c >> 1) ^ (kPoly & (0u - (c & 1u)));
      t[0][b] = c;
    }
    for (uint32_t b = 0; b < 256; ++b)
      for (size_t k = 1; k < 8; ++k) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xffu];
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

#if defined(__x86_64__)
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

// Three lanes of kLane bytes run side by side (the crc32 instruction has a latency of three
// cycles and a throughput of one), then join: crc(A B) = crc(A) * x^(8|B|) + crc(B).
constexpr size_t kLane = 8192;

__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(const void* data, size_t bytes, uint32_t seed) {
  static const uint32_t shift_lane = crc32c_x8nmodp(kLane);
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t c = ~seed;
  while (bytes >= 3 * kLane) {
    uint64_t c1 = 0xFFFFFFFFu, c2 = 0xFFFFFFFFu;
    for (size_t i = 0; i < kLane; i += 8) {
      uint64_t w0, w1, w2;
      std::memcpy(&w0, p + i, 8);  // any alignment
      std::memcpy(&w1, p + kLane + i, 8);
      std::memcpy(&w2, p + 2 * kLane + i, 8);
      c = __builtin_ia32_crc32di(c, w0);
      c1 = __builtin_ia32_crc32di(c1, w1);
      c2 = __builtin_ia32_crc32di(c2, w2);
    }
    uint32_t r = ~uint32_t(c);
    r = crc32c_multmodp(shift_lane, r) ^ ~uint32_t(c1);
    r = crc32c_multmodp(shift_lane, r) ^ ~uint32_t(c2);
    c = ~r;
    p += 3 * kLane;
    bytes -= 3 * kLane;
  }
  for (; bytes >= 8; bytes -= 8, p += 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    c = __builtin_ia32_crc32di(c, w);
  }
  for (; bytes > 0; --bytes) c = __builtin_ia32_crc32qi(uint32_t(c), *p++);
  return ~uint32_t(c);
}
#endif

}  // namespace

uint32_t crc32c_software(const void* data, size_t bytes, uint32_t seed) {
  const auto& t = tables().t;
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~seed;
  for (; bytes >= 8; bytes -= 8, p += 8) {
    uint32_t lo, hi;  // little-endian words, as the table order assumes
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= c;
    c = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24] ^
        t[3][hi & 0xff] ^ t[2][(hi >> 8) & 0xff] ^ t[1][(hi >> 16) & 0xff] ^ t[0][hi >> 24];
  }
  for (; bytes > 0; --bytes) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xffu];
  return ~c;
}

bool crc32c_hardware_available() {
#if defined(__x86_64__)
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
#else
  return false;
#endif
}

uint32_t crc32c(const void* data, size_t bytes, uint32_t seed) {
#if defined(__x86_64__)
  if (crc32c_hardware_available()) return crc32c_sse42(data, bytes, seed);
#endif
  return crc32c_software(data, bytes, seed);
}

uint32_t crc32c_file(const std::string& path, uint64_t* bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  STRATA_CHECK_IO(fd >= 0, "cannot open ", path, ": ", std::strerror(errno));
  std::vector<char> buf(size_t(4) << 20);
  uint32_t crc = 0;
  uint64_t total = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      STRATA_CHECK_IO(n == 0, "cannot read ", path, " at offset ", total, ": ", std::strerror(err));
      break;
    }
    crc = crc32c(buf.data(), size_t(n), crc);
    total += uint64_t(n);
  }
  if (bytes) *bytes = total;
  return crc;
}

std::string crc32c_hex(uint32_t crc) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", crc);
  return buf;
}

}  // namespace strata
