// The layer pass: the skeleton the three engines (engine.h, engine_zo.h, generator.h) share
// around their per-layer and per-chunk bodies. It owns the device copies of the weights — the
// layer slots and the lm_head chunk slots (offload/stream/weight_stream.h, with their loaded /
// released events), or the resident lm_head, and the resident final norm — and the host queue
// the group updates run on with one ticket per parameter group, so that every upload first waits
// for its group's pending update. It gathers the embedding on the host, uploads the RoPE
// frequencies, drives the layer loop and the lm_head chunk loop (acquire, the engine's body,
// release), marks every device copy stale after an update, synchronizes, and keeps the stats
// every engine reports.
//
// Each engine supplies its bodies: the first-order engine checkpoints and backpropagates, the
// zeroth-order one runs its perturbed passes, the generator decodes through its KV cache. A body
// is one std::function call per layer or chunk, never per element.
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <vector>

#include "offload/engine/step_engine.h"
#include "offload/state/host_store.h"
#include "offload/stream/host_queue.h"
#include "offload/stream/weight_stream.h"

namespace strata {

// Where a pass's weights live on the device (the engine's buffer table allocated them).
struct LayerPassSlots {
  std::vector<char*> layers;       // one per resident layer, then two streamed slots (one when one layer streams)
  size_t resident_layers = 0;      // layers [0, resident_layers) own slots [0, resident_layers)
  std::vector<char*> head;         // lm_head chunk slots (streamed: min(2, K); resident generator: K)
  char* lm_resident = nullptr;     // the whole lm_head, read in place chunk by chunk (none: null)
  float* final_norm = nullptr;     // (C) resident final norm
  int64_t head_rows = 0;           // R: vocab rows per chunk
};

class LayerPass {
 public:
  // updates: the engine queues group updates (a host queue is started); the generator does not.
  LayerPass(Device& dev, HostStore& store, const LayerPassSlots& slots, bool updates);

  // ---- weights: each acquire leaves the compute stream waiting for the copy; an upload first
  //      waits for the pending update of the block's group
  const char* acquire_layer(size_t layer);
  void release_layer(size_t layer);  // the compute stream queued its last read
  const float* acquire_final_norm();
  const char* acquire_head_chunk(size_t chunk);  // rows [chunk x R, ...)
  void release_head_chunk(size_t chunk);
  void mark_stale();  // after an update: no device copy is current

  // ---- the loops: acquire, body, release, layer by layer (L-1..0 when reverse), chunk by chunk
  //      (K-1..0 when reverse; v0 its first vocab row, vc its rows)
  void for_each_layer(bool reverse, const std::function<void(size_t layer, const char* weights)>& body);
  void for_each_head_chunk(bool reverse,
                           const std::function<void(size_t chunk, int64_t v0, int64_t vc, const char* w)>& body);
  size_t layers() const { return L_; }
  size_t head_chunks() const { return K_; }
  int64_t head_rows() const { return R_; }

  // ---- tokens: the embedding rows of `ids` gathered from the working table into x0 (N, C) f32
  //      (exact conversion), after the embedding group's pending update; row_done(n, row), when
  //      given, runs on each row right after it is gathered (the zeroth-order perturbation)
  void embed_gather(float* x0, const int32_t* ids, int64_t N) { embed_gather(x0, ids, N, [](int64_t, float*) {}); }
  template <class RowDone>
  void embed_gather(float* x0, const int32_t* ids, int64_t N, RowDone&& row_done);
  void rope_upload(float* inv_freq);  // (D/2) on the compute stream

  // ---- the group updates on the host queue
  HostQueue& host() { return *host_; }
  void queue_update(size_t group, std::function<void()> update);  // group's next upload waits for it
  void wait_group(size_t group);     // its pending update (the wait counted in optimizer_exposed_s)
  void forget_updates();             // every update known done (after a drain)
  template <class F>
  void optimizer_wait(F&& wait) { optimizer_exposed_s_ += engine_exposed_wait(dev_, wait); }
  size_t lm_group() const;           // the lm_head's group: the embedding's when tied, else the last

  // Every stream, the host queue, then each of `more`, all run even when one fails; the first
  // error is rethrown. Pending updates are forgotten either way.
  void synchronize(std::initializer_list<std::function<void()>> more = {});
  // compute_s, h2d_wait_s, optimizer_s, optimizer_exposed_s, link_bytes, layer_upload_bytes
  EngineStats stats() const;

 private:
  Device& dev_;
  HostStore& store_;
  size_t L_ = 0, K_ = 0;
  int64_t R_ = 0, V_ = 0;
  std::optional<WeightStream> layers_, head_;
  std::vector<char*> decoded_;           // an NF4 base: each layer slot's dequantized part (else empty)
  std::vector<int64_t> decoded_layer_;   // the layer each decoded part holds (-1: none)
  std::optional<ResidentBlock> norm_, lm_resident_;
  std::unique_ptr<HostQueue> host_;
  std::vector<uint64_t> update_ticket_;  // per group: its pending update (0: none)
  std::vector<float> rope_host_;         // (D/2) the source of rope_upload's asynchronous copy
  double optimizer_exposed_s_ = 0;
  size_t layer_upload_bytes_ = 0;        // the decoder layers' blocks uploaded so far
};

template <class RowDone>
void LayerPass::embed_gather(float* x0, const int32_t* ids, int64_t N, RowDone&& row_done) {
  wait_group(0);
  const TensorSpec& emb = store_.working_table()[size_t(store_.spec().embed)];
  const char* table = store_.working() + emb.offset;
  const int64_t C = store_.spec().config.hidden_size;
  const size_t row_bytes = size_t(C) * dtype_size(emb.dtype);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    dtype_convert(x0 + n * C, DType::f32, table + size_t(ids[n]) * row_bytes, emb.dtype, size_t(C));
    row_done(n, x0 + n * C);
  }
}

}  // namespace strata
