// The CUDA kernels: host-callable launchers of every device op, forward and backward side by
// side, in the argument order of kernels/cpu/ops.h (which documents shapes and semantics):
// outputs, inputs, saved tensors, sizes, then the cuBLAS handle (where one is used) and the
// stream last (STYLE.md §2). Raw device pointers and sizes only; nothing here knows models or tiers.
// Every launcher checks its sizes (strata::Error), enqueues on `stream` and returns at once.
//
// Legend: N rows (= B*T), B batch, T tokens per row, C hidden, H heads, Hk kv heads, D head
// dim, V vocab. Conventions as on the CPU: input gradients written, weight gradients
// accumulated, results independent of launch timing (no float atomics: every output element
// is summed by one thread in a fixed order).
//
// `error_word` (one device int, may be null) collects KernelError bits (below)
// when a kernel finds bad input it cannot report by throwing: a target outside [0, V), a
// doc_start outside [0, t], a negative token id.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "src/core/adamw_constants.h"
#include "src/core/bf16.h"

namespace strata::cuda {

// Bits of the kernel error word: kernels that find bad input set a bit; the device reports it
// at the next stream synchronize, as the CPU backend reports an exception from queued work.
enum KernelError : int {
  kErrorTarget = 1,    // lm_head_ce: target outside [0, V) and not -100
  kErrorDocStart = 2,  // attention: doc_start[b,t] outside [0, t]
  kErrorTokenId = 4,   // embedding: negative token id
};

// ---- matmul (cuBLAS, f32 accumulate) -------------------------------------------------------
// c (M,N) = op(a) (M,K) · op(b) (K,N) + beta * c, row-major, beta 0 or 1; a and b both f32 or
// both bf16 (bf16 = true). Runs on the stream the handle is set to here.
void matmul(float* c, const void* a, const void* b, bool bf16, int64_t m, int64_t n, int64_t k,
            bool trans_a, bool trans_b, float beta, cublasHandle_t handle, cudaStream_t stream);

// ---- RMSNorm (also per-head: n = N*H rows of c = D) ----------------------------------------
void rmsnorm_forward(float* out, float* rstd, const float* in, const float* weight, int64_t n,
                     int64_t c, float eps, cudaStream_t stream);
// Also out's bf16 rounding into out_b, in the same pass (twin: cpu::rmsnorm_forward_bf16).
void rmsnorm_forward_bf16(float* out, bf16* out_b, float* rstd, const float* in, const float* weight,
                          int64_t n, int64_t c, float eps, cudaStream_t stream);
void rmsnorm_backward(float* din, float* dweight, const float* dout, const float* in,
                      const float* weight, const float* rstd, int64_t n, int64_t c,
                      cudaStream_t stream);

// ---- RoPE, HF rotate-half; in-place allowed -------------------------------------------------
// rot: the leading dims of each head that turn (kernels/cpu/ops.h; 0: all d)
void rope_forward(float* out, const float* in, const int32_t* pos, const float* inv_freq,
                  int64_t n, int64_t nh, int64_t d, int64_t rot, cudaStream_t stream);
void rope_backward(float* din, const float* dout, const int32_t* pos, const float* inv_freq,
                   int64_t n, int64_t nh, int64_t d, int64_t rot, cudaStream_t stream);

// ---- SwiGLU, bias ----------------------------------------------------------------------------
void swiglu_forward(float* out, const float* gate, const float* up, int64_t n,
                    cudaStream_t stream);
// Also out's bf16 rounding into out_b, in the same pass (twin: cpu::swiglu_forward_bf16).
void swiglu_forward_bf16(float* out, bf16* out_b, const float* gate, const float* up, int64_t n,
                         cudaStream_t stream);
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                     const float* up, int64_t n, cudaStream_t stream);
// Its outputs rounded to bf16 in the same pass (twin: cpu::swiglu_backward_bf16).
void swiglu_backward_bf16(bf16* dgate, bf16* dup, const float* dout, const float* gate,
                          const float* up, int64_t n, cudaStream_t stream);
void bias_forward(float* y, const float* b, int64_t n, int64_t o, cudaStream_t stream);
void bias_backward(float* db, const float* dy, int64_t n, int64_t o, cudaStream_t stream);

// ---- embedding: table f32 or bf16 (table_bf16) -----------------------------------------------
void embedding_forward(float* out, const void* table, bool table_bf16, const int32_t* ids,
                       int64_t n, int64_t c, int* error_word, cudaStream_t stream);
void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int64_t n,
                        int64_t c, int* error_word, cudaStream_t stream);

// ---- causal GQA attention, flash-style, document-masked --------------------------------------
// Head dim d <= kAttentionMaxHeadDim. bf16_dots: q, k, v and dout rounded to bf16 on load, as the
// CPU kernel's dot_type bf16 (kernels/cpu/ops.h). window > 0: query t also stops seeing keys s
// with t - s >= window (sliding-window layers); window <= 0: no window.
constexpr int64_t kAttentionMaxHeadDim = 128;
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const int32_t* doc_start, int64_t b, int64_t t, int64_t h, int64_t hk,
                       int64_t d, float scale, bool bf16_dots, int64_t window, int* error_word,
                       cudaStream_t stream);
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        const int32_t* doc_start, int64_t b, int64_t t, int64_t h, int64_t hk,
                        int64_t d, float scale, bool bf16_dots, int64_t window, int* error_word,
                        cudaStream_t stream);

// The same op on tensor cores for bf16 dots (kernels/cuda/attention_tc.cu, WMMA): q, k, v and
// dout f32 in memory, rounded to bf16 as they are loaded; products summed in f32; P rounded to
// bf16 where it weights V in the forward too (FlashAttention-2), P and dS in the backward as
// above. Head dim d <= kAttentionTcMaxHeadDim; window as above. Deterministic. The backward stages
// D_i in dq, so dq may share no bytes with its inputs (checked: an error, nothing launched).
constexpr int64_t kAttentionTcMaxHeadDim = 256;
void attention_tc_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                          const int32_t* doc_start, int64_t b, int64_t t, int64_t h, int64_t hk,
                          int64_t d, float scale, int64_t window, int* error_word,
                          cudaStream_t stream);
void attention_tc_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                           const float* k, const float* v, const float* out, const float* lse,
                           const int32_t* doc_start, int64_t b, int64_t t, int64_t h, int64_t hk,
                           int64_t d, float scale, int64_t window, int* error_word,
                           cudaStream_t stream);

// ---- lm_head + cross-entropy with lm_head in vocab chunks (kernels/cpu/ops.h: lm_head_ce_chunk_*;
// the whole vocabulary is the one-chunk case v0 = 0, vc = V)
// w_chunk (vc,C) holds vocab rows [v0, v0 + vc); stats (N,3) double = {running max, running sum
// of exp(z - max), target logit}, initialised by the chunk with first = true. The stats pass
// and the backward pass take a workspace (device) of lm_head_ce_workspace_bytes(c, vc).
size_t lm_head_ce_workspace_bytes(int64_t c, int64_t v);
// The backward
// accumulates dh (N,C) += dlogits · w_chunk and dw_chunk (vc,C) += dlogits^T · h. The loss adds
// Σ over counted rows (in row order) of max + log(sum) - target logit into *loss_sum.
// keep_logits / kept_logits (N, vc, device; null: recomputed) as on the CPU (kernels/cpu/ops.h,
// "Kept logits"): here row r of the chunk's logits is at r * vc, ignored rows included.
void lm_head_ce_chunk_stats(double* stats, const float* h, const void* w_chunk, bool w_bf16,
                            const int32_t* targets, int64_t n, int64_t c, int64_t v, int64_t v0,
                            int64_t vc, bool first, float* keep_logits, void* workspace, size_t workspace_bytes,
                            int* error_word, cublasHandle_t handle, cudaStream_t stream);
// ent (N, or null: none) = Σ exp(z - max) (z - max) per counted row, rescaled as the max moves
// (kernels/cpu/ops.h lm_head_ce_chunk_stats_entropy); stats the same bits as without it.
void lm_head_ce_chunk_stats_entropy(double* stats, double* ent, const float* h, const void* w_chunk, bool w_bf16,
                                    const int32_t* targets, int64_t n, int64_t c, int64_t v, int64_t v0,
                                    int64_t vc, bool first, float* keep_logits, void* workspace,
                                    size_t workspace_bytes, int* error_word, cublasHandle_t handle,
                                    cudaStream_t stream);
void lm_head_ce_stats_loss(double* loss_sum, const double* stats, const int32_t* targets,
                           int64_t n, int64_t v, cudaStream_t stream);
// token_weight (N, or null: all 1) scales row i's dlogits by token_weight[i] on top of
// grad_scale (the preference objectives' per-token weights).
void lm_head_ce_chunk_backward(float* dh, float* dw_chunk, const float* h, const void* w_chunk,
                               bool w_bf16, const double* stats, const int32_t* targets,
                               const float* token_weight, int64_t n, int64_t c, int64_t v,
                               int64_t v0, int64_t vc, float grad_scale, float* kept_logits, void* workspace,
                               size_t workspace_bytes, int* error_word, cublasHandle_t handle,
                               cudaStream_t stream);
// seq_sums (num_seqs, 2) = {Σ log p(target), count} per sequence (seq (N): each row's sequence,
// or -1), summed in row order from the final stats; written, not accumulated.
void lm_head_ce_stats_seq_sums(double* seq_sums, const double* stats, const int32_t* targets,
                               const int32_t* seq, int64_t n, int64_t v, int64_t num_seqs,
                               cudaStream_t stream);

// ---- elementwise ------------------------------------------------------------------------------
void add_inplace(float* y, const float* x, int64_t n, cudaStream_t stream);  // y += x
void cast_f32_to_bf16(bf16* out, const float* in, int64_t n, cudaStream_t stream);
void cast_bf16_to_f32(float* out, const bf16* in, int64_t n, cudaStream_t stream);

// ---- AdamW (optional; the engine keeps AdamW on the CPU by design, see adamw.cu) --------------
// c: the CPU AdamW's f32 constants (src/core/adamw_constants.h), so the GPU update gives the
// CPU's bits.
// n elements: master (f32), m and v (f32, or bf16 when moments_bf16) updated in place from
// grad; working (f32, or bf16 when working_bf16; may be null) receives the new master weights.
void adamw_update(float* master, void* m, void* v, bool moments_bf16, const float* grad,
                  void* working, bool working_bf16, int64_t n, const AdamWConstants& c,
                  cudaStream_t stream);

// ---- zeroth-order perturbations (kernels/common/zo_rng.h; twins: kernels/cpu/ref/zo.h) --------
// z (n) = z(seed, tensor, offset + i);  p (n, f32 or bf16 when p_bf16) += scale * z(...), in f32,
// bf16 rounded to nearest even once. Bit-identical to the CPU kernels (kernels/cpu/zo.h).
void zo_generate(float* z, uint64_t seed, uint32_t tensor, uint64_t offset, int64_t n,
                 cudaStream_t stream);
void zo_perturb(void* p, bool p_bf16, uint64_t seed, uint32_t tensor, uint64_t offset,
                float scale, int64_t n, cudaStream_t stream);

}  // namespace strata::cuda
