// Host weights streamed through device slots (weight_stream.h).
#include "offload/stream/weight_stream.h"
#include "offload/stream/layer_views.h"

#include <algorithm>

#include "src/core/error.h"

namespace strata {

WeightStream::WeightStream(Device& dev, std::vector<char*> slots, size_t staging_bytes, size_t resident)
    : dev_(dev), slots_(std::move(slots)), resident_(resident), held_(slots_.size(), -1) {
  STRATA_ASSERT(resident_ <= slots_.size(), "more resident blocks than slots");
  for (size_t s = 0; s < slots_.size(); ++s) {
    loaded_.push_back(dev_.event_create());
    released_.push_back(dev_.event_create());
  }
  if (staging_bytes == 0 || slots_.empty()) return;
  staging_each_ = staging_bytes / kDerivedStagingBuffers;
  for (size_t k = 0; k < kDerivedStagingBuffers; ++k) {
    staging_.push_back(static_cast<char*>(dev_.alloc_pinned(staging_each_)));
    staged_.push_back(dev_.event_create());
    staging_used_.push_back(false);
  }
}

WeightStream::~WeightStream() {
  for (size_t k = 0; k < staging_.size(); ++k) {
    if (staging_used_[k]) dev_.event_synchronize(*staged_[k]);  // no copy still reads it
    dev_.free_pinned(staging_[k]);
  }
}

char* WeightStream::acquire(size_t block, HostBlock from, const std::function<void()>& before_upload) {
  STRATA_ASSERT(!slots_.empty(), "a weight stream without slots");
  const size_t s = slot_of(block);
  if (held_[s] != int64_t(block)) {
    if (before_upload) before_upload();
    const char* src = from.src;
    size_t k = staging_.size();
    if (from.fill) {
      STRATA_ASSERT(!staging_.empty() && from.bytes <= staging_each_, "a derived block of ", from.bytes,
                    " bytes without staging for it (", staging_each_, " bytes a buffer)");
      k = next_staging_++ % staging_.size();
      if (staging_used_[k]) dev_.event_synchronize(*staged_[k]);
      from.fill(staging_[k]);
      src = staging_[k];
    }
    dev_.stream_wait_event(Stream::h2d, *released_[s]);
    dev_.copy_h2d(slots_[s], src, from.bytes, Stream::h2d);
    dev_.event_record(*loaded_[s], Stream::h2d);
    if (k < staging_.size()) {
      dev_.event_record(*staged_[k], Stream::h2d);
      staging_used_[k] = true;
    }
    held_[s] = int64_t(block);
  }
  dev_.stream_wait_event(Stream::compute, *loaded_[s]);
  return slots_[s];
}

void WeightStream::release(size_t block) { dev_.event_record(*released_[slot_of(block)], Stream::compute); }

void WeightStream::invalidate() { std::fill(held_.begin(), held_.end(), -1); }

char* ResidentBlock::acquire(HostBlock from, const std::function<void()>& before_upload) {
  STRATA_ASSERT(!from.fill, "a resident block is never derived");
  if (stale_) {
    if (before_upload) before_upload();
    dev_.copy_h2d(dst_, from.src, from.bytes, Stream::compute);
    stale_ = false;
  }
  return dst_;
}

namespace {

// A layer's tensors inside a block laid out as its parameter group: rows of `table` from offset
// `first` on, in its kind's parameter order (null where the configuration has none).
template <class View, class Byte>
View group_view(const ModelLayer& layer, const TensorTable& table, size_t first, Byte* base) {
  View v;
  using Ptr = typename decltype(v.param)::value_type;
  for (int64_t row : layer.rows)
    v.param.push_back(row == kAbsent ? nullptr : reinterpret_cast<Ptr>(base + (table[size_t(row)].offset - first)));
  return v;
}

}  // namespace

LayerTensors layer_weights_in(const ModelSpec& spec, const HostStoreLayout& layout, const char* base, size_t layer) {
  return group_view<LayerTensors>(spec.layers[layer], layout.device, layout.groups[1 + layer].device_offset, base);
}

LayerGradTensors layer_grads_in(const ModelSpec& spec, const HostStoreLayout& layout, char* base, size_t layer) {
  return group_view<LayerGradTensors>(spec.layers[layer], layout.f32, layout.groups[1 + layer].f32_offset, base);
}

LayerTensors layer_weights_in(const HostStore& store, const char* base, size_t layer) {
  return group_view<LayerTensors>(store.spec().layers[layer], store.device_table(), store.layer_group(layer).device_offset, base);
}

LayerGradTensors layer_grads_in(const HostStore& store, char* base, size_t layer) {
  return group_view<LayerGradTensors>(store.spec().layers[layer], store.f32_table(), store.layer_group(layer).f32_offset, base);
}

HostBlock layer_host_block(HostStore& store, size_t layer) {
  const ParamGroup& g = store.layer_group(layer);
  if (store.layer_derived(layer))
    return {nullptr, g.working_bytes, [&store, layer](char* dst) { store.derive_working(layer, dst); }};
  return {store.working() + g.working_offset, g.working_bytes, {}};
}

HostBlock tensor_host_block(HostStore& store, int64_t row) {
  const TensorSpec& t = store.working_table()[size_t(row)];
  return {store.working() + t.offset, t.bytes(), {}};
}

HostBlock lm_head_chunk_block(HostStore& store, size_t chunk, int64_t rows) {
  const TensorSpec& lm = store.working_table()[size_t(store.spec().lm_head_row())];
  const int64_t V = store.spec().config.vocab_size;
  const size_t row_bytes = size_t(store.spec().config.hidden_size) * dtype_size(lm.dtype);
  const int64_t v0 = int64_t(chunk) * rows, vc = std::min(rows, V - v0);
  STRATA_ASSERT(vc > 0, "lm_head chunk ", chunk, " is past the vocabulary");
  return {store.working() + lm.offset + size_t(v0) * row_bytes, size_t(vc) * row_bytes, {}};
}

}  // namespace strata
