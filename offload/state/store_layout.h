// The host store's plain data: its tables and parameter groups (computed from the spec alone),
// which arrays an optimizer needs, and the store's options. What the NVMe placement, the
// optimizers and the plan read of the store without the store itself (offload/state/host_store.h
// builds on it).
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "offload/modes.h"
#include "src/core/dtype.h"
#include "src/core/tensor.h"

namespace strata {

struct ParamGroup {
  std::string name;            // "embed", "layer.3", "head"
  size_t first_row = 0, end_row = 0;  // rows [first, end) of the spec's parameter table
  size_t working_offset = 0, working_bytes = 0;  // bytes in the working arena
  size_t f32_offset = 0, f32_bytes = 0;          // bytes in the f32 arenas
  // The group's bytes as the device computes on them (a layer slot's layout): the working
  // arena's own, unless the layer is stored packed (ModelSpec::base_quant) and dequantized there.
  size_t device_offset = 0, device_bytes = 0;
};

// The store's tables and groups, computed from the spec alone (nothing allocated).
// With a packed base (ModelSpec::base_quant.nf4) the working table's quantized rows are u8 rows
// of their packed bytes (offload/state/nf4_layout.h) and `device` is the table the device slots
// use (every row in its working dtype); otherwise device is the working table.
struct HostStoreLayout {
  TensorTable working, f32;
  std::vector<ParamGroup> groups;
  TensorTable device;
  bool packed = false;
};

// What the optimizer keeps per parameter beyond the working weights and the fp32 master: the
// store allocates, the plan counts and checkpoints carry these and nothing more.
struct OptimizerStateNeeds {
  bool moments = true;  // AdamW m and v
  bool grads = true;    // fp32 gradient accumulation (what a backward pass lands)
};

// The host optimizer of a run (optim.type; LoRA's adapters use AdamW on their own store).
enum class OptimizerKind : uint8_t { adamw, zo_sgd };
inline constexpr ModeSpelling<OptimizerKind> kOptimizerKinds[] = {{OptimizerKind::adamw, "adamw"},
                                                                  {OptimizerKind::zo_sgd, "zo-sgd"}};
constexpr ModeTable<OptimizerKind> mode_table(OptimizerKind) { return mode_table_of("optim.type", kOptimizerKinds); }
inline const char* optimizer_kind_name(OptimizerKind k) { return mode_name(k); }  // "adamw", "zo-sgd"

// AdamW: m, v and the fp32 gradient; ZO-SGD: the master alone (HostAdamW::kState,
// HostZoSgd::kState in offload/state/optimizer.h and zo_sgd.h are these).
constexpr OptimizerStateNeeds optimizer_state_needs(OptimizerKind k) {
  return k == OptimizerKind::adamw ? OptimizerStateNeeds{true, true} : OptimizerStateNeeds{false, false};
}

struct HostStoreOptions {
  OptimizerStateNeeds needs;   // which arrays exist (default: AdamW's)
  DType moments = DType::f32;  // AdamW m and v: f32 or bf16 (optim.moments_dtype), in RAM or on NVMe
  // Inference (strata generate): the working weights alone — no master, moments, gradients or
  // state placement. set_param writes the working copy, get_param reads it back as f32; nothing
  // may train on such a store (placement() asserts).
  bool weights_only = false;
  // The optimizer tier is NVMe: m, v (and master, unless it is the working copy) live in files
  // under a run folder of nvme_path (offload/state/nvme_state.h), read and written group by group.
  bool state_on_nvme = false;
  // With state_on_nvme: groups [nvme_first_group, groups) keep their state on NVMe, the groups
  // before it in RAM arrays covering only their prefix of the f32 arena (0: every group on NVMe).
  // The groups updated first (the lm_head, the last layers) are the ones on NVMe.
  size_t nvme_first_group = 0;
  std::string nvme_path;          // offload.nvme_path
  size_t nvme_budget_bytes = 0;   // offload.nvme_memory; 0: the free space of nvme_path minus 10%
  size_t nvme_block_bytes = 0;    // 0: 1 MiB (the I/O and checksum unit; tests use 4 KiB)
  size_t nvme_chunk_bytes = 0;    // 0: 64 MiB per array and buffer (a multiple of the block)
  int nvme_window = 3;            // buffers: one read ahead, one updated, one written back
  // offload.working_weights = "derived": the decoder layers whose fp32 master is in RAM keep no
  // working copy; each upload converts the master to the working dtype (round to nearest even,
  // what AdamW writes) into a pinned staging buffer first (offload/stream/weight_stream.h). The
  // same bits cross; 2 bytes a parameter less in RAM for bf16 weights. AdamW only (ZO-SGD
  // perturbs the working copy), one store per process, bf16 working weights.
  bool derived_working = false;
  // Each step's gradients are consumed group by group as they land (no clipping, one pass per
  // step, one rank: the update of a group is queued on the host right behind the last addition
  // into its gradient, and runs before the next group's first): then the fp32 gradient needs the
  // embedding's own rows (a tied lm_head adds into them all backward) and one slot that every
  // other group uses in turn, not the whole f32 arena. 4 bytes a parameter less in RAM.
  bool grads_in_flight = false;
};

// The fp32 gradient's bytes the store allocates: the whole f32 arena, or with grads_in_flight
// the embedding group's and one slot as large as the largest other group.
inline size_t grad_buffer_bytes(const HostStoreLayout& l, bool in_flight) {
  if (!in_flight) return l.f32.tier_bytes(Tier::host);
  size_t slot = 0;
  for (size_t g = 1; g < l.groups.size(); ++g) slot = std::max(slot, l.groups[g].f32_bytes);
  return l.groups[0].f32_offset + l.groups[0].f32_bytes + slot;
}

// The decoder layers [0, n) whose working copy is derived from the master at upload
// (HostStoreOptions::derived_working): every layer whose master is in RAM (before a split's NVMe
// groups), none without the option.
inline size_t derived_working_layers(const HostStoreLayout& l, const HostStoreOptions& o) {
  if (!o.derived_working || o.weights_only) return 0;
  const size_t layers = l.groups.size() - 2;
  if (!o.state_on_nvme) return layers;
  return o.nvme_first_group <= 1 ? 0 : std::min(layers, o.nvme_first_group - 1);
}

// The working bytes of layers [0, n): what a derived working copy leaves out of RAM.
inline size_t derived_working_bytes(const HostStoreLayout& l, size_t n) {
  return n == 0 ? 0 : l.groups[n].working_offset + l.groups[n].working_bytes - l.groups[1].working_offset;
}

// The pinned staging a derived working copy converts into before each upload: two buffers (one
// filled while the other's copy is in flight), each as large as the largest derived layer.
inline constexpr size_t kDerivedStagingBuffers = 2;
inline size_t derived_staging_bytes(const HostStoreLayout& l, size_t n) {
  size_t largest = 0;
  for (size_t layer = 0; layer < n; ++layer) largest = std::max(largest, l.groups[1 + layer].working_bytes);
  return kDerivedStagingBuffers * largest;
}

// The f32 arena's bytes before group `first_group`, [0, groups[first_group].f32_offset): what the
// RAM arrays of a split optimizer state cover (0 for the first group; the whole arena past the
// last).
inline size_t f32_prefix_bytes(const HostStoreLayout& l, size_t first_group) {
  return first_group < l.groups.size() ? l.groups[first_group].f32_offset : l.f32.tier_bytes(Tier::host);
}

// The f32 arena's bytes whose master (unless it is the working copy) and moments the store keeps
// in RAM arrays: all of it, or with state_on_nvme the prefix before nvme_first_group. The NVMe
// part is nvme_state_sizes (offload/state/nvme_state.h).
inline size_t state_ram_f32_bytes(const HostStoreLayout& l, const HostStoreOptions& o) {
  return o.state_on_nvme ? f32_prefix_bytes(l, o.nvme_first_group) : l.f32.tier_bytes(Tier::host);
}

}  // namespace strata
