// Optimizer state on NVMe (DESIGN §8a, ZeRO-Infinity's pipelined swapper as three stages): the
// fp32 master weights (unless they are the f32 working copy) and AdamW m and v live in one file
// per array under the run's NVMe folder, read and written through the io_uring file engine
// (io/uring_file.h: O_DIRECT, a crc32c per block verified on every read).
//
// File layout: each array's file holds the groups on NVMe (all of them, or with a split
// [nvme_first_group, n): offload/state/split_state.h) one after another, each starting on a block
// boundary (group g at base = file_base[a][g - nvme_first_group]; element e of the f32 arena
// inside group g is at base + (e - g's first element) x the array's element size: 4, or 2 for
// bf16 moments), so whole blocks move between disk and the aligned window buffers without a copy.
// With bf16 moments a range is a multiple of two blocks of f32, so its moments are whole blocks. The files are created at full size and their space reserved
// (fallocate) before step 1: a disk too small fails then, not mid-run.
//
// The optimizer's pass: each group is cut into ranges of at most chunk_bytes per array; the
// window holds `window` buffers (each one range of every array on NVMe). While range k is being
// updated, range k+1 (.. k+window-2) is being read and range k-1 written back; a buffer is
// refilled only once its write-back has completed. Memory: window x chunk x arrays, plus the
// file engine's staging. Nothing else is held in RAM.
#pragma once
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "io/uring_file.h"
#include "offload/state/nvme_dir.h"
#include "offload/state/state_placement.h"
#include "offload/state/store_layout.h"

namespace strata {

// The NVMe groups' alone: [options.nvme_first_group, groups) (every group when it is 0).
struct NvmeStateSizes {
  size_t file_bytes = 0;   // all files on NVMe
  size_t host_bytes = 0;   // window buffers + file engine staging
  size_t chunk_bytes = 0;  // one range, in f32 bytes (the master's; bf16 moments take half)
  size_t block_bytes = 0;
};
// `master_on_nvme`: false in f32 compute mode (the master is the working copy).
NvmeStateSizes nvme_state_sizes(const HostStoreLayout& layout, const HostStoreOptions& options, bool master_on_nvme);

class NvmeStatePlacement final : public StatePlacement {
 public:
  // `ram_master`: the fp32 master when it stays in RAM (f32 compute mode: it is the store's
  // working copy); null puts it on NVMe with the moments. Holds groups [options.nvme_first_group,
  // n) alone (offload/state/split_state.h keeps the groups before in RAM).
  NvmeStatePlacement(HostStoreLayout layout, const HostStoreOptions& options, float* ram_master);
  ~NvmeStatePlacement() override;

  std::vector<StateRange> ranges(size_t group) const override;
  void begin_pass(const std::vector<size_t>& groups) override;
  GroupState acquire(size_t group, size_t range) override;
  void release(size_t group, size_t range) override;
  void read(StateArray a, size_t offset, void* dst, size_t bytes) override;
  void write(StateArray a, size_t offset, const void* src, size_t bytes) override;
  void flush() override;
  bool in_ram(StateArray a) const override { return !on_nvme(a); }
  size_t host_bytes() const override { return sizes_.host_bytes; }
  StateIoCounters counters() const override;
  const std::string& dir() const { return run_dir_->path(); }
  const NvmeStateSizes& sizes() const { return sizes_; }
  FileEngine& io() { return *io_; }  // tests inject faults through it

 private:
  struct Item {
    size_t group = 0, range = 0;
    StateRange bytes;
  };
  struct Slot {
    IoBuffer buffer;
    unsigned char* array[3] = {};           // per StateArray on NVMe: one chunk of its elements
    std::vector<FileTicket> pending;        // its read or its write-back
  };
  bool on_nvme(StateArray a) const { return a != StateArray::master || !ram_master_; }
  size_t group_of(size_t element) const;    // the group holding f32-arena element `element`
  // The file offset of byte `offset` of array a (inside `group`).
  uint64_t file_offset(StateArray a, size_t group, size_t offset) const;
  size_t elem_bytes(StateArray a) const { return a == StateArray::master ? 4 : dtype_size(moments_); }
  void issue_read(size_t item);
  void wait_slot(Slot& s);                  // timed: the pass waits on NVMe

  HostStoreLayout layout_;
  size_t first_group_;                     // groups [first_group_, n) are on NVMe (options.nvme_first_group)
  DType moments_;
  float* ram_master_;
  NvmeStateSizes sizes_;
  std::shared_ptr<NvmeRunDir> run_dir_;
  std::unique_ptr<FileEngine> io_;
  int file_[3] = {-1, -1, -1};
  std::vector<uint64_t> file_base_[3];     // per array, per NVMe group (index: group - first_group_)
  std::vector<Slot> slots_;
  std::vector<Item> pass_;                 // the current pass's ranges, in order
  size_t next_ = 0, issued_ = 0;           // next range to acquire; ranges whose read was issued
  std::atomic<int64_t> wait_ns_{0};
};

}  // namespace strata
