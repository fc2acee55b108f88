// strata-bench nf4: the host side of NF4 (kernels/cpu/nf4.h, issue 40) — quantizing a bf16 tensor
// (codes + absmax, then the double quantization) and dequantizing it back to bf16 (the CPU
// backend's device op), in ns per parameter at 1, 2, ... threads, against a ceiling measured in
// the same run: a plain pass over the same bytes (read the packed codes, write bf16 weights),
// which is what the dequantization would cost if the lookup and the scaling were free; and a
// memcpy of the dequantization's bytes (read the packed state, write bf16), the memory bandwidth
// this host gives those bytes. Also what a load does per linear with lora.base_dtype = "nf4"
// (offload/state/nf4_layout.h: nf4_pack_row from f32 values, the bf16 rounding included).
// Then each dequantization variant of kernels/cpu/nf4_dequantize.h this CPU runs (scalar, avx2,
// avx512), and the kernel it replaced ("before": a scalar 16-entry table per block, then AVX-512
// permutes; kept here as the sandbox's record), in ns per weight, GB/s of its traffic and as a
// fraction of the same run's memcpy.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/cpu/nf4.h"
#include "kernels/cpu/nf4_dequantize.h"
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

// The dequantization before kernels/cpu/nf4_dequantize.h (commit ff57bfe): per block the 16
// products and their bf16 roundings in scalar code, then the lookups as AVX-512 permutes of that
// table (full blocks; the scalar loop elsewhere). Its bits are the new variants'.
void dequantize_before(bf16* w, const uint8_t* codes, const uint8_t* qabsmax, const float* absmax, float offset,
                       int64_t n) {
  const int64_t blocks = cpu::nf4_blocks(n);
  const float* map = cpu::nf4_dynamic_map();
  const float* code = cpu::nf4_code();
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    float scale;
    if (qabsmax) {
      const float scaled = map[qabsmax[b]] * absmax[b / cpu::kNf4NestedBlock];
      scale = scaled + offset;
    } else {
      scale = absmax[b];
    }
    bf16 table[16];
    for (int k = 0; k < 16; ++k) table[k] = f32_to_bf16(code[k] * scale);
    const int64_t begin = b * cpu::kNf4Block, end = std::min(n, begin + cpu::kNf4Block);
    const uint8_t* c = codes + begin / 2;
    bf16* out = w + begin;
#if defined(__AVX512BW__)
    if (end - begin == cpu::kNf4Block) {
      const __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c)));
      const __m512i idx = _mm512_or_si512(_mm512_srli_epi16(v, 4),
                                          _mm512_slli_epi16(_mm512_and_si512(v, _mm512_set1_epi16(15)), 8));
      uint16_t bits[32] = {};
      std::memcpy(bits, table, 16 * sizeof(uint16_t));
      const __m512i t = _mm512_loadu_si512(bits);
      _mm512_storeu_si512(out, _mm512_permutexvar_epi16(_mm512_cvtepu8_epi16(_mm512_castsi512_si256(idx)), t));
      _mm512_storeu_si512(out + 32, _mm512_permutexvar_epi16(_mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(idx, 1)), t));
      continue;
    }
#endif
    const int64_t pairs = (end - begin) / 2;
    for (int64_t j = 0; j < pairs; ++j) out[2 * j] = table[c[j] >> 4], out[2 * j + 1] = table[c[j] & 0x0f];
    if ((end - begin) % 2) out[2 * pairs] = table[c[pairs] >> 4];
  }
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
  std::printf("strata-bench nf4: %lld parameters, best of %d rounds; active variant %s\n", (long long)params, rounds,
              cpu::nf4_isa_name(cpu::nf4_isa_active()));
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
    // the variants, each checked against the active one's bits
    cpu::nf4_dequantize_bf16(w.data(), codes.data(), qabsmax.data(), absmax2.data(), offset, params);
    const std::vector<bf16> active = w;  // (the plain pass above overwrote w)
    auto variant_row = [&](const char* name, auto&& run) {
      std::fill(w.begin(), w.end(), bf16{0});
      const double sec = best_of(rounds, run);
      STRATA_CHECK(std::memcmp(w.data(), active.data(), w.size() * sizeof(bf16)) == 0, "strata-bench nf4: the ",
                   name, " variant's bits differ from the active variant's");
      std::printf("%8d %14s %14.3f %12.2f %14.2f\n", t, name, sec / np * 1e9, deq_bytes / sec * 1e-9, copy / sec);
      char v[192];
      std::snprintf(v, sizeof v, ", {\"threads\": %d, \"variant\": \"%s\", \"dequant_ns\": %.4f, \"dequant_gbs\": %.3f}", t,
                    name, sec / np * 1e9, deq_bytes / sec * 1e-9);
      json += v;
    };
    std::printf("%8s %14s %14s %12s %14s\n", "threads", "variant", "dequant ns/p", "dequant GB/s", "of memcpy");
    variant_row("before", [&] { dequantize_before(w.data(), codes.data(), qabsmax.data(), absmax2.data(), offset, params); });
    for (cpu::Nf4Isa isa : {cpu::Nf4Isa::scalar, cpu::Nf4Isa::avx2, cpu::Nf4Isa::avx512})
      if (cpu::nf4_isa_supported(isa))
        variant_row(cpu::nf4_isa_name(isa), [&] {
          cpu::nf4_dequantize_isa(isa, cpu::Nf4Out::bf16, w.data(), codes.data(), qabsmax.data(), absmax2.data(),
                                  offset, params);
        });
    if (t == max_threads) break;
  }
  omp_set_num_threads(max_threads);
  std::printf("%s]}\n", json.c_str());
  return 0;
}

}  // namespace strata::bench
