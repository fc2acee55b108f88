// The host store's plain data: its tables and parameter groups (computed from the spec alone),
// which arrays an optimizer needs, and the store's options. What the NVMe placement, the
// optimizers and the plan read of the store without the store itself (offload/state/host_store.h
// builds on it).
#pragma once
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
};

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
