// The routed decode's uploads (routed_decode.h): a layer's shared part, then its routed experts.
#include "offload/engine/routed_decode.h"

#include "src/core/error.h"

namespace strata {
namespace {

// Bytes [begin, end) of a layer's block (offsets from the block's start; the slot's layout is the
// working copy's when nothing is packed).
struct ByteRange {
  size_t begin = 0, end = 0;
};

// The shared part of layer `layer`: everything before its first expert (the whole block when it
// is not MoE).
ByteRange shared_range(const HostStore& store, size_t layer) {
  const ParamGroup& g = store.layer_group(layer);
  MoeExpertParams e;
  if (!moe_kind_expert_params(*store.spec().layers[layer].kind, &e)) return {0, g.working_bytes};
  const int64_t row = store.spec().layers[layer].rows[e.first];
  STRATA_ASSERT(row != kAbsent, "a MoE layer without its first expert's weights");
  return {0, store.working_table()[size_t(row)].offset - g.working_offset};
}

// Expert x's parameters (per_expert consecutive rows) in layer `layer`'s block.
ByteRange expert_range(const HostStore& store, size_t layer, const MoeExpertParams& e, int64_t x) {
  const ParamGroup& g = store.layer_group(layer);
  const std::vector<int64_t>& rows = store.spec().layers[layer].rows;
  const TensorSpec& first = store.working_table()[size_t(rows[e.first + size_t(x) * e.per_expert])];
  const TensorSpec& last = store.working_table()[size_t(rows[e.first + size_t(x + 1) * e.per_expert - 1])];
  STRATA_ASSERT(last.offset >= first.offset, "expert ", x, " of layer ", layer, ": its parameters out of order");
  return {first.offset - g.working_offset, last.offset + last.bytes() - g.working_offset};
}

}  // namespace

bool routed_decode_applies(const HostStore& store) {
  if (store.packed() || store.derived_layers() > 0) return false;
  MoeExpertParams e;
  for (const ModelLayer& l : store.spec().layers)
    if (moe_kind_expert_params(*l.kind, &e)) return true;
  return false;
}

RoutedDecodeStream::RoutedDecodeStream(Device& dev, HostStore& store, std::vector<char*> slots)
    : dev_(dev), store_(store), slots_(std::move(slots)), held_(slots_.size()) {
  STRATA_ASSERT(!slots_.empty() && routed_decode_applies(store), "a routed decode without slots or experts");
  for (size_t s = 0; s < slots_.size(); ++s) {
    loaded_.push_back(dev_.event_create());
    released_.push_back(dev_.event_create());
  }
  forget();
}

RoutedDecodeStream::~RoutedDecodeStream() = default;

void RoutedDecodeStream::forget() {
  for (size_t s = 0; s < slots_.size(); ++s) {
    held_[s] = Held{};
    dev_.event_record(*released_[s], Stream::compute);  // after whatever read the slots before
  }
}

void RoutedDecodeStream::upload(size_t s, size_t at, const char* src, size_t bytes) {
  dev_.copy_h2d(slots_[s] + at, src, bytes, Stream::h2d);
  upload_bytes_ += bytes;
}

const char* RoutedDecodeStream::acquire(size_t layer) {
  const size_t s = slot_of(layer);
  Held& h = held_[s];
  if (h.layer != int64_t(layer) || !h.shared) {
    const ByteRange r = shared_range(store_, layer);
    const char* block = store_.working() + store_.layer_group(layer).working_offset;
    dev_.stream_wait_event(Stream::h2d, *released_[s]);
    upload(s, r.begin, block + r.begin, r.end - r.begin);
    dev_.event_record(*loaded_[s], Stream::h2d);
    if (h.layer != int64_t(layer)) {  // the slot's experts are another layer's
      h.layer = int64_t(layer);
      MoeExpertParams e;
      h.experts.assign(moe_kind_expert_params(*store_.spec().layers[layer].kind, &e) ? size_t(e.experts) : 0, false);
    }
    h.shared = true;
  }
  dev_.stream_wait_event(Stream::compute, *loaded_[s]);
  return slots_[s];
}

void RoutedDecodeStream::fetch_experts(size_t layer, const std::vector<int32_t>& experts) {
  const size_t s = slot_of(layer);
  Held& h = held_[s];
  STRATA_ASSERT(h.layer == int64_t(layer) && h.shared, "experts of layer ", layer, " fetched before its shared part");
  MoeExpertParams e;
  STRATA_ASSERT(moe_kind_expert_params(*store_.spec().layers[layer].kind, &e), "experts of a layer that has none");
  const char* block = store_.working() + store_.layer_group(layer).working_offset;
  bool uploaded = false;
  for (int32_t x : experts) {
    STRATA_ASSERT(x >= 0 && x < e.experts, "expert ", x, " of ", e.experts);
    if (h.experts[size_t(x)]) continue;
    const ByteRange r = expert_range(store_, layer, e, x);
    upload(s, r.begin, block + r.begin, r.end - r.begin);  // bytes no queued read of the slot touches
    h.experts[size_t(x)] = true;
    ++experts_uploaded_;
    uploaded = true;
  }
  experts_routed_ += int64_t(experts.size());
  if (!uploaded) return;
  dev_.event_record(*loaded_[s], Stream::h2d);
  dev_.stream_wait_event(Stream::compute, *loaded_[s]);
}

void RoutedDecodeStream::release(size_t layer) { dev_.event_record(*released_[slot_of(layer)], Stream::compute); }

}  // namespace strata
