// Host weights streamed through device slots (weight_stream.h).
#include "offload/stream/weight_stream.h"
#include "offload/stream/layer_views.h"

#include <algorithm>
#include <type_traits>

#include "src/core/error.h"

namespace strata {

WeightStream::WeightStream(Device& dev, std::vector<char*> slots)
    : dev_(dev), slots_(std::move(slots)), held_(slots_.size(), -1) {
  for (size_t s = 0; s < slots_.size(); ++s) {
    loaded_.push_back(dev_.event_create());
    released_.push_back(dev_.event_create());
  }
}

char* WeightStream::acquire(size_t block, HostBlock from, const std::function<void()>& before_upload) {
  STRATA_ASSERT(!slots_.empty(), "a weight stream without slots");
  const size_t s = slot_of(block);
  if (held_[s] != int64_t(block)) {
    if (before_upload) before_upload();
    dev_.stream_wait_event(Stream::h2d, *released_[s]);
    dev_.copy_h2d(slots_[s], from.src, from.bytes, Stream::h2d);
    dev_.event_record(*loaded_[s], Stream::h2d);
    held_[s] = int64_t(block);
  }
  dev_.stream_wait_event(Stream::compute, *loaded_[s]);
  return slots_[s];
}

void WeightStream::release(size_t block) { dev_.event_record(*released_[slot_of(block)], Stream::compute); }

void WeightStream::invalidate() { std::fill(held_.begin(), held_.end(), -1); }

char* ResidentBlock::acquire(HostBlock from, const std::function<void()>& before_upload) {
  if (stale_) {
    if (before_upload) before_upload();
    dev_.copy_h2d(dst_, from.src, from.bytes, Stream::compute);
    stale_ = false;
  }
  return dst_;
}

namespace {

// A layer's tensors inside one contiguous block: `at` maps a parameter row to its address (null
// where the family has no such tensor).
template <class View, class At>
View layer_view(const LayerParamRows& r, At at) {
  View v;
  auto set = [&](auto& field, int64_t row) { field = static_cast<std::remove_reference_t<decltype(field)>>(at(row)); };
  set(v.q, r.q), set(v.k, r.k), set(v.v, r.v), set(v.o, r.o);
  set(v.gate, r.gate), set(v.up, r.up), set(v.down, r.down);
  set(v.input_norm, r.input_norm), set(v.post_norm, r.post_norm), set(v.q_norm, r.q_norm), set(v.k_norm, r.k_norm);
  set(v.q_bias, r.q_bias), set(v.k_bias, r.k_bias), set(v.v_bias, r.v_bias), set(v.o_bias, r.o_bias);
  return v;
}

// The same inside a block laid out as a parameter group: rows of `table` from offset `first` on.
template <class View, class Byte>
View group_view(const LayerParamRows& rows, const TensorTable& table, size_t first, Byte* base) {
  using Ptr = std::conditional_t<std::is_const_v<Byte>, const void*, void*>;
  return layer_view<View>(rows, [&](int64_t row) -> Ptr {
    return row == kAbsent ? nullptr : base + (table[size_t(row)].offset - first);
  });
}

}  // namespace

LayerWeights layer_weights_in(const ModelSpec& spec, const HostStoreLayout& layout, const char* base, size_t layer) {
  return group_view<LayerWeights>(spec.layers[layer], layout.working, layout.groups[1 + layer].working_offset, base);
}

LayerGrads layer_grads_in(const ModelSpec& spec, const HostStoreLayout& layout, char* base, size_t layer) {
  return group_view<LayerGrads>(spec.layers[layer], layout.f32, layout.groups[1 + layer].f32_offset, base);
}

LayerWeights layer_weights_in(const HostStore& store, const char* base, size_t layer) {
  return group_view<LayerWeights>(store.spec().layers[layer], store.working_table(), store.layer_group(layer).working_offset, base);
}

LayerGrads layer_grads_in(const HostStore& store, char* base, size_t layer) {
  return group_view<LayerGrads>(store.spec().layers[layer], store.f32_table(), store.layer_group(layer).f32_offset, base);
}

HostBlock layer_host_block(HostStore& store, size_t layer) {
  const ParamGroup& g = store.layer_group(layer);
  return {store.working() + g.working_offset, g.working_bytes};
}

HostBlock tensor_host_block(HostStore& store, int64_t row) {
  const TensorSpec& t = store.working_table()[size_t(row)];
  return {store.working() + t.offset, t.bytes()};
}

HostBlock lm_head_chunk_block(HostStore& store, size_t chunk, int64_t rows) {
  const TensorSpec& lm = store.working_table()[size_t(store.spec().lm_head_row())];
  const int64_t V = store.spec().config.vocab_size;
  const size_t row_bytes = size_t(store.spec().config.hidden_size) * dtype_size(lm.dtype);
  const int64_t v0 = int64_t(chunk) * rows, vc = std::min(rows, V - v0);
  STRATA_ASSERT(vc > 0, "lm_head chunk ", chunk, " is past the vocabulary");
  return {store.working() + lm.offset + size_t(v0) * row_bytes, size_t(vc) * row_bytes};
}

}  // namespace strata
