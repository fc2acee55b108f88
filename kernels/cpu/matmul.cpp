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
// (m, n, k, tile shape, transposes, beta, dtype); one engine serves the process, and each
// thread executes on its own stream so concurrent tiles never share one.
#include <algorithm>
#include <map>
#include <mutex>
#include <vector>
#include <tuple>

#include <oneapi/dnnl/dnnl.hpp>
#include <omp.h>

#include "kernels/cpu/ops.h"
#include "src/core/error.h"

namespace strata::cpu {
namespace {

constexpr int64_t kTileM = 256, kTileN = 256;  // fixed: the tiling must not follow threads

struct MatmulKey {
  int64_t m, n, k, tile_m, tile_n;
  bool trans_a, trans_b, accumulate;
  dnnl::memory::data_type dtype;
  bool operator<(const MatmulKey& o) const {
    return std::tie(m, n, k, tile_m, tile_n, trans_a, trans_b, accumulate, dtype) <
           std::tie(o.m, o.n, o.k, o.tile_m, o.tile_n, o.trans_a, o.trans_b, o.accumulate,
                    o.dtype);
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
  // op(a) tile (tm,K): a stored (M,K) has strides {K,1}; a stored (K,M) is read as {1,M}.
  dnnl::memory::desc a_md({tm, k}, key.dtype, key.trans_a ? dims{1, m} : dims{k, 1});
  // op(b) tile (K,tn): b stored (K,N) has strides {N,1}; b stored (N,K) is read as {1,K}.
  dnnl::memory::desc b_md({k, tn}, key.dtype, key.trans_b ? dims{1, k} : dims{n, 1});
  dnnl::memory::desc c_md({tm, tn}, dnnl::memory::data_type::f32, dims{n, 1});
  dnnl::primitive_attr attr;
  // A user scratchpad per thread: oneDNN's library scratchpad is shared between concurrent
  // executions (Debian's build has no concurrent-exec support), and tiles run concurrently.
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (key.accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.f);
    attr.set_post_ops(ops);
  }
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

void matmul_run(float* c, const void* a, const void* b, int64_t m, int64_t n, int64_t k,
                bool trans_a, bool trans_b, float beta, dnnl::memory::data_type dtype) {
  STRATA_CHECK(m >= 0 && n >= 0 && k >= 0, "matmul: sizes must be >= 0, got m=", m, " n=", n,
               " k=", k);
  STRATA_CHECK(beta == 0.f || beta == 1.f, "matmul: beta must be 0 or 1, got ", beta);
  if (m == 0 || n == 0) return;
  if (k == 0) {  // an empty sum: c = beta * c
    if (beta == 0.f) std::fill(c, c + m * n, 0.f);
    return;
  }
  const size_t elem_bytes = dtype == dnnl::memory::data_type::f32 ? 4 : 2;
  const int64_t tiles_m = (m + kTileM - 1) / kTileM, tiles_n = (n + kTileN - 1) / kTileN;
  // At most four tile shapes: full, short in M, short in N, short in both.
  const MatmulPlan* plans[2][2];
  for (int sm = 0; sm < 2; ++sm) {
    for (int sn = 0; sn < 2; ++sn) {
      int64_t tm = sm ? m - (tiles_m - 1) * kTileM : std::min(m, kTileM);
      int64_t tn = sn ? n - (tiles_n - 1) * kTileN : std::min(n, kTileN);
      plans[sm][sn] = &matmul_plan(
          MatmulKey{m, n, k, tm, tn, trans_a, trans_b, beta != 0.f, dtype});
    }
  }
  const int64_t tiles = tiles_m * tiles_n;
  const auto* a_bytes = static_cast<const char*>(a);
  const auto* b_bytes = static_cast<const char*>(b);
#pragma omp parallel if (tiles > 1)
  {
    omp_set_num_threads(1);  // this thread's own ICV: oneDNN runs each tile single-threaded
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t ti = t / tiles_n, tj = t % tiles_n;
      const int64_t i0 = ti * kTileM, j0 = tj * kTileN;
      const MatmulPlan& plan = *plans[ti == tiles_m - 1][tj == tiles_n - 1];
      // Tile origins: a row i0 is at i0*K (stored (M,K)) or column i0 (stored (K,M)); b column
      // j0 is at j0 (stored (K,N)) or row j0*K (stored (N,K)).
      const size_t a_off = size_t(trans_a ? i0 : i0 * k) * elem_bytes;
      const size_t b_off = size_t(trans_b ? j0 * k : j0) * elem_bytes;
      try {
        dnnl::engine& engine = matmul_engine();
        dnnl::memory a_mem(plan.a_md, engine, const_cast<char*>(a_bytes + a_off));
        dnnl::memory b_mem(plan.b_md, engine, const_cast<char*>(b_bytes + b_off));
        dnnl::memory c_mem(plan.c_md, engine, c + i0 * n + j0);
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
    }
  }
}

}  // namespace

void matmul_f32(float* c, const float* a, const float* b, int64_t m, int64_t n, int64_t k,
                bool trans_a, bool trans_b, float beta) {
  matmul_run(c, a, b, m, n, k, trans_a, trans_b, beta, dnnl::memory::data_type::f32);
}

void matmul_bf16(float* c, const bf16* a, const bf16* b, int64_t m, int64_t n, int64_t k,
                 bool trans_a, bool trans_b, float beta) {
  matmul_run(c, a, b, m, n, k, trans_a, trans_b, beta, dnnl::memory::data_type::bf16);
}

}  // namespace strata::cpu
