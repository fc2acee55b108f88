// strata's AMX bf16 GEMM tile (twin: kernels/cpu/ref/matmul.h), for kernels/cpu/matmul.cpp's
// fixed 256 x 256 tiles on CPUs with AMX-BF16: c (tm, tn) f32 = op(a) rows · op(b) columns over
// the whole K, from operands packed once per tile row (a) and tile column (b).
//
// Layouts (32-bit words, each the bf16 pair 2p (low half) and 2p + 1 (high half) of the summed
// index; K is zero-padded to whole chunks of 32 values, rows and columns to whole 32s):
//   packed a: [row block of 16][chunk][16 rows][16 words]   (one 1 KiB tile per block and chunk)
//   packed b: [column panel of 16][chunk][16 pairs][16 words] (word (p, j): column j's pair p)
// so every tile load reads 1 KiB of contiguous memory. The tile multiplies 32 x 32 blocks of c
// with four accumulators (two a tiles by two b tiles a chunk).
//
// Numerics: each product of two bf16 values is exact in f32; an element of c sums its chunks in
// ascending order, each chunk's pairs added by the tile unit, from +0. The zero padding adds exact
// zeros. So an element's bits depend on K and its values only: not on the tiling or the threads.
#pragma once
#include <cstdint>

#include "src/core/bf16.h"

namespace strata::cpu {

// Whether this CPU and OS run the AMX tile (amx_bf16_available).
bool gemm_amx_available();

// 32-bit words of a packed operand: op(a) rows or op(b) columns `count`, K values each.
int64_t gemm_amx_packed_words(int64_t count, int64_t k);

// Pack op(a) rows [i0, i0 + tm) (a stored (M, K) with row stride lda, or (K, M) when trans_a).
void gemm_amx_pack_a(uint32_t* dst, const bf16* a, int64_t lda, bool trans_a, int64_t i0, int64_t tm,
                     int64_t k);
// Pack op(b) columns [j0, j0 + tn) (b stored (K, N) with row stride ldb, or (N, K) when trans_b).
void gemm_amx_pack_b(uint32_t* dst, const bf16* b, int64_t ldb, bool trans_b, int64_t j0, int64_t tn,
                     int64_t k);

// c (tm, tn; row stride ldc) = packed a · packed b over K. Requires gemm_amx_available().
void gemm_amx_tile(float* c, int64_t ldc, const uint32_t* a, const uint32_t* b, int64_t tm, int64_t tn,
                   int64_t k);

}  // namespace strata::cpu
