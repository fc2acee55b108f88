#include "offload/engine.h"

#include <chrono>
#include <cmath>
#include <cstring>

#include "kernels/cpu/ops.h"
#include "src/core/error.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}


// dst += src, elementwise: the fixed-order host accumulation of gradients.
void accumulate(float* dst, const float* src, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) dst[i] += src[i];
}

}  // namespace

int64_t Engine::head_chunk_rows(const ModelSpec& spec, const EngineOptions& options) {
  const int64_t V = spec.config.vocab_size;
  STRATA_CHECK(options.head_chunk_rows >= 0, "head_chunk_rows must be >= 0 (0: the default)");
  return std::min(V, options.head_chunk_rows > 0 ? options.head_chunk_rows : kHeadChunkRows);
}

EngineHostBytes Engine::host_bytes(const ModelSpec& spec, const EngineOptions& options) {
  const HostStoreLayout layout = HostStore::layout(spec);
  const size_t L = spec.layers.size();
  const int64_t C = spec.config.hidden_size;
  const size_t act_bytes = size_t(options.max_batch * options.max_tokens * C) * 4;
  size_t max_g = 0;
  for (size_t i = 0; i < L; ++i) max_g = std::max(max_g, layout.groups[1 + i].f32_bytes);
  const int64_t V = spec.config.vocab_size, rows = head_chunk_rows(spec, options);
  const size_t head_slots = (V + rows - 1) / rows > 1 ? 2 : 1;
  EngineHostBytes b;
  // x0 and dx0, two layer gradient stagings, the final norm gradient, lm_head gradient chunks
  b.staging = 2 * act_bytes + 2 * max_g + size_t(C) * 4 + head_slots * size_t(rows * C) * 4;
  b.checkpoints = options.checkpoints == "device" ? 0 : L * act_bytes;
  return b;
}

Engine::Engine(Device& dev, HostStore& store, const EngineOptions& opt)
    : dev_(dev), store_(store), opt_(opt) {
  STRATA_CHECK(opt_.weights == "stream" || opt_.weights == "device", "offload.weights = \"",
               opt_.weights, "\": use \"stream\" or \"device\"");
  STRATA_CHECK(opt_.checkpoints == "auto" || opt_.checkpoints == "device" || opt_.checkpoints == "host",
               "offload.checkpoints = \"", opt_.checkpoints, "\": use \"auto\", \"device\" or \"host\"");
  const ModelSpec& spec = store_.spec();
  const ModelConfig& cfg = spec.config;
  L_ = spec.layers.size();
  tied_ = spec.lm_head == kAbsent;
  dims_.B = opt_.max_batch;
  dims_.T = opt_.max_tokens;
  dims_.C = cfg.hidden_size;
  dims_.H = cfg.num_attention_heads;
  dims_.Hk = cfg.num_key_value_heads;
  dims_.D = cfg.head_dim;
  dims_.F = cfg.intermediate_size;
  dims_.eps = float(cfg.rms_norm_eps);
  dims_.wt = spec.matrix_dtype;
  const int64_t N = opt_.max_batch * opt_.max_tokens, C = dims_.C, V = cfg.vocab_size;
  const size_t act_bytes = size_t(N * C) * 4;
  const TensorTable& wt = store_.working_table();
  STRATA_ASSERT(wt[size_t(spec.final_norm)].dtype == DType::f32, "the final norm's working copy must be f32");
  head_rows_ = head_chunk_rows(spec, opt_);
  head_chunks_ = size_t((V + head_rows_ - 1) / head_rows_);
  head_slot_count_ = std::min<size_t>(2, head_chunks_);  // one chunk has nothing to prefetch
  const size_t lm_row_bytes = size_t(C) * dtype_size(wt[size_t(spec.lm_head_row())].dtype);
  const size_t head_chunk_w = size_t(head_rows_) * lm_row_bytes, head_chunk_g = size_t(head_rows_ * C) * 4;

  size_t max_w = 0, max_g = 0;
  for (size_t i = 0; i < L_; ++i) {
    max_w = std::max(max_w, store_.layer_group(i).working_bytes);
    max_g = std::max(max_g, store_.layer_group(i).f32_bytes);
  }
  const bool stream = opt_.weights == "stream";
  const size_t nslots = stream ? std::min<size_t>(2, L_) : L_;
  std::vector<float> inv = model_rope_inv_freq(cfg);

  // The device placement plan: every allocation, named, summed and checked against the budget
  // before anything is allocated, so a budget that is too small fails before step 1 with the
  // minimum it needs.
  std::vector<std::pair<std::string, size_t>> plan;
  for (size_t s = 0; s < nslots; ++s) {
    size_t bytes = stream ? max_w : store_.layer_group(s).working_bytes;
    plan.push_back({str_cat("layer weight slot ", s), bytes});
  }
  plan.push_back({"final norm weight", size_t(C) * 4});
  plan.push_back({"final norm gradient", size_t(C) * 4});
  if (stream) {
    for (size_t b = 0; b < head_slot_count_; ++b)
      plan.push_back({str_cat("lm_head chunk slot ", b, " (", head_rows_, " vocab rows)"), head_chunk_w});
  } else {
    plan.push_back({tied_ ? "lm_head (tied embedding, resident)" : "lm_head (resident)", size_t(V) * lm_row_bytes});
  }
  for (size_t b = 0; b < head_slot_count_; ++b)
    plan.push_back({str_cat("lm_head gradient chunk ", b), head_chunk_g});
  plan.push_back({"cross-entropy token statistics", size_t(N) * 3 * sizeof(double)});
  plan.push_back({"layer gradient slot 0", max_g});
  plan.push_back({"layer gradient slot 1", max_g});
  for (const char* name : {"last layer output", "activation staging 0", "activation staging 1",
                           "final norm output", "d final norm output", "d hidden 0", "d hidden 1"})
    plan.push_back({name, act_bytes});
  for (const char* name : {"final norm rstd", "input ids", "targets", "positions", "document starts"})
    plan.push_back({name, size_t(N) * 4});
  plan.push_back({"loss", sizeof(double)});
  plan.push_back({"rope inv_freq", inv.size() * 4});
  plan.push_back({"layer workspace", layer_workspace_bytes(dims_)});
  size_t needed = 0;
  for (auto& [name, bytes] : plan) needed += (std::max<size_t>(bytes, 1) + 255) / 256 * 256;
  STRATA_CHECK_BUDGET(needed + dev_.used_bytes() <= dev_.budget_bytes(), "the device budget of ",
                      format_bytes(dev_.budget_bytes()), " is too small: this model and micro-batch need at least ",
                      format_bytes(needed), " (", stream ? "two layer slots" : "every layer resident",
                      ", one layer's activations and workspace, the final norm and ",
                      stream ? "two lm_head chunks" : "the lm_head", "); raise [device] memory to at least ",
                      format_bytes(needed + (1 << 20)), ", or lower micro_batch_size / sequence_len",
                      stream ? "" : ", or set offload.weights = \"stream\"");
  std::vector<void*> got;
  for (auto& [name, bytes] : plan) got.push_back(dev_.alloc(bytes, name));
  size_t k = 0;
  for (size_t s = 0; s < nslots; ++s) {
    weight_slots_.push_back(static_cast<char*>(got[k++]));
    slot_layer_.push_back(-1);
    slot_loaded_.push_back(dev_.event_create());
    slot_free_.push_back(dev_.event_create());
  }
  norm_dev_ = static_cast<float*>(got[k++]);
  norm_grad_dev_ = static_cast<float*>(got[k++]);
  if (stream) {
    for (size_t b = 0; b < head_slot_count_; ++b) head_slots_[b] = static_cast<char*>(got[k++]);
  } else {
    lm_resident_ = static_cast<char*>(got[k++]);
  }
  for (size_t b = 0; b < head_slot_count_; ++b) head_grad_slots_[b] = static_cast<float*>(got[k++]);
  ce_stats_ = static_cast<double*>(got[k++]);
  for (auto& g : grad_slots_) g = static_cast<char*>(got[k++]);
  x_final_ = static_cast<float*>(got[k++]);
  for (auto& x : x_pp_) x = static_cast<float*>(got[k++]);
  hn_ = static_cast<float*>(got[k++]);
  dhn_ = static_cast<float*>(got[k++]);
  for (auto& d : dx_) d = static_cast<float*>(got[k++]);
  rstd_final_ = static_cast<float*>(got[k++]);
  ids_ = static_cast<int32_t*>(got[k++]);
  targets_ = static_cast<int32_t*>(got[k++]);
  pos_ = static_cast<int32_t*>(got[k++]);
  doc_start_ = static_cast<int32_t*>(got[k++]);
  loss_dev_ = static_cast<double*>(got[k++]);
  inv_freq_ = static_cast<float*>(got[k++]);
  workspace_ = got[k++];
  STRATA_ASSERT(k == plan.size());
  dev_.copy_h2d(inv_freq_, inv.data(), inv.size() * 4, Stream::compute);
  ws_ = layer_workspace_carve(dims_, workspace_);
  dev_.stream_synchronize(Stream::compute);

  // checkpoints: the last layers' inputs stay on the device while the budget allows
  size_t count = 0;
  if (opt_.checkpoints == "device") count = L_;
  if (opt_.checkpoints == "auto") {
    const size_t margin = 1 << 20;
    size_t left = dev_.budget_bytes() > dev_.used_bytes() + margin ? dev_.budget_bytes() - dev_.used_bytes() - margin : 0;
    count = std::min(L_, left / ((act_bytes + 255) / 256 * 256));
  }
  device_ckpt_count_ = count;
  if (count) ckpt_dev_ = static_cast<float*>(dev_.alloc(count * act_bytes, str_cat(count, " layer checkpoints")));

  size_t staging_bytes = 0;  // must be what host_bytes() tells the host budget check
  auto pinned = [&](size_t bytes) {
    staging_bytes += bytes;
    return static_cast<float*>(dev_.alloc_pinned(bytes));
  };
  x0_host_ = pinned(act_bytes);
  dx0_host_ = pinned(act_bytes);
  for (auto& g : grad_staging_) g = pinned(max_g);
  norm_grad_staging_ = pinned(size_t(C) * 4);
  for (size_t b = 0; b < head_slot_count_; ++b) head_grad_staging_[b] = pinned(head_chunk_g);
  STRATA_ASSERT(staging_bytes == host_bytes(spec, opt_).staging, "host staging estimate drifted");
  if (L_ > count) ckpt_host_ = static_cast<float*>(dev_.alloc_pinned((L_ - count) * act_bytes));

  for (auto& e : pp_saved_) e = dev_.event_create();
  for (auto& e : ckpt_fetched_) e = dev_.event_create();
  for (auto& e : stage_free_) e = dev_.event_create();
  x_ready_ = dev_.event_create();
  loss_copied_ = dev_.event_create();
  for (size_t i = 0; i < L_; ++i) grad_copied_.push_back(std::shared_ptr<Event>(dev_.event_create()));
  norm_grad_copied_ = std::shared_ptr<Event>(dev_.event_create());
  dx0_copied_ = std::shared_ptr<Event>(dev_.event_create());
  for (int b = 0; b < 2; ++b) {
    head_slot_loaded_[b] = dev_.event_create();
    head_slot_free_[b] = dev_.event_create();
    head_grad_copied_[b] = std::shared_ptr<Event>(dev_.event_create());
  }
  optimizer_ticket_.assign(store_.groups().size(), 0);
}

Engine::~Engine() {
  try {
    synchronize();
  } catch (...) {  // an error already reported by the caller's path; still free everything
  }
  for (char* p : weight_slots_) dev_.free(p);
  for (void* p : {(void*)norm_dev_, (void*)norm_grad_dev_, (void*)lm_resident_, (void*)head_slots_[0],
                  (void*)head_slots_[1], (void*)head_grad_slots_[0], (void*)head_grad_slots_[1],
                  (void*)ce_stats_, (void*)grad_slots_[0], (void*)grad_slots_[1], (void*)x_final_, (void*)x_pp_[0],
                  (void*)x_pp_[1], (void*)ckpt_dev_, (void*)hn_, (void*)rstd_final_, (void*)dhn_,
                  (void*)dx_[0], (void*)dx_[1], (void*)ids_, (void*)targets_, (void*)pos_,
                  (void*)doc_start_, (void*)loss_dev_, (void*)inv_freq_, workspace_})
    if (p) dev_.free(p);
  for (void* p : {(void*)x0_host_, (void*)dx0_host_, (void*)ckpt_host_, (void*)grad_staging_[0],
                  (void*)grad_staging_[1], (void*)norm_grad_staging_, (void*)head_grad_staging_[0],
                  (void*)head_grad_staging_[1]})
    if (p) dev_.free_pinned(p);
}

// ---- weights ---------------------------------------------------------------------------

LayerWeights Engine::weights_at(const char* base, size_t layer) const {
  const ParamGroup& g = store_.layer_group(layer);
  const TensorTable& wt = store_.working_table();
  auto at = [&](int64_t row) -> const void* {
    return row == kAbsent ? nullptr : base + (wt[size_t(row)].offset - g.working_offset);
  };
  auto f = [&](int64_t row) { return static_cast<const float*>(at(row)); };
  const LayerParamRows& r = store_.spec().layers[layer];
  LayerWeights w;
  w.q = at(r.q); w.k = at(r.k); w.v = at(r.v); w.o = at(r.o);
  w.gate = at(r.gate); w.up = at(r.up); w.down = at(r.down);
  w.input_norm = f(r.input_norm); w.post_norm = f(r.post_norm);
  w.q_norm = f(r.q_norm); w.k_norm = f(r.k_norm);
  w.q_bias = f(r.q_bias); w.k_bias = f(r.k_bias); w.v_bias = f(r.v_bias); w.o_bias = f(r.o_bias);
  return w;
}

LayerGrads Engine::grads_at(char* base, size_t layer) const {
  const ParamGroup& g = store_.layer_group(layer);
  const TensorTable& ft = store_.f32_table();
  auto at = [&](int64_t row) -> float* {
    return row == kAbsent ? nullptr : reinterpret_cast<float*>(base + (ft[size_t(row)].offset - g.f32_offset));
  };
  const LayerParamRows& r = store_.spec().layers[layer];
  LayerGrads d;
  d.q = at(r.q); d.k = at(r.k); d.v = at(r.v); d.o = at(r.o);
  d.gate = at(r.gate); d.up = at(r.up); d.down = at(r.down);
  d.input_norm = at(r.input_norm); d.post_norm = at(r.post_norm);
  d.q_norm = at(r.q_norm); d.k_norm = at(r.k_norm);
  d.q_bias = at(r.q_bias); d.k_bias = at(r.k_bias); d.v_bias = at(r.v_bias); d.o_bias = at(r.o_bias);
  return d;
}

void Engine::wait_optimizer(size_t group) {
  if (!optimizer_ticket_[group]) return;
  const size_t ticket = optimizer_ticket_[group];
  exposed_wait(&optimizer_exposed_s_, [&] { host_.wait(ticket); });
  optimizer_ticket_[group] = 0;
}

void Engine::ensure_layer(size_t layer) {
  const size_t s = opt_.weights == "stream" ? layer % weight_slots_.size() : layer;
  if (slot_layer_[s] != int64_t(layer)) {
    wait_optimizer(1 + layer);  // the update of this layer must have landed in the working copy
    const ParamGroup& g = store_.layer_group(layer);
    dev_.stream_wait_event(Stream::h2d, *slot_free_[s]);
    dev_.copy_h2d(weight_slots_[s], store_.working() + g.working_offset, g.working_bytes, Stream::h2d);
    dev_.event_record(*slot_loaded_[s], Stream::h2d);
    slot_layer_[s] = int64_t(layer);
  }
  dev_.stream_wait_event(Stream::compute, *slot_loaded_[s]);
}

void Engine::ensure_final_norm() {
  if (!norm_stale_) return;
  wait_optimizer(store_.groups().size() - 1);
  const TensorSpec& row = store_.working_table()[size_t(store_.spec().final_norm)];
  dev_.copy_h2d(norm_dev_, store_.working() + row.offset, row.bytes(), Stream::compute);
  norm_stale_ = false;
}

// The lm_head rows [chunk * head_rows, ...) on the device, ready for the compute stream: read
// in place from the resident copy, or copied into slot chunk % slots on the h2d stream (once the
// compute stream has released what the slot held) unless the slot still holds them.
const void* Engine::ensure_head_chunk(size_t chunk) {
  const TensorSpec& row = store_.working_table()[size_t(store_.spec().lm_head_row())];
  const size_t row_bytes = size_t(dims_.C) * dtype_size(row.dtype);
  const int64_t v0 = int64_t(chunk) * head_rows_;
  if (lm_resident_) {
    if (lm_resident_stale_) {
      wait_optimizer(lm_group());
      dev_.copy_h2d(lm_resident_, store_.working() + row.offset, row.bytes(), Stream::compute);
      lm_resident_stale_ = false;
    }
    return lm_resident_ + size_t(v0) * row_bytes;
  }
  const size_t s = chunk % head_slot_count_;
  if (head_slot_chunk_[s] != int64_t(chunk)) {
    wait_optimizer(lm_group());  // the update must have landed in the working copy
    const int64_t vc = std::min(head_rows_, store_.spec().config.vocab_size - v0);
    dev_.stream_wait_event(Stream::h2d, *head_slot_free_[s]);
    dev_.copy_h2d(head_slots_[s], store_.working() + row.offset + size_t(v0) * row_bytes, size_t(vc) * row_bytes,
                  Stream::h2d);
    dev_.event_record(*head_slot_loaded_[s], Stream::h2d);
    head_slot_chunk_[s] = int64_t(chunk);
  }
  dev_.stream_wait_event(Stream::compute, *head_slot_loaded_[s]);
  return head_slots_[s];
}

void Engine::release_head_chunk(size_t chunk) {
  if (!lm_resident_) dev_.event_record(*head_slot_free_[chunk % head_slot_count_], Stream::compute);
}

// ---- activations -----------------------------------------------------------------------

float* Engine::ckpt_device(size_t layer) {
  const size_t first_dev = L_ - device_ckpt_count_;
  const int64_t NC = dims_.B * dims_.T * dims_.C;
  if (layer >= first_dev) return ckpt_dev_ + (layer - first_dev) * size_t(NC);
  return x_pp_[layer % 2];
}

void Engine::upload_tokens(const MicroBatch& mb) {
  STRATA_CHECK(mb.B >= 1 && mb.T >= 1 && mb.B <= opt_.max_batch && mb.T <= opt_.max_tokens,
               "micro-batch of ", mb.B, "x", mb.T, " tokens exceeds the engine's buffers (",
               opt_.max_batch, "x", opt_.max_tokens, ")");
  const size_t n = size_t(mb.B * mb.T);
  STRATA_ASSERT(mb.ids.size() == n && mb.targets.size() == n && mb.pos.size() == n);
  const int64_t V = store_.spec().config.vocab_size;
  for (size_t i = 0; i < n; ++i) {
    STRATA_CHECK(mb.ids[i] >= 0 && mb.ids[i] < V, "token id ", mb.ids[i], " at position ", i,
                 " is outside the vocabulary [0, ", V, ")");
    STRATA_CHECK(mb.targets[i] == -100 || (mb.targets[i] >= 0 && mb.targets[i] < V), "label ",
                 mb.targets[i], " at position ", i, " is neither -100 nor in [0, ", V, ")");
  }
  host_.drain();  // the previous micro-batch's scatter still reads ids_host_ and dx0_host_
  dims_.B = mb.B;
  dims_.T = mb.T;
  has_docs_ = !mb.doc_start.empty();
  ids_host_ = mb.ids;
  dev_.copy_h2d(ids_, mb.ids.data(), n * 4, Stream::compute);
  dev_.copy_h2d(targets_, mb.targets.data(), n * 4, Stream::compute);
  dev_.copy_h2d(pos_, mb.pos.data(), n * 4, Stream::compute);
  if (has_docs_) {
    STRATA_ASSERT(mb.doc_start.size() == n);
    dev_.copy_h2d(doc_start_, mb.doc_start.data(), n * 4, Stream::compute);
  }
}

void Engine::forward(const MicroBatch& mb) {
  const Stream s = Stream::compute;
  const int64_t N = mb.B * mb.T, C = dims_.C;
  const size_t act_bytes = size_t(N * C) * 4;

  // embedding on the host: gather rows of the working table (exact conversion to f32)
  wait_optimizer(0);
  const TensorSpec& emb = store_.working_table()[size_t(store_.spec().embed)];
  const char* table = store_.working() + emb.offset;
  const size_t row_bytes = size_t(C) * dtype_size(emb.dtype);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n)
    dtype_convert(x0_host_ + n * C, DType::f32, table + size_t(mb.ids[size_t(n)]) * row_bytes, emb.dtype, size_t(C));
  dev_.stream_wait_event(s, *pp_saved_[0]);
  dev_.copy_h2d(ckpt_device(0), x0_host_, act_bytes, s);

  TokenContext ctx{pos_, has_docs_ ? doc_start_ : nullptr, inv_freq_};
  const size_t first_dev = L_ - device_ckpt_count_;
  for (size_t i = 0; i < L_; ++i) {
    ensure_layer(i);
    const size_t slot = opt_.weights == "stream" ? i % weight_slots_.size() : i;
    float* in = ckpt_device(i);
    float* out = i + 1 < L_ ? ckpt_device(i + 1) : x_final_;
    const bool out_spills = i + 1 < L_ && i + 1 < first_dev;
    if (out_spills) dev_.stream_wait_event(s, *pp_saved_[(i + 1) % 2]);  // its last d2h is done
    layer_forward(dev_, s, dims_, weights_at(weight_slots_[slot], i), ctx, ws_, out, in);
    dev_.event_record(*slot_free_[slot], s);
    if (out_spills) {
      dev_.event_record(*x_ready_, s);
      dev_.stream_wait_event(Stream::d2h, *x_ready_);
      dev_.copy_d2h(ckpt_host_ + (i + 1) * size_t(N * C), out, act_bytes, Stream::d2h);
      dev_.event_record(*pp_saved_[(i + 1) % 2], Stream::d2h);
    }
  }
  ensure_final_norm();
  dev_.rmsnorm_forward(s, hn_, rstd_final_, x_final_, norm_dev_, N, C, dims_.eps);
}

// The loss head: lm_head chunk by chunk (engine.h). Forward: online-softmax statistics per
// token over chunks 0..K-1, then the summed loss. Backward: chunks K-1..0 again, each adding its
// share into d(hidden) and sending its dW chunk to the host; then the final norm's backward.
void Engine::loss_head(const MicroBatch& mb, bool backward, float grad_scale) {
  const Stream s = Stream::compute;
  const ModelSpec& spec = store_.spec();
  const int64_t N = mb.B * mb.T, C = dims_.C, V = spec.config.vocab_size;
  const DType lm_type = store_.working_table()[size_t(spec.lm_head_row())].dtype;
  auto chunk_rows = [&](size_t k) { return std::min(head_rows_, V - int64_t(k) * head_rows_); };
  for (size_t k = 0; k < head_chunks_; ++k) {
    const void* w = ensure_head_chunk(k);
    dev_.lm_head_ce_chunk_stats(s, ce_stats_, hn_, w, lm_type, targets_, N, C, V, int64_t(k) * head_rows_,
                                chunk_rows(k), k == 0);
    release_head_chunk(k);
  }
  dev_.memset_zero(loss_dev_, sizeof(double), s);
  dev_.lm_head_ce_stats_loss(s, loss_dev_, ce_stats_, targets_, N, V);
  if (!backward) return;

  dev_.memset_zero(dhn_, size_t(N * C) * 4, s);
  float* lm_grad = store_.grad_of(size_t(spec.lm_head_row()));  // (V, C) host accumulation
  for (size_t step = 0; step < head_chunks_; ++step) {
    const size_t k = head_chunks_ - 1 - step;
    const size_t b = step % head_slot_count_;
    const int64_t v0 = int64_t(k) * head_rows_, vc = chunk_rows(k);
    const void* w = ensure_head_chunk(k);
    dev_.stream_wait_event(s, *head_grad_copied_[b]);  // the slot's previous chunk has left
    dev_.memset_zero(head_grad_slots_[b], size_t(vc * C) * 4, s);
    dev_.lm_head_ce_chunk_backward(s, dhn_, head_grad_slots_[b], hn_, w, lm_type, ce_stats_, targets_, N, C, V,
                                   v0, vc, grad_scale);
    release_head_chunk(k);

    // dW chunk -> pinned staging -> added into its rows of the host gradient
    dev_.event_record(*x_ready_, s);
    if (head_staging_ticket_[b]) exposed_wait(&d2h_wait_s_, [&] { host_.wait(head_staging_ticket_[b]); });
    dev_.stream_wait_event(Stream::d2h, *x_ready_);
    dev_.copy_d2h(head_grad_staging_[b], head_grad_slots_[b], size_t(vc * C) * 4, Stream::d2h);
    dev_.event_record(*head_grad_copied_[b], Stream::d2h);
    auto ev = head_grad_copied_[b];
    float* staging = head_grad_staging_[b];
    float* dst = lm_grad + size_t(v0 * C);
    const size_t count = size_t(vc * C);
    head_staging_ticket_[b] = host_.enqueue([this, ev] { dev_.event_synchronize(*ev); },
                                            [this, staging, dst, count] { accumulate(dst, staging, count); });
  }

  // final norm backward; its gradient goes to the host like the others
  dev_.stream_wait_event(s, *norm_grad_copied_);
  dev_.memset_zero(norm_grad_dev_, size_t(C) * 4, s);
  dev_.rmsnorm_backward(s, dx_[0], norm_grad_dev_, dhn_, x_final_, norm_dev_, rstd_final_, N, C);
  dev_.event_record(*x_ready_, s);
  dev_.stream_wait_event(Stream::d2h, *x_ready_);
  dev_.copy_d2h(norm_grad_staging_, norm_grad_dev_, size_t(C) * 4, Stream::d2h);
  dev_.event_record(*norm_grad_copied_, Stream::d2h);
  auto ev = norm_grad_copied_;
  host_.enqueue([this, ev] { dev_.event_synchronize(*ev); }, [this] {
    accumulate(store_.grad_of(size_t(store_.spec().final_norm)), norm_grad_staging_, size_t(dims_.C));
  });
  update_group_when_landed(store_.groups().size() - 1);  // final norm (and an untied lm_head)
}

void Engine::backward(const MicroBatch& mb) {
  const Stream s = Stream::compute;
  const int64_t N = mb.B * mb.T, C = dims_.C;
  const size_t act_bytes = size_t(N * C) * 4;
  const size_t first_dev = L_ - device_ckpt_count_;
  TokenContext ctx{pos_, has_docs_ ? doc_start_ : nullptr, inv_freq_};
  float* dout = dx_[0];
  float* dx = dx_[1];
  std::vector<bool> copied_this_step(L_, false);
  for (size_t step = 0; step < L_; ++step) {
    const size_t i = L_ - 1 - step;
    const size_t b = i % 2;
    ensure_layer(i);
    const size_t slot = opt_.weights == "stream" ? i % weight_slots_.size() : i;
    float* x = ckpt_device(i);
    // Bring a spilled checkpoint back, except for the last two layers: the forward's last
    // writes into the ping-pong buffers were exactly their inputs, still there (fetching them
    // again would also overwrite a buffer the forward may still be reading).
    if (i < first_dev && i + 2 < L_) {
      dev_.stream_wait_event(Stream::h2d, *stage_free_[b]);
      dev_.stream_wait_event(Stream::h2d, *pp_saved_[b]);
      const float* src = i == 0 ? x0_host_ : ckpt_host_ + i * size_t(N * C);
      dev_.copy_h2d(x, src, act_bytes, Stream::h2d);
      dev_.event_record(*ckpt_fetched_[b], Stream::h2d);
      dev_.stream_wait_event(s, *ckpt_fetched_[b]);
    }
    char* g = grad_slots_[b];
    if (i + 2 < L_ && copied_this_step[i + 2]) dev_.stream_wait_event(s, *grad_copied_[i + 2]);
    const ParamGroup& grp = store_.layer_group(i);
    dev_.memset_zero(g, grp.f32_bytes, s);
    LayerGrads lg = grads_at(g, i);
    layer_backward(dev_, s, dims_, weights_at(weight_slots_[slot], i), lg, ctx, ws_, dx, dout, x);
    dev_.event_record(*slot_free_[slot], s);
    dev_.event_record(*stage_free_[b], s);

    // gradient out: device slot -> pinned staging -> host accumulation, in layer order
    dev_.event_record(*x_ready_, s);
    if (staging_ticket_[b]) exposed_wait(&d2h_wait_s_, [&] { host_.wait(staging_ticket_[b]); });
    dev_.stream_wait_event(Stream::d2h, *x_ready_);
    dev_.copy_d2h(grad_staging_[b], g, grp.f32_bytes, Stream::d2h);
    dev_.event_record(*grad_copied_[i], Stream::d2h);
    copied_this_step[i] = true;
    auto ev = grad_copied_[i];
    float* staging = grad_staging_[b];
    staging_ticket_[b] = host_.enqueue([this, ev] { dev_.event_synchronize(*ev); }, [this, staging, i] {
      const ParamGroup& gg = store_.layer_group(i);
      accumulate(store_.grad() + gg.f32_offset / 4, staging, gg.f32_bytes / 4);
    });
    update_group_when_landed(1 + i);
    std::swap(dout, dx);
  }
  // embedding backward on the host: scatter-add d x0 into the table's gradient, in token order
  dev_.event_record(*x_ready_, s);
  dev_.stream_wait_event(Stream::d2h, *x_ready_);
  dev_.copy_d2h(dx0_host_, dout, act_bytes, Stream::d2h);
  dev_.event_record(*dx0_copied_, Stream::d2h);
  auto ev = dx0_copied_;
  const int64_t n_tokens = N;
  host_.enqueue([this, ev] { dev_.event_synchronize(*ev); }, [this, n_tokens] {
    cpu::embedding_backward(store_.grad_of(size_t(store_.spec().embed)), dx0_host_, ids_host_.data(),
                            n_tokens, dims_.C);
  });
  update_group_when_landed(0);  // the embedding (and a tied lm_head)
}

double Engine::forward_backward(const MicroBatch& mb, float grad_scale) {
  upload_tokens(mb);
  forward(mb);
  loss_head(mb, true, grad_scale);
  backward(mb);
  dev_.copy_d2h(&loss_host_, loss_dev_, sizeof(double), Stream::compute);
  dev_.event_record(*loss_copied_, Stream::compute);
  exposed_wait(&d2h_wait_s_, [&] {
    dev_.event_synchronize(*loss_copied_);
    dev_.stream_synchronize(Stream::compute);  // surfaces a kernel's error here
    dev_.event_synchronize(*dx0_copied_);
  });
  return loss_host_;
}

double Engine::forward_loss(const MicroBatch& mb) {
  upload_tokens(mb);
  forward(mb);
  loss_head(mb, false, 1.f);
  dev_.copy_d2h(&loss_host_, loss_dev_, sizeof(double), Stream::compute);
  dev_.stream_synchronize(Stream::compute);
  return loss_host_;
}

void Engine::zero_grads() {
  host_.drain();
  std::memset(store_.grad(), 0, store_.f32_floats() * 4);
}

double Engine::optimizer_step(AdamWParams params, double max_grad_norm, double weight_decay) {
  exposed_wait(&d2h_wait_s_, [&] { host_.drain(); });  // every gradient has landed
  double norm = 0;
  exposed_wait(&optimizer_exposed_s_,
               [&] { norm = std::sqrt(sum_of_squares(store_.grad(), int64_t(store_.f32_floats()))); });
  STRATA_CHECK(std::isfinite(norm), "the gradient norm is not finite (", norm,
               "); lower optim.learning_rate or check the data");
  params.clip_scale = max_grad_norm > 0 && norm > max_grad_norm ? max_grad_norm / (norm + 1e-6) : 1.0;
  for (size_t gi = 0; gi < store_.groups().size(); ++gi)
    optimizer_ticket_[gi] = host_.enqueue([this, gi, params, weight_decay] { adamw_group(gi, params, weight_decay); });
  for (auto& l : slot_layer_) l = -1;  // every device copy of the weights is now stale
  for (auto& c : head_slot_chunk_) c = -1;
  lm_resident_stale_ = norm_stale_ = true;
  return norm;
}

// Runs on the host queue: AdamW over one group's rows, then its gradient is zeroed (consumed).
void Engine::adamw_group(size_t gi, const AdamWParams& params, double weight_decay) {
  const ParamGroup& g = store_.groups()[gi];
  const TensorTable& wt = store_.working_table();
  AdamWParams p = params;
  for (size_t r = g.first_row; r < g.end_row; ++r) {
    p.weight_decay = wt[r].shape.size() == 2 ? weight_decay : 0.0;  // no decay on norms, biases
    adamw_update(store_.master_of(r), store_.m() + store_.f32_table()[r].offset / 4,
                 store_.v() + store_.f32_table()[r].offset / 4, store_.grad_of(r), store_.working_of(r),
                 wt[r].dtype, wt[r].numel(), p);
  }
  std::memset(store_.grad() + g.f32_offset / 4, 0, g.f32_bytes);
}

void Engine::update_group_when_landed(size_t gi) {
  if (!landed_.active) return;
  const AdamWParams params = landed_.params;
  const double wd = landed_.weight_decay;
  optimizer_ticket_[gi] = host_.enqueue([this, gi, params, wd] {
    const ParamGroup& g = store_.groups()[gi];
    group_sq_[gi] = sum_of_squares(store_.grad() + g.f32_offset / 4, int64_t(g.f32_bytes / 4));
    adamw_group(gi, params, wd);
  });
}

double Engine::forward_backward_update(const MicroBatch& mb, float grad_scale, AdamWParams params,
                                       double weight_decay) {
  params.clip_scale = 1.0;
  landed_ = {true, params, weight_decay};
  group_sq_.assign(store_.groups().size(), 0.0);
  double loss;
  try {
    loss = forward_backward(mb, grad_scale);
  } catch (...) {
    landed_.active = false;
    throw;
  }
  landed_.active = false;
  for (auto& l : slot_layer_) l = -1;  // every device copy of the weights is now stale
  for (auto& c : head_slot_chunk_) c = -1;
  lm_resident_stale_ = norm_stale_ = true;
  return loss;
}

double Engine::landed_update_norm() {
  host_.drain();
  double sq = 0;
  for (double g : group_sq_) sq += g;
  const double norm = std::sqrt(sq);
  STRATA_CHECK(std::isfinite(norm), "the gradient norm is not finite (", norm,
               "); lower optim.learning_rate or check the data");
  return norm;
}

// Every stream and the host queue are drained even when one of them failed, so nothing is
// left running on buffers the caller may free next; then the first error is rethrown.
void Engine::synchronize() {
  std::exception_ptr first;
  auto collect = [&](auto&& f) {
    try {
      f();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  };
  for (int s = 0; s < kStreamCount; ++s) collect([&] { dev_.stream_synchronize(Stream(s)); });
  collect([&] { host_.drain(); });
  for (auto& t : optimizer_ticket_) t = 0;
  if (first) std::rethrow_exception(first);
}

// The trainer thread blocks in `wait`; the part of that time the compute stream was neither busy
// nor blocked on another stream (it had run out of work) is added to *exposed. Only that part
// lengthens the step: the rest overlapped device work.
template <class F>
void Engine::exposed_wait(double* exposed, F&& wait) {
  const auto t0 = Clock::now();
  const DeviceCounters c0 = dev_.counters();
  wait();
  const DeviceCounters c1 = dev_.counters();
  const double device_s = (c1.compute_busy_s - c0.compute_busy_s) +
                          (c1.stream_wait_s[int(Stream::compute)] - c0.stream_wait_s[int(Stream::compute)]);
  *exposed += std::max(0.0, seconds_since(t0) - device_s);
}

EngineStats Engine::stats() const {
  DeviceCounters c = dev_.counters();
  EngineStats s;
  s.compute_s = c.compute_busy_s;
  s.h2d_wait_s = c.stream_wait_s[int(Stream::compute)];
  s.d2h_wait_s = d2h_wait_s_;
  s.optimizer_s = host_.busy_s();
  s.optimizer_exposed_s = optimizer_exposed_s_;
  s.link_bytes = c.h2d_bytes + c.d2h_bytes;
  return s;
}

}  // namespace strata
