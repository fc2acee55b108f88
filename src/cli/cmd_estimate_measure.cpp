// `strata estimate --measure` (estimate.h): this host's rates as strata's own code sees them, each
// the median of its rounds: the host's (CPU AdamW, memory bandwidth, crc32c), on the CPU backend
// the device's at this model's shapes (a decoder layer and an lm_head chunk through the Device's
// ops), and with an NVMe directory its write and read bandwidth through the io_uring engine.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>

#include "io/checksum.h"
#include "io/uring_file.h"
#include "offload/plan/layer_probe.h"
#include "offload/state/adamw.h"
#include "src/cli/estimate.h"
#include "src/device/peak_flops.h"
#include "src/core/bf16.h"
#include "src/core/error.h"
#include "src/core/threads.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The median of a probe's rounds: the step it is compared with is a median too (strata-bench
// estimate and the validation test take the median step), so the rates stand for the same
// machine, busy as it usually is, rather than for its quietest moment.
double median_of(const std::vector<double>& v) { return median_seconds(v); }

// The rounds of --measure: at least kProbeRounds, and on until kProbeWindow seconds have passed.
// Every round runs every probe once, interleaved, so a burst of other work on a shared machine
// lands on all the rates alike instead of on one of them.
constexpr double kProbeWindow = 2.0;
constexpr int kProbeRounds = 7;

template <class Round>
void probe_rounds(Round&& round) {
  round();  // touches the pages, builds oneDNN's primitives
  const auto start = Clock::now();
  for (int r = 0; r < kProbeRounds || seconds_since(start) < kProbeWindow; ++r) round();
}

// --measure: this host's rates as strata's own code sees them, each the median of its rounds
// (probe_rounds): the host's (HostProbe) and, on the CPU backend, the device's at this model's
// shapes (offload/plan/layer_probe.h). Memory: one layer, one chunk, up to 160 MiB of AdamW state, 128 MiB of memcpy.

// The host's probes: CPU AdamW as the optimizer runs it on the host (offload/state/adamw.h; the
// model's parameters, at most 8M, in its working dtype), the host's memory bandwidth (a parallel
// memcpy over 64 MiB, read + write counted) and crc32c on one core.
struct HostProbe {
  static constexpr size_t kCopyBytes = size_t(64) << 20;
  const DType working_type, moments;
  const int64_t n;
  std::vector<float> master, m, v, grad;
  std::vector<char> working, src, dst;
  AdamWParams p;
  std::vector<double> adamw_s, copy_s, crc_s;

  HostProbe(const ModelSpec& spec, const PlanInputs& in)
      : working_type(spec.matrix_dtype),
        moments(in.moments),
        // as many parameters as the model has, up to 8M (a state past the caches either way)
        n(std::clamp<int64_t>(int64_t(spec.parameter_count()), int64_t(1) << 20, int64_t(8) << 20)),
        master(size_t(n), 0.5f), m(size_t(n), 0.f), v(size_t(n), 0.f), grad(size_t(n), 1e-3f),
        working(size_t(n) * dtype_size(spec.matrix_dtype)), src(kCopyBytes, 1), dst(kCopyBytes, 0) {
    p.stochastic_round = moments == DType::bf16;
  }

  void round() {
    auto t0 = Clock::now();
    ++p.step;
    if (moments == DType::bf16)  // the recipe's optim.moments_dtype: bf16 moments, stochastically rounded as trained
      adamw_update_bf16_moments(master.data(), reinterpret_cast<bf16*>(m.data()), reinterpret_cast<bf16*>(v.data()),
                                grad.data(), working.data(), working_type, n, p);
    else
      adamw_update(master.data(), m.data(), v.data(), grad.data(), working.data(), working_type, n, p);
    adamw_s.push_back(seconds_since(t0));
    t0 = Clock::now();
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < 64; ++k)
      std::memcpy(dst.data() + size_t(k) * (kCopyBytes / 64), src.data() + size_t(k) * (kCopyBytes / 64), kCopyBytes / 64);
    copy_s.push_back(seconds_since(t0));
    t0 = Clock::now();
    volatile uint32_t crc = crc32c(src.data(), kCopyBytes);  // one core, as the file engine's I/O thread sums
    (void)crc;
    crc_s.push_back(seconds_since(t0));
  }

  void rates(MeasuredRates& r) const {
    r.adamw_params_per_s = double(n) / median_of(adamw_s);
    r.host_bytes_per_s = 2 * double(kCopyBytes) / median_of(copy_s);
    r.checksum_bytes_per_s = double(kCopyBytes) / median_of(crc_s);
  }
};

MeasuredRates measure_rates(const ModelSpec& spec, const PlanInputs& in, bool cpu_device) {
  HostProbe host(spec, in);
  const std::unique_ptr<LayerProbe> layer = cpu_device ? LayerProbe::create(spec, in) : nullptr;
  probe_rounds([&] {
    host.round();
    if (layer) layer->round();
  });
  MeasuredRates r;
  host.rates(r);
  if (layer) {
    const LayerRates d = layer->rates(spec);
    r.matmul_flops_per_s = d.matmul_flops_per_s;
    r.attention_flops_per_s = d.attention_flops_per_s;
    r.elementwise_bytes_per_s = d.elementwise_bytes_per_s;
    r.head_flops_per_s = d.head_flops_per_s;
  }
  return r;
}

// --measure with --nvme-path: sequential write (with fsync) and read of 512 MiB through strata's
// io_uring engine, in a temporary file under the directory, removed afterwards.
std::pair<double, double> measure_nvme(const std::string& dir) {
  const size_t bytes = size_t(512) << 20, piece = size_t(16) << 20;
  const std::string path = (fs::path(dir) / str_cat(".strata_estimate_", ::getpid())).string();
  IoBuffer buf = io_buffer_alloc(piece);
  std::memset(buf.get(), 0x5a, piece);
  FileEngine io;
  io.register_memory(buf.get(), piece);
  double write_s = 0, read_s = 0;
  auto remove_files = [&] {
    std::error_code ec;
    fs::remove(path, ec);
    fs::remove(path + ".crc32c", ec);
  };
  try {
    int f = io.open(path, FileOpen::create);
    auto t0 = Clock::now();
    for (size_t off = 0; off < bytes; off += piece) io.write(f, off, buf.get(), piece);
    io.wait(io.sync(f));
    io.wait_all();
    write_s = seconds_since(t0);
    io.close(f);
    f = io.open(path, FileOpen::existing);
    t0 = Clock::now();
    for (size_t off = 0; off < bytes; off += piece) io.wait(io.read(f, off, buf.get(), piece));
    read_s = seconds_since(t0);
    io.close(f);
  } catch (...) {
    remove_files();
    throw;
  }
  remove_files();
  return {double(bytes) / read_s, double(bytes) / write_s};
}

}  // namespace

void estimate_measure(const Recipe& recipe, const ModelSpec& spec, const PlanInputs& in, const PlanBudgets& budgets,
                      EstimateRates& r) {
  cpu_threads_set(int(recipe.device_cpu_threads));  // the kernels' thread count, as `strata train` sets it
  cpu_threads_apply();
  StepRates& rates = r.rates;
  const bool cpu = r.source["device"].rfind("measured here", 0) == 0;
  const MeasuredRates m = measure_rates(spec, in, cpu);
  if (cpu && m.matmul_flops_per_s > 0) {
    if (rates.mfu_peak_flops_per_s == 0)  // MFU stays against the square-GEMM peak, as the trainer's
      rates.mfu_peak_flops_per_s = rates.device_flops_per_s;
    rates.device_flops_per_s = m.matmul_flops_per_s;
    rates.attention_flops_per_s = m.attention_flops_per_s;
    rates.elementwise_bytes_per_s = m.elementwise_bytes_per_s;
    rates.head_flops_per_s = m.head_flops_per_s;
    r.source["device"] = "measured here (a layer's GEMMs at this model's shapes)";
    r.source["attention"] = r.source["elementwise"] = r.source["head"] = "measured here (a layer and an lm_head chunk)";
  }
  rates.adamw_params_per_s = m.adamw_params_per_s;
  rates.host_bytes_per_s = m.host_bytes_per_s;
  rates.checksum_bytes_per_s = m.checksum_bytes_per_s;
  r.source["adamw"] = r.source["host"] = r.source["checksum"] = "measured here";
  if (r.source["link"] == "memcpy (host bandwidth)") rates.link_bytes_per_s = rates.host_bytes_per_s;
  if (!budgets.nvme_dir.empty()) {
    const auto [read_bytes_per_s, write_bytes_per_s] = measure_nvme(budgets.nvme_dir);
    rates.nvme_read_bytes_per_s = read_bytes_per_s;
    rates.nvme_write_bytes_per_s = write_bytes_per_s;
    r.source["nvme_read"] = r.source["nvme_write"] = "measured here (" + budgets.nvme_dir + ")";
  }
}

}  // namespace strata
