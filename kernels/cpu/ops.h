// The CPU kernels: fast paths of every device op, forward and backward side by side.
// Raw pointers and sizes only; nothing here knows models, tiers or files (DESIGN §4).
// Each has a plain-loop twin in kernels/cpu/ref.h with the same argument order.
//
// Legend: N rows (tokens, = B*T), B batch, T tokens per row, C hidden, H heads, Hk kv heads,
// D head dim, V vocab, F ffn. Row-major throughout. Activations and gradients are f32;
// matrices may be bf16 (f32 accumulate). Conventions:
//   - input gradients are written (=); weight gradients are accumulated (+=);
//   - results are bitwise independent of the thread count (fixed chunking, fixed-order sums);
//   - in-place is allowed only where a comment says so.
#pragma once
#include <cstddef>
#include <cstdint>

#include "src/core/bf16.h"
#include "src/core/dtype.h"

namespace strata::cpu {

// ---- matmul ------------------------------------------------------------------------------
// c (M,N) = op(a) (M,K) · op(b) (K,N) + beta * c, with beta 0 (overwrite) or 1 (accumulate:
// c + the finished sum, the bits of the product into another buffer added to c).
// op(a) is a stored (M,K), or a^T with a stored (K,M) when trans_a; likewise b.
// Linear layer y = x W^T with W (O,I):  matmul(y, x, W, N, O, I, false, true, 0)
//                 dx = dy W:            matmul(dx, dy, W, N, I, O, false, false, 0)
//                 dW += dy^T x:         matmul(dW, dy, x, O, I, N, true, false, 1)
void matmul_f32(float* c, const float* a, const float* b, int64_t m, int64_t n, int64_t k,
                bool trans_a, bool trans_b, float beta);
void matmul_bf16(float* c, const bf16* a, const bf16* b, int64_t m, int64_t n, int64_t k,
                 bool trans_a, bool trans_b, float beta);
// Whether oneDNN multiplies bf16 on this CPU (it needs AVX-512). Where it does not (an AVX2
// workstation), matmul_bf16 widens each 256 x 256 tile's operands to f32 (exact) as they are
// packed for strata's own AVX2 kernel (kernels/cpu/gemm_avx2.h), or without AVX2 runs
// matmul_bf16_widened: op(a) as (tm, K) rows and op(b) as (tn, K) rows widened into the working
// thread's scratch for oneDNN's f32 kernel. Either way the same products of bf16 values, f32 sums
// in that kernel's order. matmul_bf16_widened runs its path on any CPU (tests).
// matmul_f32_packs: whether f32 tiles run through strata's AVX2 kernel, their operands packed
// into its panels (an f32 a stored (M, K) read in place): on CPUs with AVX2 and FMA but no
// AVX-512, where oneDNN 2.x's f32 kernel ran well below the FMA peak (kernels/cpu/matmul.cpp).
// A thread keeps its matmul buffers from one call to the next (a 256 x 256 tile's product before
// beta = 1 adds it; the packed or widened tiles; the calling thread a packed b or a its team
// shares): matmul_scratch_bytes(k, dtype) per thread for calls of up to k,
// matmul_scratch_held_bytes what the calling thread holds.
bool matmul_bf16_native();
bool matmul_f32_packs();
void matmul_bf16_widened(float* c, const bf16* a, const bf16* b, int64_t m, int64_t n, int64_t k,
                         bool trans_a, bool trans_b, float beta);
size_t matmul_scratch_bytes(int64_t k, DType dtype);
size_t matmul_scratch_held_bytes();

// ---- RMSNorm (also per-head RMSNorm: n = N*H rows of c = D) -------------------------------
// out = weight * in * rstd, rstd = 1/sqrt(mean(in^2) + eps) saved per row (n).
void rmsnorm_forward(float* out, float* rstd, const float* in, const float* weight, int64_t n,
                     int64_t c, float eps);
// The forward that also writes out's bf16 rounding to out_b (the bf16 matmuls' operand), row by
// row while the row is in cache: out's bits are rmsnorm_forward's, out_b's cast_f32_to_bf16(out)'s.
void rmsnorm_forward_bf16(float* out, bf16* out_b, float* rstd, const float* in, const float* weight,
                          int64_t n, int64_t c, float eps);
void rmsnorm_backward(float* din, float* dweight, const float* dout, const float* in,
                      const float* weight, const float* rstd, int64_t n, int64_t c);

// ---- RoPE, Hugging Face rotate-half layout ------------------------------------------------
// x (N, nh, D); pos (N) position of each token; the first R = rot dims of each head turn (R even,
// <= D; 0: R = D), the other D - R pass unchanged (partial_rotary_factor < 1: Phi-4-mini's 0.75);
// inv_freq (R/2). angle = float(pos) * inv_freq[j] in f32, cos/sin in f32 (as HF computes them).
// out[j] = x[j] cos - x[j+R/2] sin, out[j+R/2] = x[j+R/2] cos + x[j] sin for j < R/2.
// In-place allowed (out == in, din == dout).
void rope_forward(float* out, const float* in, const int32_t* pos, const float* inv_freq,
                  int64_t n, int64_t nh, int64_t d, int64_t rot = 0);
void rope_backward(float* din, const float* dout, const int32_t* pos, const float* inv_freq,
                   int64_t n, int64_t nh, int64_t d, int64_t rot = 0);

// ---- SwiGLU: out = silu(gate) * up, elementwise over n = N*F ------------------------------
void swiglu_forward(float* out, const float* gate, const float* up, int64_t n);
// The forward that also writes out's bf16 rounding to out_b (the down matmul's operand) in the
// same pass: out's bits are swiglu_forward's, out_b's cast_f32_to_bf16(out)'s.
void swiglu_forward_bf16(float* out, bf16* out_b, const float* gate, const float* up, int64_t n);
// The backward with its outputs rounded to bf16 (the bf16 matmuls' operands): swiglu_backward's
// values, then cast_f32_to_bf16's rounding, in one pass.
void swiglu_backward_bf16(bf16* dgate, bf16* dup, const float* dout, const float* gate,
                          const float* up, int64_t n);
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                     const float* up, int64_t n);

// ---- bias: y (N,O) += b (O); db += column sums of dy --------------------------------------
void bias_forward(float* y, const float* b, int64_t n, int64_t o);
void bias_backward(float* db, const float* dy, int64_t n, int64_t o);

// ---- embedding: out (N,C) = table[ids]; dtable (V,C) += scatter of dout, in token order ----
void embedding_forward(float* out, const float* table, const int32_t* ids, int64_t n, int64_t c);
void embedding_forward_bf16(float* out, const bf16* table, const int32_t* ids, int64_t n,
                            int64_t c);
void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int64_t n,
                        int64_t c);

// ---- mixture of experts: routed rows back to tokens (twin: kernels/cpu/ref/moe.h) ----------
// out (N,C) += sum_j w[r] y[r] over token t's k rows r = token_row[t*k + j] (w null: 1), in j order;
// moe_combine_backward writes dy (M,C) = w[r] dout[row_token[r]] and dw (M) = dout[row_token[r]] . y[r]
// (dw null: skipped).
void moe_combine_forward(float* out, const float* y, const float* w, const int32_t* token_row, int64_t n,
                         int64_t k, int64_t c);
void moe_combine_backward(float* dy, float* dw, const float* dout, const float* y, const float* w,
                          const int32_t* row_token, int64_t m, int64_t c);

// ---- causal GQA attention, flash-style (memory O(tile), never O(T^2)) ---------------------
// q (B,T,H,D), k and v (B,T,Hk,D), out (B,T,H,D), lse (B,T,H) log-sum-exp saved for backward.
// Head h reads kv head h / (H/Hk). doc_start (B,T) or null: query t sees keys s with
// doc_start[b,t] <= s <= t (packed rows: documents never attend across each other).
// dk, dv (B,T,Hk,D) are written.
// window > 0: a sliding window as well, query t sees keys s > t - window only (transformers'
// sliding_window_overlay: kv_idx > q_idx - window); window <= 0: none. The fp64 twin
// kernels/cpu/ref/attention.h takes the same window.
// dot_type f32 or bf16: with bf16, q, k, v and dout are rounded to bf16 (nearest even) wherever
// they are read, so the forward equals the f32 op on rounded inputs; products accumulate in f32
// and softmax, lse, P and dS are formed in f32. The backward also rounds P and dS to bf16 where
// they weight the sums over tokens (dV = P^T dO, dK = dS^T Q, dQ = dS K), as FlashAttention's
// bf16 backward does, so its gradients differ from the f32 op on rounded inputs by up to the
// weights' rounding (2^-9 relative each). The CUDA kernel does the same.
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const int32_t* doc_start, int64_t b, int64_t t, int64_t h, int64_t hk,
                       int64_t d, float scale, DType dot_type, int64_t window = 0);
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        const int32_t* doc_start, int64_t b, int64_t t, int64_t h, int64_t hk,
                        int64_t d, float scale, DType dot_type, int64_t window = 0);
// The bf16 score products (Q K^T, dO V^T) and the backward's sums over tokens run on AMX tiles
// where the CPU and OS offer AMX-BF16 (amx_bf16, kernels/cpu/amx.h), else on vdpbf16ps where the
// CPU has AVX512-BF16 (avx512_bf16), else as f32 products of the rounded values (portable); the
// three round their sums differently, so their last bits may differ (and a weight that f32
// rounding tips across a bf16 tie rounds the other way). The plain entries above use the best
// the CPU offers; the _isa entries let tests run each.
enum class AttentionIsa : uint8_t { portable, avx512_bf16, amx_bf16 };
const char* attention_isa_name(AttentionIsa isa);
bool attention_isa_supported(AttentionIsa isa);
AttentionIsa attention_isa_best();
// What the plain entries run: the ISA named by the environment variable STRATA_ATTENTION_ISA
// (portable, avx512_bf16 or amx_bf16: to reproduce another machine's bits, or to measure one
// kernel against another) when set, else attention_isa_best(); read once.
// attention_isa_choose(value) is that choice for a given value (null or empty: the best); it
// throws for an unknown name or one this CPU cannot run.
AttentionIsa attention_isa_active();
AttentionIsa attention_isa_choose(const char* want);
void attention_forward_isa(float* out, float* lse, const float* q, const float* k, const float* v,
                           const int32_t* doc_start, int64_t b, int64_t t, int64_t h, int64_t hk,
                           int64_t d, float scale, DType dot_type, AttentionIsa isa, int64_t window = 0);
// On vdpbf16ps or AMX the backward's second pass (dQ) reads the bf16 dS its first pass (dK, dV) formed,
// kept for every visible 64 x 64 tile pair (B·H·q_tiles(q_tiles + 1)/2 tiles of 8 KiB, a
// transient of the call), instead of recomputing P and dS, when they fit in
// stored_ds_max_bytes; the bits are the same either way.
// attention_stored_ds_bytes: the bytes kept (0 for f32 dots and on the portable kernel).
constexpr size_t kAttentionStoredDsMaxBytes = size_t(32) << 20;
size_t attention_stored_ds_bytes(int64_t b, int64_t t, int64_t h, int64_t d, DType dot_type, AttentionIsa isa);
// What a thread keeps from one attention call to the next (the portable kernel: the inputs
// head-major in f32, bf16-rounded with bf16 dots, and the keys' and values' transposes,
// 2·B·Hk·D·(T rounded up to 64, plus 16) floats; the vdpbf16ps and AMX kernels: the inputs' bf16
// copies and the kept dS), sized by the largest call it made: attention_scratch_bytes for a
// forward and backward of that shape; attention_scratch_held_bytes what the calling thread holds.
size_t attention_scratch_bytes(int64_t b, int64_t t, int64_t h, int64_t hk, int64_t d, DType dot_type,
                               AttentionIsa isa, size_t stored_ds_max_bytes = kAttentionStoredDsMaxBytes);
size_t attention_scratch_held_bytes();
void attention_backward_isa(float* dq, float* dk, float* dv, const float* dout, const float* q,
                            const float* k, const float* v, const float* out, const float* lse,
                            const int32_t* doc_start, int64_t b, int64_t t, int64_t h, int64_t hk,
                            int64_t d, float scale, DType dot_type, AttentionIsa isa,
                            size_t stored_ds_max_bytes = kAttentionStoredDsMaxBytes, int64_t window = 0);

// ---- lm_head + cross-entropy over the whole vocabulary (never all N x V logits at once) ----
// h (N,C) final hidden, w (V,C) lm_head, targets (N) with -100 ignored.
// Returns the sum of -log softmax(h w^T)[target] over counted rows; *count = counted rows.
// The backward variant also writes dh (N,C) and accumulates dw (V,C) with the gradient of
// grad_scale * (returned sum). These are the one-chunk case (v0 = 0, vc = V) of the chunked
// functions below, which they call. With bf16 w, h and the logit gradient are rounded to bf16
// for the matmuls.
double lm_head_ce_forward(int64_t* count, const float* h, const float* w, const int32_t* targets,
                          int64_t n, int64_t c, int64_t v);
double lm_head_ce_forward_bf16(int64_t* count, const float* h, const bf16* w,
                               const int32_t* targets, int64_t n, int64_t c, int64_t v);
double lm_head_ce_backward(float* dh, float* dw, int64_t* count, const float* h, const float* w,
                           const int32_t* targets, int64_t n, int64_t c, int64_t v,
                           float grad_scale);
double lm_head_ce_backward_bf16(float* dh, float* dw, int64_t* count, const float* h,
                                const bf16* w, const int32_t* targets, int64_t n, int64_t c,
                                int64_t v, float grad_scale);

// ---- the same loss with lm_head streamed in vocab chunks ----------------------------------
// The head's device footprint then scales with the chunk, not with V. w_chunk (vc,C) holds
// the vocab rows [v0, v0 + vc) of w (V,C). Two passes over the chunks:
//   stats pass:   for each counted row i, logits z = h_i · w_chunk^T (vc) update the row's
//                 online-softmax statistics stats (N,3) = {running max M (an f32 value),
//                 running sum S = Σ exp(z - M) (double), the target's logit}. first = the
//                 chunk initialises them: M = max z, S = Σ double(exp(z - M)); later chunks
//                 combine in double: M' = max(M, m), S' = S exp(M - M') + s exp(m - M').
//   loss:         Σ over counted rows, in row order, of M + log S - z_target.
//   backward pass: dlogits = (exp(z - M) / S - onehot) * grad_scale recomputed per chunk;
//                 dh (N,C) += dlogits · w_chunk and dw_chunk (vc,C) += dlogits^T · h (both
//                 accumulated: the caller zeroes dh once before the first chunk).
// Kept logits: keep_logits (N, vc) not null, the stats pass leaves the chunk's logits there (the
// rows the pass computes, in its own layout); the backward given them as kept_logits reads them
// instead of recomputing (one matmul of three saved) and overwrites them. The same bits either
// way: the logits come from the same matmul. Null: recomputed.
// Ignored rows (-100) are left out of the matmuls; their stats are zeroed by the first chunk
// and their dh is not touched. With bf16 w, h and dlogits are rounded to bf16 for the
// matmuls. Thread-count independent like the rest.
void lm_head_ce_chunk_stats(double* stats, const float* h, const float* w_chunk,
                            const int32_t* targets, int64_t n, int64_t c, int64_t v, int64_t v0,
                            int64_t vc, bool first, float* keep_logits);
void lm_head_ce_chunk_stats_bf16(double* stats, const float* h, const bf16* w_chunk,
                                 const int32_t* targets, int64_t n, int64_t c, int64_t v,
                                 int64_t v0, int64_t vc, bool first, float* keep_logits);
// The same stats pass (the same bits in stats) and ent (N) = Σ exp(z - max) (z - max), rescaled
// as the max moves, for each counted row (first: set): row i's softmax entropy is log(sum) -
// ent / sum (GRPO's entropy metric; twin kernels/cpu/ref/cross_entropy.h ce_ref_entropy).
void lm_head_ce_chunk_stats_entropy(double* stats, double* ent, const float* h, const float* w_chunk,
                                    const int32_t* targets, int64_t n, int64_t c, int64_t v, int64_t v0,
                                    int64_t vc, bool first, float* keep_logits);
void lm_head_ce_chunk_stats_entropy_bf16(double* stats, double* ent, const float* h, const bf16* w_chunk,
                                         const int32_t* targets, int64_t n, int64_t c, int64_t v, int64_t v0,
                                         int64_t vc, bool first, float* keep_logits);
double lm_head_ce_stats_loss(int64_t* count, const double* stats, const int32_t* targets,
                             int64_t n, int64_t v);
// What a thread keeps from one call to the next (its row tiles: h, logits, the bf16 copy of
// dlogits, dh), sized by the largest call: lm_head_ce_scratch_bytes for calls over n rows and
// chunks of up to vc vocab rows of w_dtype; lm_head_ce_scratch_held_bytes what the calling thread
// holds (f32 and bf16 heads together).
size_t lm_head_ce_scratch_bytes(int64_t n, int64_t c, int64_t vc, DType w_dtype);
size_t lm_head_ce_scratch_held_bytes();
// dw_chunk may be null: dh only (a frozen head, LoRA), the weight gradient's matmul skipped.
void lm_head_ce_chunk_backward(float* dh, float* dw_chunk, const float* h, const float* w_chunk,
                               const double* stats, const int32_t* targets, int64_t n, int64_t c,
                               int64_t v, int64_t v0, int64_t vc, float grad_scale, float* kept_logits);
void lm_head_ce_chunk_backward_bf16(float* dh, float* dw_chunk, const float* h,
                                    const bf16* w_chunk, const double* stats,
                                    const int32_t* targets, int64_t n, int64_t c, int64_t v,
                                    int64_t v0, int64_t vc, float grad_scale, float* kept_logits);

// ---- per-sequence sums and a per-token weighted backward (preference objectives) -----------
// seq (N) gives each row's sequence in [0, num_seqs), or -1 for none. From the final stats,
// seq_sums (num_seqs, 2) = {Σ log p(target), count} over the counted rows of each sequence
// (log p = target logit - max - log sum), summed in row order; written, not accumulated.
// The weighted backward is lm_head_ce_chunk_backward with row i's dlogits scaled by
// token_weight[i] * grad_scale: d loss / d logits_i = w_i (softmax - onehot).
void lm_head_ce_stats_seq_sums(double* seq_sums, const double* stats, const int32_t* targets,
                               const int32_t* seq, int64_t n, int64_t v, int64_t num_seqs);
void lm_head_ce_chunk_backward_weighted(float* dh, float* dw_chunk, const float* h,
                                        const float* w_chunk, const double* stats,
                                        const int32_t* targets, const float* token_weight,
                                        int64_t n, int64_t c, int64_t v, int64_t v0, int64_t vc,
                                        float grad_scale, float* kept_logits);
void lm_head_ce_chunk_backward_weighted_bf16(float* dh, float* dw_chunk, const float* h,
                                             const bf16* w_chunk, const double* stats,
                                             const int32_t* targets, const float* token_weight,
                                             int64_t n, int64_t c, int64_t v, int64_t v0,
                                             int64_t vc, float grad_scale, float* kept_logits);

// ---- elementwise helpers ------------------------------------------------------------------
void add_inplace(float* y, const float* x, int64_t n);  // y += x
// GeGLU (Gemma's MLP, twin kernels/cpu/ref/geglu.h): out (n) = gelu_tanh(gate) * up, PyTorch's
// gelu(approximate="tanh"); the backward writes dgate = dout * up * gelu_tanh'(gate) and
// dup = dout * gelu_tanh(gate).
void geglu_forward(float* out, const float* gate, const float* up, int64_t n);
void geglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n);
// y (n) = a x + b (y may be x): Gemma's (1 + w) norm weights and its embedding scale.
void affine(float* y, const float* x, float a, float b, int64_t n);
void cast_f32_to_bf16(bf16* out, const float* in, int64_t n);
void cast_bf16_to_f32(float* out, const bf16* in, int64_t n);

}  // namespace strata::cpu
