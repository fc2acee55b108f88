// The trainer's preference objectives (preference_step.h): pairs into micro-batches, the
// reference pass and its cache, a step, the eval pass, TRL's metric names.
#include "src/train/preference_step.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "io/files.h"
#include "src/core/error.h"
#include "src/recipe/recipe.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr const char* kReferenceFile = "reference_logps.json";

// HF labels of a sample: the id where it is trained on, -100 elsewhere.
std::vector<int32_t> sample_labels(const Sample& s) {
  std::vector<int32_t> out(s.ids.size());
  for (size_t t = 0; t < s.ids.size(); ++t) out[t] = s.labels[t] ? s.ids[t] : -100;
  return out;
}

uint64_t fnv_mix(uint64_t h, const void* p, size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

bool preference_objective_enabled(const Recipe& rc) { return rc.modes.preference.has_value(); }

PreferenceParams preference_params(const Recipe& rc) {
  PreferenceParams p;
  p.objective = *rc.modes.preference;
  p.beta = rc.preference_beta;
  p.gamma = rc.preference_gamma;
  return p;
}

MicroBatch preference_pairs_micro_batch(const PreferencePairs& pairs, const std::vector<int64_t>& order,
                                        PreferenceLayout* layout) {
  std::vector<std::vector<int32_t>> ci, cl, ri, rl;
  for (int64_t i : order) {
    const Sample& c = pairs.chosen[size_t(i)];
    const Sample& r = pairs.rejected[size_t(i)];
    ci.push_back(c.ids), cl.push_back(sample_labels(c));
    ri.push_back(r.ids), rl.push_back(sample_labels(r));
  }
  return preference_micro_batch(ci, cl, ri, rl, layout);
}

nlohmann::json preference_metrics_json(const PreferenceMetrics& m, const std::string& prefix) {
  const double P = double(std::max<int64_t>(m.pairs, 1));
  return {{prefix + "rewards/chosen", m.rewards_chosen / P},     {prefix + "rewards/rejected", m.rewards_rejected / P},
          {prefix + "rewards/margins", m.rewards_margins / P},   {prefix + "rewards/accuracies", m.accuracies / P},
          {prefix + "logps/chosen", m.logps_chosen / P},         {prefix + "logps/rejected", m.logps_rejected / P}};
}

PreferenceTrainer::PreferenceTrainer(const Recipe& rc, PreferencePairs train, PreferencePairs eval, Device& dev,
                                     Engine& engine)
    : rc_(rc), params_(preference_params(rc)), train_(std::move(train)), eval_(std::move(eval)), engine_(engine) {
  STRATA_CHECK(train_.size() > 0, "train.objective = \"", rc.objective, "\" needs preference pairs: data.path must "
               "hold {prompt, chosen, rejected} records (data.format = \"preference\")");
  auto head = std::make_unique<PreferenceHead>(dev, params_, engine.options().max_batch * engine.options().max_tokens,
                                               size_t(engine.options().group));
  head_ = head.get();
  engine_.set_loss_objective(std::move(head));
}

uint64_t PreferenceTrainer::data_hash() const {
  uint64_t h = 1469598103934665603ull;
  for (const PreferencePairs* set : {&train_, &eval_}) {
    for (const auto* side : {&set->chosen, &set->rejected})
      for (const Sample& s : *side) {
        h = fnv_mix(h, s.ids.data(), s.ids.size() * sizeof(int32_t));
        h = fnv_mix(h, s.labels.data(), s.labels.size());
        const uint64_t n = s.ids.size();
        h = fnv_mix(h, &n, sizeof n);
      }
    const uint64_t n = uint64_t(set->size());
    h = fnv_mix(h, &n, sizeof n);
  }
  return h;
}

std::string PreferenceTrainer::fingerprint() const {
  std::string model;
  if (!rc_.model_path.empty()) {
    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(rc_.model_path)) {
      const std::string name = e.path().filename().string();
      if (name == "config.json" || e.path().extension() == ".safetensors") files.push_back(name);
    }
    std::sort(files.begin(), files.end());
    model = rc_.model_path;
    for (const std::string& f : files) {
      std::error_code ec;
      const fs::path p = fs::path(rc_.model_path) / f;
      const auto size = fs::file_size(p, ec);
      const auto mtime = fs::last_write_time(p, ec).time_since_epoch().count();
      model += str_cat(";", f, ":", uint64_t(size), ":", int64_t(mtime));
    }
  } else {
    model = str_cat(rc_.model_config, ";seed ", rc_.model_init_seed, ";std ", rc_.model_init_std);
  }
  return str_cat("model ", hex(fnv_mix(1469598103934665603ull, model.data(), model.size())), " dtype ",
                 rc_.model_dtype, " data ", hex(data_hash()), " pairs ", train_.size(), "+", eval_.size());
}

PreferenceLayout PreferenceTrainer::layout_for(const PreferencePairs& pairs, const std::vector<double>& ref,
                                               const std::vector<int64_t>& idx, MicroBatch* mb) const {
  PreferenceLayout layout;
  *mb = preference_pairs_micro_batch(pairs, idx, &layout);
  if (!ref.empty())
    for (int64_t i : idx) {
      layout.ref_chosen.push_back(ref[size_t(2 * i)]);
      layout.ref_rejected.push_back(ref[size_t(2 * i + 1)]);
    }
  return layout;
}

std::vector<double> PreferenceTrainer::sums_of(const PreferencePairs& pairs, Progress* progress, int64_t done,
                                               int64_t total) {
  std::vector<double> sums(size_t(2 * pairs.size()));
  const int64_t mbs = rc_.micro_batch_size;
  for (int64_t first = 0; first < pairs.size(); first += mbs) {
    std::vector<int64_t> idx;
    for (int64_t i = first; i < std::min(pairs.size(), first + mbs); ++i) idx.push_back(i);
    MicroBatch mb;
    PreferenceLayout layout = layout_for(pairs, {}, idx, &mb);
    layout.totals = preference_layout_totals(mb, layout);
    head_->set_layout(std::move(layout));
    engine_.forward_loss(mb);
    for (size_t k = 0; k < idx.size(); ++k) {
      sums[size_t(2 * idx[k])] = head_->pairs()[k].chosen_logp;
      sums[size_t(2 * idx[k] + 1)] = head_->pairs()[k].rejected_logp;
    }
    // the phase line at every tenth of the pairs (a terminal redraws it; a log gets ten lines)
    const int64_t now = done + idx.back() + 1, before = done + first;
    if (progress && (now * 10 / total != before * 10 / total || now == total))
      progress->phase(str_cat("reference log-probs of the starting weights: ", now, "/", total, " pairs"));
  }
  return sums;
}

double PreferenceTrainer::prepare_reference(Progress& progress) {
  if (!preference_needs_reference(params_.objective)) return 0;
  const std::string path = rc_.output_dir + "/" + kReferenceFile;
  const std::string key = fingerprint();
  std::error_code ec;
  if (fs::exists(path, ec)) {
    std::ifstream in(path);
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    const bool ok = j.is_object() && j.value("fingerprint", "") == key && j.contains("train") && j.contains("eval") &&
                    j["train"].size() == size_t(2 * train_.size()) && j["eval"].size() == size_t(2 * eval_.size());
    if (ok) {
      ref_train_ = j["train"].get<std::vector<double>>();
      ref_eval_ = j["eval"].get<std::vector<double>>();
      std::fprintf(stderr, "strata train: reference log-probs from %s (%ld train + %ld eval pairs)\n", path.c_str(),
                   long(train_.size()), long(eval_.size()));
      return 0;
    }
    std::fprintf(stderr, "strata train: %s is stale (it was computed for another model or other data: %s); "
                 "recomputing the reference log-probs\n", path.c_str(),
                 j.is_object() ? j.value("fingerprint", "no fingerprint").c_str() : "unreadable");
  }
  const auto t0 = Clock::now();
  const int64_t total = train_.size() + eval_.size();
  progress.phase(str_cat("reference log-probs of the starting weights: 0/", total, " pairs"));
  ref_train_ = sums_of(train_, &progress, 0, total);
  ref_eval_ = sums_of(eval_, &progress, train_.size(), total);
  progress.phase("");
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  const nlohmann::json j = {{"fingerprint", key}, {"train", ref_train_}, {"eval", ref_eval_}};
  const std::string text = j.dump();
  file_write_atomic(path, text.data(), text.size());
  std::fprintf(stderr, "strata train: reference log-probs of %ld pairs in %.2fs, cached in %s\n", long(total),
               seconds, path.c_str());
  return seconds;
}

PreferenceStepOutcome PreferenceTrainer::step(const std::vector<std::vector<int64_t>>& micro,
                                              const AdamWParams& params, double max_grad_norm, double weight_decay,
                                              double* grad_norm) {
  std::vector<MicroBatch> mbs(micro.size());
  std::vector<PreferenceLayout> layouts(micro.size());
  PreferenceStepTotals totals;
  for (size_t a = 0; a < micro.size(); ++a) {
    layouts[a] = layout_for(train_, ref_train_, micro[a], &mbs[a]);
    const PreferenceStepTotals t = preference_layout_totals(mbs[a], layouts[a]);
    totals.pairs += t.pairs;
    totals.chosen_tokens += t.chosen_tokens;
  }
  PreferenceStepOutcome out;
  out.chosen_tokens = totals.chosen_tokens;
  for (PreferenceLayout& layout : layouts) layout.totals = totals;
  // the micro-batches one pass runs: all of them layer-major (offload.accumulation), else one
  const size_t per_pass = engine_.options().group > 1 ? micro.size() : 1;
  for (size_t a = 0; a < micro.size(); a += per_pass) {
    const std::vector<MicroBatch> pass(mbs.begin() + long(a), mbs.begin() + long(a + per_pass));
    head_->set_layouts(std::vector<PreferenceLayout>(std::make_move_iterator(layouts.begin() + long(a)),
                                                     std::make_move_iterator(layouts.begin() + long(a + per_pass))));
    const bool last = a + per_pass == micro.size();  // updates as gradients land (no clip), else gathers the norm
    const std::vector<double> losses = !last                ? engine_.forward_backward_group(pass, 1.f)
                                       : max_grad_norm <= 0 ? engine_.forward_backward_group_update(pass, 1.f, params, weight_decay)
                                                            : engine_.forward_backward_group_last(pass, 1.f, &params, weight_decay);
    for (size_t m = 0; m < per_pass; ++m) {  // in micro-batch order, as one at a time adds them
      out.loss += losses[m];
      out.metrics.add(head_->result(m).metrics);
      for (const PreferencePair& p : head_->pairs(m)) out.rejected_tokens += p.rejected_tokens;
    }
  }
  *grad_norm = max_grad_norm > 0 ? engine_.optimizer_step(params, max_grad_norm, weight_decay)
                                 : engine_.landed_update_norm();
  return out;
}

nlohmann::json PreferenceTrainer::evaluate() {
  std::vector<MicroBatch> mbs;
  std::vector<PreferenceLayout> layouts;
  PreferenceStepTotals totals;
  for (int64_t first = 0; first < eval_.size(); first += rc_.micro_batch_size) {
    std::vector<int64_t> idx;
    for (int64_t i = first; i < std::min(eval_.size(), first + rc_.micro_batch_size); ++i) idx.push_back(i);
    mbs.emplace_back();
    layouts.push_back(layout_for(eval_, ref_eval_, idx, &mbs.back()));
    const PreferenceStepTotals t = preference_layout_totals(mbs.back(), layouts.back());
    totals.pairs += t.pairs;
    totals.chosen_tokens += t.chosen_tokens;
  }
  double loss = 0;
  PreferenceMetrics m;
  for (size_t a = 0; a < mbs.size(); ++a) {
    layouts[a].totals = totals;
    head_->set_layout(std::move(layouts[a]));
    loss += engine_.forward_loss(mbs[a]);
    m.add(head_->result().metrics);
  }
  nlohmann::json j = preference_metrics_json(m, "eval_");
  j["eval_loss"] = loss;
  j["eval_pairs"] = totals.pairs;
  return j;
}

}  // namespace strata
