#include "src/device/peak_flops.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "src/core/bf16.h"
#include "kernels/cpu/ops.h"
#include "src/core/error.h"
#include "src/core/threads.h"

namespace strata {
namespace {

struct GpuRow {
  const char* match;  // a substring of the name; the first matching row wins
  const char* label;
  double bf16, f32;       // dense FLOP/s: tensor-core bf16 (f32 accumulate), plain f32
};

// NVIDIA datasheets (dense; the "with sparsity" figures halved). GeForce cards run bf16 with
// f32 accumulation at half their f16-accumulate rate, which is the rate listed here.
constexpr GpuRow kGpus[] = {
    {"H100 PCIe", "NVIDIA H100 PCIe", 756e12, 51.2e12},
    {"H100 NVL", "NVIDIA H100 NVL", 835e12, 60e12},
    {"H100", "NVIDIA H100 SXM", 989e12, 67e12},
    {"GH200", "NVIDIA GH200", 989e12, 67e12},
    {"H200", "NVIDIA H200 SXM", 989e12, 67e12},
    {"A100", "NVIDIA A100", 312e12, 19.5e12},
    {"L40S", "NVIDIA L40S", 362e12, 91.6e12},
    {"L40", "NVIDIA L40", 181e12, 90.5e12},
    {"L4", "NVIDIA L4", 121e12, 30.3e12},
    {"A10G", "NVIDIA A10G", 70e12, 31.2e12},
    {"A10", "NVIDIA A10", 125e12, 31.2e12},
    {"RTX 6000 Ada", "NVIDIA RTX 6000 Ada", 364e12, 91.1e12},
    {"RTX 4090", "NVIDIA GeForce RTX 4090", 165e12, 82.6e12},
    {"RTX 3090", "NVIDIA GeForce RTX 3090", 71e12, 35.6e12},
};

using Clock = std::chrono::steady_clock;

DevicePeak measure_cpu(DType ab) {
  const int64_t n = kCpuPeakGemmSize;
  const size_t count = size_t(n * n);
  std::vector<float> a(count), b(count), c(count);
  for (size_t i = 0; i < count; ++i) {  // not constants: a GEMM on zeros can take shortcuts
    a[i] = float(int(i % 13) - 6) * 0.125f;
    b[i] = float(int(i % 7) - 3) * 0.25f;
  }
  std::vector<bf16> a16, b16;
  if (ab == DType::bf16) {
    a16.resize(count);
    b16.resize(count);
    for (size_t i = 0; i < count; ++i) a16[i] = f32_to_bf16(a[i]), b16[i] = f32_to_bf16(b[i]);
  }
  auto gemm = [&] {
    if (ab == DType::bf16) cpu::matmul_bf16(c.data(), a16.data(), b16.data(), n, n, n, false, true, 0.f);
    else cpu::matmul_f32(c.data(), a.data(), b.data(), n, n, n, false, true, 0.f);
  };
  gemm();  // warm-up: oneDNN builds its kernel, pages are touched
  std::vector<double> runs;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = Clock::now();
    gemm();
    runs.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  // The fastest run, not the median: other processes on the machine only ever slow a run
  // down, and a peak measured low would put MFU above 1 once they go quiet.
  DevicePeak p;
  p.flops_per_s = 2.0 * double(n) * double(n) * double(n) / *std::min_element(runs.begin(), runs.end());
  p.source = str_cat("measured: the fastest of 5 ", dtype_name(ab), " GEMMs (", cpu::matmul_f32_packs() ? "strata's AVX2 kernel" : "oneDNN", ") ", n, "x", n, "x", n, " (median ",
                     str_cat(int(std::lround(2.0 * double(n) * double(n) * double(n) / median_seconds(runs) / 1e9))),
                     " GFLOP/s) on ", omp_get_max_threads(), " threads");
  return p;
}

}  // namespace

double median_seconds(std::vector<double> seconds) {
  STRATA_ASSERT(!seconds.empty());
  std::sort(seconds.begin(), seconds.end());
  const size_t m = seconds.size() / 2;
  return seconds.size() % 2 ? seconds[m] : 0.5 * (seconds[m - 1] + seconds[m]);
}

std::optional<DevicePeak> gpu_datasheet_peak(const std::string& gpu_name, DType ab) {
  STRATA_ASSERT(ab == DType::f32 || ab == DType::bf16, "peak FLOP/s is kept for f32 and bf16");
  for (const GpuRow& g : kGpus) {
    if (gpu_name.find(g.match) == std::string::npos) continue;
    DevicePeak p;
    p.flops_per_s = ab == DType::bf16 ? g.bf16 : g.f32;
    p.source = str_cat("datasheet: ", g.label, ab == DType::bf16 ? " bf16 tensor core, dense" : " f32, no tensor cores");
    return p;
  }
  return std::nullopt;
}

DevicePeak cpu_measured_peak(DType ab) {
  STRATA_ASSERT(ab == DType::f32 || ab == DType::bf16, "peak FLOP/s is kept for f32 and bf16");
  static std::mutex mu;
  static std::map<std::pair<int, int>, DevicePeak> cache;  // (dtype, threads) -> peak
  cpu_threads_apply();
  const std::pair<int, int> key{int(ab), omp_get_max_threads()};
  std::lock_guard lock(mu);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, measure_cpu(ab)).first;
  return it->second;
}

}  // namespace strata
