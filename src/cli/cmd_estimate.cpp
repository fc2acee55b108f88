// `strata estimate RECIPE.toml [key=value ...] [--measure]` and `strata estimate --model DIR|config.json`:
// will the run fit, where does every byte go, and how fast will a step be — without running
// it. The bytes are the trainer's own placement plan (offload/plan/placement_plan.h, with the same
// recipe-to-plan glue, recipe_plan_inputs); the step time is the roofline of
// offload/plan/step_estimate.h. Nothing large is allocated: a 405B config answers in a moment.
// Exit 0 when it fits, 3 when it does not, 2 on bad input.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "io/checksum.h"
#include "io/uring_file.h"
#include "src/core/bf16.h"
#include "kernels/cpu/ops.h"
#include "offload/stream/engine_buffers.h"
#include "offload/state/adamw.h"
#include "offload/plan/step_estimate.h"
#include "offload/stream/layer_views.h"
#include "src/core/threads.h"
#include "models/decoder_layer.h"
#include "src/cli/cli_args.h"
#include "src/cli/commands.h"
#include "src/core/error.h"
#include "src/core/process_memory.h"
#include "src/device/peak_flops.h"
#include "src/recipe/recipe_modes.h"
#include "src/recipe/recipe_plan.h"
#include "src/train/trainer.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

struct EstimateArgs {
  std::string recipe_path, model;
  std::vector<std::string> overrides;
  std::string gpu, gpu_memory, host_memory, nvme_memory, nvme_path, optimizer, rates_from;
  double gpu_flops = 0, link_gbps = 0, nvme_read_gbps = 0, nvme_write_gbps = 0, adamw_params_per_s = 0;
  bool json = false, measure = false, resume = false;
};

// The recipe to price: the file with its overrides, or --model's config with the defaults.
Recipe estimate_recipe(const EstimateArgs& a) {
  if (!a.recipe_path.empty()) return recipe_load(a.recipe_path, a.overrides);
  std::error_code ec;
  const fs::path m = fs::absolute(a.model);
  const bool dir = fs::is_directory(m, ec);
  STRATA_CHECK(dir || fs::is_regular_file(m, ec), "--model ", a.model, " is neither a model directory nor a config.json");
  const bool weights = dir && (fs::exists(m / "model.safetensors.index.json", ec) || fs::exists(m / "model.safetensors", ec));
  const std::string model_key = weights ? str_cat("path = \"", m.string(), "\"")
                                        : str_cat("config = \"", (dir ? m / "config.json" : m).string(), "\"");
  // data.path is not read by the estimate; the recipe needs one
  return recipe_parse(str_cat("[model]\n", model_key, "\n[data]\npath = \"(not read by strata estimate)\"\n"),
                      "strata estimate --model", a.overrides);
}

std::string gb_per_s(double bytes_per_s) { return str_cat(bytes_per_s / 1e9, " GB/s"); }

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The median of a probe's rounds: the step it is compared with is a median too (strata-bench
// estimate and the validation test take the median step), so the rates stand for the same
// machine, busy as it usually is, rather than for its quietest moment.
double median_of(std::vector<double> v) {
  STRATA_ASSERT(!v.empty(), "a probe without rounds");
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The rounds of --measure: at least kProbeRounds, and on until kProbeWindow seconds have passed.
// Every round runs every probe once, interleaved, so a burst of other work on a shared machine
// lands on all the rates alike instead of on one of them.
constexpr double kProbeWindow = 2.0;
constexpr int kProbeRounds = 7;

template <class Round>
void probe_rounds(Round&& round) {
  round();  // touches the pages, builds oneDNN's primitives
  const auto start = Clock::now();
  for (int r = 0; r < kProbeRounds || seconds_since(start) < kProbeWindow; ++r) round();
}

// --measure: this host's rates as strata's own code sees them, each the median of its rounds
// (probe_rounds): CPU AdamW (the model's parameters, at most 8M, in its working dtype), the host's
// memory bandwidth (a parallel memcpy over 64 MiB, read + write counted) and, on the CPU backend, the
// device's own rates at this model's shapes: one decoder layer's forward and backward (with its
// recompute and the gradient slot's zeroing, as the engine runs them) at the micro-batch's B x T
// and one lm_head chunk's statistics, loss and backward, on a CPU device of their size, timed by
// the device's own per-op counters (as metrics.jsonl's op_s): the layer's GEMMs give the GEMM rate,
// its attention kernel the attention rate, its norms, RoPE, SwiGLU, adds and casts the memory-bound
// rate over DeviceWork's bytes, the chunk (its wall time) the head's rate. Memory: one layer, one
// chunk, up to 160 MiB of AdamW state, 128 MiB of memcpy.
// The device's time in memory-bound ops (the kinds DeviceWork::elementwise_bytes counts).
double memory_bound_s(const DeviceCounters& c) {
  return c.op_s[int(OpKind::norm)] + c.op_s[int(OpKind::rope)] + c.op_s[int(OpKind::elementwise)];
}

struct MeasuredRates {
  double adamw_params_per_s = 0, host_bytes_per_s = 0, checksum_bytes_per_s = 0;
  double matmul_flops_per_s = 0, attention_flops_per_s = 0, elementwise_bytes_per_s = 0, head_flops_per_s = 0;
  double nvme_bytes_per_s = 0;  // --rates-from: bytes read + written over the run's disk-busy time (0: none)
};

MeasuredRates measure_rates(const ModelSpec& spec, const PlanInputs& in, bool cpu_device) {
  // AdamW over as many parameters as the model has, up to 8M (a state past the caches either way)
  const int64_t n = std::clamp<int64_t>(int64_t(spec.parameter_count()), int64_t(1) << 20, int64_t(8) << 20);
  std::vector<float> master(size_t(n), 0.5f), m(size_t(n), 0.f), v(size_t(n), 0.f), grad(size_t(n), 1e-3f);
  std::vector<char> working(size_t(n) * dtype_size(spec.matrix_dtype));
  AdamWParams p;
  p.stochastic_round = in.moments == DType::bf16;
  const size_t copy_bytes = size_t(64) << 20;
  std::vector<char> src(copy_bytes, 1), dst(copy_bytes, 0);
  std::vector<double> adamw_s, copy_s, crc_s, mm_s, attn_s, rest_s, head_s;
  // the layer and the head chunk on a CPU device
  const HostStoreLayout layout = HostStore::layout(spec);
  const EngineShape shape = placement_engine_shape(spec, layout, in, 1);
  const LayerDims d = shape.layer_capacity;
  const int64_t N = d.N(), C = d.C, V = shape.V, R = shape.head_rows;
  const DType lm_type = layout.working[size_t(spec.lm_head_row())].dtype;
  const ParamGroup& g = layout.groups[1];
  const size_t act = bytes_of<float>(N * C), chunk = size_t(R * C) * dtype_size(lm_type);
  const std::vector<size_t> sizes = {g.working_bytes, g.f32_bytes, layer_workspace_bytes(d), act, act, act, act, act,
                                     chunk, bytes_of<float>(R * C), size_t(N) * 3 * sizeof(double),
                                     size_t(N) * sizeof(int32_t) * 2, bytes_of<float>(d.D), sizeof(double)};
  size_t total = 0;
  for (size_t b : sizes) total += (b + 4095) / 4096 * 4096 + 4096;
  cpu_device = cpu_device && total <= (size_t(2) << 30);  // a 405B layer is no probe: the square-GEMM peak prices it
  std::unique_ptr<Device> dev;
  std::vector<char*> buf;
  if (cpu_device) {
    DeviceOptions o;
    o.memory_bytes = total + (size_t(16) << 20);
    dev = device_create(o);
    for (size_t i = 0; i < sizes.size(); ++i) buf.push_back(static_cast<char*>(dev->alloc(sizes[i], "estimate probe")));
    // weights 0.02 (a bf16 pattern reads as ~0.02 in the f32 norms too), activations and
    // gradients of order one, positions 0 .. T-1 per row, targets spread over the vocabulary
    auto fill = [&](char* dst, size_t bytes, auto value) {
      std::vector<decltype(value)> h(bytes / sizeof(value) + 1, value);
      dev->copy_h2d(dst, h.data(), bytes, Stream::compute);
      dev->stream_synchronize(Stream::compute);  // the copy reads h
    };
    const bool bf = spec.matrix_dtype == DType::bf16 || lm_type == DType::bf16;
    if (bf) fill(buf[0], g.working_bytes, f32_to_bf16(0.02f)), fill(buf[8], chunk, f32_to_bf16(0.02f));
    else fill(buf[0], g.working_bytes, 0.02f), fill(buf[8], chunk, 0.02f);
    std::vector<float> x(size_t(N * C));
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * float(i));
    for (int k : {3, 4, 6}) dev->copy_h2d(buf[size_t(k)], x.data(), act, Stream::compute);
    std::vector<int32_t> ids(size_t(2 * N));
    for (int64_t t = 0; t < N; ++t) ids[size_t(t)] = int32_t(t % d.T), ids[size_t(N + t)] = int32_t((t * 7919) % V);
    dev->copy_h2d(buf[11], ids.data(), ids.size() * sizeof(int32_t), Stream::compute);
    const std::vector<float> inv_freq = model_rope_inv_freq(spec.config);
    dev->copy_h2d(buf[12], inv_freq.data(), inv_freq.size() * sizeof(float), Stream::compute);
    dev->stream_synchronize(Stream::compute);
  }
  const LayerWeights w = layer_weights_in(spec, layout, buf.empty() ? nullptr : buf[0], 0);
  LayerGrads lg = layer_grads_in(spec, layout, buf.empty() ? nullptr : buf[1], 0);
  LayerWorkspace ws{};
  if (cpu_device) ws = layer_workspace_carve(d, buf[2]);
  auto op_s = [&](OpKind k) { return dev->counters().op_s[int(k)]; };
  probe_rounds([&] {
    auto t0 = Clock::now();
    ++p.step;
    if (in.moments == DType::bf16)  // the recipe's optim.moments_dtype: bf16 moments, stochastically rounded as trained
      adamw_update_bf16_moments(master.data(), reinterpret_cast<bf16*>(m.data()), reinterpret_cast<bf16*>(v.data()),
                                grad.data(), working.data(), spec.matrix_dtype, n, p);
    else
      adamw_update(master.data(), m.data(), v.data(), grad.data(), working.data(), spec.matrix_dtype, n, p);
    adamw_s.push_back(seconds_since(t0));
    t0 = Clock::now();
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < 64; ++k)
      std::memcpy(dst.data() + size_t(k) * (copy_bytes / 64), src.data() + size_t(k) * (copy_bytes / 64), copy_bytes / 64);
    copy_s.push_back(seconds_since(t0));
    t0 = Clock::now();
    volatile uint32_t crc = crc32c(src.data(), copy_bytes);  // one core, as the file engine's I/O thread sums
    (void)crc;
    crc_s.push_back(seconds_since(t0));
    if (!cpu_device) return;
    const Stream s = Stream::compute;
    const TokenContext ctx{reinterpret_cast<const int32_t*>(buf[11]), nullptr, reinterpret_cast<const float*>(buf[12])};
    auto f = [&](int k) { return reinterpret_cast<float*>(buf[size_t(k)]); };
    auto layer = [&] {
      layer_forward(*dev, f(5), f(3), w, ctx, ws, d, s);
      dev->memset_zero(buf[1], g.f32_bytes, s);
      layer_backward(*dev, f(7), lg, f(4), f(3), w, ctx, ws, d, s);
      dev->stream_synchronize(s);
    };
    layer();  // untimed: brings the layer's activations back into the caches AdamW's and memcpy's pass evicted,
              // where a run finds them (one layer's output is the next one's input)
    const double mm0 = op_s(OpKind::matmul), at0 = op_s(OpKind::attention), rest0 = memory_bound_s(dev->counters());
    layer();
    mm_s.push_back(op_s(OpKind::matmul) - mm0);
    attn_s.push_back(op_s(OpKind::attention) - at0);
    rest_s.push_back(std::max(1e-9, memory_bound_s(dev->counters()) - rest0));
    t0 = Clock::now();
    const auto* targets = reinterpret_cast<const int32_t*>(buf[11]) + N;
    auto* stats = reinterpret_cast<double*>(buf[10]);
    dev->lm_head_ce_chunk_stats(stats, f(6), buf[8], lm_type, targets, N, C, V, 0, R, true, nullptr, s);
    dev->lm_head_ce_stats_loss(reinterpret_cast<double*>(buf[13]), stats, targets, N, V, s);
    dev->memset_zero(buf[9], bytes_of<float>(R * C), s);
    dev->lm_head_ce_chunk_backward(f(7), f(9), f(6), buf[8], lm_type, stats, targets, N, C, V, 0, R, 1.f / float(N), nullptr, s);
    dev->stream_synchronize(s);
    head_s.push_back(seconds_since(t0));
  });
  MeasuredRates r;
  r.adamw_params_per_s = double(n) / median_of(adamw_s);
  r.host_bytes_per_s = 2 * double(copy_bytes) / median_of(copy_s);
  r.checksum_bytes_per_s = double(copy_bytes) / median_of(crc_s);
  if (cpu_device) {
    const DeviceWork layer = layer_work(spec, d.B, d.T), head = head_work(spec, N, R, 0);
    r.matmul_flops_per_s = layer.matmul_flops / median_of(mm_s);
    r.attention_flops_per_s = layer.attention_flops / median_of(attn_s);
    r.elementwise_bytes_per_s = layer.elementwise_bytes / median_of(rest_s);
    r.head_flops_per_s = head.head_flops / median_of(head_s);
  }
  return r;
}

// --rates-from: the CPU backend's rates as a run of the same recipe measured them, per step: each
// step of its metrics.jsonl after the first gives a rate per kind of work, its op_s (the device's
// time per op family) over the work DeviceWork counts for the step (matmul: the layers' GEMMs;
// attention; norm + rope + elementwise: the memory-bound ops; cross_entropy: the lm_head's fused
// chunks). One step's rates together, not each kind's median apart: on a shared machine a step
// is slow in all its ops at once. Sorted by the step's device time (op_s summed). NVMe likewise:
// the step's bytes read and written over its disk-busy time (metrics.jsonl's nvme_busy_s), the
// throughput the disk gave the run's own mix of reads and writes, for both directions.
struct RunStepRates {
  int64_t step = 0;
  double device_s = 0;
  MeasuredRates rates;
};

std::vector<RunStepRates> rates_from_run(const std::string& path, const ModelSpec& spec, const PlanInputs& in,
                                         const RunPlan& plan, int64_t grad_accum) {
  std::error_code ec;
  const fs::path file = fs::is_directory(path, ec) ? fs::path(path) / "metrics.jsonl" : fs::path(path);
  std::ifstream f(file);
  STRATA_CHECK(f.good(), "--rates-from ", path, ": cannot read ", file.string(), " (give a run's output dir or its metrics.jsonl)");
  const int64_t N = in.micro_batch * in.sequence_len;
  const DeviceWork work = layers_work(spec, in.micro_batch, in.sequence_len, plan.kept_activation_layers) * double(grad_accum);
  const double head = head_work(spec, N, spec.config.vocab_size, int64_t(plan.kept_logit_rows)).head_flops *
                      double(grad_accum);
  std::vector<RunStepRates> steps;
  for (std::string line; std::getline(f, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.contains("op_s") || !j.contains("step") || j["step"].get<int64_t>() < 2) continue;
    STRATA_CHECK(j["tokens"].get<int64_t>() == N * grad_accum, "--rates-from ", file.string(), ": its steps ran ",
                 j["tokens"].get<int64_t>(), " tokens, this recipe's run ", N * grad_accum, " (estimate the recipe that run used)");
    const nlohmann::json& o = j["op_s"];
    auto sec = [&](std::initializer_list<const char*> kinds) {
      double t = 0;
      for (const char* k : kinds) t += o.value(k, 0.0);
      return std::max(t, 1e-9);
    };
    RunStepRates r;
    r.step = j["step"].get<int64_t>();
    for (const auto& [kind, t] : o.items()) r.device_s += t.get<double>();
    r.rates.matmul_flops_per_s = work.matmul_flops / sec({"matmul"});
    r.rates.attention_flops_per_s = work.attention_flops / sec({"attention"});
    r.rates.elementwise_bytes_per_s = work.elementwise_bytes / sec({"norm", "rope", "elementwise"});
    r.rates.head_flops_per_s = head / sec({"cross_entropy"});
    const double nvme_bytes = j.value("nvme_read_bytes", 0.0) + j.value("nvme_write_bytes", 0.0);
    const double nvme_busy = j.value("nvme_busy_s", 0.0);
    if (nvme_bytes > 0 && nvme_busy > 0) r.rates.nvme_bytes_per_s = nvme_bytes / nvme_busy;
    steps.push_back(r);
  }
  STRATA_CHECK(!steps.empty(), "--rates-from ", file.string(), ": no step after the first with op_s (run at least 2 steps)");
  std::sort(steps.begin(), steps.end(), [](const RunStepRates& x, const RunStepRates& y) { return x.device_s < y.device_s; });
  return steps;
}

// The device's rates of a run's step in place of StepRates' (the square-GEMM peak stays MFU's).
void use_run_rates(StepRates& rates, const MeasuredRates& m) {
  if (rates.mfu_peak_flops_per_s == 0) rates.mfu_peak_flops_per_s = rates.device_flops_per_s;
  rates.device_flops_per_s = m.matmul_flops_per_s;
  rates.attention_flops_per_s = m.attention_flops_per_s;
  rates.elementwise_bytes_per_s = m.elementwise_bytes_per_s;
  rates.head_flops_per_s = m.head_flops_per_s;
  if (m.nvme_bytes_per_s > 0) rates.nvme_read_bytes_per_s = rates.nvme_write_bytes_per_s = m.nvme_bytes_per_s;
}

// --measure with --nvme-path: sequential write (with fsync) and read of 512 MiB through strata's
// io_uring engine, in a temporary file under the directory, removed afterwards.
std::pair<double, double> measure_nvme(const std::string& dir) {
  const size_t bytes = size_t(512) << 20, piece = size_t(16) << 20;
  const std::string path = (fs::path(dir) / str_cat(".strata_estimate_", ::getpid())).string();
  IoBuffer buf = io_buffer_alloc(piece);
  std::memset(buf.get(), 0x5a, piece);
  FileEngine io;
  io.register_memory(buf.get(), piece);
  double write_s = 0, read_s = 0;
  try {
    int f = io.open(path, FileOpen::create);
    auto t0 = Clock::now();
    for (size_t off = 0; off < bytes; off += piece) io.write(f, off, buf.get(), piece);
    io.wait(io.sync(f));
    io.wait_all();
    write_s = seconds_since(t0);
    io.close(f);
    f = io.open(path, FileOpen::existing);
    t0 = Clock::now();
    for (size_t off = 0; off < bytes; off += piece) io.wait(io.read(f, off, buf.get(), piece));
    read_s = seconds_since(t0);
    io.close(f);
  } catch (...) {
    std::error_code ec;
    fs::remove(path, ec);
    fs::remove(path + ".crc32c", ec);
    throw;
  }
  std::error_code ec;
  fs::remove(path, ec);
  fs::remove(path + ".crc32c", ec);
  return {double(bytes) / read_s, double(bytes) / write_s};
}

}  // namespace

int cmd_estimate(const std::vector<std::string>& args) {
  CLI::App app{"Will a run fit, where does every byte go, and how long will a step take (before running it)",
               "strata estimate"};
  EstimateArgs a;
  app.add_option("recipe", a.recipe_path, "the recipe TOML file (or --model)");
  app.add_option("overrides", a.overrides, "section.key=value overrides, e.g. train.micro_batch_size=4");
  app.add_option("--model", a.model, "a Hugging Face model dir or config.json, priced with the recipe defaults");
  app.add_option("--gpu", a.gpu, "a GPU by name: RTX 3090, RTX 4090, L40S, A100 40GB, A100 80GB, H100 PCIe, "
                                 "H100 SXM, H200, GH200 (its memory, dense peak and link)");
  app.add_option("--gpu-memory", a.gpu_memory, "device memory (a size: 24GiB); with --gpu, instead of its own");
  app.add_option("--gpu-flops", a.gpu_flops, "the device's dense matmul FLOP/s, instead of the table's");
  app.add_option("--link-gbps", a.link_gbps, "host <-> device bandwidth per direction, GB/s");
  app.add_option("--host-memory", a.host_memory, "host RAM budget (a size); default offload.host_memory, else MemAvailable");
  app.add_option("--nvme-path", a.nvme_path, "an NVMe directory for master, moments and checkpoints (nothing is written but --measure's "
                                       "probe); default offload.nvme_path");
  app.add_option("--nvme-memory", a.nvme_memory, "NVMe space strata may use (a size)");
  app.add_option("--optimizer", a.optimizer, "where master and moments go: auto, host or nvme (needs --nvme-path); default offload.optimizer");
  app.add_option("--nvme-read-gbps", a.nvme_read_gbps, "NVMe sequential read GB/s (default 1.5)");
  app.add_option("--nvme-write-gbps", a.nvme_write_gbps, "NVMe sequential write GB/s (default 2)");
  app.add_option("--adamw-params-per-s", a.adamw_params_per_s, "CPU AdamW parameters per second (default 1e9)");
  app.add_option("--rates-from", a.rates_from, "on the CPU backend: its GEMM, attention, memory-bound and lm_head rates "
                                             "as a run of this recipe measured them (its output dir or metrics.jsonl: "
                                             "op_s, the median over the steps after the first)");
  app.add_flag("--json", a.json, "print one JSON object instead of the table");
  app.add_flag("--resume", a.resume, "the run resumes from a checkpoint (count what reading it back holds)");
  app.add_flag("--measure", a.measure, "measure this host's CPU AdamW rate, memory bandwidth, on the CPU backend its "
                                       "GEMM, attention, memory-bound and lm_head rates (a layer and an lm_head chunk "
                                       "run at the model's shapes) and, with --nvme-path, the NVMe read and write "
                                       "bandwidth (a 512 MiB file, removed after) instead of the assumed defaults");
  int rc = 0;
  if (!parse_args(app, args, &rc)) return rc;
  if (!a.model.empty() && a.recipe_path.find('=') != std::string::npos) {  // --model takes overrides only
    a.overrides.insert(a.overrides.begin(), a.recipe_path);
    a.recipe_path.clear();
  }
  STRATA_CHECK(a.recipe_path.empty() != a.model.empty(), "give a recipe or --model DIR|config.json (one of them)");

  const Recipe recipe = estimate_recipe(a);
  const ModelConfig cfg = hf_config_load(recipe.model_path.empty() ? recipe.model_config : recipe.model_path);
  const DType dtype = dtype_parse(recipe.model_dtype);
  const ModelSpec spec = model_spec_build(cfg, dtype);

  PlanInputs in = recipe_plan_inputs(recipe);
  if (!a.optimizer.empty()) in.optimizer = state_tier_parse(a.optimizer);  // else the recipe's offload.optimizer
  in.resume = a.resume;
  in.baseline_bytes = process_rss_bytes();  // the same binary and libraries as `strata train`
  PlanBudgets budgets = recipe_plan_budgets(recipe);
  if (!a.host_memory.empty()) {
    budgets.host_bytes = parse_bytes(a.host_memory, "--host-memory");
    budgets.host_origin = "--host-memory " + a.host_memory;
  }
  if (!a.nvme_path.empty()) budgets.nvme_dir = a.nvme_path;  // else the recipe's offload.nvme_path
  if (!a.nvme_memory.empty()) budgets.nvme_bytes = parse_bytes(a.nvme_memory, "--nvme-memory");

  // the device: a GPU of the table, or the recipe's (the CPU backend is measured here)
  StepRates rates;
  std::string device_text;
  if (!a.gpu.empty()) {
    const std::optional<GpuSpec> g = gpu_spec_find(a.gpu);
    std::string names;
    for (const GpuSpec& s : gpu_specs()) names += (names.empty() ? "" : ", ") + s.name;
    STRATA_CHECK(g, "--gpu ", a.gpu, " is not in the table (", names, "): give --gpu-memory and --gpu-flops instead");
    in.device_in_host_ram = false;
    in.device_is_cuda = true;
    budgets.device_bytes = g->memory_bytes;
    budgets.device_origin = "--gpu " + g->name;
    const std::optional<DevicePeak> peak = gpu_datasheet_peak(g->datasheet_name, dtype);
    STRATA_ASSERT(peak, "no datasheet peak for ", g->datasheet_name);
    rates.device_flops_per_s = peak->flops_per_s;
    rates.link_bytes_per_s = g->link_bytes_per_s;
    device_text = str_cat(g->name, " (", format_bytes(g->memory_bytes), ", ", g->link, " ", gb_per_s(g->link_bytes_per_s),
                          ", ", peak->flops_per_s / 1e12, " TFLOP/s ", dtype_name(dtype), " dense)");
  } else if (recipe.device_backend == "cpu" && a.gpu_memory.empty()) {
    rates.device_flops_per_s = cpu_measured_peak(dtype).flops_per_s;
    rates.link_bytes_per_s = recipe.device_link_bytes_per_s > 0 ? recipe.device_link_bytes_per_s : rates.host_bytes_per_s;
    device_text = str_cat("the CPU backend (", format_bytes(budgets.device_bytes), " arena in process memory, ",
                          rates.device_flops_per_s / 1e9, " GFLOP/s measured here)");
  } else {
    STRATA_CHECK(!a.gpu_memory.empty() && a.gpu_flops > 0 && a.link_gbps > 0, "for a GPU not in the table give "
                 "--gpu-memory, --gpu-flops and --link-gbps (or --gpu NAME)");
    in.device_in_host_ram = false;
    in.device_is_cuda = true;
    device_text = "a GPU given by its figures";
  }
  if (!a.gpu_memory.empty()) {
    budgets.device_bytes = parse_bytes(a.gpu_memory, "--gpu-memory");
    budgets.device_origin = "--gpu-memory " + a.gpu_memory;
  }
  // where each rate comes from: the GPU table, measured here, given, or an assumption (the
  // StepRates defaults), printed beside the step time
  std::map<std::string, std::string> source = {{"device", a.gpu.empty() ? "measured here (CPU GEMM)" : "datasheet"},
                                               {"link", "datasheet"}, {"nvme_read", "assumed"},
                                               {"nvme_write", "assumed"}, {"adamw", "assumed"}, {"host", "assumed"},
                                               {"checksum", "assumed"}};
  if (a.gpu.empty() && recipe.device_backend == "cpu" && a.gpu_memory.empty())
    source["link"] = recipe.device_link_bytes_per_s > 0 ? "device.link_bandwidth (throttle)" : "memcpy (host bandwidth)";
  placement_resolve_weights(spec, in, budgets);  // offload.weights = WeightsMode::automatic, as the trainer resolves it
  if (a.measure) {
    cpu_threads_set(int(recipe.device_cpu_threads));  // the kernels' thread count, as `strata train` sets it
    cpu_threads_apply();
    const bool cpu = source["device"] == "measured here (CPU GEMM)";
    const MeasuredRates m = measure_rates(spec, in, cpu);
    if (cpu && m.matmul_flops_per_s > 0) {
      rates.mfu_peak_flops_per_s = rates.device_flops_per_s;  // MFU stays against the square-GEMM peak, as the trainer's
      rates.device_flops_per_s = m.matmul_flops_per_s;
      rates.attention_flops_per_s = m.attention_flops_per_s;
      rates.elementwise_bytes_per_s = m.elementwise_bytes_per_s;
      rates.head_flops_per_s = m.head_flops_per_s;
      source["device"] = "measured here (a layer's GEMMs at this model's shapes)";
      source["attention"] = source["elementwise"] = source["head"] = "measured here (a layer and an lm_head chunk)";
    }
    rates.adamw_params_per_s = m.adamw_params_per_s;
    rates.host_bytes_per_s = m.host_bytes_per_s;
    rates.checksum_bytes_per_s = m.checksum_bytes_per_s;
    source["adamw"] = source["host"] = source["checksum"] = "measured here";
    if (source["link"] == "memcpy (host bandwidth)") rates.link_bytes_per_s = rates.host_bytes_per_s;
    if (!budgets.nvme_dir.empty()) {
      const auto [r, w] = measure_nvme(budgets.nvme_dir);
      rates.nvme_read_bytes_per_s = r;
      rates.nvme_write_bytes_per_s = w;
      source["nvme_read"] = source["nvme_write"] = "measured here (" + budgets.nvme_dir + ")";
    }
  }
  const RunPlan plan = placement_plan(spec, in, budgets);  // and with it offload.accumulation's schedule
  std::vector<RunStepRates> run_steps;  // --rates-from: the run's steps, by device time
  if (!a.rates_from.empty()) {
    STRATA_CHECK(source["device"].rfind("measured here", 0) == 0, "--rates-from prices the CPU backend: not with --gpu or --gpu-memory");
    run_steps = rates_from_run(a.rates_from, spec, in, plan, recipe.gradient_accumulation_steps);
    const RunStepRates& median = run_steps[(run_steps.size() - 1) / 2];
    use_run_rates(rates, median.rates);
    source["device"] = source["attention"] = source["elementwise"] = source["head"] =
        str_cat("from ", a.rates_from, " (step ", median.step, ": the median device time of its steps after the first)");
    if (median.rates.nvme_bytes_per_s > 0)
      source["nvme_read"] = source["nvme_write"] =
          str_cat("from ", a.rates_from, " (step ", median.step, ": NVMe bytes read + written over its disk-busy time)");
  }
  auto given = [&](double value, double scale, double& rate, const char* name) {
    if (value > 0) rate = value * scale, source[name] = "given";
  };
  given(a.gpu_flops, 1, rates.device_flops_per_s, "device");
  given(a.link_gbps, 1e9, rates.link_bytes_per_s, "link");
  given(a.nvme_read_gbps, 1e9, rates.nvme_read_bytes_per_s, "nvme_read");
  given(a.nvme_write_gbps, 1e9, rates.nvme_write_bytes_per_s, "nvme_write");
  given(a.adamw_params_per_s, 1, rates.adamw_params_per_s, "adamw");
  std::map<std::string, double> rate_value = {
      {"device", rates.device_flops_per_s},          {"link", rates.link_bytes_per_s},
      {"nvme_read", rates.nvme_read_bytes_per_s},     {"nvme_write", rates.nvme_write_bytes_per_s},
      {"adamw", rates.adamw_params_per_s},            {"host", rates.host_bytes_per_s},
      {"checksum", rates.checksum_bytes_per_s}};
  if (rates.elementwise_bytes_per_s > 0)  // the CPU backend's own, measured
    rate_value.insert({{"attention", rates.attention_flops_per_s}, {"elementwise", rates.elementwise_bytes_per_s},
                       {"head", rates.head_flops_per_s}});

  const int64_t max_batch = placement_max_micro_batch(spec, in, budgets, 1 << 14);
  const int64_t max_seq = placement_max_sequence_len(spec, in, budgets, 1 << 20);
  const StepEstimate step = step_estimate(spec, in, plan, recipe.gradient_accumulation_steps, rates,
                                          recipe.zo_perturbations);

  if (a.json) {
    nlohmann::json j = placement_plan_json(plan);
    nlohmann::json out = {{"fits", plan.fits()}, {"tiers", j["tiers"]}, {"states", j["states"]},
                          {"accumulation", plan.group > 1 ? "layer_major" : "micro_batch"},
                          {"max_micro_batch_size", max_batch}, {"max_sequence_len", max_seq}};
    out["step"] = {{"seconds", step.seconds}, {"tokens_per_s", step.tokens_per_s}, {"mfu", step.mfu},
                   {"bottleneck", step.bottleneck}, {"components", step.components}, {"compute_parts", step.compute_parts},
                   {"bytes", {{"h2d", step.bytes.h2d}, {"d2h", step.bytes.d2h}, {"link", step.bytes.link()},
                              {"nvme_read", step.bytes.nvme_read()}, {"nvme_write", step.bytes.nvme_write()}}}};
    for (const auto& [name, v] : rate_value) out["step"]["rates"][name] = {{"value", v}, {"source", source[name]}};
    if (!run_steps.empty()) {  // the step whose rates are used, and each step's estimate at its own rates
      out["step"]["rates_from_step"] = run_steps[(run_steps.size() - 1) / 2].step;
      for (const RunStepRates& r : run_steps) {
        StepRates own = rates;
        use_run_rates(own, r.rates);
        const StepEstimate e = step_estimate(spec, in, plan, recipe.gradient_accumulation_steps, own, recipe.zo_perturbations);
        out["step"]["rates_from_steps"].push_back({{"step", r.step}, {"seconds", e.seconds}});
      }
    }
    std::printf("%s\n", out.dump().c_str());
    return plan.fits() ? 0 : 3;
  }
  const bool resident = plan.weights == WeightsMode::device;
  std::printf("strata estimate: %s, %.3gB parameters (%s); micro_batch_size %ld x sequence_len %ld, gradient "
              "accumulation %ld (%s); weights %s\ndevice: %s\nfits: %s\n",
              cfg.family.c_str(), double(spec.parameter_count()) / 1e9, dtype_name(dtype), long(in.micro_batch),
              long(in.sequence_len), long(recipe.gradient_accumulation_steps),
              plan.group > 1 ? (resident ? "layer-major" : "layer-major: weights cross twice per step")
                           : "one micro-batch at a time",
              resident ? "resident (they cross once per step, after the update)" : "streamed", device_text.c_str(),
              plan.fits() ? "yes" : "NO");
  for (const std::string& p : plan.problems) std::printf("  %s\n", p.c_str());
  std::printf("%s", placement_plan_table(plan).c_str());
  std::printf("  (tokenized data rows are not read here: 16 bytes per token of the dataset come on top)\n");
  if (!plan.fits()) {
    std::printf("what to change:\n");
    for (const PlanChange& c : plan.changes)
      std::printf("  - %s%s\n", c.what.c_str(), c.saves_bytes ? str_cat(": saves ", format_bytes(c.saves_bytes)).c_str() : "");
  }
  std::printf("largest micro_batch_size that fits (sequence_len %ld): %ld\nlargest sequence_len that fits "
              "(micro_batch_size %ld): %ld\n",
              long(in.sequence_len), long(max_batch), long(in.micro_batch), long(max_seq));
  std::printf("step: %.4g s, %.4g tokens/s, MFU %.1f%%, bottleneck %s\n", step.seconds, step.tokens_per_s,
              100 * step.mfu, step.bottleneck.c_str());
  for (const auto& [name, s] : step.components) std::printf("  %-10s %.4g s\n", name.c_str(), s);
  std::printf("  compute by kind:");
  for (const auto& [name, s] : step.compute_parts) std::printf(" %s %.4g s", name.c_str(), s);
  std::printf("\n");
  std::printf("moved per step: link %s (h2d %s, d2h %s), NVMe read %s, write %s\n",
              format_bytes(size_t(step.bytes.link())).c_str(), format_bytes(size_t(step.bytes.h2d)).c_str(),
              format_bytes(size_t(step.bytes.d2h)).c_str(), format_bytes(size_t(step.bytes.nvme_read())).c_str(),
              format_bytes(size_t(step.bytes.nvme_write())).c_str());
  const char* unit[] = {"device FLOP/s", "link B/s", "NVMe read B/s", "NVMe write B/s", "AdamW params/s", "host B/s",
                        "attention FLOP/s", "memory-bound B/s", "lm_head FLOP/s"};
  const char* key[] = {"device", "link", "nvme_read", "nvme_write", "adamw", "host", "attention", "elementwise", "head"};
  std::printf("rates:\n");
  bool assumed = false;
  for (int i = 0; i < 9; ++i) {
    if (!rate_value.count(key[i])) continue;
    std::printf("  %-16s %.4g  %s\n", unit[i], rate_value.at(key[i]), source[key[i]].c_str());
    assumed = assumed || source[key[i]] == "assumed";
  }
  if (assumed) std::printf("  (assumed rates are typical figures, not this machine's: --measure measures them here)\n");
  return plan.fits() ? 0 : 3;
}

}  // namespace strata
