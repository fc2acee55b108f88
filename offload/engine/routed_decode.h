// The generator's decode with streamed weights that uploads only the experts its tokens were
// routed to (DESIGN §11: "decode streams only routed experts"). A decode step runs B tokens, so a
// mixture-of-experts layer reads at most B x k of its E experts; the prefill (many tokens, most
// experts) keeps the layer pass's whole-layer uploads (offload/engine/layer_pass.h).
//
// During the decode passes this stream, not the layer pass, fills the generator's two layer slots
// (the same device memory, the same layout: a layer's tensors sit where layer_weights_in finds
// them, offload/stream/weight_stream.h). For each layer it uploads the shared part first — a
// dense layer's whole block, a MoE layer's attention half, norms and router (the parameters
// before MoeExpertParams::first, models/moe_layer.h) — and, once the layer's router has chosen
// (moe_forward_from_attention_routed), the union of the chosen experts that the slot does not
// hold yet, each at its own offset. A slot remembers what it holds (its layer, the shared part,
// which experts), so a model of one or two layers re-uploads only the experts it has not seen.
//
// Events, one pair per slot, as the weight stream's:
//   loaded[s]    h2d (after the slot's uploads)  compute (before reading them)
//   released[s]  compute (the layer's last read) h2d (before the next layer's shared upload)
// An expert upload into the slot the compute stream is reading writes bytes no queued read
// touches (the layer's unrouted experts), so it waits for nothing but the h2d stream's order.
//
// Hand-over with the layer pass: the two write the same slots, one phase each. The generator
// calls forget() after each prefill (the layer pass wrote the slots) and LayerPass::mark_stale()
// before the next one (this stream wrote them); each pass ends with a compute-stream synchronize,
// so no copy or read of the other phase is still queued.
//
// An NF4 base (offload/state/nf4_layout.h: a slot is [decoded | packed]): the shared part's host
// bytes land in the slot's packed part and are decoded on the compute stream (its packed linears
// dequantized, its norms and router copied) into the decoded part, where the layer reads them;
// the experts, which bitsandbytes leaves unpacked (bf16), go row by row straight to their decoded
// places. So a decode pass moves the packed shared part and the routed experts only.
//
// Not used (the generator keeps whole-layer uploads) when the weights are resident, or when a
// layer's working copy is derived at upload (offload.working_weights = "derived": it is made
// whole, into staging).
// Legend: E experts, k experts per token, B decode rows.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "models/moe_layer.h"
#include "offload/state/host_store.h"

namespace strata {

// The store can be decoded with routed uploads: some layer is MoE and no layer is derived.
bool routed_decode_applies(const HostStore& store);

class RoutedDecodeStream {
 public:
  // slots: the generator's two streamed layer slots (one when L = 1), each as large as the
  // largest layer's block.
  RoutedDecodeStream(Device& dev, HostStore& store, std::vector<char*> slots);
  ~RoutedDecodeStream();
  RoutedDecodeStream(const RoutedDecodeStream&) = delete;
  RoutedDecodeStream& operator=(const RoutedDecodeStream&) = delete;

  // The layer's slot with its shared part current (a non-MoE layer: all of it); the compute
  // stream waits for the upload.
  const char* acquire(size_t layer);
  // A MoE layer acquired last: its experts `experts` (ascending) current in the slot.
  void fetch_experts(size_t layer, const std::vector<int32_t>& experts);
  // The compute stream queued its last read of the layer.
  void release(size_t layer);
  // Another writer (the layer pass's prefill) filled the slots: nothing is held.
  void forget();

  uint64_t upload_bytes() const { return upload_bytes_; }      // everything this stream uploaded
  int64_t experts_uploaded() const { return experts_uploaded_; }
  int64_t experts_routed() const { return experts_routed_; }   // sum over fetches of the union's size

 private:
  struct Held {
    int64_t layer = -1;         // the layer whose bytes the slot holds (in part)
    bool shared = false;        // its shared part (a non-MoE layer: the whole block)
    std::vector<bool> experts;  // (E) which of its experts
  };
  size_t slot_of(size_t layer) const { return layer % slots_.size(); }
  void upload(char* dst, const char* src, size_t bytes);  // h2d into a slot, counted


  Device& dev_;
  HostStore& store_;
  std::vector<char*> slots_;         // what the layer reads (an NF4 base: the decoded part)
  std::vector<char*> packed_slots_;  // an NF4 base: each slot's packed part; else empty
  std::vector<Held> held_;
  std::vector<std::unique_ptr<Event>> loaded_, released_;
  uint64_t upload_bytes_ = 0;
  int64_t experts_uploaded_ = 0, experts_routed_ = 0;
};

}  // namespace strata
