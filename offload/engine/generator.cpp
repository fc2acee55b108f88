// The generation engine (generator.h). Reading order: set-up (the buffer table's generator rows,
// offload/stream/engine_buffers.h), one pass (embedding, layers, head) over the layer pass
// (layer_pass.h), the decode layer, then the batch loop and token choice.
//
// Events: the layer weight slots and the lm_head chunk slots stream as in training (the layer
// pass's weight_stream.h slots: each slot's loaded / released pair). Everything else runs on the
// compute stream, in order; each pass ends with a compute-stream synchronize (the host needs
// the logits).
#include "offload/engine/generator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>

#include "models/moe_layer.h"
#include "offload/engine/routed_decode.h"
#include "src/core/error.h"
#include "src/device/arena.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// A layer's adapters inside the arena `base`: A, then B in the next row (offload/state/lora.h).
void lora_layer_view(const LoraLayout& l, size_t layer, const float* base, LoraLinear (&out)[kLayerLinears]) {
  for (int t = 0; t < kLayerLinears; ++t) {
    const int64_t a = l.a_row[layer][size_t(t)];
    if (a != kAbsent) out[t] = {base + l.table[size_t(a)].offset / 4, base + l.table[size_t(a) + 1].offset / 4};
  }
}

}  // namespace

// ---- set-up ----------------------------------------------------------------------------------

// The placement for a device as it is now: what the budget leaves after what is allocated and
// what the backend takes at its first GEMM (the cuBLAS workspace: every op runs on the compute
// stream).
GeneratorPlacement Generator::placement_for(Device& dev, const ModelSpec& spec, const GeneratorShape& shape,
                                            const GeneratorLora& lora) {
  const size_t backend = dev.pending_workspace_bytes(Stream::compute) + lora_device_bytes(spec, shape, lora);
  const size_t free_bytes = dev.budget_bytes() > dev.used_bytes() ? dev.budget_bytes() - dev.used_bytes() : 0;
  const size_t left = free_bytes > backend ? free_bytes - backend : 0;
  GeneratorPlacement placement;
  const bool fits = generator_choose_placement(spec, shape, left, &placement);
  STRATA_CHECK_BUDGET(fits, "generation needs ", format_bytes(generator_min_device_bytes(spec, shape) + backend),
                      " of device memory (weights streamed through two slots, the KV cache of ", shape.max_batch,
                      " rows x ", shape.max_context, " positions spilled to host memory through two layer slots",
                      backend ? str_cat(", ", format_bytes(backend), " of cuBLAS workspace and LoRA adapters")
                              : std::string(),
                      "), the budget leaves ", format_bytes(free_bytes),
                      ": raise --device-memory, or lower --max-new-tokens, --batch-size or the prompt length");
  return placement;
}

namespace {

// The generator's dims for its buffers, with the adapters' rank (their scratch in the workspace).
LayerDims generator_dims(const ModelSpec& spec, const GeneratorShape& shape, const GeneratorLora& lora) {
  LayerDims d = generator_layer_dims(spec, shape.max_batch, shape.max_prompt);
  d.lora_r = lora.r;
  return d;
}

}  // namespace

size_t Generator::lora_device_bytes(const ModelSpec& spec, const GeneratorShape& shape, const GeneratorLora& lora) {
  if (lora.r == 0) return 0;
  const size_t with = spec.layer_bytes(LayerBuffer::forward_workspace, generator_dims(spec, shape, lora));
  const size_t without = spec.layer_bytes(LayerBuffer::forward_workspace, generator_dims(spec, shape, {}));
  return Arena::footprint(lora.bytes) + Arena::footprint(with) - Arena::footprint(without);
}

Generator::Generator(Device& dev, HostStore& store, const GeneratorShape& shape, const GeneratorLora& lora)
    : Generator(dev, store, shape, placement_for(dev, store.spec(), shape, lora), lora) {}

Generator::Generator(Device& dev, HostStore& store, const GeneratorShape& shape, const GeneratorPlacement& placement,
                     const GeneratorLora& lora)
    : dev_(dev), store_(store), shape_(shape), placement_(placement), lora_shape_(lora) {
  const ModelSpec& spec = store.spec();
  STRATA_ASSERT(shape.max_batch >= 1 && shape.max_prompt >= 1 && shape.max_context > shape.max_prompt);
  STRATA_ASSERT((lora.r > 0) == (lora.bytes > 0), "generate: LoRA of rank ", lora.r, " in ", lora.bytes, " bytes");
  L_ = spec.layers.size();
  V_ = spec.config.vocab_size;
  dims_ = generator_dims(spec, shape, lora);
  table_ = generator_buffer_table(spec, shape_, placement_, &buf_);
  if (lora.r > 0) {  // the workspace row (the table's first) grows by the adapters' scratch; their arena
    STRATA_ASSERT(table_.front().name == "layer forward workspace", "the generator's table starts elsewhere");
    table_.front().bytes = spec.layer_bytes(LayerBuffer::forward_workspace, dims_);
    table_.push_back({"LoRA adapters (A, scaled B)", lora.bytes, Memory::device,
                      [this](void* p) { lora_dev_ = static_cast<float*>(p); }});
  }
  engine_buffers_allocate(dev_, table_, "generate: ");
  ws_ = LayerScratch{static_cast<char*>(buf_.workspace), nullptr, dims_, false};
  LayerPassSlots slots;
  slots.layers = buf_.weight_slots;
  slots.head = buf_.head_slots;
  slots.final_norm = buf_.final_norm;
  slots.head_rows = generator_head_rows(spec);
  layer_pass_ = std::make_unique<LayerPass>(dev_, store_, slots, /*updates=*/false);
  layer_pass_->rope_upload(buf_.inv_freq);
  if (!placement_.weights_resident && routed_decode_applies(store_))
    routed_ = std::make_unique<RoutedDecodeStream>(dev_, store_, buf_.weight_slots);
  for (size_t s = 0; s < buf_.k_slot.size(); ++s)
    kv_loaded_.push_back(dev_.event_create()), kv_free_.push_back(dev_.event_create());
  dev_.stream_synchronize(Stream::compute);
}

void Generator::set_adapters(const LoraLayout& layout, const float* image) {
  STRATA_ASSERT(lora_dev_ && lora_shape_.r == layout.r && lora_shape_.bytes == layout.bytes && layout.a_row.size() == L_,
                "generate: adapters of rank ", layout.r, " (", layout.bytes, " bytes) on a generator built for rank ",
                lora_shape_.r, " (", lora_shape_.bytes, " bytes)");
  dev_.copy_h2d(lora_dev_, image, layout.bytes, Stream::compute);
  dev_.stream_synchronize(Stream::compute);
  lora_ = &layout;
}

bool Generator::routed_decode() const { return routed_ && routed_on_; }

size_t Generator::kv_host_bytes() const {
  return (L_ - std::min(L_, placement_.kv_device_layers)) * 2 * generator_kv_layer_bytes(store_.spec(), shape_);
}

Generator::~Generator() {
  try {
    layer_pass_->synchronize();
  } catch (...) {  // already reported on the caller's path; still free everything
  }
  engine_buffers_free(dev_, table_);
}

// ---- one pass ----------------------------------------------------------------------------------

void Generator::forward_pass(const std::vector<int32_t>& ids, const std::vector<int32_t>& start, int64_t B, int64_t T,
                             bool prefill) {
  GeneratorBuffers& b = buf_;
  const Stream s = Stream::compute;
  const int64_t N = B * T, C = dims_.C, KD = dims_.Hk * dims_.D;
  dims_.B = B, dims_.T = T;
  // positions and the embedding (gathered on the host, as the training engine does)
  pos_host_.resize(size_t(N));
  for (int64_t r = 0; r < B; ++r)
    for (int64_t t = 0; t < T; ++t) pos_host_[size_t(r * T + t)] = start[size_t(r)] + int32_t(t);
  start_host_ = start;
  dims_.max_pos = layer_dims_max_pos(pos_host_);
  dev_.copy_h2d(b.pos, pos_host_.data(), size_t(N) * 4, s);
  dev_.copy_h2d(b.start, start_host_.data(), size_t(B) * 4, s);
  layer_pass_->embed_gather(b.x_host, ids.data(), N);
  dev_.copy_h2d(b.x_a, b.x_host, size_t(N * C) * 4, s);

  float *x = b.x_a, *y = b.x_b;
  const TokenContext ctx{b.pos, nullptr, b.inv_freq};
  if (!prefill && routed_decode()) {
    decode_layers_routed(x, y, start, B);
    if (x != b.x_a) std::swap(b.x_a, b.x_b);
    return;
  }
  layer_pass_->for_each_layer(false, [&](size_t i, const char* slot) {
    LayerTensors w = layer_weights_in(store_, slot, i);
    if (lora_) lora_layer_view(*lora_, i, lora_dev_, w.lora);
    if (prefill) {
      layer_kind(store_, i).forward(dev_, y, x, w, ctx, ws_, dims_, s);
      const LayerAttention kv = layer_kind(store_, i).attention(ws_);
      // keys (after norm and RoPE) and values into the cache: on the device, or the host's
      if (kv_spilled(i)) {
        kv_write_back(i, kv.k, kv.v, start, B, T);
      } else {
        for (int64_t r = 0; r < B; ++r) {
          const size_t dst = size_t(r * shape_.max_context * KD), src = size_t(r * T * KD), bytes = size_t(T * KD) * 4;
          dev_.copy_d2d(b.k_cache[i] + dst, kv.k + src, bytes, s);
          dev_.copy_d2d(b.v_cache[i] + dst, kv.v + src, bytes, s);
        }
      }
    } else {
      if (kv_spilled(i)) kv_upload(i, start, B);
      decode_layer(i, y, x, w, B, start);
    }
    std::swap(x, y);
  });
  if (x != b.x_a) std::swap(b.x_a, b.x_b);  // the pass's output is in x_a
}

// The decode step of one layer: N = B rows of one token each, the layer's forward with the
// attention over the cache (the new key and value written at the row's position first).
void Generator::decode_layer(size_t layer, float* out, const float* x, const LayerTensors& w, int64_t B,
                             const std::vector<int32_t>& start) {
  GeneratorBuffers& b = buf_;
  const LayerKind& kind = layer_kind(store_, layer);
  const LayerAttention att = kind.attention(ws_);  // q, k, v after forward_qkv; out before forward_from_attention
  const Stream s = Stream::compute;
  const int64_t KD = dims_.Hk * dims_.D;
  kind.forward_qkv(dev_, x, w, TokenContext{b.pos, nullptr, b.inv_freq}, ws_, dims_, s);
  const auto [k_cache, v_cache] = kv_cache(layer);
  for (int64_t r = 0; r < B; ++r) {
    const size_t dst = size_t((r * shape_.max_context + start[size_t(r)]) * KD);
    dev_.copy_d2d(k_cache + dst, att.k + r * KD, size_t(KD) * 4, s);
    dev_.copy_d2d(v_cache + dst, att.v + r * KD, size_t(KD) * 4, s);
  }
  // the prefill's scale, window and dot type (bf16 with bf16 weights)
  dev_.attention_cached_forward(att.out, att.q, k_cache, v_cache, b.start, B, 1, shape_.max_context, dims_.H, dims_.Hk,
                                dims_.D, kind.attention_scale(dims_), dims_.wt, s, kind.attention_window(dims_));
  if (kv_spilled(layer)) {  // the new position to the host; then the slot may take the next layer
    kv_write_back(layer, att.k, att.v, start, B, 1);
    dev_.event_record(*kv_free_[(layer - placement_.kv_device_layers) % b.k_slot.size()], s);
  }
  MoeExpertParams experts;
  if (routed_decode() && moe_kind_expert_params(kind, &experts)) {
    moe_forward_from_attention_routed(kind, dev_, out, x, w, ws_, dims_, s, [&](const std::vector<int32_t>& routed) {
      routed_->fetch_experts(layer, routed);
    });
  } else {
    kind.forward_from_attention(dev_, out, x, w, ws_, dims_, s);
  }
}

// A decode pass's layers with routed uploads (routed_decode.h): the layer pass's loop with the
// routed stream's acquire and release; x ends up holding the pass's output.
void Generator::decode_layers_routed(float*& x, float*& y, const std::vector<int32_t>& start, int64_t B) {
  slots_routed_ = true;
  for (size_t i = 0; i < L_; ++i) {
    LayerTensors w = layer_weights_in(store_, routed_->acquire(i), i);
    if (lora_) lora_layer_view(*lora_, i, lora_dev_, w.lora);  // as the whole-layer pass: adapters unmerged
    if (kv_spilled(i)) kv_upload(i, start, B);
    decode_layer(i, y, x, w, B, start);
    routed_->release(i);
    std::swap(x, y);
  }
}

// ---- the spilled KV cache ------------------------------------------------------------------------

std::pair<float*, float*> Generator::kv_cache(size_t layer) {
  GeneratorBuffers& b = buf_;
  if (!kv_spilled(layer)) return {b.k_cache[layer], b.v_cache[layer]};
  const size_t s = (layer - placement_.kv_device_layers) % b.k_slot.size();
  return {b.k_slot[s], b.v_slot[s]};
}

// Rows' cached positions [0, start[r]) of a spilled layer into its slot, on the h2d stream once
// the slot's previous layer is done with it; the compute stream waits for them.
void Generator::kv_upload(size_t layer, const std::vector<int32_t>& start, int64_t B) {
  GeneratorBuffers& b = buf_;
  const size_t j = layer - placement_.kv_device_layers, s = j % b.k_slot.size();
  const int64_t KD = dims_.Hk * dims_.D;
  dev_.stream_wait_event(Stream::h2d, *kv_free_[s]);
  for (int64_t r = 0; r < B; ++r) {
    const size_t at = size_t(r * shape_.max_context * KD), bytes = size_t(start[size_t(r)] * KD) * 4;
    if (bytes == 0) continue;
    dev_.copy_h2d(b.k_slot[s] + at, b.k_host[j] + at, bytes, Stream::h2d);
    dev_.copy_h2d(b.v_slot[s] + at, b.v_host[j] + at, bytes, Stream::h2d);
    stats_.kv_h2d_bytes += 2 * bytes;
  }
  dev_.event_record(*kv_loaded_[s], Stream::h2d);
  dev_.stream_wait_event(Stream::compute, *kv_loaded_[s]);
}

// k, v (B, T, Hk, D) on the device: row r's T positions go to the host cache at start[r], on the
// compute stream (they follow the kernels that made them; the pass ends with a synchronize).
void Generator::kv_write_back(size_t layer, const float* k, const float* v, const std::vector<int32_t>& start,
                              int64_t B, int64_t T) {
  GeneratorBuffers& b = buf_;
  const size_t j = layer - placement_.kv_device_layers;
  const int64_t KD = dims_.Hk * dims_.D;
  for (int64_t r = 0; r < B; ++r) {
    const size_t dst = size_t((r * shape_.max_context + start[size_t(r)]) * KD), bytes = size_t(T * KD) * 4;
    dev_.copy_d2h(b.k_host[j] + dst, k + r * T * KD, bytes, Stream::compute);
    dev_.copy_d2h(b.v_host[j] + dst, v + r * T * KD, bytes, Stream::compute);
    stats_.kv_d2h_bytes += 2 * bytes;
  }
}

// The final norm and lm_head on row r's position last_index[r] of x_a; logits_ (B, V) on the host.
void Generator::head(const std::vector<int64_t>& last_index, int64_t B) {
  GeneratorBuffers& b = buf_;
  const Stream s = Stream::compute;
  const int64_t C = dims_.C;
  for (int64_t r = 0; r < B; ++r)
    dev_.copy_d2d(b.last + r * C, b.x_a + last_index[size_t(r)] * C, size_t(C) * 4, s);
  dev_.rmsnorm_forward(b.hn, b.rstd, b.last, layer_pass_->acquire_final_norm(), B, C, dims_.eps, s);
  const DType lm_type = store_.working_table()[size_t(store_.spec().lm_head_row())].dtype;
  if (lm_type == DType::bf16) dev_.cast_f32_to_bf16(b.hn_bf16, b.hn, B * C, s);
  const void* a = lm_type == DType::bf16 ? static_cast<const void*>(b.hn_bf16) : b.hn;
  logits_.resize(size_t(B * V_));
  layer_pass_->for_each_head_chunk(false, [&](size_t, int64_t v0, int64_t vc, const char* w) {
    dev_.matmul(b.logits, a, w, lm_type, B, vc, C, false, true, 0.f, s);  // (B, vc)
    for (int64_t r = 0; r < B; ++r)  // on the compute stream: the next chunk's matmul waits for it
      dev_.copy_d2h(logits_.data() + r * V_ + v0, b.logits + r * vc, size_t(vc) * 4, s);
  });
  dev_.stream_synchronize(s);
}

// ---- the batch loop and token choice -------------------------------------------------------------

// The longest prompt's tokens; an empty prompt or a token outside the vocabulary is bad input.
int64_t Generator::longest_prompt(const std::vector<std::vector<int32_t>>& prompts, uint64_t first_request) const {
  int64_t Tp = 0;
  for (size_t r = 0; r < prompts.size(); ++r) {
    STRATA_CHECK(!prompts[r].empty(), "request ", first_request + r, ": the prompt is empty (no tokens)");
    for (int32_t id : prompts[r])
      STRATA_CHECK(id >= 0 && id < V_, "request ", first_request + r, ": token id ", id,
                   " is outside the vocabulary [0, ", V_, ")");
    Tp = std::max<int64_t>(Tp, int64_t(prompts[r].size()));
  }
  STRATA_ASSERT(Tp <= shape_.max_prompt);
  return Tp;
}

std::vector<GenerateResult> Generator::generate(const std::vector<std::vector<int32_t>>& prompts,
                                                const SamplingOptions& options, uint64_t first_request,
                                                const std::function<void(size_t, int32_t)>& on_token) {
  const int64_t B = int64_t(prompts.size());
  STRATA_ASSERT(B >= 1 && B <= shape_.max_batch, "generate: ", B, " prompts, buffers for ", shape_.max_batch);
  const int64_t Tp = longest_prompt(prompts, first_request);
  const int64_t max_new = std::min<int64_t>(options.max_new_tokens, shape_.max_context - Tp);
  std::vector<GenerateResult> results(prompts.size());
  if (options.max_new_tokens <= 0) return results;
  std::vector<std::mt19937_64> rng;
  for (int64_t r = 0; r < B; ++r) rng.emplace_back(options.seed * 0x9E3779B97F4A7C15ull + first_request + uint64_t(r));
  auto pick = [&](int64_t r) {
    const double u = double(rng[size_t(r)]() >> 11) * 0x1.0p-53;
    return generator_pick_token(logits_.data() + r * V_, V_, options, u);
  };
  auto is_eos = [&](int32_t id) {
    return std::find(options.eos_ids.begin(), options.eos_ids.end(), id) != options.eos_ids.end();
  };

  // prefill: right-padded rows (padding repeats the row's last token; its cache entries are
  // overwritten before they can be read)
  std::vector<int32_t> ids(size_t(B * Tp));
  std::vector<int64_t> last(static_cast<size_t>(B));
  std::vector<int32_t> len(static_cast<size_t>(B));  // tokens in each row's cache
  for (int64_t r = 0; r < B; ++r) {
    const auto& p = prompts[size_t(r)];
    for (int64_t t = 0; t < Tp; ++t) ids[size_t(r * Tp + t)] = p[size_t(std::min<int64_t>(t, int64_t(p.size()) - 1))];
    last[size_t(r)] = r * Tp + int64_t(p.size()) - 1;
    len[size_t(r)] = int32_t(p.size());
    stats_.prefill_tokens += int64_t(p.size());
  }
  auto t0 = Clock::now();
  if (slots_routed_) {  // the routed stream wrote the layer slots: the layer pass's copies are stale
    layer_pass_->mark_stale();
    slots_routed_ = false;
  }
  forward_pass(ids, std::vector<int32_t>(size_t(B), 0), B, Tp, /*prefill=*/true);
  head(last, B);
  if (routed_) routed_->forget();  // the prefill wrote the slots (head synchronized the compute stream)
  stats_.prefill_s += seconds_since(t0);

  std::vector<bool> done(size_t(B), false);
  std::vector<int32_t> next(static_cast<size_t>(B));
  int64_t active = B;
  for (int64_t step = 0;; ++step) {
    for (int64_t r = 0; r < B; ++r) {
      if (done[size_t(r)]) continue;
      const int32_t id = pick(r);
      if (is_eos(id)) {
        results[size_t(r)].stopped = true;
      } else {
        results[size_t(r)].tokens.push_back(id);
        if (on_token) on_token(size_t(r), id);
      }
      if (results[size_t(r)].stopped || int64_t(results[size_t(r)].tokens.size()) >= max_new) {
        done[size_t(r)] = true;
        --active;
      }
      next[size_t(r)] = id;
    }
    if (active == 0) break;
    // a finished row repeats its last position (its results are no longer read)
    std::vector<int32_t> start(static_cast<size_t>(B));
    for (int64_t r = 0; r < B; ++r) {
      if (!done[size_t(r)]) {
        start[size_t(r)] = len[size_t(r)]++;
      } else {
        start[size_t(r)] = len[size_t(r)] - 1;
        next[size_t(r)] = 0;
      }
    }
    t0 = Clock::now();
    const uint64_t layer_bytes0 = layer_pass_->stats().layer_upload_bytes, routed_bytes0 = routed_ ? routed_->upload_bytes() : 0;
    const int64_t routed0 = routed_ ? routed_->experts_routed() : 0, uploaded0 = routed_ ? routed_->experts_uploaded() : 0;
    forward_pass(next, start, B, 1, /*prefill=*/false);
    stats_.decode_weight_bytes += layer_pass_->stats().layer_upload_bytes - layer_bytes0;
    if (routed_) {
      stats_.decode_weight_bytes += routed_->upload_bytes() - routed_bytes0;
      stats_.decode_experts_routed += routed_->experts_routed() - routed0;
      stats_.decode_experts_uploaded += routed_->experts_uploaded() - uploaded0;
    }
    ++stats_.decode_passes;
    std::vector<int64_t> rows(static_cast<size_t>(B));
    std::iota(rows.begin(), rows.end(), 0);
    head(rows, B);
    stats_.decode_s += seconds_since(t0);
    stats_.decode_tokens += active;
  }
  return results;
}

int32_t generator_pick_token(const float* logits, int64_t V, const SamplingOptions& o, double u) {
  if (o.temperature <= 0) return int32_t(std::max_element(logits, logits + V) - logits);
  std::vector<int32_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  // descending logits, the lower id first on ties: a fixed order whatever the sort does
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  });
  size_t keep = size_t(V);
  if (o.top_k > 0) keep = std::min(keep, size_t(o.top_k));
  std::vector<double> p(keep);
  const double m = double(logits[order[0]]);
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) sum += p[i] = std::exp((double(logits[order[i]]) - m) / o.temperature);
  if (o.top_p < 1) {  // the smallest prefix whose probability reaches top_p
    double acc = 0;
    for (size_t i = 0; i < keep; ++i) {
      acc += p[i] / sum;
      if (acc >= o.top_p) {
        keep = i + 1;
        break;
      }
    }
    sum = std::accumulate(p.begin(), p.begin() + std::ptrdiff_t(keep), 0.0);
  }
  double target = u * sum, acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += p[i];
    if (target < acc) return order[i];
  }
  return order[keep - 1];
}

}  // namespace strata
