// Tests of cuemu's cuBLAS / cuBLASLt: column-major GEMM results against a naive fp64 loop for every
// transpose pair with f32 and bf16 inputs (f32 and bf16 outputs), padded leading dimensions, beta,
// strided batches, Lt row-major layouts with a bias epilogue, and the seeded bug of a wrong leading
// dimension (CUBLAS_STATUS_INVALID_VALUE).
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

namespace {

// A cuBLAS handle for one test case, on the default stream or on a stream of its own, destroyed
// (the handle first) when the case ends.
struct BlasHandle {
  cublasHandle_t h = nullptr;
  cudaStream_t stream = nullptr;
  explicit BlasHandle(bool own_stream = false) {
    REQUIRE(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
    if (!own_stream) return;
    REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
    REQUIRE(cublasSetStream(h, stream) == CUBLAS_STATUS_SUCCESS);
  }
  ~BlasHandle() {
    cublasDestroy(h);
    if (stream) cudaStreamDestroy(stream);
  }
  BlasHandle(const BlasHandle&) = delete;
  BlasHandle& operator=(const BlasHandle&) = delete;
};

struct CudaFree {
  void operator()(void* p) const { cudaFree(p); }
};

// Device memory for one test case (or one loop pass), freed when it goes out of scope.
class DeviceMemory {
 public:
  void* alloc(size_t bytes) {
    void* d = nullptr;
    REQUIRE(cudaMalloc(&d, bytes) == cudaSuccess);
    ptrs_.emplace_back(d);
    return d;
  }
  void* copy(const void* host, size_t bytes) {
    void* d = alloc(bytes);
    REQUIRE(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice) == cudaSuccess);
    return d;
  }

 private:
  std::vector<std::unique_ptr<void, CudaFree>> ptrs_;
};

// A column-major rows x cols matrix with leading dimension ld, seeded, values exact in bf16.
std::vector<float> random_matrix(int rows, int cols, int ld, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(-64, 64);
  std::vector<float> m(static_cast<size_t>(ld) * cols, 1e30f);  // padding: huge, so reading it shows
  for (int c = 0; c < cols; ++c)
    for (int r = 0; r < rows; ++r) m[static_cast<size_t>(c) * ld + r] = float(dist(rng)) / 32.f;
  return m;
}

std::vector<__nv_bfloat16> to_bf16(const std::vector<float>& v) {
  std::vector<__nv_bfloat16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = __float2bfloat16(v[i]);
  return out;
}

// C(m,n) = alpha op(A) op(B) + beta C, column-major, in fp64.
std::vector<double> gemm_reference(bool ta, bool tb, int m, int n, int k, double alpha, const std::vector<float>& a,
                                   int lda, const std::vector<float>& b, int ldb, double beta,
                                   const std::vector<float>& c, int ldc) {
  std::vector<double> out(static_cast<size_t>(ldc) * n);
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      double acc = 0;
      for (int p = 0; p < k; ++p) {
        double av = ta ? a[static_cast<size_t>(i) * lda + p] : a[static_cast<size_t>(p) * lda + i];
        double bv = tb ? b[static_cast<size_t>(p) * ldb + j] : b[static_cast<size_t>(j) * ldb + p];
        acc += av * bv;
      }
      out[static_cast<size_t>(j) * ldc + i] = alpha * acc + (beta != 0 ? beta * c[static_cast<size_t>(j) * ldc + i] : 0);
    }
  return out;
}

}  // namespace

TEST_CASE("cuemu cublasGemmEx matches a naive column-major loop for every transpose", "[cuda-emu]") {
  const BlasHandle blas(true);
  cublasHandle_t h = blas.h;
  cudaStream_t s = blas.stream;
  const int m = 17, n = 5, k = 33;
  for (int inputs_bf16 = 0; inputs_bf16 < 2; ++inputs_bf16)
    for (int out_bf16 = 0; out_bf16 <= inputs_bf16; ++out_bf16)
      for (int ta = 0; ta < 2; ++ta)
        for (int tb = 0; tb < 2; ++tb)
          for (float beta : {0.f, 1.f}) {
            const int a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k, b_cols = tb ? k : n;
            const int lda = a_rows + 3, ldb = b_rows + 1, ldc = m + 2;  // padded on purpose
            std::vector<float> a = random_matrix(a_rows, a_cols, lda, 1 + ta);
            std::vector<float> b = random_matrix(b_rows, b_cols, ldb, 3 + tb);
            std::vector<float> c = random_matrix(m, n, ldc, 5);
            std::vector<double> want = gemm_reference(ta, tb, m, n, k, 1.5, a, lda, b, ldb, beta, c, ldc);
            const cudaDataType in_type = inputs_bf16 ? CUDA_R_16BF : CUDA_R_32F;
            const cudaDataType out_type = out_bf16 ? CUDA_R_16BF : CUDA_R_32F;
            std::vector<__nv_bfloat16> a16 = to_bf16(a), b16 = to_bf16(b), c16 = to_bf16(c);
            DeviceMemory mem;  // freed at the end of each pass
            void* da = inputs_bf16 ? mem.copy(a16.data(), a16.size() * 2) : mem.copy(a.data(), a.size() * 4);
            void* db = inputs_bf16 ? mem.copy(b16.data(), b16.size() * 2) : mem.copy(b.data(), b.size() * 4);
            void* dc = out_bf16 ? mem.copy(c16.data(), c16.size() * 2) : mem.copy(c.data(), c.size() * 4);
            const float alpha = 1.5f;
            REQUIRE(cublasGemmEx(h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha,
                                 da, in_type, lda, db, in_type, ldb, &beta, dc, out_type, ldc, CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
            REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
            std::vector<float> got(c.size());
            if (out_bf16) {
              std::vector<__nv_bfloat16> g16(c.size());
              REQUIRE(cudaMemcpy(g16.data(), dc, g16.size() * 2, cudaMemcpyDeviceToHost) == cudaSuccess);
              for (size_t i = 0; i < got.size(); ++i) got[i] = __bfloat162float(g16[i]);
            } else {
              REQUIRE(cudaMemcpy(got.data(), dc, got.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
            }
            INFO("inputs " << (inputs_bf16 ? "bf16" : "f32") << " out " << (out_bf16 ? "bf16" : "f32") << " ta=" << ta
                           << " tb=" << tb << " beta=" << beta);
            double worst = 0;
            for (int j = 0; j < n; ++j) {
              for (int i = 0; i < m; ++i) {
                const size_t idx = static_cast<size_t>(j) * ldc + i;
                // Inputs are multiples of 1/32 below 2, so f32 products and sums are exact; a bf16
                // output is the reference rounded once (relative 2^-8).
                const double tol = out_bf16 ? std::abs(want[idx]) * 0x1p-8 + 1e-6 : 1e-9;
                worst = std::max(worst, std::abs(got[idx] - want[idx]) / tol);
              }
              for (int i = m; i < ldc; ++i)  // padding rows of C are never written
                CHECK(got[static_cast<size_t>(j) * ldc + i] == (out_bf16 ? __bfloat162float(c16[j * ldc + i]) : 1e30f));
            }
            CHECK(worst <= 1.0);
          }
}

TEST_CASE("cuemu GEMM with beta = 0 never reads C, so NaN poison there is harmless", "[cuda-emu]") {
  const BlasHandle blas;
  cublasHandle_t h = blas.h;
  DeviceMemory mem;
  const int m = 3, n = 4, k = 2;
  std::vector<float> a = random_matrix(m, k, m, 7), b = random_matrix(k, n, k, 8);
  void* da = mem.copy(a.data(), a.size() * 4);
  void* db = mem.copy(b.data(), b.size() * 4);
  void* dc = mem.alloc(m * n * 4);  // NaN-poisoned
  const float alpha = 1.f, beta = 0.f;
  REQUIRE(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, static_cast<float*>(da), m,
                      static_cast<float*>(db), k, &beta, static_cast<float*>(dc), m) == CUBLAS_STATUS_SUCCESS);
  std::vector<float> got(m * n);
  REQUIRE(cudaMemcpy(got.data(), dc, got.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
  std::vector<double> want = gemm_reference(false, false, m, n, k, 1, a, m, b, k, 0, {}, m);
  for (int i = 0; i < m * n; ++i) CHECK(got[i] == float(want[i]));
}

TEST_CASE("cuemu catches the seeded bug of a wrong leading dimension", "[cuda-emu][seeded-bug]") {
  const BlasHandle blas;
  cublasHandle_t h = blas.h;
  DeviceMemory mem;
  const int m = 8, n = 6, k = 5;
  void *a = mem.alloc(64 * 64 * 4), *b = mem.alloc(64 * 64 * 4), *c = mem.alloc(64 * 64 * 4);
  const float one = 1.f, zero = 0.f;
  auto gemm = [&](cublasOperation_t ta, cublasOperation_t tb, int lda, int ldb, int ldc) {
    return cublasGemmEx(h, ta, tb, m, n, k, &one, a, CUDA_R_16BF, lda, b, CUDA_R_16BF, ldb, &zero, c, CUDA_R_32F, ldc,
                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  };
  CHECK(gemm(CUBLAS_OP_N, CUBLAS_OP_N, m, k, m) == CUBLAS_STATUS_SUCCESS);
  CHECK(gemm(CUBLAS_OP_N, CUBLAS_OP_N, m - 1, k, m) == CUBLAS_STATUS_INVALID_VALUE);  // lda < m
  CHECK(gemm(CUBLAS_OP_T, CUBLAS_OP_N, k - 1, k, m) == CUBLAS_STATUS_INVALID_VALUE);  // op T: lda < k
  CHECK(gemm(CUBLAS_OP_T, CUBLAS_OP_N, k, k, m) == CUBLAS_STATUS_SUCCESS);
  CHECK(gemm(CUBLAS_OP_N, CUBLAS_OP_N, m, k - 1, m) == CUBLAS_STATUS_INVALID_VALUE);  // ldb < k
  CHECK(gemm(CUBLAS_OP_N, CUBLAS_OP_T, m, n - 1, m) == CUBLAS_STATUS_INVALID_VALUE);  // op T: ldb < n
  CHECK(gemm(CUBLAS_OP_N, CUBLAS_OP_N, m, k, m - 1) == CUBLAS_STATUS_INVALID_VALUE);  // ldc < m
  // Mixed input types and unsupported compute types are refused, as cuBLAS does.
  CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, a, CUDA_R_16BF, m, b, CUDA_R_32F, k, &zero, c,
                     CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_NOT_SUPPORTED);
  // A host pointer where device memory belongs.
  std::vector<float> host(64 * 64);
  CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, host.data(), CUDA_R_32F, m, b, CUDA_R_32F, k, &zero,
                     c, CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_INVALID_VALUE);
  // cuBLASLt: a layout whose ld is below its rows.
  cublasLtHandle_t lt;
  REQUIRE(cublasLtCreate(&lt) == CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulDesc_t desc;
  REQUIRE(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS);
  cublasLtMatrixLayout_t la, lb, lc;
  REQUIRE(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, m, k, m - 1) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, k, n, k) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, m, n, m) == CUBLAS_STATUS_SUCCESS);
  CHECK(cublasLtMatmul(lt, desc, &one, a, la, b, lb, &zero, c, lc, c, lc, nullptr, nullptr, 0, nullptr) ==
        CUBLAS_STATUS_INVALID_VALUE);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(desc);
  cublasLtDestroy(lt);
}

TEST_CASE("cuemu strided-batched GEMM and cuBLASLt row-major with a bias epilogue", "[cuda-emu]") {
  const BlasHandle blas;
  cublasHandle_t h = blas.h;
  DeviceMemory mem;
  const int m = 7, n = 3, k = 9, batches = 3;
  std::vector<float> a = random_matrix(m, k * batches, m, 11), b = random_matrix(k, n * batches, k, 12);
  void* da = mem.copy(a.data(), a.size() * 4);
  void* db = mem.copy(b.data(), b.size() * 4);
  void* dc = mem.alloc(m * n * batches * 4);
  const float one = 1.f, zero = 0.f;
  REQUIRE(cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, static_cast<float*>(da), m,
                                    static_cast<long long>(m) * k, static_cast<float*>(db), k,
                                    static_cast<long long>(k) * n, &zero, static_cast<float*>(dc), m,
                                    static_cast<long long>(m) * n, batches) == CUBLAS_STATUS_SUCCESS);
  std::vector<float> got(m * n * batches);
  REQUIRE(cudaMemcpy(got.data(), dc, got.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
  for (int bt = 0; bt < batches; ++bt) {
    std::vector<float> ab(a.begin() + bt * m * k, a.begin() + (bt + 1) * m * k);
    std::vector<float> bb(b.begin() + bt * k * n, b.begin() + (bt + 1) * k * n);
    std::vector<double> want = gemm_reference(false, false, m, n, k, 1, ab, m, bb, k, 0, {}, m);
    for (int i = 0; i < m * n; ++i) CHECK(got[bt * m * n + i] == float(want[i]));
  }

  // Lt: D (m,n) row-major bf16 = A (m,k) row-major bf16 x B^T, B stored (n,k) row-major, + bias[m].
  std::vector<float> ar = random_matrix(k, m, k, 21);  // column-major (k,m) == row-major (m,k)
  std::vector<float> br = random_matrix(k, n, k, 22);  // column-major (k,n) == row-major (n,k)
  std::vector<float> bias = random_matrix(m, 1, m, 23);
  std::vector<__nv_bfloat16> ar16 = to_bf16(ar), br16 = to_bf16(br), bias16 = to_bf16(bias);
  void* dar = mem.copy(ar16.data(), ar16.size() * 2);
  void* dbr = mem.copy(br16.data(), br16.size() * 2);
  void* dbias = mem.copy(bias16.data(), bias16.size() * 2);
  void* dd = mem.alloc(m * n * 2);
  cublasLtHandle_t lt;
  REQUIRE(cublasLtCreate(&lt) == CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulDesc_t desc;
  REQUIRE(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS);
  const cublasOperation_t trans_b = CUBLAS_OP_T;
  const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
  REQUIRE(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof trans_b) ==
          CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue) ==
          CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &dbias, sizeof dbias) ==
          CUBLAS_STATUS_SUCCESS);
  const cublasLtOrder_t row = CUBLASLT_ORDER_ROW;
  cublasLtMatrixLayout_t la, lb, ld;
  REQUIRE(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, m, k, k) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, n, k, k) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, m, n, n) == CUBLAS_STATUS_SUCCESS);
  for (cublasLtMatrixLayout_t l : {la, lb, ld})
    REQUIRE(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ORDER, &row, sizeof row) ==
            CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulPreference_t pref;
  REQUIRE(cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulHeuristicResult_t result;
  int returned = 0;
  REQUIRE(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 1, &result, &returned) ==
          CUBLAS_STATUS_SUCCESS);
  REQUIRE(returned == 1);
  REQUIRE(cublasLtMatmul(lt, desc, &one, dar, la, dbr, lb, &zero, dd, ld, dd, ld, &result.algo, nullptr, 0,
                         nullptr) == CUBLAS_STATUS_SUCCESS);
  std::vector<__nv_bfloat16> d16(m * n);
  REQUIRE(cudaMemcpy(d16.data(), dd, d16.size() * 2, cudaMemcpyDeviceToHost) == cudaSuccess);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double want = bias[i];
      for (int p = 0; p < k; ++p) want += double(ar[i * k + p]) * br[j * k + p];
      INFO("i=" << i << " j=" << j);
      CHECK(std::abs(__bfloat162float(d16[i * n + j]) - want) <= std::abs(want) * 0x1p-8 + 1e-6);
    }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(desc);
  cublasLtDestroy(lt);
}
