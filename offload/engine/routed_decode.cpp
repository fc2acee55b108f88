// The routed decode's uploads (routed_decode.h): a layer's shared part, then its routed experts.
#include "offload/engine/routed_decode.h"

#include <cstring>

#include "offload/state/nf4_layout.h"
#include "src/core/error.h"

namespace strata {
namespace {

// Bytes [begin, end) of a layer's host block (offsets from the block's start; the slot's layout is
// the working copy's when nothing is packed).
struct ByteRange {
  size_t begin = 0, end = 0;
};

// The shared part of layer `layer`: everything before its first expert (the whole block when it
// is not MoE); *end_row: its rows end there.
ByteRange shared_range(const HostStore& store, size_t layer, size_t* end_row = nullptr) {
  const ParamGroup& g = store.layer_group(layer);
  MoeExpertParams e;
  if (end_row) *end_row = g.end_row;
  if (!moe_kind_expert_params(*store.spec().layers[layer].kind, &e)) return {0, g.working_bytes};
  const int64_t row = store.spec().layers[layer].rows[e.first];
  STRATA_ASSERT(row != kAbsent, "a MoE layer without its first expert's weights");
  if (end_row) *end_row = size_t(row);
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
  if (store.derived_layers() > 0) return false;
  MoeExpertParams e;
  for (const ModelLayer& l : store.spec().layers)
    if (moe_kind_expert_params(*l.kind, &e)) return true;
  return false;
}

RoutedDecodeStream::RoutedDecodeStream(Device& dev, HostStore& store, std::vector<char*> slots)
    : dev_(dev), store_(store), slots_(std::move(slots)), held_(slots_.size()) {
  STRATA_ASSERT(!slots_.empty() && routed_decode_applies(store), "a routed decode without slots or experts");
  if (store.packed()) {  // the slot layout of an NF4 base: [decoded | packed] (offload/state/nf4_layout.h)
    const size_t packed_at = layer_slot_bytes(HostStore::layout(store.spec()), store.spec().layers.size()).decoded;
    for (char* slot : slots_) packed_slots_.push_back(slot + packed_at);
  }
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

void RoutedDecodeStream::upload(char* dst, const char* src, size_t bytes) {
  dev_.copy_h2d(dst, src, bytes, Stream::h2d);
  upload_bytes_ += bytes;
}

const char* RoutedDecodeStream::acquire(size_t layer) {
  const size_t s = slot_of(layer);
  Held& h = held_[s];
  bool decode = false;
  size_t end_row = 0;
  if (h.layer != int64_t(layer) || !h.shared) {
    const ByteRange r = shared_range(store_, layer, &end_row);
    const char* block = store_.working() + store_.layer_group(layer).working_offset;
    dev_.stream_wait_event(Stream::h2d, *released_[s]);
    // an NF4 base: the shared part's host bytes into the slot's packed part, decoded below
    upload((packed_slots_.empty() ? slots_[s] : packed_slots_[s]) + r.begin, block + r.begin, r.end - r.begin);
    dev_.event_record(*loaded_[s], Stream::h2d);
    if (h.layer != int64_t(layer)) {  // the slot's experts are another layer's
      h.layer = int64_t(layer);
      MoeExpertParams e;
      h.experts.assign(moe_kind_expert_params(*store_.spec().layers[layer].kind, &e) ? size_t(e.experts) : 0, false);
    }
    h.shared = true;
    decode = !packed_slots_.empty();
  }
  dev_.stream_wait_event(Stream::compute, *loaded_[s]);
  // in compute-stream order: after the upload, before the layer's reads (and, as the slot's next
  // shared upload waits for released[s], before that upload overwrites the packed copy)
  if (decode) nf4_decode_rows(dev_, slots_[s], packed_slots_[s], store_, layer, end_row, Stream::compute);
  return slots_[s];
}

void RoutedDecodeStream::fetch_experts(size_t layer, const std::vector<int32_t>& experts) {
  const size_t s = slot_of(layer);
  Held& h = held_[s];
  STRATA_ASSERT(h.layer == int64_t(layer) && h.shared, "experts of layer ", layer, " fetched before its shared part");
  MoeExpertParams e;
  STRATA_ASSERT(moe_kind_expert_params(*store_.spec().layers[layer].kind, &e), "experts of a layer that has none");
  const ParamGroup& g = store_.layer_group(layer);
  const char* block = store_.working() + g.working_offset;
  bool uploaded = false;
  for (int32_t x : experts) {
    STRATA_ASSERT(x >= 0 && x < e.experts, "expert ", x, " of ", e.experts);
    if (h.experts[size_t(x)]) continue;
    // bytes no queued read of the slot touches
    if (packed_slots_.empty()) {  // the slot is the host block's layout: the expert's rows in one copy
      const ByteRange r = expert_range(store_, layer, e, x);
      upload(slots_[s] + r.begin, block + r.begin, r.end - r.begin);
    } else {  // an NF4 base leaves the experts unpacked: each row straight to its decoded place
      const std::vector<int64_t>& rows = store_.spec().layers[layer].rows;
      for (size_t k = 0; k < e.per_expert; ++k) {
        const size_t r = size_t(rows[e.first + size_t(x) * e.per_expert + k]);
        const TensorSpec &host = store_.working_table()[r], &dev = store_.device_table()[r];
        STRATA_ASSERT(host.dtype == dev.dtype && host.bytes() == dev.bytes(), "expert ", x, " of layer ", layer,
                      ": a packed row");
        upload(slots_[s] + (dev.offset - g.device_offset), block + (host.offset - g.working_offset), host.bytes());
      }
    }
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
