// The step engines' and the generator's buffer tables (engine_buffers.h).
#include "offload/stream/engine_buffers.h"
#include "offload/state/nf4_layout.h"
#include "offload/stream/buffer_binding.h"
#include "offload/stream/weight_stream.h"

#include <algorithm>

#include "src/core/error.h"
#include "src/device/arena.h"

namespace strata {
namespace {

template <class T>
std::function<void(void*)> bind_to(EngineBuffers* into, T* EngineBuffers::*field) {
  if (!into) return {};
  return [into, field](void* p) { into->*field = static_cast<T*>(p); };
}

}  // namespace

int64_t engine_head_chunk_rows(const ModelSpec& spec, const EngineOptions& options) {
  const int64_t V = spec.config.vocab_size;
  STRATA_CHECK(options.head_chunk_rows >= 0, "head_chunk_rows must be >= 0 (0: the default)");
  return std::min(V, options.head_chunk_rows > 0 ? options.head_chunk_rows : kHeadChunkRows);
}

EngineShape EngineShape::of(const ModelSpec& spec, const HostStoreLayout& layout, const EngineOptions& options) {
  const ModelConfig& cfg = spec.config;
  EngineShape s;
  STRATA_ASSERT(options.weights != WeightsMode::automatic, "the plan resolves offload.weights = \"auto\" first");
  s.weights = options.weights;
  s.checkpoints = options.checkpoints;
  s.recompute = options.recompute;
  s.layers = spec.layers.size();
  s.tied = spec.lm_head == kAbsent;
  s.C = cfg.hidden_size;
  s.V = cfg.vocab_size;
  s.tokens = options.max_batch * options.max_tokens;
  STRATA_CHECK(options.group >= 1, "the micro-batches of a layer-major pass must be at least 1, not ", options.group);
  s.group = size_t(options.group);
  LayerDims& d = s.layer_capacity;
  d.B = options.max_batch;
  d.T = options.max_tokens;
  d.C = cfg.hidden_size;
  d.H = cfg.num_attention_heads;
  d.Hk = cfg.num_key_value_heads;
  d.D = cfg.head_dim;
  d.rope_dim = cfg.rotary_dim;
  d.F = cfg.intermediate_size;
  d.eps = float(cfg.rms_norm_eps);
  d.window = cfg.sliding_window;
  d.attn_scale = model_attention_scale(cfg);
  d.wt = spec.matrix_dtype;
  s.layer_kinds = spec.layer_kinds();
  if (options.lora.enabled()) {
    d.lora_r = options.lora.r;
    d.lora_dropout = options.lora.dropout > 0;
    s.lora_bytes = LoraLayout::of(spec, options.lora).bytes;
  }
  // a slot holds the layer as uploaded; an NF4 layer also its dequantized bf16 copy
  // (offload/state/nf4_layout.h), every slot sized for the largest layer
  const size_t max_w = layer_slot_bytes(layout, s.layers).total();
  for (size_t i = 0; i < s.layers; ++i)
    if (!s.frozen()) s.layer_grad_bytes = std::max(s.layer_grad_bytes, layout.groups[1 + i].f32_bytes);
  s.resident_layers = s.weights == WeightsMode::device ? s.layers : options.resident_layers;
  STRATA_CHECK(s.resident_layers <= s.layers, "offload.resident_layers (", options.resident_layers,
               ") is more than the model's ", s.layers, " layers");
  for (size_t i = 0; i < s.resident_layers; ++i)
    s.slot_bytes.push_back(layout.packed ? max_w : layout.groups[1 + i].working_bytes);
  s.slot_bytes.insert(s.slot_bytes.end(), std::min<size_t>(2, s.layers - s.resident_layers), max_w);
  s.head_rows = engine_head_chunk_rows(spec, options);
  s.head_chunks = size_t((s.V + s.head_rows - 1) / s.head_rows);
  s.head_slots = std::min<size_t>(2, s.head_chunks);
  s.lm_row_bytes = size_t(s.C) * dtype_size(layout.working[size_t(spec.lm_head_row())].dtype);
  s.rope_floats = model_rope_inv_freq(cfg).size();
  return s;
}

size_t EngineShape::layer_slot(size_t i) const { return weight_slot_of(i, resident_layers, slot_bytes.size()); }

std::vector<EngineBuffer> engine_buffer_table(const EngineShape& s, EngineBuffers* into) {
  using B = EngineBuffers;
  const bool stream = s.weights == WeightsMode::stream;
  const size_t g = s.group;  // per-micro-batch rows: g of them (engine_buffers.h)
  const size_t act = s.activation_bytes(), tokens_i32 = g * bytes_of<int32_t>(s.tokens);
  const size_t head_w = size_t(s.head_rows) * s.lm_row_bytes, head_g = bytes_of<float>(s.head_rows * s.C);
  std::vector<EngineBuffer> t;
  auto dev = [&](std::string name, size_t bytes, std::function<void(void*)> bind) {
    t.push_back({std::move(name), bytes, Memory::device, std::move(bind)});
  };
  auto pinned = [&](std::string name, size_t bytes, std::function<void(void*)> bind) {
    t.push_back({std::move(name), bytes, Memory::pinned, std::move(bind)});
  };
  if (into) into->weight_slots.assign(s.slot_bytes.size(), nullptr);
  for (size_t k = 0; k < s.slot_bytes.size(); ++k)
    dev(str_cat("layer weight slot ", k), s.slot_bytes[k], bind_at(into ? &into->weight_slots[k] : nullptr));
  dev("final norm weight", bytes_of<float>(s.C), bind_to(into, &B::norm));
  // the widest norm: C, a head's D, or OLMo 2's q norm over the whole projection (H*D)
  const int64_t widest_norm = std::max({s.C, s.layer_capacity.D, s.layer_capacity.H * s.layer_capacity.D});
  if (s.frozen())
    dev("frozen norm gradients (discarded)", bytes_of<float>(widest_norm), bind_to(into, &B::norm_grad));
  else
    dev("final norm gradient", bytes_of<float>(s.C), bind_to(into, &B::norm_grad));
  if (stream) {
    for (size_t k = 0; k < s.head_slots; ++k)
      dev(str_cat("lm_head chunk slot ", k, " (", s.head_rows, " vocab rows)"), head_w,
          bind_at(into ? &into->head_slots[k] : nullptr));
  } else {
    dev(s.tied ? "lm_head (tied embedding, resident)" : "lm_head (resident)", size_t(s.V) * s.lm_row_bytes,
        bind_to(into, &B::lm_resident));
  }
  if (!s.frozen())  // LoRA: the frozen lm_head's backward computes d(hidden) only
    for (size_t k = 0; k < s.head_slots; ++k)
      dev(str_cat("lm_head gradient chunk ", k), head_g, bind_at(into ? &into->head_grad_slots[k] : nullptr));
  dev("cross-entropy token statistics", g * bytes_of<double>(3 * s.tokens), bind_to(into, &B::ce_stats));
  if (s.frozen()) {
    dev("LoRA adapters (every layer)", s.lora_bytes, bind_to(into, &B::lora_weights));
    dev("LoRA adapter gradients", s.lora_bytes, bind_to(into, &B::lora_grads));
    dev("LoRA adapter gradients of one micro-batch", s.lora_bytes, bind_to(into, &B::lora_mb_grads));
  } else {
    for (size_t k = 0; k < 2; ++k)
      dev(str_cat("layer gradient slot ", k), s.layer_grad_bytes, bind_at(into ? &into->grad_slots[k] : nullptr));
    if (g > 1) {  // layer-major: one micro-batch's share, added into the slot (engine.h)
      dev("layer gradient slot (layer-major share)", s.layer_grad_bytes, bind_to(into, &B::grad_scratch));
      dev("lm_head gradient share (layer-major)", head_g, bind_to(into, &B::head_grad_scratch));
      dev("final norm gradient share (layer-major)", bytes_of<float>(s.C), bind_to(into, &B::norm_grad_scratch));
    }
  }
  dev("last layer output", g * act, bind_to(into, &B::x_final));
  for (size_t k = 0; k < 2; ++k) dev(str_cat("activation staging ", k), g * act, bind_at(into ? &into->x_pp[k] : nullptr));
  dev("final norm output", g * act, bind_to(into, &B::hn));
  dev("d final norm output", g * act, bind_to(into, &B::dhn));
  if (into) into->dx.assign(g + 1, nullptr);
  for (size_t k = 0; k <= g; ++k) dev(str_cat("d hidden ", k), act, bind_at(into ? &into->dx[k] : nullptr));
  dev("final norm rstd", g * bytes_of<float>(s.tokens), bind_to(into, &B::rstd_final));
  dev("input ids", tokens_i32, bind_to(into, &B::ids));
  dev("targets", tokens_i32, bind_to(into, &B::targets));
  dev("positions", tokens_i32, bind_to(into, &B::pos));
  dev("document starts", tokens_i32, bind_to(into, &B::doc_start));
  dev("loss", g * sizeof(double), bind_to(into, &B::loss));
  dev("rope inv_freq", bytes_of<float>(int64_t(s.rope_floats)), bind_to(into, &B::inv_freq));
  dev("layer workspace", layer_kinds_bytes(s.layer_kinds, LayerBuffer::workspace, s.layer_capacity), bind_to(into, &B::workspace));

  pinned("embedding output (host)", g * act, bind_to(into, &B::x0_host));
  if (s.frozen()) {  // LoRA: no base gradient comes back; the adapters' do under data parallel
    pinned("LoRA adapter gradient staging", s.lora_bytes, bind_to(into, &B::lora_grad_staging));
    return t;
  }
  pinned("d embedding output (host)", g * act, bind_to(into, &B::dx0_host));
  for (size_t k = 0; k < 2; ++k)
    pinned(str_cat("layer gradient staging ", k), s.layer_grad_bytes, bind_at(into ? &into->grad_staging[k] : nullptr));
  pinned("final norm gradient staging", bytes_of<float>(s.C), bind_to(into, &B::norm_grad_staging));
  for (size_t k = 0; k < s.head_slots; ++k)
    pinned(str_cat("lm_head gradient staging ", k), head_g, bind_at(into ? &into->head_grad_staging[k] : nullptr));
  return t;
}

std::vector<EngineBuffer> engine_checkpoint_table(const EngineShape& s, size_t device_count, EngineBuffers* into) {
  std::vector<EngineBuffer> t;
  const size_t act = s.activation_bytes() * s.group;  // a layer's inputs: one per micro-batch of the pass
  if (device_count)
    t.push_back({str_cat(device_count, " layer checkpoints"), device_count * act, Memory::device,
                 bind_to(into, &EngineBuffers::ckpt_dev)});
  if (s.checkpoints == CheckpointMode::nvme) {
    for (size_t k = 0; k < kSpillRing; ++k)
      t.push_back({str_cat("NVMe checkpoint staging ", k), s.activation_bytes(), Memory::pinned,
                   bind_at(into ? &into->ckpt_ring[k] : nullptr)});
  } else if (s.layers > device_count)
    t.push_back({"spilled layer checkpoints (host)", (s.layers - device_count) * act, Memory::pinned,
                 bind_to(into, &EngineBuffers::ckpt_host)});
  return t;
}

size_t engine_kept_activation_layers(const EngineShape& s, size_t device_bytes_left) {
  // a layer-major pass runs its g micro-batches through a layer before the next one: the one
  // micro-batch's activations a layer keeps would be overwritten, so every layer is recomputed
  // (src/train/accumulation.cpp refuses layer_major with recompute = "never")
  if (s.group > 1) return 0;
  switch (s.recompute) {
    case RecomputeMode::always: return 0;
    case RecomputeMode::never: return s.layers;
    case RecomputeMode::automatic: break;
  }
  return std::min(s.layers, device_bytes_left / Arena::footprint(layer_kinds_bytes(s.layer_kinds, LayerBuffer::activations, s.layer_capacity)));
}

std::vector<EngineBuffer> engine_kept_activation_table(const EngineShape& s, size_t count, EngineBuffers* into) {
  if (count == 0) return {};
  return {{str_cat("kept activations of ", count, " layers (no recompute)"),
           count * layer_kinds_bytes(s.layer_kinds, LayerBuffer::activations, s.layer_capacity), Memory::device, bind_to(into, &EngineBuffers::kept_activations)}};
}

size_t engine_kept_logit_floats(const EngineShape& s) {
  return (size_t(s.tokens * s.head_rows) + 63) / 64 * 64;  // each chunk's rows start 256-byte aligned
}

size_t engine_kept_logit_chunks(const EngineShape& s, size_t device_bytes_left) {
  if (s.recompute == RecomputeMode::always || s.head_chunks == 0) return 0;
  const size_t chunk = s.group * bytes_of<float>(int64_t(engine_kept_logit_floats(s)));
  return std::min(s.head_chunks, device_bytes_left / Arena::footprint(chunk));
}

std::vector<EngineBuffer> engine_kept_logits_table(const EngineShape& s, size_t count, EngineBuffers* into) {
  if (count == 0) return {};
  return {{str_cat("kept lm_head logits of ", count, " chunks (no recompute)"),
           count * s.group * bytes_of<float>(int64_t(engine_kept_logit_floats(s))), Memory::device,
           bind_to(into, &EngineBuffers::kept_logits)}};
}

void engine_buffers_allocate(Device& dev, std::vector<EngineBuffer>& table, const std::string& name_prefix) {
  try {
    for (EngineBuffer& b : table) {
      b.ptr = b.memory == Memory::device ? dev.alloc(b.bytes, name_prefix + b.name) : dev.alloc_pinned(b.bytes);
      b.bind(b.ptr);
    }
  } catch (...) {
    engine_buffers_free(dev, table);
    throw;
  }
}

void engine_buffers_free(Device& dev, std::vector<EngineBuffer>& table) {
  for (EngineBuffer& b : table) {
    if (!b.ptr) continue;
    if (b.memory == Memory::device) dev.free(b.ptr);
    else dev.free_pinned(b.ptr);
    b.ptr = nullptr;
  }
}

void engine_tokens_upload(Device& dev, const EngineShape& shape, const MicroBatch& mb, const DeviceTokens& to) {
  const LayerDims& cap = shape.layer_capacity;
  STRATA_CHECK(mb.B >= 1 && mb.T >= 1 && mb.B <= cap.B && mb.T <= cap.T, "micro-batch of ", mb.B, "x", mb.T,
               " tokens exceeds the engine's buffers (", cap.B, "x", cap.T, ")");
  const size_t n = size_t(mb.B * mb.T);
  STRATA_ASSERT(mb.ids.size() == n && mb.targets.size() == n && mb.pos.size() == n);
  const int64_t V = shape.V;
  for (size_t i = 0; i < n; ++i) {
    STRATA_CHECK(mb.ids[i] >= 0 && mb.ids[i] < V, "token id ", mb.ids[i], " at position ", i,
                 " is outside the vocabulary [0, ", V, ")");
    STRATA_CHECK(mb.targets[i] == -100 || (mb.targets[i] >= 0 && mb.targets[i] < V), "label ",
                 mb.targets[i], " at position ", i, " is neither -100 nor in [0, ", V, ")");
  }
  const size_t bytes = bytes_of<int32_t>(int64_t(n));
  dev.copy_h2d(to.ids, mb.ids.data(), bytes, Stream::compute);
  dev.copy_h2d(to.targets, mb.targets.data(), bytes, Stream::compute);
  dev.copy_h2d(to.pos, mb.pos.data(), bytes, Stream::compute);
  if (!mb.doc_start.empty()) {
    STRATA_ASSERT(mb.doc_start.size() == n);
    dev.copy_h2d(to.doc_start, mb.doc_start.data(), bytes, Stream::compute);
  }
}

size_t engine_device_bytes(const std::vector<EngineBuffer>& table) {
  size_t sum = 0;
  for (const EngineBuffer& b : table)
    if (b.memory == Memory::device) sum += Arena::footprint(b.bytes);
  return sum;
}

size_t engine_pinned_bytes(const std::vector<EngineBuffer>& table) {
  size_t sum = 0;
  for (const EngineBuffer& b : table)
    if (b.memory == Memory::pinned) sum += b.bytes;
  return sum;
}

// ---- the generator's rows ------------------------------------------------------------------

LayerDims generator_layer_dims(const ModelSpec& spec, int64_t B, int64_t T) {
  const ModelConfig& c = spec.config;
  LayerDims d;
  d.B = B, d.T = T, d.C = c.hidden_size, d.H = c.num_attention_heads, d.Hk = c.num_key_value_heads;
  d.D = c.head_dim, d.F = c.intermediate_size, d.eps = float(c.rms_norm_eps), d.wt = spec.matrix_dtype;
  d.window = c.sliding_window, d.attn_scale = model_attention_scale(c), d.rope_dim = c.rotary_dim;
  return d;
}

int64_t generator_head_rows(const ModelSpec& spec) { return std::min<int64_t>(kHeadChunkRows, spec.config.vocab_size); }

size_t generator_kv_layer_bytes(const ModelSpec& spec, const GeneratorShape& shape) {
  const ModelConfig& c = spec.config;
  return size_t(shape.max_batch * shape.max_context * c.num_key_value_heads * c.head_dim) * 4;
}

namespace {

size_t max_layer_working_bytes(const ModelSpec& spec) {
  return layer_slot_bytes(HostStore::layout(spec), spec.layers.size()).total();
}

// The placements worth considering: weights resident or streamed, times every layer's cache on
// the device or n of them with the rest through two slots (n <= L - 3: otherwise the slots take
// as much as the caches they replace).
std::vector<GeneratorPlacement> generator_placement_candidates(size_t L) {
  std::vector<GeneratorPlacement> c;
  for (const bool resident : {true, false}) {
    c.push_back({resident, L});
    for (size_t n = L >= 3 ? L - 3 + 1 : 0; n-- > 0;) c.push_back({resident, n});
  }
  return c;
}

// The per-layer rows: each device layer's k and v caches, the cache slots, the weight slots.
void generator_layer_rows(std::vector<EngineBuffer>& t, const ModelSpec& spec, const GeneratorShape& shape,
                          const GeneratorPlacement& placement, GeneratorBuffers* into) {
  const size_t L = spec.layers.size(), kv = generator_kv_layer_bytes(spec, shape);
  auto dev = [&](std::string name, size_t bytes, std::function<void(void*)> bind) {
    t.push_back({std::move(name), bytes, Memory::device, std::move(bind)});
  };
  const size_t kv_device = std::min(placement.kv_device_layers, L), kv_slots = std::min<size_t>(2, L - kv_device);
  auto pairs = [&](const char* what, size_t n, std::vector<float*>* k, std::vector<float*>* v) {
    if (into) k->assign(n, nullptr), v->assign(n, nullptr);
    for (size_t l = 0; l < n; ++l) {
      dev(str_cat("KV cache ", what, " ", l, " keys"), kv, bind_at(into ? &(*k)[l] : nullptr));
      dev(str_cat("KV cache ", what, " ", l, " values"), kv, bind_at(into ? &(*v)[l] : nullptr));
    }
  };
  pairs("layer", kv_device, into ? &into->k_cache : nullptr, into ? &into->v_cache : nullptr);
  pairs("slot", kv_slots, into ? &into->k_slot : nullptr, into ? &into->v_slot : nullptr);
  const size_t weight_slots = placement.weights_resident ? L : std::min<size_t>(2, L);
  const size_t slot_bytes = max_layer_working_bytes(spec);
  if (into) into->weight_slots.assign(weight_slots, nullptr);
  for (size_t s = 0; s < weight_slots; ++s)
    dev(str_cat("layer weight slot ", s), slot_bytes, bind_at(into ? &into->weight_slots[s] : nullptr));
}

}  // namespace

std::vector<EngineBuffer> generator_buffer_table(const ModelSpec& spec, const GeneratorShape& shape,
                                                 const GeneratorPlacement& placement, GeneratorBuffers* into) {
  const LayerDims d = generator_layer_dims(spec, shape.max_batch, shape.max_prompt);
  const int64_t N = d.N(), C = d.C, B = shape.max_batch, R = generator_head_rows(spec);
  const size_t K = size_t((spec.config.vocab_size + R - 1) / R);
  std::vector<EngineBuffer> t;
  auto dev = [&](std::string name, size_t bytes, std::function<void(void*)> bind) {
    t.push_back({std::move(name), bytes, Memory::device, std::move(bind)});
  };
  dev("layer forward workspace", spec.layer_bytes(LayerBuffer::forward_workspace, d), bind_at(into ? &into->workspace : nullptr));
  dev("hidden states a", bytes_of<float>(N * C), bind_at(into ? &into->x_a : nullptr));
  dev("hidden states b", bytes_of<float>(N * C), bind_at(into ? &into->x_b : nullptr));
  dev("positions", bytes_of<int32_t>(N), bind_at(into ? &into->pos : nullptr));
  dev("row starts", bytes_of<int32_t>(B), bind_at(into ? &into->start : nullptr));
  dev("rope inv_freq", bytes_of<float>(int64_t(model_rope_inv_freq(spec.config).size())), bind_at(into ? &into->inv_freq : nullptr));
  dev("final norm weight", bytes_of<float>(C), bind_at(into ? &into->final_norm : nullptr));
  dev("last positions", bytes_of<float>(B * C), bind_at(into ? &into->last : nullptr));
  dev("final norm output", bytes_of<float>(B * C), bind_at(into ? &into->hn : nullptr));
  dev("final norm rstd", bytes_of<float>(B), bind_at(into ? &into->rstd : nullptr));
  dev("final norm output (bf16)", size_t(B * C) * 2, bind_at(into ? &into->hn_bf16 : nullptr));
  dev("logits of one lm_head chunk", bytes_of<float>(B * R), bind_at(into ? &into->logits : nullptr));
  generator_layer_rows(t, spec, shape, placement, into);
  const size_t head_slots = placement.weights_resident ? K : std::min<size_t>(2, K);
  if (into) into->head_slots.assign(head_slots, nullptr);
  for (size_t s = 0; s < head_slots; ++s)
    dev(str_cat("lm_head chunk slot ", s, " (", R, " vocab rows)"), size_t(R * C) * dtype_size(spec.matrix_dtype),
        bind_at(into ? &into->head_slots[s] : nullptr));
  // pinned host: the spilled layers' caches, the embedding gathered
  const size_t L = spec.layers.size(), spilled = L - std::min(placement.kv_device_layers, L);
  const size_t kv = generator_kv_layer_bytes(spec, shape);
  if (into) into->k_host.assign(spilled, nullptr), into->v_host.assign(spilled, nullptr);
  for (size_t j = 0; j < spilled; ++j) {
    t.push_back({str_cat("KV cache of spilled layer ", j, " keys (host)"), kv, Memory::pinned,
                 bind_at(into ? &into->k_host[j] : nullptr)});
    t.push_back({str_cat("KV cache of spilled layer ", j, " values (host)"), kv, Memory::pinned,
                 bind_at(into ? &into->v_host[j] : nullptr)});
  }
  t.push_back({"embedding output (host)", bytes_of<float>(N * C), Memory::pinned, bind_at(into ? &into->x_host : nullptr)});
  return t;
}

size_t generator_device_bytes(const ModelSpec& spec, const GeneratorShape& shape, const GeneratorPlacement& placement) {
  return engine_device_bytes(generator_buffer_table(spec, shape, placement, nullptr));
}

size_t generator_min_device_bytes(const ModelSpec& spec, const GeneratorShape& shape) {
  size_t least = SIZE_MAX;
  for (const GeneratorPlacement& p : generator_placement_candidates(spec.layers.size()))
    least = std::min(least, generator_device_bytes(spec, shape, p));
  return least;
}

bool generator_choose_placement(const ModelSpec& spec, const GeneratorShape& shape, size_t budget_bytes,
                                GeneratorPlacement* placement) {
  const size_t L = spec.layers.size(), layer_bytes = max_layer_working_bytes(spec);
  const size_t kv_bytes = generator_kv_layer_bytes(spec, shape);
  bool found = false;
  double best = 0;
  for (const GeneratorPlacement& p : generator_placement_candidates(L)) {
    if (generator_device_bytes(spec, shape, p) > budget_bytes) continue;
    // link bytes per decoded token at full length: streamed weights, spilled caches in and out
    const double moved = (p.weights_resident ? 0.0 : double(L) * double(layer_bytes)) +
                         double(L - p.kv_device_layers) * 2.0 * double(kv_bytes);
    if (!found || moved < best) found = true, best = moved, *placement = p;
  }
  return found;
}

}  // namespace strata
