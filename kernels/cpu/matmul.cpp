// Matmul on the CPU through oneDNN (twin: kernels/cpu/ref/matmul.h).
// c (M,N) = op(a) · op(b) + beta * c, row-major; transposes are strides of the memory
// descriptors (no copies), beta = 1 is a sum post-op, bf16 inputs accumulate in f32.
//
// Thread-count independence (ops.h promises bitwise results for any thread count): oneDNN's
// multi-threaded matmul splits K across threads when M x N is small (measured with oneDNN 2.6
// for a transposed a, e.g. m = n = 64, k = 2048: 1 and 2 threads give different bits). So c is
// cut into fixed 256 x 256 tiles that depend only on the shape; each tile is one
// single-threaded oneDNN call over the whole K, and the tiles are spread over OpenMP threads.
// Every output element is then computed by the same code in the same order whatever the
// thread count. The price: no parallelism inside one tile (a small-M, small-N, huge-K product
// runs on one core).
//
// Creating a oneDNN primitive costs far more than a small GEMM, so primitives are cached per
// (m, n, k, tile shape, transposes, output buffer, dtype); one engine serves the process, and each
// thread executes on its own stream so concurrent tiles never share one.
//
// bf16 on a CPU without AVX-512 (an AVX2 workstation: oneDNN 2.x has no bf16 matmul there and
// refuses to create one): each tile's operands are widened to f32 (exact) into the thread's own
// buffers, op(a) as (tm, K) rows and op(b) as (tn, K) rows, and multiplied by an f32 primitive:
// the same products of bf16 values with f32 sums, in oneDNN's f32 order rather than its bf16
// kernel's. On such a CPU an f32 tile's transposed a is packed the same way, and a b stored
// (K, N) is copied as (K, tn) rows kRestrideLd apart (matmul_pack_f32). A thread keeps a packed
// operand for its next tile in the same row (a) or column (b) of tiles; with both, one of them is
// made once per call and shared by the threads.
//
// beta = 1 is c + (the finished sum), on every path: the tile's product goes into the thread's
// sum buffer and is then added to c. (oneDNN's sum post-op does that in its AVX-512 kernels, but
// its AVX2 f32 GEMM starts the sums from c for a transposed a: other bits.) So a gradient
// accumulated by the GEMM equals one summed in a second buffer and added, which the engine's
// schedules rely on (offload/engine.cpp: LoRA's adapters, layer-major shares).
#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>
#include <tuple>
#include <type_traits>

#include <immintrin.h>
#include <oneapi/dnnl/dnnl.hpp>
#include <omp.h>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/scratch.h"
#include "src/core/error.h"

namespace strata::cpu {
namespace {

constexpr int64_t kTileM = 256, kTileN = 256;  // fixed: the tiling must not follow threads
// An f32 b stored (K, N) is copied tile column by tile column into (K, tn) rows this far apart:
// not a power of two, unlike the model's usual N (512 floats: 2 KiB between rows), whose rows
// oneDNN's AVX2 kernel reads in place from the same few cache sets.
constexpr int64_t kRestrideLd = kTileN + 8;
constexpr int64_t kRestrideMinM = 64;  // fewer rows of op(a): b is read in place (matmul_run)

struct MatmulKey {
  int64_t m, n, k, tile_m, tile_n;
  bool trans_a, trans_b;
  bool buffered;  // the product into the thread's dense (tm, tn) sum buffer, not into c
  dnnl::memory::data_type dtype;
  // f32 tiles packed by matmul_run into the thread's buffers: op(a) as (tm, K) rows, op(b) as
  // (tn, K) rows (widened bf16 packs both); an f32 b stored (K, N) restrided as (K, tn) rows
  // kRestrideLd apart
  bool packed_a = false, packed_b = false, restrided_b = false;
  bool operator<(const MatmulKey& o) const {
    return std::tie(m, n, k, tile_m, tile_n, trans_a, trans_b, buffered, dtype, packed_a, packed_b,
                    restrided_b) <
           std::tie(o.m, o.n, o.k, o.tile_m, o.tile_n, o.trans_a, o.trans_b, o.buffered,
                    o.dtype, o.packed_a, o.packed_b, o.restrided_b);
  }
};

// One tile's primitive and the descriptors of its three operands (sub-blocks of a, b, c that
// keep the full matrices' strides).
struct MatmulPlan {
  dnnl::matmul prim;
  dnnl::memory::desc a_md, b_md, c_md, scratch_md;
};

dnnl::engine& matmul_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

dnnl::stream& matmul_stream() {
  thread_local dnnl::stream stream(matmul_engine());
  return stream;
}

// Must run with omp_get_max_threads() == 1 so oneDNN plans a single-threaded primitive.
MatmulPlan matmul_make_plan(const MatmulKey& key) {
  using dims = dnnl::memory::dims;
  const int64_t m = key.m, n = key.n, k = key.k, tm = key.tile_m, tn = key.tile_n;
  // op(a) tile (tm,K): a stored (M,K) or packed has strides {K,1}; a stored (K,M) is read as {1,M}.
  dnnl::memory::desc a_md({tm, k}, key.dtype, key.trans_a && !key.packed_a ? dims{1, m} : dims{k, 1});
  // op(b) tile (K,tn): b stored (N,K) or packed is read as {1,K}; b stored (K,N) has strides {N,1},
  // restrided {kRestrideLd,1}.
  dnnl::memory::desc b_md({k, tn}, key.dtype,
                          key.trans_b || key.packed_b ? dims{1, k}
                                                      : dims{key.restrided_b ? kRestrideLd : n, 1});
  dnnl::memory::desc c_md({tm, tn}, dnnl::memory::data_type::f32, key.buffered ? dims{tn, 1} : dims{n, 1});
  dnnl::primitive_attr attr;
  // A user scratchpad per thread: oneDNN's library scratchpad is shared between concurrent
  // executions (Debian's build has no concurrent-exec support), and tiles run concurrently.
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::matmul::desc desc(a_md, b_md, c_md);
  dnnl::matmul::primitive_desc pd(desc, attr, matmul_engine());
  return MatmulPlan{dnnl::matmul(pd), a_md, b_md, c_md, pd.scratchpad_desc()};
}

// The cached plan for key, made on first use. Entries are never erased, so the reference
// stays valid after the lock is released; a primitive may execute on several threads at once.
const MatmulPlan& matmul_plan(const MatmulKey& key) {
  static std::mutex mutex;
  static std::map<MatmulKey, MatmulPlan> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it == cache.end()) {
    const int keep = omp_get_max_threads();
    omp_set_num_threads(1);
    try {
      it = cache.emplace(key, matmul_make_plan(key)).first;
    } catch (const dnnl::error& e) {
      omp_set_num_threads(keep);
      STRATA_ASSERT(false, "oneDNN could not create a matmul (m=", key.m, " n=", key.n, " k=",
                    key.k, "): ", e.what());
    }
    omp_set_num_threads(keep);
  }
  return it->second;
}

float matmul_to_f32(float x) { return x; }
float matmul_to_f32(bf16 x) { return bf16_to_f32(x); }

#if defined(__AVX__)
// dst's 8 x 8 block (row stride ldd) = the transpose of src's (row stride lds): unpacks pair the
// rows' elements, shuffles make quadruples, 128-bit lane permutes finish the columns.
inline void matmul_transpose_8x8(float* dst, int64_t ldd, const float* src, int64_t lds) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * lds);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(dst + i * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
    _mm256_storeu_ps(dst + (i + 4) * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
  }
}
#endif

// op(x) rows [r0, r0 + nr) by columns [c0, c0 + nc) of the matrix x (stored (R, C) with row
// stride ld, or transposed: stored (C, R)), as f32 into dst (nr, nc) dense.
template <class T>
void matmul_pack(float* dst, const T* x, int64_t ld, bool trans, int64_t r0, int64_t nr, int64_t c0,
                 int64_t nc) {
  if (!trans) {
    for (int64_t i = 0; i < nr; ++i) {
      const T* src = x + (r0 + i) * ld + c0;
      float* d = dst + i * nc;
#pragma omp simd
      for (int64_t j = 0; j < nc; ++j) d[j] = matmul_to_f32(src[j]);
    }
    return;
  }
  // stored rows are op(x)'s columns: a transpose, in 8 x 8 blocks (a block's reads are eight
  // short rows, its writes eight short rows: both stay in cache lines), then the ragged edges
  constexpr int64_t kBlock = 8;
  const int64_t nr8 = nr - nr % kBlock, nc8 = nc - nc % kBlock;
  for (int64_t j0 = 0; j0 < nc8; j0 += kBlock) {
    for (int64_t i0 = 0; i0 < nr8; i0 += kBlock) {
#if defined(__AVX__)
      if constexpr (std::is_same_v<T, float>) {  // through registers: the scalar block ran at ~4 GB/s
        matmul_transpose_8x8(dst + i0 * nc + j0, nc, x + (c0 + j0) * ld + r0 + i0, ld);
        continue;
      }
#endif
      float block[kBlock][kBlock];
      for (int64_t j = 0; j < kBlock; ++j) {
        const T* src = x + (c0 + j0 + j) * ld + r0 + i0;
        for (int64_t i = 0; i < kBlock; ++i) block[i][j] = matmul_to_f32(src[i]);
      }
      for (int64_t i = 0; i < kBlock; ++i)
        for (int64_t j = 0; j < kBlock; ++j) dst[(i0 + i) * nc + j0 + j] = block[i][j];
    }
  }
  for (int64_t j = 0; j < nc; ++j) {
    const T* src = x + (c0 + j) * ld + r0;
    for (int64_t i = j < nc8 ? nr8 : 0; i < nr; ++i) dst[i * nc + j] = matmul_to_f32(src[i]);
  }
}

// Rows [r0, r1) of the tile column [j0, j0 + tn) of an f32 b stored (K, N) into dst, the
// column's (K, tn) copy with rows kRestrideLd apart.
void matmul_restride_rows(float* dst, const float* b, int64_t n, int64_t j0, int64_t tn, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r)
    std::memcpy(dst + r * kRestrideLd, b + r * n + j0, size_t(tn) * sizeof(float));
}

// matmul_pack of x's bf16 (widen) or f32 elements.
void matmul_pack_any(float* dst, const void* x, bool widen, int64_t ld, bool trans, int64_t r0,
                     int64_t nr, int64_t c0, int64_t nc) {
  if (widen) matmul_pack(dst, static_cast<const bf16*>(x), ld, trans, r0, nr, c0, nc);
  else matmul_pack(dst, static_cast<const float*>(x), ld, trans, r0, nr, c0, nc);
}

// Whether f32 tiles are rearranged: a transposed a packed to run along K (op(a) as (tm, K) rows),
// a b stored (K, N) restrided (its tile column as (K, tn) rows kRestrideLd apart). Measured with
// oneDNN 2.6's AVX2 f32 kernel on an AMD EPYC: the weight gradient dy^T x (512 x 512, K = 2048)
// at 86 GFLOP/s (2 threads) against ~105 with a packed; the lm_head's dw (8192 x 512, K = 128) at
// 64 against ~95-104. A b stored (K, N) with N = 512 runs a 256 x 256 x 2048 tile at 50-54 GFLOP/s
// on one thread when 64-byte aligned, as every device buffer is (77 when 16 bytes off: oneDNN then
// copies it), 73-75 packed as (tn, K) rows, 78-85 restrided: in a training step the weight
// gradients of q, k, v, o, gate and up (b = the layer's 512-wide input) ran at 58-69 GFLOP/s
// before the restride. On AVX-512 the tiles go to oneDNN as they are stored: measured fast there.
bool matmul_pack_f32() {
  static const bool pack = !__builtin_cpu_supports("avx512f");
  return pack;
}

}  // namespace

bool matmul_f32_packs() { return matmul_pack_f32(); }

namespace {

// The buffers of the calling thread: op(a) (tm, K) and op(b) as (tn, K) of one tile packed
// (widened from bf16, or f32 rearranged), and a tile's product (tm, tn) before beta = 1 adds it
// to c. A packed operand is kept for the thread's next tile of the same call and row (a) or column
// (b) of tiles: call is the matmul_run call's number, -1 when nothing is packed.
struct MatmulScratch {
  std::vector<float> a, b, c;
  std::vector<float> shared;  // a call's whole b restrided or a packed, shared by its threads (matmul_run)
  int64_t a_call = -1, a_tile = -1, b_call = -1, b_tile = -1;
};
MatmulScratch& matmul_scratch() {
  thread_local MatmulScratch scratch;
  return scratch;
}

void matmul_run(float* c, const void* a, const void* b, int64_t m, int64_t n, int64_t k,
                bool trans_a, bool trans_b, float beta, dnnl::memory::data_type dtype, bool widen) {
  STRATA_CHECK(m >= 0 && n >= 0 && k >= 0, "matmul: sizes must be >= 0, got m=", m, " n=", n,
               " k=", k);
  STRATA_CHECK(beta == 0.f || beta == 1.f, "matmul: beta must be 0 or 1, got ", beta);
  if (m == 0 || n == 0) return;
  if (k == 0) {  // an empty sum: c = beta * c
    if (beta == 0.f) std::fill(c, c + m * n, 0.f);
    return;
  }
  const bool f32 = dtype == dnnl::memory::data_type::f32;
  // f32: a transposed a is packed only when other tiles share it (a packed a serves a row of
  // tiles). A b stored (K, N) is restrided per tile column once op(a) has kRestrideMinM rows:
  // the copy is K x tn floats for 2 M K tn flops. Measured (AVX2, 2 threads, aligned b of
  // 2048 x 512): M = 1 0.21 ms restrided against 0.09 in place, M = 8 0.36 / 0.24, M = 32 about
  // even, M = 64 1.2-1.6 / 1.5, M = 256 4.1-4.7 / 6.1-6.3.
  const bool pack_a = widen || (f32 && trans_a && n > kTileN && matmul_pack_f32());
  const bool pack_b = widen;
  const bool restride_b = f32 && !trans_b && m >= kRestrideMinM && matmul_pack_f32();
  static std::atomic<int64_t> calls{0};
  const int64_t call = calls.fetch_add(1, std::memory_order_relaxed);
  const size_t elem_bytes = f32 ? 4 : 2;
  const int64_t tiles_m = (m + kTileM - 1) / kTileM, tiles_n = (n + kTileN - 1) / kTileN;
  // At most four tile shapes: full, short in M, short in N, short in both.
  const MatmulPlan* plans[2][2];
  for (int sm = 0; sm < 2; ++sm) {
    for (int sn = 0; sn < 2; ++sn) {
      int64_t tm = sm ? m - (tiles_m - 1) * kTileM : std::min(m, kTileM);
      int64_t tn = sn ? n - (tiles_n - 1) * kTileN : std::min(n, kTileN);
      plans[sm][sn] = &matmul_plan(MatmulKey{m, n, k, tm, tn, trans_a, trans_b, beta != 0.f,
                                             widen ? dnnl::memory::data_type::f32 : dtype, pack_a, pack_b,
                                             restride_b});
    }
  }
  const int64_t tiles = tiles_m * tiles_n;
  // With a packed and b restrided, a thread's run of tiles keeps one of them and copies the other
  // afresh for each tile (the weight gradient of gate or up on the mid model, 6 x 2 tiles: 12
  // copies of 2048 x 256 floats in row order, ~8% of its time). So one of them is made once per
  // call, by the team before its first tile, into the calling thread's shared buffer, when it
  // takes no more than the threads' own buffers would (its tiles no more than the threads): b
  // (all its tile columns restrided, (K, tn) rows kRestrideLd apart per column; tiles in row
  // order), else a (all its tile rows packed, (tm, K) each; tiles in column order).
  const int threads = omp_get_max_threads();
  const bool shared_b = restride_b && pack_a && tiles > 1 && tiles_n <= threads;
  const bool shared_a = restride_b && pack_a && tiles > 1 && !shared_b && tiles_m <= threads;
  float* shared = nullptr;
  if (shared_b) shared = scratch_grow(matmul_scratch().shared, size_t(tiles_n * k * kRestrideLd));
  if (shared_a) shared = scratch_grow(matmul_scratch().shared, size_t(tiles_m * kTileM * k));
  // Tiles in column order when only b is packed or restrided, or a is shared (a thread's next
  // tile mostly reuses its b), else in row order.
  const bool by_columns = (pack_b || restride_b) && (!pack_a || shared_a);
  // A thread takes runs of tiles along a row (a column when by_columns), as long as that leaves
  // every thread work, so that its packed operand serves the run.
  const int64_t along = by_columns ? tiles_m : tiles_n;
  const int chunk = int(std::clamp<int64_t>(tiles / std::max(1, omp_get_max_threads()), 1, along));
  const auto* a_bytes = static_cast<const char*>(a);
  const auto* b_bytes = static_cast<const char*>(b);
#pragma omp parallel if (tiles > 1)
  {
    omp_set_num_threads(1);  // this thread's own ICV: oneDNN runs each tile single-threaded
    if (shared_b) {  // rows of every tile column, in blocks spread over the team
      constexpr int64_t kRows = 64;
#pragma omp for schedule(static)
      for (int64_t r0 = 0; r0 < k; r0 += kRows)
        for (int64_t tj = 0; tj < tiles_n; ++tj)
          matmul_restride_rows(shared + tj * k * kRestrideLd, static_cast<const float*>(b), n, tj * kTileN,
                               std::min(kTileN, n - tj * kTileN), r0, std::min(k, r0 + kRows));
    }
    if (shared_a) {
#pragma omp for schedule(static)
      for (int64_t ti = 0; ti < tiles_m; ++ti)
        matmul_pack_any(shared + ti * kTileM * k, a, false, m, true, ti * kTileM,
                        std::min(kTileM, m - ti * kTileM), 0, k);
    }
#pragma omp for schedule(dynamic, chunk)
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t ti = by_columns ? t % tiles_m : t / tiles_n;
      const int64_t tj = by_columns ? t / tiles_m : t % tiles_n;
      const int64_t i0 = ti * kTileM, j0 = tj * kTileN;
      const MatmulPlan& plan = *plans[ti == tiles_m - 1][tj == tiles_n - 1];
      // Tile origins: a row i0 is at i0*K (stored (M,K)) or column i0 (stored (K,M)); b column
      // j0 is at j0 (stored (K,N)) or row j0*K (stored (N,K)).
      const size_t a_off = size_t(trans_a ? i0 : i0 * k) * elem_bytes;
      const size_t b_off = size_t(trans_b ? j0 * k : j0) * elem_bytes;
      const void* a_tile = a_bytes + a_off;
      const void* b_tile = b_bytes + b_off;
      float* c_tile = c + i0 * n + j0;
      const int64_t tm = std::min(kTileM, m - i0), tn = std::min(kTileN, n - j0);
      MatmulScratch& ws = matmul_scratch();
      if (shared_a) {
        a_tile = shared + ti * kTileM * k;
      } else if (pack_a) {  // op(a) rows [i0, i0 + tm) as (tm, K) f32
        float* a32 = scratch_grow(ws.a, size_t(kTileM * k));  // sized by K alone: one size per K
        if (ws.a_call != call || ws.a_tile != ti) {
          matmul_pack_any(a32, a, widen, trans_a ? m : k, trans_a, i0, tm, 0, k);
          ws.a_call = call, ws.a_tile = ti;
        }
        a_tile = a32;
      }
      if (pack_b) {  // op(b) columns [j0, j0 + tn) as (tn, K) f32 rows: stored b's rows, or its transpose
        float* b32 = scratch_grow(ws.b, size_t(k * kTileN));
        if (ws.b_call != call || ws.b_tile != tj) {
          matmul_pack_any(b32, b, widen, trans_b ? k : n, !trans_b, j0, tn, 0, k);
          ws.b_call = call, ws.b_tile = tj;
        }
        b_tile = b32;
      }
      if (shared_b) {
        b_tile = shared + tj * k * kRestrideLd;
      } else if (restride_b) {  // b's columns [j0, j0 + tn) as (K, tn) rows kRestrideLd apart
        float* b32 = scratch_grow(ws.b, size_t(k * kRestrideLd));
        if (ws.b_call != call || ws.b_tile != tj) {
          matmul_restride_rows(b32, static_cast<const float*>(b), n, j0, tn, 0, k);
          ws.b_call = call, ws.b_tile = tj;
        }
        b_tile = b32;
      }
      if (beta != 0.f) c_tile = scratch_grow(ws.c, size_t(kTileM * kTileN));
      try {
        dnnl::engine& engine = matmul_engine();
        dnnl::memory a_mem(plan.a_md, engine, const_cast<void*>(a_tile));
        dnnl::memory b_mem(plan.b_md, engine, const_cast<void*>(b_tile));
        dnnl::memory c_mem(plan.c_md, engine, c_tile);
        thread_local std::vector<char> scratch;
        if (scratch.size() < plan.scratch_md.get_size()) scratch.resize(plan.scratch_md.get_size());
        dnnl::memory s_mem(plan.scratch_md, engine, scratch.data());
        plan.prim.execute(matmul_stream(), {{DNNL_ARG_SRC, a_mem},
                                            {DNNL_ARG_WEIGHTS, b_mem},
                                            {DNNL_ARG_DST, c_mem},
                                            {DNNL_ARG_SCRATCHPAD, s_mem}});
        matmul_stream().wait();
      } catch (const dnnl::error& e) {  // nothing may leave an OpenMP region
        STRATA_ASSERT(false, "oneDNN matmul failed (m=", m, " n=", n, " k=", k, "): ", e.what());
      }
      if (beta != 0.f) {  // c + the finished sum
        for (int64_t i = 0; i < tm; ++i) {
          float* ci = c + (i0 + i) * n + j0;
          const float* ti = c_tile + i * tn;
#pragma omp simd
          for (int64_t j = 0; j < tn; ++j) ci[j] += ti[j];
        }
      }
    }
  }
}

}  // namespace

void matmul_f32(float* c, const float* a, const float* b, int64_t m, int64_t n, int64_t k,
                bool trans_a, bool trans_b, float beta) {
  matmul_run(c, a, b, m, n, k, trans_a, trans_b, beta, dnnl::memory::data_type::f32, false);
}

bool matmul_bf16_native() {
  static const bool native = [] {  // asked once, by making a bf16 plan
    const int keep = omp_get_max_threads();
    omp_set_num_threads(1);
    bool ok = true;
    try {
      matmul_make_plan(MatmulKey{16, 16, 16, 16, 16, false, false, false, dnnl::memory::data_type::bf16});
    } catch (const dnnl::error&) {
      ok = false;
    }
    omp_set_num_threads(keep);
    return ok;
  }();
  return native;
}

void matmul_bf16(float* c, const bf16* a, const bf16* b, int64_t m, int64_t n, int64_t k,
                 bool trans_a, bool trans_b, float beta) {
  matmul_run(c, a, b, m, n, k, trans_a, trans_b, beta, dnnl::memory::data_type::bf16, !matmul_bf16_native());
}

void matmul_bf16_widened(float* c, const bf16* a, const bf16* b, int64_t m, int64_t n, int64_t k,
                         bool trans_a, bool trans_b, float beta) {
  matmul_run(c, a, b, m, n, k, trans_a, trans_b, beta, dnnl::memory::data_type::bf16, true);
}

size_t matmul_scratch_bytes(int64_t k, DType dtype) {
  STRATA_CHECK(k >= 0, "matmul_scratch_bytes: k must be >= 0, got ", k);
  // widened bf16: op(a) (256, K) and op(b) (256, K); f32: op(a) (256, K), b (K, kRestrideLd) and
  // a thread's share of a call's shared restrided b or packed a (the calling thread holds up to
  // one (K, kRestrideLd) or (256, K) block per thread of the team)
  const bool packs = dtype == DType::bf16 ? !matmul_bf16_native() : matmul_pack_f32();
  const int64_t b_row = dtype == DType::bf16 ? kTileN : 2 * kRestrideLd;
  const size_t packed = packs ? size_t(kTileM + b_row) * size_t(k) : 0;
  return (packed + size_t(kTileM * kTileN)) * sizeof(float);
}

size_t matmul_scratch_held_bytes() {
  const MatmulScratch& ws = matmul_scratch();
  return (ws.a.capacity() + ws.b.capacity() + ws.c.capacity() + ws.shared.capacity()) * sizeof(float);
}

}  // namespace strata::cpu
