// strata-bench nvme: sequential write and read of one file through strata's file engine
// (io/uring_file: O_DIRECT, fixed buffers, crc32c per block written and verified) against fio
// on the same file, block size and queue depth, in the same run: rounds of fio write, strata
// write, then both reads (order alternating), all O_DIRECT, writes ending with fsync. Reports
// the median bandwidth of each and strata's ratio to fio (target >= 0.95 each way).
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/uring_file.h"
#include "src/core/error.h"
#include "src/recipe/recipe.h"

namespace strata::bench {

// Runs a shell command; returns its standard output (standard error goes to ours). Shared by the
// benchmarks that run a program (fio here, strata in bench_estimate.cpp).
std::string bench_run_capture(const std::string& cmd, int* status) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  STRATA_CHECK_IO(p, "cannot run ", cmd);
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  *status = pclose(p);
  return out;
}

namespace {

using Clock = std::chrono::steady_clock;

struct NvmeArgs {
  std::string dir = ".";
  size_t size = size_t(2) << 30;
  size_t block = size_t(1) << 20;
  int queue_depth = 32;
  int rounds = 3;
  std::string fio = "fio";
};

void bench_nvme_usage(FILE* f) {
  std::fprintf(f,
               "usage: strata-bench nvme [--path DIR] [--size SIZE] [--block-size B] [--queue-depth Q]\n"
               "                         [--rounds R] [--fio PROGRAM]\n\n"
               "Sequential write (with fsync) and read of a SIZE file in DIR (default: the current\n"
               "directory; use a real disk, not tmpfs) through strata's file engine and through fio,\n"
               "same block size and queue depth, O_DIRECT, interleaved over R rounds (default 3).\n"
               "Defaults: --size 2GiB --block-size 1MiB --queue-depth 32. The file is removed after.\n");
}

// One fio job on `path`; returns fio's bandwidth in bytes/s (its runtime includes the end fsync).
double bench_fio(const NvmeArgs& a, const std::string& path, bool write) {
  const std::string cmd =
      a.fio + " --name=strata-bench --filename=" + path + " --rw=" + (write ? "write" : "read") +
      " --bs=" + std::to_string(a.block) + " --size=" + std::to_string(a.size) +
      " --iodepth=" + std::to_string(a.queue_depth) +
      " --ioengine=io_uring --fixedbufs=1 --direct=1 --fallocate=none --end_fsync=" + (write ? "1" : "0") +
      " --output-format=json";
  int status = 0;
  const std::string out = bench_run_capture(cmd, &status);
  const size_t brace = out.find('{');
  STRATA_CHECK_IO(status == 0 && brace != std::string::npos, "fio failed (status ", status, "): ", cmd, "\n", out);
  const nlohmann::json j = nlohmann::json::parse(out.substr(brace));
  const auto& job = j.at("jobs").at(0).at(write ? "write" : "read");
  STRATA_CHECK_IO(job.at("io_bytes").get<uint64_t>() == a.size, "fio moved ", job.at("io_bytes").get<uint64_t>(),
                  " bytes, not ", a.size, ": ", cmd);
  return job.at("bw_bytes").get<double>();
}

// strata's engine, used as the NVMe tier uses it: chunks of queue_depth blocks, three tickets in
// flight, the caller's buffer from io_buffer_alloc and registered with the ring. Setup (staging, ring, open) is outside the
// timing; the write's time ends after sync and close.
double bench_cpu_s() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);  // this process's threads (fio runs in a child: not counted)
  return double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + 1e-6 * double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

double bench_strata(const NvmeArgs& a, const std::string& path, bool write, unsigned char* user, size_t user_bytes,
                    std::string* note, double* cpu_s) {
  FileEngineOptions opt;
  opt.block_bytes = a.block;
  opt.queue_depth = a.queue_depth;
  FileEngine io(opt);
  const bool registered = io.register_memory(user, user_bytes);
  const size_t chunk = user_bytes / 3;
  const int f = io.open(path, write ? FileOpen::create : FileOpen::existing);
  const auto t0 = Clock::now();  // like fio's runtime: from the first transfer
  const double c0 = bench_cpu_s();
  std::vector<FileTicket> slot(3, 0);
  std::vector<bool> busy(3, false);
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
  if (note->empty())
    *note = str_cat(io.backend(), registered ? ", the caller's buffers registered (fixed)" : "",
                    io.direct(f) ? ", O_DIRECT" : ", buffered (O_DIRECT refused: not a disk measurement)");
  io.close(f);
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  *cpu_s += bench_cpu_s() - c0;
  io.unregister_memory(user);
  return double(a.size) / s;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int bench_nvme(const std::vector<std::string>& args) {
  NvmeArgs a;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& o = args[i];
    const bool has = i + 1 < args.size();
    if (o == "--help" || o == "-h") {
      bench_nvme_usage(stdout);
      return 0;
    } else if (o == "--path" && has) {
      a.dir = args[++i];
    } else if (o == "--size" && has) {
      a.size = parse_bytes(args[++i], "--size");
    } else if (o == "--block-size" && has) {
      a.block = parse_bytes(args[++i], "--block-size");
    } else if (o == "--queue-depth" && has) {
      a.queue_depth = std::atoi(args[++i].c_str());
    } else if (o == "--rounds" && has) {
      a.rounds = std::atoi(args[++i].c_str());
    } else if (o == "--fio" && has) {
      a.fio = args[++i];
    } else {
      bench_nvme_usage(stderr);
      STRATA_CHECK(false, "unknown or incomplete option '", o, "'");
    }
  }
  STRATA_CHECK(a.block >= 4096 && a.block % 4096 == 0, "--block-size must be a multiple of 4096 bytes");
  STRATA_CHECK(a.size >= a.block && a.size % a.block == 0, "--size must be a multiple of --block-size");
  STRATA_CHECK(a.queue_depth >= 1 && a.queue_depth <= 4096, "--queue-depth must be between 1 and 4096");
  STRATA_CHECK(a.rounds >= 1, "--rounds must be at least 1");
  STRATA_CHECK(std::filesystem::is_directory(a.dir), "--path ", a.dir, " is not a directory");
  int status = 0;
  const std::string version = bench_run_capture(a.fio + " --version 2>/dev/null", &status);
  STRATA_CHECK(status == 0 && !version.empty(), "cannot run '", a.fio,
               " --version': install fio (scripts/setup.sh does) or pass --fio PROGRAM");

  const std::string path = (std::filesystem::path(a.dir) / ("strata-bench-nvme." + std::to_string(::getpid()) + ".dat")).string();
  const auto remove_files = [&] {
    std::error_code ec;
    std::filesystem::remove(path, ec);
    std::filesystem::remove(path + ".crc32c", ec);
  };
  // the caller's buffer: three chunks of queue_depth blocks, filled with noise
  const size_t chunk = std::min<size_t>(a.size, a.block * size_t(a.queue_depth));
  // (from io_buffer_alloc, as the NVMe tier's buffers are: whole blocks move without a copy)
  IoBuffer user = io_buffer_alloc(3 * chunk);
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; i < 3 * chunk; i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    std::memcpy(user.get() + i, &x, 8);
  }

  std::printf("strata-bench nvme: %s, %.2f GiB, block %zu KiB, queue depth %d, %d rounds, %s",
              path.c_str(), double(a.size) / double(size_t(1) << 30), a.block / 1024, a.queue_depth, a.rounds,
              version.c_str());
  std::printf("  %-6s %14s %14s %14s %14s\n", "round", "fio write", "strata write", "fio read", "strata read");
  std::vector<double> fw, sw, fr, sr;
  std::string note;
  double cpu_write = 0, cpu_read = 0;  // strata's CPU seconds (all its threads)
  try {
    for (int r = 0; r < a.rounds; ++r) {
      remove_files();
      fw.push_back(bench_fio(a, path, true));
      remove_files();
      sw.push_back(bench_strata(a, path, true, user.get(), 3 * chunk, &note, &cpu_write));
      if (r % 2 == 0) {
        fr.push_back(bench_fio(a, path, false));
        sr.push_back(bench_strata(a, path, false, user.get(), 3 * chunk, &note, &cpu_read));
      } else {
        sr.push_back(bench_strata(a, path, false, user.get(), 3 * chunk, &note, &cpu_read));
        fr.push_back(bench_fio(a, path, false));
      }
      std::printf("  %-6d %10.3f GB/s %9.3f GB/s %9.3f GB/s %9.3f GB/s\n", r + 1, fw.back() / 1e9, sw.back() / 1e9,
                  fr.back() / 1e9, sr.back() / 1e9);
    }
  } catch (...) {
    remove_files();
    throw;
  }
  remove_files();
  const double write_ratio = median(sw) / median(fw), read_ratio = median(sr) / median(fr);
  const double gb = double(a.size) * a.rounds / 1e9;
  std::printf("  strata's engine: %s; crc32c of every block written and verified; CPU %.3f s/GB writing, "
              "%.3f s/GB reading\n", note.c_str(), cpu_write / gb, cpu_read / gb);
  const auto span = [](const std::vector<double>& v) {
    char b[64];
    std::snprintf(b, sizeof b, "%.3f..%.3f", *std::min_element(v.begin(), v.end()) / 1e9,
                  *std::max_element(v.begin(), v.end()) / 1e9);
    return std::string(b);
  };
  std::printf("  %-30s %9.3f GB/s vs fio %.3f GB/s: ratio %.3f (target >= 0.95); ranges %s vs %s GB/s\n",
              "write (median, with fsync)", median(sw) / 1e9, median(fw) / 1e9, write_ratio, span(sw).c_str(),
              span(fw).c_str());
  std::printf("  %-30s %9.3f GB/s vs fio %.3f GB/s: ratio %.3f (target >= 0.95); ranges %s vs %s GB/s\n",
              "read (median)", median(sr) / 1e9, median(fr) / 1e9, read_ratio, span(sr).c_str(), span(fr).c_str());
  nlohmann::json j = {{"nvme",
                       {{"read_ratio", read_ratio},
                        {"write_ratio", write_ratio},
                        {"read_bytes_per_s", median(sr)},
                        {"write_bytes_per_s", median(sw)},
                        {"fio_read_bytes_per_s", median(fr)},
                        {"fio_write_bytes_per_s", median(fw)},
                        {"block_bytes", a.block},
                        {"queue_depth", a.queue_depth},
                        {"file_bytes", a.size}}}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace strata::bench
