#include "offload/objective/preference_loss.h"

#include <algorithm>
#include <cmath>

#include "src/core/error.h"

namespace strata {
namespace {

// log σ(z) = -softplus(-z), without overflow for large |z|.
double log_sigmoid(double z) { return -(std::max(-z, 0.0) + std::log1p(std::exp(-std::fabs(z)))); }

// σ(-z) = 1 - σ(z) = -d/dz log σ(z).
double sigmoid_neg(double z) {
  if (z >= 0) {
    const double e = std::exp(-z);
    return e / (1 + e);
  }
  return 1 / (1 + std::exp(z));
}

// log(1 - e^x) for x <= 0 (a mean log-prob), accurate on both sides of -ln 2. A mean of exactly
// 0 (every token certain) is moved just below it so the log stays finite.
double log1m_exp(double x) {
  x = std::min(x, -1e-30);
  return x > -0.6931471805599453 ? std::log(-std::expm1(x)) : std::log1p(-std::exp(x));
}

}  // namespace

bool preference_needs_reference(PreferenceObjective objective) {
  return objective == PreferenceObjective::dpo || objective == PreferenceObjective::ipo;
}

double preference_default_beta(PreferenceObjective objective) {
  return objective == PreferenceObjective::simpo ? 2.0 : 0.1;
}

void PreferenceMetrics::add(const PreferenceMetrics& o) {
  rewards_chosen += o.rewards_chosen;
  rewards_rejected += o.rewards_rejected;
  rewards_margins += o.rewards_margins;
  accuracies += o.accuracies;
  logps_chosen += o.logps_chosen;
  logps_rejected += o.logps_rejected;
  pairs += o.pairs;
}

PreferenceLoss preference_loss(const PreferenceParams& params, const std::vector<PreferencePair>& pairs,
                               const PreferenceStepTotals& totals) {
  STRATA_ASSERT(totals.pairs >= int64_t(pairs.size()) && totals.pairs > 0, "step totals below the batch");
  const double beta = params.beta, P = double(totals.pairs);
  PreferenceLoss out;
  out.d_chosen_logp.resize(pairs.size());
  out.d_rejected_logp.resize(pairs.size());
  if (params.objective == PreferenceObjective::orpo)
    STRATA_ASSERT(totals.chosen_tokens > 0, "orpo needs the step's chosen token count");
  for (size_t i = 0; i < pairs.size(); ++i) {
    const PreferencePair& p = pairs[i];
    STRATA_CHECK(p.chosen_tokens > 0 && p.rejected_tokens > 0, "preference pair ", i,
                 " has a side without a trained token (", p.chosen_tokens, " chosen, ", p.rejected_tokens,
                 " rejected): every chosen and rejected response needs at least one label");
    const double sc = p.chosen_logp, sr = p.rejected_logp;
    const double nc = double(p.chosen_tokens), nr = double(p.rejected_tokens);
    double loss = 0, dc = 0, dr = 0, reward_c = 0, reward_r = 0;
    switch (params.objective) {
      case PreferenceObjective::dpo: {
        const double z = beta * ((sc - sr) - (p.ref_chosen_logp - p.ref_rejected_logp));
        loss = -log_sigmoid(z) / P;
        dc = -beta * sigmoid_neg(z) / P;
        dr = -dc;
        reward_c = beta * (sc - p.ref_chosen_logp);
        reward_r = beta * (sr - p.ref_rejected_logp);
        break;
      }
      case PreferenceObjective::ipo: {
        const double h = (sc / nc - sr / nr) - (p.ref_chosen_logp / nc - p.ref_rejected_logp / nr);
        const double e = h - 1 / (2 * beta);
        loss = e * e / P;
        dc = 2 * e / nc / P;
        dr = -2 * e / nr / P;
        reward_c = beta * (sc - p.ref_chosen_logp);
        reward_r = beta * (sr - p.ref_rejected_logp);
        break;
      }
      case PreferenceObjective::simpo: {
        const double z = beta * (sc / nc - sr / nr) - params.gamma;
        loss = -log_sigmoid(z) / P;
        dc = -beta * sigmoid_neg(z) / nc / P;
        dr = beta * sigmoid_neg(z) / nr / P;
        reward_c = beta * sc / nc;
        reward_r = beta * sr / nr;
        break;
      }
      case PreferenceObjective::orpo: {
        const double mc = sc / nc, mr = sr / nr;
        const double lo = (mc - mr) - (log1m_exp(mc) - log1m_exp(mr));
        const double Nc = double(totals.chosen_tokens);
        loss = -sc / Nc - beta * log_sigmoid(lo) / P;
        // d lo / d mc = 1 / (1 - e^mc) and d lo / d mr = -1 / (1 - e^mr); -expm1 keeps it exact.
        const double g = -beta * sigmoid_neg(lo) / P;  // d loss / d lo
        dc = -1 / Nc + g / -std::expm1(std::min(mc, -1e-30)) / nc;
        dr = -g / -std::expm1(std::min(mr, -1e-30)) / nr;
        reward_c = beta * mc;
        reward_r = beta * mr;
        break;
      }
    }
    out.loss += loss;
    out.d_chosen_logp[i] = dc;
    out.d_rejected_logp[i] = dr;
    PreferenceMetrics& m = out.metrics;
    m.rewards_chosen += reward_c;
    m.rewards_rejected += reward_r;
    m.rewards_margins += reward_c - reward_r;
    m.accuracies += reward_c > reward_r ? 1 : 0;
    m.logps_chosen += sc;
    m.logps_rejected += sr;
    m.pairs += 1;
  }
  return out;
}

}  // namespace strata
