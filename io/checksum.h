// CRC-32C (Castagnoli, the polynomial iSCSI, ext4 and RocksDB use): the per-file checksum of
// checkpoints, the per-block checksum of the NVMe file engine (io/uring_file.h), and of any other
// durable file strata wants to verify when it reads it back.
// crc32c() takes the SSE4.2 instruction when the CPU has it (three interleaved lanes joined by a
// multiplication modulo the polynomial) and a table-driven loop otherwise;
// crc32c_software() is that loop, kept callable so tests compare the two on the same bytes.
//
// Chaining: crc32c(b, nb, crc32c(a, na)) == crc32c(a then b, na + nb), so a file can be summed
// in pieces as it is written or read.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace strata {

uint32_t crc32c(const void* data, size_t bytes, uint32_t seed = 0);
uint32_t crc32c_software(const void* data, size_t bytes, uint32_t seed = 0);
bool crc32c_hardware_available();

// The CRC-32C of a whole file, read in 4 MiB pieces; *bytes (when given) gets its size.
// Throws strata::Error (kind io) naming the path when it cannot be opened or read.
uint32_t crc32c_file(const std::string& path, uint64_t* bytes = nullptr);

// "e3069283": eight lowercase hex digits, as manifests store a checksum.
std::string crc32c_hex(uint32_t crc);

}  // namespace strata
