#include "offload/state/optimizer.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include <omp.h>

#include "src/core/error.h"

namespace strata {

namespace {
// The seed of bf16 moments' stochastic rounding (any constant: the keys also mix step and row).
constexpr uint64_t kMomentRoundSeed = 0x5354524154414d31ull;

// memcpy over the kernels' threads (the backup copies run at memory bandwidth, as AdamW does):
// 1 MiB pieces, each copied whole by one thread.
void copy_parallel(char* dst, const char* src, size_t bytes) {
  constexpr size_t kPiece = size_t(1) << 20;
  if (bytes <= kPiece || omp_get_max_threads() == 1) {
    std::memcpy(dst, src, bytes);
    return;
  }
  const int64_t pieces = int64_t((bytes + kPiece - 1) / kPiece);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < pieces; ++i) {
    const size_t at = size_t(i) * kPiece;
    std::memcpy(dst + at, src + at, std::min(kPiece, bytes - at));
  }
}
}  // namespace

void HostAdamW::update(size_t group, const AdamWParams& hyper, double weight_decay) {
  step_rows(group, hyper, weight_decay);
  commit(group);
}

void HostAdamW::step_rows(size_t group, const AdamWParams& hyper, double weight_decay) {
  const TensorTable& wt = store_.working_table();
  const bool in_place = store_.master_is_working();
  const DType moments = store_.moments_dtype();
  AdamWParams p = hyper;
  p.stochastic_round = moments == DType::bf16;
  for_each_row_piece(store_, placement_, group, [&](const RowPiece& pc) {
    const size_t r = pc.row;
    // no working copy to write: the f32 master is it, or it is derived at upload (offload.working_weights)
    char* working = in_place || store_.row_derived(r) ? nullptr
                                                      : static_cast<char*>(store_.working_of(r)) + pc.first * dtype_size(wt[r].dtype);
    p.weight_decay = wt[r].shape.size() == 2 ? weight_decay : 0.0;  // no decay on norms, biases
    if (p.stochastic_round) {
      adamw_round_keys(kMomentRoundSeed, hyper.step, r, p.round_key_m, p.round_key_v);
      p.round_counter = uint32_t(pc.first);  // mod 2^32: still a pure function of (row, element)
    }
    adamw_update_isa(adamw_isa_active(), pc.state.master, pc.state.m, pc.state.v, moments, store_.grad_of(r) + pc.first,
                     working, wt[r].dtype, pc.n, p);
  });
}

// ---- speculation ----------------------------------------------------------------------------

// Sized by the group's f32 span (its rows and the alignment between them), as the plan counts it.
size_t HostAdamW::speculation_backup_bytes(const HostStore& store, size_t group) {
  const size_t n = count_of<float>(store.groups()[group].f32_bytes);
  return n * (sizeof(float) + 2 * store.state_elem_bytes(StateArray::m));  // master, m, v
}

void HostAdamW::copy_state(size_t group, char* backup, bool save) {
  const size_t mb = store_.state_elem_bytes(StateArray::m);
  char* at = backup;
  for_each_row_piece(store_, placement_, group, [&](const RowPiece& pc) {
    const std::pair<void*, size_t> arrays[] = {{pc.state.master, sizeof(float)}, {pc.state.m, mb}, {pc.state.v, mb}};
    for (const auto& [array, elem] : arrays) {
      STRATA_ASSERT(array, "speculation needs master, m and v of every row (AdamW's state in RAM)");
      const size_t bytes = size_t(pc.n) * elem;
      if (save) copy_parallel(at, static_cast<const char*>(array), bytes);
      else copy_parallel(static_cast<char*>(array), at, bytes);
      at += bytes;
    }
  });
  STRATA_ASSERT(size_t(at - backup) <= speculation_backup_bytes(store_, group), "the speculation backup of group ",
                group, " is smaller than its walk copies");
}

void HostAdamW::speculate(size_t group, const AdamWParams& hyper, double weight_decay, char* backup) {
  STRATA_ASSERT(hyper.clip_scale == 1.0, "a speculative update runs before the norm: clip scale 1");
  copy_state(group, backup, true);
  step_rows(group, hyper, weight_decay);  // the gradient stays for a redo
}

void HostAdamW::commit(size_t group) {
  const ParamGroup& g = store_.groups()[group];
  std::memset(store_.group_grad(group), 0, g.f32_bytes);  // consumed (with gradients in flight: the slot is free)
}

void HostAdamW::redo(size_t group, const AdamWParams& hyper, double weight_decay, const char* backup) {
  copy_state(group, const_cast<char*>(backup), false);
  update(group, hyper, weight_decay);
}

}  // namespace strata
