// strata-bench nvme-checksum: the file engine's throughput with its block checksums (crc32c of
// every block written, verification of every block read) on one thread against N threads
// (FileEngineOptions::checksum_threads), sequential write (with sync) and read of one file,
// interleaved over rounds so both see the same disk and page cache. No fio: the ceiling here is
// the one-thread engine, and the figure is the ratio. On tmpfs (O_DIRECT refused: buffered) the
// kernel's copy is cheap and the checksums dominate, so the ratio shows what the threads buy;
// on a disk slower than one core's crc32c (~8 GB/s) the ratio is ~1 by construction.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "io/uring_file.h"
#include "src/core/error.h"
#include "tools/bench/bench_util.h"

namespace strata::bench {
namespace {

void bench_nvme_checksum_usage(FILE* f) {
  std::fprintf(f,
               "usage: strata-bench nvme-checksum [--path DIR] [--size SIZE] [--block-size B] [--queue-depth Q]\n"
               "                                  [--rounds R] [--threads N]\n\n"
               "Sequential write (with sync) and read of a SIZE file in DIR through strata's file engine\n"
               "with its checksums on 1 thread and on N (default: file_engine_checksum_threads(), the\n"
               "engine's own default), interleaved over R rounds. Defaults: --path /dev/shm --size 1GiB\n"
               "--block-size 1MiB --queue-depth 32 --rounds 3. The file is removed after.\n");
}

double pass(const NvmePassArgs& a, int threads, const std::string& path, bool write, unsigned char* user, size_t bytes) {
  return bench_engine_pass(a, threads, path, write, user, bytes).bytes_per_s;
}

}  // namespace

int bench_nvme_checksum(const std::vector<std::string>& args) {
  NvmePassArgs a;
  a.dir = "/dev/shm";
  a.size = size_t(1) << 30;
  int threads = 0;  // 0: file_engine_checksum_threads()
  if (!bench_pass_args(args, a, bench_nvme_checksum_usage, [&](const std::string& o, const std::string& v) {
        if (o != "--threads") return false;
        threads = std::atoi(v.c_str());
        return true;
      }))
    return 0;
  if (threads == 0) threads = file_engine_checksum_threads();
  STRATA_CHECK(threads >= 1 && threads <= 256, "--threads must be between 1 and 256");
  const std::string path = (std::filesystem::path(a.dir) / ("strata-bench-crc." + std::to_string(::getpid()) + ".dat")).string();
  const auto remove_files = [&] {
    std::error_code ec;
    std::filesystem::remove(path, ec);
    std::filesystem::remove(path + ".crc32c", ec);
  };
  size_t bytes = 0;
  IoBuffer user = bench_noise_buffer(a, &bytes);
  std::printf("strata-bench nvme-checksum: %s, %.2f GiB, block %zu KiB, queue depth %d, %d rounds, 1 vs %d checksum "
              "threads, %u cores\n", path.c_str(), double(a.size) / double(size_t(1) << 30), a.block / 1024,
              a.queue_depth, a.rounds, threads, std::thread::hardware_concurrency());
  std::printf("  %-6s %14s %14s %14s %14s\n", "round", "write 1", "write N", "read 1", "read N");
  std::vector<double> w1, wn, r1, rn;
  try {
    for (int r = 0; r < a.rounds; ++r) {
      const bool one_first = r % 2 == 0;  // alternate which goes first
      for (int k = 0; k < 2; ++k) {
        const bool one = (k == 0) == one_first;
        remove_files();
        (one ? w1 : wn).push_back(pass(a, one ? 1 : threads, path, true, user.get(), bytes));
        (one ? r1 : rn).push_back(pass(a, one ? 1 : threads, path, false, user.get(), bytes));
      }
      std::printf("  %-6d %9.3f GB/s %9.3f GB/s %9.3f GB/s %9.3f GB/s\n", r + 1, w1.back() / 1e9, wn.back() / 1e9,
                  r1.back() / 1e9, rn.back() / 1e9);
    }
  } catch (...) {
    remove_files();
    throw;
  }
  remove_files();
  const double write_ratio = bench_median(wn) / bench_median(w1), read_ratio = bench_median(rn) / bench_median(r1);
  std::printf("  write (median, with sync): %.3f GB/s on 1 thread, %.3f GB/s on %d: ratio %.2f\n", bench_median(w1) / 1e9,
              bench_median(wn) / 1e9, threads, write_ratio);
  std::printf("  read (median):             %.3f GB/s on 1 thread, %.3f GB/s on %d: ratio %.2f\n", bench_median(r1) / 1e9,
              bench_median(rn) / 1e9, threads, read_ratio);
  const nlohmann::json j = {{"nvme_checksum",
                             {{"threads", threads},
                              {"write_ratio", write_ratio},
                              {"read_ratio", read_ratio},
                              {"write_bytes_per_s_1", bench_median(w1)},
                              {"write_bytes_per_s_n", bench_median(wn)},
                              {"read_bytes_per_s_1", bench_median(r1)},
                              {"read_bytes_per_s_n", bench_median(rn)},
                              {"block_bytes", a.block},
                              {"queue_depth", a.queue_depth},
                              {"file_bytes", a.size}}}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace strata::bench
