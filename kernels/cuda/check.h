// STRATA_CUDA_CHECK: a CUDA runtime call checked, the message carrying the call, its file and
// line. Host code only; shared by the kernels' launchers (kernels/cuda/common.cuh) and the CUDA
// device (src/device/cuda_device.cpp).
#pragma once
#include <cuda_runtime_api.h>

#include "src/core/error.h"

#define STRATA_CUDA_CHECK(call)                                                            \
  do {                                                                                     \
    const cudaError_t strata_cuda_status = (call);                                         \
    STRATA_CHECK(strata_cuda_status == cudaSuccess, __FILE__, ":", __LINE__, ": ", #call,  \
                 " failed: ", cudaGetErrorString(strata_cuda_status));                     \
  } while (0)
