// What the strata-bench subcommands share: running a command and reading its output, the median
// of timed rounds, a device's bf16 GEMM rate (pipeline, attention), and the NVMe file engine's
// sequential pass with its command-line options (bench_nvme.cpp against fio,
// bench_nvme_checksum.cpp with 1 against N checksum threads).
#pragma once
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "io/uring_file.h"
#include "src/device/device.h"

namespace strata::bench {

// `cmd` through the shell: its standard output, and its wait status in *status.
std::string bench_run_capture(const std::string& cmd, int* status);

// The middle value (the mean of the two middle ones for an even count); NaN for none.
double bench_median(std::vector<double> v);

// Uniform noise in [-amp, amp) from `seed` (a bench's inputs: never zeros, METHOD of measuring).
std::vector<float> bench_noise_floats(size_t n, uint64_t seed, float amp = 1.f);

// The device's bf16 GEMM rate (f32 accumulate) on an n x n x n product of random operands (the
// median of 5 rounds of 4 products after a warm-up), for MFU against the rate measured in a run.
double bench_gemm_flops(Device& dev, int64_t n);

// A sequential pass over one file: its path's directory, size, block, queue depth, rounds.
struct NvmePassArgs {
  std::string dir = ".";
  size_t size = size_t(2) << 30;
  size_t block = size_t(1) << 20;
  int queue_depth = 32;
  int rounds = 3;
};

// --path, --size, --block-size, --queue-depth, --rounds into `a`, each checked; `own(option, value)`
// takes a subcommand's own options (true when it took one). False after --help (`usage` to stdout);
// an unknown option prints `usage` to stderr and is bad input.
bool bench_pass_args(const std::vector<std::string>& args, NvmePassArgs& a, void (*usage)(FILE*),
                     const std::function<bool(const std::string&, const std::string&)>& own);

// Three chunks of queue_depth blocks from io_buffer_alloc (as the NVMe tier's buffers are: whole
// blocks move without a copy), filled with noise that nothing compresses or dedups.
IoBuffer bench_noise_buffer(const NvmePassArgs& a, size_t* bytes);

// One pass of the engine as the NVMe tier uses it: chunks of queue_depth blocks, three tickets in
// flight, the caller's buffer registered with the ring. Setup is outside the timing; a write's
// time ends after sync and close.
struct EnginePass {
  double bytes_per_s = 0;
  double cpu_s = 0;   // this process's CPU seconds over the pass (all its threads)
  std::string note;   // the backend, registration and O_DIRECT as the engine took them
};
EnginePass bench_engine_pass(const NvmePassArgs& a, int checksum_threads, const std::string& path, bool write,
                             unsigned char* user, size_t user_bytes);

}  // namespace strata::bench
