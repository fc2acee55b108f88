// The host parameter store (DESIGN §2): the authoritative state of every parameter, laid out
// group by group (embedding, each decoder layer, the head) so one layer is one contiguous
// block in every array:
//   working  the device-dtype copy that is streamed (bf16 or f32), pinned    (working table)
//   master   fp32 master weights                                              (f32 table)
//   m, v     AdamW moments, fp32                                              (f32 table)
//   grad     fp32 gradient accumulation, pinned (it receives device copies)   (f32 table)
// Sizes are accounted per tier (a pinned allocation that fell back to pageable memory counts
// as host, not pinned); on a machine with several NUMA nodes the arrays are interleaved across
// them (one node: said once, and nothing else changes). estimate() gives the same tiers' bytes
// from the spec alone, before anything is allocated (offload/host_budget.h checks them).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "models/model_spec.h"
#include "src/device/device.h"

namespace strata {

struct ParamGroup {
  std::string name;            // "embed", "layer.3", "head"
  size_t first_row = 0, end_row = 0;  // rows [first, end) of the spec's parameter table
  size_t working_offset = 0, working_bytes = 0;  // bytes in the working arena
  size_t f32_offset = 0, f32_bytes = 0;          // bytes in the f32 arenas
};

// The store's tables and groups, computed from the spec alone (nothing allocated).
struct HostStoreLayout {
  TensorTable working, f32;
  std::vector<ParamGroup> groups;
};

struct HostStoreOptions {
  DType moments = DType::f32;  // AdamW m and v; the store allocates f32 (bf16 is for estimates)
};

// Host bytes per tier, as the store and the step engine will allocate them.
struct HostMemoryEstimate {
  size_t working = 0;      // pinned: the device-dtype working weights (what is streamed)
  size_t master = 0;       // fp32 master weights
  size_t moments = 0;      // AdamW m and v
  size_t grads = 0;        // pinned: fp32 gradient accumulation
  size_t staging = 0;      // pinned: the engine's activation and gradient staging
  size_t checkpoints = 0;  // pinned: layer inputs spilled from the device (upper bound)
  size_t total() const { return working + master + moments + grads + staging + checkpoints; }
};

class HostStore {
 public:
  static HostStoreLayout layout(const ModelSpec& spec);
  // The store's own tiers (working, master, moments, grads); staging and checkpoints are the
  // engine's (Engine::host_staging) and stay 0 here.
  static HostMemoryEstimate estimate(const ModelSpec& spec, const HostStoreOptions& options);

  HostStore(Device& dev, const ModelSpec& spec);
  // The store in memory the caller owns, e.g. POSIX shared memory the ranks of one node map
  // (src/train/shared_store.h): shared_bytes(spec) bytes, page aligned, zero filled; nothing is
  // allocated or cleared here (another rank may already have loaded weights into it).
  HostStore(Device& dev, const ModelSpec& spec, void* shared);
  static size_t shared_bytes(const ModelSpec& spec);
  ~HostStore();
  HostStore(const HostStore&) = delete;
  HostStore& operator=(const HostStore&) = delete;

  const ModelSpec& spec() const { return spec_; }
  const TensorTable& working_table() const { return working_; }  // device dtypes
  const TensorTable& f32_table() const { return f32_; }
  const std::vector<ParamGroup>& groups() const { return groups_; }
  const ParamGroup& layer_group(size_t layer) const { return groups_[1 + layer]; }
  const ParamGroup& embed_group() const { return groups_.front(); }
  const ParamGroup& head_group() const { return groups_.back(); }

  char* working() { return working_data_; }
  float* master() { return master_; }
  float* m() { return m_; }
  float* v() { return v_; }
  float* grad() { return grad_; }
  size_t f32_floats() const { return f32_.tier_bytes(Tier::host) / 4; }

  float* master_of(size_t row) { return master_ + f32_[row].offset / 4; }
  float* grad_of(size_t row) { return grad_ + f32_[row].offset / 4; }
  void* working_of(size_t row) { return working_data_ + working_[row].offset; }

  // Values of one parameter as f32 (set writes master and the working copy).
  void set_param(size_t row, const float* values);
  void get_param(size_t row, float* values) const;

  size_t pinned_bytes() const { return pinned_bytes_; }  // working + grad, when pinning worked
  size_t host_bytes() const { return host_bytes_; }      // master + m + v, and any pinned fallback

 private:
  Device& dev_;
  ModelSpec spec_;
  TensorTable working_, f32_;
  std::vector<ParamGroup> groups_;
  char* working_data_ = nullptr;
  float *master_ = nullptr, *m_ = nullptr, *v_ = nullptr, *grad_ = nullptr;
  size_t pinned_bytes_ = 0, host_bytes_ = 0;
  bool shared_ = false;
};

}  // namespace strata
