// Matmul on the CPU through oneDNN, or strata's own AVX2 kernel, or for bf16 on an AMX CPU strata's
// AMX tile (kernels/cpu/gemm_amx.h) (twin: kernels/cpu/ref/matmul.h).
// c (M,N) = op(a) · op(b) + beta * c, row-major; for oneDNN transposes are strides of the memory
// descriptors (no copies); bf16 inputs accumulate in f32.
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
// On a CPU with AVX2 and FMA but no AVX-512 the tiles are strata's own (kernels/cpu/gemm_avx2.h):
// oneDNN 2.x's AVX2 f32 kernel ran them at 60-75% of the FMA peak (slower still for a transposed
// a or a b stored (K, N)), and has no bf16 matmul there at all. Each tile's op(a) rows and op(b)
// columns are packed over the whole K into that kernel's panels (bf16 widened to f32, exact, as
// they are packed; an f32 a stored (M, K) is read in place): the same products, f32 sums in that
// kernel's order, which depends only on K. In the mid model's training step (Zen 3, 2 cores,
// interleaved runs) its GEMMs took 2.25-2.38 s a step against 2.45-2.84 s for oneDNN's fed by
// strata's repacking. A thread keeps a packed operand for its next tile in the same row (a) or
// column (b) of tiles, and when one operand's tiles are no more than the threads it is packed
// once per call and shared by the team. Without AVX2 (and without AVX-512: no bf16 in oneDNN) a
// bf16 tile's operands are widened into the thread's buffers, op(a) as (tm, K) rows and op(b) as
// (tn, K) rows, for an f32 primitive; matmul_bf16_widened runs that path on any CPU (tests).
//
// beta = 1 is c + (the finished sum), on every path: the tile's product goes into the thread's
// sum buffer and is then added to c. (oneDNN's sum post-op does that in its AVX-512 kernels, but
// its AVX2 f32 GEMM starts the sums from c for a transposed a: other bits.) So a gradient
// accumulated by the GEMM equals one summed in a second buffer and added, which the engine's
// schedules rely on (offload/engine/engine.cpp: LoRA's adapters, layer-major shares).
#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>
#include <tuple>

#include <oneapi/dnnl/dnnl.hpp>
#include <omp.h>

#include "kernels/cpu/gemm_amx.h"
#include "kernels/cpu/gemm_avx2.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/scratch.h"
#include "src/core/error.h"

namespace strata::cpu {
namespace {

constexpr int64_t kTileM = 256, kTileN = 256;  // fixed: the tiling must not follow threads

struct MatmulKey {
  int64_t m, n, k, tile_m, tile_n;
  bool trans_a, trans_b;
  bool buffered;  // the product into the thread's dense (tm, tn) sum buffer, not into c
  dnnl::memory::data_type dtype;
  // bf16 tiles widened by matmul_run into the thread's buffers: op(a) as (tm, K) rows, op(b) as
  // (tn, K) rows
  bool widened = false;
  bool operator<(const MatmulKey& o) const {
    return std::tie(m, n, k, tile_m, tile_n, trans_a, trans_b, buffered, dtype, widened) <
           std::tie(o.m, o.n, o.k, o.tile_m, o.tile_n, o.trans_a, o.trans_b, o.buffered, o.dtype, o.widened);
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
  // op(a) tile (tm,K): a stored (M,K) or widened has strides {K,1}; a stored (K,M) is read as {1,M}.
  dnnl::memory::desc a_md({tm, k}, key.dtype, key.trans_a && !key.widened ? dims{1, m} : dims{k, 1});
  // op(b) tile (K,tn): b stored (N,K) or widened is read as {1,K}; b stored (K,N) has strides {N,1}.
  dnnl::memory::desc b_md({k, tn}, key.dtype, key.trans_b || key.widened ? dims{1, k} : dims{n, 1});
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
      STRATA_CHECK_BUDGET(e.status != dnnl_out_of_memory, "oneDNN ran out of host memory creating a matmul (m=",
                          key.m, " n=", key.n, " k=", key.k, "): the process is out of memory or address space "
                          "(ulimit -v); lower the memory the recipe needs, or device.cpu_threads");
      STRATA_ASSERT(false, "oneDNN could not create a matmul (m=", key.m, " n=", key.n, " k=",
                    key.k, "): ", e.what());
    }
    omp_set_num_threads(keep);
  }
  return it->second;
}

// Whether f32 tiles run through strata's AVX2 kernel: on CPUs with AVX2 and FMA but no AVX-512.
// Measured with oneDNN 2.6 on an AMD EPYC (Zen 3, 2 cores, FMA peak ~184 GFLOP/s): its AVX2
// kernel ran the mid model's GEMMs at 100-130 GFLOP/s with operands laid along K, and a
// transposed a or a b stored (K, N) 18-33% slower (a 64-byte aligned b stored (K, N) with
// N = 512 at 50-54 GFLOP/s on one thread). On AVX-512 the tiles go to oneDNN as they are stored:
// measured fast there.
bool matmul_own_f32() {
  static const bool own = !__builtin_cpu_supports("avx512f") && gemm_avx2_available();
  return own;
}

// op(x) rows [r0, r0 + nr), all nc columns, of the bf16 matrix x (stored (R, C) with row stride
// ld, or transposed: stored (C, R)) widened into dst (nr, nc) dense.
void matmul_widen(float* dst, const bf16* x, int64_t ld, bool trans, int64_t r0, int64_t nr, int64_t nc) {
  for (int64_t i = 0; i < nr; ++i)
    for (int64_t j = 0; j < nc; ++j) dst[i * nc + j] = bf16_to_f32(trans ? x[j * ld + r0 + i] : x[(r0 + i) * ld + j]);
}

}  // namespace

bool matmul_f32_packs() { return matmul_own_f32(); }

namespace {

// The buffers of the calling thread: a tile's op(a) and op(b) packed over the whole K (strata's
// kernel: its panels; widened bf16 for oneDNN: (tm, K) and (tn, K) rows), and a tile's product
// (tm, tn) before beta = 1 adds it to c. A packed operand is kept for the thread's next tile of
// the same call and row (a) or column (b) of tiles: call is the matmul call's number, -1 when
// nothing is packed.
struct MatmulScratch {
  LineVector<float> a, b, c;  // on 64-byte lines: the AMX tile's loads read whole lines
  LineVector<float> shared;   // a call's whole packed a or b, shared by its threads (matmul_run_own)
  int64_t a_call = -1, a_tile = -1, b_call = -1, b_tile = -1;
};
MatmulScratch& matmul_scratch() {
  thread_local MatmulScratch scratch;
  return scratch;
}

int64_t matmul_next_call() {
  static std::atomic<int64_t> calls{0};
  return calls.fetch_add(1, std::memory_order_relaxed);
}

// c's tile (rows [i0, i0 + tm), columns [j0, j0 + tn)) += the finished sum in the thread's buffer.
void matmul_add_tile(float* c, int64_t n, int64_t i0, int64_t j0, const float* sum, int64_t tm, int64_t tn) {
  for (int64_t i = 0; i < tm; ++i) {
    float* ci = c + (i0 + i) * n + j0;
    const float* si = sum + i * tn;
#pragma omp simd
    for (int64_t j = 0; j < tn; ++j) ci[j] += si[j];
  }
}

// The tiles through strata's kernel (gemm_avx2.h), f32 or bf16 operands.
void matmul_run_own(float* c, const void* a, const void* b, int64_t m, int64_t n, int64_t k, bool trans_a,
                    bool trans_b, float beta, bool bf16) {
  const int64_t call = matmul_next_call();
  const int64_t lda = trans_a ? m : k, ldb = trans_b ? k : n;
  // As few tiles as 256 x 256 ones, of near-equal sizes (whole panels of the kernel where that
  // stays within 256): 1408 columns as 5 x 240 + 208 rather than 5 x 256 + 128, so that two
  // threads with three tiles each finish together (97.7% busy rather than 91.7%). The tiles
  // depend only on the shape, and an element's sum never on its tile.
  const auto tile_size = [](int64_t size, int64_t panel) {
    const int64_t count = (size + kTileM - 1) / kTileM, even = (size + count - 1) / count;
    return std::min(kTileM, (even + panel - 1) / panel * panel);
  };
  static_assert(kTileM == kTileN);
  const int64_t tile_m = tile_size(m, kGemmMr), tile_n = tile_size(n, kGemmNr);
  const int64_t tiles_m = (m + tile_m - 1) / tile_m, tiles_n = (n + tile_n - 1) / tile_n;
  const int64_t tiles = tiles_m * tiles_n;
  // buffers sized for a 256 x 256 tile: one size per K whatever the shape
  const int64_t a_floats = gemm_packed_a_floats(kTileM, k), b_floats = gemm_packed_b_floats(kTileN, k);
  // An f32 a stored (M, K) is read in place (its rows run along K): only a tile's last, partial
  // panel of rows is packed. Otherwise a thread's run of tiles along a row keeps its packed a
  // and packs b afresh for each tile; with a in place, runs go down a column, keeping b.
  const bool a_in_place = !bf16 && !trans_a;
  // When one operand's tiles are no more than the threads it is packed once per call, by the
  // team before its first tile, into the calling thread's shared buffer: b (every tile column;
  // tiles in row order), else a packed (every tile row; tiles in column order). That takes no
  // more than the threads' own buffers would.
  const int threads = omp_get_max_threads();
  const bool shared_b = tiles > 1 && tiles_n <= threads;
  const bool shared_a = tiles > 1 && !shared_b && !a_in_place && tiles_m <= threads;
  float* shared = nullptr;
  if (shared_b) shared = scratch_grow(matmul_scratch().shared, size_t(tiles_n * b_floats));
  if (shared_a) shared = scratch_grow(matmul_scratch().shared, size_t(tiles_m * a_floats));
  // A thread takes runs of tiles along a row (down a column when b is its own and a in place,
  // or a is shared), as long as that leaves every thread work, so that its packed operand
  // serves the run.
  const bool by_columns = shared_a || (a_in_place && !shared_b);
  const int64_t along = by_columns ? tiles_m : tiles_n;
  const int chunk = int(std::clamp<int64_t>(tiles / std::max(1, threads), 1, along));
#pragma omp parallel if (tiles > 1)
  {
    if (shared_b) {  // b's panels, tile column by tile column (a tile column is whole panels)
      const int64_t per_tile = tile_n / kGemmNr, panels = tiles_n * per_tile;
#pragma omp for schedule(static)
      for (int64_t q = 0; q < panels; ++q) {
        const int64_t tj = q / per_tile, j = tj * tile_n + (q % per_tile) * kGemmNr;
        if (j < std::min(n, (tj + 1) * tile_n))
          gemm_pack_b(shared + tj * b_floats + (q % per_tile) * kGemmNr * k, b, bf16, ldb, trans_b, j,
                      std::min({kGemmNr, n - j, (tj + 1) * tile_n - j}), k);
      }
    }
    if (shared_a) {
#pragma omp for schedule(static)
      for (int64_t ti = 0; ti < tiles_m; ++ti)
        gemm_pack_a(shared + ti * a_floats, a, bf16, lda, trans_a, ti * tile_m, std::min(tile_m, m - ti * tile_m), k);
    }
#pragma omp for schedule(dynamic, chunk)
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t ti = by_columns ? t % tiles_m : t / tiles_n;
      const int64_t tj = by_columns ? t / tiles_m : t % tiles_n;
      const int64_t i0 = ti * tile_m, j0 = tj * tile_n;
      const int64_t tm = std::min(tile_m, m - i0), tn = std::min(tile_n, n - j0);
      MatmulScratch& ws = matmul_scratch();
      const float* a_rows = a_in_place ? static_cast<const float*>(a) + i0 * k : nullptr;
      const float* a_tile = shared_a ? shared + ti * a_floats : nullptr;
      if (!a_tile) {  // a's rows packed, or in place but for the last partial panel
        const int64_t from = a_in_place ? tm - tm % kGemmMr : 0;
        float* packed = scratch_grow(ws.a, size_t(a_in_place ? kGemmMr * k : a_floats));  // sized by K alone
        if (from < tm && (ws.a_call != call || ws.a_tile != ti)) {
          gemm_pack_a(packed, a, bf16, lda, trans_a, i0 + from, tm - from, k);
          ws.a_call = call, ws.a_tile = ti;
        }
        a_tile = packed;
      }
      const float* b_tile = shared_b ? shared + tj * b_floats : nullptr;
      if (!b_tile) {
        float* packed = scratch_grow(ws.b, size_t(b_floats));
        if (ws.b_call != call || ws.b_tile != tj) {
          gemm_pack_b(packed, b, bf16, ldb, trans_b, j0, tn, k);
          ws.b_call = call, ws.b_tile = tj;
        }
        b_tile = packed;
      }
      if (beta == 0.f) {
        gemm_tile(c + i0 * n + j0, n, a_rows, lda, a_tile, b_tile, tm, tn, k);
      } else {  // c + the finished sum
        float* sum = scratch_grow(ws.c, size_t(kTileM * kTileN));
        gemm_tile(sum, tn, a_rows, lda, a_tile, b_tile, tm, tn, k);
        matmul_add_tile(c, n, i0, j0, sum, tm, tn);
      }
    }
  }
}

// The tiles through oneDNN: f32 or bf16 as stored, or bf16 widened into the thread's buffers.
void matmul_run_onednn(float* c, const void* a, const void* b, int64_t m, int64_t n, int64_t k, bool trans_a,
                       bool trans_b, float beta, dnnl::memory::data_type dtype, bool widen) {
  const int64_t call = matmul_next_call();
  const size_t elem_bytes = dtype == dnnl::memory::data_type::f32 ? 4 : 2;
  const int64_t tiles_m = (m + kTileM - 1) / kTileM, tiles_n = (n + kTileN - 1) / kTileN;
  // At most four tile shapes: full, short in M, short in N, short in both.
  const MatmulPlan* plans[2][2];
  for (int sm = 0; sm < 2; ++sm) {
    for (int sn = 0; sn < 2; ++sn) {
      int64_t tm = sm ? m - (tiles_m - 1) * kTileM : std::min(m, kTileM);
      int64_t tn = sn ? n - (tiles_n - 1) * kTileN : std::min(n, kTileN);
      plans[sm][sn] = &matmul_plan(MatmulKey{m, n, k, tm, tn, trans_a, trans_b, beta != 0.f,
                                             widen ? dnnl::memory::data_type::f32 : dtype, widen});
    }
  }
  const int64_t tiles = tiles_m * tiles_n;
  // widened: tiles in row order, a thread's run along a row keeping its widened a
  const int chunk = int(std::clamp<int64_t>(tiles / std::max(1, omp_get_max_threads()), 1, tiles_n));
  const auto* a_bytes = static_cast<const char*>(a);
  const auto* b_bytes = static_cast<const char*>(b);
  std::atomic<bool> out_of_memory{false};  // a tile oneDNN could not run for memory: thrown after the region
#pragma omp parallel if (tiles > 1)
  {
    omp_set_num_threads(1);  // this thread's own ICV: oneDNN runs each tile single-threaded
#pragma omp for schedule(dynamic, chunk)
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t ti = t / tiles_n, tj = t % tiles_n;
      const int64_t i0 = ti * kTileM, j0 = tj * kTileN;
      const MatmulPlan& plan = *plans[ti == tiles_m - 1][tj == tiles_n - 1];
      // Tile origins: a row i0 is at i0*K (stored (M,K)) or column i0 (stored (K,M)); b column
      // j0 is at j0 (stored (K,N)) or row j0*K (stored (N,K)).
      const void* a_tile = a_bytes + size_t(trans_a ? i0 : i0 * k) * elem_bytes;
      const void* b_tile = b_bytes + size_t(trans_b ? j0 * k : j0) * elem_bytes;
      float* c_tile = c + i0 * n + j0;
      const int64_t tm = std::min(kTileM, m - i0), tn = std::min(kTileN, n - j0);
      MatmulScratch& ws = matmul_scratch();
      if (widen) {  // op(a) rows [i0, i0 + tm) as (tm, K), op(b) columns [j0, j0 + tn) as (tn, K)
        float* a32 = scratch_grow(ws.a, size_t(kTileM * k));  // sized by K alone: one size per K
        if (ws.a_call != call || ws.a_tile != ti) {
          matmul_widen(a32, static_cast<const bf16*>(a), trans_a ? m : k, trans_a, i0, tm, k);
          ws.a_call = call, ws.a_tile = ti;
        }
        float* b32 = scratch_grow(ws.b, size_t(k * kTileN));
        if (ws.b_call != call || ws.b_tile != tj) {
          matmul_widen(b32, static_cast<const bf16*>(b), trans_b ? k : n, !trans_b, j0, tn, k);
          ws.b_call = call, ws.b_tile = tj;
        }
        a_tile = a32, b_tile = b32;
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
        if (e.status == dnnl_out_of_memory) {
          out_of_memory = true;
          continue;
        }
        STRATA_ASSERT(false, "oneDNN matmul failed (m=", m, " n=", n, " k=", k, "): ", e.what());
      }
      if (beta != 0.f) matmul_add_tile(c, n, i0, j0, c_tile, tm, tn);
    }
  }
  STRATA_CHECK_BUDGET(!out_of_memory, "oneDNN ran out of host memory running a matmul (m=", m, " n=", n, " k=", k,
                      "): the process is out of memory or address space (ulimit -v); lower the memory the recipe "
                      "needs, or device.cpu_threads");
}

// bf16 tiles through strata's AMX kernel (gemm_amx.h): tiles of near-equal sizes in whole 32s up to
// 256 x 256, fixed by the shape. op(b)'s tile columns go in bands of up to kAmxBandTiles per thread
// of the team: the team packs a band's columns once into the calling thread's shared buffer, then
// takes the band's tiles a row at a time, each thread packing op(a)'s tile row once for its run
// (kept across bands while the thread stays on that row). Measured on 2 AMX vCPUs against oneDNN
// 2.6's tiles on the large peer config's layer shapes (bits equal): x·W_upᵀ (2048, 2816, 1024) 1.41
// against 0.62 TFLOP/s, a 2048³ product 1.16 against 0.93, the other layer products about level
// (docs/benchmarks.md).
constexpr int64_t kAmxBandTiles = 4;

void matmul_run_amx(float* c, const bf16* a, const bf16* b, int64_t m, int64_t n, int64_t k, bool trans_a,
                    bool trans_b, float beta) {
  const int64_t call = matmul_next_call();
  const int64_t lda = trans_a ? m : k, ldb = trans_b ? k : n;
  const auto tile_size = [](int64_t size) {
    const int64_t count = (size + kTileM - 1) / kTileM, even = (size + count - 1) / count;
    return std::min(kTileM, (even + 31) / 32 * 32);
  };
  const int64_t tile_m = tile_size(m), tile_n = tile_size(n);
  const int64_t tiles_m = (m + tile_m - 1) / tile_m, tiles_n = (n + tile_n - 1) / tile_n;
  const int64_t words = gemm_amx_packed_words(kTileM, k);  // one tile row of op(a) or column of op(b)
  const int threads = omp_get_max_threads();
  const int64_t band = std::min(tiles_n, kAmxBandTiles * std::max(1, threads));
  auto* shared = reinterpret_cast<uint32_t*>(scratch_grow(matmul_scratch().shared, size_t(band * words)));
#pragma omp parallel if (tiles_m * tiles_n > 1)
  {
    for (int64_t b0 = 0; b0 < tiles_n; b0 += band) {  // every thread of the team takes every band
      const int64_t bn = std::min(band, tiles_n - b0), tiles = tiles_m * bn;
#pragma omp for schedule(static)
      for (int64_t q = 0; q < bn; ++q) {
        const int64_t j0 = (b0 + q) * tile_n;
        gemm_amx_pack_b(shared + q * words, b, ldb, trans_b, j0, std::min(tile_n, n - j0), k);
      }
      const int chunk = int(std::clamp<int64_t>(tiles / std::max(1, threads), 1, bn));
#pragma omp for schedule(dynamic, chunk)
      for (int64_t t = 0; t < tiles; ++t) {
        const int64_t ti = t / bn, tj = b0 + t % bn, i0 = ti * tile_m, j0 = tj * tile_n;
        const int64_t tm = std::min(tile_m, m - i0), tn = std::min(tile_n, n - j0);
        MatmulScratch& ws = matmul_scratch();
        auto* a_tile = reinterpret_cast<uint32_t*>(scratch_grow(ws.a, size_t(words)));
        if (ws.a_call != call || ws.a_tile != ti) {
          gemm_amx_pack_a(a_tile, a, lda, trans_a, i0, tm, k);
          ws.a_call = call, ws.a_tile = ti;
        }
        const uint32_t* b_tile = shared + (tj - b0) * words;
        if (beta == 0.f) {
          gemm_amx_tile(c + i0 * n + j0, n, a_tile, b_tile, tm, tn, k);
        } else {  // c + the finished sum
          float* sum = scratch_grow(ws.c, size_t(kTileM * kTileN));
          gemm_amx_tile(sum, tn, a_tile, b_tile, tm, tn, k);
          matmul_add_tile(c, n, i0, j0, sum, tm, tn);
        }
      }  // the loop's barrier: the band's tiles are done before the next band is packed over them
    }
  }
}

// Which tiles: oneDNN's (its f32 or bf16 kernels, or bf16 widened for its f32 kernel), or strata's
// (AVX2 panels, or the AMX tile for bf16).
enum class MatmulPath { onednn, onednn_widened, own, amx };

void matmul_run(float* c, const void* a, const void* b, int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b,
                float beta, dnnl::memory::data_type dtype, MatmulPath path) {
  STRATA_CHECK(m >= 0 && n >= 0 && k >= 0, "matmul: sizes must be >= 0, got m=", m, " n=", n,
               " k=", k);
  STRATA_CHECK(beta == 0.f || beta == 1.f, "matmul: beta must be 0 or 1, got ", beta);
  if (m == 0 || n == 0) return;
  if (k == 0) {  // an empty sum: c = beta * c
    if (beta == 0.f) std::fill(c, c + m * n, 0.f);
    return;
  }
  if (path == MatmulPath::amx)
    matmul_run_amx(c, static_cast<const bf16*>(a), static_cast<const bf16*>(b), m, n, k, trans_a, trans_b, beta);
  else if (path == MatmulPath::own)
    matmul_run_own(c, a, b, m, n, k, trans_a, trans_b, beta, dtype == dnnl::memory::data_type::bf16);
  else
    matmul_run_onednn(c, a, b, m, n, k, trans_a, trans_b, beta, dtype, path == MatmulPath::onednn_widened);
}

// bf16 on an AMX CPU through strata's AMX tile: products of at least 32 x 32 and K a multiple of 32
// (a thinner one, such as a decode step's few rows, wastes most of a 32 x 32 block; another K takes
// the scalar packers, measured at half oneDNN's rate). The choice follows the shape alone, so the
// bits never follow the thread count.
bool matmul_bf16_amx(int64_t m, int64_t n, int64_t k) {
  static const bool available = gemm_amx_available();
  return available && m >= 32 && n >= 32 && k >= 32 && k % 32 == 0;
}

// bf16 where oneDNN has no bf16 matmul: strata's kernel where it runs, else widened for oneDNN.
bool matmul_bf16_own() { return !matmul_bf16_native() && gemm_avx2_available(); }

}  // namespace

void matmul_f32(float* c, const float* a, const float* b, int64_t m, int64_t n, int64_t k,
                bool trans_a, bool trans_b, float beta) {
  matmul_run(c, a, b, m, n, k, trans_a, trans_b, beta, dnnl::memory::data_type::f32,
             matmul_own_f32() ? MatmulPath::own : MatmulPath::onednn);
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
  matmul_run(c, a, b, m, n, k, trans_a, trans_b, beta, dnnl::memory::data_type::bf16,
             matmul_bf16_amx(m, n, k) ? MatmulPath::amx
             : matmul_bf16_native()   ? MatmulPath::onednn
             : matmul_bf16_own()      ? MatmulPath::own
                                  : MatmulPath::onednn_widened);
}

void matmul_bf16_widened(float* c, const bf16* a, const bf16* b, int64_t m, int64_t n, int64_t k,
                         bool trans_a, bool trans_b, float beta) {
  matmul_run(c, a, b, m, n, k, trans_a, trans_b, beta, dnnl::memory::data_type::bf16, MatmulPath::onednn_widened);
}

size_t matmul_scratch_bytes(int64_t k, DType dtype) {
  STRATA_CHECK(k >= 0, "matmul_scratch_bytes: k must be >= 0, got ", k);
  // strata's kernel: a tile row of op(a) and a tile column of op(b) in its panels, and a thread's
  // share of a call's shared packed operand (the calling thread holds up to one tile row or
  // column per thread of the team); oneDNN widening bf16: op(a) (256, K) and op(b) (256, K)
  // strata's AMX tile: a tile row of op(a), and a thread's share of a band of op(b)'s tile columns
  // (kAmxBandTiles a thread, held by the calling thread for its team)
  if (dtype == DType::bf16 && gemm_amx_available())
    return (size_t((1 + kAmxBandTiles) * gemm_amx_packed_words(kTileM, k)) + size_t(kTileM * kTileN)) * sizeof(float);
  const bool own = dtype == DType::bf16 ? matmul_bf16_own() : matmul_own_f32();
  const bool widens = dtype == DType::bf16 && !matmul_bf16_native();
  const int64_t a_floats = gemm_packed_a_floats(kTileM, k), b_floats = gemm_packed_b_floats(kTileN, k);
  const size_t packed = own ? size_t(a_floats + b_floats + std::max(a_floats, b_floats))
                      : widens ? size_t(kTileM + kTileN) * size_t(k) : 0;
  return (packed + size_t(kTileM * kTileN)) * sizeof(float);
}

size_t matmul_scratch_held_bytes() {
  const MatmulScratch& ws = matmul_scratch();
  return (ws.a.capacity() + ws.b.capacity() + ws.c.capacity() + ws.shared.capacity()) * sizeof(float);
}

}  // namespace strata::cpu
