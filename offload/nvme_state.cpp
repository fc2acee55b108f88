#include "offload/nvme_state.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "src/core/error.h"

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
  size_t per_array = 0, largest = 0;
  for (const ParamGroup& g : layout.groups) {
    per_array += round_up(g.f32_bytes, s.block_bytes);
    largest = std::max(largest, round_up(g.f32_bytes, s.block_bytes));
  }
  s.chunk_bytes = round_up(options.nvme_chunk_bytes ? options.nvme_chunk_bytes : kDefaultChunk, s.block_bytes);
  s.chunk_bytes = std::min(s.chunk_bytes, largest);
  const size_t arrays = master_on_nvme ? 3 : 2;
  s.file_bytes = arrays * per_array;
  s.host_bytes = size_t(std::max(options.nvme_window, 3)) * arrays * s.chunk_bytes +
                 FileEngine::staging_bytes(engine_options(s.block_bytes));
  return s;
}

NvmeStatePlacement::NvmeStatePlacement(HostStore& store, const HostStoreOptions& options)
    : store_(store), master_on_nvme_(!store.master_is_working()) {
  HostStoreLayout l{store.working_table(), store.f32_table(), store.groups()};
  sizes_ = nvme_state_sizes(l, options, master_on_nvme_);
  run_dir_ = NvmeRunDir::acquire(options.nvme_path);
  const size_t per_array = sizes_.file_bytes / (master_on_nvme_ ? 3 : 2);
  run_dir_->reserve(sizes_.file_bytes, nvme_budget_bytes(options.nvme_budget_bytes, options.nvme_path),
                    master_on_nvme_ ? "the optimizer state (fp32 master weights, AdamW m and v)"
                                    : "the optimizer state (AdamW m and v)");
  uint64_t base = 0;
  for (const ParamGroup& g : store.groups()) {
    file_base_.push_back(base);
    base += round_up(g.f32_bytes, sizes_.block_bytes);
  }
  io_ = std::make_unique<FileEngine>(engine_options(sizes_.block_bytes));
  try {
    const size_t arrays = master_on_nvme_ ? 3 : 2;
    slots_.resize(size_t(std::max(options.nvme_window, 3)));
    for (Slot& s : slots_) {
      s.buffer = io_buffer_alloc(arrays * sizes_.chunk_bytes);
      io_->register_memory(s.buffer.get(), arrays * sizes_.chunk_bytes);
      size_t at = 0;
      for (StateArray a : kArrays)
        if (on_nvme(a)) s.array[int(a)] = s.buffer.get() + sizes_.chunk_bytes * at++;
    }
    // Every file at full size (its last block written: the blocks before it are holes that read
    // as zeros and verify as zeros), then its space reserved.
    std::memset(slots_[0].buffer.get(), 0, sizes_.block_bytes);
    for (StateArray a : kArrays) {
      if (!on_nvme(a)) continue;
      const std::string path = run_dir_->path() + "/state." + state_array_name(a) + ".f32";
      file_[int(a)] = io_->open(path, FileOpen::create);
      io_->wait(io_->write(file_[int(a)], per_array - sizes_.block_bytes, slots_[0].buffer.get(), sizes_.block_bytes));
      io_->wait(io_->sync(file_[int(a)]));
      nvme_file_reserve(path, per_array);
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
  std::fprintf(stderr, "strata: optimizer state on NVMe: %s in %s (%s, %s window)\n",
               format_bytes(sizes_.file_bytes).c_str(), run_dir_->path().c_str(), io_->backend(),
               format_bytes(slots_.size() * (master_on_nvme_ ? 3 : 2) * sizes_.chunk_bytes).c_str());
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

size_t NvmeStatePlacement::group_of(size_t offset) const {
  const auto& groups = store_.groups();
  auto it = std::upper_bound(groups.begin(), groups.end(), offset,
                             [](size_t o, const ParamGroup& g) { return o < g.f32_offset; });
  STRATA_ASSERT(it != groups.begin());
  return size_t(it - groups.begin()) - 1;
}

uint64_t NvmeStatePlacement::file_offset(size_t group, size_t offset) const {
  const ParamGroup& g = store_.groups()[group];
  STRATA_ASSERT(offset >= g.f32_offset && offset <= g.f32_offset + g.f32_bytes);
  return file_base_[group] + (offset - g.f32_offset);
}

std::vector<StateRange> NvmeStatePlacement::ranges(size_t group) const {
  const ParamGroup& g = store_.groups()[group];
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
  const size_t len = round_up(it.bytes.end - it.bytes.begin, sizes_.block_bytes);
  for (StateArray a : kArrays)
    if (on_nvme(a)) s.pending.push_back(io_->read(file_[int(a)], file_offset(it.group, it.bytes.begin), s.array[int(a)], len));
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
  auto at = [&](StateArray a, float* ram) {
    return on_nvme(a) ? reinterpret_cast<float*>(s.array[int(a)]) : ram + first;
  };
  return {at(StateArray::master, store_.master()), at(StateArray::m, store_.m()), at(StateArray::v, store_.v())};
}

void NvmeStatePlacement::release(size_t group, size_t range) {
  STRATA_ASSERT(next_ < pass_.size() && pass_[next_].group == group && pass_[next_].range == range,
                "NVMe state: range ", range, " of group ", group, " released out of order");
  const Item& it = pass_[next_];
  Slot& s = slots_[next_ % slots_.size()];
  const size_t len = round_up(it.bytes.end - it.bytes.begin, sizes_.block_bytes);
  for (StateArray a : kArrays)
    if (on_nvme(a)) s.pending.push_back(io_->write(file_[int(a)], file_offset(it.group, it.bytes.begin), s.array[int(a)], len));
  ++next_;
  if (issued_ < pass_.size()) issue_read(issued_++);
}

void NvmeStatePlacement::read(StateArray a, size_t offset, void* dst, size_t bytes) {
  if (!bytes) return;
  if (!on_nvme(a)) {
    std::memcpy(dst, reinterpret_cast<const char*>(store_.master()) + offset, bytes);
    return;
  }
  const size_t g = group_of(offset);
  io_->wait(io_->read(file_[int(a)], file_offset(g, offset), dst, bytes));
  (void)file_offset(g, offset + bytes);  // inside the group
}

void NvmeStatePlacement::write(StateArray a, size_t offset, const void* src, size_t bytes) {
  if (!bytes) return;
  if (!on_nvme(a)) {
    std::memcpy(reinterpret_cast<char*>(store_.master()) + offset, src, bytes);
    return;
  }
  const size_t g = group_of(offset);
  (void)file_offset(g, offset + bytes);
  io_->wait(io_->write(file_[int(a)], file_offset(g, offset), src, bytes));
}

void NvmeStatePlacement::flush() {
  for (Slot& s : slots_) wait_slot(s);
}

StateIoCounters NvmeStatePlacement::counters() const {
  const FileEngineStats st = io_->stats();
  return {st.read_bytes, st.write_bytes, double(wait_ns_.load()) * 1e-9};
}

}  // namespace strata
