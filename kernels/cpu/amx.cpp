// AMX bf16 tile products (see amx.h). The tile intrinsics name their tiles by number in the
// instruction, so the tiles are fixed: 0-3 accumulators (16 columns each), 4 and 5 the a and b
// tiles of a full chunk of 16 pairs, 6 and 7 those of the last, shorter chunk.
#include "kernels/cpu/amx.h"

#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "src/core/error.h"

namespace strata::cpu {
namespace {

constexpr long kArchReqXcompPerm = 0x1023;  // Linux arch_prctl: ask for an XSTATE component
constexpr long kXfeatureXtileData = 18;     // the AMX tile data component
constexpr int64_t kPairsPerChunk = 16;      // a tile row is 64 bytes: 16 words
constexpr int64_t kTileRows = 16;

// Tiles for a block of `rows` rows of c whose sum ends in a chunk of `tail` pairs (0: none).
void amx_configure(int64_t rows, int64_t tail) {
  AmxTileConfig cfg;
  const auto r = static_cast<uint8_t>(rows);
  for (int t = 0; t < 4; ++t) {
    cfg.rows[t] = r;
    cfg.colsb[t] = 64;
  }
  cfg.rows[4] = r;
  cfg.colsb[4] = 64;
  cfg.rows[5] = kTileRows;
  cfg.colsb[5] = 64;
  if (tail > 0) {
    cfg.rows[6] = r;
    cfg.colsb[6] = static_cast<uint16_t>(tail * 4);
    cfg.rows[7] = static_cast<uint8_t>(tail);
    cfg.colsb[7] = 64;
  }
  amx_load_tile_config(cfg);
}

// One block: rows of c (as configured) by kC 16-column accumulators, summed over np pairs.
template <int kC>
__attribute__((target("amx-tile,amx-bf16"))) void amx_block(float* c, int64_t ldc, bool accumulate,
                                                             const uint32_t* a, int64_t lda,
                                                             const uint32_t* b, int64_t ldb,
                                                             int64_t np) {
  static_assert(kC >= 1 && kC <= 4);
  const int64_t sc = ldc * 4, sa = lda * 4, sb = ldb * 4;
  if (accumulate) {
    _tile_loadd(0, c, sc);
    if constexpr (kC > 1) _tile_loadd(1, c + 16, sc);
    if constexpr (kC > 2) _tile_loadd(2, c + 32, sc);
    if constexpr (kC > 3) _tile_loadd(3, c + 48, sc);
  } else {
    _tile_zero(0);
    if constexpr (kC > 1) _tile_zero(1);
    if constexpr (kC > 2) _tile_zero(2);
    if constexpr (kC > 3) _tile_zero(3);
  }
  int64_t k0 = 0;
  for (; k0 + kPairsPerChunk <= np; k0 += kPairsPerChunk) {
    const uint32_t* bk = b + k0 * ldb;
    _tile_loadd(4, a + k0, sa);
    _tile_loadd(5, bk, sb);
    _tile_dpbf16ps(0, 4, 5);
    if constexpr (kC > 1) {
      _tile_loadd(5, bk + 16, sb);
      _tile_dpbf16ps(1, 4, 5);
    }
    if constexpr (kC > 2) {
      _tile_loadd(5, bk + 32, sb);
      _tile_dpbf16ps(2, 4, 5);
    }
    if constexpr (kC > 3) {
      _tile_loadd(5, bk + 48, sb);
      _tile_dpbf16ps(3, 4, 5);
    }
  }
  if (k0 < np) {
    const uint32_t* bk = b + k0 * ldb;
    _tile_loadd(6, a + k0, sa);
    _tile_loadd(7, bk, sb);
    _tile_dpbf16ps(0, 6, 7);
    if constexpr (kC > 1) {
      _tile_loadd(7, bk + 16, sb);
      _tile_dpbf16ps(1, 6, 7);
    }
    if constexpr (kC > 2) {
      _tile_loadd(7, bk + 32, sb);
      _tile_dpbf16ps(2, 6, 7);
    }
    if constexpr (kC > 3) {
      _tile_loadd(7, bk + 48, sb);
      _tile_dpbf16ps(3, 6, 7);
    }
  }
  _tile_stored(0, c, sc);
  if constexpr (kC > 1) _tile_stored(1, c + 16, sc);
  if constexpr (kC > 2) _tile_stored(2, c + 32, sc);
  if constexpr (kC > 3) _tile_stored(3, c + 48, sc);
}

__attribute__((target("amx-tile"))) void amx_release() { _tile_release(); }

}  // namespace

__attribute__((target("amx-tile"))) void amx_load_tile_config(const AmxTileConfig& cfg) {
  __asm__ volatile("" : : "r"(&cfg) : "memory");  // every store to cfg happens before this point
  _tile_loadconfig(&cfg);
}

bool amx_bf16_available() {
  static const bool available = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c >> 27 & 1u)) return false;  // OSXSAVE
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    if (!(d >> 22 & 1u) || !(d >> 24 & 1u)) return false;  // AMX-BF16, AMX-TILE
    uint32_t xcr0_lo = 0, xcr0_hi = 0;
    __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    if ((xcr0_lo & (3u << 17)) != (3u << 17)) return false;  // XTILECFG, XTILEDATA saved
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtileData) == 0;
  }();
  return available;
}

void amx_pairs_gemm(float* c, int64_t ldc, bool accumulate, const uint32_t* a, int64_t lda,
                    const uint32_t* b, int64_t ldb, int64_t m, int64_t np, int64_t nv) {
  STRATA_ASSERT(amx_bf16_available(), "amx_pairs_gemm: this CPU or OS offers no AMX-BF16");
  if (m <= 0 || nv <= 0) return;
  if (np <= 0) {
    if (!accumulate)
      for (int64_t r = 0; r < m; ++r) std::fill(c + r * ldc, c + r * ldc + 16 * nv, 0.f);
    return;
  }
  const int64_t tail = np % kPairsPerChunk;
  int64_t configured = -1;
  for (int64_t r = 0; r < m; r += kTileRows) {
    const int64_t rows = std::min(kTileRows, m - r);
    if (rows != configured) {
      amx_configure(rows, tail);
      configured = rows;
    }
    const uint32_t* ar = a + r * lda;
    float* cr = c + r * ldc;
    for (int64_t v = 0; v < nv; v += 4) {
      const int64_t n = std::min<int64_t>(4, nv - v);
      if (n == 4) amx_block<4>(cr + 16 * v, ldc, accumulate, ar, lda, b + 16 * v, ldb, np);
      if (n == 3) amx_block<3>(cr + 16 * v, ldc, accumulate, ar, lda, b + 16 * v, ldb, np);
      if (n == 2) amx_block<2>(cr + 16 * v, ldc, accumulate, ar, lda, b + 16 * v, ldb, np);
      if (n == 1) amx_block<1>(cr + 16 * v, ldc, accumulate, ar, lda, b + 16 * v, ldb, np);
    }
  }
  amx_release();
}

}  // namespace strata::cpu
