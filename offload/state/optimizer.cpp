#include "offload/state/optimizer.h"

#include <algorithm>
#include <cstring>

#include "src/core/error.h"

namespace strata {

namespace {
// The seed of bf16 moments' stochastic rounding (any constant: the keys also mix step and row).
constexpr uint64_t kMomentRoundSeed = 0x5354524154414d31ull;
}  // namespace

void HostAdamW::update(size_t group, const AdamWParams& hyper, double weight_decay) {
  const ParamGroup& g = store_.groups()[group];
  const TensorTable& wt = store_.working_table();
  const bool in_place = store_.master_is_working();
  const DType moments = store_.moments_dtype();
  AdamWParams p = hyper;
  p.stochastic_round = moments == DType::bf16;
  for_each_row_piece(store_, placement_, group, [&](const RowPiece& pc) {
    const size_t r = pc.row;
    char* working = in_place ? nullptr : static_cast<char*>(store_.working_of(r)) + pc.first * dtype_size(wt[r].dtype);
    p.weight_decay = wt[r].shape.size() == 2 ? weight_decay : 0.0;  // no decay on norms, biases
    if (p.stochastic_round) {
      adamw_round_keys(kMomentRoundSeed, hyper.step, r, p.round_key_m, p.round_key_v);
      p.round_counter = uint32_t(pc.first);  // mod 2^32: still a pure function of (row, element)
    }
    adamw_update_isa(adamw_isa_active(), pc.state.master, pc.state.m, pc.state.v, moments, store_.grad_of(r) + pc.first,
                     working, wt[r].dtype, pc.n, p);
  });
  std::memset(store_.grad() + count_of<float>(g.f32_offset), 0, g.f32_bytes);  // consumed
}

}  // namespace strata
