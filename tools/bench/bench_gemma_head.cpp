// strata-bench gemma-head: the chunked loss head at Gemma 3's 262,144-token vocabulary. One
// training step (forward, backward, AdamW) of a Gemma-3-270M-shaped model cut to one decoder layer
// (hidden 640, tied embeddings), where the lm_head is ~97% of the matmul FLOPs, at V = 262,144
// against V = 32,768: the head's FLOP rate (6 N V C per step over the step's device compute time)
// at each, and against the device's bf16 GEMM rate measured in the same run. Chunking keeps the
// head's device memory at two chunks of rows whatever V; this says whether its speed holds too.
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "offload/plan/plan_search.h"
#include "offload/plan/run_engines.h"
#include "offload/state/model_io.h"
#include "src/core/error.h"
#include "tools/bench/bench_util.h"

namespace strata::bench {
namespace {

using Clock = std::chrono::steady_clock;

ModelConfig head_config(int64_t vocab, int64_t hidden) {
  const nlohmann::json j = {{"architectures", {"Gemma3ForCausalLM"}}, {"model_type", "gemma3_text"},
                            {"hidden_size", hidden}, {"intermediate_size", 2048}, {"num_hidden_layers", 1},
                            {"num_attention_heads", 4}, {"num_key_value_heads", 1}, {"head_dim", 256},
                            {"query_pre_attn_scalar", 256}, {"sliding_window", 512}, {"vocab_size", vocab},
                            {"max_position_embeddings", 32768}, {"tie_word_embeddings", true}};
  return hf_config_parse(j.dump(), "gemma-head config");
}

struct HeadRun {
  double step_s = 0, compute_s = 0, matmul_s = 0, cross_entropy_s = 0;
  size_t device_peak = 0;
};

HeadRun run_head(const ModelConfig& cfg, int64_t T, int steps) {
  DeviceOptions dopt;
  dopt.memory_bytes = size_t(2) << 30;
  auto dev = device_create(dopt);
  const ModelSpec spec = model_spec_build(cfg, DType::bf16);
  PlanInputs in;
  in.weights = WeightsMode::automatic;
  in.checkpoints = CheckpointMode::host;
  in.micro_batch = 1;
  in.sequence_len = T;
  const RunPlan plan = placement_plan(spec, in, PlanBudgets{});
  std::unique_ptr<HostStore> store = run_plan_host_store(*dev, spec, plan);
  model_init_weights(*store, 1, 0.02);
  std::unique_ptr<Engine> engine = run_plan_engine(*dev, *store, plan);
  std::vector<MicroBatch> mbs(1);
  MicroBatch& mb = mbs[0];
  mb.B = 1;
  mb.T = T;
  uint64_t x = 7;
  for (int64_t i = 0; i < T; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    mb.ids.push_back(int32_t((x >> 33) % uint64_t(cfg.vocab_size)));
    mb.pos.push_back(int32_t(i));
  }
  for (int64_t i = 0; i < T; ++i) mb.targets.push_back(i + 1 < T ? mb.ids[size_t(i + 1)] : -100);
  AdamWParams ap;
  ap.lr = 1e-4f;
  StepWork work;
  work.micro = &mbs;
  work.counted = mb.counted();
  work.max_grad_norm = 1.0;
  work.gradients_first = true;
  work.hyper = ap;
  engine->train_step(work);  // warm-up
  engine->synchronize();
  dev->reset_peak();
  const DeviceCounters c0 = dev->counters();
  const EngineStats s0 = engine->stats();
  const auto t0 = Clock::now();
  for (int i = 0; i < steps; ++i) {
    ap.step = i + 2;
    work.hyper = ap;
    engine->train_step(work);
  }
  engine->synchronize();
  const DeviceCounters c1 = dev->counters();
  const EngineStats s1 = engine->stats();
  HeadRun r;
  r.step_s = std::chrono::duration<double>(Clock::now() - t0).count() / steps;
  r.compute_s = (s1.compute_s - s0.compute_s) / steps;
  r.matmul_s = (c1.op_s[int(OpKind::matmul)] - c0.op_s[int(OpKind::matmul)]) / steps;
  r.cross_entropy_s = (c1.op_s[int(OpKind::cross_entropy)] - c0.op_s[int(OpKind::cross_entropy)]) / steps;
  r.device_peak = dev->peak_bytes();
  return r;
}

}  // namespace

int bench_gemma_head(const std::vector<std::string>& args) {
  int64_t tokens = 256, hidden = 640, vocab = 262144, small_vocab = 32768;
  int steps = 2;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& o = args[i];
    const bool v = i + 1 < args.size();
    if (o == "--help" || o == "-h") {
      std::printf("strata-bench gemma-head [--tokens N (256)] [--hidden C (640)] [--vocab V (262144)]\n"
                  "  [--small-vocab V (32768)] [--steps S (2)]\n");
      return 0;
    } else if (o == "--tokens" && v) tokens = std::stoll(args[++i]);
    else if (o == "--hidden" && v) hidden = std::stoll(args[++i]);
    else if (o == "--vocab" && v) vocab = std::stoll(args[++i]);
    else if (o == "--small-vocab" && v) small_vocab = std::stoll(args[++i]);
    else if (o == "--steps" && v) steps = std::stoi(args[++i]);
    else STRATA_CHECK(false, "unknown or incomplete option '", o, "' (see strata-bench gemma-head --help)");
  }
  STRATA_CHECK(tokens >= 2 && hidden >= 64 && vocab > small_vocab && small_vocab >= 256 && steps >= 1,
               "--tokens >= 2, --hidden >= 64, --vocab > --small-vocab >= 256, --steps >= 1");
  double gemm = 0;
  {
    auto dev = device_create(DeviceOptions{});
    gemm = bench_gemm_flops(*dev, 1024);
  }
  std::printf("gemma3_text, 1 layer, hidden %lld, tied lm_head, bf16, %lld tokens; bf16 GEMM rate %.1f GFLOP/s\n",
              (long long)hidden, (long long)tokens, gemm / 1e9);
  std::printf("%10s %10s %12s %12s %12s %14s %10s %12s\n", "vocab", "step s", "compute s", "matmul s", "xent s",
              "head GFLOP/s", "of GEMM", "device MiB");
  nlohmann::json rows = nlohmann::json::array();
  double rate[2] = {};
  int k = 0;
  for (int64_t V : {small_vocab, vocab}) {
    const HeadRun r = run_head(head_config(V, hidden), tokens, steps);
    const double head_flops = 6.0 * double(tokens) * double(V) * double(hidden);
    rate[k++] = head_flops / r.compute_s;
    std::printf("%10lld %10.3f %12.3f %12.3f %12.3f %14.1f %10.3f %12.1f\n", (long long)V, r.step_s, r.compute_s,
                r.matmul_s, r.cross_entropy_s, head_flops / r.compute_s / 1e9, head_flops / r.compute_s / gemm,
                double(r.device_peak) / 1048576);
    rows.push_back({{"vocab", V}, {"step_s", r.step_s}, {"compute_s", r.compute_s}, {"matmul_s", r.matmul_s},
                    {"cross_entropy_s", r.cross_entropy_s}, {"head_flops_per_s", head_flops / r.compute_s},
                    {"device_peak_bytes", r.device_peak}});
  }
  std::printf("head FLOP rate at V = %lld over V = %lld: %.3f\n", (long long)vocab, (long long)small_vocab,
              rate[1] / rate[0]);
  std::printf("%s\n", nlohmann::json{{"bench", "gemma-head"}, {"gemm_flops_per_s", gemm}, {"runs", rows},
                                     {"rate_ratio", rate[1] / rate[0]}}.dump().c_str());
  return 0;
}

}  // namespace strata::bench
