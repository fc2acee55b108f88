// strata-bench nvme-checksum: the file engine's throughput with its block checksums (crc32c of
// every block written, verification of every block read) on one thread against N threads
// (FileEngineOptions::checksum_threads), sequential write (with sync) and read of one file,
// interleaved over rounds so both see the same disk and page cache. No fio: the ceiling here is
// the one-thread engine, and the figure is the ratio. On tmpfs (O_DIRECT refused: buffered) the
// kernel's copy is cheap and the checksums dominate, so the ratio shows what the threads buy;
// on a disk slower than one core's crc32c (~8 GB/s) the ratio is ~1 by construction.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "io/uring_file.h"
#include "src/core/error.h"
#include "src/recipe/recipe.h"

namespace strata::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct ChecksumArgs {
  std::string dir = "/dev/shm";
  size_t size = size_t(1) << 30;
  size_t block = size_t(1) << 20;
  int queue_depth = 32;
  int rounds = 3;
  int threads = 0;  // 0: file_engine_checksum_threads()
};

void bench_nvme_checksum_usage(FILE* f) {
  std::fprintf(f,
               "usage: strata-bench nvme-checksum [--path DIR] [--size SIZE] [--block-size B] [--queue-depth Q]\n"
               "                                  [--rounds R] [--threads N]\n\n"
               "Sequential write (with sync) and read of a SIZE file in DIR through strata's file engine\n"
               "with its checksums on 1 thread and on N (default: file_engine_checksum_threads(), the\n"
               "engine's own default), interleaved over R rounds. Defaults: --path /dev/shm --size 1GiB\n"
               "--block-size 1MiB --queue-depth 32 --rounds 3. The file is removed after.\n");
}

// Bytes/s of one pass: the whole file in chunks of queue_depth blocks, three in flight (as the
// NVMe tier moves its ranges), from an io_buffer_alloc buffer registered with the ring.
double bench_checksum_pass(const ChecksumArgs& a, int threads, const std::string& path, bool write,
                           unsigned char* user, size_t user_bytes) {
  FileEngineOptions opt;
  opt.block_bytes = a.block;
  opt.queue_depth = a.queue_depth;
  opt.checksum_threads = threads;
  opt.warn = [](const std::string&) {};  // tmpfs refuses O_DIRECT: said once in the header line
  FileEngine io(opt);
  io.register_memory(user, user_bytes);
  const size_t chunk = user_bytes / 3;
  const int f = io.open(path, write ? FileOpen::create : FileOpen::existing);
  const auto t0 = Clock::now();
  FileTicket slot[3] = {};
  bool busy[3] = {};
  size_t k = 0;
  for (uint64_t off = 0; off < a.size; off += chunk, ++k) {
    const size_t s = k % 3;
    if (busy[s]) io.wait(slot[s]);
    const size_t n = size_t(std::min<uint64_t>(chunk, a.size - off));
    slot[s] = write ? io.write(f, off, user + s * chunk, n) : io.read(f, off, user + s * chunk, n);
    busy[s] = true;
  }
  for (size_t s = 0; s < 3; ++s)
    if (busy[s]) io.wait(slot[s]);
  io.close(f);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  io.unregister_memory(user);
  return double(a.size) / seconds;
}

double bench_median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

ChecksumArgs bench_checksum_args(const std::vector<std::string>& args, bool* help) {
  ChecksumArgs a;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& o = args[i];
    const bool has = i + 1 < args.size();
    if (o == "--help" || o == "-h") *help = true;
    else if (o == "--path" && has) a.dir = args[++i];
    else if (o == "--size" && has) a.size = parse_bytes(args[++i], "--size");
    else if (o == "--block-size" && has) a.block = parse_bytes(args[++i], "--block-size");
    else if (o == "--queue-depth" && has) a.queue_depth = std::atoi(args[++i].c_str());
    else if (o == "--rounds" && has) a.rounds = std::atoi(args[++i].c_str());
    else if (o == "--threads" && has) a.threads = std::atoi(args[++i].c_str());
    else {
      bench_nvme_checksum_usage(stderr);
      STRATA_CHECK(false, "unknown or incomplete option '", o, "'");
    }
  }
  if (a.threads == 0) a.threads = file_engine_checksum_threads();
  STRATA_CHECK(a.block >= 4096 && a.block % 4096 == 0, "--block-size must be a multiple of 4096 bytes");
  STRATA_CHECK(a.size >= a.block && a.size % a.block == 0, "--size must be a multiple of --block-size");
  STRATA_CHECK(a.queue_depth >= 1 && a.queue_depth <= 4096, "--queue-depth must be between 1 and 4096");
  STRATA_CHECK(a.rounds >= 1, "--rounds must be at least 1");
  STRATA_CHECK(a.threads >= 1 && a.threads <= 256, "--threads must be between 1 and 256");
  STRATA_CHECK(std::filesystem::is_directory(a.dir), "--path ", a.dir, " is not a directory");
  return a;
}

}  // namespace

int bench_nvme_checksum(const std::vector<std::string>& args) {
  bool help = false;
  const ChecksumArgs a = bench_checksum_args(args, &help);
  if (help) {
    bench_nvme_checksum_usage(stdout);
    return 0;
  }
  const std::string path = (std::filesystem::path(a.dir) / ("strata-bench-crc." + std::to_string(::getpid()) + ".dat")).string();
  const auto remove_files = [&] {
    std::error_code ec;
    std::filesystem::remove(path, ec);
    std::filesystem::remove(path + ".crc32c", ec);
  };
  const size_t chunk = std::min<size_t>(a.size, a.block * size_t(a.queue_depth));
  IoBuffer user = io_buffer_alloc(3 * chunk);
  uint64_t x = 0x9E3779B97F4A7C15ull;  // noise: nothing compresses or dedups
  for (size_t i = 0; i < 3 * chunk; i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    std::memcpy(user.get() + i, &x, 8);
  }
  std::printf("strata-bench nvme-checksum: %s, %.2f GiB, block %zu KiB, queue depth %d, %d rounds, 1 vs %d checksum "
              "threads, %u cores\n", path.c_str(), double(a.size) / double(size_t(1) << 30), a.block / 1024,
              a.queue_depth, a.rounds, a.threads, std::thread::hardware_concurrency());
  std::printf("  %-6s %14s %14s %14s %14s\n", "round", "write 1", "write N", "read 1", "read N");
  std::vector<double> w1, wn, r1, rn;
  try {
    for (int r = 0; r < a.rounds; ++r) {
      const bool one_first = r % 2 == 0;  // alternate which goes first
      for (int k = 0; k < 2; ++k) {
        const bool one = (k == 0) == one_first;
        remove_files();
        (one ? w1 : wn).push_back(bench_checksum_pass(a, one ? 1 : a.threads, path, true, user.get(), 3 * chunk));
        (one ? r1 : rn).push_back(bench_checksum_pass(a, one ? 1 : a.threads, path, false, user.get(), 3 * chunk));
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
              bench_median(wn) / 1e9, a.threads, write_ratio);
  std::printf("  read (median):             %.3f GB/s on 1 thread, %.3f GB/s on %d: ratio %.2f\n", bench_median(r1) / 1e9,
              bench_median(rn) / 1e9, a.threads, read_ratio);
  const nlohmann::json j = {{"nvme_checksum",
                             {{"threads", a.threads},
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
