// Matmul on the CPU through oneDNN (twin: kernels/cpu/ref/matmul.h).
// c (M,N) = op(a) · op(b) + beta * c, row-major; transposes are expressed as strides of the
// memory descriptors (no copies), beta = 1 as a sum post-op, bf16 inputs accumulate in f32.
// Creating a oneDNN primitive costs far more than a small GEMM, so primitives are cached per
// shape; one engine and one stream serve the whole process.
#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

#include <oneapi/dnnl/dnnl.hpp>
#include <omp.h>

#include "kernels/cpu/ops.h"
#include "src/core/error.h"

namespace strata::cpu {
namespace {

// oneDNN sizes its work split for the OpenMP thread count seen at creation and expects the
// same count at execution, so the thread count is part of the key.
struct MatmulKey {
  int64_t m, n, k;
  bool trans_a, trans_b, accumulate;
  dnnl::memory::data_type dtype;
  int threads;
  bool operator<(const MatmulKey& o) const {
    return std::tie(m, n, k, trans_a, trans_b, accumulate, dtype, threads) <
           std::tie(o.m, o.n, o.k, o.trans_a, o.trans_b, o.accumulate, o.dtype, o.threads);
  }
};

struct MatmulPlan {
  dnnl::matmul prim;
  dnnl::memory::desc a_md, b_md, c_md;
};

dnnl::engine& matmul_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

dnnl::stream& matmul_stream() {
  static dnnl::stream stream(matmul_engine());
  return stream;
}

MatmulPlan matmul_make_plan(const MatmulKey& key) {
  using dims = dnnl::memory::dims;
  const int64_t m = key.m, n = key.n, k = key.k;
  // op(a) (M,K): stored (M,K) with strides {K,1}, or stored (K,M) read through strides {1,M}.
  dnnl::memory::desc a_md({m, k}, key.dtype, key.trans_a ? dims{1, m} : dims{k, 1});
  dnnl::memory::desc b_md({k, n}, key.dtype, key.trans_b ? dims{1, k} : dims{n, 1});
  dnnl::memory::desc c_md({m, n}, dnnl::memory::data_type::f32, dims{n, 1});
  dnnl::primitive_attr attr;
  if (key.accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.f);
    attr.set_post_ops(ops);
  }
  dnnl::matmul::desc desc(a_md, b_md, c_md);
  dnnl::matmul::primitive_desc pd(desc, attr, matmul_engine());
  return MatmulPlan{dnnl::matmul(pd), a_md, b_md, c_md};
}

// The cached plan for key, made on first use. Entries are never erased, so the reference
// stays valid after the lock is released; executing a primitive concurrently is safe.
const MatmulPlan& matmul_plan(const MatmulKey& key) {
  static std::mutex mutex;
  static std::map<MatmulKey, MatmulPlan> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, matmul_make_plan(key)).first;
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
  try {
    const MatmulPlan& plan =
        matmul_plan(MatmulKey{m, n, k, trans_a, trans_b, beta != 0.f, dtype, omp_get_max_threads()});
    dnnl::engine& engine = matmul_engine();
    dnnl::memory a_mem(plan.a_md, engine, const_cast<void*>(a));
    dnnl::memory b_mem(plan.b_md, engine, const_cast<void*>(b));
    dnnl::memory c_mem(plan.c_md, engine, c);
    plan.prim.execute(matmul_stream(),
                      {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem}});
    matmul_stream().wait();
  } catch (const dnnl::error& e) {
    STRATA_ASSERT(false, "oneDNN matmul failed (m=", m, " n=", n, " k=", k, "): ", e.what());
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
