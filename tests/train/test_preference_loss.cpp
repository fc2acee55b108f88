// Preference losses against torch goldens (tools/golden/make_preference_goldens.py, float64 with
// autograd, TRL's definitions) and against central finite differences of themselves.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "src/core/error.h"
#include "offload/objective/preference_loss.h"
#include "src/recipe/recipe_modes.h"

using namespace strata;

namespace {

std::vector<PreferencePair> pairs_of(const nlohmann::json& c) {
  std::vector<PreferencePair> pairs(c["chosen_logp"].size());
  for (size_t i = 0; i < pairs.size(); ++i) {
    pairs[i].chosen_logp = c["chosen_logp"][i];
    pairs[i].rejected_logp = c["rejected_logp"][i];
    pairs[i].chosen_tokens = c["chosen_tokens"][i];
    pairs[i].rejected_tokens = c["rejected_tokens"][i];
    pairs[i].ref_chosen_logp = c["ref_chosen_logp"][i];
    pairs[i].ref_rejected_logp = c["ref_rejected_logp"][i];
  }
  return pairs;
}

PreferenceStepTotals totals_of(const std::vector<PreferencePair>& pairs) {
  PreferenceStepTotals t;
  t.pairs = int64_t(pairs.size());
  for (const auto& p : pairs) t.chosen_tokens += p.chosen_tokens;
  return t;
}

double rel(double a, double b) { return std::fabs(a - b) / std::max(std::fabs(b), 1e-300); }

}  // namespace

TEST_CASE("preference losses and their derivatives match torch, split into micro-batches as accumulation does",
          "[preference]") {
  std::ifstream f(STRATA_SOURCE_DIR "/tests/golden/preference/preference_losses.json");
  REQUIRE(f.good());
  const auto golden = nlohmann::json::parse(f);
  REQUIRE(golden["cases"].size() == 32);
  for (const auto& c : golden["cases"]) {
    PreferenceParams params;
    params.objective = preference_objective_parse(c["objective"]);
    params.beta = c["beta"];
    params.gamma = c["gamma"];
    const auto pairs = pairs_of(c);
    const PreferenceStepTotals totals = totals_of(pairs);
    double loss = 0;
    std::vector<double> dc, dr;
    size_t at = 0;
    for (int64_t n : c["split"].get<std::vector<int64_t>>()) {  // one micro-batch each
      std::vector<PreferencePair> part(pairs.begin() + at, pairs.begin() + at + n);
      const PreferenceLoss l = preference_loss(params, part, totals);
      loss += l.loss;
      dc.insert(dc.end(), l.d_chosen_logp.begin(), l.d_chosen_logp.end());
      dr.insert(dr.end(), l.d_rejected_logp.begin(), l.d_rejected_logp.end());
      at += size_t(n);
    }
    INFO(c["objective"].get<std::string>() << " beta " << params.beta << " pairs " << pairs.size());
    CHECK(rel(loss, c["loss"]) < 1e-12);
    for (size_t i = 0; i < pairs.size(); ++i) {
      CHECK(rel(dc[i], c["d_chosen_logp"][i]) < 1e-10);
      CHECK(rel(dr[i], c["d_rejected_logp"][i]) < 1e-10);
    }
  }
}

TEST_CASE("preference derivatives equal central finite differences of the loss", "[preference]") {
  std::vector<PreferencePair> pairs = {{-12.5, -20.25, 9, 14, -13.0, -19.0},
                                       {-3.0, -2.5, 4, 3, -4.0, -2.0},
                                       {-40.0, -8.0, 20, 2, -35.0, -9.5}};
  const PreferenceStepTotals totals{5, 60};  // the step has two more pairs in other micro-batches
  for (const char* name : {"dpo", "ipo", "simpo", "orpo"}) {
    PreferenceParams params;
    params.objective = preference_objective_parse(name);
    params.beta = 0.3;
    params.gamma = 0.4;
    const PreferenceLoss l = preference_loss(params, pairs, totals);
    const double h = 1e-5;
    for (size_t i = 0; i < pairs.size(); ++i) {
      for (int side = 0; side < 2; ++side) {
        auto bumped = [&](double d) {
          auto p = pairs;
          (side == 0 ? p[i].chosen_logp : p[i].rejected_logp) += d;
          return preference_loss(params, p, totals).loss;
        };
        const double fd = (bumped(h) - bumped(-h)) / (2 * h);
        const double analytic = side == 0 ? l.d_chosen_logp[i] : l.d_rejected_logp[i];
        INFO(name << " pair " << i << " side " << side);
        CHECK(std::fabs(fd - analytic) <= 1e-7 * std::max(1.0, std::fabs(analytic)));
      }
    }
  }
}

TEST_CASE("preference metrics follow TRL's rewards and count accuracies", "[preference]") {
  // pair 0: chosen gained over the reference, rejected lost: margin > 0; pair 1: the reverse
  std::vector<PreferencePair> pairs = {{-10, -20, 5, 5, -12, -18}, {-10, -20, 5, 5, -8, -22}};
  PreferenceParams dpo;
  dpo.beta = 0.5;
  const PreferenceMetrics m = preference_loss(dpo, pairs, {2, 10}).metrics;
  CHECK(m.pairs == 2);
  CHECK(m.rewards_chosen == Approx(0.5 * 2 + 0.5 * -2));
  CHECK(m.rewards_rejected == Approx(0.5 * -2 + 0.5 * 2));
  CHECK(m.rewards_margins == Approx(0.5 * 4 + 0.5 * -4));
  CHECK(m.accuracies == 1);
  CHECK(m.logps_chosen == -20);
  CHECK(m.logps_rejected == -40);
  PreferenceParams simpo;
  simpo.objective = PreferenceObjective::simpo;
  simpo.beta = 2;
  const PreferenceMetrics s = preference_loss(simpo, pairs, {2, 10}).metrics;
  CHECK(s.rewards_chosen == Approx(2 * (-2.0) * 2));  // β·s/n summed over the two pairs
  CHECK(s.accuracies == 2);
}

TEST_CASE("preference losses stay finite at extreme margins and reject a side with no tokens", "[preference]") {
  for (const char* name : {"dpo", "ipo", "simpo", "orpo"}) {
    PreferenceParams params;
    params.objective = preference_objective_parse(name);
    params.beta = 5;
    // margins of ±5000 nats (σ saturates), and a chosen side with certainty (mean log-prob 0)
    std::vector<PreferencePair> pairs = {{-1, -5000, 1, 1, 0, 0}, {-5000, -1, 1, 1, 0, 0}, {0, -3, 4, 4, 0, 0}};
    const PreferenceLoss l = preference_loss(params, pairs, {3, 6});
    INFO(name);
    CHECK(std::isfinite(l.loss));
    for (double d : l.d_chosen_logp) CHECK(std::isfinite(d));
    for (double d : l.d_rejected_logp) CHECK(std::isfinite(d));
  }
  PreferenceParams dpo;
  std::vector<PreferencePair> empty_side = {{-1, -2, 3, 0, 0, 0}};
  CHECK_THROWS_WITH(preference_loss(dpo, empty_side, {1, 3}), Catch::Contains("without a trained token"));
  CHECK_THROWS_AS(preference_objective_parse("kto"), Error);
  CHECK_THROWS_WITH(preference_objective_parse("kto"), Catch::Contains("train.objective must be \"dpo\", \"ipo\", \"simpo\" or \"orpo\""));
  CHECK(preference_needs_reference(PreferenceObjective::dpo));
  CHECK_FALSE(preference_needs_reference(PreferenceObjective::orpo));
  CHECK(preference_default_beta(PreferenceObjective::simpo) == 2.0);
}
