#include "offload/optimizer.h"

#include <algorithm>
#include <cstring>

#include "offload/zo_sgd.h"
#include "src/core/error.h"

namespace strata {

const char* state_array_name(StateArray a) {
  switch (a) {
    case StateArray::master: return "master";
    case StateArray::m: return "exp_avg";
    case StateArray::v: return "exp_avg_sq";
  }
  return "?";
}

char* RamStatePlacement::array(StateArray a) const {
  switch (a) {
    case StateArray::master: return reinterpret_cast<char*>(store_.master());
    case StateArray::m: return static_cast<char*>(store_.m());
    case StateArray::v: return static_cast<char*>(store_.v());
  }
  return nullptr;
}

std::vector<StateRange> RamStatePlacement::ranges(size_t group) const {
  const ParamGroup& g = store_.groups()[group];
  return {StateRange{g.f32_offset, g.f32_offset + g.f32_bytes}};
}

GroupState RamStatePlacement::acquire(size_t group, size_t range) {
  STRATA_ASSERT(range == 0);
  const size_t first = count_of<float>(store_.groups()[group].f32_offset);
  const size_t mb = store_.state_elem_bytes(StateArray::m);
  auto at = [&](void* a) -> void* { return a ? static_cast<char*>(a) + first * mb : nullptr; };  // absent for ZO-SGD
  return {store_.master() + first, at(store_.m()), at(store_.v())};
}

void RamStatePlacement::read(StateArray a, size_t offset, void* dst, size_t bytes) {
  std::memcpy(dst, array(a) + offset, bytes);
}

void RamStatePlacement::write(StateArray a, size_t offset, const void* src, size_t bytes) {
  std::memcpy(array(a) + offset, src, bytes);
}

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

OptimizerStateNeeds optimizer_state_needs(const std::string& optim_type) {
  if (optim_type == "adamw") return HostAdamW::kState;
  STRATA_CHECK(optim_type == "zo-sgd", "optim.type must be \"adamw\" or \"zo-sgd\", not \"", optim_type, "\"");
  return HostZoSgd::kState;
}

}  // namespace strata
