// The zeroth-order step engine (engine_zo.h). Reading order: the buffer table, set-up, the
// weights (clean slots, the perturbed slot), one run (tokens, embedding, layers, head), the
// update.
//
// Events (the first-order engine's table, engine.cpp, has the same meaning):
//   slot_loaded[s]  h2d (upload into clean slot s)   compute (the layer's passes)
//   slot_free[s]    compute (both passes done)       h2d (next upload into s)
//   head_loaded[b]  h2d (lm_head chunk upload)       compute (the chunk's passes)
//   head_free[b]    compute (both passes done)       h2d (next chunk upload into b)
// The perturbed slots are written and read on the compute stream only (stream order guards
// them). Host-side: update_ticket[g] (group g's ZO-SGD update, before its upload); the pinned
// x0 buffers and ids_host are rewritten only after the previous run synchronised the compute
// stream (run() ends with the losses' copy).
#include "offload/engine_zo.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/zo.h"
#include "src/core/error.h"
#include "src/device/arena.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;

template <class T>
std::function<void(void*)> bind_at(T** slot) {
  if (!slot) return {};
  return [slot](void* p) { *slot = static_cast<T*>(p); };
}

}  // namespace

// ---- the buffer table ----------------------------------------------------------------------

std::vector<EngineBuffer> zo_buffer_table(const EngineShape& s, ZoBuffers* into) {
  const size_t act = s.activation_bytes(), tokens_i32 = bytes_of<int32_t>(s.tokens);
  const size_t slot = s.slot_bytes.empty() ? 0 : *std::max_element(s.slot_bytes.begin(), s.slot_bytes.end());
  const size_t head_w = size_t(s.head_rows) * s.lm_row_bytes;
  const size_t clean_slots = std::min<size_t>(2, s.layers);
  std::vector<EngineBuffer> t;
  auto dev = [&](std::string name, size_t bytes, std::function<void(void*)> bind) {
    t.push_back({std::move(name), bytes, Memory::device, std::move(bind)});
  };
  if (into) into->slots.assign(clean_slots, nullptr);
  for (size_t k = 0; k < clean_slots; ++k)
    dev(str_cat("layer weight slot ", k), slot, bind_at(into ? &into->slots[k] : nullptr));
  dev("perturbed layer weights", slot, bind_at(into ? &into->perturbed : nullptr));
  dev("final norm weight", bytes_of<float>(s.C), bind_at(into ? &into->norm : nullptr));
  dev("perturbed final norm weight", bytes_of<float>(s.C), bind_at(into ? &into->norm_perturbed : nullptr));
  for (size_t k = 0; k < s.head_slots; ++k)
    dev(str_cat("lm_head chunk slot ", k, " (", s.head_rows, " vocab rows)"), head_w,
        bind_at(into ? &into->head_slots[k] : nullptr));
  dev("perturbed lm_head chunk", head_w, bind_at(into ? &into->head_perturbed : nullptr));
  for (size_t p = 0; p < 2; ++p) {
    dev(str_cat("cross-entropy token statistics, pass ", p), bytes_of<double>(3 * s.tokens),
        bind_at(into ? &into->ce_stats[p] : nullptr));
    for (size_t k = 0; k < 2; ++k)
      dev(str_cat("hidden states, pass ", p, " buffer ", k), act, bind_at(into ? &into->x[p][k] : nullptr));
  }
  dev("final norm rstd", bytes_of<float>(s.tokens), bind_at(into ? &into->rstd_final : nullptr));
  dev("input ids", tokens_i32, bind_at(into ? &into->ids : nullptr));
  dev("targets", tokens_i32, bind_at(into ? &into->targets : nullptr));
  dev("positions", tokens_i32, bind_at(into ? &into->pos : nullptr));
  dev("document starts", tokens_i32, bind_at(into ? &into->doc_start : nullptr));
  dev("losses", 2 * sizeof(double), bind_at(into ? &into->loss : nullptr));
  dev("rope inv_freq", bytes_of<float>(int64_t(s.rope_floats)), bind_at(into ? &into->inv_freq : nullptr));
  dev("layer forward workspace", layer_forward_workspace_bytes(s.layer_capacity), bind_at(into ? &into->workspace : nullptr));
  for (size_t p = 0; p < 2; ++p)
    t.push_back({str_cat("embedding output, pass ", p, " (host)"), act, Memory::pinned,
                 bind_at(into ? &into->x0_host[p] : nullptr)});
  return t;
}

// ---- set-up ----------------------------------------------------------------------------------

EngineShape zo_engine_shape(const ModelSpec& spec, EngineOptions options) {
  options.weights = "stream";
  options.checkpoints = "host";
  return EngineShape::of(spec, HostStore::layout(spec), options);
}

size_t ZoEngine::device_bytes(const ModelSpec& spec, const EngineOptions& options) {
  return engine_device_bytes(zo_buffer_table(zo_engine_shape(spec, options), nullptr));
}

size_t ZoEngine::pinned_bytes(const ModelSpec& spec, const EngineOptions& options) {
  return engine_pinned_bytes(zo_buffer_table(zo_engine_shape(spec, options), nullptr));
}

ZoEngine::ZoEngine(Device& dev, HostStore& store, const EngineOptions& options)
    : dev_(dev), store_(store), shape_(zo_engine_shape(store.spec(), options)) {
  L_ = shape_.layers;
  dims_ = shape_.layer_capacity;
  STRATA_ASSERT(store_.working_table()[size_t(store_.spec().final_norm)].dtype == DType::f32,
                "the final norm's working copy must be f32");
  table_ = zo_buffer_table(shape_, &buf_);
  const size_t needed = engine_device_bytes(table_);
  STRATA_CHECK_BUDGET(needed + dev_.used_bytes() <= dev_.budget_bytes(), "the device budget of ",
                      format_bytes(dev_.budget_bytes()), " is too small for zeroth-order training: this model "
                      "and micro-batch need at least ", format_bytes(needed), " (two clean layer slots and one "
                      "perturbed, both passes' activations, one layer's workspace, three lm_head chunks); raise "
                      "[device] memory to at least ", format_bytes(needed + (1 << 20)),
                      ", or lower micro_batch_size / sequence_len");
  try {
    for (EngineBuffer& b : table_) {
      b.ptr = b.memory == Memory::device ? dev_.alloc(b.bytes, "zo: " + b.name) : dev_.alloc_pinned(b.bytes);
      b.bind(b.ptr);
    }
  } catch (...) {
    free_buffers();
    throw;
  }
  ws_ = layer_forward_workspace_carve(shape_.layer_capacity, buf_.workspace);
  const std::vector<float> inv = model_rope_inv_freq(store_.spec().config);
  dev_.copy_h2d(buf_.inv_freq, inv.data(), bytes_of<float>(int64_t(inv.size())), Stream::compute);
  dev_.stream_synchronize(Stream::compute);
  for (size_t s = 0; s < buf_.slots.size(); ++s) {
    ev_.slot_loaded.push_back(dev_.event_create());
    ev_.slot_free.push_back(dev_.event_create());
  }
  for (int b = 0; b < 2; ++b) {
    ev_.head_loaded[b] = dev_.event_create();
    ev_.head_free[b] = dev_.event_create();
  }
  slot_layer_.assign(buf_.slots.size(), -1);
  update_ticket_.assign(store_.groups().size(), 0);
  STRATA_CHECK(store_.placement().in_ram(StateArray::master), "zeroth-order training keeps the fp32 master weights "
               "in RAM (6 bytes per parameter in bf16): set offload.optimizer = \"host\"");
  optimizer_ = std::make_unique<HostZoSgd>(store_, store_.placement());
}

ZoEngine::~ZoEngine() {
  try {
    synchronize();
  } catch (...) {  // already reported on the caller's path; still free everything
  }
  free_buffers();
}

void ZoEngine::free_buffers() {
  for (EngineBuffer& b : table_) {
    if (!b.ptr) continue;
    if (b.memory == Memory::device) dev_.free(b.ptr);
    else dev_.free_pinned(b.ptr);
    b.ptr = nullptr;
  }
}

size_t ZoEngine::weight_link_bytes() const {
  const ModelSpec& spec = store_.spec();
  const TensorTable& wt = store_.working_table();
  size_t bytes = wt[size_t(spec.final_norm)].bytes() + wt[size_t(spec.lm_head_row())].bytes();
  for (size_t i = 0; i < L_; ++i) bytes += store_.layer_group(i).working_bytes;
  return bytes;
}

// ---- weights -------------------------------------------------------------------------------

void ZoEngine::wait_group(size_t group) {
  if (!update_ticket_[group]) return;
  const uint64_t ticket = update_ticket_[group];
  exposed_wait([&] { host_.wait(ticket); });
  update_ticket_[group] = 0;
}

void ZoEngine::ensure_layer(size_t layer) {
  const size_t s = layer % buf_.slots.size();
  if (slot_layer_[s] != int64_t(layer)) {
    wait_group(1 + layer);  // this step's update of the layer has landed in the working copy
    const ParamGroup& g = store_.layer_group(layer);
    dev_.stream_wait_event(Stream::h2d, *ev_.slot_free[s]);
    dev_.copy_h2d(buf_.slots[s], store_.working() + g.working_offset, g.working_bytes, Stream::h2d);
    dev_.event_record(*ev_.slot_loaded[s], Stream::h2d);
    slot_layer_[s] = int64_t(layer);
  }
  dev_.stream_wait_event(Stream::compute, *ev_.slot_loaded[s]);
}

void ZoEngine::ensure_final_norm() {
  if (!norm_stale_) return;
  wait_group(store_.groups().size() - 1);
  const TensorSpec& row = store_.working_table()[size_t(store_.spec().final_norm)];
  dev_.copy_h2d(buf_.norm, store_.working() + row.offset, row.bytes(), Stream::compute);
  norm_stale_ = false;
}

const char* ZoEngine::ensure_head_chunk(size_t chunk) {
  const TensorSpec& row = store_.working_table()[size_t(store_.spec().lm_head_row())];
  const int64_t v0 = int64_t(chunk) * shape_.head_rows;
  const size_t s = chunk % shape_.head_slots;
  if (head_slot_chunk_[s] != int64_t(chunk)) {
    wait_group(shape_.tied ? 0 : store_.groups().size() - 1);
    const int64_t vc = std::min(shape_.head_rows, shape_.V - v0);
    dev_.stream_wait_event(Stream::h2d, *ev_.head_free[s]);
    dev_.copy_h2d(buf_.head_slots[s], store_.working() + row.offset + size_t(v0) * shape_.lm_row_bytes,
                  size_t(vc) * shape_.lm_row_bytes, Stream::h2d);
    dev_.event_record(*ev_.head_loaded[s], Stream::h2d);
    head_slot_chunk_[s] = int64_t(chunk);
  }
  dev_.stream_wait_event(Stream::compute, *ev_.head_loaded[s]);
  return buf_.head_slots[s];
}

// Pass p's weights of `layer`: the clean slot, or the perturbed slot rebuilt from it with
// p.sign · ε · z for every tensor of the layer.
const char* ZoEngine::layer_weights_for(const Pass& p, size_t layer, uint64_t seed, float eps) {
  const char* clean = buf_.slots[layer % buf_.slots.size()];
  if (p.sign == 0) return clean;
  const ParamGroup& g = store_.layer_group(layer);
  const TensorTable& wt = store_.working_table();
  dev_.copy_d2d(buf_.perturbed, clean, g.working_bytes, Stream::compute);
  for (size_t r = g.first_row; r < g.end_row; ++r)
    dev_.zo_perturb(buf_.perturbed + (wt[r].offset - g.working_offset), wt[r].dtype, seed, uint32_t(r), 0,
                    float(p.sign) * eps, wt[r].numel(), Stream::compute);
  return buf_.perturbed;
}

namespace {

// A layer's tensors inside its contiguous block of the working arena, as engine.cpp maps them.
LayerWeights layer_weights_in(const HostStore& store, const char* base, size_t layer) {
  const ParamGroup& g = store.layer_group(layer);
  const TensorTable& wt = store.working_table();
  const LayerParamRows& r = store.spec().layers[layer];
  auto at = [&](int64_t row) -> const void* {
    return row == kAbsent ? nullptr : base + (wt[size_t(row)].offset - g.working_offset);
  };
  auto atf = [&](int64_t row) { return static_cast<const float*>(at(row)); };
  LayerWeights w;
  w.q = at(r.q), w.k = at(r.k), w.v = at(r.v), w.o = at(r.o);
  w.gate = at(r.gate), w.up = at(r.up), w.down = at(r.down);
  w.input_norm = atf(r.input_norm), w.post_norm = atf(r.post_norm), w.q_norm = atf(r.q_norm), w.k_norm = atf(r.k_norm);
  w.q_bias = atf(r.q_bias), w.k_bias = atf(r.k_bias), w.v_bias = atf(r.v_bias), w.o_bias = atf(r.o_bias);
  return w;
}

}  // namespace

// ---- one run -----------------------------------------------------------------------------------

ZoLosses ZoEngine::dual_forward(const MicroBatch& mb, uint64_t seed, float eps) {
  STRATA_CHECK(std::isfinite(eps) && eps > 0, "optim.zo_eps must be a positive number, got ", eps);
  ZoLosses out;
  run(mb, {{+1}, {-1}}, seed, eps, &out);
  return out;
}

double ZoEngine::perturbed_forward(const MicroBatch& mb, uint64_t seed, float eps, int sign) {
  STRATA_CHECK(std::isfinite(eps) && eps > 0, "optim.zo_eps must be a positive number, got ", eps);
  STRATA_ASSERT(sign == 1 || sign == -1);
  return run(mb, {{sign}}, seed, eps, nullptr);
}

double ZoEngine::forward_loss(const MicroBatch& mb) { return run(mb, {{0}}, 0, 0.f, nullptr); }

void ZoEngine::upload_tokens(const MicroBatch& mb) {
  STRATA_CHECK(mb.B >= 1 && mb.T >= 1 && mb.B <= shape_.layer_capacity.B && mb.T <= shape_.layer_capacity.T, "micro-batch of ",
               mb.B, "x", mb.T, " tokens exceeds the engine's buffers (", shape_.layer_capacity.B, "x",
               shape_.layer_capacity.T, ")");
  const size_t n = size_t(mb.B * mb.T);
  STRATA_ASSERT(mb.ids.size() == n && mb.targets.size() == n && mb.pos.size() == n);
  for (size_t i = 0; i < n; ++i) {
    STRATA_CHECK(mb.ids[i] >= 0 && mb.ids[i] < shape_.V, "token id ", mb.ids[i], " at position ", i,
                 " is outside the vocabulary [0, ", shape_.V, ")");
    STRATA_CHECK(mb.targets[i] == -100 || (mb.targets[i] >= 0 && mb.targets[i] < shape_.V), "label ",
                 mb.targets[i], " at position ", i, " is neither -100 nor in [0, ", shape_.V, ")");
  }
  dims_.B = mb.B;
  dims_.T = mb.T;
  has_docs_ = !mb.doc_start.empty();
  ids_host_ = mb.ids;
  const size_t bytes = bytes_of<int32_t>(int64_t(n));
  dev_.copy_h2d(buf_.ids, mb.ids.data(), bytes, Stream::compute);
  dev_.copy_h2d(buf_.targets, mb.targets.data(), bytes, Stream::compute);
  dev_.copy_h2d(buf_.pos, mb.pos.data(), bytes, Stream::compute);
  if (has_docs_) {
    STRATA_ASSERT(mb.doc_start.size() == n);
    dev_.copy_h2d(buf_.doc_start, mb.doc_start.data(), bytes, Stream::compute);
  }
}

// Each pass's embedding output on the host: the working table's rows gathered (exact
// conversion to f32), then perturbed with the full table's element indices id·C + c (in f32,
// rounded to bf16 once when the table is bf16: what the device's zo_perturb does to a tensor).
void ZoEngine::embed_forward(const std::vector<Pass>& passes, uint64_t seed, float eps) {
  const int64_t N = dims_.N(), C = dims_.C;
  wait_group(0);
  const size_t row = size_t(store_.spec().embed);
  const TensorSpec& emb = store_.working_table()[row];
  const char* table = store_.working() + emb.offset;
  const size_t row_bytes = size_t(C) * dtype_size(emb.dtype);
  for (size_t p = 0; p < passes.size(); ++p) {
    float* x0 = buf_.x0_host[p];
    const float scale = float(passes[p].sign) * eps;
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const int32_t id = ids_host_[size_t(n)];
      float* xr = x0 + n * C;
      dtype_convert(xr, DType::f32, table + size_t(id) * row_bytes, emb.dtype, size_t(C));
      if (passes[p].sign == 0) continue;
      cpu::zo_perturb_f32(xr, seed, uint32_t(row), uint64_t(id) * uint64_t(C), scale, C);
      if (emb.dtype == DType::bf16)
        for (int64_t c = 0; c < C; ++c) xr[c] = bf16_to_f32(f32_to_bf16(xr[c]));
    }
    dev_.copy_h2d(buf_.x[p][0], x0, bytes_of<float>(N * C), Stream::compute);
  }
}

// Tokens, the embedding, every layer (both passes while it is on the device), the final norm
// and the chunked head (both passes' statistics per chunk), the losses back. Returns the first
// pass's summed loss; *out (when given) gets both.
double ZoEngine::run(const MicroBatch& mb, const std::vector<Pass>& passes, uint64_t seed, float eps,
                     ZoLosses* out) {
  const Stream s = Stream::compute;
  const size_t P = passes.size();
  STRATA_ASSERT(P == 1 || P == 2);
  upload_tokens(mb);
  embed_forward(passes, seed, eps);
  const int64_t N = dims_.N(), C = dims_.C, V = shape_.V, R = shape_.head_rows;
  const TokenContext ctx{buf_.pos, has_docs_ ? buf_.doc_start : nullptr, buf_.inv_freq};
  for (size_t i = 0; i < L_; ++i) {
    ensure_layer(i);
    for (size_t p = 0; p < P; ++p) {
      const char* w = layer_weights_for(passes[p], i, seed, eps);
      layer_forward(dev_, buf_.x[p][(i + 1) % 2], buf_.x[p][i % 2], layer_weights_in(store_, w, i), ctx, ws_, dims_, s);
    }
    dev_.event_record(*ev_.slot_free[i % buf_.slots.size()], s);
  }
  // final norm: hn of pass p into the ping-pong buffer the last layer read from
  ensure_final_norm();
  const uint32_t norm_row = uint32_t(store_.spec().final_norm);
  float* hn[2] = {};
  for (size_t p = 0; p < P; ++p) {
    const float* norm = buf_.norm;
    if (passes[p].sign != 0) {
      dev_.copy_d2d(buf_.norm_perturbed, buf_.norm, bytes_of<float>(C), s);
      dev_.zo_perturb(buf_.norm_perturbed, DType::f32, seed, norm_row, 0, float(passes[p].sign) * eps, C, s);
      norm = buf_.norm_perturbed;
    }
    hn[p] = buf_.x[p][(L_ + 1) % 2];
    dev_.rmsnorm_forward(hn[p], buf_.rstd_final, buf_.x[p][L_ % 2], norm, N, C, dims_.eps, s);
  }
  // head: each chunk serves both passes
  const uint32_t lm_row = uint32_t(store_.spec().lm_head_row());
  const DType lm_type = store_.working_table()[lm_row].dtype;
  for (size_t k = 0; k < shape_.head_chunks; ++k) {
    const char* clean = ensure_head_chunk(k);
    const int64_t v0 = int64_t(k) * R, vc = std::min(R, V - v0);
    for (size_t p = 0; p < P; ++p) {
      const void* w = clean;
      if (passes[p].sign != 0) {
        dev_.copy_d2d(buf_.head_perturbed, clean, size_t(vc) * shape_.lm_row_bytes, s);
        dev_.zo_perturb(buf_.head_perturbed, lm_type, seed, lm_row, uint64_t(v0 * C), float(passes[p].sign) * eps,
                        vc * C, s);
        w = buf_.head_perturbed;
      }
      dev_.lm_head_ce_chunk_stats(buf_.ce_stats[p], hn[p], w, lm_type, buf_.targets, N, C, V, v0, vc, k == 0, s);
    }
    dev_.event_record(*ev_.head_free[k % shape_.head_slots], s);
  }
  dev_.memset_zero(buf_.loss, 2 * sizeof(double), s);
  for (size_t p = 0; p < P; ++p) dev_.lm_head_ce_stats_loss(buf_.loss + p, buf_.ce_stats[p], buf_.targets, N, V, s);
  dev_.copy_d2h(loss_host_, buf_.loss, P * sizeof(double), s);
  dev_.stream_synchronize(s);
  if (out) {
    out->plus = loss_host_[0];
    out->minus = loss_host_[1];
  }
  return loss_host_[0];
}

// ---- the update --------------------------------------------------------------------------------

void ZoEngine::queue_update(const ZoSgdEstimate& estimate, double lr, double weight_decay) {
  // the previous update has been waited for group by group by the passes since; make sure
  for (size_t g = 0; g < update_ticket_.size(); ++g) wait_group(g);
  optimizer_->set_estimate(estimate);
  AdamWParams hyper;
  hyper.lr = lr;
  for (size_t g = 0; g < store_.groups().size(); ++g)
    update_ticket_[g] = host_.enqueue([this, g, hyper, weight_decay] { optimizer_->update(g, hyper, weight_decay); });
  for (auto& l : slot_layer_) l = -1;
  for (auto& c : head_slot_chunk_) c = -1;
  norm_stale_ = true;
}

void ZoEngine::synchronize() {
  std::exception_ptr first;
  for (int s = 0; s < kStreamCount; ++s) {
    try {
      dev_.stream_synchronize(Stream(s));
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  try {
    host_.drain();
  } catch (...) {
    if (!first) first = std::current_exception();
  }
  for (auto& t : update_ticket_) t = 0;
  if (first) std::rethrow_exception(first);
}

// The trainer thread waits for an update; the part of the wait the compute stream had nothing to
// do is exposed optimizer time (engine.cpp's exposed_wait).
template <class F>
void ZoEngine::exposed_wait(F&& wait) {
  const auto t0 = Clock::now();
  const DeviceCounters c0 = dev_.counters();
  wait();
  const DeviceCounters c1 = dev_.counters();
  const double device_s = (c1.compute_busy_s - c0.compute_busy_s) +
                          (c1.stream_wait_s[int(Stream::compute)] - c0.stream_wait_s[int(Stream::compute)]);
  optimizer_exposed_s_ += std::max(0.0, std::chrono::duration<double>(Clock::now() - t0).count() - device_s);
}

EngineStats ZoEngine::stats() const {
  const DeviceCounters c = dev_.counters();
  EngineStats s;
  s.compute_s = c.compute_busy_s;
  s.h2d_wait_s = c.stream_wait_s[int(Stream::compute)];
  s.optimizer_s = host_.busy_s();
  s.optimizer_exposed_s = optimizer_exposed_s_;
  s.link_bytes = c.h2d_bytes + c.d2h_bytes;
  return s;
}

}  // namespace strata
