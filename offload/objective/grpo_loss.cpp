// The GRPO losses and their derivatives (grpo_loss.h), in double, token by token in row order.
#include "offload/objective/grpo_loss.h"

#include <algorithm>
#include <cmath>

#include "src/core/error.h"

namespace strata {

GrpoLossType grpo_loss_type_parse(const std::string& name) {
  if (name == "grpo") return GrpoLossType::grpo;
  if (name == "bnpo") return GrpoLossType::bnpo;
  if (name == "dr_grpo") return GrpoLossType::dr_grpo;
  if (name == "dapo") return GrpoLossType::dapo;
  STRATA_CHECK(false, "unknown GRPO loss_type \"", name, "\"; use grpo, bnpo, dr_grpo or dapo");
  return GrpoLossType::dapo;
}

const char* grpo_loss_type_name(GrpoLossType t) {
  switch (t) {
    case GrpoLossType::grpo: return "grpo";
    case GrpoLossType::bnpo: return "bnpo";
    case GrpoLossType::dr_grpo: return "dr_grpo";
    case GrpoLossType::dapo: return "dapo";
  }
  return "?";
}

namespace {

// One token: its loss l and d l / d logp (torch's subgradients of min and clamp).
struct TokenLoss {
  double l = 0, dl = 0, kl = 0;
  bool clip_low = false, clip_high = false;
};

TokenLoss grpo_token(const GrpoParams& p, double a, double logp, double old, double ref) {
  TokenLoss t;
  const double lo = 1 - p.epsilon, hi = 1 + p.epsilon_high;
  const double c1 = std::exp(logp - old);             // d c1 / d logp = c1
  const double c2 = std::clamp(c1, lo, hi);
  const double in_range = (c1 >= lo && c1 <= hi) ? 1.0 : 0.0;  // clamp passes the gradient
  const double l1 = c1 * a, l2 = c2 * a;
  // torch.min(l1, l2): the gradient to the smaller, split evenly on a tie
  const double g1 = l1 < l2 ? 1.0 : (l1 == l2 ? 0.5 : 0.0);
  t.l = -std::min(l1, l2);
  t.dl = -(g1 * a * c1 + (1 - g1) * a * c1 * in_range);
  t.clip_low = c1 < lo && a < 0;
  t.clip_high = c1 > hi && a > 0;
  if (p.beta != 0) {
    const double d = ref - logp;
    t.kl = std::exp(d) - d - 1;
    t.l += p.beta * t.kl;
    t.dl += p.beta * (1 - std::exp(d));
  }
  return t;
}

}  // namespace

GrpoLoss grpo_loss(const GrpoParams& p, const std::vector<GrpoRow>& rows, const GrpoStepTotals& totals) {
  STRATA_ASSERT(!rows.empty() && totals.micro_batches >= 1, "a GRPO micro-batch without rows");
  STRATA_CHECK(p.temperature > 0, "GRPO temperature must be > 0 (got ", p.temperature, ")");
  STRATA_CHECK(p.loss_type != GrpoLossType::dr_grpo || p.max_completion_length > 0,
               "loss_type dr_grpo needs max_completion_length > 0 (its constant denominator)");
  GrpoLoss out;
  out.d_logp.resize(rows.size());
  int64_t mb_tokens = 0;
  for (const GrpoRow& r : rows) mb_tokens += int64_t(r.logp.size());
  const double accum = double(totals.micro_batches);
  const double R = double(rows.size());
  for (size_t b = 0; b < rows.size(); ++b) {
    const GrpoRow& r = rows[b];
    const size_t n = r.logp.size();
    STRATA_ASSERT(r.old_logp.empty() || r.old_logp.size() == n, "old log-probs do not match row ", b);
    STRATA_CHECK(p.beta == 0 || r.ref_logp.size() == n, "GRPO with beta > 0 needs the reference log-probs of "
                 "every completion token (row ", b, " has ", r.ref_logp.size(), " for ", n, " tokens)");
    // the factor of this row's tokens in the micro-batch's loss
    double scale = 0;
    switch (p.loss_type) {
      case GrpoLossType::grpo: scale = 1.0 / (std::max(1.0, double(n)) * R * accum); break;
      case GrpoLossType::bnpo: scale = 1.0 / (std::max(1.0, double(mb_tokens)) * accum); break;
      case GrpoLossType::dr_grpo: scale = 1.0 / (R * double(p.max_completion_length) * accum); break;
      case GrpoLossType::dapo: scale = 1.0 / std::max(1.0, double(totals.tokens)); break;
    }
    double row_sum = 0;
    out.d_logp[b].resize(n);
    for (size_t t = 0; t < n; ++t) {
      const double old = r.old_logp.empty() ? r.logp[t] : r.old_logp[t];
      const double ref = p.beta != 0 ? r.ref_logp[t] : 0.0;
      const TokenLoss tl = grpo_token(p, r.advantage, r.logp[t], old, ref);
      row_sum += tl.l;
      out.d_logp[b][t] = tl.dl * scale;
      out.metrics.clip_low += tl.clip_low;
      out.metrics.clip_high += tl.clip_high;
      out.metrics.clip_region += tl.clip_low || tl.clip_high;
      out.metrics.kl += tl.kl;
    }
    out.loss += row_sum * scale;
    out.metrics.tokens += int64_t(n);
  }
  return out;
}

}  // namespace strata
