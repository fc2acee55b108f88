#include "offload/plan/plan_search.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>

#include <thread>

#include "io/uring_file.h"
#include "offload/state/host_store.h"
#include "src/core/error.h"
#include "src/core/threads.h"
#include "src/device/device.h"

namespace strata {

StepRates plan_default_rates(const PlanInputs& in) {
  StepRates r;
  r.checksum_threads = file_engine_checksum_threads();  // the file engine's own count here
  if (in.device_in_host_ram) {
    r.device_flops_per_s = 2e11;
    r.link_bytes_per_s = r.host_bytes_per_s;
  } else {
    r.device_flops_per_s = 400e12;
    r.link_bytes_per_s = 25e9;
  }
  return r;
}

StepRates plan_run_rates(const PlanInputs& in, double cpu_peak_flops_per_s, const LayerRates& probe,
                         double link_bytes_per_s) {
  StepRates r = plan_default_rates(in);
  if (in.device_in_host_ram) {
    r.device_flops_per_s = r.mfu_peak_flops_per_s = cpu_peak_flops_per_s;
    if (probe.measured()) {
      r.device_flops_per_s = probe.matmul_flops_per_s;
      r.attention_flops_per_s = probe.attention_flops_per_s;
      r.elementwise_bytes_per_s = probe.elementwise_bytes_per_s;
      r.head_flops_per_s = probe.head_flops_per_s;
    }
  }
  if (link_bytes_per_s > 0) r.link_bytes_per_s = link_bytes_per_s;
  return r;
}

PlanInputs plan_resolved_inputs(const PlanInputs& in, const RunPlan& p) {
  PlanInputs v = in;
  v.micro_batch = p.micro_batch;
  v.accumulation_steps = p.accumulation_steps;
  v.weights = p.weights;
  v.resident_layers = int64_t(p.resident_layers);
  v.accumulation = p.group > 1 ? AccumulationMode::layer_major : AccumulationMode::micro_batch;
  if (p.nvme_checkpoints > 0) v.checkpoints = CheckpointMode::nvme;
  return v;
}

namespace {

// `plan`'s step at `rates`, its inputs resolved as it chose them (layout: the store's, when built).
StepEstimate estimate_at(const ModelSpec& spec, const PlanInputs& in, const RunPlan& plan, const StepRates& rates,
                         const HostStoreLayout* layout = nullptr) {
  return step_estimate(spec, plan_resolved_inputs(in, plan), plan, plan.accumulation_steps, rates, in.zo_perturbations,
                       layout);
}

// Bytes over the budgets, summed over the tiers (0: it fits).
size_t overflow(const RunPlan& p) {
  const PlanBudgets& b = p.budgets;
  auto over = [](size_t have, size_t budget) { return budget && have > budget ? have - budget : 0; };
  return over(p.tier(Tier::device), b.device_bytes) + over(p.host_total(), b.host_bytes) +
         over(p.tier(Tier::nvme), b.nvme_bytes);
}

bool host_over(const RunPlan& p) { return p.budgets.host_bytes && p.host_total() > p.budgets.host_bytes; }
bool device_over(const RunPlan& p) { return p.budgets.device_bytes && p.tier(Tier::device) > p.budgets.device_bytes; }
bool nvme_over(const RunPlan& p) { return p.budgets.nvme_bytes && p.tier(Tier::nvme) > p.budgets.nvme_bytes; }

// A priced candidate.
struct Priced {
  RunPlan plan;
  double seconds = 0, moved = 0;  // the step; its link + NVMe bytes
};

// a before b: fitting first, then faster, then fewer bytes moved; of two that do not fit, the
// one less over its budgets
bool better(const Priced& a, const Priced& b) {
  if (a.plan.fits() != b.plan.fits()) return a.plan.fits();
  if (!a.plan.fits()) {
    const size_t oa = overflow(a.plan), ob = overflow(b.plan);
    if (oa != ob) return oa < ob;
  }
  const double tol = 1e-6 * std::max(a.seconds, b.seconds);
  if (std::abs(a.seconds - b.seconds) > tol) return a.seconds < b.seconds;
  return a.moved < b.moved;
}

struct Search {
  const ModelSpec& spec;
  const PlanInputs& in;
  const PlanBudgets& budgets;
  StepRates rates;
  size_t groups = 0;  // parameter groups of the store (embed, layers, head)
  HostStoreLayout layout;  // the store's groups (HostStore::layout)
  bool have_best = false;
  Priced best;
  double last_link_share = 0;  // the last candidate considered: its link time over its step

  void consider(const PlanInputs& v, RunPlan plan) {
    Priced c{std::move(plan)};
    const StepEstimate e = estimate_at(spec, v, c.plan, rates, &layout);
    c.seconds = e.seconds;
    c.moved = e.bytes.link() + e.bytes.nvme_read() + e.bytes.nvme_write();
    c.plan.step_seconds = e.seconds;
    last_link_share = e.seconds > 0 ? e.components.at("link") / e.seconds : 0;
    if (!have_best || better(c, best)) best = std::move(c), have_best = true;
  }

  // The optimizer state's tier for one candidate: RAM when it fits (or when NVMe cannot help),
  // else the fewest groups on NVMe that make the host fit (all of them when none does).
  RunPlan with_optimizer(const PlanInputs& v, int64_t group, bool ckpt_nvme, bool derive, bool norm_pass) {
    PlanChoice c;
    c.checkpoints_nvme = ckpt_nvme;
    c.derive_working = derive;
    c.norm_pass = norm_pass;
    if (v.optimizer == StateTier::nvme) {
      c.optimizer_nvme = true;
      return placement_plan_at(spec, v, group, budgets, c, &layout);
    }
    RunPlan ram = placement_plan_at(spec, v, group, budgets, c, &layout);
    const bool may_split = v.optimizer == StateTier::automatic && !budgets.nvme_dir.empty() &&
                           optimizer_state_needs(v.optimizer_kind).moments && !v.lora.enabled();
    if (!may_split || !host_over(ram)) return ram;
    c.optimizer_nvme = true;
    c.optimizer_first_group = 0;
    RunPlan all = placement_plan_at(spec, v, group, budgets, c, &layout);
    if (host_over(all)) return all.host_total() < ram.host_total() ? all : ram;
    size_t lo = 0, hi = groups;  // fits with groups lo.. on NVMe; RAM (hi) does not
    while (hi - lo > 1) {
      c.optimizer_first_group = lo + (hi - lo) / 2;
      (host_over(placement_plan_at(spec, v, group, budgets, c, &layout)) ? hi : lo) = c.optimizer_first_group;
    }
    c.optimizer_first_group = lo;
    return lo == 0 ? all : placement_plan_at(spec, v, group, budgets, c, &layout);
  }

  // The candidate with its updates speculated (offload.speculative_update): groups [first, end)
  // from the head down, at most as many as the host budget leaves room to back up; "on" takes
  // them all, "auto" the count the step model prices fastest (the updates that fill the last
  // backward: more only add their copies to the host's work). None where speculation does not
  // apply (no clipping, LoRA, ZO, several ranks), where the last group's state is on NVMe, or,
  // for "auto", on the CPU backend (the update and the backward share the same cores).
  std::optional<RunPlan> with_speculation(const PlanInputs& v, int64_t group, bool ckpt_nvme, const RunPlan& p) {
    if (v.speculate == SpeculateMode::off || !v.clip_grad || p.norm_pass || v.optimizer_kind != OptimizerKind::adamw ||
        v.lora.enabled() || v.ranks != 1 || !p.fits())
      return std::nullopt;
    if (v.speculate == SpeculateMode::automatic && v.device_in_host_ram) return std::nullopt;
    const size_t end = p.optimizer_on_nvme ? p.optimizer_nvme_first_group : groups;
    const size_t room = !budgets.host_bytes ? SIZE_MAX : budgets.host_bytes - std::min(budgets.host_bytes, p.host_total());
    size_t first = end, bytes = 0;
    while (first > 1) {
      const size_t b = speculation_backup_bytes(layout, v.moments, first - 1, first);
      if (b > room - bytes) break;
      bytes += b;
      --first;
    }
    if (first >= end) return std::nullopt;
    if (v.speculate == SpeculateMode::automatic) first = fastest_speculation(v, p, first, end);
    PlanChoice c;
    c.checkpoints_nvme = ckpt_nvme;
    c.optimizer_nvme = p.optimizer_on_nvme;
    c.optimizer_first_group = p.optimizer_nvme_first_group;
    c.derive_working = p.derived_working;
    c.speculate_first_group = first;
    c.speculate_end_group = end;
    RunPlan s = placement_plan_at(spec, v, group, budgets, c, &layout);
    if (!s.fits()) return std::nullopt;
    return s;
  }

  // The first speculated group in [lo, end) that the step model prices fastest (the step reads
  // only the range from the plan): a scan at a stride, then every first around the best.
  size_t fastest_speculation(const PlanInputs& v, const RunPlan& p, size_t lo, size_t end) {
    RunPlan trial = p;
    trial.speculate_end_group = end;
    const PlanInputs resolved = plan_resolved_inputs(v, p);
    auto seconds = [&](size_t first) {
      trial.speculate_first_group = first;
      return step_estimate(spec, resolved, trial, v.accumulation_steps, rates, in.zo_perturbations, &layout).seconds;
    };
    const size_t stride = std::max<size_t>(1, (end - lo) / 16);
    size_t best = end - 1;
    double best_s = seconds(best);
    auto visit = [&](size_t first) {
      const double t = seconds(first);
      if (t < best_s * (1 - 1e-9)) best = first, best_s = t;
    };
    for (size_t f = lo; f + 1 < end; f += stride) visit(f);
    const size_t from = best > lo + stride ? best - stride : lo, to = std::min(end - 1, best + stride);
    for (size_t f = from; f < to; ++f) visit(f);
    return best;
  }

  // The weights' candidates at `group` micro-batches a pass: every layer resident, or streamed with
  // the first n resident (offload.resident_layers; "auto": none, as many as the device has room
  // for beside the engine's other rows, and half as many: what room the checkpoints and kept
  // activations would have instead is the step model's to weigh).
  struct Weights {
    WeightsMode mode;
    int64_t resident;
  };
  std::vector<Weights> weights_candidates(const PlanInputs& v, int64_t group) const {
    const bool zo = v.optimizer_kind == OptimizerKind::zo_sgd;
    if (v.weights == WeightsMode::device) return {{WeightsMode::device, 0}};
    if (zo) return {{WeightsMode::stream, 0}};
    if (v.resident_layers >= 0) return {{WeightsMode::stream, v.resident_layers}};
    if (v.weights == WeightsMode::stream) return {{WeightsMode::stream, 0}};
    std::vector<Weights> out = {{WeightsMode::device, 0}, {WeightsMode::stream, 0}};
    const int64_t most = int64_t(placement_max_resident_layers(spec, v, group, budgets));
    for (int64_t n : {most, most / 2})
      if (n > 0 && std::none_of(out.begin(), out.end(), [&](const Weights& w) { return w.resident == n; }))
        out.push_back({WeightsMode::stream, n});
    return out;
  }

  void split(PlanInputs v) {
    const int64_t k = placement_layer_major_group(v);  // zo-sgd: its q x k perturbed pairs
    std::vector<int64_t> passes = {1};
    if (k > 1 && v.accumulation != AccumulationMode::micro_batch) {
      const std::string obstacle = placement_layer_major_obstacle(spec, v);
      STRATA_CHECK(v.accumulation != AccumulationMode::layer_major || obstacle.empty(), "offload.accumulation = "
                   "\"layer_major\" does not apply here: ", obstacle, "; set offload.accumulation = \"micro_batch\" or \"auto\"");
      if (v.accumulation == AccumulationMode::layer_major) passes = {k};
      else if (obstacle.empty()) passes.push_back(k);
    }
    // the checkpoints: the device's share first (the rest in pinned host, or on NVMe), or all in
    // pinned host (the device's room then goes to kept activations: no recompute)
    struct Ckpt {
      CheckpointMode mode;
      bool nvme;
    };
    // the working copy: stored, or (where it applies) derived from the master at each upload
    std::vector<bool> derive = {v.working == WorkingMode::derived};
    const std::string derive_obstacle = placement_derived_working_obstacle(spec, v);
    STRATA_CHECK(v.working != WorkingMode::derived || derive_obstacle.empty(), "offload.working_weights = \"derived\" "
                 "does not apply here: ", derive_obstacle, "; set offload.working_weights = \"stored\" or \"auto\"");
    if (v.working == WorkingMode::automatic && derive_obstacle.empty()) derive.push_back(true);
    // clipping: the norm gathered as the gradients land (every gradient held), or a norm pass first
    // (the gradients in flight, a second pass of work)
    std::vector<bool> norm_passes = {v.norm_pass == NormPassMode::on};
    if (v.norm_pass == NormPassMode::automatic) norm_passes.push_back(true);
    std::vector<Ckpt> ckpts = {{v.checkpoints, false}};
    if (v.checkpoints == CheckpointMode::automatic && v.optimizer_kind != OptimizerKind::zo_sgd) {
      ckpts.push_back({CheckpointMode::host, false});
      if (!budgets.nvme_dir.empty()) ckpts.push_back({CheckpointMode::automatic, true});
    }
    if (v.norm_pass == NormPassMode::on) {  // only the schedules a norm pass applies to
      std::string why;
      std::vector<int64_t> one_pass;
      for (int64_t g : passes)
        if (const std::string o = placement_norm_pass_obstacle(v, g); o.empty()) one_pass.push_back(g);
        else why = o;
      STRATA_CHECK(!one_pass.empty(), "offload.norm_pass = \"on\" does not apply here: ", why,
                   "; set offload.norm_pass = \"off\" or \"auto\"");
      passes = one_pass;
    }
    const PlanInputs asked = v;
    for (int64_t g : passes) {
      // layers resident save link time alone: on a GPU they are priced where the streamed plans
      // spend at least half their step on the link (on the CPU backend the link's copies take the
      // cores: always)
      double link_share = 0;
      for (const Weights& w : weights_candidates(asked, g)) {
        const bool mix = w.mode == WeightsMode::stream && w.resident > 0 && asked.resident_layers < 0;
        if (mix && !v.device_in_host_ram && link_share < 0.5) continue;
        for (const Ckpt& c : ckpts)
          for (bool d : derive) {
            // a norm pass only adds work: it can be faster only where holding every gradient does
            // not fit, or puts state on NVMe (its candidate is then priced; else it is skipped)
            bool serial_lean = false;
            for (bool np : norm_passes) {
              if (np && !placement_norm_pass_obstacle(v, g).empty()) continue;
              if (np && v.norm_pass == NormPassMode::automatic && serial_lean) continue;
              v.weights = w.mode;
              v.resident_layers = w.resident;
              PlanInputs cv = v;
              cv.checkpoints = c.mode;
              RunPlan p = with_optimizer(cv, g, c.nvme, d, np);
              if (!np) serial_lean = p.fits() && p.tier(Tier::nvme) == 0;
              // every layer's state on NVMe: nothing to derive, the same plan as stored (kept when forced)
              if (d && p.derived_working_layers == 0 && derive.size() > 1) continue;
              if (c.nvme && p.nvme_checkpoints == 0) continue;  // nothing spilled: the same as without
              std::optional<RunPlan> ahead = with_speculation(cv, g, c.nvme, p);
              if (!ahead || cv.speculate != SpeculateMode::on) consider(cv, std::move(p));
              if (w.mode == WeightsMode::stream && w.resident == 0) link_share = std::max(link_share, last_link_share);
              if (ahead) consider(cv, std::move(*ahead));
            }
          }
      }
    }
  }
};

// The splits of the global batch the recipe leaves open: (micro_batch rows, accumulation_steps).
std::vector<std::pair<int64_t, int64_t>> batch_splits(const PlanInputs& in) {
  if (in.global_batch <= 0) return {{in.micro_batch, in.accumulation_steps}};
  const int64_t unit = in.micro_batch / std::max<int64_t>(1, in.pair_rows);
  STRATA_CHECK(in.global_batch % in.ranks == 0, "train.global_batch_size (", in.global_batch,
               ") must divide evenly among the ", in.ranks, " ranks");
  const int64_t per_rank = in.global_batch / in.ranks;
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t m = 1; m <= per_rank; ++m) {
    if (per_rank % m != 0) continue;
    if (in.micro_batch_fixed && m != unit) continue;
    if (in.accumulation_fixed && per_rank / m != in.accumulation_steps) continue;
    out.emplace_back(m * in.pair_rows, per_rank / m);
  }
  STRATA_CHECK(!out.empty(), "train.global_batch_size = ", in.global_batch, " cannot be split as ",
               in.micro_batch_fixed ? str_cat("train.micro_batch_size = ", unit) : std::string("micro-batches"), " x ",
               in.accumulation_fixed ? str_cat("train.gradient_accumulation_steps = ", in.accumulation_steps)
                                     : std::string("accumulation steps"),
               " x ", in.ranks, " rank(s): give a global batch that is a multiple of the parts you fix, or leave "
               "them out for the plan to choose");
  return out;
}

RunPlan search(const ModelSpec& spec, const PlanInputs& in, const PlanBudgets& budgets, const StepRates& rates) {
  StepRates priced = rates;  // a rate not known is the search's stated default (only the order matters)
  const StepRates fallback = plan_default_rates(in);
  if (priced.device_flops_per_s <= 0) priced.device_flops_per_s = fallback.device_flops_per_s;
  if (priced.link_bytes_per_s <= 0) priced.link_bytes_per_s = fallback.link_bytes_per_s;
  Search s{spec, in, budgets, priced};
  s.groups = spec.layers.size() + 2;
  s.layout = HostStore::layout(spec);
  for (const auto& [micro, accum] : batch_splits(in)) {
    PlanInputs v = in;
    v.micro_batch = micro;
    v.accumulation_steps = accum;
    s.split(v);
  }
  STRATA_ASSERT(s.have_best, "the plan search considered no candidate");
  return std::move(s.best.plan);
}

}  // namespace

// ---- what to change ---------------------------------------------------------------------------

namespace {

// One candidate change: the recipe overrides and what they do to the plan's inputs and budgets.
struct Variant {
  std::string what;
  nlohmann::json set;
  std::function<void(PlanInputs&, PlanBudgets&)> apply;
};

struct Changes {
  const ModelSpec& spec;
  const PlanInputs& in;
  const PlanBudgets& budgets;
  const StepRates& rates;
  const RunPlan& p;
  const StepRates* priced_at = nullptr;  // the rates a change's step is reported at (null: `rates`)
  std::vector<Variant> variants;

  void add(std::string what, nlohmann::json set, std::function<void(PlanInputs&, PlanBudgets&)> apply) {
    variants.push_back({std::move(what), std::move(set), std::move(apply)});
  }

  // The change planned again, applied alone: its saving on the tier it lowers most.
  PlanChange priced(const Variant& v) const {
    PlanInputs vi = in;
    PlanBudgets vb = budgets;
    v.apply(vi, vb);
    const RunPlan q = search(spec, vi, vb, rates);
    PlanChange c{v.what, v.set};
    // the tier it lowers: of the tiers over their budgets the one it lowers most, else of all
    const PlanBudgets& b = p.budgets;
    struct Saved {
      Tier tier;
      double bytes;
      bool over;
    };
    const Saved saved[] = {
        {Tier::device, double(p.tier(Tier::device)) - double(q.tier(Tier::device)), device_over(p)},
        {Tier::host, double(p.host_total()) - double(q.host_total()), b.host_bytes && p.host_total() > b.host_bytes},
        {Tier::nvme, double(p.tier(Tier::nvme)) - double(q.tier(Tier::nvme)), nvme_over(p)}};
    const Saved* most = nullptr;
    for (bool over_only : {true, false})
      for (const Saved& sv : saved)
        if (!most && sv.bytes > 0 && (sv.over || !over_only) &&
            std::none_of(std::begin(saved), std::end(saved), [&](const Saved& o) {
              return o.bytes > sv.bytes && (o.over || !over_only);
            }))
          most = &sv;
    c.tier = most ? most->tier : Tier::host;
    c.saves_bytes = most ? size_t(most->bytes) : 0;
    c.fits = q.fits();
    c.step_seconds = priced_at ? estimate_at(spec, vi, q, *priced_at).seconds : q.step_seconds;
    return c;
  }

  // Whether `c` closes the gap of the tier it lowers (what a suggestion must do to be listed).
  bool closes_gap(const PlanChange& c) const {
    if (c.fits) return true;
    const PlanBudgets& b = p.budgets;
    const size_t budget = c.tier == Tier::device ? b.device_bytes : c.tier == Tier::host ? b.host_bytes : b.nvme_bytes;
    const size_t have = c.tier == Tier::device ? p.tier(Tier::device) : c.tier == Tier::host ? p.host_total() : p.tier(Tier::nvme);
    return c.saves_bytes > 0 && budget && have > budget && have - c.saves_bytes <= budget;
  }
};


std::string mib_text(size_t bytes) {
  const size_t mib = size_t(1) << 20;
  return str_cat((bytes + mib - 1) / mib, "MiB");
}

// The variants that lower a tier that is over its budget.
void memory_variants(Changes& x) {
  const PlanInputs& in = x.in;
  const RunPlan& p = x.p;
  const bool adamw_state = optimizer_state_needs(in.optimizer_kind).moments && !in.lora.enabled();
  const std::string nvme_hint = x.budgets.nvme_dir.empty() ? " with offload.nvme_path = a directory on an NVMe drive" : "";
  auto nvme_dir = [](PlanBudgets& b) {
    if (b.nvme_dir.empty()) b.nvme_dir = "(offload.nvme_path)";
  };
  if (host_over(p) && adamw_state && !(p.optimizer_on_nvme && p.optimizer_nvme_first_group == 0))
    x.add(str_cat("set offload.optimizer = \"nvme\"", nvme_hint, " (fp32 master weights and AdamW moments move to NVMe)"),
          {{"offload.optimizer", "nvme"}}, [&](PlanInputs& v, PlanBudgets& b) { v.optimizer = StateTier::nvme, nvme_dir(b); });
  if ((host_over(p) || nvme_over(p)) && adamw_state && in.moments == DType::f32)
    x.add("set optim.moments_dtype = \"bf16\" (AdamW m and v stored in bf16: 4 bytes per parameter instead of 8)",
          {{"optim.moments_dtype", "bf16"}}, [](PlanInputs& v, PlanBudgets&) { v.moments = DType::bf16; });
  if (host_over(p) && in.working == WorkingMode::stored && placement_derived_working_obstacle(x.spec, in).empty())
    x.add("set offload.working_weights = \"derived\" (the layers' bf16 working copy made from the fp32 master at each "
          "upload: 2 bytes per parameter less in RAM)", {{"offload.working_weights", "derived"}},
          [](PlanInputs& v, PlanBudgets&) { v.working = WorkingMode::derived; });
  if (host_over(p) && in.norm_pass == NormPassMode::off && placement_norm_pass_obstacle(in, p.group).empty())
    x.add("set offload.norm_pass = \"on\" (clipping's norm from a first pass, each group updated as its gradient lands "
          "in a second: the fp32 gradient buffer holds one group's instead of every one)", {{"offload.norm_pass", "on"}},
          [](PlanInputs& v, PlanBudgets&) { v.norm_pass = NormPassMode::on; });
  if (host_over(p) && p.host_checkpoints && in.optimizer_kind != OptimizerKind::zo_sgd)
    x.add(str_cat("set offload.checkpoints = \"nvme\"", nvme_hint, " (spilled layer checkpoints move to NVMe)"),
          {{"offload.checkpoints", "nvme"}}, [&](PlanInputs& v, PlanBudgets& b) { v.checkpoints = CheckpointMode::nvme, nvme_dir(b); });
  if (device_over(p) && in.weights == WeightsMode::device)
    x.add("set offload.weights = \"stream\" (two layer slots on the device instead of every layer)",
          {{"offload.weights", "stream"}}, [](PlanInputs& v, PlanBudgets&) { v.weights = WeightsMode::stream; });
  if (device_over(p) && p.weights == WeightsMode::stream && in.resident_layers > 0)
    x.add("set offload.resident_layers = 0 (every layer streams through two slots)", {{"offload.resident_layers", 0}},
          [](PlanInputs& v, PlanBudgets&) { v.resident_layers = 0; });
  if (device_over(p) && in.checkpoints == CheckpointMode::device)
    x.add("set offload.checkpoints = \"auto\" (checkpoints the device cannot hold spill to pinned host memory)",
          {{"offload.checkpoints", "auto"}}, [](PlanInputs& v, PlanBudgets&) { v.checkpoints = CheckpointMode::automatic; });
  if ((device_over(p) || host_over(p)) && in.accumulation == AccumulationMode::layer_major)
    x.add("set offload.accumulation = \"micro_batch\" (one micro-batch's buffers and checkpoints per layer instead "
          "of the step's)", {{"offload.accumulation", "micro_batch"}},
          [](PlanInputs& v, PlanBudgets&) { v.accumulation = AccumulationMode::micro_batch; });
}

// The largest value below `from` (and at least 1) for which `closes(value)` holds, closes being
// monotone (smaller closes more); 0 when none does.
template <class F>
int64_t largest_closing(int64_t from, F&& closes) {
  if (from <= 1 || !closes(1)) return 0;
  int64_t lo = 1, hi = from;  // closes(lo), hi not tried (or does not close)
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (closes(mid) ? lo : hi) = mid;
  }
  return lo;
}

// Smaller micro-batches at the same global batch, and shorter sequences: the largest that close
// the gap of a tier over its budget.
void shape_variants(Changes& x) {
  const PlanInputs& in = x.in;
  const RunPlan& p = x.p;
  if (!device_over(p) && !host_over(p)) return;
  const int64_t pair = std::max<int64_t>(1, in.pair_rows);
  const int64_t unit = p.micro_batch / pair, rows = unit * p.accumulation_steps;
  auto split = [&](int64_t m) {
    return Variant{str_cat("lower train.micro_batch_size to ", m, " with train.gradient_accumulation_steps = ", rows / m,
                           " (the same rows per step)"),
                   {{"train.micro_batch_size", m}, {"train.gradient_accumulation_steps", rows / m}},
                   [m, rows, pair](PlanInputs& v, PlanBudgets&) {
                     v.micro_batch = m * pair, v.accumulation_steps = rows / m, v.global_batch = 0;
                   }};
  };
  auto seq = [&](int64_t t) {
    return Variant{str_cat("lower data.sequence_len to ", t), {{"data.sequence_len", t}},
                   [t](PlanInputs& v, PlanBudgets&) { v.sequence_len = t; }};
  };
  auto closes = [&](const Variant& v) { return x.closes_gap(x.priced(v)); };
  if (in.global_batch <= 0 || in.micro_batch_fixed)
    for (int64_t m = unit - 1; m >= 1; --m)
      if (rows % m == 0 && closes(split(m))) {
        x.variants.push_back(split(m));
        break;
      }
  if (const int64_t t = largest_closing(in.sequence_len, [&](int64_t t) { return closes(seq(t)); }))
    x.variants.push_back(seq(t));
}

// The budgets the plan needs, for a machine that has them (they save nothing: fits says whether
// raising it alone is enough).
void budget_variants(Changes& x) {
  const RunPlan& p = x.p;
  const size_t mib = size_t(1) << 20;
  auto up = [&](size_t bytes) { return (bytes + mib - 1) / mib * mib; };
  if (device_over(p)) {
    const size_t need = up(p.tier(Tier::device));
    x.add(str_cat("raise device.memory to at least ", mib_text(need), " (a GPU with more memory)"),
          {{"device.memory", mib_text(need)}}, [need](PlanInputs&, PlanBudgets& b) { b.device_bytes = need; });
  }
  if (host_over(p)) {
    // the process baseline (resident set at start) varies by a MiB or so from run to run: the
    // advice leaves 2% (at least 4 MiB) above this run's total, so following it fits next time
    const size_t need = up(p.host_total() + std::max(p.host_total() / 50, 4 * mib));
    x.add(str_cat("raise offload.host_memory to at least ", mib_text(need), " if the machine has the RAM (the plan's "
                  "host total is ", format_bytes(p.host_total()), ")"),
          {{"offload.host_memory", mib_text(need)}}, [need](PlanInputs&, PlanBudgets& b) { b.host_bytes = need; });
  }
  if (nvme_over(p)) {
    const size_t need = up(p.tier(Tier::nvme));
    x.add(str_cat("raise offload.nvme_memory to at least ", mib_text(need), ", or point offload.nvme_path at a larger "
                  "drive"), {{"offload.nvme_memory", mib_text(need)}}, [need](PlanInputs&, PlanBudgets& b) { b.nvme_bytes = need; });
  }
}

// The opt-ins that change the numerics a little for a faster step: bf16 moments, and the plan's
// choice of the batch split (train.global_batch_size).
void faster_variants(Changes& x) {
  const PlanInputs& in = x.in;
  const RunPlan& p = x.p;
  if (optimizer_state_needs(in.optimizer_kind).moments && !in.lora.enabled() && in.moments == DType::f32)
    x.add("set optim.moments_dtype = \"bf16\" (AdamW m and v in bf16: less state to hold and move)",
          {{"optim.moments_dtype", "bf16"}}, [](PlanInputs& v, PlanBudgets&) { v.moments = DType::bf16; });
  const int64_t rows = p.micro_batch / std::max<int64_t>(1, in.pair_rows) * p.accumulation_steps * in.ranks;
  if (in.global_batch <= 0 && rows > 1)
    x.add(str_cat("set train.global_batch_size = ", rows, " and leave out train.micro_batch_size and "
                  "gradient_accumulation_steps (the plan chooses the split of the same batch)"),
          {{"train.global_batch_size", rows}}, [rows](PlanInputs& v, PlanBudgets&) {
            v.global_batch = rows, v.micro_batch_fixed = v.accumulation_fixed = false;
          });
}

// The variants, each priced alone; a fitting plan keeps those that make its step faster, one
// that does not fit those that close a gap (and, when none fits alone, one combination that does).
std::vector<PlanChange> priced_changes(Changes& x) {
  std::vector<PlanChange> out;
  for (const Variant& v : x.variants) {
    PlanChange c = x.priced(v);
    const bool keep = x.p.fits() ? c.fits && c.step_seconds < 0.99 * x.p.step_seconds : x.closes_gap(c);
    if (keep) out.push_back(std::move(c));
  }
  return out;
}

// When no change fits alone: the memory changes together, in the order listed, until it fits.
void combination(Changes& x, std::vector<PlanChange>& out) {
  if (x.p.fits() || std::any_of(out.begin(), out.end(), [](const PlanChange& c) { return c.fits; })) return;
  Variant all{"together: ", nlohmann::json::object(), [](PlanInputs&, PlanBudgets&) {}};
  for (const Variant& v : x.variants) {
    all.what += (all.set.empty() ? "" : "; ") + v.what;
    all.set.update(v.set);
    all.apply = [before = all.apply, next = v.apply](PlanInputs& i, PlanBudgets& b) { before(i, b), next(i, b); };
    PlanChange c = x.priced(all);
    if (c.fits) {
      out.push_back(std::move(c));
      return;
    }
  }
}

// The CPU backend's GEMM scratch is per kernel thread: more threads than cores only cost memory.
// (Not a plan input: the saving is the scratch's, counted directly.)
std::optional<PlanChange> fewer_threads(const Changes& x) {
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  if (!host_over(x.p) || !x.in.device_in_host_ram || cpu_threads_count() <= cores) return std::nullopt;
  const EngineShape shape =
      placement_engine_shape(x.spec, HostStore::layout(x.spec), plan_resolved_inputs(x.in, x.p), x.p.group);
  const LayerDims& d = shape.layer_capacity;
  const CpuScratchShape sh{d.B, d.T, d.H, d.Hk, d.D, shape.C, shape.head_rows, d.F, d.wt};
  const size_t now = cpu_backend_scratch_bytes(sh), fewer = cpu_backend_scratch_bytes(sh, cores);
  if (now <= fewer) return std::nullopt;
  PlanChange c{str_cat("lower device.cpu_threads to ", cores, " (this machine's cores; it is ", cpu_threads_count(),
                       ", and each kernel thread keeps its own GEMM scratch)"), {{"device.cpu_threads", cores}}};
  c.saves_bytes = now - fewer;
  c.fits = x.p.host_total() - c.saves_bytes <= x.p.budgets.host_bytes && !device_over(x.p) && !nvme_over(x.p);
  return c;
}

std::vector<PlanChange> plan_changes(const ModelSpec& spec, const PlanInputs& in, const PlanBudgets& budgets,
                                     const StepRates& rates, const RunPlan& p, const StepRates* priced_at) {
  Changes x{spec, in, budgets, rates, p, priced_at};
  if (p.fits()) {
    faster_variants(x);
    return priced_changes(x);
  }
  memory_variants(x);
  shape_variants(x);
  std::vector<PlanChange> out = priced_changes(x);
  combination(x, out);
  if (const std::optional<PlanChange> c = fewer_threads(x)) out.push_back(*c);
  x.variants.clear();
  budget_variants(x);
  for (const Variant& v : x.variants) out.push_back(x.priced(v));
  return out;
}

}  // namespace

RunPlan placement_plan(const ModelSpec& spec, const PlanInputs& in, const PlanBudgets& budgets, const StepRates& rates,
                       const StepRates* priced_at) {
  RunPlan p = search(spec, in, budgets, rates);
  if (priced_at) p.step_seconds = estimate_at(spec, in, p, *priced_at).seconds;
  p.changes = plan_changes(spec, in, budgets, rates, p, priced_at);
  return p;
}


// ---- fit questions ----------------------------------------------------------------------------

bool placement_fits(const ModelSpec& spec, const PlanInputs& in, const PlanBudgets& budgets) {
  PlanInputs lean = in;
  if (lean.weights == WeightsMode::automatic) lean.weights = WeightsMode::stream;
  if (lean.accumulation == AccumulationMode::automatic) lean.accumulation = AccumulationMode::micro_batch;
  const int64_t group = lean.accumulation == AccumulationMode::layer_major ? placement_layer_major_group(lean) : 1;
  PlanChoice c;
  if (placement_plan_at(spec, lean, group, budgets, c).fits()) return true;
  const bool nvme = !budgets.nvme_dir.empty();
  c.checkpoints_nvme = nvme && lean.checkpoints == CheckpointMode::automatic;
  c.optimizer_nvme = lean.optimizer == StateTier::nvme ||
                     (nvme && lean.optimizer == StateTier::automatic &&
                      optimizer_state_needs(lean.optimizer_kind).moments && !lean.lora.enabled());
  return placement_plan_at(spec, lean, group, budgets, c).fits();
}

namespace {

// The largest value in [1, limit] for which fits(value) holds, fits being monotone; 0 if none.
template <class F>
int64_t largest_fitting(int64_t limit, F&& fits) {
  if (!fits(1)) return 0;
  int64_t lo = 1, hi = 2;
  while (hi <= limit && fits(hi)) lo = hi, hi *= 2;
  hi = std::min(hi, limit + 1);  // fits(lo), !fits(hi) (or hi beyond the limit)
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

}  // namespace

int64_t placement_max_micro_batch(const ModelSpec& spec, PlanInputs in, const PlanBudgets& budgets, int64_t limit) {
  in.global_batch = 0;
  return largest_fitting(limit, [&](int64_t b) {
    in.micro_batch = b;
    return placement_fits(spec, in, budgets);
  });
}

int64_t placement_max_sequence_len(const ModelSpec& spec, PlanInputs in, const PlanBudgets& budgets, int64_t limit) {
  in.global_batch = 0;
  return largest_fitting(limit, [&](int64_t t) {
    in.sequence_len = t;
    return placement_fits(spec, in, budgets);
  });
}

}  // namespace strata
