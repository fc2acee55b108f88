// strata-bench zo: the host side of zeroth-order training (kernels/cpu/zo.h) — z generated per
// element (Philox4x32-10 + Box–Muller, vectorised) and the ZO-SGD update of fp32 master weights
// writing a bf16 working copy, in ns per parameter, against a ceiling measured in the same run:
// a plain pass over the same bytes (read and write the f32 master, write the bf16 copy), which
// is what the update would cost if z were free. Thread counts 1, 2, 4, ... up to OpenMP's.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/cpu/zo.h"
#include "src/core/error.h"

namespace strata::bench {
namespace {

using Clock = std::chrono::steady_clock;

template <class F>
double best_seconds(int rounds, F&& f) {
  double best = 1e30;
  for (int r = 0; r < rounds; ++r) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int bench_zo(const std::vector<std::string>& args) {
  int64_t params = int64_t(1) << 25;
  int rounds = 5;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const bool has_value = i + 1 < args.size();
    if (a == "--help" || a == "-h") {
      std::printf("strata-bench zo [--params N (default 2^25)] [--rounds R (default 5)]\n");
      return 0;
    } else if (a == "--params" && has_value) {
      params = std::stoll(args[++i]);
    } else if (a == "--rounds" && has_value) {
      rounds = std::stoi(args[++i]);
    } else {
      STRATA_CHECK(false, "unknown or incomplete option '", a, "' (see strata-bench zo --help)");
    }
  }
  STRATA_CHECK(params > 0 && rounds > 0, "--params and --rounds must be positive");

  std::vector<float> z(size_t(params), 0.f), master(size_t(params), 0.5f);
  std::vector<bf16> working(static_cast<size_t>(params));
  const uint64_t seeds[1] = {12345};
  const float coefs[1] = {0.01f};
  const int max_threads = omp_get_max_threads();
  std::printf("strata-bench zo: %lld parameters, best of %d rounds\n", (long long)params, rounds);
  std::printf("%8s %14s %14s %14s %10s\n", "threads", "generate ns/p", "update ns/p", "ceiling ns/p",
              "update/ceil");
  std::string json = "{\"bench\": \"zo\", \"params\": " + std::to_string(params) + ", \"rows\": [";
  for (int t = 1;; t = std::min(t * 2, max_threads)) {
    omp_set_num_threads(t);
    const double gen = best_seconds(rounds, [&] { cpu::zo_generate(z.data(), 7, 1, 0, params); });
    const double upd = best_seconds(rounds, [&] {
      cpu::zo_sgd_update(master.data(), working.data(), true, seeds, coefs, 1, 1, 0, 1e-6f, 0.f, params);
    });
    const double ceil = best_seconds(rounds, [&] {
      float* m = master.data();
      bf16* w = working.data();
#pragma omp parallel for simd schedule(static)
      for (int64_t i = 0; i < params; ++i) {
        m[i] = m[i] * 0.999999f;
        w[i] = f32_to_bf16(m[i]);
      }
    });
    const double np = double(params);
    std::printf("%8d %14.3f %14.3f %14.3f %10.2f\n", t, gen / np * 1e9, upd / np * 1e9, ceil / np * 1e9,
                upd / ceil);
    char row[256];
    std::snprintf(row, sizeof row, "%s{\"threads\": %d, \"generate_ns\": %.4f, \"update_ns\": %.4f, "
                  "\"ceiling_ns\": %.4f}", t == 1 ? "" : ", ", t, gen / np * 1e9, upd / np * 1e9,
                  ceil / np * 1e9);
    json += row;
    if (t == max_threads) break;
  }
  omp_set_num_threads(max_threads);
  std::printf("%s]}\n", json.c_str());
  return 0;
}

}  // namespace strata::bench
