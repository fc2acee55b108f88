// lm_head + softmax cross-entropy on CUDA with lm_head in vocab chunks (twin: kernels/cpu/ref/
// cross_entropy.h; CPU fast path kernels/cpu/cross_entropy.cpp; the whole vocabulary is the
// one-chunk case v0 = 0, vc = V). Rows go in tiles of kCeTileRows, so at most
// kCeTileRows x vc logits exist at once, in a caller-provided workspace; the matmuls go
// through cuBLAS (matmul.cu). Unlike the CPU path, ignored rows (-100) are not compacted away
// (that would need the targets on the host): they ride through the matmuls and get zero loss
// and zero gradient.
//
// Per tile: logits = h_tile · w_chunk^T (h rounded to bf16 first when w is bf16). The stats
// pass updates each row's running max and sum of exps (one block per row, thread 0 combines in
// double); one thread sums the loss from the stats in row order (deterministic, as on the
// CPU); the backward pass recomputes the tile's logits into dlogits = (softmax - onehot) *
// grad_scale (also rounded to bf16 for bf16 w) and accumulates dh += dlogits · w_chunk and
// dw_chunk += dlogits^T · h. Kept logits (ops.h): the stats pass computes each tile's logits into
// the caller's (N, vc) buffer instead of the workspace, and the backward works on them in place
// instead of recomputing them (the same matmul, so the same bits).
#include "kernels/common/ce_workspace.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"
#include "src/core/align.h"

namespace strata::cuda {
namespace {

constexpr int32_t kCeIgnoreIndex = -100;
constexpr int kCeThreads = 256;

// The workspace, carved in this order.
struct CeWorkspace {
  float* logits;          // (chunk, vc) logits, then dlogits
  __nv_bfloat16* h_bf16;  // (chunk, C) bf16 w only
  __nv_bfloat16* dl_bf16; // (chunk, vc) bf16 w only
};

CeWorkspace ce_carve(void* base, int64_t c, int64_t v) {
  char* p = static_cast<char*>(base);
  CeWorkspace ws;
  ws.logits = reinterpret_cast<float*>(p);
  p += align_up(size_t(kCeTileRows * v) * sizeof(float));
  ws.h_bf16 = reinterpret_cast<__nv_bfloat16*>(p);
  p += align_up(size_t(kCeTileRows * c) * sizeof(__nv_bfloat16));
  ws.dl_bf16 = reinterpret_cast<__nv_bfloat16*>(p);
  return ws;
}

__global__ void ce_cast_kernel(__nv_bfloat16* out, const float* in, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = bf16_from(in[i]);
}

// Stats pass, grid (rows of the tile), block kCeThreads. x: the tile's logits (rows, vc);
// stats, ent and targets start at the tile's first row. ent (null: none): the entropy
// accumulator Σ exp(z - max) (z - max), rescaled as the max moves (ops.h).
__global__ void ce_chunk_stats_kernel(double* stats, double* ent, const float* x, const int32_t* targets,
                                      int64_t v, int64_t v0, int64_t vc, int first,
                                      int* error_word) {
  __shared__ float fscratch[kWarp];
  __shared__ double dscratch[kWarp];
  const int64_t r = blockIdx.x;
  const float* xr = x + r * vc;  // (vc)
  double* st = stats + 3 * r;
  const int32_t target = targets[r];
  const bool bad = target != kCeIgnoreIndex && (target < 0 || target >= v);
  if (bad && threadIdx.x == 0) kernel_error_raise(error_word, kErrorTarget);
  if (target == kCeIgnoreIndex || bad) {  // uniform over the block
    if (first && threadIdx.x == 0) st[0] = st[1] = st[2] = 0.0;
    if (first && ent && threadIdx.x == 0) ent[r] = 0.0;
    return;
  }
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < vc; j += kCeThreads) m = fmaxf(m, xr[j]);
  m = block_max(m, fscratch);
  double sum = 0.0;
  for (int64_t j = threadIdx.x; j < vc; j += kCeThreads) sum += double(expf(xr[j] - m));
  sum = block_sum(sum, dscratch);
  double dot = 0.0;  // Σ exp(z - m) (z - m), the entropy accumulator's share of this chunk
  if (ent) {
    for (int64_t j = threadIdx.x; j < vc; j += kCeThreads)
      dot += double(expf(xr[j] - m)) * (double(xr[j]) - double(m));
    dot = block_sum(dot, dscratch);
  }
  if (threadIdx.x != 0) return;
  if (first) {
    st[0] = double(m);
    st[1] = sum;
    st[2] = 0.0;
    if (ent) ent[r] = dot;
  } else {
    const double mx = fmax(st[0], double(m));
    if (ent)
      ent[r] = exp(st[0] - mx) * (ent[r] + (st[0] - mx) * st[1]) + exp(double(m) - mx) * (dot + (double(m) - mx) * sum);
    st[1] = st[1] * exp(st[0] - mx) + sum * exp(double(m) - mx);
    st[0] = mx;
  }
  const int64_t t = int64_t(target) - v0;
  if (t >= 0 && t < vc) st[2] = double(xr[t]);
}

// Backward pass, grid (rows of the tile), block kCeThreads: the tile's logits become dlogits =
// (exp(z - max) / sum - onehot) * grad_scale (and their bf16 copy when x_bf16 != null).
// token_weight (rows of the tile, or null: all 1) scales each row's dlogits on top of grad_scale.
__global__ void ce_chunk_grad_kernel(float* x, __nv_bfloat16* x_bf16, const double* stats,
                                     const int32_t* targets, const float* token_weight, int64_t v,
                                     int64_t v0, int64_t vc, float grad_scale, int* error_word) {
  const int64_t r = blockIdx.x;
  float* xr = x + r * vc;  // (vc)
  const int32_t target = targets[r];
  const bool bad = target != kCeIgnoreIndex && (target < 0 || target >= v);
  if (bad && threadIdx.x == 0) kernel_error_raise(error_word, kErrorTarget);
  if (target == kCeIgnoreIndex || bad) {
    for (int64_t j = threadIdx.x; j < vc; j += kCeThreads) {
      xr[j] = 0.f;
      if (x_bf16) x_bf16[r * vc + j] = bf16_from(0.f);
    }
    return;
  }
  const double* st = stats + 3 * r;
  const float m = float(st[0]);
  const float inv_sum = float(1.0 / st[1]);
  const float scale = token_weight ? grad_scale * token_weight[r] : grad_scale;
  const int64_t t = int64_t(target) - v0;
  for (int64_t j = threadIdx.x; j < vc; j += kCeThreads) {
    float g = expf(xr[j] - m) * inv_sum * scale;
    if (j == t) g -= scale;
    xr[j] = g;
    if (x_bf16) x_bf16[r * vc + j] = bf16_from(g);
  }
}

// One thread: *loss_sum += Σ over counted rows, in row order, of max + log(sum) - target logit.
__global__ void ce_stats_loss_kernel(double* loss_sum, const double* stats, const int32_t* targets,
                                     int64_t n, int64_t v) {
  double acc = 0.0;
  for (int64_t r = 0; r < n; ++r) {
    const int32_t t = targets[r];
    if (t < 0 || t >= v) continue;  // ignored (-100); a bad id was reported by the stats pass
    acc += stats[3 * r] + log(stats[3 * r + 1]) - stats[3 * r + 2];
  }
  *loss_sum += acc;
}

// One thread per sequence: seq_sums[q] = {Σ log p(target), count} over the counted rows with
// seq == q, in row order (deterministic, as on the CPU).
__global__ void ce_stats_seq_sums_kernel(double* seq_sums, const double* stats, const int32_t* targets,
                                         const int32_t* seq, int64_t n, int64_t v, int64_t num_seqs) {
  const int64_t q = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (q >= num_seqs) return;
  double acc = 0.0, count = 0.0;
  for (int64_t r = 0; r < n; ++r) {
    const int32_t t = targets[r];
    if (t < 0 || t >= v || seq[r] != q) continue;
    acc += stats[3 * r + 2] - stats[3 * r] - log(stats[3 * r + 1]);
    count += 1.0;
  }
  seq_sums[2 * q] = acc;
  seq_sums[2 * q + 1] = count;
}

// Checks shared by the chunk launchers.
void ce_chunk_check(int64_t n, int64_t c, int64_t v, int64_t v0, int64_t vc, size_t workspace_bytes) {
  STRATA_CHECK(n >= 0 && c > 0 && v > 0, "lm_head_ce chunk: sizes must be positive (got n=", n,
               " c=", c, " v=", v, ")");
  STRATA_CHECK(v0 >= 0 && vc > 0 && v0 + vc <= v, "lm_head_ce chunk: vocab rows [", v0, ", ",
               v0 + vc, ") are not a non-empty range inside [0, ", v, ")");
  STRATA_CHECK(workspace_bytes >= lm_head_ce_workspace_bytes(c, vc), "lm_head_ce chunk: workspace of ",
               workspace_bytes, " bytes is smaller than the ", lm_head_ce_workspace_bytes(c, vc),
               " it needs");
}

// Tile [r0, r0 + nr) of the rows: h rounded to bf16 into the workspace when w is bf16, then
// logits (nr, vc) = h_tile · w_chunk^T unless compute is false (the kept logits already hold
// them). Returns h_tile as the matmuls read it.
const void* ce_tile_logits(float* logits, const CeWorkspace& ws, const float* h, const void* w_chunk, bool w_bf16,
                           int64_t r0, int64_t nr, int64_t c, int64_t vc, bool compute, cublasHandle_t handle,
                           cudaStream_t stream) {
  const void* h_tile = h + r0 * c;  // (nr, C)
  if (w_bf16) {
    STRATA_LAUNCH(ce_cast_kernel, grid_blocks(nr * c, kCeThreads), kCeThreads, 0, stream, ws.h_bf16,
                  h + r0 * c, nr * c);
    STRATA_CUDA_CHECK_LAUNCH("lm_head_ce cast");
    h_tile = ws.h_bf16;
  }
  if (compute) matmul(logits, h_tile, w_chunk, w_bf16, nr, vc, c, false, true, 0.f, handle, stream);
  return h_tile;
}

}  // namespace

size_t lm_head_ce_workspace_bytes(int64_t c, int64_t v) {
  static_assert(sizeof(__nv_bfloat16) == 2, "ce_carve's layout is ce_workspace.h's");
  return lm_head_ce_tile_workspace_bytes(c, v);
}

void lm_head_ce_chunk_stats(double* stats, const float* h, const void* w_chunk, bool w_bf16,
                            const int32_t* targets, int64_t n, int64_t c, int64_t v, int64_t v0,
                            int64_t vc, bool first, float* keep_logits, void* workspace, size_t workspace_bytes,
                            int* error_word, cublasHandle_t handle, cudaStream_t stream) {
  lm_head_ce_chunk_stats_entropy(stats, nullptr, h, w_chunk, w_bf16, targets, n, c, v, v0, vc, first, keep_logits,
                                 workspace, workspace_bytes, error_word, handle, stream);
}

void lm_head_ce_chunk_stats_entropy(double* stats, double* ent, const float* h, const void* w_chunk, bool w_bf16,
                                    const int32_t* targets, int64_t n, int64_t c, int64_t v, int64_t v0,
                                    int64_t vc, bool first, float* keep_logits, void* workspace,
                                    size_t workspace_bytes, int* error_word, cublasHandle_t handle,
                                    cudaStream_t stream) {
  ce_chunk_check(n, c, v, v0, vc, workspace_bytes);
  const CeWorkspace ws = ce_carve(workspace, c, vc);
  for (int64_t r0 = 0; r0 < n; r0 += kCeTileRows) {
    const int64_t nr = n - r0 < kCeTileRows ? n - r0 : kCeTileRows;
    float* logits = keep_logits ? keep_logits + r0 * vc : ws.logits;  // the stats kernel only reads them
    ce_tile_logits(logits, ws, h, w_chunk, w_bf16, r0, nr, c, vc, true, handle, stream);
    STRATA_LAUNCH(ce_chunk_stats_kernel, unsigned(nr), kCeThreads, 0, stream, stats + 3 * r0,
                  ent ? ent + r0 : nullptr, logits, targets + r0, v, v0, vc, first ? 1 : 0, error_word);
    STRATA_CUDA_CHECK_LAUNCH("lm_head_ce chunk stats");
  }
}

void lm_head_ce_stats_loss(double* loss_sum, const double* stats, const int32_t* targets,
                           int64_t n, int64_t v, cudaStream_t stream) {
  STRATA_CHECK(n >= 0 && v > 0, "lm_head_ce loss: sizes must be positive (got n=", n, " v=", v, ")");
  STRATA_LAUNCH(ce_stats_loss_kernel, 1, 1, 0, stream, loss_sum, stats, targets, n, v);
  STRATA_CUDA_CHECK_LAUNCH("lm_head_ce stats loss");
}

void lm_head_ce_stats_seq_sums(double* seq_sums, const double* stats, const int32_t* targets,
                               const int32_t* seq, int64_t n, int64_t v, int64_t num_seqs,
                               cudaStream_t stream) {
  STRATA_CHECK(n >= 0 && v > 0 && num_seqs >= 0, "lm_head_ce seq sums: sizes must be positive (got n=", n,
               " v=", v, " sequences=", num_seqs, ")");
  if (num_seqs == 0) return;
  STRATA_LAUNCH(ce_stats_seq_sums_kernel, grid_blocks(num_seqs, kCeThreads), kCeThreads, 0, stream, seq_sums,
                stats, targets, seq, n, v, num_seqs);
  STRATA_CUDA_CHECK_LAUNCH("lm_head_ce stats seq sums");
}

// dw_chunk null: dh only (a frozen head, LoRA), the weight gradient's matmul skipped.
void lm_head_ce_chunk_backward(float* dh, float* dw_chunk, const float* h, const void* w_chunk,
                               bool w_bf16, const double* stats, const int32_t* targets,
                               const float* token_weight, int64_t n, int64_t c, int64_t v,
                               int64_t v0, int64_t vc, float grad_scale, float* kept_logits, void* workspace,
                               size_t workspace_bytes, int* error_word, cublasHandle_t handle,
                               cudaStream_t stream) {
  ce_chunk_check(n, c, v, v0, vc, workspace_bytes);
  const CeWorkspace ws = ce_carve(workspace, c, vc);
  for (int64_t r0 = 0; r0 < n; r0 += kCeTileRows) {
    const int64_t nr = n - r0 < kCeTileRows ? n - r0 : kCeTileRows;
    float* logits = kept_logits ? kept_logits + r0 * vc : ws.logits;  // then dlogits, in place
    const void* h_tile = ce_tile_logits(logits, ws, h, w_chunk, w_bf16, r0, nr, c, vc, !kept_logits, handle, stream);
    STRATA_LAUNCH(ce_chunk_grad_kernel, unsigned(nr), kCeThreads, 0, stream, logits,
                  w_bf16 ? ws.dl_bf16 : nullptr, stats + 3 * r0, targets + r0,
                  token_weight ? token_weight + r0 : nullptr, v, v0, vc, grad_scale, error_word);
    STRATA_CUDA_CHECK_LAUNCH("lm_head_ce chunk grad");
    const void* dlogits = w_bf16 ? static_cast<const void*>(ws.dl_bf16) : logits;
    matmul(dh + r0 * c, dlogits, w_chunk, w_bf16, nr, c, vc, false, false, 1.f, handle, stream);
    if (dw_chunk) matmul(dw_chunk, dlogits, h_tile, w_bf16, vc, c, nr, true, false, 1.f, handle, stream);
  }
}

}  // namespace strata::cuda
