// Bias add and its gradient, fast CPU path (twin: kernels/cpu/ref/bias.h).
// db is a column sum over rows: rows are cut into fixed 64-row chunks, each chunk sums its rows
// in order, and the chunk partials are summed in chunk order, so db is bitwise independent of
// the thread count.
#include <algorithm>
#include <vector>

#include "kernels/cpu/ops.h"
#include "src/core/error.h"

namespace strata::cpu {
namespace {

constexpr int64_t kParallelMin = 1 << 14;  // elements; fewer are not worth waking threads

constexpr int64_t kRowsPerChunk = 64;  // fixed: the db sum order must not follow threads

// s (o) = sum of rows [begin, end) of dy (n,o), in row order.
void bias_sum_rows(float* s, const float* dy, int64_t begin, int64_t end, int64_t o) {
  std::fill(s, s + o, 0.f);
  for (int64_t i = begin; i < end; ++i) {
    const float* row = dy + i * o;
#pragma omp simd
    for (int64_t j = 0; j < o; ++j) s[j] += row[j];
  }
}

}  // namespace

void bias_forward(float* y, const float* b, int64_t n, int64_t o) {
  STRATA_CHECK(n >= 0 && o > 0, "bias_forward: need n >= 0 and o > 0, got n=", n, " o=", o);
#pragma omp parallel for schedule(static) if (n * o >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    float* row = y + i * o;
#pragma omp simd
    for (int64_t j = 0; j < o; ++j) row[j] += b[j];
  }
}

void bias_backward(float* db, const float* dy, int64_t n, int64_t o) {
  STRATA_CHECK(n >= 0 && o > 0, "bias_backward: need n >= 0 and o > 0, got n=", n, " o=", o);
  int64_t chunks = (n + kRowsPerChunk - 1) / kRowsPerChunk;
  if (chunks <= 1) {
    std::vector<float> s(static_cast<size_t>(o));  // (o)
    bias_sum_rows(s.data(), dy, 0, n, o);
#pragma omp simd
    for (int64_t j = 0; j < o; ++j) db[j] += s[j];
    return;
  }
  std::vector<float> partial(size_t(chunks * o));  // (chunks, o) one column sum per chunk
#pragma omp parallel for schedule(static) if (n * o >= kParallelMin)
  for (int64_t ch = 0; ch < chunks; ++ch)
    bias_sum_rows(partial.data() + ch * o, dy, ch * kRowsPerChunk,
                  std::min(n, (ch + 1) * kRowsPerChunk), o);
  // The partials are themselves rows to sum in order: recurse (64x fewer rows each level).
  bias_backward(db, partial.data(), chunks, o);
}

}  // namespace strata::cpu
