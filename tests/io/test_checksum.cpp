// CRC-32C: the published check values, the hardware path equal to the table-driven twin on
// every length and alignment around the 8-byte word, and chaining.
#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "io/checksum.h"

namespace strata {

TEST_CASE("crc32c matches the published check values", "[checksum]") {
  const std::string check = "123456789";
  std::vector<unsigned char> zeros(32, 0), ones(32, 0xff), ascending(32), descending(32);
  for (int i = 0; i < 32; ++i) ascending[size_t(i)] = (unsigned char)i, descending[size_t(i)] = (unsigned char)(31 - i);
  for (auto f : {&crc32c, &crc32c_software}) {
    CHECK(f(check.data(), check.size(), 0) == 0xe3069283u);  // the CRC catalogue's check value
    // RFC 3720 (iSCSI) B.4 test vectors
    CHECK(f(zeros.data(), 32, 0) == 0x8a9136aau);
    CHECK(f(ones.data(), 32, 0) == 0x62a8ab43u);
    CHECK(f(ascending.data(), 32, 0) == 0x46dd794eu);
    CHECK(f(descending.data(), 32, 0) == 0x113fdb5cu);
    CHECK(f(nullptr, 0, 0) == 0u);
  }
  CHECK(crc32c_hex(0xe3069283u) == "e3069283");
  CHECK(crc32c_hex(0x0000beefu) == "0000beef");
}

TEST_CASE("crc32c: the fast path equals the twin at every length and alignment, chaining", "[checksum]") {
  std::vector<unsigned char> buf(4097 + 16);
  uint32_t x = 12345;
  for (auto& b : buf) b = (unsigned char)((x = x * 1103515245u + 12345u) >> 16);
  for (size_t offset = 0; offset < 8; ++offset)
    for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(8), size_t(9), size_t(15), size_t(17), size_t(63),
                     size_t(4097)}) {
      INFO("offset " << offset << " length " << n);
      CHECK(crc32c(buf.data() + offset, n, 0) == crc32c_software(buf.data() + offset, n, 0));
    }
  for (size_t split : {size_t(0), size_t(1), size_t(13), size_t(4096), size_t(4097)}) {
    const uint32_t whole = crc32c(buf.data(), 4097);
    CHECK(crc32c(buf.data() + split, 4097 - split, crc32c(buf.data(), split)) == whole);
    CHECK(crc32c_software(buf.data() + split, 4097 - split, crc32c_software(buf.data(), split)) == whole);
  }
  // one flipped bit anywhere changes the sum
  const uint32_t before = crc32c(buf.data(), 4097);
  buf[2049] ^= 0x10;
  CHECK(crc32c(buf.data(), 4097) != before);
}

}  // namespace strata
