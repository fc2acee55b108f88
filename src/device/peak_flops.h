// The MFU denominator: a device's peak dense matmul throughput per input dtype (f32, bf16; f32
// accumulation as every strata matmul does). The CPU backend measures it (oneDNN GEMMs, the
// kernels the backend runs); the CUDA backend looks the GPU up in a datasheet table by name and
// measures a cuBLAS GEMM only for GPUs the table does not know.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "src/core/dtype.h"

namespace strata {

struct DevicePeak {
  double flops_per_s = 0;  // > 0
  std::string source;      // where the figure comes from, for the log: "datasheet: ...", "measured: ..."
};

// The datasheet peak of a GPU by its cudaDeviceProp name ("NVIDIA H100 80GB HBM3", "NVIDIA
// GeForce RTX 4090", ...): dense (no sparsity) tensor-core bf16 with f32 accumulation, and
// plain (non-tensor) f32. nullopt for a GPU the table does not list.
std::optional<DevicePeak> gpu_datasheet_peak(const std::string& gpu_name, DType ab);

// The CPU backend's peak for `ab`: the fastest of 5 timed GEMMs of its own matmul (oneDNN, or
// strata's AVX2 kernel where it runs: kernels/cpu/matmul.cpp) (M = N = K =
// kCpuPeakGemmSize, after a warm-up; the median is reported beside it) on the current
// device.cpu_threads, measured once per process for each dtype and thread count. The fastest,
// because other load on the machine only slows runs down.
inline constexpr int kCpuPeakGemmSize = 1536;
DevicePeak cpu_measured_peak(DType ab);

// The median of the seconds of `runs` timed calls (the MFU helpers above share it).
double median_seconds(std::vector<double> seconds);

}  // namespace strata
