#include "src/train/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <atomic>
#include <csignal>
#include <map>
#include <sstream>
#include <unistd.h>

#include "io/files.h"
#include "io/metrics.h"
#include "io/safetensors.h"
#include "io/token_rows.h"
#include "kernels/cpu/ops.h"
#include "offload/engine.h"
#include "offload/host_budget.h"
#include "offload/model_io.h"
#include "offload/adamw.h"
#include "src/core/error.h"
#include "src/core/threads.h"
#include "src/train/checkpoint.h"
#include "src/train/progress.h"
#include "src/train/training_data.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Peak f32 GEMM throughput of the CPU backend, measured once so MFU is a ratio to something
// real on this machine rather than a datasheet number.
double measure_cpu_gemm_peak() {
  const int64_t n = 1024;
  std::vector<float> a(size_t(n * n), 0.5f), b(size_t(n * n), 0.25f), c(size_t(n * n));
  cpu::matmul_f32(c.data(), a.data(), b.data(), n, n, n, false, true, 0.f);  // warm up
  double best = 1e30;
  for (int r = 0; r < 3; ++r) {
    auto t0 = Clock::now();
    cpu::matmul_f32(c.data(), a.data(), b.data(), n, n, n, false, true, 0.f);
    best = std::min(best, seconds_since(t0));
  }
  return 2.0 * double(n * n * n) / best;
}

// Model FLOPs of one token's forward + backward: 6 per matmul parameter plus attention
// (12 * layers * heads * head_dim * context / 2 for a causal mask), as the MFU literature counts.
double flops_per_token(const ModelSpec& spec, int64_t T) {
  double matmul_params = 0;
  for (auto& r : spec.params.rows())
    if (r.shape.size() == 2 && r.name != "model.embed_tokens.weight") matmul_params += double(r.numel());
  if (spec.lm_head == kAbsent) matmul_params += double(spec.params[size_t(spec.embed)].numel());
  const auto& c = spec.config;
  return 6.0 * matmul_params +
         6.0 * double(c.num_hidden_layers * c.num_attention_heads * c.head_dim) * double(T);
}

MicroBatch take_rows(const TokenRows& rows, const std::vector<int64_t>& order, size_t first, int64_t count) {
  MicroBatch mb;
  mb.B = count;
  mb.T = rows.T;
  for (int64_t b = 0; b < count; ++b) {
    size_t r = size_t(order[(first + size_t(b)) % order.size()]);
    auto span = [&](const std::vector<int32_t>& v, std::vector<int32_t>& out) {
      out.insert(out.end(), v.begin() + int64_t(r) * rows.T, v.begin() + int64_t(r + 1) * rows.T);
    };
    span(rows.ids, mb.ids);
    span(rows.targets, mb.targets);
    span(rows.pos, mb.pos);
    span(rows.doc_start, mb.doc_start);
  }
  return mb;
}

}  // namespace

double lr_schedule(const std::string& type, int64_t s, int64_t total, int64_t warmup, double min_ratio) {
  if (s < warmup) return double(s) / double(warmup);  // as HF: the first warmup step has lr 0
  if (type == "constant") return 1.0;
  double progress = double(s - warmup) / double(std::max<int64_t>(1, total - warmup));
  double decay = type == "linear" ? 1.0 - progress : 0.5 * (1.0 + std::cos(M_PI * progress));
  return min_ratio + (1.0 - min_ratio) * std::max(0.0, decay);
}

namespace {

uint64_t rows_hash(const TokenRows& rows) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const std::vector<int32_t>& v) {
    for (int32_t x : v) {
      uint32_t u = uint32_t(x);
      for (int b = 0; b < 4; ++b) h = (h ^ ((u >> (8 * b)) & 0xffu)) * 1099511628211ull;
    }
  };
  mix(rows.ids);
  mix(rows.targets);
  mix(rows.pos);
  mix(rows.doc_start);
  return h ^ uint64_t(rows.T);
}

// "section.key = value" lines of an effective recipe, for comparing a resumed run's recipe
// with the checkpoint's.
std::map<std::string, std::string> recipe_lines(const std::string& toml) {
  std::map<std::string, std::string> out;
  std::istringstream in(toml);
  std::string line, section;
  while (std::getline(in, line)) {
    if (line.size() > 2 && line.front() == '[') section = line.substr(1, line.find(']') - 1);
    size_t eq = line.find(" = ");
    if (eq != std::string::npos) out[section + "." + line.substr(0, eq)] = line.substr(eq + 3);
  }
  return out;
}

// Keeps the records of steps <= last_step (a resumed run rewrites what came after).
void metrics_truncate(const std::string& path, int64_t last_step) {
  std::ifstream in(path);
  if (!in) return;
  std::string line, kept;
  while (std::getline(in, line)) {
    try {
      auto j = nlohmann::json::parse(line);
      if (j.contains("step") && j["step"].get<int64_t>() <= last_step) kept += line + "\n";
    } catch (const nlohmann::json::exception&) {
      // a torn last line of an interrupted run: dropped
    }
  }
  file_write_atomic(path, kept.data(), kept.size());
}

std::atomic<int> g_signals{0};

extern "C" void on_stop_signal(int sig) {
  if (g_signals.fetch_add(1) == 0) {
    const char msg[] = "\nstrata train: stopping after this step and saving a checkpoint "
                       "(signal again to stop at once without saving)\n";
    ssize_t ignored = ::write(2, msg, sizeof msg - 1);
    (void)ignored;
    return;
  }
  const char msg[] = "\nstrata train: second signal: stopped at once; earlier checkpoints are intact\n";
  ssize_t ignored = ::write(2, msg, sizeof msg - 1);
  (void)ignored;
  (void)sig;
  ::_exit(kExitStoppedAtOnce);
}

}  // namespace

void train_install_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

void train_request_stop() { g_signals.fetch_add(1); }

TrainSummary train_run(const Recipe& rc, const TrainOptions& topt) {
  g_signals.store(0);
  std::fprintf(stderr, "strata train: effective recipe (%s)\n%s\n", rc.source_path.c_str(), rc.to_toml().c_str());

  // model config
  ModelConfig cfg = hf_config_load(rc.model_path.empty() ? rc.model_config : rc.model_path);
  ModelSpec spec = model_spec_build(cfg, dtype_parse(rc.model_dtype));

  // output dir first: a run that cannot write its results should fail before any work
  {
    std::error_code ec;
    std::filesystem::create_directories(rc.output_dir, ec);
    STRATA_CHECK_IO(!ec, "cannot create checkpoint.output_dir ", rc.output_dir, ": ", ec.message());
    STRATA_CHECK_IO(::access(rc.output_dir.c_str(), W_OK) == 0, "checkpoint.output_dir ", rc.output_dir,
                    " is not writable: choose another output_dir or fix its permissions");
  }
  std::string resume_dir;
  if (!topt.resume.empty()) {
    resume_dir = topt.resume == "auto" ? checkpoint_find_latest(rc.output_dir) : topt.resume;
    if (resume_dir.empty())
      std::fprintf(stderr, "strata train: --resume auto: no complete checkpoint in %s; starting from step 0\n",
                   rc.output_dir.c_str());
  }

  // data
  TrainingData data = training_data_load(rc, cfg.vocab_size);
  const TokenRows& rows = data.train;

  // device and model
  DeviceOptions dopt;
  dopt.backend = rc.device_backend;
  dopt.memory_bytes = rc.device_memory_bytes;
  dopt.link_bytes_per_s = rc.device_link_bytes_per_s;
  cpu_threads_set(int(rc.device_cpu_threads));
  cpu_threads_apply();
  // the host tiers must fit before anything is allocated (exit 3 naming what to move to NVMe)
  host_budget_check(spec, HostStoreOptions{},
                    EngineOptions{rc.offload_weights, rc.offload_checkpoints, rc.micro_batch_size, rc.sequence_len},
                    host_memory_budget(rc.host_memory_bytes, rc.host_memory));
  auto dev = device_create(dopt);
  HostStore store(*dev, spec);
  if (!rc.model_path.empty()) model_load_weights(store, rc.model_path);
  else model_init_weights(store, uint64_t(rc.model_init_seed), rc.model_init_std);
  EngineOptions eopt;
  eopt.weights = rc.offload_weights;
  eopt.checkpoints = rc.offload_checkpoints;
  eopt.max_batch = rc.micro_batch_size;
  eopt.max_tokens = rc.sequence_len;
  Engine engine(*dev, store, eopt);
  const ModelSpec& ms = store.spec();
  const size_t host_bytes = store.host_bytes() + store.pinned_bytes();
  std::fprintf(stderr, "strata train: %s, %.2fM parameters (%s), weights %s, %zu of %zu layer "
               "checkpoints on the device; device %s of %s, host %s (%s pinned)\n",
               cfg.family.c_str(), double(ms.parameter_count()) / 1e6, rc.model_dtype.c_str(),
               rc.offload_weights.c_str(), engine.device_checkpoints(), ms.layers.size(),
               format_bytes(dev->used_bytes()).c_str(), format_bytes(dev->budget_bytes()).c_str(),
               format_bytes(host_bytes).c_str(), format_bytes(store.pinned_bytes()).c_str());

  const double peak = measure_cpu_gemm_peak();
  const double fpt = flops_per_token(ms, rc.sequence_len);
  const std::string recipe_toml = rc.to_toml();
  file_write_atomic(rc.output_dir + "/recipe.toml", recipe_toml.data(), recipe_toml.size());
  CheckpointFiles files{data.tokenizer_dir, rc.model_path};
  const DType save_dtype = dtype_parse(rc.save_dtype);

  // the data order and where a resumed run continues
  const int64_t rows_per_step = rc.micro_batch_size * rc.gradient_accumulation_steps;
  const int64_t max_steps = rc.max_steps > 0 ? rc.max_steps
      : std::max<int64_t>(1, int64_t(std::ceil(rc.num_train_epochs * double(rows.rows()) / double(rows_per_step))));
  TrainState state;
  state.rows = rows.rows();
  state.data_hash = rows_hash(rows);
  std::mt19937_64 rng(uint64_t(rc.seed));
  if (resume_dir.empty()) {
    state.order.resize(size_t(rows.rows()));
    std::iota(state.order.begin(), state.order.end(), 0);
    std::shuffle(state.order.begin(), state.order.end(), rng);
    metrics_truncate(rc.output_dir + "/metrics.jsonl", 0);
  } else {
    TrainState saved = checkpoint_load(resume_dir, store);
    STRATA_CHECK(saved.rows == state.rows && saved.data_hash == state.data_hash, "cannot resume from ",
                 resume_dir, ": its training data (", saved.rows, " rows) differs from this run's (", state.rows,
                 " rows, or the same count with other tokens); resume needs the same data, tokenizer, "
                 "sequence_len and packing");
    STRATA_CHECK(saved.step < max_steps, "cannot resume from ", resume_dir, ": it is at step ", saved.step,
                 " and the run ends at step ", max_steps, "; raise train.max_steps to train further");
    std::istringstream rs(saved.rng);
    rs >> rng;
    STRATA_CHECK(!rs.fail(), resume_dir, "/trainer_state.json: the RNG state is damaged");
    const std::string saved_recipe = file_read(resume_dir + "/recipe.toml", "checkpoint file",
                                               "resume from an older checkpoint (--resume DIR)");
    auto was = recipe_lines(saved_recipe), now = recipe_lines(recipe_toml);
    for (auto& [k, v] : now) {
      if (k.rfind("checkpoint.", 0) == 0 || k.rfind("device.", 0) == 0 || k == "train.max_steps" ||
          k == "train.log_steps" || k == "train.eval_steps" || k.rfind("offload.", 0) == 0)
        continue;
      auto it = was.find(k);
      if (it != was.end() && it->second != v)
        std::fprintf(stderr, "strata train: warning: %s is %s now but was %s in the checkpoint; the resumed run "
                     "is not the run it continues\n", k.c_str(), v.c_str(), it->second.c_str());
    }
    state = std::move(saved);
    metrics_truncate(rc.output_dir + "/metrics.jsonl", state.step);
    std::fprintf(stderr, "strata train: resumed from %s at step %ld of %ld\n", resume_dir.c_str(),
                 long(state.step), long(max_steps));
  }
  state.max_steps = max_steps;
  MetricsWriter metrics(rc.output_dir + "/metrics.jsonl", /*append=*/true);

  const int64_t warmup = rc.warmup_steps > 0 ? rc.warmup_steps
                                             : int64_t(std::ceil(rc.warmup_ratio * double(max_steps)));
  Progress progress(max_steps, rc.log_steps);
  auto save = [&]() {
    engine.synchronize();
    std::string dir = checkpoint_save(rc.output_dir, store, state, recipe_toml, save_dtype, files, rc.keep_last);
    progress.message("strata train: saved " + dir);
    return dir;
  };
  auto evaluate = [&](int64_t step) {
    if (data.eval.rows() == 0) return;
    double loss_sum = 0;
    int64_t counted = 0;
    std::vector<int64_t> seq(size_t(data.eval.rows()));
    std::iota(seq.begin(), seq.end(), 0);
    for (size_t first = 0; first < seq.size(); first += size_t(rc.micro_batch_size)) {
      int64_t n = std::min<int64_t>(rc.micro_batch_size, int64_t(seq.size() - first));
      MicroBatch mb = take_rows(data.eval, seq, first, n);
      counted += mb.counted();
      loss_sum += engine.forward_loss(mb);
    }
    const double eval_loss = counted ? loss_sum / double(counted) : 0.0;
    metrics.write({{"step", step}, {"eval_loss", eval_loss}, {"eval_tokens", counted}});
    progress.message(str_cat("step ", step, "/", max_steps, "  eval_loss ", eval_loss, " over ", counted, " tokens"));
  };

  TrainSummary summary;
  double tokens_after_first = 0, time_after_first = 0;
  const int64_t first_step = state.step + 1;
  DeviceCounters after_first{};
  for (int64_t step = first_step; step <= max_steps; ++step) {
    auto t_step = Clock::now();
    const DeviceCounters c0 = dev->counters();
    // the micro-batches of this step, and the token count the loss is averaged over
    std::vector<MicroBatch> mbs;
    int64_t counted = 0;
    for (int64_t a = 0; a < rc.gradient_accumulation_steps; ++a) {
      if (state.cursor + uint64_t(rc.micro_batch_size) > state.order.size()) {  // next epoch, reshuffled
        std::shuffle(state.order.begin(), state.order.end(), rng);
        state.cursor = 0;
        ++state.epoch;
      }
      mbs.push_back(take_rows(rows, state.order, state.cursor, rc.micro_batch_size));
      state.cursor += uint64_t(rc.micro_batch_size);
      counted += mbs.back().counted();
    }
    STRATA_CHECK(counted > 0, "step ", step, " has no labelled tokens");
    const EngineStats e0 = engine.stats();
    AdamWParams ap;
    ap.lr = rc.learning_rate * lr_schedule(rc.lr_scheduler_type, step - 1, max_steps, warmup, rc.min_lr_ratio);
    ap.beta1 = rc.adam_beta1;
    ap.beta2 = rc.adam_beta2;
    ap.eps = rc.adam_epsilon;
    ap.step = step;
    const float scale = float(1.0 / double(counted));
    double loss_sum = 0, grad_norm = 0;
    if (rc.max_grad_norm > 0) {  // clipping needs the global norm before any update
      for (auto& mb : mbs) loss_sum += engine.forward_backward(mb, scale);
      grad_norm = engine.optimizer_step(ap, rc.max_grad_norm, rc.weight_decay);
    } else {  // no clipping: the last micro-batch updates each group as its gradient lands
      for (size_t a = 0; a + 1 < mbs.size(); ++a) loss_sum += engine.forward_backward(mbs[a], scale);
      loss_sum += engine.forward_backward_update(mbs.back(), scale, ap, rc.weight_decay);
      grad_norm = engine.landed_update_norm();
    }
    if (step == max_steps) engine.synchronize();
    const EngineStats e1 = engine.stats();
    const double step_s = seconds_since(t_step);
    const DeviceCounters c1 = dev->counters();
    const int64_t tokens = rows_per_step * rc.sequence_len;
    const double loss = loss_sum / double(counted);
    state.step = step;
    state.tokens_seen += double(tokens);
    summary.losses.push_back(loss);
    if (step > first_step) {
      tokens_after_first += double(tokens);
      time_after_first += step_s;
    } else {
      after_first = c1;
    }
    const double tps = double(tokens) / step_s;
    nlohmann::json rec = {
        {"step", step}, {"loss", loss}, {"lr", ap.lr}, {"grad_norm", grad_norm},
        {"tokens", tokens}, {"loss_tokens", counted}, {"tokens_per_s", tps},
        {"mfu", tps * fpt / peak}, {"step_s", step_s}, {"compute_s", e1.compute_s - e0.compute_s},
        {"h2d_wait_s", e1.h2d_wait_s - e0.h2d_wait_s}, {"d2h_wait_s", e1.d2h_wait_s - e0.d2h_wait_s},
        {"optimizer_s", e1.optimizer_s - e0.optimizer_s},
        {"optimizer_exposed_s", e1.optimizer_exposed_s - e0.optimizer_exposed_s}, {"nvme_wait_s", 0.0},
        {"device_peak_bytes", dev->peak_bytes()}, {"host_pinned_bytes", store.pinned_bytes()},
        {"host_bytes", host_bytes}, {"link_bytes", e1.link_bytes - e0.link_bytes}};
    nlohmann::json ops = nlohmann::json::object();
    for (int k = 0; k < int(OpKind::count); ++k) ops[op_kind_name(OpKind(k))] = c1.op_s[k] - c0.op_s[k];
    rec["op_s"] = ops;
    metrics.write(rec);
    progress.step({step, max_steps, loss, ap.lr, grad_norm, tps, tps * fpt / peak, step_s, dev->peak_bytes(),
                   store.pinned_bytes(), host_bytes});

    const bool last = step == max_steps;
    if (rc.eval_steps > 0 && step % rc.eval_steps == 0 && !last) evaluate(step);
    const bool stop = g_signals.load() > 0 || step == topt.stop_at_step;
    if (last || stop || (rc.save_steps > 0 && step % rc.save_steps == 0)) {
      std::ostringstream rs;
      rs << rng;
      state.rng = rs.str();
      if (last) evaluate(step);
      summary.last_checkpoint = save();
    }
    if (stop && !last) {
      summary.interrupted = true;
      progress.finish();
      std::fprintf(stderr, "strata train: interrupted at step %ld; resume with: strata train %s --resume auto\n",
                   long(step), rc.source_path.c_str());
      engine.synchronize();
      return summary;
    }
  }
  progress.finish();
  summary.tokens_per_s = time_after_first > 0 ? tokens_after_first / time_after_first : 0;
  {
    const DeviceCounters end = dev->counters();
    double total = 0;
    for (int k = 0; k < int(OpKind::count); ++k) total += end.op_s[k] - after_first.op_s[k];
    summary.matmul_share = total > 0 ? (end.op_s[0] - after_first.op_s[0]) / total : 0;
    std::string split;
    for (int k = 0; k < int(OpKind::count); ++k)
      split += str_cat(k ? ", " : "", op_kind_name(OpKind(k)), " ",
                       int(std::lround(100 * (end.op_s[k] - after_first.op_s[k]) / std::max(total, 1e-12))), "%");
    if (max_steps > first_step)
      std::fprintf(stderr, "strata train: %.0f tokens/s after the first step; device op time: %s\n",
                   summary.tokens_per_s, split.c_str());
  }
  summary.final_dir = rc.output_dir + "/final";
  engine.synchronize();
  export_hf_atomic(store, summary.final_dir, save_dtype, files);
  std::fprintf(stderr, "strata train: done; model written to %s, metrics to %s/metrics.jsonl\n",
               summary.final_dir.c_str(), rc.output_dir.c_str());
  return summary;
}

}  // namespace strata
