#include "offload/state/nvme_state.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "src/core/error.h"
#include "src/core/fault.h"

namespace strata {
namespace {

constexpr size_t kDefaultBlock = size_t(1) << 20;
constexpr size_t kDefaultChunk = size_t(64) << 20;
constexpr int kQueueDepth = 32;
constexpr StateArray kArrays[3] = {StateArray::master, StateArray::m, StateArray::v};

size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

FileEngineOptions engine_options(size_t block) {
  FileEngineOptions fo;
  fo.block_bytes = block;
  fo.queue_depth = kQueueDepth;
  return fo;
}

}  // namespace

NvmeStateSizes nvme_state_sizes(const HostStoreLayout& layout, const HostStoreOptions& options, bool master_on_nvme) {
  NvmeStateSizes s;
  s.block_bytes = options.nvme_block_bytes ? options.nvme_block_bytes : kDefaultBlock;
  STRATA_CHECK(s.block_bytes % 4096 == 0, "the NVMe block size must be a multiple of 4096 bytes (got ",
               s.block_bytes, ")");
  const size_t mb = dtype_size(options.moments);  // moments' element size: 4 or 2
  // a range's f32 bytes: whole blocks of every array (bf16 moments: two blocks of f32 per block)
  const size_t unit = s.block_bytes * (4 / mb);
  const size_t first = options.nvme_first_group;
  STRATA_CHECK(first < layout.groups.size(), "the optimizer state's NVMe part starts at parameter group ", first,
               ", but the model has ", layout.groups.size(), " groups (embed, the layers, head): at most ",
               layout.groups.size() - 1, " (the head alone on NVMe)");
  size_t master_file = 0, moment_file = 0, largest = 0;  // the NVMe groups' alone
  for (size_t i = first; i < layout.groups.size(); ++i) {
    const ParamGroup& g = layout.groups[i];
    master_file += round_up(g.f32_bytes, s.block_bytes);
    moment_file += round_up(g.f32_bytes / 4 * mb, s.block_bytes);
    largest = std::max(largest, round_up(g.f32_bytes, unit));
  }
  s.chunk_bytes = round_up(options.nvme_chunk_bytes ? options.nvme_chunk_bytes : kDefaultChunk, unit);
  s.chunk_bytes = std::min(s.chunk_bytes, largest);
  s.file_bytes = (master_on_nvme ? master_file : 0) + 2 * moment_file;
  const size_t range_bytes = (master_on_nvme ? s.chunk_bytes : 0) + 2 * (s.chunk_bytes / 4 * mb);
  s.host_bytes = size_t(std::max(options.nvme_window, 3)) * range_bytes +
                 FileEngine::staging_bytes(engine_options(s.block_bytes));
  return s;
}

NvmeStatePlacement::NvmeStatePlacement(HostStoreLayout layout, const HostStoreOptions& options, float* ram_master)
    : layout_(std::move(layout)), first_group_(options.nvme_first_group), moments_(options.moments), ram_master_(ram_master) {
  const bool master_on_nvme = !ram_master_;
  sizes_ = nvme_state_sizes(layout_, options, master_on_nvme);
  run_dir_ = NvmeRunDir::acquire(options.nvme_path);
  run_dir_->reserve(sizes_.file_bytes, nvme_budget_bytes(options.nvme_budget_bytes, options.nvme_path),
                    master_on_nvme ? "the optimizer state (fp32 master weights, AdamW m and v)"
                                    : "the optimizer state (AdamW m and v)");
  size_t file_bytes[3] = {};  // per array: the NVMe groups one after another
  for (StateArray a : kArrays) {
    for (size_t i = first_group_; i < layout_.groups.size(); ++i) {
      const ParamGroup& g = layout_.groups[i];
      file_base_[int(a)].push_back(file_bytes[int(a)]);
      file_bytes[int(a)] += round_up(g.f32_bytes / 4 * elem_bytes(a), sizes_.block_bytes);
    }
  }
  io_ = std::make_unique<FileEngine>(engine_options(sizes_.block_bytes));
  size_t slot_bytes = 0;  // one range of every array on NVMe
  for (StateArray a : kArrays)
    if (on_nvme(a)) slot_bytes += sizes_.chunk_bytes / 4 * elem_bytes(a);
  try {
    slots_.resize(size_t(std::max(options.nvme_window, 3)));
    for (Slot& s : slots_) {
      s.buffer = io_buffer_alloc(slot_bytes);
      io_->register_memory(s.buffer.get(), slot_bytes);
      size_t at = 0;
      for (StateArray a : kArrays)
        if (on_nvme(a)) {
          s.array[int(a)] = s.buffer.get() + at;
          at += sizes_.chunk_bytes / 4 * elem_bytes(a);
        }
    }
    // Every file at full size (its last block written: the blocks before it are holes that read
    // as zeros and verify as zeros), then its space reserved.
    std::memset(slots_[0].buffer.get(), 0, sizes_.block_bytes);
    for (StateArray a : kArrays) {
      if (!on_nvme(a)) continue;
      const std::string path = run_dir_->path() + "/state." + state_array_name(a) + "." +
                               dtype_name(a == StateArray::master ? DType::f32 : moments_);
      const size_t size = file_bytes[int(a)];
      file_[int(a)] = io_->open(path, FileOpen::create);
      io_->wait(io_->write(file_[int(a)], size - sizes_.block_bytes, slots_[0].buffer.get(), sizes_.block_bytes));
      io_->wait(io_->sync(file_[int(a)]));
      nvme_file_reserve(path, size);
    }
  } catch (...) {
    try {
      io_->wait_all();
    } catch (...) {
    }
    for (Slot& s : slots_)
      if (s.buffer) io_->unregister_memory(s.buffer.get());
    io_.reset();
    throw;
  }
  const std::string which = first_group_ == 0 ? "" : str_cat(" for groups ", layout_.groups[first_group_].name, " .. ",
                                                             layout_.groups.back().name, " (the groups before in RAM)");
  std::fprintf(stderr, "strata: optimizer state on NVMe: %s in %s (%s, %s window)%s\n",
               format_bytes(sizes_.file_bytes).c_str(), run_dir_->path().c_str(), io_->backend(),
               format_bytes(slots_.size() * slot_bytes).c_str(), which.c_str());
}

NvmeStatePlacement::~NvmeStatePlacement() {
  for (Slot& s : slots_) s.pending.clear();
  try {
    io_->wait_all();
  } catch (...) {  // the error was reported where it happened
  }
  for (Slot& s : slots_) io_->unregister_memory(s.buffer.get());
  for (int f : file_)
    if (f >= 0) {
      try {
        io_->close(f);
      } catch (...) {  // the files are removed with the run folder next
      }
    }
  io_.reset();
}

size_t NvmeStatePlacement::group_of(size_t element) const {
  const auto& groups = layout_.groups;
  auto it = std::upper_bound(groups.begin(), groups.end(), element,
                             [](size_t e, const ParamGroup& g) { return e < g.f32_offset / 4; });
  STRATA_ASSERT(it != groups.begin());
  const size_t g = size_t(it - groups.begin()) - 1;
  STRATA_ASSERT(g >= first_group_, "NVMe state: element ", element, " is in group ", g, ", which is kept in RAM");
  return g;
}

uint64_t NvmeStatePlacement::file_offset(StateArray a, size_t group, size_t offset) const {
  const ParamGroup& g = layout_.groups[group];
  const size_t es = elem_bytes(a), begin = g.f32_offset / 4 * es;
  STRATA_ASSERT(group >= first_group_ && offset >= begin && offset <= begin + g.f32_bytes / 4 * es);
  return file_base_[int(a)][group - first_group_] + (offset - begin);
}

std::vector<StateRange> NvmeStatePlacement::ranges(size_t group) const {
  STRATA_ASSERT(group >= first_group_ && group < layout_.groups.size(), "NVMe state: group ", group,
                " is not on NVMe (groups ", first_group_, " .. ", layout_.groups.size() - 1, " are)");
  const ParamGroup& g = layout_.groups[group];
  std::vector<StateRange> out;
  for (size_t b = 0; b < g.f32_bytes; b += sizes_.chunk_bytes)
    out.push_back({g.f32_offset + b, g.f32_offset + std::min(g.f32_bytes, b + sizes_.chunk_bytes)});
  return out;
}

void NvmeStatePlacement::wait_slot(Slot& s) {
  if (s.pending.empty()) return;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<FileTicket> pending = std::move(s.pending);
  s.pending.clear();
  std::exception_ptr first;
  for (FileTicket t : pending) {
    try {
      io_->wait(t);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  wait_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  if (first) std::rethrow_exception(first);
}

// A range moves as whole blocks (its group's span in the file is a whole number of blocks and a
// buffer holds a whole chunk), so the engine never reads a block to change part of it.
void NvmeStatePlacement::issue_read(size_t item) {
  const Item& it = pass_[item];
  Slot& s = slots_[item % slots_.size()];
  wait_slot(s);  // its previous range has been written back
  for (StateArray a : kArrays) {
    if (!on_nvme(a)) continue;
    const size_t es = elem_bytes(a), len = round_up((it.bytes.end - it.bytes.begin) / 4 * es, sizes_.block_bytes);
    s.pending.push_back(io_->read(file_[int(a)], file_offset(a, it.group, it.bytes.begin / 4 * es), s.array[int(a)], len));
  }
}

void NvmeStatePlacement::begin_pass(const std::vector<size_t>& groups) {
  for (Slot& s : slots_) wait_slot(s);
  pass_.clear();
  for (size_t g : groups) {
    const std::vector<StateRange> rs = ranges(g);
    for (size_t k = 0; k < rs.size(); ++k) pass_.push_back({g, k, rs[k]});
  }
  next_ = issued_ = 0;
  while (issued_ < pass_.size() && issued_ + 1 < slots_.size()) issue_read(issued_++);
}

GroupState NvmeStatePlacement::acquire(size_t group, size_t range) {
  if (next_ >= pass_.size() || pass_[next_].group != group || pass_[next_].range != range) begin_pass({group});
  STRATA_ASSERT(next_ < pass_.size() && pass_[next_].group == group && pass_[next_].range == range,
                "NVMe state: range ", range, " of group ", group, " acquired out of order");
  while (issued_ <= next_) issue_read(issued_++);
  Slot& s = slots_[next_ % slots_.size()];
  wait_slot(s);
  const size_t first = count_of<float>(pass_[next_].bytes.begin);
  // m and v are always on NVMe; the master is in RAM when it is the f32 working copy
  float* master = on_nvme(StateArray::master) ? reinterpret_cast<float*>(s.array[int(StateArray::master)])
                                              : ram_master_ + first;
  return {master, s.array[int(StateArray::m)], s.array[int(StateArray::v)]};
}

void NvmeStatePlacement::release(size_t group, size_t range) {
  STRATA_ASSERT(next_ < pass_.size() && pass_[next_].group == group && pass_[next_].range == range,
                "NVMe state: range ", range, " of group ", group, " released out of order");
  const Item& it = pass_[next_];
  Slot& s = slots_[next_ % slots_.size()];
  for (StateArray a : kArrays) {
    if (!on_nvme(a)) continue;
    const size_t es = elem_bytes(a), len = round_up((it.bytes.end - it.bytes.begin) / 4 * es, sizes_.block_bytes);
    s.pending.push_back(io_->write(file_[int(a)], file_offset(a, it.group, it.bytes.begin / 4 * es), s.array[int(a)], len));
  }
  ++next_;
  fault_point("nvme-writeback");  // STRATA_FAULT=kill@nvme-writeback: a range's write-back in flight
  if (issued_ < pass_.size()) issue_read(issued_++);
}

void NvmeStatePlacement::read(StateArray a, size_t offset, void* dst, size_t bytes) {
  if (!bytes) return;
  if (!on_nvme(a)) {
    std::memcpy(dst, reinterpret_cast<const char*>(ram_master_) + offset, bytes);
    return;
  }
  const size_t g = group_of(offset / elem_bytes(a));
  io_->wait(io_->read(file_[int(a)], file_offset(a, g, offset), dst, bytes));
  (void)file_offset(a, g, offset + bytes);  // inside the group
}

void NvmeStatePlacement::write(StateArray a, size_t offset, const void* src, size_t bytes) {
  if (!bytes) return;
  if (!on_nvme(a)) {
    std::memcpy(reinterpret_cast<char*>(ram_master_) + offset, src, bytes);
    return;
  }
  const size_t g = group_of(offset / elem_bytes(a));
  (void)file_offset(a, g, offset + bytes);
  io_->wait(io_->write(file_[int(a)], file_offset(a, g, offset), src, bytes));
}

void NvmeStatePlacement::flush() {
  for (Slot& s : slots_) wait_slot(s);
}

StateIoCounters NvmeStatePlacement::counters() const {
  const FileEngineStats st = io_->stats();
  return {st.read_bytes, st.write_bytes, double(wait_ns_.load()) * 1e-9};
}

}  // namespace strata
