// lm_head + cross-entropy on the CPU, with lm_head in vocab chunks (a streamed lm_head) and
// rows in tiles of ce_tile_rows (so a bounded number of logits exist at once: vocab is 32k-152k,
// and all N x V logits would not fit). Ignored rows (-100) are dropped before the matmuls: only
// counted rows are gathered into tiles.
//
// A stats pass keeps each row's running max and sum of exps (online softmax, combined in
// double), the loss is read from the stats, and a backward pass recomputes each chunk's logits
// (or reads the ones the stats pass kept in the caller's buffer, ops.h "Kept logits"):
// dlogits = (softmax - onehot) * grad_scale, then dh += dlogits · w_chunk and
// dw_chunk += dlogits^T · h. With bf16 w, h and dlogits are rounded to bf16 before the matmuls.
// Logits come from the ops.h matmuls (f32, or bf16 inputs with f32 accumulate); exp in f32
// (the vectorised kernels/cpu/vec_exp.h: 1.4 ulp at most; glibc's expf, which f32 weights used
// until the AVX2 peer benchmark, is not vectorised and cost ~0.1 s a step at hidden 512, V 8192,
// 2048 tokens), each row's sum of exps in double over 8 fixed lanes combined in lane order; row losses are summed serially in row order, so results are bitwise
// independent of the thread count (given deterministic matmuls).
//
// The whole-vocabulary entries (lm_head_ce_forward / _backward) are the one-chunk case.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/vec_exp.h"
#include "src/core/error.h"

namespace strata::cpu {
namespace {

constexpr int32_t kCeIgnoreIndex = -100;
constexpr int64_t kCeTileRowsMin = 128, kCeTileRowsMax = 1024;
constexpr int64_t kCeTileLogitBytes = int64_t(8) << 20;  // f32 logits of a tile, about

// Rows per tile for a vocab chunk of vc: a function of the shape only (never of the thread
// count), so the tiles, and the order dw sums them in, are fixed: about kCeTileLogitBytes of
// logits, 128 to 1024 rows, so the tile's matmuls are long enough in K to run near the GEMM's
// peak: dw_chunk += dlogits^T h sums over the tile's rows, and at vc 4096 128-row tiles ran it at
// ~75% of a large GEMM's rate (512: ~90%). (f32 weights kept 128-row tiles until the AVX2
// machine's peer benchmark: with 512-row tiles and the vectorised exp, the f32 loss over 2,048
// rows of hidden 512 and V 8192 in two chunks went from 0.50-0.56 to 0.41-0.48 s there.)
template <class W>
int64_t ce_tile_rows(int64_t vc) {
  return std::clamp(kCeTileLogitBytes / (vc * int64_t(sizeof(float))), kCeTileRowsMin, kCeTileRowsMax);
}

// The per-call tile buffers, kept by the calling thread (the device's compute stream) from one
// call to the next and only grown: a step makes a few calls of one shape, and allocating and
// faulting in megabytes every call cost more than the loops that fill them.
template <class W>
struct CeScratch {
  std::vector<W> h_tile, dlogits_cast;
  std::vector<float> logits, dh_tile;
};

template <class W>
CeScratch<W>& ce_scratch() {
  static thread_local CeScratch<W> scratch;
  return scratch;
}

template <class W>
size_t ce_scratch_bytes(int64_t n, int64_t c, int64_t vc) {
  const size_t rows = size_t(std::min(ce_tile_rows<W>(vc), std::max<int64_t>(n, 0)));
  const size_t cast = std::is_same_v<W, bf16> ? rows * size_t(vc) * sizeof(W) : 0;  // dlogits' bf16 copy
  return rows * size_t(c) * sizeof(W) + rows * size_t(vc) * sizeof(float) + cast + rows * size_t(c) * sizeof(float);
}

template <class W>
size_t ce_scratch_held() {
  const CeScratch<W>& s = ce_scratch<W>();
  return (s.h_tile.capacity() + s.dlogits_cast.capacity()) * sizeof(W) +
         (s.logits.capacity() + s.dh_tile.capacity()) * sizeof(float);
}

void ce_matmul(float* c, const float* a, const float* b, int64_t m, int64_t n, int64_t k,
               bool trans_a, bool trans_b, float beta) {
  matmul_f32(c, a, b, m, n, k, trans_a, trans_b, beta);
}
void ce_matmul(float* c, const bf16* a, const bf16* b, int64_t m, int64_t n, int64_t k,
               bool trans_a, bool trans_b, float beta) {
  matmul_bf16(c, a, b, m, n, k, trans_a, trans_b, beta);
}

template <class W>
W ce_from_f32(float x) {
  if constexpr (std::is_same_v<W, bf16>) {
    return f32_to_bf16(x);
  } else {
    return x;
  }
}

// max of x[0..n) (n > 0), over 16 lanes so the loop vectorises; a max is the same whatever the
// order (NaN aside, which poisons the loss either way).
float ce_row_max(const float* x, int64_t n) {
  constexpr int64_t kLanes = 16;
  float lane[kLanes];
  for (int64_t l = 0; l < kLanes; ++l) lane[l] = x[0];
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) lane[l] = std::max(lane[l], x[j + l]);
  float m = lane[0];
  for (int64_t l = 1; l < kLanes; ++l) m = std::max(m, lane[l]);
  for (; j < n; ++j) m = std::max(m, x[j]);
  return m;
}

// The sum in double of e^(x[j] - m), the exps formed in e (n; x itself is left as it is, so a
// kept tile of logits stays logits): 8 lanes, combined in lane order, then the tail. A fixed
// order, so the same bits on any thread count.
double ce_row_exp_sum(const float* x, float* e, int64_t n, float m) {
  constexpr int64_t kLanes = 8;
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) e[j] = exp_f32(x[j] - m);
  double lane[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) lane[l] += double(e[j + l]);
  double sum = 0.0;
  for (int64_t l = 0; l < kLanes; ++l) sum += lane[l];
  for (; j < n; ++j) sum += double(e[j]);
  return sum;
}

// Σ in double of e[j] (x[j] - m) (e: ce_row_exp_sum's exps of x - m), 8 lanes combined in lane
// order, then the tail: the entropy accumulator of a row's chunk (ops.h
// lm_head_ce_chunk_stats_entropy).
double ce_row_exp_dot(const float* x, const float* e, int64_t n, float m) {
  constexpr int64_t kLanes = 8;
  double lane[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) lane[l] += double(e[j + l]) * (double(x[j + l]) - double(m));
  double sum = 0.0;
  for (int64_t l = 0; l < kLanes; ++l) sum += lane[l];
  for (; j < n; ++j) sum += double(e[j]) * (double(x[j]) - double(m));
  return sum;
}

// Checks sizes and targets; returns the indices of counted rows in order.
std::vector<int64_t> ce_counted_rows(const int32_t* targets, int64_t n, int64_t c, int64_t v) {
  STRATA_CHECK(n >= 0 && c > 0 && v > 0, "lm_head_ce: sizes must be positive (got n=", n, " c=", c,
               " v=", v, ")");
  std::vector<int64_t> rows;
  rows.reserve(size_t(n));
  for (int64_t i = 0; i < n; ++i) {
    const int32_t id = targets[i];
    if (id == kCeIgnoreIndex) continue;
    STRATA_CHECK(id >= 0 && id < v, "lm_head_ce: row ", i, " has target id ", id, " outside [0, ",
                 v, "); use -100 to ignore a token");
    rows.push_back(i);
  }
  return rows;
}

void ce_check_chunk(int64_t v, int64_t v0, int64_t vc) {
  STRATA_CHECK(v0 >= 0 && vc > 0 && v0 + vc <= v, "lm_head_ce chunk: vocab rows [", v0, ", ",
               v0 + vc, ") are not a non-empty range inside [0, ", v, ")");
}

// Gathers counted rows [r0, r0 + nr) of h into a (nr, C) tile, rounded to W.
template <class W>
void ce_gather(W* tile, const float* h, const std::vector<int64_t>& rows, int64_t r0, int64_t nr,
               int64_t c) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < nr; ++r) {
    const float* src = h + rows[size_t(r0 + r)] * c;
    for (int64_t e = 0; e < c; ++e) tile[r * c + e] = ce_from_f32<W>(src[e]);
  }
}

// Where the logits of a chunk live: a tile of ce_tile_rows rows (recomputed per tile), or the
// caller's kept (N, vc) buffer, counted row r at kept + r * vc.
enum class CeLogits { compute, compute_into_kept, read_kept };

// For each tile of up to ce_tile_rows<W>(vc) counted rows (in order): the tile's rows of h gathered
// and rounded to W, its logits (nr, vc) = h_tile · w_chunk^T (computed into the tile, or into
// kept's rows; read_kept: not computed, kept's rows already hold them), then per_tile(r0, nr,
// h_tile, logits) with rows [r0, r0 + nr) of `rows`. One matmul of the same shape and operands
// whichever the destination, so kept logits are the bits a recompute gives.
template <class W, class F>
void ce_for_each_tile(const float* h, const W* w, const std::vector<int64_t>& rows, int64_t c, int64_t vc,
                      CeLogits mode, float* kept, F&& per_tile) {
  const int64_t counted = int64_t(rows.size());
  if (counted == 0) return;
  const int64_t chunk = std::min(ce_tile_rows<W>(vc), counted);
  CeScratch<W>& scratch = ce_scratch<W>();
  W* h_tile = scratch_grow(scratch.h_tile, size_t(chunk * c));  // (chunk, C)
  float* tile = mode == CeLogits::compute ? scratch_grow(scratch.logits, size_t(chunk * vc)) : nullptr;  // (chunk, vc)
  for (int64_t r0 = 0; r0 < counted; r0 += chunk) {
    const int64_t nr = std::min(chunk, counted - r0);
    float* logits = mode == CeLogits::compute ? tile : kept + r0 * vc;
    ce_gather(h_tile, h, rows, r0, nr, c);
    if (mode != CeLogits::read_kept) ce_matmul(logits, h_tile, w, nr, vc, c, false, true, 0.f);
    per_tile(r0, nr, h_tile, logits);
  }
}

// Stats pass over one vocab chunk: stats (N,3) = {max, sum of exp(z - max), target logit}.
// keep (N, vc) not null: the logits stay there for the backward (lm_head_ce_chunk_backward's
// kept_logits). ent (N) not null: also Σ exp(z - max) (z - max); when the max moves from m0 to
// mx each of the two parts is rescaled by exp(m - mx) and shifted by (m - mx) times its sum:
// Σ e^(z - mx) (z - mx) = e^(m - mx) (Σ e^(z - m) (z - m) + (m - mx) Σ e^(z - m)).
template <class W>
void ce_chunk_stats(double* stats, double* ent, const float* h, const W* w, const int32_t* targets, int64_t n,
                    int64_t c, int64_t v, int64_t v0, int64_t vc, bool first, float* keep) {
  const std::vector<int64_t> rows = ce_counted_rows(targets, n, c, v);
  ce_check_chunk(v, v0, vc);
  if (first) std::fill(stats, stats + 3 * n, 0.0);
  if (first && ent) std::fill(ent, ent + n, 0.0);
  const CeLogits mode = keep ? CeLogits::compute_into_kept : CeLogits::compute;
  ce_for_each_tile(h, w, rows, c, vc, mode, keep, [&](int64_t r0, int64_t nr, const W*, float* logits) {
#pragma omp parallel
    {
      std::vector<float> exps(static_cast<size_t>(vc));  // this thread's row of exps (the logits stay as they are)
#pragma omp for schedule(static)
      for (int64_t r = 0; r < nr; ++r) {
        const float* x = logits + r * vc;
        const int64_t i = rows[size_t(r0 + r)];
        const int64_t t = int64_t(targets[i]) - v0;
        const float target_logit = t >= 0 && t < vc ? x[t] : 0.f;
        const float m = ce_row_max(x, vc);
        const double sum = ce_row_exp_sum(x, exps.data(), vc, m);
        double* st = stats + 3 * i;
        const double dot = ent ? ce_row_exp_dot(x, exps.data(), vc, m) : 0.0;  // (z - m)-weighted sum
        if (first) {
          st[0] = double(m);
          st[1] = sum;
          if (ent) ent[i] = dot;
        } else {
          const double mx = std::max(st[0], double(m));
          if (ent)
            ent[i] = std::exp(st[0] - mx) * (ent[i] + (st[0] - mx) * st[1]) +
                     std::exp(double(m) - mx) * (dot + (double(m) - mx) * sum);
          st[1] = st[1] * std::exp(st[0] - mx) + sum * std::exp(double(m) - mx);
          st[0] = mx;
        }
        if (t >= 0 && t < vc) st[2] = double(target_logit);
      }
    }
  });
}

// Backward pass over one vocab chunk: dh += dlogits · w_chunk, dw_chunk += dlogits^T · h (dw_chunk
// null: not computed, the head is frozen).
// token_weight (N, or null: all 1) scales each row's dlogits on top of grad_scale.
// kept_logits (N, vc) not null: the chunk's logits as the stats pass kept them, read instead of
// recomputed and overwritten with dlogits.
template <class W>
void ce_chunk_backward(float* dh, float* dw, const float* h, const W* w, const double* stats,
                       const int32_t* targets, const float* token_weight, int64_t n, int64_t c,
                       int64_t v, int64_t v0, int64_t vc, float grad_scale, float* kept_logits) {
  const std::vector<int64_t> rows = ce_counted_rows(targets, n, c, v);
  ce_check_chunk(v, v0, vc);
  const int64_t chunk = std::min<int64_t>(ce_tile_rows<W>(vc), int64_t(rows.size()));
  CeScratch<W>& scratch = ce_scratch<W>();
  W* dlogits_cast = nullptr;  // (chunk, vc) bf16 copy, bf16 w only
  if constexpr (std::is_same_v<W, bf16>) dlogits_cast = scratch_grow(scratch.dlogits_cast, size_t(chunk * vc));
  float* dh_tile = scratch_grow(scratch.dh_tile, size_t(chunk * c));  // (chunk, C)
  const CeLogits mode = kept_logits ? CeLogits::read_kept : CeLogits::compute;
  ce_for_each_tile(h, w, rows, c, vc, mode, kept_logits, [&](int64_t r0, int64_t nr, const W* h_tile, float* logits) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < nr; ++r) {
      float* x = logits + r * vc;  // logits, then dlogits
      const int64_t i = rows[size_t(r0 + r)];
      const double* st = stats + 3 * i;
      const float m = float(st[0]);
      const float inv_sum = float(1.0 / st[1]);
      const float scale = token_weight ? grad_scale * token_weight[i] : grad_scale;
#pragma omp simd
      for (int64_t j = 0; j < vc; ++j) x[j] = exp_f32(x[j] - m) * inv_sum * scale;
      const int64_t t = int64_t(targets[i]) - v0;
      if (t >= 0 && t < vc) x[t] -= scale;
      if constexpr (std::is_same_v<W, bf16>) {
        bf16* xb = dlogits_cast + r * vc;
#pragma omp simd
        for (int64_t j = 0; j < vc; ++j) xb[j] = f32_to_bf16(x[j]);
      }
    }
    const W* dlogits;
    if constexpr (std::is_same_v<W, bf16>) {
      dlogits = dlogits_cast;
    } else {
      dlogits = logits;
    }
    ce_matmul(dh_tile, dlogits, w, nr, c, vc, false, false, 0.f);   // (nr, C)
    if (dw) ce_matmul(dw, dlogits, h_tile, vc, c, nr, true, false, 1.f);   // (vc, C) += (null: frozen head)
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < nr; ++r) {
      float* dst = dh + rows[size_t(r0 + r)] * c;
      const float* src = dh_tile + r * c;
      for (int64_t e = 0; e < c; ++e) dst[e] += src[e];
    }
  });
}

}  // namespace

size_t lm_head_ce_scratch_bytes(int64_t n, int64_t c, int64_t vc, DType w_dtype) {
  STRATA_CHECK(n >= 0 && c > 0 && vc > 0, "lm_head_ce scratch: sizes must be positive (got n=", n, " c=", c,
               " vc=", vc, ")");
  return w_dtype == DType::bf16 ? ce_scratch_bytes<bf16>(n, c, vc) : ce_scratch_bytes<float>(n, c, vc);
}

size_t lm_head_ce_scratch_held_bytes() { return ce_scratch_held<float>() + ce_scratch_held<bf16>(); }

void lm_head_ce_chunk_stats(double* stats, const float* h, const float* w_chunk,
                            const int32_t* targets, int64_t n, int64_t c, int64_t v, int64_t v0,
                            int64_t vc, bool first, float* keep_logits) {
  ce_chunk_stats<float>(stats, nullptr, h, w_chunk, targets, n, c, v, v0, vc, first, keep_logits);
}

void lm_head_ce_chunk_stats_bf16(double* stats, const float* h, const bf16* w_chunk,
                                 const int32_t* targets, int64_t n, int64_t c, int64_t v,
                                 int64_t v0, int64_t vc, bool first, float* keep_logits) {
  ce_chunk_stats<bf16>(stats, nullptr, h, w_chunk, targets, n, c, v, v0, vc, first, keep_logits);
}

void lm_head_ce_chunk_stats_entropy(double* stats, double* ent, const float* h, const float* w_chunk,
                                    const int32_t* targets, int64_t n, int64_t c, int64_t v, int64_t v0,
                                    int64_t vc, bool first, float* keep_logits) {
  ce_chunk_stats<float>(stats, ent, h, w_chunk, targets, n, c, v, v0, vc, first, keep_logits);
}

void lm_head_ce_chunk_stats_entropy_bf16(double* stats, double* ent, const float* h, const bf16* w_chunk,
                                         const int32_t* targets, int64_t n, int64_t c, int64_t v, int64_t v0,
                                         int64_t vc, bool first, float* keep_logits) {
  ce_chunk_stats<bf16>(stats, ent, h, w_chunk, targets, n, c, v, v0, vc, first, keep_logits);
}

double lm_head_ce_stats_loss(int64_t* count, const double* stats, const int32_t* targets,
                             int64_t n, int64_t v) {
  const std::vector<int64_t> rows = ce_counted_rows(targets, n, 1, v);
  *count = int64_t(rows.size());
  double loss = 0.0;
  for (int64_t i : rows) {  // row order, as the fused kernels sum
    const double* st = stats + 3 * i;
    loss += st[0] + std::log(st[1]) - st[2];
  }
  return loss;
}

void lm_head_ce_chunk_backward(float* dh, float* dw_chunk, const float* h, const float* w_chunk,
                               const double* stats, const int32_t* targets, int64_t n, int64_t c,
                               int64_t v, int64_t v0, int64_t vc, float grad_scale, float* kept_logits) {
  ce_chunk_backward<float>(dh, dw_chunk, h, w_chunk, stats, targets, nullptr, n, c, v, v0, vc, grad_scale,
                           kept_logits);
}

void lm_head_ce_chunk_backward_bf16(float* dh, float* dw_chunk, const float* h,
                                    const bf16* w_chunk, const double* stats,
                                    const int32_t* targets, int64_t n, int64_t c, int64_t v,
                                    int64_t v0, int64_t vc, float grad_scale, float* kept_logits) {
  ce_chunk_backward<bf16>(dh, dw_chunk, h, w_chunk, stats, targets, nullptr, n, c, v, v0, vc, grad_scale,
                          kept_logits);
}

// ---- per-sequence sums and the per-token weighted backward (preference objectives) ---------

void lm_head_ce_stats_seq_sums(double* seq_sums, const double* stats, const int32_t* targets,
                               const int32_t* seq, int64_t n, int64_t v, int64_t num_seqs) {
  STRATA_CHECK(num_seqs >= 0, "lm_head_ce seq sums: negative sequence count ", num_seqs);
  const std::vector<int64_t> rows = ce_counted_rows(targets, n, 1, v);
  std::fill(seq_sums, seq_sums + 2 * num_seqs, 0.0);
  for (int64_t i : rows) {  // row order, as the CUDA kernel sums
    const int32_t q = seq[i];
    if (q < 0) continue;
    STRATA_CHECK(q < num_seqs, "lm_head_ce seq sums: row ", i, " names sequence ", q, " of ", num_seqs);
    const double* st = stats + 3 * i;
    seq_sums[2 * q] += st[2] - st[0] - std::log(st[1]);
    seq_sums[2 * q + 1] += 1.0;
  }
}

void lm_head_ce_chunk_backward_weighted(float* dh, float* dw_chunk, const float* h,
                                        const float* w_chunk, const double* stats,
                                        const int32_t* targets, const float* token_weight,
                                        int64_t n, int64_t c, int64_t v, int64_t v0, int64_t vc,
                                        float grad_scale, float* kept_logits) {
  ce_chunk_backward<float>(dh, dw_chunk, h, w_chunk, stats, targets, token_weight, n, c, v, v0, vc, grad_scale,
                           kept_logits);
}

void lm_head_ce_chunk_backward_weighted_bf16(float* dh, float* dw_chunk, const float* h,
                                             const bf16* w_chunk, const double* stats,
                                             const int32_t* targets, const float* token_weight,
                                             int64_t n, int64_t c, int64_t v, int64_t v0,
                                             int64_t vc, float grad_scale, float* kept_logits) {
  ce_chunk_backward<bf16>(dh, dw_chunk, h, w_chunk, stats, targets, token_weight, n, c, v, v0, vc, grad_scale,
                          kept_logits);
}

// ---- the whole vocabulary at once: the one-chunk case of the chunked loss ------------------

namespace {

template <class W>
double ce_one_chunk(float* dh, float* dw, int64_t* count, const float* h, const W* w,
                    const int32_t* targets, int64_t n, int64_t c, int64_t v, float grad_scale) {
  std::vector<double> stats(size_t(3 * std::max<int64_t>(n, 0)));  // (N, 3)
  ce_chunk_stats<W>(stats.data(), nullptr, h, w, targets, n, c, v, 0, v, true, nullptr);
  const double loss = lm_head_ce_stats_loss(count, stats.data(), targets, n, v);
  if (dh) {
    std::fill(dh, dh + n * c, 0.f);  // written: ignored rows keep zero
    ce_chunk_backward<W>(dh, dw, h, w, stats.data(), targets, nullptr, n, c, v, 0, v, grad_scale, nullptr);
  }
  return loss;
}

}  // namespace

double lm_head_ce_forward(int64_t* count, const float* h, const float* w, const int32_t* targets,
                          int64_t n, int64_t c, int64_t v) {
  return ce_one_chunk<float>(nullptr, nullptr, count, h, w, targets, n, c, v, 0.f);
}

double lm_head_ce_forward_bf16(int64_t* count, const float* h, const bf16* w,
                               const int32_t* targets, int64_t n, int64_t c, int64_t v) {
  return ce_one_chunk<bf16>(nullptr, nullptr, count, h, w, targets, n, c, v, 0.f);
}

double lm_head_ce_backward(float* dh, float* dw, int64_t* count, const float* h, const float* w,
                           const int32_t* targets, int64_t n, int64_t c, int64_t v,
                           float grad_scale) {
  return ce_one_chunk<float>(dh, dw, count, h, w, targets, n, c, v, grad_scale);
}

double lm_head_ce_backward_bf16(float* dh, float* dw, int64_t* count, const float* h, const bf16* w,
                                const int32_t* targets, int64_t n, int64_t c, int64_t v,
                                float grad_scale) {
  return ce_one_chunk<bf16>(dh, dw, count, h, w, targets, n, c, v, grad_scale);
}

}  // namespace strata::cpu
