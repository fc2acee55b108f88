// cuemu_blas.cpp - the cuBLAS and cuBLASLt calls strata's CUDA backend uses, as a CPU GEMM with
// the real column-major semantics and argument validation (a leading dimension smaller than the
// rows of the stored matrix is CUBLAS_STATUS_INVALID_VALUE, as cuBLAS documents). Inputs f32 or
// bf16, output f32 or bf16, f32 accumulation; beta == 0 never reads C (it may hold NaN poison).
// The GEMM runs on the handle's stream, in order with kernels and copies.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "tools/cuemu/cuemu_internal.h"

using namespace cuemu::detail;

struct cublasContext {
  cudaStream_t stream = nullptr;
  cublasPointerMode_t pointer_mode = CUBLAS_POINTER_MODE_HOST;
};
struct cublasLtContext {
  int unused = 0;
};

namespace {

// One stored matrix: element (r, c) of the rows x cols matrix, column- or row-major, per batch.
struct Operand {
  const void* data = nullptr;
  cudaDataType type = CUDA_R_32F;
  int64_t rows = 0, cols = 0, ld = 0;
  bool row_major = false;
  int64_t batch_stride = 0;
  float at(int64_t batch, int64_t r, int64_t c) const {
    int64_t i = batch * batch_stride + (row_major ? r * ld + c : r + c * ld);
    return type == CUDA_R_32F ? static_cast<const float*>(data)[i]
                              : __bfloat162float(static_cast<const __nv_bfloat16*>(data)[i]);
  }
  // Bytes from the start to one past the last element read (for the device-range check).
  size_t extent_bytes(int64_t batches) const {
    if (rows == 0 || cols == 0) return 0;
    int64_t last = row_major ? (rows - 1) * ld + cols - 1 : (cols - 1) * ld + rows - 1;
    last += (batches - 1) * batch_stride;
    return static_cast<size_t>(last + 1) * (type == CUDA_R_32F ? 4 : 2);
  }
};

bool type_supported(cudaDataType t) { return t == CUDA_R_32F || t == CUDA_R_16BF; }

enum class Epilogue { none, bias, relu, relu_bias, gelu, gelu_bias };

struct GemmJob {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0, batches = 1;
  Operand a, b, c;                   // a, b stored; c read when beta != 0
  void* d = nullptr;                 // output, laid out like `d_layout`
  Operand d_layout;
  const float* alpha_ptr = nullptr;  // device pointer mode: read when the GEMM runs
  const float* beta_ptr = nullptr;
  float alpha = 1.f, beta = 0.f;
  Epilogue epilogue = Epilogue::none;
  const void* bias = nullptr;
  cudaDataType bias_type = CUDA_R_32F;
};

float gelu_tanh(float x) { return 0.5f * x * (1.f + std::tanh(0.7978845608f * (x + 0.044715f * x * x * x))); }

void gemm_run(const GemmJob& j) {
  float alpha = j.alpha_ptr ? *j.alpha_ptr : j.alpha;
  float beta = j.beta_ptr ? *j.beta_ptr : j.beta;
  std::vector<float> opa(static_cast<size_t>(j.m * j.k)), opb(static_cast<size_t>(j.n * j.k));  // (m,k), (n,k)
  for (int64_t bt = 0; bt < j.batches; ++bt) {
    for (int64_t i = 0; i < j.m; ++i)
      for (int64_t p = 0; p < j.k; ++p) opa[i * j.k + p] = j.trans_a ? j.a.at(bt, p, i) : j.a.at(bt, i, p);
    for (int64_t c = 0; c < j.n; ++c)
      for (int64_t p = 0; p < j.k; ++p) opb[c * j.k + p] = j.trans_b ? j.b.at(bt, c, p) : j.b.at(bt, p, c);
    for (int64_t c = 0; c < j.n; ++c)
      for (int64_t i = 0; i < j.m; ++i) {
        const float* x = &opa[i * j.k];
        const float* y = &opb[c * j.k];
        float acc = 0.f;
        for (int64_t p = 0; p < j.k; ++p) acc += x[p] * y[p];
        float v = alpha * acc;
        if (beta != 0.f) v += beta * j.c.at(bt, i, c);
        if (j.epilogue == Epilogue::bias || j.epilogue == Epilogue::relu_bias || j.epilogue == Epilogue::gelu_bias)
          v += j.bias_type == CUDA_R_32F ? static_cast<const float*>(j.bias)[i]
                                         : __bfloat162float(static_cast<const __nv_bfloat16*>(j.bias)[i]);
        if (j.epilogue == Epilogue::relu || j.epilogue == Epilogue::relu_bias) v = std::max(v, 0.f);
        if (j.epilogue == Epilogue::gelu || j.epilogue == Epilogue::gelu_bias) v = gelu_tanh(v);
        const Operand& dl = j.d_layout;
        int64_t idx = bt * dl.batch_stride + (dl.row_major ? i * dl.ld + c : i + c * dl.ld);
        if (dl.type == CUDA_R_32F) static_cast<float*>(j.d)[idx] = v;
        else static_cast<__nv_bfloat16*>(j.d)[idx] = __float2bfloat16(v);
      }
  }
}

// The device-memory checks every GEMM gets: a GPU would fault on a host pointer or on reading past
// an allocation; cuemu refuses the call instead and says which operand.
bool operand_in_device(const char* call, const char* name, const Operand& o, int64_t batches) {
  size_t bytes = o.extent_bytes(batches);
  if (bytes == 0 || is_device_range(o.data, bytes)) return true;
  report("%s: %s (%p, %zu bytes as laid out) is not inside one device allocation", call, name, o.data, bytes);
  return false;
}

cublasStatus_t gemm_submit(const char* call, cudaStream_t stream, const GemmJob& j) {
  if (!operand_in_device(call, "A", j.a, j.batches) || !operand_in_device(call, "B", j.b, j.batches) ||
      (j.beta_ptr == nullptr && j.beta != 0.f && !operand_in_device(call, "C", j.c, j.batches)) ||
      !operand_in_device(call, "D/C output", Operand{j.d, j.d_layout.type, j.m, j.n, j.d_layout.ld,
                                                     j.d_layout.row_major, j.d_layout.batch_stride},
                         j.batches))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (j.m == 0 || j.n == 0) return CUBLAS_STATUS_SUCCESS;
  if (stream_submit(stream, [j] { gemm_run(j); }) != cudaSuccess) return CUBLAS_STATUS_EXECUTION_FAILED;
  return CUBLAS_STATUS_SUCCESS;
}

bool compute_32f(cublasComputeType_t t) {
  return t == CUBLAS_COMPUTE_32F || t == CUBLAS_COMPUTE_32F_PEDANTIC || t == CUBLAS_COMPUTE_32F_FAST_16BF ||
         t == CUBLAS_COMPUTE_32F_FAST_TF32;
}

// cublasGemmEx and its strided-batched form, validated as cuBLAS documents.
cublasStatus_t gemm_ex(const char* call, cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                       int k, const void* alpha, const void* A, cudaDataType at, int lda, long long stride_a,
                       const void* B, cudaDataType bt, int ldb, long long stride_b, const void* beta, void* C,
                       cudaDataType ct, int ldc, long long stride_c, int batches, cublasComputeType_t compute) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  auto op_ok = [](cublasOperation_t o) { return o == CUBLAS_OP_N || o == CUBLAS_OP_T || o == CUBLAS_OP_C; };
  if (!op_ok(ta) || !op_ok(tb) || m < 0 || n < 0 || k < 0 || batches < 0) return CUBLAS_STATUS_INVALID_VALUE;
  int a_rows = ta == CUBLAS_OP_N ? m : k, b_rows = tb == CUBLAS_OP_N ? k : n;
  if (lda < std::max(1, a_rows) || ldb < std::max(1, b_rows) || ldc < std::max(1, m)) {
    report("%s: leading dimension too small: lda=%d (needs >= %d), ldb=%d (needs >= %d), ldc=%d (needs >= %d)", call,
           lda, std::max(1, a_rows), ldb, std::max(1, b_rows), ldc, std::max(1, m));
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (!compute_32f(compute) || !type_supported(at) || at != bt || !type_supported(ct) ||
      (at == CUDA_R_32F && ct != CUDA_R_32F))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (!alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
  GemmJob j;
  j.trans_a = ta != CUBLAS_OP_N;
  j.trans_b = tb != CUBLAS_OP_N;
  j.m = m;
  j.n = n;
  j.k = k;
  j.batches = batches;
  j.a = {A, at, a_rows, ta == CUBLAS_OP_N ? k : m, lda, false, stride_a};
  j.b = {B, bt, b_rows, tb == CUBLAS_OP_N ? n : k, ldb, false, stride_b};
  j.c = {C, ct, m, n, ldc, false, stride_c};
  j.d = C;
  j.d_layout = j.c;
  if (h->pointer_mode == CUBLAS_POINTER_MODE_DEVICE) {
    j.alpha_ptr = static_cast<const float*>(alpha);
    j.beta_ptr = static_cast<const float*>(beta);
  } else {
    j.alpha = *static_cast<const float*>(alpha);
    j.beta = *static_cast<const float*>(beta);
  }
  if (batches == 0) return CUBLAS_STATUS_SUCCESS;
  if (k == 0) {  // nothing to read from A or B
    j.a.rows = j.a.cols = 0;
    j.b.rows = j.b.cols = 0;
  }
  return gemm_submit(call, h->stream, j);
}

// ---- cuBLASLt descriptors, stored inside the semi-opaque structs the header defines ------------
struct LayoutState {
  cudaDataType type;
  int32_t order;
  uint64_t rows, cols;
  int64_t ld;
  int32_t batch_count;
  int64_t batch_stride;
};
static_assert(sizeof(LayoutState) <= sizeof(cublasLtMatrixLayoutOpaque_t));

struct DescState {
  cublasComputeType_t compute;
  cudaDataType scale;
  int32_t pointer_mode;
  int32_t trans_a, trans_b;
  uint32_t epilogue;
  const void* bias;
  int32_t bias_type;  // -1: same as D
};
static_assert(sizeof(DescState) <= sizeof(cublasLtMatmulDescOpaque_t));

struct PrefState {
  uint64_t max_workspace_bytes;
};
static_assert(sizeof(PrefState) <= sizeof(cublasLtMatmulPreferenceOpaque_t));

LayoutState* layout_of(cublasLtMatrixLayout_t l) { return reinterpret_cast<LayoutState*>(l->data); }
DescState* desc_of(cublasLtMatmulDesc_t d) { return reinterpret_cast<DescState*>(d->data); }
PrefState* pref_of(cublasLtMatmulPreference_t p) { return reinterpret_cast<PrefState*>(p->data); }

template <class T>
cublasStatus_t attr_write(T& field, const void* buf, size_t bytes) {
  if (!buf || bytes != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(&field, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}
template <class T>
cublasStatus_t attr_read(const T& field, void* buf, size_t bytes, size_t* written) {
  if (bytes == 0) {
    if (!written) return CUBLAS_STATUS_INVALID_VALUE;
    *written = sizeof(T);
    return CUBLAS_STATUS_SUCCESS;
  }
  if (!buf || bytes != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(buf, &field, sizeof(T));
  if (written) *written = sizeof(T);
  return CUBLAS_STATUS_SUCCESS;
}

void layout_init(LayoutState* s, cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld) {
  *s = LayoutState{type, CUBLASLT_ORDER_COL, rows, cols, ld, 1, 0};
}
void desc_init(DescState* s, cublasComputeType_t compute, cudaDataType scale) {
  *s = DescState{compute, scale, CUBLASLT_POINTER_MODE_HOST, CUBLAS_OP_N, CUBLAS_OP_N, CUBLASLT_EPILOGUE_DEFAULT,
                 nullptr, -1};
}

// Calls f(field) on the field of a layout or matmul descriptor that `attr` names
// (CUBLAS_STATUS_NOT_SUPPORTED for others): one table per descriptor for setting and getting.
template <class State, class F>
cublasStatus_t state_field(State& s, cublasLtMatrixLayoutAttribute_t attr, F f) {
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE: return f(s.type);
    case CUBLASLT_MATRIX_LAYOUT_ORDER: return f(s.order);
    case CUBLASLT_MATRIX_LAYOUT_ROWS: return f(s.rows);
    case CUBLASLT_MATRIX_LAYOUT_COLS: return f(s.cols);
    case CUBLASLT_MATRIX_LAYOUT_LD: return f(s.ld);
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return f(s.batch_count);
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: return f(s.batch_stride);
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}
template <class State, class F>
cublasStatus_t state_field(State& s, cublasLtMatmulDescAttributes_t attr, F f) {
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: return f(s.compute);
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: return f(s.scale);
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: return f(s.pointer_mode);
    case CUBLASLT_MATMUL_DESC_TRANSA: return f(s.trans_a);
    case CUBLASLT_MATMUL_DESC_TRANSB: return f(s.trans_b);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return f(s.epilogue);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return f(s.bias);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return f(s.bias_type);
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

// cublasLt*SetAttribute / GetAttribute of a descriptor's state (layout or matmul descriptor).
template <class State, class Attr>
cublasStatus_t state_set(State* s, Attr attr, const void* buf, size_t bytes) {
  return state_field(*s, attr, [&](auto& field) { return attr_write(field, buf, bytes); });
}
template <class State, class Attr>
cublasStatus_t state_get(const State* s, Attr attr, void* buf, size_t bytes, size_t* written) {
  return state_field(*s, attr, [&](const auto& field) { return attr_read(field, buf, bytes, written); });
}

template <class Opaque>
cublasStatus_t descriptor_destroy(Opaque* d) {
  delete d;
  return CUBLAS_STATUS_SUCCESS;
}

// A new cuBLAS or cuBLASLt context in *h; CUBLAS_STATUS_NOT_INITIALIZED when there is no device.
template <class Context>
cublasStatus_t context_create(Context** h) {
  if (!h) return CUBLAS_STATUS_INVALID_VALUE;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return CUBLAS_STATUS_NOT_INITIALIZED;
  }
  *h = new Context;
  return CUBLAS_STATUS_SUCCESS;
}

bool layout_ld_ok(const LayoutState& l) {
  if (l.order == CUBLASLT_ORDER_COL) return l.ld >= std::max<int64_t>(1, static_cast<int64_t>(l.rows));
  if (l.order == CUBLASLT_ORDER_ROW) return l.ld >= std::max<int64_t>(1, static_cast<int64_t>(l.cols));
  return false;
}

Operand operand_of(const void* data, const LayoutState& l) {
  return Operand{data, l.type, static_cast<int64_t>(l.rows), static_cast<int64_t>(l.cols), l.ld,
                 l.order == CUBLASLT_ORDER_ROW, l.batch_stride};
}

}  // namespace

extern "C" {

// ---- cuBLAS --------------------------------------------------------------------------------------
cublasStatus_t cublasCreate_v2(cublasHandle_t* h) { return context_create(h); }
cublasStatus_t cublasDestroy_v2(cublasHandle_t h) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  cudaStreamSynchronize(h->stream);
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!stream_known(s)) return CUBLAS_STATUS_INVALID_VALUE;
  h->stream = s;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasGetStream_v2(cublasHandle_t h, cudaStream_t* s) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  *s = h->stream;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t h, void* workspace, size_t bytes) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (bytes > 0 && !is_device_range(workspace, bytes)) return CUBLAS_STATUS_INVALID_VALUE;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode) {
  return h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}
cublasStatus_t cublasSetPointerMode_v2(cublasHandle_t h, cublasPointerMode_t mode) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  h->pointer_mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasGetPointerMode_v2(cublasHandle_t h, cublasPointerMode_t* mode) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  *mode = h->pointer_mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void* alpha, const void* A, cudaDataType at, int lda, const void* B,
                            cudaDataType bt, int ldb, const void* beta, void* C, cudaDataType ct, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t algo) {
  return gemm_ex("cublasGemmEx", h, ta, tb, m, n, k, alpha, A, at, lda, 0, B, bt, ldb, 0, beta, C, ct, ldc, 0, 1,
                 compute);
}
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                          int k, const void* alpha, const void* A, cudaDataType at, int lda,
                                          long long stride_a, const void* B, cudaDataType bt, int ldb,
                                          long long stride_b, const void* beta, void* C, cudaDataType ct, int ldc,
                                          long long stride_c, int batches, cublasComputeType_t compute,
                                          cublasGemmAlgo_t algo) {
  return gemm_ex("cublasGemmStridedBatchedEx", h, ta, tb, m, n, k, alpha, A, at, lda, stride_a, B, bt, ldb,
                 stride_b, beta, C, ct, ldc, stride_c, batches, compute);
}
cublasStatus_t cublasSgemm_v2(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                              const float* alpha, const float* A, int lda, const float* B, int ldb, const float* beta,
                              float* C, int ldc) {
  return gemm_ex("cublasSgemm", h, ta, tb, m, n, k, alpha, A, CUDA_R_32F, lda, 0, B, CUDA_R_32F, ldb, 0, beta, C,
                 CUDA_R_32F, ldc, 0, 1, CUBLAS_COMPUTE_32F);
}
cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                         int k, const float* alpha, const float* A, int lda, long long stride_a,
                                         const float* B, int ldb, long long stride_b, const float* beta, float* C,
                                         int ldc, long long stride_c, int batches) {
  return gemm_ex("cublasSgemmStridedBatched", h, ta, tb, m, n, k, alpha, A, CUDA_R_32F, lda, stride_a, B, CUDA_R_32F,
                 ldb, stride_b, beta, C, CUDA_R_32F, ldc, stride_c, batches, CUBLAS_COMPUTE_32F);
}

// ---- cuBLASLt ------------------------------------------------------------------------------------
cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) { return context_create(h); }
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutInit_internal(cublasLtMatrixLayout_t l, size_t size, cudaDataType type,
                                                 uint64_t rows, uint64_t cols, int64_t ld) {
  if (!l || size < sizeof(LayoutState)) return CUBLAS_STATUS_INVALID_VALUE;
  layout_init(layout_of(l), type, rows, cols, ld);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType type, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
  if (!l) return CUBLAS_STATUS_INVALID_VALUE;
  *l = new cublasLtMatrixLayoutOpaque_t{};
  layout_init(layout_of(*l), type, rows, cols, ld);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) { return descriptor_destroy(l); }
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t bytes) {
  return l ? state_set(layout_of(l), attr, buf, bytes) : CUBLAS_STATUS_INVALID_VALUE;
}
cublasStatus_t cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr,
                                                void* buf, size_t bytes, size_t* written) {
  return l ? state_get(layout_of(l), attr, buf, bytes, written) : CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatmulDescInit_internal(cublasLtMatmulDesc_t d, size_t size, cublasComputeType_t compute,
                                               cudaDataType_t scale) {
  if (!d || size < sizeof(DescState)) return CUBLAS_STATUS_INVALID_VALUE;
  desc_init(desc_of(d), compute, scale);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute, cudaDataType_t scale) {
  if (!d) return CUBLAS_STATUS_INVALID_VALUE;
  *d = new cublasLtMatmulDescOpaque_t{};
  desc_init(desc_of(*d), compute, scale);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) { return descriptor_destroy(d); }
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t bytes) {
  return d ? state_set(desc_of(d), attr, buf, bytes) : CUBLAS_STATUS_INVALID_VALUE;
}
cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, void* buf,
                                              size_t bytes, size_t* written) {
  return d ? state_get(desc_of(d), attr, buf, bytes, written) : CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatmulPreferenceInit_internal(cublasLtMatmulPreference_t p, size_t size) {
  if (!p || size < sizeof(PrefState)) return CUBLAS_STATUS_INVALID_VALUE;
  *pref_of(p) = PrefState{0};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
  if (!p) return CUBLAS_STATUS_INVALID_VALUE;
  *p = new cublasLtMatmulPreferenceOpaque_t{};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) { return descriptor_destroy(p); }
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t bytes) {
  if (!p) return CUBLAS_STATUS_INVALID_VALUE;
  if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) return attr_write(pref_of(p)->max_workspace_bytes, buf, bytes);
  return CUBLAS_STATUS_SUCCESS;  // search-tuning hints: no effect on a CPU GEMM
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int* returned) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (requested <= 0 || !results || !returned) return CUBLAS_STATUS_INVALID_VALUE;
  std::memset(&results[0], 0, sizeof results[0]);
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].workspaceSize = 0;
  results[0].wavesCount = 1.f;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, const void* alpha, const void* A,
                              cublasLtMatrixLayout_t a_desc, const void* B, cublasLtMatrixLayout_t b_desc,
                              const void* beta, const void* C, cublasLtMatrixLayout_t c_desc, void* D,
                              cublasLtMatrixLayout_t d_desc, const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspace_bytes, cudaStream_t stream) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!desc || !a_desc || !b_desc || !c_desc || !d_desc || !alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
  const DescState& s = *desc_of(desc);
  const LayoutState &la = *layout_of(a_desc), &lb = *layout_of(b_desc), &lc = *layout_of(c_desc),
                    &ld = *layout_of(d_desc);
  const char* call = "cublasLtMatmul";
  if (!layout_ld_ok(la) || !layout_ld_ok(lb) || !layout_ld_ok(lc) || !layout_ld_ok(ld)) {
    report("%s: a leading dimension is smaller than its layout's rows (column order) or columns (row order): "
           "A ld=%lld, B ld=%lld, C ld=%lld, D ld=%lld", call, static_cast<long long>(la.ld),
           static_cast<long long>(lb.ld), static_cast<long long>(lc.ld), static_cast<long long>(ld.ld));
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  bool ta = s.trans_a != CUBLAS_OP_N, tb = s.trans_b != CUBLAS_OP_N;
  uint64_t m = ld.rows, n = ld.cols;
  uint64_t am = ta ? la.cols : la.rows, ak = ta ? la.rows : la.cols;
  uint64_t bk = tb ? lb.cols : lb.rows, bn = tb ? lb.rows : lb.cols;
  if (am != m || bn != n || ak != bk || lc.rows != m || lc.cols != n) {
    report("%s: shapes disagree: op(A) %llux%llu, op(B) %llux%llu, C %llux%llu, D %llux%llu", call,
           static_cast<unsigned long long>(am), static_cast<unsigned long long>(ak),
           static_cast<unsigned long long>(bk), static_cast<unsigned long long>(bn),
           static_cast<unsigned long long>(lc.rows), static_cast<unsigned long long>(lc.cols),
           static_cast<unsigned long long>(m), static_cast<unsigned long long>(n));
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  int batches = ld.batch_count;
  if (la.batch_count != batches || lb.batch_count != batches || lc.batch_count != batches || batches < 1)
    return CUBLAS_STATUS_INVALID_VALUE;
  if (!compute_32f(s.compute) || s.scale != CUDA_R_32F || !type_supported(la.type) || la.type != lb.type ||
      !type_supported(ld.type) || lc.type != ld.type || (la.type == CUDA_R_32F && ld.type != CUDA_R_32F))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (workspace_bytes > 0 && !is_device_range(workspace, workspace_bytes)) {
    report("%s: workspace %p (%zu bytes) is not device memory", call, workspace, workspace_bytes);
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  GemmJob j;
  switch (s.epilogue) {
    case CUBLASLT_EPILOGUE_DEFAULT: j.epilogue = Epilogue::none; break;
    case CUBLASLT_EPILOGUE_BIAS: j.epilogue = Epilogue::bias; break;
    case CUBLASLT_EPILOGUE_RELU: j.epilogue = Epilogue::relu; break;
    case CUBLASLT_EPILOGUE_RELU_BIAS: j.epilogue = Epilogue::relu_bias; break;
    case CUBLASLT_EPILOGUE_GELU: j.epilogue = Epilogue::gelu; break;
    case CUBLASLT_EPILOGUE_GELU_BIAS: j.epilogue = Epilogue::gelu_bias; break;
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (j.epilogue == Epilogue::bias || j.epilogue == Epilogue::relu_bias || j.epilogue == Epilogue::gelu_bias) {
    j.bias = s.bias;
    j.bias_type = s.bias_type < 0 ? ld.type : static_cast<cudaDataType>(s.bias_type);
    size_t bias_bytes = m * (j.bias_type == CUDA_R_32F ? 4 : 2);
    if (!type_supported(j.bias_type)) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (!is_device_range(j.bias, bias_bytes)) {
      report("%s: bias %p (%zu bytes) is not inside one device allocation", call, j.bias, bias_bytes);
      return CUBLAS_STATUS_INVALID_VALUE;
    }
  }
  j.trans_a = ta;
  j.trans_b = tb;
  j.m = static_cast<int64_t>(m);
  j.n = static_cast<int64_t>(n);
  j.k = static_cast<int64_t>(ak);
  j.batches = batches;
  j.a = operand_of(A, la);
  j.b = operand_of(B, lb);
  j.c = operand_of(C, lc);
  j.d = D;
  j.d_layout = operand_of(D, ld);
  if (s.pointer_mode == CUBLASLT_POINTER_MODE_DEVICE) {
    j.alpha_ptr = static_cast<const float*>(alpha);
    j.beta_ptr = static_cast<const float*>(beta);
  } else {
    j.alpha = *static_cast<const float*>(alpha);
    j.beta = *static_cast<const float*>(beta);
  }
  if (j.k == 0) {
    j.a.rows = j.a.cols = 0;
    j.b.rows = j.b.cols = 0;
  }
  return gemm_submit(call, stream, j);
}

}  // extern "C"
