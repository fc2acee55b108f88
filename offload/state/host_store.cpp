#include "offload/state/host_store.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cerrno>
#include <mutex>
#include <sys/mman.h>
#ifdef STRATA_HAVE_NUMA
#include <numa.h>
#endif

#include <vector>

#include "offload/state/nf4_layout.h"
#include "offload/state/nvme_state.h"
#include "offload/state/split_state.h"
#include "src/core/bf16.h"
#include "src/core/error.h"

namespace strata {
namespace {

// With several NUMA nodes the host arrays are interleaved across them before first touch, so
// the optimizer's streaming passes draw on every node's memory bandwidth; with one node (or no
// libnuma) placement is left to the OS, said once.
void numa_place(void* p, size_t bytes) {
  static std::once_flag said;
#ifdef STRATA_HAVE_NUMA
  if (numa_available() >= 0 && numa_num_configured_nodes() > 1) {
    numa_interleave_memory(p, bytes, numa_all_nodes_ptr);
    std::call_once(said, [] {
      std::fprintf(stderr, "strata: host store interleaved across %d NUMA nodes\n", numa_num_configured_nodes());
    });
    return;
  }
#endif
  (void)p;
  (void)bytes;
  std::call_once(said, [] { std::fprintf(stderr, "strata: one NUMA node; host placement left to the OS\n"); });
}

void* alloc_host_bytes(size_t size, const char* what) {
  const size_t bytes = std::max<size_t>((size + 4095) / 4096 * 4096, 4096);
  void* p = std::aligned_alloc(4096, bytes);
  STRATA_CHECK_BUDGET(p, "cannot allocate ", format_bytes(size), " of host memory for ", what,
                      ": the model's optimizer state does not fit in RAM; place it on NVMe "
                      "(offload.optimizer = \"nvme\" with offload.nvme_path) or use a smaller model");
  numa_place(p, bytes);
  std::memset(p, 0, size);
  return p;
}

// bf16 moments are read and written through f32 in pieces of this many elements (64 KiB of bf16).
constexpr size_t kStateConvertElements = size_t(1) << 15;

}  // namespace

HostStoreLayout HostStore::layout(const ModelSpec& spec) {
  // groups: embed | layer 0 .. L-1 | head (final norm, lm_head) — the spec's row order
  HostStoreLayout l;
  const auto& rows = spec.params.rows();
  const std::string layers = spec.config.text_prefix + "layers.";  // "model.layers.", or a gemma3 checkpoint's
  auto group_of = [&](size_t r) -> std::string {
    const std::string& n = rows[r].name;
    const size_t at = layers.size();
    if (n.rfind(layers, 0) == 0) return "layer." + n.substr(at, n.find('.', at) - at);
    if (int64_t(r) == spec.embed) return "embed";
    return "head";
  };
  for (size_t r = 0; r < rows.size(); ++r) {
    std::string g = group_of(r);
    if (l.groups.empty() || l.groups.back().name != g) l.groups.push_back(ParamGroup{g, r, r});
    STRATA_ASSERT(l.groups.back().name == g);
    l.groups.back().end_row = r + 1;
    l.working.add(TensorSpec{rows[r].name, rows[r].shape, rows[r].dtype, Tier::host_pinned});
    l.f32.add(TensorSpec{rows[r].name, rows[r].shape, DType::f32, Tier::host});
  }
  STRATA_ASSERT(l.groups.size() == spec.layers.size() + 2 && l.groups.front().name == "embed" &&
                l.groups.back().name == "head", "unexpected parameter order");
  l.working.layout(Tier::host_pinned);
  l.f32.layout(Tier::host);
  l.device = l.working;
  if (spec.base_quant.nf4) {  // the packed rows: u8, their NF4 state's bytes (nf4_layout.h)
    l.packed = true;
    const std::vector<bool> packed = nf4_packed_rows(spec);
    for (size_t r = 0; r < rows.size(); ++r)
      if (packed[r])
        l.working[r].shape = {int64_t(Nf4RowLayout::of(rows[r].numel(), spec.base_quant.double_quant).bytes)},
        l.working[r].dtype = DType::u8;
    l.working.layout(Tier::host_pinned);
  }
  for (auto& g : l.groups) {
    g.device_offset = l.device[g.first_row].offset;
    g.device_bytes = l.device[g.end_row - 1].offset + l.device[g.end_row - 1].bytes() - g.device_offset;
    g.working_offset = l.working[g.first_row].offset;
    g.f32_offset = l.f32[g.first_row].offset;
    const TensorSpec& last_w = l.working[g.end_row - 1];
    const TensorSpec& last_f = l.f32[g.end_row - 1];
    g.working_bytes = last_w.offset + last_w.bytes() - g.working_offset;
    g.f32_bytes = last_f.offset + last_f.bytes() - g.f32_offset;
  }
  return l;
}

namespace {

// f32 compute mode: every working row is f32, so the working arena has the f32 table's layout
// and serves as the master copy.
bool working_is_f32(const HostStoreLayout& l) {
  for (size_t r = 0; r < l.working.size(); ++r)
    if (l.working[r].dtype != DType::f32) return false;
  return true;
}

}  // namespace

HostMemoryEstimate HostStore::estimate(const ModelSpec& spec, const HostStoreOptions& options) {
  const HostStoreLayout l = layout(spec);
  const size_t f32_bytes = l.f32.tier_bytes(Tier::host);
  const bool aliased = working_is_f32(l);
  HostMemoryEstimate e;
  e.working = l.working.tier_bytes(Tier::host_pinned);
  if (options.weights_only) return e;
  e.working -= derived_working_bytes(l, derived_working_layers(l, options));
  const size_t ram_f32 = state_ram_f32_bytes(l, options);  // all, or the prefix before the NVMe groups
  e.master = aliased ? 0 : ram_f32;
  e.moments = options.needs.moments ? 2 * ram_f32 / 4 * dtype_size(options.moments) : 0;
  e.grads = options.needs.grads ? grad_buffer_bytes(l, options.grads_in_flight) : 0;
  if (options.state_on_nvme) {
    const NvmeStateSizes n = nvme_state_sizes(l, options, !aliased);
    e.nvme_buffers = n.host_bytes;
    e.nvme = n.file_bytes;
  }
  return e;
}

HostStore::HostStore(Device& dev, const ModelSpec& spec, const HostStoreOptions& options)
    : dev_(dev), spec_(spec), options_(options) {
  STRATA_CHECK(options_.moments == DType::f32 || options_.moments == DType::bf16, "AdamW moments are f32 or bf16, not ",
               dtype_name(options_.moments));
  STRATA_CHECK(!options_.state_on_nvme || options_.needs.moments, "offload.optimizer = \"nvme\" places AdamW "
               "moments on NVMe, and this optimizer keeps none (its fp32 master stays in RAM): set offload.optimizer "
               "= \"host\"");
  HostStoreLayout l = layout(spec_);
  STRATA_CHECK(options_.weights_only || !options_.state_on_nvme || options_.nvme_first_group < l.groups.size(),
               "the optimizer state's NVMe part starts at parameter group ", options_.nvme_first_group,
               ", but the model has ", l.groups.size(), " groups (embed, the layers, head)");
  STRATA_CHECK(!l.packed || options_.weights_only, "an NF4 base (lora.base_dtype = \"nf4\") is frozen: it trains "
               "LoRA adapters only (set lora.r > 0)");
  master_is_working_ = working_is_f32(l);
  working_ = std::move(l.working);
  f32_ = std::move(l.f32);
  groups_ = std::move(l.groups);
  device_ = std::move(l.device);
  packed_ = l.packed;
  for (size_t r = 0; master_is_working_ && r < f32_.size(); ++r)
    STRATA_ASSERT(working_[r].offset == f32_[r].offset, "f32 working and master tables differ at ", f32_[r].name);
  const size_t working_bytes = working_.tier_bytes(Tier::host_pinned);
  const size_t n = f32_floats();
  // pinned where the device can pin it; a fallback to pageable memory counts as host
  auto account = [&](const void* p, size_t bytes) { (dev_.host_is_pinned(p) ? pinned_bytes_ : host_bytes_) += bytes; };
  if (!options_.weights_only) {
    const HostStoreLayout placed{working_, f32_, groups_};
    derived_layers_ = derived_working_layers(placed, options_);
  }
  STRATA_CHECK(!options_.grads_in_flight || options_.needs.grads, "gradients in flight need an optimizer that keeps gradients");
  STRATA_CHECK(derived_layers_ == 0 || (!master_is_working_ && options_.needs.moments),
               "offload.working_weights = \"derived\" makes bf16 working weights from AdamW's fp32 master: it needs "
               "model.dtype = \"bf16\" and optim.type = \"adamw\" (set offload.working_weights = \"stored\")");
  if (derived_layers_ > 0) alloc_derived_working(working_bytes);
  else {
    working_data_ = static_cast<char*>(dev_.alloc_pinned(working_bytes));
    account(working_data_, working_bytes);
    std::memset(working_data_, 0, working_bytes);
  }
  if (master_is_working_) master_ = reinterpret_cast<float*>(working_data_);
  if (options_.weights_only) return;
  try {
    if (options_.needs.grads) {
      const HostStoreLayout placed{working_, f32_, groups_};
      const size_t bytes = grad_buffer_bytes(placed, options_.grads_in_flight);
      grad_floats_ = bytes / 4;
      grad_slot_floats_ = (groups_[0].f32_offset + groups_[0].f32_bytes) / 4;
      row_group_.assign(f32_.size(), 0);
      for (size_t g = 0; g < groups_.size(); ++g)
        for (size_t r = groups_[g].first_row; r < groups_[g].end_row; ++r) row_group_[r] = uint32_t(g);
      grad_ = static_cast<float*>(dev_.alloc_pinned(bytes));
      account(grad_, bytes);
      std::memset(grad_, 0, bytes);
    }
    // master, m and v in RAM for all groups, or for those before the split; the rest on NVMe
    const HostStoreLayout placed{working_, f32_, groups_, device_, packed_};
    alloc_state_arrays(state_ram_f32_bytes(placed, options_) / 4);
    if (!options_.state_on_nvme) {
      placement_ = std::make_unique<RamStatePlacement>(*this);
      return;
    }
    auto nvme = std::make_unique<NvmeStatePlacement>(placed, options_, master_is_working_ ? master_ : nullptr);
    host_bytes_ += nvme->host_bytes();
    const size_t first = options_.nvme_first_group;
    if (first == 0) {  // every group on NVMe
      placement_ = std::move(nvme);
      return;
    }
    placement_ = std::make_unique<SplitStatePlacement>(std::make_unique<RamStatePlacement>(*this), std::move(nvme),
                                                       first, f32_prefix_bytes(placed, first),
                                                       state_elem_bytes(StateArray::m));
  } catch (...) {
    release();
    throw;
  }
}

// Master (unless it is the f32 working copy), m and v in RAM for the f32 arena's first `floats`
// elements: all of it, the prefix before a split's NVMe groups, or none.
void HostStore::alloc_state_arrays(size_t floats) {
  if (floats == 0) return;
  if (!master_is_working_) {
    master_ = static_cast<float*>(alloc_host_bytes(floats * 4, "master weights"));
    host_bytes_ += floats * 4;
  }
  if (options_.needs.moments) {
    const size_t moment_bytes = floats * dtype_size(options_.moments);
    m_ = alloc_host_bytes(moment_bytes, "AdamW first moments");
    v_ = alloc_host_bytes(moment_bytes, "AdamW second moments");
    host_bytes_ += 2 * moment_bytes;
  }
}

namespace {
size_t page_round(size_t bytes) { return (bytes + 4095) / 4096 * 4096; }
}  // namespace

// working | master (unless it is the f32 working copy) | m | v | grad, each starting on a page.
size_t HostStore::shared_bytes(const ModelSpec& spec) {
  const HostStoreLayout l = layout(spec);
  const size_t f32_arrays = working_is_f32(l) ? 3 : 4;
  return page_round(l.working.tier_bytes(Tier::host_pinned)) + f32_arrays * page_round(l.f32.tier_bytes(Tier::host));
}

HostStore::HostStore(Device& dev, const ModelSpec& spec, void* shared) : dev_(dev), spec_(spec), shared_(true) {
  HostStoreLayout l = layout(spec_);
  STRATA_CHECK(!l.packed, "an NF4 base (lora.base_dtype = \"nf4\") is not shared between ranks yet: run one process "
               "per node (distributed.shared_host_store = false), or lora.base_dtype = \"auto\"");
  master_is_working_ = working_is_f32(l);
  working_ = std::move(l.working);
  f32_ = std::move(l.f32);
  groups_ = std::move(l.groups);
  device_ = std::move(l.device);
  char* p = static_cast<char*>(shared);
  working_data_ = p;
  p += page_round(working_.tier_bytes(Tier::host_pinned));
  if (master_is_working_) master_ = reinterpret_cast<float*>(working_data_);
  std::vector<void**> arrays = {&m_, &v_, reinterpret_cast<void**>(&grad_)};  // f32 moments (options_ default)
  if (!master_is_working_) arrays.insert(arrays.begin(), reinterpret_cast<void**>(&master_));
  for (void** a : arrays) {
    *a = p;
    p += page_round(f32_floats() * 4);
  }
  host_bytes_ = shared_bytes(spec_);
  placement_ = std::make_unique<RamStatePlacement>(*this);
}

void HostStore::release() {
  placement_.reset();  // first: the NVMe placement finishes its I/O and removes its files
  if (shared_) {       // the caller's memory
    master_ = grad_ = nullptr;
    m_ = v_ = nullptr;
    working_data_ = nullptr;
    return;
  }
  if (!master_is_working_) std::free(master_);
  std::free(m_);
  std::free(v_);
  if (working_reserved_ > 0) {
    for (const auto& [p, registered] : working_kept_)
      if (registered > 0) dev_.unregister_host(p);
    if (working_data_) munmap(working_data_, working_reserved_);
    working_kept_.clear();
    working_reserved_ = 0;
  } else {
    dev_.free_pinned(working_data_);
  }
  if (grad_) dev_.free_pinned(grad_);
  master_ = grad_ = nullptr;
  m_ = v_ = nullptr;
  working_data_ = nullptr;
}

HostStore::~HostStore() { release(); }

// The byte offset of elements [first, first + count) of row's f32 tensor in array a's state
// (its own element size), after checking the store holds that array.
size_t HostStore::state_at(StateArray a, size_t row, int64_t first, int64_t count) const {
  STRATA_ASSERT(placement_, "a weights-only host store has no optimizer state");
  STRATA_ASSERT(holds(a), "the store holds no ", state_array_name(a), " (the optimizer does not need it)");
  STRATA_ASSERT(first >= 0 && count >= 0 && first + count <= f32_[row].numel());
  return (f32_[row].offset / 4 + size_t(first)) * state_elem_bytes(a);
}

// Calls f(scratch, k, len) over [0, count) in pieces of at most kStateConvertElements, with a bf16
// scratch of that size (no transient the plan misses).
template <class F>
void in_bf16_pieces(size_t count, F&& f) {
  std::vector<bf16> narrow(std::min<size_t>(count, kStateConvertElements));
  for (size_t k = 0; k < count; k += narrow.size()) f(narrow.data(), k, std::min(narrow.size(), count - k));
}

void HostStore::read_state(StateArray a, size_t row, int64_t first, int64_t count, float* dst) const {
  const size_t at = state_at(a, row, first, count), es = state_elem_bytes(a);
  if (es == 4) return placement_->read(a, at, dst, size_t(count) * 4);
  in_bf16_pieces(size_t(count), [&](bf16* narrow, size_t k, size_t len) {  // bf16 moments: read, widen (exact)
    placement_->read(a, at + k * es, narrow, len * es);
    dtype_convert(dst + k, DType::f32, narrow, DType::bf16, len);
  });
}

void HostStore::write_state(StateArray a, size_t row, int64_t first, int64_t count, const float* src) {
  const size_t at = state_at(a, row, first, count), es = state_elem_bytes(a);
  if (es == 4) return placement_->write(a, at, src, size_t(count) * 4);
  in_bf16_pieces(size_t(count), [&](bf16* narrow, size_t k, size_t len) {  // round to nearest even, write
    dtype_convert(narrow, DType::bf16, src + k, DType::f32, len);
    placement_->write(a, at + k * es, narrow, len * es);
  });
}

void HostStore::set_param(size_t row, const float* values) {
  const int64_t n = f32_[row].numel();
  if (!master_is_working_ && !options_.weights_only) write_state(StateArray::master, row, 0, n, values);
  if (row_derived(row)) return;
  if (working_[row].dtype == DType::u8) return nf4_pack_row(static_cast<char*>(working_of(row)), values, n, spec_.base_quant);
  dtype_convert(working_of(row), working_[row].dtype, values, DType::f32, size_t(n));
}

// ---- derived working weights (offload.working_weights = "derived") ----------------------------

// The arena as reserved address space: only the kept ranges (the embedding before the derived
// layers, the NVMe groups' layers and the head after them) are touched and pinned; the derived
// layers' pages in between are never touched and take no memory. Accounted by the kept bytes.
void HostStore::alloc_derived_working(size_t working_bytes) {
  constexpr size_t kPage = 4096;
  working_reserved_ = std::max<size_t>((working_bytes + kPage - 1) / kPage * kPage, kPage);
  void* p = mmap(nullptr, working_reserved_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  STRATA_CHECK_BUDGET(p != MAP_FAILED, "cannot reserve ", format_bytes(working_bytes),
                      " of address space for the working weights: ", std::strerror(errno));
  working_data_ = static_cast<char*>(p);
  const size_t lo = groups_[1].working_offset;
  const size_t hi = groups_[derived_layers_].working_offset + groups_[derived_layers_].working_bytes;
  // whole pages around each kept range (at most a page of a derived layer's range in each; one
  // range when the derived layers span less than a page)
  const size_t lo_end = std::min(working_reserved_, (lo + kPage - 1) / kPage * kPage);
  const size_t hi_begin = std::max(lo_end, hi / kPage * kPage);
  const std::pair<size_t, size_t> kept[] = {{0, lo_end}, {hi_begin, working_reserved_}};
  bool pinned = true;
  for (const auto& [begin, end] : kept) {
    if (end <= begin) continue;
    char* at = working_data_ + begin;
    std::memset(at, 0, end - begin);  // touched now, before pinning
    const bool registered = dev_.register_host(at, end - begin);
    pinned = pinned && registered;
    working_kept_.push_back({at, registered ? end - begin : 0});
  }
  // the kept bytes exactly as the plan counts them (the working copy less the derived layers')
  (pinned ? pinned_bytes_ : host_bytes_) += working_bytes - (hi - lo);
}

void HostStore::derive_working(size_t layer, char* dst) const {
  STRATA_ASSERT(layer_derived(layer) && master_, "layer ", layer, "'s working copy is not derived");
  const ParamGroup& g = groups_[1 + layer];
  for (size_t r = g.first_row; r < g.end_row; ++r) {
    const TensorSpec& w = working_[r];
    const float* src = master_ + f32_[r].offset / 4;
    const int64_t n = w.numel();
    if (w.dtype == DType::f32) {  // norms (and biases) are f32 in the working copy too: the master itself
      std::memcpy(dst + (w.offset - g.working_offset), src, size_t(n) * 4);
      continue;
    }
    STRATA_ASSERT(w.dtype == DType::bf16, "a derived working copy is bf16 or f32, not ", dtype_name(w.dtype));
    bf16* out = reinterpret_cast<bf16*>(dst + (w.offset - g.working_offset));
    constexpr int64_t kPiece = int64_t(1) << 16;
#pragma omp parallel for schedule(static)
    for (int64_t at = 0; at < n; at += kPiece) {
      const int64_t end = std::min(n, at + kPiece);
      for (int64_t i = at; i < end; ++i) out[i] = f32_to_bf16(src[i]);  // AdamW's rounding, vectorised
    }
  }
}

size_t HostStore::derived_staging_bytes() const {
  return strata::derived_staging_bytes(HostStoreLayout{working_, f32_, groups_}, derived_layers_);
}

void HostStore::get_param(size_t row, float* values) const {
  if (working_[row].dtype == DType::u8)  // packed: its dequantized bf16 values
    return nf4_unpack_row(values, working_data_ + working_[row].offset, f32_[row].numel(), spec_.base_quant.double_quant);
  if (options_.weights_only) {  // the working copy is all there is
    dtype_convert(values, DType::f32, working_data_ + working_[row].offset, working_[row].dtype, size_t(f32_[row].numel()));
    return;
  }
  read_state(StateArray::master, row, 0, f32_[row].numel(), values);
}

const char* state_array_name(StateArray a) {
  constexpr const char* kNames[] = {"master", "exp_avg", "exp_avg_sq"};  // StateArray's order
  return size_t(a) < std::size(kNames) ? kNames[size_t(a)] : "?";
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

}  // namespace strata
