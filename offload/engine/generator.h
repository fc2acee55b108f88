// The generation engine behind `strata generate`: a forward-only pass streamed like training
// (DESIGN §3), with a KV cache within the device budget.
//   - weights: every layer resident when the budget holds them beside the cache (uploaded once),
//     else two device slots, layer i+1 copied in on the h2d stream while layer i computes; the
//     lm_head likewise, in chunks of vocab rows (kHeadChunkRows), resident or through two slots.
//   - KV cache: each layer's keys and values (B, Tcap, Hk, D) on the device while they fit; when
//     they do not (long contexts, many rows), the caches of the last layers live in pinned host
//     memory and pass through two device cache slots like the weights: before layer i attends,
//     its cached positions (each row's [0, start)) are copied in on the h2d stream, and the new
//     position's key and value go back to the host after it. The attention reads the same
//     numbers in the same layout either way, so the tokens are identical; the price is link
//     traffic of 2 x rows x length x Hk x D x 4 bytes per spilled layer per decoded token.
//     GeneratorPlacement says which: the plan's (offload/plan/run_engines.h), or the fitting one
//     that moves fewest bytes (generator_choose_placement).
//   - buffers: rows of the shared buffer table (offload/stream/engine_buffers.h: generator_buffer_table),
//     which the placement plan prices too; the weights' slots, the embedding gather and the layer
//     and lm_head chunk loops are the layer pass's (layer_pass.h).
//   - prefill: the prompts of a batch, right-padded to the longest, in one pass per layer through
//     its kind's forward (the training forward); each layer's keys and values (after the k norm and
//     RoPE, LayerKind::attention) are copied into its cache rows. A padded position writes cache entries that are never
//     read: the row's first generated token overwrites them before any query can reach them.
//   - decode: one token per row per pass; each layer writes the new key and value at the row's
//     position and attends over the cache with attention_cached_forward (the device op). With
//     streamed weights and mixture-of-experts layers, a decode pass uploads a MoE layer's shared
//     part and then only the experts its rows were routed to (offload/engine/routed_decode.h);
//     the tokens are the same as with whole-layer uploads (set_routed_decode(false)).
//   - LoRA (GRPO samples from the current policy, issue 41): built with a GeneratorLora and given
//     the adapters by set_adapters, each targeted linear of every pass (prefill and decode) adds the adapter path,
//     y = x W^T + (x A^T) (s B)^T, through the layer kinds' own LoRA forward (models/decoder_layer.h)
//     with the adapters unmerged in a device arena of the generator's (LoraStore::image: B scaled);
//     the base weights are read as stored, never merged.
//   - head: the final norm and lm_head for each row's last position only; logits (B, V) come to
//     the host, where the next token is chosen (greedy, or temperature / top-k / top-p sampling
//     from a generator seeded per request, so a request's tokens do not depend on its batch).
// Legend: B rows, Tp padded prompt length, Tcap cache positions per row, C hidden, H heads,
// Hk kv heads, D head dim, V vocab.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/layer_kind.h"
#include "offload/engine/layer_pass.h"
#include "offload/state/host_store.h"
#include "offload/stream/engine_buffers.h"

namespace strata {

struct SamplingOptions {
  int64_t max_new_tokens = 256;
  double temperature = 0;  // 0: greedy (argmax, the lowest id on ties)
  int64_t top_k = 0;       // 0: all
  double top_p = 1;        // 1: all
  uint64_t seed = 0;
  std::vector<int32_t> eos_ids;  // generation stops after any of them (not part of the result)
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids, without the EOS that stopped them
  bool stopped = false;         // true: an EOS id came; false: max_new_tokens reached
};

struct GenerateStats {
  int64_t prefill_tokens = 0, decode_tokens = 0;  // real (unpadded) tokens processed
  uint64_t kv_h2d_bytes = 0, kv_d2h_bytes = 0;     // spilled KV cache traffic
  uint64_t decode_weight_bytes = 0;  // decoder-layer weights uploaded by the decode passes
  int64_t decode_passes = 0;
  // routed decode: the experts the passes' MoE layers ran (each layer's union over its rows,
  // summed), and the ones uploaded (not already in the slot)
  int64_t decode_experts_routed = 0, decode_experts_uploaded = 0;
  double prefill_s = 0, decode_s = 0;
};

// LoRA in the layer pass: the adapters' rank and their f32 arena (LoraLayout::r, bytes:
// offload/state/lora.h); r = 0: none.
struct GeneratorLora {
  int64_t r = 0;
  size_t bytes = 0;
};
class RoutedDecodeStream;

class Generator {
 public:
  // The placement that fits what dev's budget leaves (generator_choose_placement) beside the
  // adapters' device bytes (lora_device_bytes); throws a budget error (exit 3) when even streamed
  // weights and a spilled cache do not fit.
  static GeneratorPlacement placement_for(Device& dev, const ModelSpec& spec, const GeneratorShape& shape,
                                          const GeneratorLora& lora = {});
  // What LoRA adds to the buffer table's rows: the adapter arena and the workspace's (N, r)
  // adapter scratch (x A^T), as the arena rounds them.
  static size_t lora_device_bytes(const ModelSpec& spec, const GeneratorShape& shape, const GeneratorLora& lora);

  // `placement`: the plan's (run_plan_generator); without it, placement_for(dev, ...).
  Generator(Device& dev, HostStore& store, const GeneratorShape& shape, const GeneratorPlacement& placement,
            const GeneratorLora& lora = {});
  Generator(Device& dev, HostStore& store, const GeneratorShape& shape, const GeneratorLora& lora = {});
  ~Generator();
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;

  // Generates for up to max_batch prompts in one batch. Request r's sampling generator is seeded
  // from (options.seed, first_request + r). on_token(r, id), when set, sees every token as it
  // comes (the EOS excluded).
  std::vector<GenerateResult> generate(const std::vector<std::vector<int32_t>>& prompts,
                                       const SamplingOptions& options, uint64_t first_request,
                                       const std::function<void(size_t, int32_t)>& on_token = {});

  // LoRA: the adapters of `layout` from `image` (host, LoraStore::image(): every B times the
  // scale) into the generator's arena; the passes after it add them. Needs a generator built
  // with GeneratorLora{layout.r, layout.bytes}. Synchronous (the image may change after).
  void set_adapters(const LoraLayout& layout, const float* image);

  bool weights_resident() const { return placement_.weights_resident; }
  const GeneratorPlacement& placement() const { return placement_; }
  size_t kv_host_bytes() const;  // pinned host memory of the spilled layers' caches
  const GenerateStats& stats() const { return stats_; }
  // Decode MoE layers with routed uploads (the default where it applies: streamed weights, no
  // derived layer, an NF4 base or not; routed_decode_applies) or with whole-layer uploads (false).
  void set_routed_decode(bool on) { routed_on_ = on; }
  bool routed_decode() const;  // the next decode passes upload routed experts only

 private:
  int64_t longest_prompt(const std::vector<std::vector<int32_t>>& prompts, uint64_t first_request) const;
  // One pass: rows' tokens (B rows x T each, row-major) at positions start[b] + t.
  void forward_pass(const std::vector<int32_t>& ids, const std::vector<int32_t>& start, int64_t B, int64_t T,
                    bool prefill);
  void decode_layer(size_t layer, float* out, const float* x, const LayerTensors& w, int64_t B,
                    const std::vector<int32_t>& start);
  void decode_layers_routed(float*& x, float*& y, const std::vector<int32_t>& start, int64_t B);
  // The KV cache of a layer: on the device, or a spilled layer's (uploaded into its cache slot
  // for a decode pass: positions [0, start[r]) of each row).
  bool kv_spilled(size_t layer) const { return layer >= placement_.kv_device_layers; }
  std::pair<float*, float*> kv_cache(size_t layer);
  void kv_upload(size_t layer, const std::vector<int32_t>& start, int64_t B);
  // After a spilled layer ran: its new positions [start[r], start[r] + T) go back to the host.
  void kv_write_back(size_t layer, const float* k, const float* v, const std::vector<int32_t>& start, int64_t B,
                     int64_t T);
  // logits (B, V) on the host of row b's position last[b] of the pass output.
  void head(const std::vector<int64_t>& last_index, int64_t B);

  Device& dev_;
  HostStore& store_;
  GeneratorShape shape_;
  GeneratorPlacement placement_;
  GeneratorLora lora_shape_;
  float* lora_dev_ = nullptr;         // (adapter arena) every layer's A and scaled B; null: no LoRA
  LayerDims dims_;     // B, T set per pass
  size_t L_ = 0;
  int64_t V_ = 0;
  std::vector<EngineBuffer> table_;   // the buffer table's generator rows
  GeneratorBuffers buf_;
  LayerScratch ws_{};
  const LoraLayout* lora_ = nullptr;  // set_adapters' layout; null: the base alone
  std::unique_ptr<LayerPass> layer_pass_;  // weight slots, final norm, embedding gather, the loops
  std::unique_ptr<RoutedDecodeStream> routed_;  // streamed weights with MoE layers: the decode's uploads
  bool routed_on_ = true;
  bool slots_routed_ = false;  // the routed stream wrote the layer slots since the last prefill
  std::vector<std::unique_ptr<Event>> kv_loaded_, kv_free_;  // the spilled layers' cache slots
  std::vector<float> logits_;         // (B, V) host
  std::vector<int32_t> pos_host_, start_host_;
  GenerateStats stats_;
};

// The next token from logits (V): argmax when temperature is 0, else a draw from the
// temperature-scaled softmax restricted to the top_k largest and the smallest set whose
// probability reaches top_p; u in [0, 1) is the draw.
int32_t generator_pick_token(const float* logits, int64_t V, const SamplingOptions& options, double u);

}  // namespace strata
