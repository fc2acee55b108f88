// `strata estimate RECIPE.toml [key=value ...] [--measure]` and `strata estimate --model DIR|config.json`:
// will the run fit, where does every byte go, and how fast will a step be — without running
// it. The bytes are the trainer's own placement plan (offload/placement_plan.h, with the same
// recipe-to-plan glue, train_plan_inputs); the step time is the roofline of
// offload/step_estimate.h. Nothing large is allocated: a 405B config answers in a moment.
// Exit 0 when it fits, 3 when it does not, 2 on bad input.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>

#include "io/uring_file.h"
#include "src/core/bf16.h"
#include "kernels/cpu/ops.h"
#include "offload/engine_buffers.h"
#include "offload/adamw.h"
#include "offload/step_estimate.h"
#include "src/cli/cli_args.h"
#include "src/cli/commands.h"
#include "src/core/error.h"
#include "src/core/process_memory.h"
#include "src/device/peak_flops.h"
#include "src/train/accumulation.h"
#include "src/train/trainer.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

struct EstimateArgs {
  std::string recipe_path, model;
  std::vector<std::string> overrides;
  std::string gpu, gpu_memory, host_memory, nvme_memory, nvme_path, optimizer;
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

// The probes below time short rounds and keep the fastest: other work on the machine only ever
// slows a round down, and on a shared machine it comes and goes in bursts of seconds, so the
// rounds go on until kProbeWindow seconds have passed (at least kProbeRounds of them).
constexpr double kProbeWindow = 2.0;
constexpr int kProbeRounds = 5;

template <class Round>
double probe_fastest_seconds(Round&& round) {
  round();  // touches the pages, builds oneDNN's primitives
  double best = 1e30;
  const auto start = Clock::now();
  for (int r = 0; r < kProbeRounds || seconds_since(start) < kProbeWindow; ++r) {
    const auto t0 = Clock::now();
    round();
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

// --measure: this host's CPU AdamW rate (the fastest update over 8M parameters, bf16 working
// copy) — 128 MiB of memory, freed before the plan is priced.
double measure_adamw_params_per_s() {
  const int64_t n = int64_t(8) << 20;
  std::vector<float> master(size_t(n), 0.5f), m(size_t(n), 0.f), v(size_t(n), 0.f), grad(size_t(n), 1e-3f);
  std::vector<bf16> working{};
  working.resize(size_t(n));
  AdamWParams p;
  const double best = probe_fastest_seconds([&] {
    ++p.step;
    adamw_update(master.data(), m.data(), v.data(), grad.data(), working.data(), DType::bf16, n, p);
  });
  return double(n) / best;
}

// --measure: this host's memory bandwidth as the copies and the accumulation see it: the fastest
// parallel memcpy pass over 64 MiB (read + write counted).
double measure_host_bytes_per_s() {
  const size_t n = size_t(64) << 20;
  std::vector<char> src(n, 1), dst(n, 0);
  const double best = probe_fastest_seconds([&] {
    const int64_t pieces = 64;
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < pieces; ++p) std::memcpy(dst.data() + size_t(p) * (n / pieces), src.data() + size_t(p) * (n / pieces), n / pieces);
  });
  return 2 * double(n) / best;
}

// --measure on the CPU backend: the GEMM rate at this model's own shapes — each distinct layer
// matrix (O, I) and one lm_head chunk, in the three products a step runs (y = x W^T, dx = dy W,
// dW += dy^T x) at the micro-batch's N tokens — as the backend runs them (oneDNN); each shape's
// fastest round (probe_fastest_seconds). Small micro-batches run below the square-GEMM peak.
double measure_cpu_gemm_at_shapes(const ModelSpec& spec, int64_t N, DType ab) {
  std::vector<std::pair<int64_t, int64_t>> shapes;  // (O, I) with their multiplicity folded in below
  std::vector<double> count;
  for (const TensorSpec& r : spec.params.rows()) {
    if (r.shape.size() != 2 || r.name.rfind("model.layers.0.", 0) != 0) continue;
    const std::pair<int64_t, int64_t> oi{r.shape[0], r.shape[1]};
    const auto it = std::find(shapes.begin(), shapes.end(), oi);
    if (it == shapes.end()) shapes.push_back(oi), count.push_back(double(spec.layers.size()));
    else count[size_t(it - shapes.begin())] += double(spec.layers.size());
  }
  const TensorSpec& lm = spec.params[size_t(spec.lm_head_row())];
  shapes.push_back({std::min<int64_t>(lm.shape[0], kHeadChunkRows), lm.shape[1]});
  count.push_back(double(lm.shape[0]) / double(shapes.back().first));
  struct Probe {
    int64_t O, I;
    std::vector<float> a, b, c;
    std::vector<bf16> a16, b16;
    double best = 1e30;
  };
  std::vector<Probe> probes;
  for (const auto& [O, I] : shapes) {
    const size_t big = size_t(std::max(O, N) * std::max(I, N));
    probes.push_back({O, I, std::vector<float>(big, 0.25f), std::vector<float>(big, -0.5f), std::vector<float>(big),
                      std::vector<bf16>(big, f32_to_bf16(0.25f)), std::vector<bf16>(big, f32_to_bf16(-0.5f))});
  }
  auto products = [&](Probe& q) {
    auto mm = [&](int64_t m, int64_t n, int64_t k, bool ta, bool tb, float beta) {
      if (ab == DType::bf16) cpu::matmul_bf16(q.c.data(), q.a16.data(), q.b16.data(), m, n, k, ta, tb, beta);
      else cpu::matmul_f32(q.c.data(), q.a.data(), q.b.data(), m, n, k, ta, tb, beta);
    };
    mm(N, q.O, q.I, false, true, 0.f);   // y = x W^T
    mm(N, q.I, q.O, false, false, 0.f);  // dx = dy W
    mm(q.O, q.I, N, true, false, 1.f);   // dW += dy^T x
  };
  probe_fastest_seconds([&] {  // each shape keeps its own fastest round
    for (Probe& q : probes) {
      const auto t0 = Clock::now();
      products(q);
      q.best = std::min(q.best, seconds_since(t0));
    }
  });
  double flops = 0, seconds = 0;
  for (size_t i = 0; i < probes.size(); ++i) {
    flops += count[i] * 6.0 * double(N) * double(probes[i].O) * double(probes[i].I);
    seconds += count[i] * probes[i].best;
  }
  return flops / seconds;
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
  app.add_flag("--json", a.json, "print one JSON object instead of the table");
  app.add_flag("--resume", a.resume, "the run resumes from a checkpoint (count what reading it back holds)");
  app.add_flag("--measure", a.measure, "measure this host's CPU AdamW rate, memory bandwidth and, with --nvme-path, the "
                                       "NVMe read and write bandwidth (a 512 MiB file, removed after) instead of the "
                                       "assumed defaults");
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

  PlanInputs in = train_plan_inputs(recipe);
  if (!a.optimizer.empty()) in.optimizer = a.optimizer;  // else the recipe's offload.optimizer
  in.resume = a.resume;
  in.baseline_bytes = process_rss_bytes();  // the same binary and libraries as `strata train`
  PlanBudgets budgets = train_plan_budgets(recipe);
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
                                               {"nvme_write", "assumed"}, {"adamw", "assumed"}, {"host", "assumed"}};
  if (a.gpu.empty() && recipe.device_backend == "cpu" && a.gpu_memory.empty())
    source["link"] = recipe.device_link_bytes_per_s > 0 ? "device.link_bandwidth (throttle)" : "memcpy (host bandwidth)";
  if (a.measure) {
    if (source["device"] == "measured here (CPU GEMM)") {
      rates.mfu_peak_flops_per_s = rates.device_flops_per_s;  // MFU stays against the square-GEMM peak, as the trainer's
      rates.device_flops_per_s = measure_cpu_gemm_at_shapes(spec, in.micro_batch * in.sequence_len, dtype);
      source["device"] = "measured here (CPU GEMM at this model's shapes)";
    }
    rates.adamw_params_per_s = measure_adamw_params_per_s();
    rates.host_bytes_per_s = measure_host_bytes_per_s();
    source["adamw"] = source["host"] = "measured here";
    if (source["link"] == "memcpy (host bandwidth)") rates.link_bytes_per_s = rates.host_bytes_per_s;
    if (!budgets.nvme_dir.empty()) {
      const auto [r, w] = measure_nvme(budgets.nvme_dir);
      rates.nvme_read_bytes_per_s = r;
      rates.nvme_write_bytes_per_s = w;
      source["nvme_read"] = source["nvme_write"] = "measured here (" + budgets.nvme_dir + ")";
    }
  }
  auto given = [&](double value, double scale, double& rate, const char* name) {
    if (value > 0) rate = value * scale, source[name] = "given";
  };
  given(a.gpu_flops, 1, rates.device_flops_per_s, "device");
  given(a.link_gbps, 1e9, rates.link_bytes_per_s, "link");
  given(a.nvme_read_gbps, 1e9, rates.nvme_read_bytes_per_s, "nvme_read");
  given(a.nvme_write_gbps, 1e9, rates.nvme_write_bytes_per_s, "nvme_write");
  given(a.adamw_params_per_s, 1, rates.adamw_params_per_s, "adamw");
  const std::map<std::string, double> rate_value = {
      {"device", rates.device_flops_per_s},          {"link", rates.link_bytes_per_s},
      {"nvme_read", rates.nvme_read_bytes_per_s},     {"nvme_write", rates.nvme_write_bytes_per_s},
      {"adamw", rates.adamw_params_per_s},            {"host", rates.host_bytes_per_s}};

  in.group = accumulation_group(recipe, spec.lm_head == kAbsent, 1, [&](int64_t k) {  // offload.accumulation
    PlanInputs t = in;
    t.group = k;
    return placement_plan(spec, t, budgets).fits();
  });
  const PlacementPlan plan = placement_plan(spec, in, budgets);
  const int64_t max_batch = placement_max_micro_batch(spec, in, budgets, 1 << 14);
  const int64_t max_seq = placement_max_sequence_len(spec, in, budgets, 1 << 20);
  const StepEstimate step = step_estimate(spec, in, plan, recipe.gradient_accumulation_steps, rates,
                                          recipe.zo_perturbations);

  if (a.json) {
    nlohmann::json j = placement_plan_json(plan);
    nlohmann::json out = {{"fits", plan.fits()}, {"tiers", j["tiers"]}, {"states", j["states"]},
                          {"accumulation", in.group > 1 ? "layer_major" : "micro_batch"},
                          {"max_micro_batch_size", max_batch}, {"max_sequence_len", max_seq}};
    out["step"] = {{"seconds", step.seconds}, {"tokens_per_s", step.tokens_per_s}, {"mfu", step.mfu},
                   {"bottleneck", step.bottleneck}, {"components", step.components},
                   {"bytes", {{"h2d", step.bytes.h2d}, {"d2h", step.bytes.d2h}, {"link", step.bytes.link()},
                              {"nvme_read", step.bytes.nvme_read()}, {"nvme_write", step.bytes.nvme_write()}}}};
    for (const auto& [name, v] : rate_value) out["step"]["rates"][name] = {{"value", v}, {"source", source[name]}};
    std::printf("%s\n", out.dump().c_str());
    return plan.fits() ? 0 : 3;
  }
  std::printf("strata estimate: %s, %.3gB parameters (%s); micro_batch_size %ld x sequence_len %ld, gradient "
              "accumulation %ld (%s)\ndevice: %s\nfits: %s\n",
              cfg.family.c_str(), double(spec.parameter_count()) / 1e9, dtype_name(dtype), long(in.micro_batch),
              long(in.sequence_len), long(recipe.gradient_accumulation_steps),
              in.group > 1 ? "layer-major: weights cross twice per step" : "one micro-batch at a time", device_text.c_str(),
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
  std::printf("moved per step: link %s (h2d %s, d2h %s), NVMe read %s, write %s\n",
              format_bytes(size_t(step.bytes.link())).c_str(), format_bytes(size_t(step.bytes.h2d)).c_str(),
              format_bytes(size_t(step.bytes.d2h)).c_str(), format_bytes(size_t(step.bytes.nvme_read())).c_str(),
              format_bytes(size_t(step.bytes.nvme_write())).c_str());
  const char* unit[] = {"device FLOP/s", "link B/s", "NVMe read B/s", "NVMe write B/s", "AdamW params/s", "host B/s"};
  const char* key[] = {"device", "link", "nvme_read", "nvme_write", "adamw", "host"};
  std::printf("rates:\n");
  bool assumed = false;
  for (int i = 0; i < 6; ++i) {
    std::printf("  %-15s %.4g  %s\n", unit[i], rate_value.at(key[i]), source[key[i]].c_str());
    assumed = assumed || source[key[i]] == "assumed";
  }
  if (assumed) std::printf("  (assumed rates are typical figures, not this machine's: --measure measures them here)\n");
  return plan.fits() ? 0 : 3;
}

}  // namespace strata
