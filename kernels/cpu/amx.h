// Intel AMX (Advanced Matrix Extensions) bf16 tile products for the CPU kernels: 16 x 16 f32
// accumulator tiles fed by bf16 row tiles and pair ("VNNI") tiles, about four times what
// vdpbf16ps does per cycle on the same core.
//
// Operands use the layouts the attention kernel already builds for vdpbf16ps: a is m rows of
// 32-bit words, each two bf16 values (the pair 2p, 2p + 1 of the summed index); b is np rows of
// words, word (p, j) holding column j's values for 2p (low half) and 2p + 1 (high half).
//
// Numerics: every product of two bf16 values is exact in f32; the tile unit adds the pair
// products and the accumulator with its own rounding, which is not vdpbf16ps's (measured: about
// 6% of results differ in the last bits), so results are bitwise reproducible on AMX but not
// equal to the AVX512-BF16 kernels'. Each c element sums its pairs in ascending chunks of 16,
// whatever the row or column blocking, so the bits do not depend on the thread count.
#pragma once
#include <cstdint>

namespace strata::cpu {

// True when the CPU has AMX-TILE and AMX-BF16, the OS saves the tile state (XCR0) and grants this
// process the tile data permission (Linux arch_prctl ARCH_REQ_XCOMP_PERM, asked once).
bool amx_bf16_available();

// The 64-byte operand of ldtilecfg (palette 1): rows and bytes per row of each of the 8 tiles.
struct alignas(64) AmxTileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};  // bytes per row of each tile
  uint8_t rows[16] = {};
};

// Configures this thread's tiles with cfg (ldtilecfg). Requires amx_bf16_available(). Every AMX
// kernel configures through here: GCC 12 without -march=native (STRATA_NATIVE=OFF) dropped a
// config's stores as dead where _tile_loadconfig followed them in the same function (it models
// ldtilecfg as reading 16 of the 64 bytes), and the tile unit faulted on the stale rest.
void amx_load_tile_config(const AmxTileConfig& cfg);

// c (m, 16 nv; row stride ldc floats) = (accumulate ? c : 0) + a · b, where a is (m, np) words
// with row stride lda and b is (np, 16 nv) words with row stride ldb (both in words). Any m, np,
// nv >= 0. Requires amx_bf16_available().
void amx_pairs_gemm(float* c, int64_t ldc, bool accumulate, const uint32_t* a, int64_t lda,
                    const uint32_t* b, int64_t ldb, int64_t m, int64_t np, int64_t nv);

}  // namespace strata::cpu
