// strata-bench nvme: sequential write and read of one file through strata's file engine
// (io/uring_file: O_DIRECT, fixed buffers, crc32c per block written and verified) against fio
// on the same file, block size and queue depth, in the same run: rounds of fio write, strata
// write, then both reads (order alternating), all O_DIRECT, writes ending with fsync. Reports
// the median bandwidth of each and strata's ratio to fio (target >= 0.95 each way).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/uring_file.h"
#include "src/core/error.h"
#include "tools/bench/bench_util.h"

namespace strata::bench {

namespace {

struct NvmeArgs : NvmePassArgs {
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

// strata's engine (bench_engine_pass), its CPU seconds added up and its note kept.
double bench_strata(const NvmeArgs& a, const std::string& path, bool write, unsigned char* user, size_t user_bytes,
                    std::string* note, double* cpu_s) {
  const EnginePass p = bench_engine_pass(a, 0, path, write, user, user_bytes);
  if (note->empty()) *note = p.note;
  *cpu_s += p.cpu_s;
  return p.bytes_per_s;
}

}  // namespace

int bench_nvme(const std::vector<std::string>& args) {
  NvmeArgs a;
  if (!bench_pass_args(args, a, bench_nvme_usage, [&](const std::string& o, const std::string& v) {
        if (o != "--fio") return false;
        a.fio = v;
        return true;
      }))
    return 0;
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
  size_t user_bytes = 0;
  IoBuffer user = bench_noise_buffer(a, &user_bytes);

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
      sw.push_back(bench_strata(a, path, true, user.get(), user_bytes, &note, &cpu_write));
      if (r % 2 == 0) {
        fr.push_back(bench_fio(a, path, false));
        sr.push_back(bench_strata(a, path, false, user.get(), user_bytes, &note, &cpu_read));
      } else {
        sr.push_back(bench_strata(a, path, false, user.get(), user_bytes, &note, &cpu_read));
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
  const double write_ratio = bench_median(sw) / bench_median(fw), read_ratio = bench_median(sr) / bench_median(fr);
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
              "write (median, with fsync)", bench_median(sw) / 1e9, bench_median(fw) / 1e9, write_ratio, span(sw).c_str(),
              span(fw).c_str());
  std::printf("  %-30s %9.3f GB/s vs fio %.3f GB/s: ratio %.3f (target >= 0.95); ranges %s vs %s GB/s\n",
              "read (median)", bench_median(sr) / 1e9, bench_median(fr) / 1e9, read_ratio, span(sr).c_str(), span(fr).c_str());
  nlohmann::json j = {{"nvme",
                       {{"read_ratio", read_ratio},
                        {"write_ratio", write_ratio},
                        {"read_bytes_per_s", bench_median(sr)},
                        {"write_bytes_per_s", bench_median(sw)},
                        {"fio_read_bytes_per_s", bench_median(fr)},
                        {"fio_write_bytes_per_s", bench_median(fw)},
                        {"block_bytes", a.block},
                        {"queue_depth", a.queue_depth},
                        {"file_bytes", a.size}}}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace strata::bench
