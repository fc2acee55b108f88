// The layer pass (layer_pass.h): the weights' device copies and their waits, the loops, the
// embedding gather, the group updates' tickets, synchronize and the common stats.
#include "offload/engine/layer_pass.h"

#include <algorithm>
#include <chrono>

#include "offload/state/nf4_layout.h"
#include "src/core/error.h"

namespace strata {

LayerPass::LayerPass(Device& dev, HostStore& store, const LayerPassSlots& slots, bool updates)
    : dev_(dev), store_(store) {
  const ModelSpec& spec = store.spec();
  L_ = spec.layers.size();
  V_ = spec.config.vocab_size;
  R_ = slots.head_rows;
  STRATA_ASSERT(R_ > 0 && slots.final_norm, "a pass needs its lm_head chunk rows and a final norm slot");
  K_ = size_t((V_ + R_ - 1) / R_);
  // An NF4 base (offload/state/nf4_layout.h): the packed block lands past the slot's decoded
  // part, and is dequantized into it once per upload.
  std::vector<char*> upload_slots = slots.layers;
  if (store.packed()) {
    const size_t packed_at = layer_slot_bytes(HostStore::layout(spec), L_).decoded;
    decoded_ = slots.layers;
    for (char*& p : upload_slots) p += packed_at;
    decoded_layer_.assign(decoded_.size(), -1);
  }
  layers_.emplace(dev_, upload_slots, store.derived_staging_bytes(), slots.resident_layers);
  head_.emplace(dev_, slots.head);
  norm_.emplace(dev_, reinterpret_cast<char*>(slots.final_norm));
  if (slots.lm_resident) lm_resident_.emplace(dev_, slots.lm_resident);
  if (updates) host_ = std::make_unique<HostQueue>();
  update_ticket_.assign(store_.groups().size(), 0);
}

// ---- weights -------------------------------------------------------------------------------

const char* LayerPass::acquire_layer(size_t layer) {
  const HostBlock block = layer_host_block(store_, layer);
  const char* w = layers_->acquire(layer, block, [&] {
    wait_group(1 + layer);
    layer_upload_bytes_ += block.bytes;
  });
  if (decoded_.empty()) return w;
  const size_t s = layers_->slot_of(layer);
  if (decoded_layer_[s] != int64_t(layer)) {  // the upload's bytes are new: decode them (compute stream order)
    nf4_decode_layer(dev_, decoded_[s], w, store_, layer, Stream::compute);
    decoded_layer_[s] = int64_t(layer);
  }
  return decoded_[s];
}

void LayerPass::release_layer(size_t layer) { layers_->release(layer); }

// Gemma 3's final norm scales by (1 + w) (models/gemma_layer.h): the device copy holds 1 + w,
// made once per upload. d(1 + w)/dw = 1, so the norm's backward reads it and its gradient is w's.
const float* LayerPass::acquire_final_norm() {
  const ModelSpec& spec = store_.spec();
  const HostBlock norm = tensor_host_block(store_, spec.final_norm);
  bool uploaded = false;
  float* w = reinterpret_cast<float*>(norm_->acquire(norm, [&] {
    wait_group(store_.groups().size() - 1);
    uploaded = true;
  }));
  if (uploaded && model_norm_plus_one(spec.config)) dev_.affine(w, w, 1.f, 1.f, spec.config.hidden_size, Stream::compute);
  return w;
}

// The lm_head rows of `chunk`: read in place from the resident copy, or streamed through the
// chunk slots.
const char* LayerPass::acquire_head_chunk(size_t chunk) {
  auto wait_update = [&] { wait_group(lm_group()); };
  if (lm_resident_) {
    const char* lm = lm_resident_->acquire(tensor_host_block(store_, store_.spec().lm_head_row()), wait_update);
    const DType lm_type = store_.working_table()[size_t(store_.spec().lm_head_row())].dtype;
    return lm + chunk * size_t(R_) * size_t(store_.spec().config.hidden_size) * dtype_size(lm_type);
  }
  return head_->acquire(chunk, lm_head_chunk_block(store_, chunk, R_), wait_update);
}

void LayerPass::release_head_chunk(size_t chunk) {
  if (!lm_resident_) head_->release(chunk);
}

void LayerPass::mark_stale() {
  layers_->invalidate();
  std::fill(decoded_layer_.begin(), decoded_layer_.end(), -1);
  head_->invalidate();
  norm_->invalidate();
  if (lm_resident_) lm_resident_->invalidate();
}

size_t LayerPass::lm_group() const { return store_.spec().lm_head == kAbsent ? 0 : store_.groups().size() - 1; }

// ---- the loops -----------------------------------------------------------------------------

void LayerPass::for_each_layer(bool reverse, const std::function<void(size_t, const char*)>& body) {
  for (size_t step = 0; step < L_; ++step) {
    const size_t i = reverse ? L_ - 1 - step : step;
    body(i, acquire_layer(i));
    release_layer(i);
  }
}

void LayerPass::for_each_head_chunk(bool reverse,
                                    const std::function<void(size_t, int64_t, int64_t, const char*)>& body) {
  for (size_t step = 0; step < K_; ++step) {
    const size_t k = reverse ? K_ - 1 - step : step;
    const int64_t v0 = int64_t(k) * R_;
    body(k, v0, std::min(R_, V_ - v0), acquire_head_chunk(k));
    release_head_chunk(k);
  }
}

// ---- tokens --------------------------------------------------------------------------------

// The host copy stays a member: the copy runs asynchronously on the compute stream.
void LayerPass::rope_upload(float* inv_freq) {
  rope_host_ = model_rope_inv_freq(store_.spec().config);
  dev_.copy_h2d(inv_freq, rope_host_.data(), bytes_of<float>(int64_t(rope_host_.size())), Stream::compute);
}

// ---- the group updates ---------------------------------------------------------------------

void LayerPass::queue_update(size_t group, std::function<void()> update) {
  STRATA_ASSERT(host_, "a pass without updates queued one");
  update_ticket_[group] = host_->enqueue(std::move(update));
}

void LayerPass::wait_group(size_t group) {
  if (!update_ticket_[group]) return;
  const uint64_t ticket = update_ticket_[group];
  optimizer_wait([&] { host_->wait(ticket); });
  update_ticket_[group] = 0;
}

void LayerPass::forget_updates() { std::fill(update_ticket_.begin(), update_ticket_.end(), 0); }

void LayerPass::synchronize(std::initializer_list<std::function<void()>> more) {
  std::exception_ptr first;
  auto collect = [&](const std::function<void()>& f) {
    try {
      f();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  };
  for (int s = 0; s < kStreamCount; ++s) collect([&] { dev_.stream_synchronize(Stream(s)); });
  if (host_) collect([&] { host_->drain(); });
  for (const std::function<void()>& f : more) collect(f);
  forget_updates();
  if (first) std::rethrow_exception(first);
}

double engine_exposed_wait(Device& dev, const std::function<void()>& wait) {
  const auto t0 = std::chrono::steady_clock::now();
  const DeviceCounters c0 = dev.counters();
  wait();
  const DeviceCounters c1 = dev.counters();
  const double device_s = (c1.compute_busy_s - c0.compute_busy_s) +
                          (c1.stream_wait_s[int(Stream::compute)] - c0.stream_wait_s[int(Stream::compute)]);
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return std::max(0.0, wall_s - device_s);
}

EngineStats LayerPass::stats() const {
  const DeviceCounters c = dev_.counters();
  EngineStats s;
  s.compute_s = c.compute_busy_s;
  s.h2d_wait_s = c.stream_wait_s[int(Stream::compute)];
  s.optimizer_s = host_ ? host_->busy_s() : 0.0;
  s.optimizer_exposed_s = optimizer_exposed_s_;
  s.link_bytes = c.h2d_bytes + c.d2h_bytes;
  s.layer_upload_bytes = layer_upload_bytes_;
  return s;
}

}  // namespace strata
