// One GRPO step (grpo_step.h): generate, score, normalise, train num_iterations times.
#include "src/train/grpo_step.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "src/core/error.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Field f of slot i of a zero-filled (slots, fields) table that the ranks fill and sum.
struct RankTable {
  size_t fields;
  std::vector<double> v;
  RankTable(size_t slots, size_t f) : fields(f), v(slots * f, 0.0) {}
  double& at(size_t i, size_t f) { return v[i * fields + f]; }
};

}  // namespace

std::vector<size_t> grpo_rank_prompts(size_t P, int64_t G, int64_t rows, int r, int N) {
  STRATA_ASSERT(N >= 1 && r >= 0 && r < N && G >= 1 && rows >= 1, "bad GRPO rank layout");
  std::vector<size_t> mine;
  if (N == 1) {
    for (size_t p = 0; p < P; ++p) mine.push_back(p);
    return mine;
  }
  const size_t n = P * size_t(G);
  STRATA_CHECK(n % (size_t(rows) * size_t(N)) == 0 && (P % size_t(N)) == 0 &&
                   ((n / size_t(N)) % size_t(G)) == 0,
               "GRPO over ", N, " ranks: ", P, " prompts x ", G, " generations do not give each rank whole groups "
               "in whole micro-batches of ", rows, "; each rank keeps its prompts' num_generations completions: make "
               "grpo.num_generations divide train.micro_batch_size x gradient_accumulation_steps");
  if (rows % G == 0) {  // whole prompts per micro-batch: rank r takes micro-batches r, r + N, ...
    const size_t per_mb = size_t(rows / G), mbs = n / size_t(rows);
    for (size_t m = size_t(r); m < mbs; m += size_t(N))
      for (size_t q = 0; q < per_mb; ++q) mine.push_back(m * per_mb + q);
  } else {  // a block of prompts, its completions split into micro-batches
    const size_t per_rank = P / size_t(N);
    for (size_t q = 0; q < per_rank; ++q) mine.push_back(size_t(r) * per_rank + q);
  }
  return mine;
}

void GrpoStep::set_ranks(GrpoRanks ranks) {
  STRATA_ASSERT(ranks.size == 1 || ranks.all_reduce_sum, "GRPO over ranks without an all-reduce");
  ranks_ = std::move(ranks);
}

uint64_t grpo_step_seed(uint64_t seed, int64_t step) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * uint64_t(step + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

GrpoStep::GrpoStep(const GrpoConfig& config, Device& dev, HostStore& store, Engine& engine,
                   const GeneratorShape& gen_shape, Rewards& rewards,
                   std::function<std::string(const std::vector<int32_t>&)> decode, LoraStore* lora)
    : c_(config), dev_(dev), store_(store), engine_(engine), gen_shape_(gen_shape), rewards_(rewards), lora_(lora),
      decode_(std::move(decode)) {
  STRATA_ASSERT(engine.options().lora.enabled() == (lora != nullptr), "GRPO: a LoRA engine without its adapters");
  if (lora_) gen_lora_ = {lora_->layout().r, lora_->layout().bytes};
  STRATA_CHECK(c_.num_generations >= 2, "grpo.num_generations must be >= 2 (a group needs a baseline), got ",
               c_.num_generations);
  STRATA_CHECK(c_.num_iterations >= 1, "grpo.num_iterations must be >= 1, got ", c_.num_iterations);
  STRATA_CHECK(c_.loss.beta >= 0 && std::isfinite(c_.loss.beta), "grpo.beta must be >= 0, got ", c_.loss.beta);
  // full fine-tuning's reference: the weights as they are now, the starting model
  if (c_.loss.beta != 0 && !lora_) ref_store_ = frozen_weights_copy(dev, store);
  const EngineOptions& eo = engine.options();
  auto owned = std::make_unique<GrpoHead>(dev, c_.loss, eo.max_batch * eo.max_tokens, std::max<size_t>(1, eo.group));
  head_ = owned.get();
  engine.set_loss_objective(std::move(owned));
}

GrpoStepOutcome GrpoStep::run(const std::vector<const GrpoPrompt*>& prompts, const std::vector<int64_t>& prompt_index,
                              int64_t step, const AdamWParams& params, double max_grad_norm, double weight_decay) {
  STRATA_ASSERT(!prompts.empty() && prompts.size() == prompt_index.size(), "a GRPO step without prompts");
  const size_t P = prompts.size(), G = size_t(c_.num_generations), n_all = P * G;
  const size_t N = size_t(ranks_.size);
  auto all_reduce = [&](std::vector<double>& v) {
    if (N > 1) ranks_.all_reduce_sum(v);
  };
  // this rank's prompts (all of them on one rank), its completions i = q G + g of mine[q]
  const std::vector<size_t> mine = grpo_rank_prompts(P, int64_t(G), c_.micro_batch_rows, ranks_.rank, ranks_.size);
  const size_t n = mine.size() * G;
  auto global = [&](size_t i) { return mine[i / G] * G + i % G; };  // its index in the step's order
  const EngineOptions& eo = engine_.options();
  STRATA_CHECK(int64_t(n) % c_.micro_batch_rows == 0, "GRPO: ", n, " completions per step (", mine.size(),
               " prompts x ", G, " generations) do not split into micro-batches of ", c_.micro_batch_rows, " rows");
  // ---- generation: the current weights, each prompt's G completions as one seeded batch
  const auto t_gen = Clock::now();
  engine_.synchronize();  // the last update has landed in the host weights
  STRATA_CHECK(gen_shape_.max_batch >= int64_t(G), "GRPO: the generator's batch (", gen_shape_.max_batch,
               ") holds fewer rows than num_generations (", G, ")");
  SamplingOptions so;
  so.max_new_tokens = c_.loss.max_completion_length;
  so.temperature = c_.loss.temperature;
  so.top_k = c_.top_k;
  so.top_p = c_.top_p;
  so.seed = grpo_step_seed(c_.seed, step);
  so.eos_ids = c_.eos_ids;
  std::vector<GenerateResult> res(n);
  {
    Generator gen(dev_, store_, gen_shape_, gen_lora_);  // its device buffers are freed before the training passes
    if (lora_) gen.set_adapters(lora_->layout(), lora_->image());  // the policy as the last update left it
    for (size_t q = 0; q < mine.size(); ++q) {
      const size_t p = mine[q];
      const std::vector<std::vector<int32_t>> rows(G, prompts[p]->ids);
      STRATA_CHECK(int64_t(prompts[p]->ids.size()) <= gen_shape_.max_prompt, "GRPO: prompt ", prompt_index[p],
                   " has ", prompts[p]->ids.size(), " tokens, more than the generator's ", gen_shape_.max_prompt);
      std::vector<GenerateResult> r = gen.generate(rows, so, uint64_t(prompt_index[p]) * G);
      std::move(r.begin(), r.end(), res.begin() + long(q * G));
    }
  }
  const double gen_s = seconds_since(t_gen);

  // ---- rewards and advantages (timed with the training: training_s is everything after sampling)
  const auto t_train = Clock::now();
  std::vector<RewardSample> samples(n);
  for (size_t i = 0; i < n; ++i) {
    const GrpoPrompt& pr = *prompts[mine[i / G]];
    samples[i].prompt = pr.text;
    samples[i].completion = decode_(res[i].tokens);
    samples[i].completion_tokens = int64_t(res[i].tokens.size()) + (res[i].stopped ? 1 : 0);
    samples[i].fields = pr.fields;
  }
  std::vector<std::vector<double>> per_mine;
  const std::vector<double> total_mine = rewards_.score(samples, &per_mine);
  // every completion's {total, per function, tokens, stopped} in the step's order, from every rank
  const size_t F = per_mine.size();
  RankTable scored(n_all, F + 3);
  for (size_t i = 0; i < n; ++i) {
    const size_t gi = global(i);
    scored.at(gi, 0) = total_mine[i];
    for (size_t f = 0; f < F; ++f) scored.at(gi, 1 + f) = per_mine[f][i];
    scored.at(gi, F + 1) = double(samples[i].completion_tokens);
    scored.at(gi, F + 2) = res[i].stopped ? 1 : 0;
  }
  all_reduce(scored.v);
  std::vector<double> total(n_all);
  std::vector<std::vector<double>> per(F, std::vector<double>(n_all));
  for (size_t gi = 0; gi < n_all; ++gi) {
    total[gi] = scored.at(gi, 0);
    for (size_t f = 0; f < F; ++f) per[f][gi] = scored.at(gi, 1 + f);
  }
  const GrpoAdvantages adv = grpo_advantages(total, int64_t(G), c_.scale_rewards);

  // ---- the micro-batches: prompt + completion (+ its EOS), mask on the completion
  std::vector<std::vector<int32_t>> ids(n), mask(n);
  for (size_t i = 0; i < n; ++i) {
    ids[i] = prompts[mine[i / G]]->ids;
    std::vector<int32_t> comp = res[i].tokens;
    if (res[i].stopped && !c_.eos_ids.empty()) comp.push_back(c_.eos_ids[0]);
    mask[i].assign(ids[i].size(), 0);
    const int32_t m = c_.mask_truncated_completions && !res[i].stopped ? 0 : 1;
    ids[i].insert(ids[i].end(), comp.begin(), comp.end());
    mask[i].resize(ids[i].size(), m);
  }
  // Every row padded to the step's longest (every rank's): the micro-batches of N ranks then hold
  // the shapes one process gives them (the data-parallel reduction needs equal token counts, and a
  // GEMM's sums depend on its shape); padding is id 0 with the mask off (grpo_micro_batch's own)
  std::vector<double> longest(N, 0.0);
  for (size_t i = 0; i < n; ++i) longest[size_t(ranks_.rank)] = std::max(longest[size_t(ranks_.rank)], double(ids[i].size()));
  all_reduce(longest);
  const size_t T_step = size_t(*std::max_element(longest.begin(), longest.end()));
  for (size_t i = 0; i < n; ++i) ids[i].resize(T_step, 0), mask[i].resize(T_step, 0);
  const size_t rows = size_t(c_.micro_batch_rows), k = n / rows;
  std::vector<MicroBatch> mbs(k);
  std::vector<GrpoLayout> layouts(k);
  std::vector<double> step_tokens = {0};  // counted tokens of the whole step (every rank's)
  for (size_t a = 0; a < k; ++a) {
    const std::vector<std::vector<int32_t>> mi(ids.begin() + long(a * rows), ids.begin() + long((a + 1) * rows));
    const std::vector<std::vector<int32_t>> mm(mask.begin() + long(a * rows), mask.begin() + long((a + 1) * rows));
    mbs[a] = grpo_micro_batch(mi, mm);
    STRATA_CHECK(mbs[a].T <= eo.max_tokens, "GRPO: a prompt with its completion is ", mbs[a].T,
                 " tokens, longer than data.sequence_len (", eo.max_tokens, "); raise data.sequence_len to at least "
                 "the longest prompt + grpo.max_completion_length + 1");
    layouts[a].rows = mbs[a].B;
    layouts[a].cols = mbs[a].T;
    for (size_t i = a * rows; i < (a + 1) * rows; ++i) layouts[a].advantages.push_back(adv.advantages[global(i)]);
    step_tokens[0] += double(mbs[a].counted());
  }
  all_reduce(step_tokens);  // integers: exact in any order
  const GrpoStepTotals totals{int64_t(k * N), int64_t(step_tokens[0])};  // as one process with every rank's
  for (GrpoLayout& l : layouts) l.totals = totals;

  // ---- beta > 0: the reference model's log-probs of the completions, one forward per micro-batch
  double ref_s = 0;
  if (c_.loss.beta != 0) {
    const auto t_ref = Clock::now();
    HostStore& ref = ref_store_ ? *ref_store_ : store_;  // LoRA: the frozen base, read without adapters
    GrpoTemperature temperature(ref, c_.loss.temperature);  // logits / T, as in the training passes
    int64_t B = 0, T = 0;
    for (const MicroBatch& mb : mbs) B = std::max(B, mb.B), T = std::max(T, mb.T);
    TokenScorer scorer(dev_, ref, B, T);  // its device buffers are freed before the training passes
    for (size_t a = 0; a < k; ++a) layouts[a].ref_logp = scorer.token_logps(mbs[a]);
    ref_s = seconds_since(t_ref);
  }

  // ---- num_iterations updates over the micro-batches
  GrpoStepOutcome out;
  std::vector<GrpoMetricSums> mb_metrics(k);  // the last update's, per micro-batch
  const size_t per_pass = eo.group > 1 ? k : 1;
  STRATA_CHECK(per_pass == 1 || size_t(eo.group) >= k, "GRPO: the engine's layer-major passes hold ", eo.group,
               " micro-batches, the step has ", k);
  for (int64_t it = 0; it < c_.num_iterations; ++it) {
    out.loss = 0;
    out.losses.clear();
    GrpoTemperature temperature(store_, c_.loss.temperature);  // g / T for the passes of this update
    for (size_t a = 0; a < k; a += per_pass) {
      std::vector<const MicroBatch*> ptrs;
      std::vector<GrpoLayout> pass_layouts;
      for (size_t m = a; m < a + per_pass; ++m) ptrs.push_back(&mbs[m]), pass_layouts.push_back(layouts[m]);
      head_->set_layouts(std::move(pass_layouts), ptrs);
      const std::vector<MicroBatch> pass(mbs.begin() + long(a), mbs.begin() + long(a + per_pass));
      // plain passes: the norm's gradient is divided by T before the optimizer gathers any norm
      const std::vector<double> losses = engine_.forward_backward_group(pass, 1.f);
      for (size_t m = 0; m < per_pass; ++m) {
        out.loss += losses[m];
        out.losses.push_back(losses[m]);
        if (it + 1 == c_.num_iterations) mb_metrics[a + m] = head_->result(m).metrics;
        if (it == 0 && c_.num_iterations > 1) layouts[a + m].old_logp = head_->token_logps(m);  // the old policy's
      }
    }
    engine_.synchronize();
    temperature.finish();
    out.grad_norm = engine_.optimizer_step(params, max_grad_norm, weight_decay);
  }
  const double train_s = seconds_since(t_train);
  out.batches = std::move(mbs);
  out.layouts = std::move(layouts);

  // ---- the metric sums over the step's micro-batches in the one-process order (rank r's j-th is
  // micro-batch j N + r), and the phases' times (the slowest rank's)
  RankTable sums(k * N, 6);
  for (size_t j = 0; j < k; ++j) {
    const GrpoMetricSums& m = mb_metrics[j];
    const size_t row = j * N + size_t(ranks_.rank);
    sums.at(row, 0) = double(m.tokens), sums.at(row, 1) = m.clip_low, sums.at(row, 2) = m.clip_high;
    sums.at(row, 3) = m.clip_region, sums.at(row, 4) = m.kl, sums.at(row, 5) = m.entropy;
  }
  const double times[3] = {gen_s, train_s, ref_s};  // each rank's in its own slots after the sums
  RankTable timing(N, 3);
  for (size_t t = 0; t < 3; ++t) timing.at(size_t(ranks_.rank), t) = times[t];
  sums.v.insert(sums.v.end(), timing.v.begin(), timing.v.end());
  all_reduce(sums.v);
  GrpoMetricSums ms;
  for (size_t row = 0; row < k * N; ++row) {
    GrpoMetricSums m;
    m.tokens = int64_t(sums.at(row, 0)), m.clip_low = sums.at(row, 1), m.clip_high = sums.at(row, 2);
    m.clip_region = sums.at(row, 3), m.kl = sums.at(row, 4), m.entropy = sums.at(row, 5);
    ms.add(m);
  }
  double slowest[3] = {0, 0, 0};
  for (size_t r = 0; r < N; ++r)
    for (size_t t = 0; t < 3; ++t) slowest[t] = std::max(slowest[t], sums.v[k * N * 6 + r * 3 + t]);

  // ---- the completions: every rank's scores; the text of this rank's, and of the first
  // log_prompts prompts' from whichever rank sampled them
  const size_t logged = std::min(P, size_t(std::max<int64_t>(0, c_.log_prompts))) * G;
  const size_t width = size_t(c_.loss.max_completion_length) + 1;  // {count, ids}
  std::vector<std::string> text(n_all);
  for (size_t i = 0; i < n; ++i) text[global(i)] = samples[i].completion;
  if (N > 1 && logged > 0) {
    RankTable toks(logged, width);
    for (size_t i = 0; i < n; ++i) {
      const size_t gi = global(i);
      if (gi >= logged) continue;
      toks.at(gi, 0) = double(res[i].tokens.size());
      for (size_t t = 0; t < res[i].tokens.size() && t + 1 < width; ++t) toks.at(gi, t + 1) = double(res[i].tokens[t]);
    }
    all_reduce(toks.v);
    for (size_t gi = 0; gi < logged; ++gi) {
      if (!text[gi].empty() || toks.at(gi, 0) == 0) continue;
      std::vector<int32_t> t(size_t(toks.at(gi, 0)));
      for (size_t j = 0; j < t.size(); ++j) t[j] = int32_t(toks.at(gi, j + 1));
      text[gi] = decode_(t);
    }
  }

  // ---- metrics (TRL's names)
  nlohmann::json& j = out.metrics;
  double mean = 0;
  for (double r : total) mean += r / double(n_all);
  j["reward"] = mean;
  j["reward_std"] = adv.reward_std;
  j["frac_reward_zero_std"] = adv.frac_reward_zero_std;
  for (size_t f = 0; f < per.size(); ++f) {
    double m = 0;
    for (double r : per[f]) m += r / double(n_all);
    j["rewards/" + rewards_.names()[f] + "/mean"] = m;
    double ss = 0;  // torch's std: unbiased
    for (double r : per[f]) ss += (r - m) * (r - m);
    j["rewards/" + rewards_.names()[f] + "/std"] = n_all > 1 ? std::sqrt(ss / double(n_all - 1)) : 0.0;
  }
  double len_sum = 0, len_max = 0, len_min = 1e300, truncated = 0;
  for (size_t gi = 0; gi < n_all; ++gi) {
    const double L = scored.at(gi, F + 1);
    const bool stopped = scored.at(gi, F + 2) != 0;
    len_sum += L, len_max = std::max(len_max, L), len_min = std::min(len_min, L);
    truncated += stopped ? 0 : 1;
    out.completions.push_back({prompt_index[gi / G], text[gi], total[gi], adv.advantages[gi], int64_t(L), !stopped});
  }
  j["completions/mean_length"] = len_sum / double(n_all);
  j["completions/max_length"] = len_max;
  j["completions/min_length"] = len_min;
  j["completions/clipped_ratio"] = truncated / double(n_all);
  const double tok = double(std::max<int64_t>(1, ms.tokens));
  j["clip_ratio/low_mean"] = ms.clip_low / tok;
  j["clip_ratio/high_mean"] = ms.clip_high / tok;
  j["clip_ratio/region_mean"] = ms.clip_region / tok;
  j["entropy"] = ms.entropy / tok;
  if (c_.loss.beta != 0) j["kl"] = ms.kl / tok;
  if (c_.loss.beta != 0) j["reference_s"] = slowest[2];
  j["generation_s"] = slowest[0];
  j["training_s"] = slowest[1];
  return out;
}

}  // namespace strata
