// kernels/cuda/launch.h - one kernel-launch syntax for the two compilers that build kernels/cuda/*.cu.
//
// nvcc (the product):   STRATA_LAUNCH(k, grid, block, smem, stream, a, b) -> k<<<grid, block, smem, stream>>>(a, b)
// g++ + cuemu (tests):  the same call runs the grid on the CPU emulator in tools/cuemu (the .cu file is
//                       compiled with `-x c++ -include tools/cuemu/cuemu.h`), asynchronously on `stream`.
// After either, cudaGetLastError() reports a bad launch configuration (cudaErrorInvalidConfiguration).
//
// Rules for kernels that must build both ways:
// - A template kernel goes through a named pointer, since a macro argument cannot hold a bare comma:
//     auto* k = my_kernel<float, 4>; STRATA_LAUNCH(k, grid, block, 0, stream, args...);
// - Dynamic shared memory is declared with STRATA_DYN_SHARED(type, name) (not `extern __shared__`),
//   16-byte aligned; size it with the launch's smem argument. Static `__shared__ T x[N];` works as is.
// - More than 48 KiB of dynamic shared memory needs cudaFuncSetAttribute(k,
//   cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) first, exactly as on a GPU (cuemu checks it).
#pragma once

#if defined(__CUDACC__)
#include <cuda_runtime.h>
#define STRATA_LAUNCH(kernel, grid, block, smem, stream, ...) \
  kernel<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__)
#define STRATA_DYN_SHARED(type, name)                                  \
  extern __shared__ __align__(16) unsigned char name##_strata_raw_[]; \
  type* name = reinterpret_cast<type*>(name##_strata_raw_)
#elif defined(STRATA_CUEMU)
// cuemu.h (force-included) defines STRATA_CUEMU and cuemu::launch_kernel / cuemu::dynamic_shared.
#define STRATA_LAUNCH(kernel, grid, block, smem, stream, ...)                                  \
  ::cuemu::launch_kernel(__FILE__, __LINE__, #kernel, (kernel), dim3(grid), dim3(block), \
                         static_cast<size_t>(smem), static_cast<cudaStream_t>(stream) __VA_OPT__(, ) __VA_ARGS__)
#define STRATA_DYN_SHARED(type, name) type* name = static_cast<type*>(::cuemu::dynamic_shared())
#else
#error "kernels/cuda/*.cu are compiled by nvcc, or by g++ with -x c++ -include tools/cuemu/cuemu.h (tests)"
#endif
