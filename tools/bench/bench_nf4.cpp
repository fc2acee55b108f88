// strata-bench nf4: the host side of NF4 (kernels/cpu/nf4.h, issue 40) — quantizing a bf16 tensor
// (codes + absmax, then the double quantization) and dequantizing it back to bf16 (the CPU
// backend's device op), in ns per parameter at 1, 2, ... threads, against a ceiling measured in
// the same run: a plain pass over the same bytes (read the packed codes, write bf16 weights),
// which is what the dequantization would cost if the lookup and the scaling were free; and a
// memcpy of the dequantization's bytes (read the packed state, write bf16), the memory bandwidth
// this host gives those bytes. Also what a load does per linear with lora.base_dtype = "nf4"
// (offload/state/nf4_layout.h: nf4_pack_row from f32 values, the bf16 rounding included).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/cpu/nf4.h"
#include "offload/state/nf4_layout.h"
#include "src/core/error.h"

namespace strata::bench {
namespace {

using Clock = std::chrono::steady_clock;

template <class F>
double best_of(int rounds, F&& f) {
  double best = 1e30;
  for (int r = 0; r < rounds; ++r) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int bench_nf4(const std::vector<std::string>& args) {
  int64_t params = int64_t(1) << 24;
  int rounds = 5;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const bool has_value = i + 1 < args.size();
    if (a == "--help" || a == "-h") {
      std::printf("strata-bench nf4 [--params N (default 2^24)] [--rounds R (default 5)]\n");
      return 0;
    } else if (a == "--params" && has_value) {
      params = std::stoll(args[++i]);
    } else if (a == "--rounds" && has_value) {
      rounds = std::stoi(args[++i]);
    } else {
      STRATA_CHECK(false, "unknown or incomplete option '", a, "' (see strata-bench nf4 --help)");
    }
  }
  STRATA_CHECK(params > 0 && rounds > 0, "--params and --rounds must be positive");

  const int64_t blocks = cpu::nf4_blocks(params);
  std::vector<bf16> x(static_cast<size_t>(params)), w(static_cast<size_t>(params));
  for (int64_t i = 0; i < params; ++i) x[size_t(i)] = f32_to_bf16(float((i * 7919) % 2001 - 1000) * 1e-5f);
  std::vector<uint8_t> codes(size_t(cpu::nf4_code_bytes(params))), qabsmax(static_cast<size_t>(blocks));
  std::vector<float> absmax(static_cast<size_t>(blocks)), absmax2(size_t(cpu::nf4_nested_blocks(params)));
  float offset = 0;
  const int max_threads = omp_get_max_threads();
  std::printf("strata-bench nf4: %lld parameters, best of %d rounds\n", (long long)params, rounds);
  std::vector<float> xf(static_cast<size_t>(params));
  for (int64_t i = 0; i < params; ++i) xf[size_t(i)] = bf16_to_f32(x[size_t(i)]);
  BaseQuant bq;
  bq.nf4 = true;
  std::vector<char> row(Nf4RowLayout::of(params, true).bytes);
  // the dequantization's traffic: the packed state read, the bf16 weights written
  const double deq_bytes = double(cpu::nf4_state_bytes(params, true)) + 2.0 * double(params);
  std::vector<char> src(size_t(deq_bytes / 2)), dst(size_t(deq_bytes / 2));
  std::printf("%8s %14s %14s %14s %12s %12s %14s %12s\n", "threads", "quantize ns/p", "dequant ns/p", "ceiling ns/p",
              "dequant/ceil", "dequant GB/s", "memcpy GB/s", "load ns/p");
  std::string json = "{\"bench\": \"nf4\", \"params\": " + std::to_string(params) + ", \"rows\": [";
  for (int t = 1;; t = std::min(t * 2, max_threads)) {
    omp_set_num_threads(t);
    const double quant = best_of(rounds, [&] {
      cpu::nf4_quantize(codes.data(), absmax.data(), x.data(), params);
      cpu::nf4_double_quantize(qabsmax.data(), absmax2.data(), &offset, absmax.data(), blocks, 1);
    });
    const double deq = best_of(rounds, [&] {
      cpu::nf4_dequantize_bf16(w.data(), codes.data(), qabsmax.data(), absmax2.data(), offset, params);
    });
    const double ceil = best_of(rounds, [&] {
      const uint8_t* c = codes.data();
      bf16* out = w.data();
#pragma omp parallel for simd schedule(static)
      for (int64_t i = 0; i < params; ++i) out[i] = bf16{uint16_t(c[i / 2] + 0x3f00)};
    });
    // memcpy of the same bytes in halves split over the threads (what the bandwidth allows)
    const double copy = best_of(rounds, [&] {
      const int64_t half = int64_t(src.size()), piece = (half + t - 1) / t;
#pragma omp parallel for schedule(static)
      for (int k = 0; k < t; ++k) {
        const int64_t b = k * piece, e = std::min(half, b + piece);
        if (b < e) std::memcpy(dst.data() + b, src.data() + b, size_t(e - b));
      }
    });
    const double load = best_of(rounds, [&] { nf4_pack_row(row.data(), xf.data(), params, bq); });
    const double np = double(params);
    std::printf("%8d %14.3f %14.3f %14.3f %12.2f %12.2f %14.2f %12.3f\n", t, quant / np * 1e9, deq / np * 1e9,
                ceil / np * 1e9, deq / ceil, deq_bytes / deq * 1e-9, deq_bytes / copy * 1e-9, load / np * 1e9);
    char jrow[384];
    std::snprintf(jrow, sizeof jrow, "%s{\"threads\": %d, \"quantize_ns\": %.4f, \"dequant_ns\": %.4f, "
                  "\"ceiling_ns\": %.4f, \"dequant_gbs\": %.3f, \"memcpy_gbs\": %.3f, \"load_ns\": %.4f}",
                  t == 1 ? "" : ", ", t, quant / np * 1e9, deq / np * 1e9, ceil / np * 1e9, deq_bytes / deq * 1e-9,
                  deq_bytes / copy * 1e-9, load / np * 1e9);
    json += jrow;
    if (t == max_threads) break;
  }
  omp_set_num_threads(max_threads);
  std::printf("%s]}\n", json.c_str());
  return 0;
}

}  // namespace strata::bench
