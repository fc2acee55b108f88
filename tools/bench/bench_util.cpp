#include "tools/bench/bench_util.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "src/core/error.h"
#include "src/recipe/recipe.h"

namespace strata::bench {

std::string bench_run_capture(const std::string& cmd, int* status) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  STRATA_CHECK_IO(p, "cannot run ", cmd);
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  *status = pclose(p);
  return out;
}

double bench_median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<float> bench_noise_floats(size_t n, uint64_t seed, float amp) {
  std::vector<float> v(n);
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (float& f : v) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    f = amp * (float(x >> 40) / float(1 << 23) - 1.f);  // 24 bits: [-amp, amp)
  }
  return v;
}

double bench_gemm_flops(Device& dev, int64_t n) {
  const size_t count = size_t(n * n), ab_bytes = count * sizeof(bf16);
  std::vector<bf16> host(count);
  void* a = dev.alloc(ab_bytes, "bench gemm a");  // (n, n) bf16
  void* b = dev.alloc(ab_bytes, "bench gemm b");  // (n, n) bf16
  auto* c = static_cast<float*>(dev.alloc(count * sizeof(float), "bench gemm c"));  // (n, n)
  for (void* dst : {a, b}) {
    const std::vector<float> noise = bench_noise_floats(count, dst == a ? 1 : 2);
    for (size_t i = 0; i < count; ++i) host[i] = f32_to_bf16(noise[i]);
    dev.copy_h2d(dst, host.data(), ab_bytes, Stream::compute);
    dev.stream_synchronize(Stream::compute);
  }
  std::vector<double> rates;
  for (int i = 0; i < 6; ++i) {
    dev.stream_synchronize(Stream::compute);
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < 4; ++r) dev.matmul(c, a, b, DType::bf16, n, n, n, false, true, 0.f, Stream::compute);
    dev.stream_synchronize(Stream::compute);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i > 0) rates.push_back(4 * 2.0 * double(n) * double(n) * double(n) / s);  // the first is the warm-up
  }
  dev.free(c);
  dev.free(b);
  dev.free(a);
  return bench_median(rates);
}

bool bench_pass_args(const std::vector<std::string>& args, NvmePassArgs& a, void (*usage)(FILE*),
                     const std::function<bool(const std::string&, const std::string&)>& own) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& o = args[i];
    const bool has = i + 1 < args.size();
    if (o == "--help" || o == "-h") {
      usage(stdout);
      return false;
    }
    if (has && own(o, args[i + 1])) ++i;
    else if (o == "--path" && has) a.dir = args[++i];
    else if (o == "--size" && has) a.size = parse_bytes(args[++i], "--size");
    else if (o == "--block-size" && has) a.block = parse_bytes(args[++i], "--block-size");
    else if (o == "--queue-depth" && has) a.queue_depth = std::atoi(args[++i].c_str());
    else if (o == "--rounds" && has) a.rounds = std::atoi(args[++i].c_str());
    else {
      usage(stderr);
      STRATA_CHECK(false, "unknown or incomplete option '", o, "'");
    }
  }
  STRATA_CHECK(a.block >= 4096 && a.block % 4096 == 0, "--block-size must be a multiple of 4096 bytes");
  STRATA_CHECK(a.size >= a.block && a.size % a.block == 0, "--size must be a multiple of --block-size");
  STRATA_CHECK(a.queue_depth >= 1 && a.queue_depth <= 4096, "--queue-depth must be between 1 and 4096");
  STRATA_CHECK(a.rounds >= 1, "--rounds must be at least 1");
  STRATA_CHECK(std::filesystem::is_directory(a.dir), "--path ", a.dir, " is not a directory");
  return true;
}

IoBuffer bench_noise_buffer(const NvmePassArgs& a, size_t* bytes) {
  *bytes = 3 * std::min<size_t>(a.size, a.block * size_t(a.queue_depth));
  IoBuffer user = io_buffer_alloc(*bytes);
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; i < *bytes; i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    std::memcpy(user.get() + i, &x, 8);
  }
  return user;
}

namespace {
double cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);  // this process's threads (a child such as fio: not counted)
  return double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + 1e-6 * double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}
}  // namespace

EnginePass bench_engine_pass(const NvmePassArgs& a, int checksum_threads, const std::string& path, bool write,
                             unsigned char* user, size_t user_bytes) {
  FileEngineOptions opt;
  opt.block_bytes = a.block;
  opt.queue_depth = a.queue_depth;
  opt.checksum_threads = checksum_threads;
  opt.warn = [](const std::string&) {};  // O_DIRECT refused: the note says so
  FileEngine io(opt);
  const bool registered = io.register_memory(user, user_bytes);
  const size_t chunk = user_bytes / 3;
  const int f = io.open(path, write ? FileOpen::create : FileOpen::existing);
  const auto t0 = std::chrono::steady_clock::now();  // like fio's runtime: from the first transfer
  const double c0 = cpu_seconds();
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
  EnginePass p;
  p.note = str_cat(io.backend(), registered ? ", the caller's buffers registered (fixed)" : "",
                   io.direct(f) ? ", O_DIRECT" : ", buffered (O_DIRECT refused: not a disk measurement)");
  io.close(f);
  p.bytes_per_s = double(a.size) / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  p.cpu_s = cpu_seconds() - c0;
  io.unregister_memory(user);
  return p;
}

}  // namespace strata::bench
