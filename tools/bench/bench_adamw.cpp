// strata-bench adamw: CPU AdamW parameters per second against two references measured in the
// same run (DESIGN §7, §10):
//   the bound  = STREAM-triad bytes/s (a[i] = b[i] + s c[i], non-temporal stores, so the 24
//                counted bytes per element are the bytes moved) / bytes per parameter;
//   torch      = torch.optim.AdamW(foreach=True) on the same size in a /usr/bin/python3 subprocess.
// Bytes per parameter, as counted: f32 moments, no working copy: read grad, master, m, v (16),
// write master, m, v (12) = 28 (the headline figure); + 2 for a bf16 working copy = 30; bf16
// moments with a bf16 working copy: read 12, write 10 = 22.
// Memory bandwidth here is bimodal (DESIGN §10), so every round measures the triad and each
// AdamW configuration back to back, and each figure is the best of its rounds. An extra row,
// the AdamW access pattern with no arithmetic, separates memory limits from compute ones.
#include <immintrin.h>
#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "offload/state/adamw.h"
#include "src/core/error.h"

namespace strata::bench {
namespace {

using Clock = std::chrono::steady_clock;

double bench_seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// A 2 MiB aligned buffer (transparent huge pages where the kernel allows), first touched by
// the threads that will use each part of it.
struct BenchBuffer {
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<void, Free> mem;
  template <class T>
  T* as() const { return static_cast<T*>(mem.get()); }
};

BenchBuffer bench_alloc(size_t bytes) {
  constexpr size_t kAlign = size_t(2) << 20;
  bytes = (bytes + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, bytes);
  STRATA_CHECK_BUDGET(p != nullptr, "cannot allocate ", bytes >> 20, " MiB; use a smaller --params");
  madvise(p, bytes, MADV_HUGEPAGE);
  return BenchBuffer{std::unique_ptr<void, BenchBuffer::Free>(p)};
}

// [begin, end) of thread t of nt over n elements, in blocks of 64 (whole cache lines).
void bench_thread_range(int64_t n, int64_t t, int64_t nt, int64_t* begin, int64_t* end) {
  const int64_t blocks = (n + 63) / 64;
  *begin = blocks * t / nt * 64;
  *end = std::min(n, blocks * (t + 1) / nt * 64);
}

void bench_fill(float* x, int64_t n, float base, float step) {
#pragma omp parallel
  {
    int64_t b, e;
    bench_thread_range(n, omp_get_thread_num(), omp_get_num_threads(), &b, &e);
    for (int64_t i = b; i < e; ++i) x[i] = base + step * float(i % 1021);
  }
}

// a = b + s c over [begin, end), with non-temporal stores (kStream) or plain ones.
template <bool kStream>
__attribute__((target("avx512f"))) void bench_triad_avx512(float* a, const float* b, const float* c, float s,
                                                           int64_t begin, int64_t end) {
  const __m512 vs = _mm512_set1_ps(s);
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    const __m512 x = _mm512_add_ps(_mm512_loadu_ps(b + i), _mm512_mul_ps(vs, _mm512_loadu_ps(c + i)));
    if constexpr (kStream) _mm512_stream_ps(a + i, x);
    else _mm512_storeu_ps(a + i, x);
  }
  for (; i < end; ++i) a[i] = b[i] + s * c[i];
}

__attribute__((target("avx2"))) void bench_triad_stream_avx2(float* a, const float* b, const float* c, float s,
                                                             int64_t begin, int64_t end) {
  const __m256 vs = _mm256_set1_ps(s);
  int64_t i = begin;
  for (; i + 8 <= end; i += 8)
    _mm256_stream_ps(a + i, _mm256_add_ps(_mm256_loadu_ps(b + i), _mm256_mul_ps(vs, _mm256_loadu_ps(c + i))));
  for (; i < end; ++i) a[i] = b[i] + s * c[i];
}

// One STREAM triad over n elements (64-byte aligned arrays); returns seconds. With non-temporal
// stores (`stream`) the counted bytes are the bytes moved: that triad is the bound. With plain
// stores STREAM's classic convention counts 24 bytes per element, but the write-allocate read makes
// it move 32: printed for comparison only.
double bench_triad(float* a, const float* b, const float* c, int64_t n, bool stream) {
  const bool avx512 = __builtin_cpu_supports("avx512f");
  const auto t0 = Clock::now();
#pragma omp parallel
  {
    int64_t beg, end;
    bench_thread_range(n, omp_get_thread_num(), omp_get_num_threads(), &beg, &end);
    if (avx512 && stream) bench_triad_avx512<true>(a, b, c, 3.f, beg, end);
    else if (avx512) bench_triad_avx512<false>(a, b, c, 3.f, beg, end);
    else if (stream) bench_triad_stream_avx2(a, b, c, 3.f, beg, end);
    else
      for (int64_t i = beg; i < end; ++i) a[i] = b[i] + 3.f * c[i];
  }
  if (stream) _mm_sfence();
  return bench_seconds_since(t0);
}

// The AdamW access pattern without its arithmetic: read g, p, m, v, write p, m, v (28 bytes
// per element, plain stores). Not the bound; printed to tell memory limits from compute ones.
__attribute__((target("avx512f"))) void bench_pattern_avx512(const float* g, float* p, float* m,
                                                             float* v, int64_t begin, int64_t end) {
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    const __m512 x = _mm512_loadu_ps(g + i);
    _mm512_storeu_ps(p + i, _mm512_add_ps(_mm512_loadu_ps(p + i), x));
    _mm512_storeu_ps(m + i, _mm512_add_ps(_mm512_loadu_ps(m + i), x));
    _mm512_storeu_ps(v + i, _mm512_add_ps(_mm512_loadu_ps(v + i), x));
  }
  for (; i < end; ++i) p[i] += g[i], m[i] += g[i], v[i] += g[i];
}

double bench_pattern(const float* g, float* p, float* m, float* v, int64_t n) {
  const bool avx512 = __builtin_cpu_supports("avx512f");
  const auto t0 = Clock::now();
#pragma omp parallel
  {
    int64_t beg, end;
    bench_thread_range(n, omp_get_thread_num(), omp_get_num_threads(), &beg, &end);
    if (avx512) {
      bench_pattern_avx512(g, p, m, v, beg, end);
    } else {
      for (int64_t i = beg; i < end; ++i) p[i] += g[i], m[i] += g[i], v[i] += g[i];
    }
  }
  return bench_seconds_since(t0);
}

// torch.optim.AdamW(foreach=True) steps on one tensor of n params with `threads` threads in a
// subprocess; the best seconds per step of `reps`, or a negative number when torch is absent.
double bench_torch_adamw(int64_t n, int threads, int reps) {
  if (std::system("test -x /usr/bin/python3 && /usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0)
    return -1;
  const std::string code =
      "import sys, time, torch\n"
      "n, threads, reps = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])\n"
      "torch.set_num_threads(threads)\n"
      "p = torch.nn.Parameter(torch.randn(n))\n"
      "p.grad = torch.randn(n)\n"
      "opt = torch.optim.AdamW([p], lr=1e-3, weight_decay=0.01, foreach=True)\n"
      "opt.step()\n"
      "best = 1e30\n"
      "for _ in range(reps):\n"
      "    t = time.perf_counter(); opt.step(); best = min(best, time.perf_counter() - t)\n"
      "print(best)\n";
  const std::string cmd = "/usr/bin/python3 -c '" + code + "' " + std::to_string(n) + " " +
                          std::to_string(threads) + " " + std::to_string(reps) + " 2>/dev/null";
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return -1;
  double best = -1;
  if (std::fscanf(f, "%lf", &best) != 1) best = -1;
  pclose(f);
  return best;
}

int64_t bench_parse_count(const std::string& s) {
  size_t used = 0;
  double x = 0;
  try {
    x = std::stod(s, &used);
  } catch (const std::exception&) {
    STRATA_CHECK(false, "'", s, "' is not a count; write e.g. 64M or 67108864");
  }
  const std::string suffix = s.substr(used);
  double mult = 1;
  if (suffix == "K" || suffix == "k") mult = double(1 << 10);
  else if (suffix == "M") mult = double(1 << 20);
  else if (suffix == "G") mult = double(1 << 30);
  else STRATA_CHECK(suffix.empty(), "unknown suffix '", suffix, "' in '", s, "'; use K, M or G");
  const double v = x * mult;
  STRATA_CHECK(v >= 1 && v < 1e11, "count ", s, " is out of range");
  return int64_t(v);
}

void bench_adamw_usage(FILE* f) {
  std::fprintf(f,
               "usage: strata-bench adamw [--params N] [--rounds R] [--no-torch]\n"
               "  --params N   parameters per update (default 64M; suffixes K, M, G are powers of 1024)\n"
               "  --rounds R   measurement rounds, best of each figure is kept (default 7)\n"
               "  --no-torch   skip the torch.optim.AdamW comparison\n"
               "Threads: OMP_NUM_THREADS (default all cores). The AdamW variant: STRATA_ADAMW_ISA.\n");
}

struct AdamWConfig {
  const char* what;
  AdamWIsa isa;
  DType moments;
  bool bf16_working;
  int bytes_per_param;
  double best_s = 1e30;
};

}  // namespace

int bench_adamw(const std::vector<std::string>& args) {
  int64_t n = int64_t(64) << 20;
  int rounds = 7;
  bool torch = true;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      bench_adamw_usage(stdout);
      return 0;
    } else if (a == "--params" && i + 1 < args.size()) {
      n = bench_parse_count(args[++i]);
    } else if (a == "--rounds" && i + 1 < args.size()) {
      rounds = int(bench_parse_count(args[++i]));
    } else if (a == "--no-torch") {
      torch = false;
    } else {
      bench_adamw_usage(stderr);
      STRATA_CHECK(false, "unknown or incomplete option '", a, "'");
    }
  }
  const int threads = omp_get_max_threads();
  const AdamWIsa isa = adamw_isa_active();

  // AdamW state (f32 and bf16 moments) and the triad arrays, all first-touched in parallel
  BenchBuffer grad = bench_alloc(size_t(n) * 4), master = bench_alloc(size_t(n) * 4);
  BenchBuffer m = bench_alloc(size_t(n) * 4), v = bench_alloc(size_t(n) * 4);
  BenchBuffer mb = bench_alloc(size_t(n) * 2), vb = bench_alloc(size_t(n) * 2);
  BenchBuffer work = bench_alloc(size_t(n) * 2);
  BenchBuffer ta = bench_alloc(size_t(n) * 4), tb = bench_alloc(size_t(n) * 4), tc = bench_alloc(size_t(n) * 4);
  BenchBuffer td = bench_alloc(size_t(n) * 4);
  bench_fill(grad.as<float>(), n, -0.5f, 1e-3f);
  bench_fill(master.as<float>(), n, 0.25f, 1e-4f);
  bench_fill(m.as<float>(), n, 0.f, 0.f);
  bench_fill(v.as<float>(), n, 1e-4f, 0.f);
  bench_fill(ta.as<float>(), n, 0.f, 0.f);
  bench_fill(tb.as<float>(), n, 1.f, 1e-3f);
  bench_fill(tc.as<float>(), n, 2.f, 1e-3f);
  bench_fill(td.as<float>(), n, 0.f, 0.f);
  dtype_convert(mb.as<void>(), DType::bf16, m.as<float>(), DType::f32, size_t(n));
  dtype_convert(vb.as<void>(), DType::bf16, v.as<float>(), DType::f32, size_t(n));
  dtype_convert(work.as<void>(), DType::bf16, master.as<float>(), DType::f32, size_t(n));

  std::vector<AdamWConfig> configs = {
      {"adamw f32 moments", isa, DType::f32, false, 28},
      {"adamw f32 moments + bf16 working", isa, DType::f32, true, 30},
      {"adamw bf16 moments + bf16 working", isa, DType::bf16, true, 22},
  };
  for (AdamWIsa other : {AdamWIsa::avx2, AdamWIsa::scalar})
    if (other != isa && adamw_isa_supported(other))
      configs.push_back({other == AdamWIsa::avx2 ? "adamw f32 moments, avx2 variant"
                                                 : "adamw f32 moments, scalar variant",
                         other, DType::f32, false, 28});

  std::printf("strata-bench adamw: %ld params, %d threads, variant %s, %d rounds (best of each)\n",
              long(n), threads, adamw_isa_name(isa), rounds);
  AdamWParams ap;
  ap.lr = 1e-4;  // small: the state stays in range however many steps run
  ap.weight_decay = 0.01;
  ap.clip_scale = 0.9;
  int64_t step = 0;
  double triad_best = 1e30, triad_plain_best = 1e30, pattern_best = 1e30;
  for (int r = 0; r < rounds; ++r) {
    triad_best = std::min(triad_best, bench_triad(ta.as<float>(), tb.as<float>(), tc.as<float>(), n, true));
    triad_plain_best = std::min(triad_plain_best, bench_triad(ta.as<float>(), tb.as<float>(), tc.as<float>(), n, false));
    // on the triad arrays and one more (their values do not matter), not the AdamW state
    pattern_best = std::min(pattern_best, bench_pattern(tc.as<float>(), ta.as<float>(), tb.as<float>(),
                                                        td.as<float>(), n));
    for (auto& c : configs) {
      ap.step = ++step;
      const bool bm = c.moments == DType::bf16;
      const auto t0 = Clock::now();
      adamw_update_isa(c.isa, master.as<float>(), bm ? mb.as<void>() : m.as<void>(),
                       bm ? vb.as<void>() : v.as<void>(), c.moments, grad.as<float>(),
                       c.bf16_working ? work.as<void>() : nullptr, DType::bf16, n, ap);
      c.best_s = std::min(c.best_s, bench_seconds_since(t0));
    }
  }
  const double triad_bytes_per_s = 24.0 * double(n) / triad_best;

  double torch_s = -1;
  if (torch) torch_s = bench_torch_adamw(n, threads, std::max(3, rounds / 2));
  const double torch_params_per_s = torch_s > 0 ? double(n) / torch_s : -1;

  std::printf("\n%-36s %8s %10s %12s %9s %10s\n", "", "B/param", "best ms", "Mparams/s", "GB/s", "of bound");
  std::printf("%-36s %8d %10.2f %12s %9.1f %10s\n", "stream triad (non-temporal stores)", 24,
              triad_best * 1e3, "", triad_bytes_per_s / 1e9, "");
  const double triad_plain_bytes_per_s = 24.0 * double(n) / triad_plain_best;
  std::printf("%-36s %8d %10.2f %12s %9.1f %10s\n", "stream triad, plain stores (24 of 32)", 24,
              triad_plain_best * 1e3, "", triad_plain_bytes_per_s / 1e9, "");
  const double pattern_bytes_per_s = 28.0 * double(n) / pattern_best;
  std::printf("%-36s %8d %10.2f %12.1f %9.1f %9.1f%%\n", "adamw access pattern, no arithmetic", 28,
              pattern_best * 1e3, double(n) / pattern_best / 1e6, pattern_bytes_per_s / 1e9,
              100 * pattern_bytes_per_s / triad_bytes_per_s);
  nlohmann::json variants = nlohmann::json::array();
  for (const auto& c : configs) {
    const double pps = double(n) / c.best_s;
    const double bound = triad_bytes_per_s / c.bytes_per_param;
    std::printf("%-36s %8d %10.2f %12.1f %9.1f %9.1f%%\n", c.what, c.bytes_per_param, c.best_s * 1e3,
                pps / 1e6, pps * c.bytes_per_param / 1e9, 100 * pps / bound);
    variants.push_back({{"what", c.what}, {"isa", adamw_isa_name(c.isa)}, {"bytes_per_param", c.bytes_per_param},
                        {"params_per_s", pps}, {"ratio_to_bound", pps / bound}});
  }
  if (torch_s > 0) {
    std::printf("%-36s %8d %10.2f %12.1f %9.1f %9.1f%%\n", "torch.optim.AdamW(foreach=True)", 28,
                torch_s * 1e3, torch_params_per_s / 1e6, torch_params_per_s * 28 / 1e9,
                100 * torch_params_per_s / (triad_bytes_per_s / 28));
  } else {
    std::printf("%-36s %s\n", "torch.optim.AdamW(foreach=True)", torch ? "(no /usr/bin/python3 with torch)" : "(skipped)");
  }

  const AdamWConfig& head = configs[0];
  const double pps = double(n) / head.best_s, bound = triad_bytes_per_s / head.bytes_per_param;
  std::printf("\nheadline (%d B/param): %.2f Gparams/s = %.0f%% of the triad bound (target >= 80%%), %.0f%% of the "
              "same access pattern without arithmetic", head.bytes_per_param, pps / 1e9, 100 * pps / bound,
              100 * pps * pattern_best / double(n));
  if (torch_s > 0) std::printf(", %.1fx torch (target >= 5x)", pps / torch_params_per_s);
  std::printf("\n");
  nlohmann::json out = {
      {"params", n}, {"threads", threads}, {"isa", adamw_isa_name(isa)}, {"rounds", rounds},
      {"bytes_per_param", head.bytes_per_param}, {"triad_bytes_per_s", triad_bytes_per_s},
      {"pattern_params_per_s", double(n) / pattern_best},
      {"triad_plain_stores_bytes_per_s", triad_plain_bytes_per_s},
      {"params_per_s", pps}, {"bound_params_per_s", bound}, {"ratio_to_bound", pps / bound},
      {"torch_params_per_s", torch_s > 0 ? nlohmann::json(torch_params_per_s) : nlohmann::json(nullptr)},
      {"ratio_to_torch", torch_s > 0 ? nlohmann::json(pps / torch_params_per_s) : nlohmann::json(nullptr)},
      {"variants", variants}};
  std::printf("%s\n", nlohmann::json{{"adamw", out}}.dump().c_str());
  return 0;
}

}  // namespace strata::bench
