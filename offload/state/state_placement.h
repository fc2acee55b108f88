// Where a parameter group's optimizer state lives (DESIGN §2, §8a): the seam between the
// optimizer step and the memory tiers. Three arrays share the f32 table's element layout (row r
// from element f32_table[r].offset / 4 of each):
//   master  fp32 master weights (in f32 compute mode the working copy itself: no second array)
//   m, v    AdamW moments, f32 or bf16 (HostStore::moments_dtype)
// Byte offsets into an array are element index x its element size (HostStore::state_elem_bytes);
// ranges (StateRange) are in the f32 arena's bytes, the same elements in every array.
// Two implementations: RAM (offload/state/optimizer.h: the host store's arrays, every call free) and
// NVMe (offload/state/nvme_state.h: files, read ahead and written back in a pipeline).
//
// Two ways in:
//   - the optimizer's pass: begin_pass(order) names the groups it will update, in order; then
//     for each group, for each of its ranges: acquire() (pointers valid until release), update,
//     release() (written back). The NVMe placement reads range k+1 while k is updated and k-1
//     is written back.
//   - byte access for everything else (model init and load, checkpoints, export): read() and
//     write() of any span inside one row; only while no pass runs (the engine is synchronised).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace strata {

enum class StateArray : uint8_t { master, m, v };
const char* state_array_name(StateArray a);  // "master", "exp_avg", "exp_avg_sq"

// Pointers to the first element of an acquired range in each array (m, v: of the moments' dtype).
struct GroupState {
  float* master = nullptr;
  void* m = nullptr;
  void* v = nullptr;
};

// Bytes [begin, end) of the f32 arena: a piece of one group.
struct StateRange {
  size_t begin = 0, end = 0;
};

// What the NVMe tier moved and how long its users waited (cumulative; zero for RAM).
struct StateIoCounters {
  uint64_t read_bytes = 0, write_bytes = 0;
  double wait_s = 0;  // time the optimizer's pass was blocked on a read or a buffer's write-back
};

class StatePlacement {
 public:
  virtual ~StatePlacement() = default;
  // The ranges a group's update walks, in order (RAM: the whole group).
  virtual std::vector<StateRange> ranges(size_t group) const = 0;
  virtual void begin_pass(const std::vector<size_t>& groups) { (void)groups; }
  virtual GroupState acquire(size_t group, size_t range) = 0;
  virtual void release(size_t group, size_t range) = 0;
  // `bytes` at byte `offset` of array `a` (whole elements of it, inside one row).
  virtual void read(StateArray a, size_t offset, void* dst, size_t bytes) = 0;
  virtual void write(StateArray a, size_t offset, const void* src, size_t bytes) = 0;
  // Every write handed over so far has reached the placement's medium (a save follows).
  virtual void flush() {}
  virtual bool in_ram(StateArray a) const = 0;
  virtual size_t host_bytes() const { return 0; }  // buffers it holds in RAM (not the store's arrays)
  virtual StateIoCounters counters() const { return {}; }
};

}  // namespace strata
