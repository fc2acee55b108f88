// strata's own f32 GEMM tile for AVX2 + FMA CPUs without AVX-512 (kernels/cpu/gemm_avx2.cpp):
// what matmul_run (kernels/cpu/matmul.cpp) multiplies its 256 x 256 tiles with there, in place
// of oneDNN 2.x's AVX2 kernel.
//
// A tile's operands are packed first, over the whole K: op(a)'s rows [i0, i0 + tm) as panels of
// kGemmMr rows, each panel (K, kGemmMr) with element (p, r) at p * kGemmMr + r, rows past tm zero;
// op(b)'s columns [j0, j0 + tn) as panels of kGemmNr columns, (K, kGemmNr) each, columns past tn
// zero. bf16 operands are widened (exactly) as they are packed. An f32 a stored (M, K) is read in
// place instead (its rows run along K already), but for a last panel of fewer than kGemmMr rows.
// gemm_tile then sums in blocks of kGemmKc (512) along K: c = the first block's sum, then c +=
// each next block's. Every element's sum
// runs in one fixed order that depends only on K, never on the tile's place or the thread.
#pragma once

#include <cstdint>

namespace strata::cpu {

constexpr int64_t kGemmMr = 6, kGemmNr = 16;

// Whether this CPU runs the kernel (AVX2 and FMA).
bool gemm_avx2_available();

// Floats of op(a)'s packed rows [i0, i0 + tm) (rounded up to whole panels) and of op(b)'s columns.
inline int64_t gemm_packed_a_floats(int64_t tm, int64_t k) { return (tm + kGemmMr - 1) / kGemmMr * kGemmMr * k; }
inline int64_t gemm_packed_b_floats(int64_t tn, int64_t k) { return (tn + kGemmNr - 1) / kGemmNr * kGemmNr * k; }

// op(a) (M, K) is a stored (M, K) with row stride ld, or trans: stored (K, M), row stride ld.
// bf16: the elements are bf16. Packs op(a)'s rows [i0, i0 + tm), all of K, into dst.
void gemm_pack_a(float* dst, const void* a, bool bf16, int64_t ld, bool trans, int64_t i0, int64_t tm, int64_t k);
// op(b) (K, N) is b stored (K, N) with row stride ld, or trans: stored (N, K), row stride ld.
// Packs op(b)'s columns [j0, j0 + tn), all of K, into dst.
void gemm_pack_b(float* dst, const void* b, bool bf16, int64_t ld, bool trans, int64_t j0, int64_t tn, int64_t k);
// c (tm, tn), row stride ldc, = op(a)'s rows times the packed op(b) (tm <= 256, tn <= 256).
// op(a)'s rows are a_packed's panels, or (a_rows not null: f32 a stored (M, K), row i of the tile
// at a_rows + i * lda) read in place, and then a_packed holds only the last, partial panel (rows
// [tm - tm % kGemmMr, tm), packed by gemm_pack_a) when tm is not a multiple of kGemmMr.
void gemm_tile(float* c, int64_t ldc, const float* a_rows, int64_t lda, const float* a_packed,
               const float* b_packed, int64_t tm, int64_t tn, int64_t k);

}  // namespace strata::cpu
