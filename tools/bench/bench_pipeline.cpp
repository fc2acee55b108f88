// strata-bench pipeline: the streaming engine with weights crossing the host<->device link.
// CPU backend: the link is throttled so that moving a step's streamed bytes takes as long as its
// compute. CUDA backend (--backend cuda): the real link, its pinned host->device bandwidth and
// the bf16 GEMM rate measured in the same run. Reports (1) step time over max(compute, transfer)
// — 1.0 means streaming and the optimizer are fully hidden — (2) streamed against resident step
// time and model FLOP/s against the measured GEMM rate, and (3) the device high-water mark of
// the same model at 4 and at L layers, which must not grow with depth, and (4) gradient
// accumulation over k micro-batches (--accum) on a link k times slower: one micro-batch at a time
// against layer-major (offload.accumulation), per optimizer step.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>
#include <nlohmann/json.hpp>

#include "offload/plan/plan_search.h"
#include "io/token_rows.h"
#include "src/recipe/recipe_modes.h"
#include "offload/plan/run_engines.h"
#include "offload/state/model_io.h"
#include "src/core/cli_args.h"
#include "src/core/error.h"
#include "tools/bench/bench_util.h"
#include "src/recipe/recipe.h"

namespace strata::bench {
namespace {

using Clock = std::chrono::steady_clock;

ModelConfig bench_config(int64_t layers, int64_t hidden) {
  nlohmann::json j = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"},
                      {"hidden_size", hidden}, {"intermediate_size", hidden * 11 / 4},
                      {"num_hidden_layers", layers}, {"num_attention_heads", hidden / 64},
                      {"num_key_value_heads", std::max<int64_t>(1, hidden / 256)},
                      {"vocab_size", 1024}, {"max_position_embeddings", 4096},
                      {"rms_norm_eps", 1e-5}, {"rope_theta", 10000.0}, {"tie_word_embeddings", false}};
  return hf_config_parse(j.dump(), "bench config");
}

MicroBatch bench_batch(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  MicroBatch mb;
  mb.B = B;
  mb.T = T;
  uint64_t x = seed;
  for (int64_t i = 0; i < B * T; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    mb.ids.push_back(int32_t((x >> 33) % uint64_t(V)));
    mb.pos.push_back(int32_t(i % T));
  }
  for (int64_t i = 0; i < B * T; ++i) mb.targets.push_back(i % T + 1 < T ? mb.ids[size_t(i + 1)] : -100);
  return mb;
}

struct PipelineRun {
  double step_s = 0, compute_s = 0, link_bytes = 0, optimizer_exposed_s = 0, h2d_wait_s = 0;
  size_t device_peak = 0;
};

// Pinned host -> device bytes/s over the real link: the median of several 256 MiB copies.
double measure_link_bytes_per_s(Device& dev) {
  const size_t bytes = 256ull << 20;
  void* host = dev.alloc_pinned(bytes);
  void* devbuf = dev.alloc(bytes, "bench link buffer");
  std::memset(host, 1, bytes);
  std::vector<double> rates;
  for (int i = 0; i < 7; ++i) {
    auto t0 = Clock::now();
    dev.copy_h2d(devbuf, host, bytes, Stream::h2d);
    dev.stream_synchronize(Stream::h2d);
    rates.push_back(double(bytes) / std::chrono::duration<double>(Clock::now() - t0).count());
  }
  dev.free(devbuf);
  dev.free_pinned(host);
  return bench_median(rates);
}

// Model FLOPs of one training step: 6 per parameter per token for the matmuls (forward, and
// backward's two products) plus causal attention (QK^T and PV, forward 2, backward 4 products).
double step_model_flops(const ModelConfig& cfg, int64_t B, int64_t T) {
  const double C = double(cfg.hidden_size), F = double(cfg.intermediate_size);
  const double D = double(cfg.head_dim), H = double(cfg.num_attention_heads);
  const double Hk = double(cfg.num_key_value_heads);
  const double layer_params = C * H * D * 2 + C * Hk * D * 2 + 3 * C * F;
  const double params = layer_params * double(cfg.num_hidden_layers) + C * double(cfg.vocab_size);
  const double attention = 2.0 * 2.0 * H * D * double(T) * double(T) / 2 * double(cfg.num_hidden_layers);
  return double(B) * (6.0 * params * double(T) + 3.0 * attention);
}

// `steps` optimizer steps of `accum` micro-batches each, one at a time or (layer_major) in one
// layer-major pass (offload.accumulation); the figures are per optimizer step.
PipelineRun run_pipeline(const std::string& backend, const ModelConfig& cfg, const std::string& weights,
                         double bandwidth, int64_t B, int64_t T, int steps, const std::string& memory,
                         double clip, int accum = 1, bool layer_major = false) {
  DeviceOptions dopt;
  dopt.backend = device_backend_parse(backend);
  dopt.memory_bytes = parse_bytes(memory, "--device-memory");
  dopt.link_bytes_per_s = bandwidth;
  auto dev = device_create(dopt);
  const ModelSpec spec = model_spec_build(cfg, DType::bf16);
  PlanInputs in;  // the engine through the plan, as the trainer builds it (offload/plan/run_engines.h)
  in.weights = weights_mode_parse(weights);
  in.checkpoints = CheckpointMode::host;
  in.micro_batch = B;
  in.sequence_len = T;
  in.accumulation = layer_major ? AccumulationMode::layer_major : AccumulationMode::micro_batch;
  in.accumulation_steps = accum;
  const RunPlan plan = placement_plan(spec, in, PlanBudgets{});
  std::unique_ptr<HostStore> store_owned = run_plan_host_store(*dev, spec, plan);
  HostStore& store = *store_owned;
  model_init_weights(store, 1, 0.02);
  std::unique_ptr<Engine> engine_owned = run_plan_engine(*dev, store, plan);
  Engine& engine = *engine_owned;
  std::vector<MicroBatch> mbs;
  int64_t counted = 0;
  for (int a = 0; a < accum; ++a) mbs.push_back(bench_batch(B, T, cfg.vocab_size, 7 + uint64_t(a))), counted += mbs.back().counted();
  AdamWParams ap;
  ap.lr = 1e-4f;
  StepWork work;  // forward + backward over the step's micro-batches, then the optimizer (overlapped)
  work.micro = &mbs;
  work.counted = counted;
  work.max_grad_norm = clip;
  work.gradients_first = clip > 0;
  auto one_step = [&] {
    work.hyper = ap;
    engine.train_step(work);
  };
  one_step();  // warm-up
  engine.synchronize();
  dev->reset_peak();
  const EngineStats s0 = engine.stats();
  auto t0 = Clock::now();
  for (int i = 0; i < steps; ++i) {
    ap.step = i + 2;
    one_step();
  }
  engine.synchronize();
  const EngineStats s1 = engine.stats();
  PipelineRun r;
  r.step_s = std::chrono::duration<double>(Clock::now() - t0).count() / steps;
  r.compute_s = (s1.compute_s - s0.compute_s) / steps;
  r.link_bytes = double(s1.link_bytes - s0.link_bytes) / steps;
  r.optimizer_exposed_s = (s1.optimizer_exposed_s - s0.optimizer_exposed_s) / steps;
  r.h2d_wait_s = (s1.h2d_wait_s - s0.h2d_wait_s) / steps;
  r.device_peak = dev->peak_bytes();
  return r;
}

}  // namespace

int bench_pipeline(const std::vector<std::string>& args) {
  CLI::App app{"The streaming pipeline: a throttled link on the CPU backend, the real one on CUDA",
               "strata-bench pipeline"};
  int64_t layers = 32, hidden = 256, batch = 1, tokens = 256;
  int steps = 3;
  int64_t accum = 4;
  double clip = 1.0;
  std::string memory = "1GiB", backend = "cpu";
  app.add_option("--backend", backend, "cpu (throttled link) or cuda (the real link)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--layers", layers, "decoder layers of the deep model (the shallow one has 4)");
  app.add_option("--hidden", hidden, "hidden size (multiple of 64)");
  app.add_option("--tokens", tokens, "tokens per row");
  app.add_option("--batch", batch, "rows per micro-batch");
  app.add_option("--steps", steps, "timed steps");
  app.add_option("--accum", accum, "micro-batches per optimizer step of the accumulation case (k)");
  app.add_option("--device-memory", memory, "device arena budget");
  app.add_option("--clip", clip, "the steps' global-norm clip (optim.max_grad_norm; 0: off, each group updates as its gradient lands)");
  int rc = 0;
  if (!parse_args(app, args, &rc)) return rc;  // 0 after --help, 2 on bad usage
  STRATA_CHECK(hidden % 64 == 0 && hidden >= 64, "--hidden must be a positive multiple of 64");
  STRATA_CHECK(layers >= 4, "--layers must be at least 4");
  STRATA_CHECK(accum >= 1, "--accum must be at least 1");
  STRATA_CHECK(clip >= 0 && std::isfinite(clip), "--clip must be 0 (off) or positive");

  const bool cuda = backend == "cuda";
  const ModelConfig deep = bench_config(layers, hidden);
  // 1. resident and unthrottled: the compute time per step, and the bytes streaming will move
  PipelineRun resident = run_pipeline(backend, deep, "device", 0, batch, tokens, steps, memory, clip);
  PipelineRun probe = run_pipeline(backend, deep, "stream", 0, batch, tokens, 1, memory, clip);
  // 2. the link: on the CPU backend throttled so that moving the streamed bytes takes as long as
  //    the compute; on CUDA the real one, measured in this run
  double bandwidth = probe.link_bytes / std::max(resident.compute_s, 1e-6);
  double gemm_flops = 0;
  if (cuda) {
    DeviceOptions dopt;
    dopt.backend = device_backend_parse(backend);
    dopt.memory_bytes = parse_bytes(memory, "--device-memory");
    auto dev = device_create(dopt);
    bandwidth = measure_link_bytes_per_s(*dev);
    gemm_flops = bench_gemm_flops(*dev, 8192);
  }
  PipelineRun streamed = run_pipeline(backend, deep, "stream", cuda ? 0 : bandwidth, batch, tokens, steps, memory, clip);
  const double transfer_s = streamed.link_bytes / bandwidth;
  const double bound = std::max(streamed.compute_s, transfer_s);
  const double ratio = streamed.step_s / bound;
  const double model_flops = step_model_flops(deep, batch, tokens);
  // 3. the device high-water mark does not grow with depth
  PipelineRun shallow = run_pipeline(backend, bench_config(4, hidden), "stream", 0, batch, tokens, 1, memory, clip);
  // 4. gradient accumulation over k micro-batches on a link k times slower than the balanced one
  //    (CPU backend; CUDA: the real link): one micro-batch at a time moves k x the weights per
  //    step and is link-bound, layer-major moves them once and hides them behind k x the compute
  const double slow = cuda ? 0 : bandwidth / accum;
  PipelineRun per_mb = run_pipeline(backend, deep, "stream", slow, batch, tokens, steps, memory, clip, int(accum), false);
  PipelineRun lm = run_pipeline(backend, deep, "stream", slow, batch, tokens, steps, memory, clip, int(accum), true);

  std::printf("strata-bench pipeline (%s): llama, hidden %ld, %ld layers, %ldx%ld tokens, bf16 weights, "
              "checkpoints on the host\n", backend.c_str(), long(hidden), long(layers), long(batch), long(tokens));
  std::printf("  %-40s %10.4f s\n", "resident step", resident.step_s);
  std::printf("  %-40s %10.4f s\n", "compute per step (streamed)", streamed.compute_s);
  std::printf("  %-40s %10.2f MB at %.2f GB/s%s = %.4f s\n", "link traffic per step",
              streamed.link_bytes / 1e6, bandwidth / 1e9, cuda ? " (measured)" : " (throttled)", transfer_s);
  std::printf("  %-40s %10.4f s\n", "streamed step", streamed.step_s);
  std::printf("  %-40s %10.3f  (target <= 1.15)\n", "step / max(compute, transfer)", ratio);
  std::printf("  %-40s %10.3f\n", "streamed step / resident step", streamed.step_s / resident.step_s);
  std::printf("  %-40s %10.4f s, compute waited %.4f s for weights\n", "optimizer exposed per step",
              streamed.optimizer_exposed_s, streamed.h2d_wait_s);
  std::printf("  %-40s %10.0f tokens/s\n", "streamed throughput", double(batch * tokens) / streamed.step_s);
  if (cuda)
    std::printf("  %-40s %10.1f TFLOP/s = %.3f of the bf16 GEMM rate measured here (%.1f TFLOP/s)\n",
                "model FLOP/s (streamed)", model_flops / streamed.step_s / 1e12,
                model_flops / streamed.step_s / gemm_flops, gemm_flops / 1e12);
  std::printf("  %-40s %10.2f MiB (4 layers) vs %.2f MiB (%ld layers)\n", "device peak",
              double(shallow.device_peak) / 1048576, double(streamed.device_peak) / 1048576, long(layers));
  std::printf("  gradient accumulation k = %ld, link %.3f GB/s%s:\n", long(accum), (cuda ? bandwidth : slow) / 1e9,
              cuda ? " (measured)" : " (throttled to 1/k)");
  std::printf("  %-40s %10.4f s, %.2f MB over the link, optimizer exposed %.4f s (%.1f%%)\n", "  micro_batch step",
              per_mb.step_s, per_mb.link_bytes / 1e6, per_mb.optimizer_exposed_s, 100 * per_mb.optimizer_exposed_s / per_mb.step_s);
  std::printf("  %-40s %10.4f s, %.2f MB over the link, optimizer exposed %.4f s (%.1f%%)\n", "  layer_major step",
              lm.step_s, lm.link_bytes / 1e6, lm.optimizer_exposed_s, 100 * lm.optimizer_exposed_s / lm.step_s);
  std::printf("  %-40s %10.3f (link bytes %.3f)\n", "  layer_major / micro_batch step", lm.step_s / per_mb.step_s,
              lm.link_bytes / per_mb.link_bytes);
  nlohmann::json j = {{"pipeline", {{"backend", backend}, {"step_s", streamed.step_s},
                                    {"resident_step_s", resident.step_s}, {"compute_s", streamed.compute_s},
                                    {"transfer_s", transfer_s}, {"ratio", ratio},
                                    {"tokens_per_s", double(batch * tokens) / streamed.step_s},
                                    {"model_flops_per_s", model_flops / streamed.step_s},
                                    {"gemm_flops_per_s", gemm_flops},
                                    {"device_peak_bytes", streamed.device_peak},
                                    {"device_peak_bytes_4_layers", shallow.device_peak},
                                    {"link_bytes_per_s", bandwidth}, {"clip", clip},
                                    {"optimizer_exposed_s", streamed.optimizer_exposed_s},
                                    {"accumulation", {{"k", accum}, {"link_bytes_per_s", cuda ? bandwidth : slow},
                                                      {"micro_batch_step_s", per_mb.step_s},
                                                      {"layer_major_step_s", lm.step_s},
                                                      {"micro_batch_optimizer_exposed_s", per_mb.optimizer_exposed_s},
                                                      {"layer_major_optimizer_exposed_s", lm.optimizer_exposed_s},
                                                      {"micro_batch_link_bytes", per_mb.link_bytes},
                                                      {"layer_major_link_bytes", lm.link_bytes}}}}}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace strata::bench
