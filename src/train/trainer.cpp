#include "src/train/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>

#include "io/datasets.h"
#include "io/files.h"
#include "io/metrics.h"
#include "io/text_encoder.h"
#include "io/safetensors.h"
#include "io/token_rows.h"
#include "offload/state/nf4_layout.h"
#include "offload/state/adamw.h"
#include "offload/reduce/comm_reduction.h"
#include "offload/reduce/device_reduction.h"
#include "offload/engine/engine.h"
#include "offload/engine/engine_zo.h"
#include "offload/engine/step_engine.h"
#include "offload/state/lora.h"
#include "offload/state/model_io.h"
#include "offload/plan/step_estimate.h"
#include "offload/plan/placement_plan.h"
#include "offload/plan/plan_search.h"
#include "offload/plan/run_engines.h"
#include "offload/state/nvme_dir.h"
#include "src/core/error.h"
#include "src/core/fault.h"
#include "src/core/process_memory.h"
#include "src/core/threads.h"
#include "src/recipe/recipe_plan.h"
#include "src/train/checkpoint.h"
#include "src/train/distributed.h"
#include "src/train/grpo_trainer.h"
#include "src/train/preference_step.h"
#include "src/train/progress.h"
#include "src/train/run_dir.h"
#include "src/train/shared_store.h"
#include "src/train/step_calibration.h"
#include "src/train/training_data.h"
#include "src/train/zo_step.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

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

// Inputs that must exist, checked before anything is loaded: a missing one is bad input (exit 2)
// that names the recipe key.
void check_inputs(const Recipe& rc) {
  std::error_code ec;
  if (!rc.model_path.empty())
    STRATA_CHECK(fs::is_directory(rc.model_path, ec), "model.path ", rc.model_path, " does not exist (or is not "
                 "a directory): give a Hugging Face model folder holding config.json and *.safetensors");
  if (!rc.model_config.empty())
    STRATA_CHECK(fs::exists(rc.model_config, ec), "model.config ", rc.model_config, " does not exist: give the "
                 "config.json of the model to initialise");
  STRATA_CHECK(!rc.lora_enabled || !rc.model_path.empty(), rc.source_path, ": LoRA trains adapters on a pretrained "
               "base: set model.path (model.config alone prices the run with strata estimate, but has no weights to adapt)");
  if (!rc.nvme_path.empty()) nvme_path_check(rc.nvme_path);
  if (!rc.eval_path.empty())
    STRATA_CHECK(fs::exists(rc.eval_path, ec), "data.eval_path ", rc.eval_path, " does not exist: give the "
                 "held-out dataset, or leave data.eval_path unset (data.eval_split holds out part of data.path)");
}

// Every path the run reads, for --overwrite to keep its hands off (src/train/run_dir.h).
std::vector<RunInput> run_inputs(const Recipe& rc, const TrainOptions& topt) {
  std::vector<RunInput> in = {{"model.path", rc.model_path},     {"model.config", rc.model_config},
                              {"data.path", rc.data_path},       {"data.eval_path", rc.eval_path},
                              {"data.prepared_dir", rc.prepared_dir}, {"lora.adapter", rc.lora_adapter}};
  if (TextEncoder::setting_is_dir(rc.data_tokenizer)) in.push_back({"data.tokenizer", rc.data_tokenizer});
  if (!topt.resume.empty()) in.push_back({"--resume", topt.resume});
  return in;
}

// A loaded model must hold finite weights: NaN or Inf in a file is the file's fault, and would
// otherwise surface later as a "not finite" gradient.
void check_loaded_weights(HostStore& store, const std::string& model_path) {
  const ModelSpec& spec = store.spec();
  std::vector<float> w;  // one parameter at a time, wherever the master lives
  for (size_t i = 0; i < spec.params.size(); ++i) {
    const int64_t n = spec.params[i].numel();
    w.resize(size_t(n));
    store.get_param(i, w.data());
    for (int64_t j = 0; j < n; ++j)
      STRATA_CHECK(std::isfinite(w[j]), "the model in ", model_path, " holds ", std::isnan(w[j]) ? "NaN" : "Inf",
                   " in ", spec.params[i].name, " (element ", j, "): the model file is damaged or was saved "
                   "broken; re-download or re-export it");
  }
}

// The built-in ChatML template when chat data was rendered with it (the tokenizer has no
// template of its own), for the export; "" otherwise.
std::string fallback_chat_template(const Recipe& rc, const std::string& tokenizer_dir) {
  if (tokenizer_dir.empty()) return "";
  if (!dataset_format_renders_chat(rc.data_format, rc.prepared_dir.empty() ? rc.data_path : "", rc.skip_bad_lines))
    return "";
  std::error_code ec;
  if (fs::exists(fs::path(tokenizer_dir) / "chat_template.jinja", ec)) return "";
  const fs::path cfg = fs::path(tokenizer_dir) / "tokenizer_config.json";
  if (fs::is_regular_file(cfg, ec)) {
    std::ifstream in(cfg, std::ios::binary);
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    if (!j.is_object() || (j.contains("chat_template") && !j["chat_template"].is_null())) return "";
  }
  return TextEncoder::chatml_source();
}

struct StepBatch {
  std::vector<MicroBatch> micro;
  int64_t counted = 0;  // labelled tokens the loss is averaged over
  std::vector<std::vector<int64_t>> pairs;  // preference objectives: each micro-batch's pair indices
  std::vector<int64_t> prompts;             // grpo: the step's prompts (src/train/grpo_trainer.h)
};

struct StepResult {
  int64_t step = 0;
  int64_t counted = 0;  // labelled tokens the loss averaged over
  double loss = 0, grad_norm = 0, lr = 0;
  double run_s = 0, save_s = 0;  // the step's compute and, when it saved, the save
  nlohmann::json preference;     // preference objectives: TRL's metrics (preference_step.h)
  EngineStats e0, e1;
  DeviceCounters c0, c1;
  CommReductionStats g0, g1;  // data parallel: the gradient all-reduces
  nlohmann::json workers;     // data parallel, every distributed.diagnostics_steps: worker consistency
  nlohmann::json extra = nlohmann::json::object();  // objective-specific metrics (zo-sgd: zo_step.h)
};

// One training run: what the steps of train_run share.
class TrainRun {
 public:
  TrainRun(const Recipe& rc, const TrainOptions& topt, Distributed& dist)
      : rc_(rc), topt_(topt), dist_(dist), progress_(0, rc.log_steps) {}
  void set_up();
  void resume();
  bool stop_before_first_step() const { return train_stop_requested(); }
  bool done() const { return state_.step >= max_steps_; }
  StepBatch next_batch();
  StepResult step(const StepBatch& batch);
  void evaluate_if_due(int64_t step, bool stopping);
  bool save_due(int64_t step, bool stopping) const;
  double save();
  void show(const StepResult& r);    // the progress display, as soon as the step is done
  void record(const StepResult& r);  // metrics.jsonl, once its save (if any) is timed
  bool stop_requested(int64_t step) { return dist_.any(train_stop_requested() || step == topt_.stop_at_step); }
  TrainSummary interrupted(int64_t step);
  TrainSummary finish();
  void warn_batch_change(const TrainState& saved, int64_t rows_per_step) const;

 private:
  void set_up_model();
  StepRates plan_rates() const;
  void measure_cpu_rates(const ModelSpec& spec);
  void keep_resumed_split();
  void adopt_plan_split();
  void say_accumulation(const ModelSpec& spec) const;
  void release_model();
  void check_allocations_against_plan();
  void say_speculation() const;
  void say_lean_state() const;
  void load_data();
  void plan_with_data();
  void load_weights();
  void evaluate(int64_t step);
  nlohmann::json op_seconds(const DeviceCounters& c0, const DeviceCounters& c1) const;
  double step_mfu(const StepResult& r);
  void check_step_model(const StepResult& r, nlohmann::json& rec);
  void check_grpo_phases(const StepResult& r, const StepRates& rates, nlohmann::json& rec);
  // the engine of the run's optimizer: first order (engine_) or zeroth order (zo_engine_)
  void engine_synchronize() { engine_->synchronize(); }
  EngineStats engine_stats() const { return engine_->stats(); }
  int64_t tokens_per_step() const {  // a preference micro-batch is micro_batch_size pairs: twice the rows
    return rc_.micro_batch_size * rc_.gradient_accumulation_steps * zo_par_.groups * rc_.sequence_len *
           (preference_ ? 2 : 1);
  }

  Recipe rc_;  // a copy: train.global_batch_size's split is written into it
  const TrainOptions& topt_;
  Distributed& dist_;
  Progress progress_;
  std::unique_ptr<RunLock> lock_;
  ModelConfig cfg_;
  TrainingData data_;
  PlanInputs plan_in_;
  PlanBudgets budgets_;
  RunPlan plan_;
  int64_t built_group_ = 1;  // the engine's micro-batches per pass, as built
  std::unique_ptr<Device> dev_;
  std::unique_ptr<SharedHostMemory> shared_memory_;  // distributed.shared_host_store: the store's memory
  bool shared_store_ = false;
  std::unique_ptr<Comm> device_comm_;  // data parallel over NCCL (Distributed::device_comm), freed before dev_
  std::unique_ptr<HostStore> store_;
  std::unique_ptr<LoraStore> lora_;  // [lora]: the adapters (the store is frozen)
  std::unique_ptr<StepEngine> engine_;  // the one the plan built (offload/engine/step_engine.h)
  Engine* first_order_ = nullptr;  // engine_ when it is the first-order one: its set-up hooks (reduction, LoRA, preference)
  DataParallelReduction* reduction_ = nullptr;  // data parallel: the engine's gradient reduction
  // How the step's micro-batches are dealt over the ranks: first order, one data group per rank;
  // zo-sgd, distributed.zo's layout (src/train/zo_step.h)
  ZoParallel zo_par_;
  std::unique_ptr<PreferenceTrainer> preference_;  // train.objective dpo | ipo | simpo | orpo
  std::unique_ptr<GrpoTrainer> grpo_;               // train.objective grpo
  GrpoPromptData grpo_data_;                        // its prompts, until grpo_ holds them
  std::unique_ptr<MetricsWriter> metrics_;
  DevicePeak peak_;
  // the CPU backend's rates the plan is priced at (measure_cpu_rates), rank 0's on every rank
  struct CpuRates {
    LayerRates layer;  // a layer and an lm_head chunk at the model's shapes (offload/plan/layer_probe.h)
    double square_gemm_peak = 0;
  } cpu_rates_;
  bool cpu_rates_measured_ = false;
  double flops_per_token_ = 0;
  bool mfu_capped_ = false;
  size_t host_bytes_ = 0;
  std::string recipe_toml_, resume_dir_;
  bool data_loaded_ = false;
  bool export_only_ = false;  // resumed at the last step to finish final/'s export
  CheckpointFiles files_;
  int64_t max_steps_ = 0, warmup_ = 0, first_step_ = 1;
  TrainState state_;
  std::mt19937_64 rng_;
  TrainSummary summary_;
  double tokens_after_first_ = 0, time_after_first_ = 0;
  DeviceCounters after_first_{};
};

}  // namespace

std::string lora_target_list(const std::vector<std::string>& names, const std::vector<std::string>& parameters) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  for (const std::string& n : parameters) out += (out.empty() ? "" : ", ") + n;
  return out;
}

double lr_schedule(LrSchedule type, int64_t s, int64_t total, int64_t warmup, double min_ratio) {
  if (s < warmup) return double(s) / double(warmup);  // as HF: the first warmup step has lr 0
  if (type == LrSchedule::constant) return 1.0;
  double progress = double(s - warmup) / double(std::max<int64_t>(1, total - warmup));
  double decay = type == LrSchedule::linear ? 1.0 - progress : 0.5 * (1.0 + std::cos(M_PI * progress));
  return min_ratio + (1.0 - min_ratio) * std::max(0.0, decay);
}

TrainSummary train_run(const Recipe& rc, const TrainOptions& topt) {
  Distributed dist(rc);
  TrainRun run(rc, topt, dist);
  run.set_up();
  run.resume();
  if (run.stop_before_first_step()) return run.interrupted(0);
  while (!run.done()) {
    const StepBatch batch = run.next_batch();
    StepResult r = run.step(batch);
    run.show(r);
    const bool stopping = run.stop_requested(r.step);
    run.evaluate_if_due(r.step, stopping);
    if (run.save_due(r.step, stopping)) r.save_s = run.save();
    run.record(r);
    if (stopping && !run.done()) return run.interrupted(r.step);
  }
  return run.finish();
}

namespace {

// Inputs, the output dir, budgets (host, then device, before any data is tokenized or weight
// loaded), data, weights, the MFU peak. A signal in here exits at once (signals.h).
void TrainRun::set_up() {
  train_signals_reset();
  train_signal_phase_setup(true);
  std::fprintf(stderr, "strata train: effective recipe (%s)\n%s\n", rc_.source_path.c_str(), rc_.to_toml().c_str());
  check_inputs(rc_);
  const bool zo = rc_.modes.optimizer == OptimizerKind::zo_sgd;
  zo_par_ = zo ? zo_parallel_layout(rc_.modes.zo, dist_.rank(), dist_.size()) : ZoParallel{1, 0, dist_.size(), dist_.rank()};
  if (zo && dist_.data_parallel())
    std::fprintf(stderr, "strata train: zo-sgd over %d ranks: %d side(s) x %d data group(s) (distributed.zo = \"%s\"); "
                 "only the loss scalars cross between ranks\n", dist_.size(), zo_par_.sides, zo_par_.groups,
                 rc_.distributed_zo.c_str());
  STRATA_CHECK(!zo || !preference_objective_enabled(rc_), "optim.type = \"zo-sgd\" trains "
               "train.objective = \"sft\" only; set optim.type = \"adamw\" for train.objective = \"", rc_.objective, "\"");
  STRATA_CHECK(!preference_objective_enabled(rc_) || dist_.size() == 1,
               "train.objective = \"", rc_.objective,
               "\" runs on one rank only (data parallel covers train.objective = \"sft\" and \"grpo\"): launch "
               "without mpirun, or with -np 1");
  cfg_ = hf_config_load(rc_.model_path.empty() ? rc_.model_config : rc_.model_path);
  if (cfg_.max_position_embeddings > 0 && cfg_.max_position_embeddings < rc_.sequence_len)
    std::fprintf(stderr, "strata train: warning: data.sequence_len (%ld) is longer than the model's "
                 "max_position_embeddings (%ld): positions beyond it were never trained\n",
                 long(rc_.sequence_len), long(cfg_.max_position_embeddings));
  if (dist_.primary()) {  // rank 0 owns the run dir; the others look once it is ready
    // the lock first: nothing in the dir is touched while another process holds it
    run_dir_create(rc_.output_dir);
    lock_ = std::make_unique<RunLock>(rc_.output_dir);
    run_dir_prepare(rc_.output_dir, topt_.resuming(), topt_.overwrite, run_inputs(rc_, topt_));
  }
  dist_.barrier();
  if (topt_.resuming()) {
    resume_dir_ = topt_.resume_latest ? checkpoint_find_latest(rc_.output_dir) : topt_.resume;
    if (resume_dir_.empty())
      std::fprintf(stderr, "strata train: --resume auto: no complete checkpoint in %s; starting from step 0\n",
                   rc_.output_dir.c_str());
  }
  adamw_isa_active();  // its one-line notice comes now, not over the progress bar
  plan_in_ = recipe_plan_inputs(rc_, dist_.size());  // plan_with_data adds the tokenized rows
  plan_in_.resume = !resume_dir_.empty();
  plan_in_.baseline_bytes = process_rss_bytes();  // before the device, the store and the data
  keep_resumed_split();
  set_up_model();
  if (!data_loaded_) load_data();
  plan_with_data();
  if (rc_.eval_steps > 0 && data_.eval.rows() == 0 && data_.eval_chosen.empty())
    std::fprintf(stderr, "strata train: warning: train.eval_steps is %ld but there is no eval data; set "
                 "data.eval_path or data.eval_split to get an eval loss\n", long(rc_.eval_steps));
  load_weights();
  if (preference_objective_enabled(rc_)) {  // the reference pass sees the starting weights
    preference_ = std::make_unique<PreferenceTrainer>(
        rc_, PreferencePairs{std::move(data_.train_chosen), std::move(data_.train_rejected)},
        PreferencePairs{std::move(data_.eval_chosen), std::move(data_.eval_rejected)}, *dev_, *first_order_);
    preference_->prepare_reference(progress_);
  }
  if (rc_.objective == "grpo") {  // the generator and the rewards over the loaded weights
    STRATA_CHECK(first_order_, "train.objective = \"grpo\" trains with optim.type = \"adamw\"");
    GrpoRanks ranks{dist_.rank(), dist_.size(), [this](std::vector<double>& v) { dist_.all_reduce_sum(v); }};
    grpo_ = std::make_unique<GrpoTrainer>(rc_, std::move(grpo_data_), cfg_, *dev_, *store_, *first_order_, lora_.get(),
                                          std::move(ranks));
  }
  peak_ = dev_->peak_flops(dtype_parse(rc_.model_dtype));
  flops_per_token_ = model_flops_per_token(store_->spec(), rc_.sequence_len);  // offload/plan/step_estimate.h
  if (plan_.optimizer_kind == OptimizerKind::zo_sgd) flops_per_token_ *= zo_flops_ratio(rc_);  // forward passes only
  std::fprintf(stderr, "strata train: MFU is relative to %.3g TFLOP/s (%s)\n", peak_.flops_per_s / 1e12,
               peak_.source.c_str());
  if (plan_in_.device_in_host_ram)
    std::fprintf(stderr, "strata train: CPU attention kernel %s (STRATA_ATTENTION_ISA chooses another)\n",
                 cpu_backend_attention_kernel());
  recipe_toml_ = rc_.to_toml();
  if (dist_.primary()) file_write_atomic(rc_.output_dir + "/recipe.toml", recipe_toml_.data(), recipe_toml_.size());
  files_ = CheckpointFiles{data_.tokenizer_dir, rc_.model_path, fallback_chat_template(rc_, data_.tokenizer_dir)};
  if (dist_.primary()) {  // a disk that cannot take one checkpoint: said now, not after the first steps
    std::error_code ec;
    const fs::space_info space = fs::space(rc_.output_dir, ec);
    const size_t need = checkpoint_bytes_estimate(*store_, dtype_parse(rc_.save_dtype), plan_in_.data_rows, lora_.get());
    const std::string warning = ec ? "" : run_dir_space_warning(rc_.output_dir, need, size_t(space.available));
    if (!warning.empty()) std::fprintf(stderr, "strata train: warning: %s\n", warning.c_str());
  }
}

// The placement plan (offload/plan/placement_plan.h) decides and checks every tier before anything
// large is allocated or filled (exit 3 naming what to change); then the device, the host store
// and the engine allocate, and what they allocated is checked against the plan. The tokenized
// rows are not known yet: plan_with_data adds them.
void TrainRun::set_up_model() {
  ModelSpec spec = model_spec_build(cfg_, dtype_parse(rc_.model_dtype));
  if (plan_in_.lora.enabled() && plan_in_.lora.base_nf4) nf4_base_enable(spec, plan_in_.lora.double_quant);
  DeviceOptions dopt;
  dopt.backend = rc_.modes.device;
  dopt.memory_bytes = rc_.device_memory_bytes;
  dopt.link_bytes_per_s = rc_.device_link_bytes_per_s;
  cpu_threads_set(int(rc_.device_cpu_threads));
  cpu_threads_apply();
  cpu_threads_start();  // before anything opens a parallel region (the tokenizer too): exit 3 if they cannot exist

  budgets_ = recipe_plan_budgets(rc_);
  if (plan_in_.device_in_host_ram && !cpu_rates_measured_) measure_cpu_rates(spec);
  // every "auto" resolved: the fastest plan that fits (offload/plan/plan_search.h)
  const StepRates rates = plan_rates();
  plan_ = placement_plan(spec, plan_in_, budgets_, rates);
  const bool device_over = budgets_.device_bytes && plan_.tier(Tier::device) > budgets_.device_bytes;
  if (!plan_.fits() && !data_loaded_ && !device_over) {
    // Short of host memory: before it says what to change, the plan counts the tokenized data
    // too, so the advice is the total the checks after loading use, not one that fails again
    // with the data added. (A device that is too small is said at once: the data changes nothing
    // there.)
    load_data();
    plan_ = placement_plan(spec, plan_in_, budgets_, rates);
  }
  placement_plan_check(plan_);
  adopt_plan_split();
  say_accumulation(spec);
  shared_store_ = dist_.choose_shared_store(rc_, plan_.optimizer_on_nvme);

  dev_ = device_create(dopt);
  if (shared_store_) {  // one store for the node's ranks (src/train/shared_store.h), page-locked for copies
    shared_memory_ = std::make_unique<SharedHostMemory>(dist_.node(), HostStore::shared_bytes(spec), dev_.get());
    store_ = std::make_unique<HostStore>(*dev_, spec, shared_memory_->data());
  } else {
    store_ = run_plan_host_store(*dev_, spec, plan_);
  }
  if (plan_.lora.enabled()) lora_ = std::make_unique<LoraStore>(*dev_, spec, plan_.lora);
  if (plan_.optimizer_kind == OptimizerKind::zo_sgd) {
    std::unique_ptr<ZoEngine> zo = run_plan_zo_engine(*dev_, *store_, plan_);
    zo->set_step({uint64_t(rc_.seed), rc_.zo_eps, int(rc_.zo_perturbations)}, zo_par_, &dist_.comm());
    engine_ = std::move(zo);
    zo_step_notes(rc_);
  } else {
    std::unique_ptr<Engine> first = run_plan_engine(*dev_, *store_, plan_, lora_.get());
    first_order_ = first.get();
    engine_ = std::move(first);
  }
  built_group_ = plan_.group;
  if (dist_.data_parallel() && first_order_) {  // zo-sgd reduces loss scalars only (zo_step.h)
    device_comm_ = dist_.device_comm(*dev_);
    Comm* node = shared_store_ ? &dist_.node() : nullptr;  // the ranks sharing this rank's store
    std::unique_ptr<DataParallelReduction> reduction;
    if (device_comm_) {
      reduction = std::make_unique<DeviceGradReduction>(*device_comm_, spec.lm_head == kAbsent, *dev_, node);
      std::fprintf(stderr, "strata train: gradients all-reduced on the device over %s\n", device_comm_->name().c_str());
    } else {
      reduction = std::make_unique<CommGradReduction>(dist_.comm(), spec.lm_head == kAbsent, *dev_, node);
    }
    reduction_ = reduction.get();
    first_order_->set_grad_reduction(std::move(reduction));
  }
  host_bytes_ = store_->host_bytes() + store_->pinned_bytes() + (lora_ ? lora_->host_bytes() + lora_->pinned_bytes() : 0);
  check_allocations_against_plan();
}

// What the search prices plans with: on the CPU backend its own rates at the model's shapes
// (measure_cpu_rates) and the link's throttle or memcpy; on a GPU the search's stated defaults
// (the device is not open yet: only the order of the plans matters).
StepRates TrainRun::plan_rates() const {
  return plan_run_rates(plan_in_, cpu_rates_.square_gemm_peak, cpu_rates_.layer, rc_.device_link_bytes_per_s);
}

// The CPU backend's rates, before the first plan: a few rounds of one layer's forward and backward
// and one lm_head chunk at the model's shapes, so that the search sees the attention, the memory-
// bound ops (a layer-major pass's gradient adds among them) and the head at what they cost here,
// not every op at the square-GEMM peak. Measured once, on rank 0: every rank plans alike.
void TrainRun::measure_cpu_rates(const ModelSpec& spec) {
  if (dist_.primary()) {
    cpu_rates_.layer = layer_probe_run_rates(spec, plan_in_);
    cpu_rates_.square_gemm_peak = cpu_measured_peak(dtype_parse(rc_.model_dtype)).flops_per_s;
  }
  if (dist_.size() > 1) dist_.comm().broadcast(&cpu_rates_, sizeof cpu_rates_, 0).wait();
  cpu_rates_measured_ = true;
}

// train.global_batch_size on resume: the split the checkpoint's run chose is kept (the same
// micro-batches in the same order: bit-exact), when the global batch and the ranks are the same.
void TrainRun::keep_resumed_split() {
  if (rc_.global_batch_size <= 0 || resume_dir_.empty()) return;
  const TrainState saved = checkpoint_batch_split(resume_dir_);
  if (saved.global_batch != rc_.global_batch_size || saved.ranks != dist_.size() || saved.micro_batch <= 0) return;
  plan_in_.micro_batch = saved.micro_batch * plan_in_.pair_rows;
  plan_in_.accumulation_steps = saved.accumulation;
  plan_in_.micro_batch_fixed = plan_in_.accumulation_fixed = true;
}

// train.global_batch_size: the split the plan chose becomes the run's (its micro-batches, the
// checkpoint's record); later plans (with the data counted) keep it.
void TrainRun::adopt_plan_split() {
  if (rc_.global_batch_size <= 0) return;
  rc_.micro_batch_size = plan_.micro_batch / plan_in_.pair_rows;
  rc_.gradient_accumulation_steps = plan_.accumulation_steps;
  plan_in_.micro_batch = plan_.micro_batch;
  plan_in_.accumulation_steps = plan_.accumulation_steps;
  plan_in_.micro_batch_fixed = plan_in_.accumulation_fixed = true;
  if (dist_.primary())
    std::fprintf(stderr, "strata train: train.global_batch_size = %ld: micro_batch_size %ld x gradient_accumulation_steps "
                 "%ld x %d rank%s (%s)\n", long(rc_.global_batch_size), long(rc_.micro_batch_size),
                 long(rc_.gradient_accumulation_steps), dist_.size(), dist_.size() == 1 ? "" : "s",
                 resume_dir_.empty() ? "the fastest split that fits" : "the split this run started with, or the fastest");
}

// The schedule over a step's micro-batches the plan chose (offload.accumulation), said at start.
// zo-sgd: over its q x k dual forwards; where "auto" kept them one at a time because the
// layer-major schedule does not fit, what does not fit.
void TrainRun::say_accumulation(const ModelSpec& spec) const {
  const char* asked = rc_.offload_accumulation.c_str();
  if (rc_.gradient_accumulation_steps > 1 && plan_.optimizer_kind == OptimizerKind::adamw) {
    // what crosses the link: resident layers once a step (after the update), streamed ones twice a pass
    const size_t L = spec.layers.size();
    const size_t resident = plan_.weights == WeightsMode::device ? L : std::min(plan_.resident_layers, L);
    const char* pass = plan_.group > 1 ? "optimizer step" : "micro-batch";
    const std::string weights =
        resident == L ? "the weights stay on the device (they cross once per step, after the update)"
        : resident > 0 ? str_cat("the first ", resident, " layers' weights stay on the device, the other layers' cross twice per ", pass)
                       : str_cat("each layer's weights cross twice per ", pass);
    std::fprintf(stderr, "strata train: offload.accumulation = \"%s\": %s, %s\n", asked,
                 plan_.group > 1 ? "layer-major" : "one micro-batch at a time", weights.c_str());
  }
  const int64_t pairs = rc_.gradient_accumulation_steps * rc_.zo_perturbations;
  if (plan_.optimizer_kind != OptimizerKind::zo_sgd || pairs <= 1 || !dist_.primary()) return;
  if (plan_.group > 1) {
    std::fprintf(stderr, "strata train: offload.accumulation = \"%s\": layer-major, the step's %ld dual forwards "
                 "(%ld perturbation(s) x %ld micro-batch(es)) run through each layer while it is on the device: the "
                 "weights cross once per step\n", asked, long(pairs), long(rc_.zo_perturbations),
                 long(rc_.gradient_accumulation_steps));
    return;
  }
  std::string why;
  if (rc_.modes.accumulation == AccumulationMode::automatic) {
    PlanInputs layer_major = plan_resolved_inputs(plan_in_, plan_);
    layer_major.accumulation = AccumulationMode::layer_major;
    const RunPlan p = placement_plan_at(spec, layer_major, pairs, budgets_, PlanChoice{});
    why = p.fits() ? " (\"auto\": the layer-major schedule is not faster here)"
                   : str_cat(" (\"auto\": the layer-major schedule's ", 2 * pairs, " branches' hidden states do not fit: ",
                             p.problems.front(), ")");
  }
  std::fprintf(stderr, "strata train: offload.accumulation = \"%s\": one dual forward at a time, the weights cross "
               "once per dual forward (%ld per step)%s\n", asked, long(pairs), why.c_str());
}

// Frees the engine, the store and the device (reverse order of set_up_model), before any weight
// is loaded into them.
void TrainRun::release_model() {
  reduction_ = nullptr;
  first_order_ = nullptr;
  engine_.reset();
  lora_.reset();
  store_.reset();
  device_comm_.reset();
  shared_memory_.reset();
  dev_.reset();
}

// What the store and the device allocated is what the plan counted.
void TrainRun::check_allocations_against_plan() {
  // the store's arrays in RAM (and, with the optimizer state on NVMe, the placement's window)
  size_t store_planned = 0;
  for (const PlanState& st : plan_.states)
    if (st.tier != Tier::nvme && st.tier != Tier::device &&
        (st.kind.rfind("working weights", 0) == 0 || st.kind == "fp32 gradient accumulation" ||
         st.kind.rfind("fp32 master weights", 0) == 0 || st.kind.rfind("AdamW moments", 0) == 0 ||
         st.kind.rfind("NVMe optimizer pipeline", 0) == 0 || st.kind.rfind("LoRA adapters", 0) == 0))
      store_planned += st.bytes;
  const size_t page_slack = shared_store_ ? 5 * 4096 : 0;  // the shared segment starts each array on a page
  STRATA_ASSERT(host_bytes_ >= store_planned && host_bytes_ <= store_planned + page_slack,
                "the placement plan and the host store disagree: the store holds ", host_bytes_, " bytes, the plan ",
                store_planned);
  // The CPU backend's arena holds the engine's buffers alone (the zeroth-order engine's rows when
  // optim.type = "zo-sgd": the plan reads that engine's table); the CUDA backend's also holds its
  // own error word, which the plan does not count, and, from the first step, the cuBLAS and
  // lm_head_ce workspaces, which it does (cuda_backend_workspace_bytes).
  const size_t device_checkpoints = engine_->device_checkpoints();
  const size_t kept_layers = engine_->kept_activation_layers();
  const size_t kept_chunks = engine_->kept_logit_chunks();
  // (GRPO's phases, plan_.grpo_phase_device_bytes, come later: its generator, its reference pass)
  if (plan_in_.device_in_host_ram)
    STRATA_ASSERT(dev_->used_bytes() == plan_.tier(Tier::device) - plan_.grpo_phase_device_bytes &&
                      device_checkpoints == plan_.device_checkpoints &&
                      kept_layers == plan_.kept_activation_layers && kept_chunks == plan_.kept_logit_chunks,
                  "the placement plan and the device disagree: the device holds ", dev_->used_bytes(), " bytes (plan ",
                  plan_.tier(Tier::device) - plan_.grpo_phase_device_bytes, "), ", device_checkpoints, " device checkpoints (plan ",
                  plan_.device_checkpoints, "), kept activations of ", kept_layers, " layers (plan ",
                  plan_.kept_activation_layers, "), kept logits of ", kept_chunks, " lm_head chunks (plan ",
                  plan_.kept_logit_chunks, ")");
  if (first_order_)
    STRATA_ASSERT(first_order_->speculation_backup_bytes() == plan_.bytes_of(kSpeculationBackupKind),
                  "the placement plan and the engine disagree on the speculation backup: ",
                  first_order_->speculation_backup_bytes(), " bytes, the plan ", plan_.bytes_of(kSpeculationBackupKind));
}

// offload.speculative_update, said at start when it was asked for or chosen.
void TrainRun::say_speculation() const {
  const char* asked = mode_name(plan_in_.speculate);
  const size_t first = plan_.speculate_first_group, end = plan_.speculate_end_group;
  if (end > first) {
    std::fprintf(stderr, "strata train: offload.speculative_update = \"%s\": %zu of %zu parameter groups (from the head "
                 "down) start AdamW as their gradients land, before the norm; backup %s\n", asked, end - first,
                 store_->groups().size(), format_bytes(plan_.bytes_of(kSpeculationBackupKind)).c_str());
  } else if (plan_in_.speculate == SpeculateMode::on) {
    std::fprintf(stderr, "strata train: offload.speculative_update = \"on\": no group speculated (it needs "
                 "optim.max_grad_norm > 0, AdamW without LoRA, one rank, the last group's state in RAM and host room "
                 "for a group's master and moments)\n");
  }
}

// The leaner host state, said at start: gradients consumed as they land, derived working weights.
void TrainRun::say_lean_state() const {
  if (plan_.grads_in_flight)
    std::fprintf(stderr, "strata train: each group's gradient is consumed as it lands (%s, one pass a step): "
                 "the fp32 gradient buffer holds the embedding's and one group's, %s\n",
                 plan_.norm_pass ? "offload.norm_pass: clipping's norm from a first pass, the updates in a second"
                                 : "no clipping",
                 format_bytes(plan_.bytes_of("fp32 gradient accumulation")).c_str());
  if (plan_.derived_working_layers == 0) return;
  const size_t saved = derived_working_bytes(HostStore::layout(store_->spec()), plan_.derived_working_layers);
  std::fprintf(stderr, "strata train: offload.working_weights = \"%s\": the bf16 working copy of %zu of %zu layers is "
               "made from the fp32 master at each upload (%s less pinned RAM, staging included)\n",
               mode_name(plan_in_.working), plan_.derived_working_layers, plan_.layers,
               format_bytes(saved - plan_.bytes_of(kDerivedStagingKind)).c_str());
}

// The training and eval data, tokenized, and their bytes in the plan's inputs.
void TrainRun::load_data() {
  data_loaded_ = true;
  if (rc_.objective == "grpo") {  // prompts, not rows (src/train/grpo_data.h)
    const TextEncoder enc = training_encoder(rc_, cfg_.vocab_size);
    grpo_data_ = grpo_prompts_read({rc_.data_path, rc_.sequence_len - rc_.grpo_max_completion_length - 1,
                                    rc_.modes.drop_overlong, rc_.skip_bad_lines}, enc);
    std::fprintf(stderr, "strata data: %s\n", grpo_data_.report.c_str());
    data_.tokenizer_dir = enc.dir();
    plan_in_.data_rows = grpo_data_.prompts.size();
    plan_in_.data_bytes = grpo_data_.bytes + plan_in_.data_rows * sizeof(int64_t);  // + the shuffled order
    return;
  }
  data_ = training_data_load(rc_, cfg_.vocab_size);
  size_t bytes = 0;
  for (const TokenRows* rows : {&data_.train, &data_.eval})
    bytes += 4 * (rows->ids.size() + rows->targets.size() + rows->pos.size() + rows->doc_start.size());
  for (const auto* side : {&data_.train_chosen, &data_.train_rejected, &data_.eval_chosen, &data_.eval_rejected})
    for (const Sample& sm : *side) bytes += sm.ids.size() * sizeof(int32_t) + sm.labels.size();  // preference pairs
  plan_in_.data_rows = size_t(data_.train.rows()) + data_.train_chosen.size();
  plan_in_.data_bytes = bytes + plan_in_.data_rows * sizeof(int64_t);  // + the shuffled order
}

// The plan with the tokenized rows and their order added, checked again, printed and stored
// as output_dir/plan.json.
void TrainRun::plan_with_data() {
  plan_ = placement_plan(store_->spec(), plan_in_, budgets_, plan_rates());
  if (plan_.group != built_group_) {
    // "auto" chose layer-major before the rows were counted, and they leave no room for its k
    // checkpoints per layer: nothing is loaded yet, so the model is set up again, the choice
    // made with the rows counted (micro_batch where it fits, else exit 3 naming what to change)
    std::fprintf(stderr, "strata train: the tokenized data (%s) leaves no room for the layer-major schedule's %ld "
                 "%s per layer within the budgets; setting up again\n", format_bytes(plan_in_.data_bytes).c_str(),
                 long(built_group_), plan_.optimizer_kind == OptimizerKind::zo_sgd ? "dual forwards" : "micro-batches");
    release_model();
    set_up_model();
  } else if (store_ && plan_.derived_working_layers != store_->derived_layers()) {
    // the rows changed whether the layers' working copy is derived (offload.working_weights)
    std::fprintf(stderr, "strata train: with the tokenized data (%s) counted, the plan %s the layers' working weights; "
                 "setting up again\n", format_bytes(plan_in_.data_bytes).c_str(),
                 plan_.derived_working_layers ? "derives" : "stores");
    release_model();
    set_up_model();
  }
  if (first_order_) {  // the rows may leave room for fewer speculated groups than the engine was built with
    first_order_->set_speculated_groups(plan_.speculate_first_group, plan_.speculate_end_group);
    STRATA_ASSERT(first_order_->speculation_backup_bytes() == plan_.bytes_of(kSpeculationBackupKind),
                  "the placement plan and the engine disagree on the speculation backup");
  }
  placement_plan_check(plan_);
  if (!dist_.primary()) return;  // every rank plans the same; rank 0 says it and writes it
  say_speculation();
  say_lean_state();
  std::fprintf(stderr, "strata train: placement plan\n%s", placement_plan_table(plan_).c_str());
  file_write_atomic(rc_.output_dir + "/plan.json", placement_plan_json(plan_).dump(1) + "\n");
}

void TrainRun::load_weights() {
  const auto t0 = Clock::now();
  if (shared_store_ && !dist_.node_leader()) {  // each node's first rank fills its node's store
  } else if (!rc_.model_path.empty()) {
    progress_.phase("loading model weights from " + rc_.model_path);
    model_load_weights(*store_, rc_.model_path);
    check_loaded_weights(*store_, rc_.model_path);
    if (lora_) {  // the adapters: continued from a PEFT dir, or PEFT's initialisation from the seed
      if (rc_.lora_adapter.empty()) lora_->init(uint64_t(rc_.seed));
      else lora_->load_peft(rc_.lora_adapter);
      first_order_->lora_upload();
      std::fprintf(stderr, "strata train: LoRA r %ld, alpha %g on %s: %.3fM adapter parameters%s%s\n", long(rc_.lora_r),
                   rc_.lora_alpha, lora_target_list(rc_.lora_target_modules, rc_.lora_target_parameters).c_str(),
                   double(lora_->layout().parameter_count()) / 1e6, rc_.lora_adapter.empty() ? "" : " from ",
                   rc_.lora_adapter.c_str());
    }
  } else {
    progress_.phase("initialising weights (seed " + std::to_string(rc_.model_init_seed) + ")");
    model_init_weights(*store_, uint64_t(rc_.model_init_seed), rc_.model_init_std);
  }
  if (shared_store_) dist_.barrier();
  const ModelSpec& ms = store_->spec();
  std::fprintf(stderr, "strata train: %s, %.2fM parameters (%s), weights %s, %zu of %zu layer "
               "checkpoints on the device, %zu layers' activations and %zu lm_head chunks' logits kept (no recompute); device %s of %s, host %s (%s pinned); weights ready in %.1fs\n",
               cfg_.family.c_str(), double(ms.parameter_count()) / 1e6, rc_.model_dtype.c_str(),
               plan_.weights == WeightsMode::device ? "resident"
               : plan_.resident_layers ? str_cat("stream (the first ", plan_.resident_layers, " layers resident)").c_str()
                                       : "stream",
               engine_->device_checkpoints(), ms.layers.size(),
               engine_->kept_activation_layers(), engine_->kept_logit_chunks(), format_bytes(dev_->used_bytes()).c_str(), format_bytes(dev_->budget_bytes()).c_str(),
               format_bytes(host_bytes_).c_str(), format_bytes(store_->pinned_bytes()).c_str(), seconds_since(t0));
}

// The data order and where the run continues: a fresh shuffle, or the checkpoint's state after
// every file of it was verified (checkpoint_load).
void TrainRun::resume() {
  // the unit of the data order: a packed row, or (preference objectives) a pair
  const int64_t units = preference_ ? preference_->train_pairs() : grpo_ ? grpo_->train_prompts() : data_.train.rows();
  const int64_t rows_per_step = rc_.micro_batch_size * rc_.gradient_accumulation_steps * zo_par_.groups;
  const int64_t units_per_step = grpo_ ? grpo_->prompts_per_step() : rows_per_step;
  max_steps_ = rc_.max_steps > 0 ? rc_.max_steps
      : std::max<int64_t>(1, int64_t(std::ceil(rc_.num_train_epochs * double(units) / double(units_per_step))));
  warmup_ = rc_.warmup_steps > 0 ? rc_.warmup_steps : int64_t(std::ceil(rc_.warmup_ratio * double(max_steps_)));
  state_.rows = units;
  state_.data_hash = preference_ ? preference_->data_hash() : grpo_ ? grpo_->data_hash() : rows_hash(data_.train);
  rng_.seed(uint64_t(rc_.seed));
  if (resume_dir_.empty()) {
    state_.order.resize(size_t(units));
    std::iota(state_.order.begin(), state_.order.end(), 0);
    std::shuffle(state_.order.begin(), state_.order.end(), rng_);
    if (dist_.primary()) run_dir_truncate_metrics(rc_.output_dir, 0);
    if (dist_.primary() && grpo_) grpo_completions_truncate(rc_.output_dir, 0);
  } else {
    progress_.phase("verifying and loading " + resume_dir_);
    TrainState saved =
        shared_store_ && !dist_.node_leader() ? TrainState{} : checkpoint_load(resume_dir_, *store_, lora_.get());
    if (lora_) first_order_->lora_upload();
    if (shared_store_) distributed_share_state(dist_, saved);  // the node leaders loaded the shared stores
    STRATA_CHECK(saved.rows == state_.rows && saved.data_hash == state_.data_hash, "cannot resume from ",
                 resume_dir_, ": its training data (", saved.rows, " rows) differs from this run's (", state_.rows,
                 " rows, or the same count with other tokens); resume needs the same data, tokenizer, "
                 "sequence_len and packing");
    // A run whose steps are all done resumes only to finish an export that did not (a full disk
    // or a kill while final/ was written): the last step always saves a checkpoint first.
    export_only_ = saved.step == max_steps_ && run_dir_final_step(rc_.output_dir) != saved.step;
    STRATA_CHECK(saved.step < max_steps_ || export_only_, "cannot resume from ", resume_dir_, ": it is at step ",
                 saved.step, " and the run ends at step ", max_steps_,
                 saved.step == max_steps_ ? str_cat("; the run is complete (its model is in ", rc_.output_dir,
                                                    "/final)") : std::string(),
                 "; raise train.max_steps to train further");
    std::istringstream rs(saved.rng);
    rs >> rng_;
    STRATA_CHECK(!rs.fail(), resume_dir_, "/trainer_state.json: the RNG state is damaged");
    const std::string saved_recipe = file_read(resume_dir_ + "/recipe.toml", "checkpoint file",
                                               "resume from an older checkpoint (--resume DIR)");
    run_dir_warn_recipe_changes(saved_recipe, recipe_toml_, saved.global_batch > 0);
    warn_batch_change(saved, rows_per_step);
    state_ = std::move(saved);
    if (export_only_)
      std::fprintf(stderr, "strata train: the run's %ld steps are done but its export to %s/final did not finish; "
                   "finishing it now (the model of step %ld is also in %s/%s)\n", long(max_steps_),
                   rc_.output_dir.c_str(), long(state_.step), resume_dir_.c_str(), lora_ ? "adapter" : "hf");
    if (dist_.primary()) run_dir_truncate_metrics(rc_.output_dir, state_.step);
    if (dist_.primary() && grpo_) grpo_completions_truncate(rc_.output_dir, state_.step);
    std::fprintf(stderr, "strata train: resumed from %s at step %ld of %ld\n", resume_dir_.c_str(),
                 long(state_.step), long(max_steps_));
  }
  state_.max_steps = max_steps_;
  state_.ranks = dist_.size();
  state_.global_batch = rows_per_step;
  state_.micro_batch = rc_.micro_batch_size;
  state_.accumulation = rc_.gradient_accumulation_steps;
  first_step_ = state_.step + 1;
  if (dist_.primary()) metrics_ = std::make_unique<MetricsWriter>(rc_.output_dir + "/metrics.jsonl", /*append=*/true);
  progress_.set_total(max_steps_);
  progress_.set_save_plan(rc_.save_steps);
  train_signal_phase_setup(false);  // from here a signal stops after the current step
}

// What decides whether a resumed run continues the saved one is the global batch (rows per
// optimizer step, in the same order), not how it is split over micro-batches, accumulation and
// ranks: 2 ranks x accumulation 1 continue bit-identically as 1 rank x accumulation 2.
void TrainRun::warn_batch_change(const TrainState& saved, int64_t rows_per_step) const {
  if (saved.global_batch <= 0) return;  // an older checkpoint: the recipe keys were compared
  const std::string was = str_cat(saved.global_batch, " rows per step (micro_batch_size ", saved.micro_batch,
                                  " x gradient_accumulation_steps ", saved.accumulation, " x ", saved.ranks, " rank",
                                  saved.ranks == 1 ? "" : "s", ")");
  const std::string now = str_cat(rows_per_step, " (", rc_.micro_batch_size, " x ", rc_.gradient_accumulation_steps,
                                  " x ", dist_.size(), " rank", dist_.size() == 1 ? "" : "s", ")");
  if (saved.global_batch != rows_per_step) {
    const int64_t per = rc_.micro_batch_size * zo_par_.groups;
    std::fprintf(stderr, "strata train: warning: the checkpoint's global batch was %s and this run's is %s; the resumed "
                 "run is not the run it continues%s\n", was.c_str(), now.c_str(),
                 saved.global_batch % per == 0 ? str_cat(" (train.gradient_accumulation_steps = ", saved.global_batch / per,
                                                         " continues it exactly)").c_str() : "");
  } else if (saved.micro_batch != rc_.micro_batch_size || saved.accumulation != rc_.gradient_accumulation_steps ||
             saved.ranks != dist_.size()) {
    std::fprintf(stderr, "strata train: the checkpoint's global batch was %s; this run deals the same rows as %s: the "
                 "run continues as it was (the same rows, in the same order)\n", was.c_str(), now.c_str());
  }
}

// The micro-batches of the next step, taken in the shuffled order (reshuffled each epoch). Data
// parallel: the step has gradient_accumulation_steps x G micro-batches in that order (G data
// groups: N ranks first order, distributed.zo's groups for zo-sgd); this rank keeps micro-batches
// group, group + G, ... and counts the labelled tokens of all of them.
StepBatch TrainRun::next_batch() {
  StepBatch batch;
  if (grpo_) {  // the step's prompts, in the shuffled order: the same on every rank, which runs its share
    for (int64_t p = 0; p < grpo_->prompts_per_step(); ++p) {
      if (state_.cursor + 1 > state_.order.size()) {
        std::shuffle(state_.order.begin(), state_.order.end(), rng_);
        state_.cursor = 0;
        ++state_.epoch;
      }
      batch.prompts.push_back(state_.order[state_.cursor++]);
    }
    return batch;
  }
  for (int64_t a = 0; a < rc_.gradient_accumulation_steps * zo_par_.groups; ++a) {
    if (state_.cursor + uint64_t(rc_.micro_batch_size) > state_.order.size()) {
      std::shuffle(state_.order.begin(), state_.order.end(), rng_);
      state_.cursor = 0;
      ++state_.epoch;
    }
    if (preference_) {  // one rank (set_up refuses preference objectives with several)
      batch.pairs.emplace_back(state_.order.begin() + long(state_.cursor),
                               state_.order.begin() + long(state_.cursor) + rc_.micro_batch_size);
    } else {
      MicroBatch mb = take_rows(data_.train, state_.order, state_.cursor, rc_.micro_batch_size);
      batch.counted += mb.counted();
      if (a % zo_par_.groups == zo_par_.group) batch.micro.push_back(std::move(mb));
    }
    state_.cursor += uint64_t(rc_.micro_batch_size);
  }
  STRATA_CHECK(preference_ || batch.counted > 0, "step ", state_.step + 1, " has no labelled tokens");
  return batch;
}

// Forward, backward and the optimizer over one batch.
StepResult TrainRun::step(const StepBatch& batch) {
  StepResult r;
  r.step = state_.step + 1;
  const auto t0 = Clock::now();
  r.c0 = dev_->counters();
  r.e0 = engine_stats();
  AdamWParams ap;
  ap.lr = rc_.learning_rate * lr_schedule(rc_.modes.lr_schedule, r.step - 1, max_steps_, warmup_, rc_.min_lr_ratio);
  ap.beta1 = rc_.adam_beta1;
  ap.beta2 = rc_.adam_beta2;
  ap.eps = rc_.adam_epsilon;
  ap.step = r.step;
  const bool diagnose = reduction_ && rc_.distributed_diagnostics_steps > 0 &&
                        r.step % rc_.distributed_diagnostics_steps == 0;
  if (reduction_) r.g0 = reduction_->stats();
  if (diagnose) reduction_->diagnostics_begin();
  std::vector<double> losses;  // this rank's micro-batches, summed below in the global order
  if (lora_) first_order_->lora_dropout_begin_step(r.step, zo_par_.group, zo_par_.groups);  // its masks' keys
  bool global = false;  // zo-sgd's loss is already the whole step's on every rank (it exchanged the scalars)
  if (preference_) {  // the head normalises by the step's pairs: the sum is the step's loss
    const PreferenceStepOutcome o = preference_->step(batch.pairs, ap, rc_.max_grad_norm, rc_.weight_decay, &r.grad_norm);
    losses.push_back(o.loss);
    r.counted = o.chosen_tokens + o.rejected_tokens;
    r.preference = preference_metrics_json(o.metrics, "");
  } else if (grpo_) {  // generate, score, then num_iterations updates (src/train/grpo_trainer.h)
    GrpoTrainerOutcome o = grpo_->step(batch.prompts, r.step, ap, rc_.max_grad_norm, rc_.weight_decay, dist_.primary());
    losses = std::move(o.losses);  // this rank's micro-batches: summed below in the global order
    r.grad_norm = o.grad_norm;
    r.counted = o.completion_tokens;
    r.extra = std::move(o.metrics);
  } else {  // the engine's step: first order (one at a time, or layer-major), or the perturbed passes
    StepWork w;
    w.micro = &batch.micro;
    w.counted = batch.counted;
    w.step = r.step;
    w.hyper = ap;
    w.max_grad_norm = rc_.max_grad_norm;
    w.weight_decay = rc_.weight_decay;
    w.gradients_first = rc_.max_grad_norm > 0 || shared_store_;  // clipping (or a shared store) needs every gradient first
    w.norm_pass = plan_.norm_pass;  // ... or a first pass for the norm alone (offload.norm_pass)
    if (w.norm_pass) w.gradients_first = false;
    StepOutcome o = engine_->train_step(w);
    losses = std::move(o.losses);
    global = o.global;
    r.grad_norm = o.grad_norm;
    if (!o.extra.empty()) r.extra = std::move(o.extra);
    if (global && dist_.data_parallel()) r.extra.update({{"ranks", dist_.size()}, {"comm_bytes", o.comm_bytes}});  // scalars alone
  }
  const double loss_sum = global ? losses.front() : dist_.sum_in_global_order(losses);
  if (reduction_) r.g1 = reduction_->stats();
  if (diagnose) {
    int64_t mine = 0;
    for (auto& mb : batch.micro) mine += mb.counted();
    r.workers = distributed_worker_diagnostics(dist_, std::accumulate(losses.begin(), losses.end(), 0.0), mine,
                                               reduction_->diagnostics_end());
  }
  if (r.step == max_steps_) engine_synchronize();
  r.e1 = engine_stats();
  r.c1 = dev_->counters();
  r.run_s = seconds_since(t0);
  r.loss = preference_ || grpo_ ? loss_sum : loss_sum / double(batch.counted);
  if (!preference_ && !grpo_) r.counted = batch.counted;
  r.lr = ap.lr;
  state_.step = r.step;
  state_.tokens_seen += double(tokens_per_step());
  return r;
}

void TrainRun::evaluate_if_due(int64_t step, bool stopping) {
  const bool last = step == max_steps_;
  if (last || (rc_.eval_steps > 0 && step % rc_.eval_steps == 0 && !stopping)) evaluate(step);
}

void TrainRun::evaluate(int64_t step) {
  if (preference_) {
    if (preference_->eval_pairs() == 0) return;
    const auto t0 = Clock::now();
    progress_.phase("eval");
    nlohmann::json rec = preference_->evaluate();
    progress_.phase("");
    rec["step"] = step;
    rec["eval_s"] = seconds_since(t0);
    metrics_->write(rec);
    progress_.message(str_cat("step ", step, "/", max_steps_, "  eval_loss ", rec["eval_loss"].get<double>(),
                              "  eval margin ", rec["eval_rewards/margins"].get<double>(), "  eval accuracy ",
                              rec["eval_rewards/accuracies"].get<double>(), " over ", rec["eval_pairs"].get<int64_t>(),
                              " pairs"));
    return;
  }
  if (data_.eval.rows() == 0) return;
  const auto t0 = Clock::now();
  progress_.phase("eval");
  int64_t counted = 0;
  std::vector<int64_t> seq(size_t(data_.eval.rows()));
  std::iota(seq.begin(), seq.end(), 0);
  std::vector<double> losses;  // per micro-batch; data parallel: rank r runs micro-batches r, r + N, ...
  for (size_t first = 0; first < seq.size(); first += size_t(rc_.micro_batch_size)) {
    int64_t n = std::min<int64_t>(rc_.micro_batch_size, int64_t(seq.size() - first));
    MicroBatch mb = take_rows(data_.eval, seq, first, n);
    counted += mb.counted();
    losses.push_back(int64_t(losses.size()) % dist_.size() == dist_.rank()
                         ? engine_->forward_loss(mb)
                         : 0.0);
  }
  dist_.all_reduce_sum(losses);  // each entry has one rank's value: x + 0 is exact
  const double loss_sum = std::accumulate(losses.begin(), losses.end(), 0.0);
  progress_.phase("");
  const double eval_loss = counted ? loss_sum / double(counted) : 0.0;
  if (metrics_) metrics_->write({{"step", step}, {"eval_loss", eval_loss}, {"eval_tokens", counted}, {"eval_s", seconds_since(t0)}});
  progress_.message(str_cat("step ", step, "/", max_steps_, "  eval_loss ", eval_loss, " over ", counted, " tokens"));
}

bool TrainRun::save_due(int64_t step, bool stopping) const {
  return step == max_steps_ || stopping || (rc_.save_steps > 0 && step % rc_.save_steps == 0);
}

double TrainRun::save() {
  const auto t0 = Clock::now();
  progress_.phase(str_cat("saving checkpoint-", state_.step));
  engine_synchronize();
  std::ostringstream rs;
  rs << rng_;
  state_.rng = rs.str();
  if (!dist_.primary()) return seconds_since(t0);  // every rank holds the same state; rank 0 writes it
  summary_.last_checkpoint = checkpoint_save(rc_.output_dir, *store_, state_, recipe_toml_,
                                             dtype_parse(rc_.save_dtype), files_, rc_.keep_last, lora_.get());
  const double s = seconds_since(t0);
  progress_.saved(s);
  progress_.phase("");
  progress_.message("strata train: saved " + summary_.last_checkpoint);
  return s;
}

nlohmann::json TrainRun::op_seconds(const DeviceCounters& c0, const DeviceCounters& c1) const {
  nlohmann::json ops = nlohmann::json::object();
  for (int k = 0; k < int(OpKind::count); ++k) ops[op_kind_name(OpKind(k))] = c1.op_s[k] - c0.op_s[k];
  return ops;
}

// MFU of a step: model FLOPs per second over the device's peak for the run's dtype.
double TrainRun::step_mfu(const StepResult& r) {
  const double tps = double(tokens_per_step()) / r.run_s;
  double mfu = tps * flops_per_token_ / peak_.flops_per_s;
  if (mfu > 1) {  // a measured peak taken while the machine was busy: say so, keep MFU a fraction
    if (!mfu_capped_)
      progress_.message(str_cat("strata train: warning: step ", r.step, " ran at ", mfu, " times the peak (",
                                peak_.source, "); the peak was measured low, likely while the machine was busy. "
                                "MFU is shown as at most 100%"));
    mfu_capped_ = true;
    mfu = 1;
  }
  return mfu;
}

void TrainRun::show(const StepResult& r) {
  const double tps = double(tokens_per_step()) / r.run_s;
  StepReport report{r.step, max_steps_, r.loss, r.lr, r.grad_norm, tps, step_mfu(r), r.run_s, dev_->peak_bytes(),
                    store_->pinned_bytes(), host_bytes_, NAN, {}};
  if (!r.preference.is_null())
    report.extra = str_cat("margin ", r.preference["rewards/margins"].get<double>(), " acc ",
                           r.preference["rewards/accuracies"].get<double>());
  if (grpo_) {  // the step's mean reward and its time sampling
    char text[64];
    std::snprintf(text, sizeof text, "reward %.3f  gen %.2fs", r.extra["reward"].get<double>(),
                  r.extra["generation_s"].get<double>());
    report.extra = text;
  }
  progress_.step(report);
}

// metrics.jsonl. Every time is what its name says (recipes/README.md):
// compute_s + h2d_wait_s + d2h_wait_s + optimizer_exposed_s + save_s is about step_s.
void TrainRun::record(const StepResult& r) {
  const int64_t tokens = tokens_per_step();
  const double step_s = r.run_s + r.save_s;
  const double tps = double(tokens) / r.run_s;
  const double mfu = step_mfu(r);
  summary_.losses.push_back(r.loss);
  if (r.step > first_step_) {
    tokens_after_first_ += double(tokens);
    time_after_first_ += r.run_s;
  } else {
    after_first_ = r.c1;
  }
  const EngineStats &e0 = r.e0, &e1 = r.e1;
  nlohmann::json rec = {
      {"step", r.step}, {"loss", r.loss}, {"lr", r.lr}, {"grad_norm", r.grad_norm}, {"tokens", tokens},
      {"loss_tokens", r.counted}, {"tokens_per_s", tps}, {"mfu", mfu}, {"step_s", step_s}, {"compute_s", e1.compute_s - e0.compute_s},
      {"h2d_wait_s", e1.h2d_wait_s - e0.h2d_wait_s}, {"d2h_wait_s", e1.d2h_wait_s - e0.d2h_wait_s},
      {"optimizer_s", e1.optimizer_s - e0.optimizer_s},
      {"optimizer_exposed_s", e1.optimizer_exposed_s - e0.optimizer_exposed_s}, {"save_s", r.save_s},
      {"nvme_read_bytes", e1.nvme_read_bytes - e0.nvme_read_bytes},
      {"nvme_write_bytes", e1.nvme_write_bytes - e0.nvme_write_bytes}, {"nvme_wait_s", e1.nvme_wait_s - e0.nvme_wait_s},
      {"nvme_busy_s", e1.nvme_busy_s - e0.nvme_busy_s},
      {"device_peak_bytes", dev_->peak_bytes()}, {"host_pinned_bytes", store_->pinned_bytes() + (first_order_ ? first_order_->pinned_bytes() : 0)},
      {"host_bytes", host_bytes_}, {"host_rss_peak_bytes", process_rss_peak_bytes()},
      {"link_bytes", e1.link_bytes - e0.link_bytes},
      {"link_busy_s", (r.c1.h2d_busy_s - r.c0.h2d_busy_s) + (r.c1.d2h_busy_s - r.c0.d2h_busy_s)}};
  rec["op_s"] = op_seconds(r.c0, r.c1);
  if (plan_.speculate_end_group > plan_.speculate_first_group) {  // offload.speculative_update
    rec["speculated_groups"] = e1.speculated_updates - e0.speculated_updates;
    rec["speculation_redone"] = e1.speculation_redos - e0.speculation_redos;
  }
  if (!r.preference.is_null()) rec.update(r.preference);
  rec.update(r.extra);
  if (reduction_) {  // recipes/README.md: comm_bytes, comm_s, comm_hidden_s
    rec["ranks"] = dist_.size();
    rec["comm_bytes"] = r.g1.reduced_bytes - r.g0.reduced_bytes;
    rec["comm_s"] = r.g1.comm_s - r.g0.comm_s;
    rec["comm_hidden_s"] = r.g1.hidden_s - r.g0.hidden_s;
  }
  if (!r.workers.is_null()) rec["workers"] = r.workers;
  check_step_model(r, rec);
  if (metrics_) metrics_->write(rec);
}

// Past this ratio either way, the calibration line on the CPU backend says how to price the plan
// at the run's own rates.
constexpr double kStepModelBand = 1.25;

// The step model against this run (src/train/step_calibration.h), on rank 0 at the run's third step
// (the first two warm caches and pages) and its tenth: the stderr line and rec["step_model"].
void TrainRun::check_step_model(const StepResult& r, nlohmann::json& rec) {
  if (!metrics_ || (r.step != first_step_ + 2 && r.step != first_step_ + 9)) return;
  const StepRates rates =
      step_calibration_rates(peak_, cpu_rates_.layer, plan_in_.device_in_host_ram, rc_.device_link_bytes_per_s);
  if (grpo_) {
    check_grpo_phases(r, rates, rec);
    return;
  }
  PlanInputs in = plan_in_;
  in.weights = plan_.weights;  // as the plan resolved offload.weights = "auto"
  const StepEstimate e = step_estimate(store_->spec(), in, plan_, rc_.gradient_accumulation_steps, rates,
                                       rc_.zo_perturbations);
  StepPhases m;
  m.step = r.step;
  m.step_s = r.run_s;
  m.compute_s = r.e1.compute_s - r.e0.compute_s;
  m.link_s = std::max(r.c1.h2d_busy_s - r.c0.h2d_busy_s, r.c1.d2h_busy_s - r.c0.d2h_busy_s);
  m.nvme_s = r.e1.nvme_busy_s - r.e0.nvme_busy_s;
  m.optimizer_s = r.e1.optimizer_s - r.e0.optimizer_s;
  rec["step_model"] = step_calibration(e, rates, m);
  std::string line = "strata train: " + step_calibration_line(rec["step_model"]);
  const double ratio = rec["step_model"]["ratio"].get<double>();
  if (plan_in_.device_in_host_ram && (ratio > kStepModelBand || ratio < 1 / kStepModelBand))
    line += str_cat("; the run prices its plan at ", cpu_rates_.layer.measured() ? "one layer's rates probed before it "
                    "started" : "the square-GEMM peak for every op", " and stated defaults: `strata estimate RECIPE "
                    "--rates-from ", rc_.output_dir, "` prices it at this run's own rates");
  progress_.message(line);
}

// GRPO: the step's sampling and reference pass against offload/plan/grpo_estimate.h's model, at this
// run's rates, its longest prompt and the device memory the engine leaves (where the generator is
// built). The model's sampling is every completion running to max_completion_length, so a run whose
// completions stop early measures less. The training passes are not compared: the device's copy
// counters mix the generator's and the reference pass's transfers with the engine's, and
// training_s holds the rewards and num_iterations updates.
void TrainRun::check_grpo_phases(const StepResult& r, const StepRates& rates, nlohmann::json& rec) {
  const int64_t longest = grpo_->longest_prompt();
  const int64_t ref_tokens = std::min(rc_.sequence_len, longest + rc_.grpo_max_completion_length + 1);
  const size_t left = dev_->budget_bytes() > dev_->used_bytes() ? dev_->budget_bytes() - dev_->used_bytes() : 0;
  const GrpoPhaseEstimate g = grpo_phase_estimate(
      store_->spec(), recipe_grpo_phase_shape(rc_, plan_in_.device_in_host_ram, longest, ref_tokens), left, rates);
  const double gen = r.extra.value("generation_s", 0.0), ref = r.extra.value("reference_s", 0.0);
  nlohmann::json sm = {{"step", r.step},
                       {"sampling", {{"measured_s", gen}, {"estimated_s", g.sampling_s},
                                     {"ratio", g.sampling_s > 0 ? gen / g.sampling_s : 0.0},
                                     {"mean_length", r.extra.value("completions/mean_length", 0.0)},
                                     {"max_completion_length", rc_.grpo_max_completion_length}}}};
  std::string line = str_cat("strata train: GRPO step model at step ", r.step, ": sampling measured ", gen,
                             " s, estimated ", g.sampling_s, " s for completions of max_completion_length (x",
                             g.sampling_s > 0 ? gen / g.sampling_s : 0.0, "; mean length ",
                             r.extra.value("completions/mean_length", 0.0), " of ", rc_.grpo_max_completion_length, ")");
  if (rc_.grpo_beta != 0) {
    sm["reference"] = {{"measured_s", ref}, {"estimated_s", g.reference_s},
                       {"ratio", g.reference_s > 0 ? ref / g.reference_s : 0.0}};
    line += str_cat("; reference pass measured ", ref, " s, estimated ", g.reference_s, " s");
  }
  rec["step_model"] = sm;
  progress_.message(line);
}

TrainSummary TrainRun::interrupted(int64_t step) {
  engine_synchronize();
  summary_.interrupted = true;
  progress_.finish();
  std::fprintf(stderr, "strata train: interrupted %s; resume with: %s\n",
               step > 0 ? str_cat("at step ", step).c_str() : "before the first step (nothing saved)",
               run_dir_resume_command(rc_.source_path, topt_.overrides).c_str());
  return summary_;
}

// The run's speed and per-op split (by op name), then the Hugging Face export.
TrainSummary TrainRun::finish() {
  summary_.tokens_per_s = time_after_first_ > 0 ? tokens_after_first_ / time_after_first_ : 0;
  const nlohmann::json ops = op_seconds(after_first_, dev_->counters());
  double total = 0;
  for (auto& [name, s] : ops.items()) total += s.get<double>();
  summary_.matmul_share = total > 0 ? ops[op_kind_name(OpKind::matmul)].get<double>() / total : 0;
  std::string split;
  for (auto& [name, s] : ops.items())
    split += str_cat(split.empty() ? "" : ", ", name, " ", int(std::lround(100 * s.get<double>() / std::max(total, 1e-12))), "%");
  summary_.final_dir = rc_.output_dir + "/final";
  engine_synchronize();
  if (!dist_.primary()) return summary_;  // rank 0 exports
  const auto t0 = Clock::now();
  progress_.phase("exporting the model to " + summary_.final_dir);
  try {
    // STRATA_FAULT=kill@export: killed before final/ is written; enospc@export: a full disk there
    STRATA_CHECK_IO(fault_point("export") != FaultKind::io, "cannot write ", summary_.final_dir,
                    ": No space left on device (injected by STRATA_FAULT)");
    if (lora_) {  // the PEFT adapter dir, and with lora.merge the merged model beside it
      lora_export(*lora_, *store_, summary_.final_dir, rc_.lora_merge, dtype_parse(rc_.save_dtype), files_);
    } else {
      export_hf_atomic(*store_, summary_.final_dir, dtype_parse(rc_.save_dtype), files_);
    }
  } catch (const Error& e) {  // the last step's checkpoint holds the model: say where, and how to finish
    throw Error(e.kind(), str_cat(e.what(), "\nThe model of step ", state_.step, " is saved in ", summary_.last_checkpoint.empty()
                                  ? str_cat(rc_.output_dir, "/checkpoint-", state_.step) : summary_.last_checkpoint,
                                  lora_ ? "/adapter" : "/hf", "; once the cause is fixed, finish the export with: ",
                                  run_dir_resume_command(rc_.source_path, topt_.overrides)));
  }
  run_dir_mark_final(rc_.output_dir, state_.step);
  progress_.saved(seconds_since(t0));
  progress_.phase("");
  progress_.finish();
  if (max_steps_ > first_step_)
    std::fprintf(stderr, "strata train: %.0f tokens/s after the first step; device op time: %s\n",
                 summary_.tokens_per_s, split.c_str());
  std::fprintf(stderr, "strata train: host memory peak %s (resident set high-water mark); the plan's host total %s\n",
               format_bytes(process_rss_peak_bytes()).c_str(), format_bytes(plan_.host_total()).c_str());
  std::fprintf(stderr, "strata train: done; model written to %s, metrics to %s/metrics.jsonl\n",
               summary_.final_dir.c_str(), rc_.output_dir.c_str());
  return summary_;
}

}  // namespace

}  // namespace strata
