// The host parameter store (DESIGN §2): the authoritative state of every parameter, laid out
// group by group (embedding, each decoder layer, the head) so one layer is one contiguous
// block in every array:
//   working  the device-dtype copy that is streamed (bf16 or f32), pinned    (working table)
//   master   fp32 master weights                                              (f32 table)
//   m, v     AdamW moments, fp32 or bf16 (optim.moments_dtype)                (f32 table's rows)
//   grad     fp32 gradient accumulation, pinned (it receives device copies)   (f32 table)
// Only what the run's optimizer needs is allocated (OptimizerStateNeeds): AdamW all four f32
// arrays, ZO-SGD the master alone (working + master: 6 B/param in bf16, 4 B in f32).
// Master and moments sit behind a StatePlacement (offload/state/state_placement.h) the store owns:
// RAM arrays, or files on NVMe (offload.optimizer = "nvme"; then they take no RAM but the
// placement's few buffers), or split by group: the first groups in RAM, the rest on NVMe
// (HostStoreOptions::nvme_first_group, offload/state/split_state.h). In f32 compute mode the master IS the working copy: no second f32
// array (the two tables then have the same offsets).
// With options.derived_working the decoder layers whose master is in RAM have no working copy:
// the working arena is reserved address space whose pages for those layers are never touched (no
// memory), and derive_working() makes a layer's working bytes from its master for an upload.
// Sizes are accounted per tier (a pinned allocation that fell back to pageable memory counts
// as host, not pinned); on a machine with several NUMA nodes the arrays are interleaved across
// them (one node: said once, and nothing else changes). estimate() gives the same tiers' bytes
// from the spec alone, before anything is allocated (offload/plan/placement_plan.h counts them).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/model_spec.h"
#include "offload/state/state_placement.h"
#include "offload/state/store_layout.h"
#include "src/core/error.h"
#include "src/device/device.h"

namespace strata {

// Host bytes per tier, as the store and the step engine will allocate them.
struct HostMemoryEstimate {
  size_t working = 0;      // pinned: the device-dtype working weights (what is streamed)
  size_t master = 0;       // fp32 master weights
  size_t moments = 0;      // AdamW m and v
  size_t grads = 0;        // pinned: fp32 gradient accumulation
  size_t staging = 0;      // pinned: the engine's activation and gradient staging
  size_t checkpoints = 0;  // pinned: layer inputs spilled from the device (upper bound)
  size_t nvme_buffers = 0; // the NVMe placement's read-ahead/write-back window and I/O staging
  size_t nvme = 0;         // not host memory: the files on NVMe (reported, not in total())
  size_t total() const { return working + master + moments + grads + staging + checkpoints + nvme_buffers; }
};

class HostStore {
 public:
  static HostStoreLayout layout(const ModelSpec& spec);
  // The store's own tiers (working, master, moments, grads); staging and checkpoints are the
  // engine's (Engine::host_staging) and stay 0 here.
  static HostMemoryEstimate estimate(const ModelSpec& spec, const HostStoreOptions& options);

  HostStore(Device& dev, const ModelSpec& spec, const HostStoreOptions& options = {});
  // The store in memory the caller owns, e.g. POSIX shared memory the ranks of one node map
  // (src/train/shared_store.h): shared_bytes(spec) bytes, page aligned, zero filled; nothing is
  // allocated or cleared here (another rank may already have loaded weights into it). State in RAM.
  HostStore(Device& dev, const ModelSpec& spec, void* shared);
  static size_t shared_bytes(const ModelSpec& spec);
  ~HostStore();
  HostStore(const HostStore&) = delete;
  HostStore& operator=(const HostStore&) = delete;

  const ModelSpec& spec() const { return spec_; }
  // The working arena's rows: device dtypes, or u8 for the rows of a packed (NF4) base
  // (offload/state/nf4_layout.h); device_table() is the layout of a layer's device slot.
  const TensorTable& working_table() const { return working_; }
  const TensorTable& device_table() const { return device_; }
  bool packed() const { return packed_; }
  const TensorTable& f32_table() const { return f32_; }
  const std::vector<ParamGroup>& groups() const { return groups_; }
  const ParamGroup& layer_group(size_t layer) const { return groups_[1 + layer]; }
  const ParamGroup& embed_group() const { return groups_.front(); }
  const ParamGroup& head_group() const { return groups_.back(); }

  char* working() { return working_data_; }
  const char* working() const { return working_data_; }
  // The RAM arrays; null when the placement keeps them elsewhere (NVMe) or the optimizer does
  // not need them (options().needs). In f32 compute mode master() is the working copy. With the
  // state split (options().nvme_first_group > 0) they cover the groups before the split alone:
  // state_ram_f32_bytes(layout, options) / 4 elements; reach state through read_state/placement().
  float* master() { return master_; }
  // m and v hold moments_dtype() elements (f32 or bf16), row r from element f32_table()[r].offset / 4.
  void* m() { return m_; }
  void* v() { return v_; }
  DType moments_dtype() const { return options_.moments; }
  // Bytes per element of array a: 4 for the master, the moments' dtype size for m and v. A
  // placement's byte offsets into array a are element index x this.
  size_t state_elem_bytes(StateArray a) const { return a == StateArray::master ? 4 : dtype_size(options_.moments); }
  // The fp32 gradient buffer (grad_floats() floats). With options().grads_in_flight it holds the
  // embedding's group at its f32 offset and one slot after it that every other group uses in turn
  // (store_layout.h): reach a row or a group through grad_of / group_grad, never by offset.
  float* grad() { return grad_; }
  size_t grad_floats() const { return grad_floats_; }
  float* group_grad(size_t group) {
    STRATA_ASSERT(grad_, "the store holds no gradients (the optimizer does not need them)");
    if (options_.grads_in_flight && group > 0) return grad_ + grad_slot_floats_;
    return grad_ + groups_[group].f32_offset / 4;
  }
  size_t f32_floats() const { return f32_.tier_bytes(Tier::host) / 4; }
  bool master_is_working() const { return master_is_working_; }
  StatePlacement& placement() {
    STRATA_ASSERT(placement_, "a weights-only host store has no optimizer state");
    return *placement_;
  }
  const HostStoreOptions& options() const { return options_; }
  const OptimizerStateNeeds& needs() const { return options_.needs; }
  // The arrays of StateArray the store holds (master always; m and v with moments).
  bool holds(StateArray a) const { return a == StateArray::master || options_.needs.moments; }

  float* grad_of(size_t row) {
    STRATA_ASSERT(grad_, "the store holds no gradients (the optimizer does not need them)");
    if (!options_.grads_in_flight) return grad_ + f32_[row].offset / 4;
    const size_t g = row_group_[row];
    return group_grad(g) + (f32_[row].offset - groups_[g].f32_offset) / 4;
  }
  void* working_of(size_t row) {
    STRATA_ASSERT(!row_derived(row), "parameter ", f32_[row].name, " has no working copy (offload.working_weights = "
                  "\"derived\": it is made from the master at upload)");
    return working_data_ + working_[row].offset;
  }

  // offload.working_weights = "derived": layers [0, derived_layers()) keep no working copy.
  size_t derived_layers() const { return derived_layers_; }
  bool layer_derived(size_t layer) const { return layer < derived_layers_; }
  bool row_derived(size_t row) const {
    return derived_layers_ > 0 && row >= groups_[1].first_row && row < groups_[derived_layers_].end_row;
  }
  // Layer `layer`'s working bytes (its group's layout, working_bytes of them) made from its
  // master into dst: what the working copy would hold, bit for bit. On the calling thread's
  // OpenMP team.
  void derive_working(size_t layer, char* dst) const;
  // The pinned staging the uploads of derived layers need (0: none derived).
  size_t derived_staging_bytes() const;

  // Values of one parameter as f32 (set writes master and the working copy), wherever the
  // master lives.
  void set_param(size_t row, const float* values);
  void get_param(size_t row, float* values) const;
  // count values of array `a` of parameter `row`, from its element `first`, as f32 (bf16
  // moments are widened on read and rounded to nearest even on write).
  void read_state(StateArray a, size_t row, int64_t first, int64_t count, float* dst) const;
  void write_state(StateArray a, size_t row, int64_t first, int64_t count, const float* src);

  size_t pinned_bytes() const { return pinned_bytes_; }  // working + grad, when pinning worked
  size_t host_bytes() const { return host_bytes_; }      // master + m + v, and any pinned fallback
  size_t bytes() const { return pinned_bytes_ + host_bytes_; }  // everything the store allocated

 private:
  void release();
  void alloc_derived_working(size_t working_bytes);  // the reserved arena (derived_layers_ > 0)
  void alloc_state_arrays(size_t floats);
  size_t state_at(StateArray a, size_t row, int64_t first, int64_t count) const;  // the byte offset, checked

  Device& dev_;
  ModelSpec spec_;
  HostStoreOptions options_;
  bool master_is_working_ = false;
  bool shared_ = false;  // the arrays are the caller's memory
  size_t derived_layers_ = 0;
  size_t grad_floats_ = 0, grad_slot_floats_ = 0;  // the gradient buffer; grads_in_flight: where its slot starts
  std::vector<uint32_t> row_group_;                // each row's parameter group
  size_t working_reserved_ = 0;  // derived: the mmap'd arena's bytes (0: alloc_pinned's)
  std::vector<std::pair<char*, size_t>> working_kept_;  // derived: the arena's kept ranges (bytes registered, 0: pageable)
  std::unique_ptr<StatePlacement> placement_;
  TensorTable working_, f32_, device_;
  bool packed_ = false;  // ModelSpec::base_quant.nf4: the layers' linears are NF4 in the working arena
  std::vector<ParamGroup> groups_;
  char* working_data_ = nullptr;
  float *master_ = nullptr, *grad_ = nullptr;
  void *m_ = nullptr, *v_ = nullptr;
  size_t pinned_bytes_ = 0, host_bytes_ = 0;
};

// The state in the store's RAM arrays: every call free (the default placement).
class RamStatePlacement final : public StatePlacement {
 public:
  explicit RamStatePlacement(HostStore& store) : store_(store) {}
  std::vector<StateRange> ranges(size_t group) const override;
  GroupState acquire(size_t group, size_t range) override;
  void release(size_t, size_t) override {}
  void read(StateArray a, size_t offset, void* dst, size_t bytes) override;
  void write(StateArray a, size_t offset, const void* src, size_t bytes) override;
  bool in_ram(StateArray) const override { return true; }

 private:
  char* array(StateArray a) const;
  HostStore& store_;
};

}  // namespace strata
