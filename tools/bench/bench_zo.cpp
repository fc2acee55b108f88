// strata-bench zo: the host side of zeroth-order training (kernels/cpu/zo.h) — z generated per
// element (Philox4x32-10 + Box–Muller, vectorised) and the ZO-SGD update of fp32 master weights
// writing a bf16 working copy, in ns per parameter, against a ceiling measured in the same run:
// a plain pass over the same bytes (read and write the f32 master, write the bf16 copy), which
// is what the update would cost if z were free. Thread counts 1, 2, 4, ... up to OpenMP's.
// Then the link: the bytes a ZO step moves on the CPU backend, measured from the device's
// counters, with the step's q x k dual forwards one at a time (offload.accumulation =
// "micro_batch") and layer-major (one run: the weights once per step), in units of W (the
// weights of one run) for a deep model with a large vocabulary (--layers, --vocab).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/hf_config.h"
#include "kernels/cpu/zo.h"
#include "offload/engine/engine_zo.h"
#include "offload/state/model_io.h"
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

// Link bytes of the second of two ZO steps (the first fills nothing the second reuses: every
// device copy is stale after an update) with `group` pairs per run: all of them, and the weights
// alone (less the tokens and each pass's embedding output).
struct LinkRun {
  size_t all = 0, weights = 0, W = 0;
};

LinkRun zo_link_run(const ModelSpec& spec, int64_t k, int q, int64_t group) {
  auto dev = device_create(DeviceOptions{});
  HostStoreOptions so;
  so.needs = HostZoSgd::kState;
  HostStore store(*dev, spec, so);
  model_init_weights(store, 1);
  const int64_t B = 1, T = 64, V = spec.config.vocab_size, C = spec.config.hidden_size;
  EngineOptions eo;
  eo.max_batch = B;
  eo.max_tokens = T;
  eo.group = group;
  ZoEngine engine(*dev, store, eo);
  std::vector<MicroBatch> micro(static_cast<size_t>(k));
  int64_t counted = 0;
  for (int64_t m = 0; m < k; ++m) {
    MicroBatch& mb = micro[size_t(m)];
    mb.B = B, mb.T = T;
    for (int64_t i = 0; i < B * T; ++i) {
      mb.ids.push_back(int32_t((i * 131 + m * 17) % V));
      mb.targets.push_back(i + 1 < T ? int32_t((i * 131 + 7) % V) : -100);
      mb.pos.push_back(int32_t(i));
    }
    counted += mb.counted();
  }
  LinkRun r;
  r.W = engine.weight_link_bytes();
  for (int step = 1; step <= 2; ++step) {
    const DeviceCounters c0 = dev->counters();
    zo_step_run(engine, {3, 1e-3, q}, micro, counted, step, 1e-4, 0.0);
    const DeviceCounters c1 = dev->counters();
    r.all = (c1.h2d_bytes - c0.h2d_bytes) + (c1.d2h_bytes - c0.d2h_bytes);
  }
  engine.synchronize();
  // each run sends its micro-batches' tokens (3 int32 arrays), each pair both passes' x0 (f32)
  const size_t pairs = size_t(k) * size_t(q), runs = (pairs + size_t(group) - 1) / size_t(group);
  const size_t tokens = runs * size_t(std::min<int64_t>(group, k)) * 3 * 4 * size_t(B * T);
  r.weights = r.all - tokens - pairs * (2 * 4 * size_t(B * T * C) + 2 * sizeof(double));
  return r;
}

// Bytes moved per step, one dual forward at a time against layer-major, for a few k and q.
void link_bytes_table(int64_t layers, int64_t vocab, std::string& json) {
  const nlohmann::json cfg = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"hidden_size", 64},
                              {"intermediate_size", 176}, {"num_hidden_layers", layers}, {"num_attention_heads", 4},
                              {"num_key_value_heads", 2}, {"vocab_size", vocab}, {"max_position_embeddings", 512},
                              {"tie_word_embeddings", true}};
  const ModelSpec spec = model_spec_build(hf_config_parse(cfg.dump(), "bench config"), DType::bf16);
  std::printf("\nlink bytes per ZO step, %lld layers, vocab %lld (bf16, tied), 1 x 64 tokens per micro-batch:\n",
              (long long)layers, (long long)vocab);
  std::printf("%4s %4s %12s %16s %16s %14s %14s %10s\n", "k", "q", "W bytes", "one-at-a-time W", "layer-major W",
              "one-at-a-time", "layer-major", "ratio");
  json += "], \"link\": [";
  bool first = true;
  for (const auto& [k, q] : {std::pair<int64_t, int>{1, 1}, {2, 1}, {3, 1}, {2, 2}, {4, 2}}) {
    const LinkRun one = zo_link_run(spec, k, q, 1), major = zo_link_run(spec, k, q, k * q);
    const double W = double(one.W);
    std::printf("%4lld %4d %12zu %16.3f %16.3f %14zu %14zu %10.3f\n", (long long)k, q, one.W, double(one.weights) / W,
                double(major.weights) / W, one.all, major.all, double(one.all) / double(major.all));
    char row[320];
    std::snprintf(row, sizeof row, "%s{\"k\": %lld, \"q\": %d, \"W\": %zu, \"one_at_a_time_weights_W\": %.4f, "
                  "\"layer_major_weights_W\": %.4f, \"one_at_a_time_link_bytes\": %zu, \"layer_major_link_bytes\": %zu}",
                  first ? "" : ", ", (long long)k, q, one.W, double(one.weights) / W, double(major.weights) / W, one.all,
                  major.all);
    json += row;
    first = false;
  }
}

}  // namespace

int bench_zo(const std::vector<std::string>& args) {
  int64_t params = int64_t(1) << 25, layers = 32, vocab = 32000;
  int rounds = 5;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const bool has_value = i + 1 < args.size();
    if (a == "--help" || a == "-h") {
      std::printf("strata-bench zo [--params N (default 2^25)] [--rounds R (default 5)] [--layers L (default 32)] "
                  "[--vocab V (default 32000)]\n");
      return 0;
    } else if (a == "--params" && has_value) {
      params = std::stoll(args[++i]);
    } else if (a == "--rounds" && has_value) {
      rounds = std::stoi(args[++i]);
    } else if (a == "--layers" && has_value) {
      layers = std::stoll(args[++i]);
    } else if (a == "--vocab" && has_value) {
      vocab = std::stoll(args[++i]);
    } else {
      STRATA_CHECK(false, "unknown or incomplete option '", a, "' (see strata-bench zo --help)");
    }
  }
  STRATA_CHECK(params > 0 && rounds > 0 && layers > 0 && vocab > 1, "--params, --rounds, --layers and --vocab must be positive");

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
  link_bytes_table(layers, vocab, json);
  std::printf("%s]}\n", json.c_str());
  return 0;
}

}  // namespace strata::bench
