// crc32c (Castagnoli, the iSCSI/ext4 polynomial 0x1EDC6F41, reflected): the per-block checksum
// of strata's files on NVMe. crc32c("123456789") == 0xE3069283. `seed` is the result of the
// previous call, so a checksum can be built in pieces: crc32c(b, nb, crc32c(a, na)) equals the
// checksum of a followed by b. Uses the SSE4.2 crc32 instruction where the build targets it
// (-march=native here; three interleaved streams joined by a multiplication modulo the polynomial), else a
// byte table.
#pragma once
#include <cstddef>
#include <cstdint>

namespace strata {

uint32_t crc32c(const void* data, size_t bytes, uint32_t seed = 0);

}  // namespace strata
