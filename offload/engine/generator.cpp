// The generation engine (generator.h). Reading order: sizes and set-up, the weights (which slot
// holds what), one pass (embedding, layers, head), the decode layer, then the batch loop and
// token choice.
//
// Events: the layer weight slots and the lm_head chunk slots stream as in training
// (offload/stream/weight_stream.h: each slot's loaded / released pair). Everything else runs on the
// compute stream, in order; each pass ends with a compute-stream synchronize (the host needs
// the logits).
#include "offload/engine/generator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <optional>
#include <random>

#include "offload/stream/engine_buffers.h"
#include "offload/stream/weight_stream.h"
#include "src/core/error.h"
#include "src/device/arena.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

int64_t head_rows_of(const ModelSpec& spec) { return std::min<int64_t>(kHeadChunkRows, spec.config.vocab_size); }

LayerDims dims_of(const ModelSpec& spec, int64_t B, int64_t T) {
  const ModelConfig& c = spec.config;
  LayerDims d;
  d.B = B, d.T = T, d.C = c.hidden_size, d.H = c.num_attention_heads, d.Hk = c.num_key_value_heads;
  d.D = c.head_dim, d.F = c.intermediate_size, d.eps = float(c.rms_norm_eps), d.wt = spec.matrix_dtype;
  return d;
}

// The device allocations of one generator, as (bytes, name) rows in allocation order.
struct DeviceRow {
  size_t bytes;
  const char* name;
};

size_t kv_layer_bytes(const ModelSpec& spec, const GeneratorShape& shape) {  // one of k, v: (B, Tcap, Hk, D) f32
  const ModelConfig& c = spec.config;
  return size_t(shape.max_batch * shape.max_context * c.num_key_value_heads * c.head_dim) * 4;
}

std::vector<DeviceRow> device_rows(const ModelSpec& spec, const GeneratorShape& shape, size_t layer_bytes,
                                   const GeneratorPlacement& placement) {
  const bool resident = placement.weights_resident;
  const LayerDims d = dims_of(spec, shape.max_batch, shape.max_prompt);
  const int64_t N = d.N(), C = d.C, B = shape.max_batch, R = head_rows_of(spec);
  const int64_t V = spec.config.vocab_size, chunks = (V + R - 1) / R;
  const size_t L = size_t(spec.config.num_hidden_layers);
  const size_t row_bytes = size_t(C) * dtype_size(spec.matrix_dtype);
  const size_t kv_bytes = kv_layer_bytes(spec, shape);
  std::vector<DeviceRow> rows = {
      {spec.layer_bytes(LayerBuffer::forward_workspace, d), "gen.workspace"},
      {size_t(N * C) * 4, "gen.x_a"},
      {size_t(N * C) * 4, "gen.x_b"},
      {size_t(N) * 4, "gen.pos"},
      {size_t(B) * 4, "gen.start"},
      {size_t(d.D / 2) * 4, "gen.inv_freq"},
      {size_t(C) * 4, "gen.final_norm"},
      {size_t(B * C) * 4, "gen.last"},
      {size_t(B * C) * 4, "gen.hn"},
      {size_t(B) * 4, "gen.rstd"},
      {size_t(B * C) * 2, "gen.hn_bf16"},
      {size_t(B * R) * 4, "gen.logits"},
  };
  const size_t kv_device = std::min(placement.kv_device_layers, L), kv_slots = std::min<size_t>(2, L - kv_device);
  for (size_t l = 0; l < kv_device; ++l) rows.push_back({kv_bytes, "gen.k_cache"}), rows.push_back({kv_bytes, "gen.v_cache"});
  for (size_t s = 0; s < kv_slots; ++s) rows.push_back({kv_bytes, "gen.k_slot"}), rows.push_back({kv_bytes, "gen.v_slot"});
  const size_t weight_slots = resident ? L : std::min<size_t>(2, L);
  for (size_t s = 0; s < weight_slots; ++s) rows.push_back({layer_bytes, "gen.weight_slot"});
  const size_t head_slots = resident ? size_t(chunks) : std::min<size_t>(2, size_t(chunks));
  for (size_t s = 0; s < head_slots; ++s) rows.push_back({size_t(R) * row_bytes, "gen.head_slot"});
  return rows;
}

size_t rows_footprint(const std::vector<DeviceRow>& rows) {
  size_t total = 0;
  for (const DeviceRow& r : rows) total += Arena::footprint(r.bytes);
  return total;
}

}  // namespace

struct Generator::Buffers {
  std::vector<void*> owned;  // every device allocation, freed in reverse
  void* workspace = nullptr;
  LayerScratch ws{};
  float *x_a = nullptr, *x_b = nullptr, *inv_freq = nullptr, *final_norm = nullptr;
  int32_t *pos = nullptr, *start = nullptr;
  float *last = nullptr, *hn = nullptr, *rstd = nullptr, *logits = nullptr;
  bf16* hn_bf16 = nullptr;
  std::vector<float*> k_cache, v_cache;  // per device layer (B, Tcap, Hk, D)
  std::vector<float*> k_slot, v_slot;    // the spilled layers' device cache slots, (B, Tcap, Hk, D) each
  std::vector<float*> k_host, v_host;    // per spilled layer (B, Tcap, Hk, D), pinned host
  std::vector<char*> weight_slots, head_slots;
  std::optional<WeightStream> layers, head;  // streaming through them (resident: a slot per block)
  std::vector<std::unique_ptr<Event>> kv_loaded, kv_free;  // the spilled layers' cache slots
  std::vector<float> x_host;  // (N, C) the embedding gathered on the host
};

// ---- sizes and set-up --------------------------------------------------------------------------

namespace {

size_t max_layer_bytes(const ModelSpec& spec) {
  const HostStoreLayout layout = HostStore::layout(spec);
  size_t layer_bytes = 0;
  for (size_t l = 0; l < spec.layers.size(); ++l) layer_bytes = std::max(layer_bytes, layout.groups[1 + l].working_bytes);
  return layer_bytes;
}

// The placements worth considering: weights resident or streamed, times every layer's cache on
// the device or n of them with the rest through two slots (n <= L - 3: otherwise the slots take
// as much as the caches they replace).
std::vector<GeneratorPlacement> placement_candidates(size_t L) {
  std::vector<GeneratorPlacement> c;
  for (const bool resident : {true, false}) {
    c.push_back({resident, L});
    for (size_t n = L >= 3 ? L - 3 + 1 : 0; n-- > 0;) c.push_back({resident, n});
  }
  return c;
}

}  // namespace

size_t Generator::device_bytes(const ModelSpec& spec, const GeneratorShape& shape, const GeneratorPlacement& placement) {
  return rows_footprint(device_rows(spec, shape, max_layer_bytes(spec), placement));
}

size_t Generator::device_bytes(const ModelSpec& spec, const GeneratorShape& shape, bool resident) {
  return device_bytes(spec, shape, GeneratorPlacement{resident, spec.layers.size()});
}

size_t Generator::min_device_bytes(const ModelSpec& spec, const GeneratorShape& shape) {
  size_t least = SIZE_MAX;
  for (const GeneratorPlacement& p : placement_candidates(spec.layers.size()))
    least = std::min(least, device_bytes(spec, shape, p));
  return least;
}

bool Generator::choose_placement(const ModelSpec& spec, const GeneratorShape& shape, size_t budget_bytes,
                                 GeneratorPlacement* placement) {
  const size_t L = spec.layers.size(), layer_bytes = max_layer_bytes(spec);
  const size_t kv_bytes = kv_layer_bytes(spec, shape);
  bool found = false;
  double best = 0;
  for (const GeneratorPlacement& p : placement_candidates(L)) {
    if (device_bytes(spec, shape, p) > budget_bytes) continue;
    // link bytes per decoded token at full length: streamed weights, spilled caches in and out
    const double moved = (p.weights_resident ? 0.0 : double(L) * double(layer_bytes)) +
                         double(L - p.kv_device_layers) * 2.0 * double(kv_bytes);
    if (!found || moved < best) found = true, best = moved, *placement = p;
  }
  return found;
}

Generator::Generator(Device& dev, HostStore& store, const GeneratorShape& shape)
    : dev_(dev), store_(store), shape_(shape) {
  const ModelSpec& spec = store.spec();
  STRATA_ASSERT(shape.max_batch >= 1 && shape.max_prompt >= 1 && shape.max_context > shape.max_prompt);
  L_ = spec.layers.size();
  V_ = spec.config.vocab_size;
  head_rows_ = head_rows_of(spec);
  head_chunks_ = size_t((V_ + head_rows_ - 1) / head_rows_);
  dims_ = dims_of(spec, shape.max_batch, shape.max_prompt);
  // what the backend takes at the first GEMM (the cuBLAS workspace) stays free: every op runs on
  // the compute stream
  const size_t backend = dev.pending_workspace_bytes(Stream::compute);
  const size_t free_bytes = dev.budget_bytes() > dev.used_bytes() ? dev.budget_bytes() - dev.used_bytes() : 0;
  const size_t left = free_bytes > backend ? free_bytes - backend : 0;
  GeneratorPlacement placement;
  const bool fits = choose_placement(spec, shape, left, &placement);
  STRATA_CHECK_BUDGET(fits, "generation needs ", format_bytes(min_device_bytes(spec, shape) + backend),
                      " of device memory (weights streamed through two slots, the KV cache of ", shape.max_batch,
                      " rows x ", shape.max_context, " positions spilled to host memory through two layer slots",
                      backend ? str_cat(", ", format_bytes(backend), " of cuBLAS workspace") : std::string(),
                      "), the budget leaves ", format_bytes(free_bytes),
                      ": raise --device-memory, or lower --max-new-tokens, --batch-size or the prompt length");
  allocate(placement);
}

void Generator::allocate(const GeneratorPlacement& placement) {
  placement_ = placement;
  buf_ = std::make_unique<Buffers>();
  Buffers& b = *buf_;
  const ModelSpec& spec = store_.spec();
  const std::vector<DeviceRow> rows = device_rows(spec, shape_, max_layer_bytes(spec), placement);
  try {
    size_t i = 0;
    auto next = [&]() -> void* {
      void* p = dev_.alloc(rows[i].bytes, rows[i].name);
      ++i;
      b.owned.push_back(p);
      return p;
    };
    b.workspace = next();
    b.x_a = static_cast<float*>(next());
    b.x_b = static_cast<float*>(next());
    b.pos = static_cast<int32_t*>(next());
    b.start = static_cast<int32_t*>(next());
    b.inv_freq = static_cast<float*>(next());
    b.final_norm = static_cast<float*>(next());
    b.last = static_cast<float*>(next());
    b.hn = static_cast<float*>(next());
    b.rstd = static_cast<float*>(next());
    b.hn_bf16 = static_cast<bf16*>(next());
    b.logits = static_cast<float*>(next());
    auto named = [&](const char* name) { return i < rows.size() && std::string(rows[i].name) == name; };
    while (named("gen.k_cache")) {
      b.k_cache.push_back(static_cast<float*>(next()));
      b.v_cache.push_back(static_cast<float*>(next()));
    }
    while (named("gen.k_slot")) {
      b.k_slot.push_back(static_cast<float*>(next()));
      b.v_slot.push_back(static_cast<float*>(next()));
    }
    while (named("gen.weight_slot")) b.weight_slots.push_back(static_cast<char*>(next()));
    while (i < rows.size()) b.head_slots.push_back(static_cast<char*>(next()));
    const size_t kv_bytes = kv_layer_bytes(spec, shape_);
    for (size_t l = placement.kv_device_layers; l < L_; ++l) {  // the spilled layers' caches, pinned host
      b.k_host.push_back(static_cast<float*>(dev_.alloc_pinned(kv_bytes)));
      b.v_host.push_back(static_cast<float*>(dev_.alloc_pinned(kv_bytes)));
    }
  } catch (...) {
    release();
    throw;
  }
  b.ws = LayerScratch{static_cast<char*>(b.workspace), nullptr, dims_, false};
  const std::vector<float> inv = model_rope_inv_freq(spec.config);
  dev_.copy_h2d(b.inv_freq, inv.data(), inv.size() * 4, Stream::compute);
  const TensorSpec& norm = store_.working_table()[size_t(spec.final_norm)];
  dev_.copy_h2d(b.final_norm, store_.working_of(size_t(spec.final_norm)), norm.bytes(), Stream::compute);
  b.layers.emplace(dev_, b.weight_slots);
  b.head.emplace(dev_, b.head_slots);
  for (size_t s = 0; s < b.k_slot.size(); ++s)
    b.kv_loaded.push_back(dev_.event_create()), b.kv_free.push_back(dev_.event_create());
  b.x_host.resize(size_t(dims_.N() * dims_.C));
  dev_.stream_synchronize(Stream::compute);
}

void Generator::release() {
  if (!buf_) return;
  for (auto it = buf_->owned.rbegin(); it != buf_->owned.rend(); ++it) dev_.free(*it);
  buf_->owned.clear();
  for (float* p : buf_->k_host) dev_.free_pinned(p);
  for (float* p : buf_->v_host) dev_.free_pinned(p);
  buf_->k_host.clear(), buf_->v_host.clear();
}

size_t Generator::kv_host_bytes() const {
  return (L_ - std::min(L_, placement_.kv_device_layers)) * 2 * kv_layer_bytes(store_.spec(), shape_);
}

Generator::~Generator() {
  try {
    dev_.synchronize();
  } catch (...) {  // already reported on the caller's path; still free everything
  }
  release();
}

// ---- weights -----------------------------------------------------------------------------------

// Layer `layer`'s weights in its slot, the compute stream waiting for them (h2d only when the
// slot holds something else).
LayerTensors Generator::ensure_layer(size_t layer) {
  return layer_weights_in(store_, buf_->layers->acquire(layer, layer_host_block(store_, layer)), layer);
}

const void* Generator::ensure_head_chunk(size_t chunk) {
  return buf_->head->acquire(chunk, lm_head_chunk_block(store_, chunk, head_rows_));
}

// ---- one pass ----------------------------------------------------------------------------------

void Generator::forward_pass(const std::vector<int32_t>& ids, const std::vector<int32_t>& start, int64_t B, int64_t T,
                             bool prefill) {
  Buffers& b = *buf_;
  const Stream s = Stream::compute;
  const int64_t N = B * T, C = dims_.C, KD = dims_.Hk * dims_.D;
  dims_.B = B, dims_.T = T;
  // positions and the embedding (gathered on the host, as the training engine does)
  pos_host_.resize(size_t(N));
  for (int64_t r = 0; r < B; ++r)
    for (int64_t t = 0; t < T; ++t) pos_host_[size_t(r * T + t)] = start[size_t(r)] + int32_t(t);
  start_host_ = start;
  dev_.copy_h2d(b.pos, pos_host_.data(), size_t(N) * 4, s);
  dev_.copy_h2d(b.start, start_host_.data(), size_t(B) * 4, s);
  const size_t emb_row = size_t(store_.spec().embed);
  const DType emb_type = store_.working_table()[emb_row].dtype;
  const char* table = static_cast<const char*>(store_.working_of(emb_row));
  const size_t row_bytes = size_t(C) * dtype_size(emb_type);
  for (int64_t n = 0; n < N; ++n)
    dtype_convert(b.x_host.data() + n * C, DType::f32, table + size_t(ids[size_t(n)]) * row_bytes, emb_type, size_t(C));
  dev_.copy_h2d(b.x_a, b.x_host.data(), size_t(N * C) * 4, s);

  float *x = b.x_a, *y = b.x_b;
  const TokenContext ctx{b.pos, nullptr, b.inv_freq};
  for (size_t i = 0; i < L_; ++i) {
    const LayerTensors w = ensure_layer(i);
    if (prefill) {
      layer_kind(store_, i).forward(dev_, y, x, w, ctx, b.ws, dims_, s);
      const LayerAttention kv = layer_kind(store_, i).attention(b.ws);
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
    b.layers->release(i);
    std::swap(x, y);
  }
  if (x != b.x_a) std::swap(b.x_a, b.x_b);  // the pass's output is in x_a
}

// The decode step of one layer: N = B rows of one token each, the layer's forward with the
// attention over the cache (the new key and value written at the row's position first).
void Generator::decode_layer(size_t layer, float* out, const float* x, const LayerTensors& w, int64_t B,
                             const std::vector<int32_t>& start) {
  Buffers& b = *buf_;
  const LayerKind& kind = layer_kind(store_, layer);
  const LayerAttention att = kind.attention(b.ws);  // q, k, v after forward_qkv; out before forward_from_attention
  const Stream s = Stream::compute;
  const int64_t KD = dims_.Hk * dims_.D;
  kind.forward_qkv(dev_, x, w, TokenContext{b.pos, nullptr, b.inv_freq}, b.ws, dims_, s);
  const auto [k_cache, v_cache] = kv_cache(layer);
  for (int64_t r = 0; r < B; ++r) {
    const size_t dst = size_t((r * shape_.max_context + start[size_t(r)]) * KD);
    dev_.copy_d2d(k_cache + dst, att.k + r * KD, size_t(KD) * 4, s);
    dev_.copy_d2d(v_cache + dst, att.v + r * KD, size_t(KD) * 4, s);
  }
  const float scale = 1.0f / std::sqrt(float(dims_.D));
  dev_.attention_cached_forward(att.out, att.q, k_cache, v_cache, b.start, B, 1, shape_.max_context, dims_.H, dims_.Hk,
                                dims_.D, scale, dims_.wt, s);  // the prefill's dot type (bf16 with bf16 weights)
  if (kv_spilled(layer)) {  // the new position to the host; then the slot may take the next layer
    kv_write_back(layer, att.k, att.v, start, B, 1);
    dev_.event_record(*b.kv_free[(layer - placement_.kv_device_layers) % b.k_slot.size()], s);
  }
  kind.forward_from_attention(dev_, out, x, w, b.ws, dims_, s);
}

// ---- the spilled KV cache ------------------------------------------------------------------------

std::pair<float*, float*> Generator::kv_cache(size_t layer) {
  Buffers& b = *buf_;
  if (!kv_spilled(layer)) return {b.k_cache[layer], b.v_cache[layer]};
  const size_t s = (layer - placement_.kv_device_layers) % b.k_slot.size();
  return {b.k_slot[s], b.v_slot[s]};
}

// Rows' cached positions [0, start[r]) of a spilled layer into its slot, on the h2d stream once
// the slot's previous layer is done with it; the compute stream waits for them.
void Generator::kv_upload(size_t layer, const std::vector<int32_t>& start, int64_t B) {
  Buffers& b = *buf_;
  const size_t j = layer - placement_.kv_device_layers, s = j % b.k_slot.size();
  const int64_t KD = dims_.Hk * dims_.D;
  dev_.stream_wait_event(Stream::h2d, *b.kv_free[s]);
  for (int64_t r = 0; r < B; ++r) {
    const size_t at = size_t(r * shape_.max_context * KD), bytes = size_t(start[size_t(r)] * KD) * 4;
    if (bytes == 0) continue;
    dev_.copy_h2d(b.k_slot[s] + at, b.k_host[j] + at, bytes, Stream::h2d);
    dev_.copy_h2d(b.v_slot[s] + at, b.v_host[j] + at, bytes, Stream::h2d);
    stats_.kv_h2d_bytes += 2 * bytes;
  }
  dev_.event_record(*b.kv_loaded[s], Stream::h2d);
  dev_.stream_wait_event(Stream::compute, *b.kv_loaded[s]);
}

// k, v (B, T, Hk, D) on the device: row r's T positions go to the host cache at start[r], on the
// compute stream (they follow the kernels that made them; the pass ends with a synchronize).
void Generator::kv_write_back(size_t layer, const float* k, const float* v, const std::vector<int32_t>& start,
                              int64_t B, int64_t T) {
  Buffers& b = *buf_;
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
  Buffers& b = *buf_;
  const Stream s = Stream::compute;
  const int64_t C = dims_.C;
  for (int64_t r = 0; r < B; ++r)
    dev_.copy_d2d(b.last + r * C, b.x_a + last_index[size_t(r)] * C, size_t(C) * 4, s);
  dev_.rmsnorm_forward(b.hn, b.rstd, b.last, b.final_norm, B, C, dims_.eps, s);
  const DType lm_type = store_.working_table()[size_t(store_.spec().lm_head_row())].dtype;
  if (lm_type == DType::bf16) dev_.cast_f32_to_bf16(b.hn_bf16, b.hn, B * C, s);
  const void* a = lm_type == DType::bf16 ? static_cast<const void*>(b.hn_bf16) : b.hn;
  logits_.resize(size_t(B * V_));
  for (size_t k = 0; k < head_chunks_; ++k) {
    const int64_t v0 = int64_t(k) * head_rows_, vc = std::min(head_rows_, V_ - v0);
    const void* w = ensure_head_chunk(k);
    dev_.matmul(b.logits, a, w, lm_type, B, vc, C, false, true, 0.f, s);  // (B, vc)
    b.head->release(k);
    for (int64_t r = 0; r < B; ++r)  // on the compute stream: the next chunk's matmul waits for it
      dev_.copy_d2h(logits_.data() + r * V_ + v0, b.logits + r * vc, size_t(vc) * 4, s);
  }
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
  forward_pass(ids, std::vector<int32_t>(size_t(B), 0), B, Tp, /*prefill=*/true);
  head(last, B);
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
    forward_pass(next, start, B, 1, /*prefill=*/false);
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
