// The preference loss head (preference_head.h): layout of pairs in a micro-batch, then the
// objective's two hooks — loss() between the head's stats pass and its backward, and the
// weighted chunk backward.
#include "offload/objective/preference_head.h"

#include <algorithm>
#include <cmath>

#include "src/core/error.h"

namespace strata {

MicroBatch preference_micro_batch(const std::vector<std::vector<int32_t>>& chosen_ids,
                                  const std::vector<std::vector<int32_t>>& chosen_labels,
                                  const std::vector<std::vector<int32_t>>& rejected_ids,
                                  const std::vector<std::vector<int32_t>>& rejected_labels,
                                  PreferenceLayout* layout) {
  const size_t P = chosen_ids.size();
  STRATA_CHECK(P > 0, "the preference batch has no pairs");
  STRATA_CHECK(rejected_ids.size() == P && chosen_labels.size() == P && rejected_labels.size() == P,
               "the preference batch needs as many rows in chosen_input_ids (", P, "), chosen_labels (",
               chosen_labels.size(), "), rejected_input_ids (", rejected_ids.size(), ") and rejected_labels (",
               rejected_labels.size(), ")");
  size_t T = 0;
  for (size_t i = 0; i < P; ++i) {
    STRATA_CHECK(!chosen_ids[i].empty() && !rejected_ids[i].empty(), "pair ", i, " has an empty sequence");
    STRATA_CHECK(chosen_labels[i].size() == chosen_ids[i].size(), "chosen_labels row ", i, " has ",
                 chosen_labels[i].size(), " entries but chosen_input_ids row has ", chosen_ids[i].size());
    STRATA_CHECK(rejected_labels[i].size() == rejected_ids[i].size(), "rejected_labels row ", i, " has ",
                 rejected_labels[i].size(), " entries but rejected_input_ids row has ", rejected_ids[i].size());
    T = std::max({T, chosen_ids[i].size(), rejected_ids[i].size()});
  }
  MicroBatch mb;
  mb.B = int64_t(2 * P);
  mb.T = int64_t(T);
  layout->seq.clear();
  layout->num_seqs = mb.B;
  layout->chosen.resize(P);
  layout->rejected.resize(P);
  for (size_t b = 0; b < 2 * P; ++b) {
    const bool chosen = b < P;
    const auto& row = chosen ? chosen_ids[b] : rejected_ids[b - P];
    const auto& lab = chosen ? chosen_labels[b] : rejected_labels[b - P];
    for (size_t t = 0; t < T; ++t) {
      const bool real = t < row.size();
      mb.ids.push_back(real ? row[t] : 0);
      mb.targets.push_back(t + 1 < row.size() ? lab[t + 1] : -100);
      mb.pos.push_back(int32_t(t));
      layout->seq.push_back(real ? int32_t(b) : -1);
    }
    (chosen ? layout->chosen[b] : layout->rejected[b - P]) = int32_t(b);
  }
  return mb;
}

PreferenceStepTotals preference_layout_totals(const MicroBatch& mb, const PreferenceLayout& layout) {
  STRATA_ASSERT(layout.seq.size() == mb.targets.size(), "layout and micro-batch differ in size");
  std::vector<char> is_chosen(size_t(layout.num_seqs), 0);
  for (int32_t q : layout.chosen) is_chosen[size_t(q)] = 1;
  PreferenceStepTotals t;
  t.pairs = int64_t(layout.chosen.size());
  for (size_t i = 0; i < mb.targets.size(); ++i)
    if (mb.targets[i] != -100 && layout.seq[i] >= 0 && is_chosen[size_t(layout.seq[i])]) ++t.chosen_tokens;
  return t;
}

PreferenceHead::PreferenceHead(Device& dev, const PreferenceParams& params, int64_t max_tokens, size_t max_group)
    : dev_(dev), params_(params), capacity_(max_tokens), max_group_(max_group) {
  STRATA_ASSERT(max_tokens > 0 && max_group > 0, "preference head without tokens");
  try {
    seq_dev_ = static_cast<int32_t*>(dev_.alloc(bytes_of<int32_t>(max_tokens), "preference.seq"));
    weight_dev_ = static_cast<float*>(dev_.alloc(bytes_of<float>(max_tokens * int64_t(max_group)),
                                                 "preference.token_weight"));
    sums_dev_ = static_cast<double*>(dev_.alloc(bytes_of<double>(2 * max_tokens), "preference.seq_sums"));
  } catch (...) {
    if (seq_dev_) dev_.free(seq_dev_);
    if (weight_dev_) dev_.free(weight_dev_);
    throw;
  }
}

PreferenceHead::~PreferenceHead() {
  try {
    dev_.synchronize();  // no queued copy still reads the host buffers or writes these
  } catch (...) {  // reported on the caller's path
  }
  dev_.free(seq_dev_);
  dev_.free(weight_dev_);
  dev_.free(sums_dev_);
}

void PreferenceHead::set_layouts(std::vector<PreferenceLayout> layouts) {
  STRATA_ASSERT(!layouts.empty() && layouts.size() <= max_group_, "a pass of ", layouts.size(),
                " micro-batches on a preference head built for ", max_group_);
  passes_.clear();
  for (PreferenceLayout& layout : layouts) {
    STRATA_ASSERT(layout.chosen.size() == layout.rejected.size() && !layout.chosen.empty(), "pairs without sides");
    STRATA_ASSERT(layout.ref_chosen.size() == layout.ref_rejected.size() &&
                      (layout.ref_chosen.empty() || layout.ref_chosen.size() == layout.chosen.size()),
                  "reference sums do not match the pairs");
    STRATA_ASSERT(layout.num_seqs > 0 && layout.num_seqs <= capacity_, "sequence count outside the head's buffers");
    passes_.push_back({std::move(layout), {}, {}});
  }
}

void PreferenceHead::set_layout(PreferenceLayout layout) {
  std::vector<PreferenceLayout> one;
  one.push_back(std::move(layout));
  set_layouts(std::move(one));
}

// Between the stats pass and the backward: s, n per sequence to the host (a synchronisation of
// the compute stream: the loss's weights depend on them), then the pairs' loss and derivatives,
// the per-token weights back to the device, and this micro-batch's loss into *loss_sum.
void PreferenceHead::loss(double* loss_sum, const HeadTensors& head, Device& dev, Stream s) {
  STRATA_CHECK(head.m < passes_.size(), "a preference objective needs the micro-batch's pair layout before the step");
  MicroBatchHead& mb = passes_[head.m];
  const PreferenceLayout& layout = mb.layout;
  std::vector<PreferencePair>& pairs = mb.pairs;
  STRATA_ASSERT(int64_t(layout.seq.size()) == head.n && head.n <= capacity_, "layout of ", layout.seq.size(),
                " tokens for a micro-batch of ", head.n);
  const int64_t S = layout.num_seqs;
  dev.copy_h2d(seq_dev_, layout.seq.data(), bytes_of<int32_t>(head.n), s);
  dev.lm_head_ce_stats_seq_sums(sums_dev_, head.stats, head.targets, seq_dev_, head.n, head.v, S, s);
  sums_host_.resize(size_t(2 * S));
  dev.copy_d2h(sums_host_.data(), sums_dev_, bytes_of<double>(2 * S), s);
  dev.stream_synchronize(s);

  const size_t P = layout.chosen.size();
  const bool own_ref = layout.ref_chosen.empty();
  pairs.assign(P, PreferencePair{});
  for (size_t i = 0; i < P; ++i) {
    PreferencePair& p = pairs[i];
    const size_t c = size_t(layout.chosen[i]), r = size_t(layout.rejected[i]);
    p.chosen_logp = sums_host_[2 * c];
    p.rejected_logp = sums_host_[2 * r];
    p.chosen_tokens = int64_t(sums_host_[2 * c + 1]);
    p.rejected_tokens = int64_t(sums_host_[2 * r + 1]);
    p.ref_chosen_logp = own_ref ? p.chosen_logp : layout.ref_chosen[i];
    p.ref_rejected_logp = own_ref ? p.rejected_logp : layout.ref_rejected[i];
  }
  const PreferenceLoss& result = mb.result = preference_loss(params_, pairs, layout.totals);

  // w_t = -d loss / d s of the token's sequence (d s / d logits = onehot - softmax)
  std::vector<double> d_seq(size_t(S), 0.0);
  for (size_t i = 0; i < P; ++i) {
    d_seq[size_t(layout.chosen[i])] = result.d_chosen_logp[i];
    d_seq[size_t(layout.rejected[i])] = result.d_rejected_logp[i];
  }
  weight_host_.resize(size_t(head.n));
  for (size_t t = 0; t < weight_host_.size(); ++t) {
    const int32_t q = layout.seq[t];
    weight_host_[t] = q < 0 ? 0.f : float(-d_seq[size_t(q)]);
  }
  // the next loss() synchronises the stream before it rewrites weight_host_ or loss_host_
  dev.copy_h2d(weight_dev_ + head.m * size_t(capacity_), weight_host_.data(), bytes_of<float>(head.n), s);
  loss_host_ = result.loss;
  dev.copy_h2d(loss_sum, &loss_host_, sizeof(double), s);  // the engine zeroed it: the sum is this loss
}

void PreferenceHead::chunk_backward(float* dh, float* dw_chunk, const HeadTensors& head, const void* w_chunk,
                                    DType w_type, int64_t v0, int64_t vc, float grad_scale, float* kept_logits,
                                    Device& dev, Stream s) {
  STRATA_ASSERT(head.m < passes_.size(), "a preference backward without its micro-batch's layout");
  dev.lm_head_ce_chunk_backward_weighted(dh, dw_chunk, head.h, w_chunk, w_type, head.stats, head.targets,
                                         weight_dev_ + head.m * size_t(capacity_), head.n, head.c, head.v, v0, vc,
                                         grad_scale, kept_logits, s);
}

}  // namespace strata
