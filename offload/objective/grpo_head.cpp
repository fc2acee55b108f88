// The GRPO loss head (grpo_head.h): the micro-batch of completions, then the objective's two
// hooks — loss() between the head's stats pass and its backward, and the weighted chunk backward.
#include "offload/objective/grpo_head.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>

#include "models/model_spec.h"
#include "src/core/error.h"

namespace strata {

MicroBatch grpo_micro_batch(const std::vector<std::vector<int32_t>>& ids,
                            const std::vector<std::vector<int32_t>>& completion_mask) {
  STRATA_CHECK(!ids.empty(), "the GRPO batch has no rows");
  STRATA_CHECK(completion_mask.size() == ids.size(), "completion_mask has ", completion_mask.size(),
               " rows but input_ids has ", ids.size());
  size_t T = 0;
  for (size_t b = 0; b < ids.size(); ++b) {
    STRATA_CHECK(!ids[b].empty(), "input_ids row ", b, " is empty");
    STRATA_CHECK(completion_mask[b].size() == ids[b].size(), "completion_mask row ", b, " has ",
                 completion_mask[b].size(), " entries but input_ids row has ", ids[b].size());
    T = std::max(T, ids[b].size());
  }
  MicroBatch mb;
  mb.B = int64_t(ids.size());
  mb.T = int64_t(T);
  for (size_t b = 0; b < ids.size(); ++b) {
    const auto& row = ids[b];
    for (size_t t = 0; t < T; ++t) {
      if (t < row.size()) {
        const int32_t m = completion_mask[b][t];
        STRATA_CHECK(m == 0 || m == 1, "completion_mask[", b, "][", t, "] is ", m, "; use 0 or 1");
      }
      mb.ids.push_back(t < row.size() ? row[t] : 0);
      const bool counted = t + 1 < row.size() && completion_mask[b][t + 1] == 1;
      mb.targets.push_back(counted ? row[t + 1] : -100);
      mb.pos.push_back(int32_t(t));
    }
  }
  return mb;
}

std::vector<double> grpo_by_position(const std::vector<std::vector<double>>& per_token, int64_t cols) {
  std::vector<double> out(per_token.size() * size_t(cols), std::numeric_limits<double>::quiet_NaN());
  for (size_t b = 0; b < per_token.size(); ++b)
    for (size_t t = 1; t < per_token[b].size() && int64_t(t) <= cols; ++t)
      out[b * size_t(cols) + t - 1] = per_token[b][t];
  return out;
}

GrpoTemperature::GrpoTemperature(HostStore& store, double temperature) : store_(store) {
  STRATA_CHECK(temperature > 0, "GRPO temperature must be > 0 (got ", temperature, ")");
  if (temperature == 1) return;
  const size_t row = size_t(store.spec().final_norm);
  const TensorSpec& spec = store.working_table()[row];
  STRATA_ASSERT(spec.dtype == DType::f32, "the final norm's working copy is not f32");
  weight_ = static_cast<float*>(store.working_of(row));
  saved_.assign(weight_, weight_ + spec.numel());
  inv_t_ = float(1.0 / temperature);
  if (model_norm_plus_one(store.spec().config)) {  // Gemma: the norm scales by (1 + w): 1 + w' = (1 + w) / T
    for (float& w : std::span<float>(weight_, saved_.size())) w = (1.f + w) * inv_t_ - 1.f;
  } else {
    for (float& w : std::span<float>(weight_, saved_.size())) w *= inv_t_;
  }
}

void GrpoTemperature::restore() {
  if (weight_) std::copy(saved_.begin(), saved_.end(), weight_);
  weight_ = nullptr;
}

void GrpoTemperature::finish() {
  if (!weight_) return;
  restore();
  if (!store_.grad()) return;  // frozen (LoRA): no gradient of the norm
  float* g = store_.grad_of(size_t(store_.spec().final_norm));
  for (size_t i = 0; i < saved_.size(); ++i) g[i] *= inv_t_;
}

GrpoHead::GrpoHead(Device& dev, const GrpoParams& params, int64_t max_tokens, size_t max_group)
    : dev_(dev), params_(params), capacity_(max_tokens), max_group_(max_group) {
  STRATA_ASSERT(max_tokens > 0 && max_group > 0, "GRPO head without tokens");
  STRATA_CHECK(params.temperature > 0, "GRPO temperature must be > 0 (got ", params.temperature, ")");
  weight_dev_ = static_cast<float*>(dev_.alloc(bytes_of<float>(max_tokens * int64_t(max_group)), "grpo.token_weight"));
  ent_dev_ = static_cast<double*>(dev_.alloc(bytes_of<double>(max_tokens * int64_t(max_group)), "grpo.entropy"));
}

GrpoHead::~GrpoHead() {
  try {
    dev_.synchronize();  // no queued copy still reads the host buffers
  } catch (...) {  // reported on the caller's path
  }
  dev_.free(weight_dev_);
  dev_.free(ent_dev_);
}

void GrpoHead::set_layouts(std::vector<GrpoLayout> layouts, const std::vector<const MicroBatch*>& mbs) {
  STRATA_ASSERT(!layouts.empty() && layouts.size() <= max_group_ && layouts.size() == mbs.size(), "a pass of ",
                layouts.size(), " micro-batches on a GRPO head built for ", max_group_);
  passes_.clear();
  for (size_t m = 0; m < layouts.size(); ++m) {
    GrpoLayout& l = layouts[m];
    const MicroBatch& mb = *mbs[m];
    const size_t N = size_t(mb.B * mb.T);
    STRATA_ASSERT(l.rows == mb.B && l.cols == mb.T && int64_t(N) <= capacity_, "GRPO layout does not match its micro-batch");
    STRATA_CHECK(l.advantages.size() == size_t(mb.B), "the GRPO batch needs one advantage per row (", mb.B, "), got ",
                 l.advantages.size());
    STRATA_ASSERT(l.old_logp.empty() || l.old_logp.size() == N, "old log-probs of the wrong size");
    STRATA_ASSERT(l.ref_logp.empty() || l.ref_logp.size() == N, "reference log-probs of the wrong size");
    STRATA_CHECK(params_.beta == 0 || !l.ref_logp.empty(), "GRPO with beta > 0 needs reference log-probs "
                 "(ref_per_token_logps)");
    passes_.push_back({std::move(l), mb.targets, {}, {}, {}});
  }
}

void GrpoHead::set_layout(GrpoLayout layout, const MicroBatch& mb) {
  std::vector<GrpoLayout> one;
  one.push_back(std::move(layout));
  set_layouts(std::move(one), {&mb});
}

void GrpoHead::chunk_stats(double* stats, const HeadTensors& head, const void* w_chunk, DType w_type, int64_t v0,
                           int64_t vc, bool first, float* keep_logits, Device& dev, Stream s) {
  STRATA_ASSERT(head.m < max_group_ && head.n <= capacity_, "a GRPO stats pass beyond the head's buffers");
  dev.lm_head_ce_chunk_stats_entropy(stats, ent_dev_ + head.m * size_t(capacity_), head.h, w_chunk, w_type,
                                     head.targets, head.n, head.c, head.v, v0, vc, first, keep_logits, s);
}

// Between the stats pass and the backward: the statistics to the host (a synchronisation of the
// compute stream: the weights depend on them), the log-probs, the loss and its derivatives, the
// per-token weights back to the device, and the loss into *loss_sum.
void GrpoHead::loss(double* loss_sum, const HeadTensors& head, Device& dev, Stream s) {
  STRATA_CHECK(head.m < passes_.size(), "a GRPO objective needs the micro-batch's layout before the step");
  MicroBatchHead& mb = passes_[head.m];
  const GrpoLayout& l = mb.layout;
  const size_t N = size_t(head.n);
  STRATA_ASSERT(mb.targets.size() == N && int64_t(N) <= capacity_, "layout of ", mb.targets.size(),
                " tokens for a micro-batch of ", N);
  stats_host_.resize(3 * N);
  ent_host_.resize(N);
  dev.copy_d2h(stats_host_.data(), head.stats, bytes_of<double>(int64_t(3 * N)), s);
  dev.copy_d2h(ent_host_.data(), ent_dev_ + head.m * size_t(capacity_), bytes_of<double>(int64_t(N)), s);
  dev.stream_synchronize(s);

  mb.logp.assign(N, std::numeric_limits<double>::quiet_NaN());
  mb.entropy.assign(N, std::numeric_limits<double>::quiet_NaN());
  double entropy_sum = 0;  // counted tokens in row order
  std::vector<GrpoRow> rows(size_t(l.rows));
  for (int64_t b = 0; b < l.rows; ++b) {
    GrpoRow& r = rows[size_t(b)];
    r.advantage = l.advantages[size_t(b)];
    for (int64_t t = 0; t < l.cols; ++t) {
      const size_t i = size_t(b * l.cols + t);
      if (mb.targets[i] == -100) continue;
      const double* st = &stats_host_[3 * i];  // {max, Σ exp(z - max), z_target}
      const double lp = st[2] - st[0] - std::log(st[1]);
      mb.logp[i] = lp;
      mb.entropy[i] = std::log(st[1]) - ent_host_[i] / st[1];  // log Z - E_p[z], both relative to the max
      entropy_sum += mb.entropy[i];
      r.logp.push_back(lp);
      if (!l.old_logp.empty()) {
        STRATA_CHECK(std::isfinite(l.old_logp[i]), "old_per_token_logps row ", b, " entry ", t + 1,
                     " is not a finite number but the token counts");
        r.old_logp.push_back(l.old_logp[i]);
      }
      if (params_.beta != 0) {
        STRATA_CHECK(std::isfinite(l.ref_logp[i]), "ref_per_token_logps row ", b, " entry ", t + 1,
                     " is not a finite number but the token counts");
        r.ref_logp.push_back(l.ref_logp[i]);
      }
    }
  }
  mb.result = grpo_loss(params_, rows, l.totals);
  mb.result.metrics.entropy = entropy_sum;

  // w_i = -d loss / d logp_i (d logp / d z = onehot - softmax)
  weight_host_.assign(N, 0.f);
  for (int64_t b = 0; b < l.rows; ++b) {
    size_t k = 0;
    for (int64_t t = 0; t < l.cols; ++t) {
      const size_t i = size_t(b * l.cols + t);
      if (mb.targets[i] != -100) weight_host_[i] = float(-mb.result.d_logp[size_t(b)][k++]);
    }
  }
  dev.copy_h2d(weight_dev_ + head.m * size_t(capacity_), weight_host_.data(), bytes_of<float>(head.n), s);
  loss_host_ = mb.result.loss;
  dev.copy_h2d(loss_sum, &loss_host_, sizeof(double), s);  // the engine zeroed it: the sum is this loss
}

void GrpoHead::chunk_backward(float* dh, float* dw_chunk, const HeadTensors& head, const void* w_chunk, DType w_type,
                              int64_t v0, int64_t vc, float grad_scale, float* kept_logits, Device& dev, Stream s) {
  STRATA_ASSERT(head.m < passes_.size(), "a GRPO backward without its micro-batch's layout");
  dev.lm_head_ce_chunk_backward_weighted(dh, dw_chunk, head.h, w_chunk, w_type, head.stats, head.targets,
                                         weight_dev_ + head.m * size_t(capacity_), head.n, head.c, head.v, v0, vc,
                                         grad_scale, kept_logits, s);
}

}  // namespace strata
