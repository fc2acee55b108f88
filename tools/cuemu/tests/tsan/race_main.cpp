// race_main.cpp - the seeded missing-__syncthreads bug, run under ThreadSanitizer with one OS
// thread per CUDA thread (CUEMU_THREADS=1). ctest passes when TSan's report names the racy kernel
// (cuemu_tsan_catches_missing_syncthreads); run by hand it prints the race with file and line.
// With --correct it runs the kernel with its barrier, plus streams, events and shuffles, where TSan
// must stay silent (cuemu_tsan_silent_on_correct_kernel: the emulator adds no false races).
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "tools/cuemu/tests/test_kernels.h"

int main(int argc, char** argv) {
  const bool correct = argc > 1 && std::strcmp(argv[1], "--correct") == 0;
  const int n = 256 * 3;
  std::vector<float> host(n, 1.0f);
  const int threads = 256, blocks = n / threads;
  float *x = nullptr, *sums = nullptr;
  if (cudaMalloc(reinterpret_cast<void**>(&x), n * sizeof(float)) != cudaSuccess ||
      cudaMalloc(reinterpret_cast<void**>(&sums), blocks * sizeof(float)) != cudaSuccess) {
    std::fprintf(stderr, "cudaMalloc failed\n");
    return 2;
  }
  cudaMemcpy(x, host.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  if (cuemu_test::reduce_sum(x, sums, n, threads, /*missing_sync=*/!correct, nullptr) != cudaSuccess) return 2;
  std::vector<float> got(blocks);
  cudaMemcpy(got.data(), sums, blocks * sizeof(float), cudaMemcpyDeviceToHost);
  for (int b = 0; b < blocks; ++b) std::printf("racy reduction: block %d sum %g, exact %d\n", b, double(got[b]), threads);
  if (correct) {  // a second launch on a stream, ordered by an event, read back asynchronously
    cudaStream_t s;
    cudaEvent_t e;
    cudaStreamCreate(&s);
    cudaEventCreate(&e);
    cudaEventRecord(e, nullptr);
    cudaStreamWaitEvent(s, e, 0);
    cuemu_test::reduce_sum(x, sums, n, threads, false, s);
    cudaMemcpyAsync(got.data(), sums, blocks * sizeof(float), cudaMemcpyDeviceToHost, s);
    cudaStreamSynchronize(s);
    for (int b = 0; b < blocks; ++b)
      if (got[b] != float(threads)) return 1;
    cudaEventDestroy(e);
    cudaStreamDestroy(s);
  }
  cudaFree(x);
  cudaFree(sums);
  return 0;
}
