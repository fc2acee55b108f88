// The step engine (engine.h). Reading order: set-up (buffers from the table, events), the
// weights (which slot holds what), one pass (tokens, forward, head, backward, finish), the
// staging helper every gradient goes through, then the optimizer.
//
// Layer-major passes (EngineOptions::group = g > 1, offload.accumulation = "layer_major"; DESIGN
// §3): one pass runs up to g micro-batches. Forward: layer i's weights arrive once and every
// micro-batch runs through it (last to first, so the checkpoint order is the exact reverse of the
// backward's: the NVMe spill reads back in reverse of what it wrote), each keeping its layer
// input as a checkpoint (g per layer, placed as engine.h says); lm_head chunks likewise.
// Backward: layer i's weights arrive once, the g backwards run in micro-batch order, micro-batch
// 0's dW straight into the layer's gradient slot, each later one's into a share slot then added
// (grad_share): the slot holds ((d0 + d1) + d2) + ..., the sums the host accumulation forms one
// micro-batch at a time, so one host add per pass gives the micro_batch schedule's bits. Link
// bytes per step ~ 2W + G instead of g (2W + G). Every per-micro-batch buffer has g rows
// (engine_buffers.h). Not with a tied lm_head outside LoRA (the head's rows and each micro-
// batch's embedding scatter share one gradient: the order of the additions would change).
//
// Events: each guards the reuse of one buffer across streams (or the host).
//   event               recorded on (after)        waited by (before)           guards against
//   (layer pass)        the weight slots' loaded[s] / released[s] pairs (weight_stream.h, owned by
//                       layer_pass.h): the layer weight slots, and the lm_head chunk slots
//   pp_saved[b]         d2h (spill of x_pp[b])     compute (writing x_pp[b]);   overwriting a ping-pong checkpoint
//                                                  h2d (fetching into x_pp[b])  before it reached the host
//   ckpt_fetched[b]     h2d (fetch into x_pp[b])   compute (the recompute)      reading a checkpoint not yet back
//   stage_free[b]       compute (layer backward)   h2d (next fetch into x_pp[b]) overwriting a checkpoint still read
//   compute_done        compute (what d2h copies)  d2h (the copy)               copying out unfinished results
//   grad_copied[i]      d2h (layer i's gradient)   compute (zeroing slot i % 2  reusing a gradient slot before it
//                                                  for layer i - 2); host task  left; adding staging before it landed
//   head_grad_copied[b] d2h (chunk gradient)       compute; host task           the same, lm_head gradient slot b
//   norm_grad_copied    d2h (final norm gradient)  compute; host task           the same, final norm gradient
//   dx0_copied          d2h (d x0)                 host task; finish_step       scattering d x0 before it landed
//   lora_grad_copied    d2h (LoRA micro-batch      compute (zeroing it); host   reusing the micro-batch adapter
//                       adapter gradients)         task                         gradients (data parallel)
//   loss_copied         compute (loss d2h)         host (finish_step)           reading the loss before it landed
// pp_saved, ckpt_fetched and stage_free exist once per (layer parity b, micro-batch m of the pass),
// as the ping-pong buffers do (x_pp[b] has a row per micro-batch); dx0_copied is recorded after
// each micro-batch's d x0, the last record covering them all (one d2h stream, in order).
// Host-side reuse is guarded by host-queue tickets: staging_ticket[b] / head_staging_ticket[b]
// (a staging buffer's previous reader), the layer pass's update ticket of group g (before its
// weights are uploaded), and scatter_ticket (upload_tokens waits for the previous micro-batch's
// scatter, which reads ids_host and dx0_host; not for the optimizer updates queued after it).
#include "offload/engine/engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "io/uring_file.h"
#include "src/core/error.h"
#include "src/core/fault.h"
#include "src/device/arena.h"
#include "src/device/host_ops.h"

namespace strata {
// ---- set-up ------------------------------------------------------------------------------

EngineHostBytes Engine::host_bytes(const ModelSpec& spec, const EngineOptions& options) {
  const EngineShape shape = EngineShape::of(spec, HostStore::layout(spec), options);
  EngineHostBytes b;
  b.staging = engine_pinned_bytes(engine_buffer_table(shape, nullptr));
  b.checkpoints = shape.checkpoints == CheckpointMode::device ? 0
                  : shape.checkpoints == CheckpointMode::nvme ? kSpillRing * shape.activation_bytes() + CheckpointSpill::host_bytes()
                                                              : shape.layers * shape.group * shape.activation_bytes();
  return b;
}

Engine::Engine(Device& dev, HostStore& store, const EngineOptions& opt, LoraStore* lora)
    : dev_(dev), store_(store), lora_(lora), opt_(opt), shape_(EngineShape::of(store.spec(), HostStore::layout(store.spec()), opt)) {
  const ModelSpec& spec = store_.spec();
  L_ = shape_.layers;
  STRATA_ASSERT(store_.working_table()[size_t(spec.final_norm)].dtype == DType::f32,
                "the final norm's working copy must be f32");
  STRATA_ASSERT(lora || store_.needs().grads, "the first-order engine lands gradients: its store needs them (HostAdamW::kState)");
  STRATA_ASSERT(opt.lora.enabled() == (lora != nullptr) && (!lora || store.options().weights_only),
                "LoRA mode needs the adapters and a frozen store, and only LoRA mode has them");

  // Layer-major sums a layer's gradient over the pass on the device, then adds it into the host
  // accumulation once: the micro_batch schedule's sums exactly, except for a tied lm_head, whose
  // gradient shares the embedding's rows with the scatter-add of every micro-batch in between
  // (LoRA: the base has no gradient, the adapters' accumulate on the device in either schedule).
  STRATA_CHECK(shape_.group == 1 || !shape_.tied || shape_.frozen(), "offload.accumulation = \"layer_major\" needs an untied lm_head "
               "(tie_word_embeddings = false): set offload.accumulation = \"micro_batch\" or \"auto\"");
  // Every buffer from the table: summed and checked against the device budget before anything
  // is allocated, so a budget that is too small fails before step 1 with the minimum it needs.
  table_ = engine_buffer_table(shape_, &buf_);
  const size_t needed = engine_device_bytes(table_);
  const bool stream = shape_.weights == WeightsMode::stream;
  STRATA_CHECK_BUDGET(needed + dev_.used_bytes() <= dev_.budget_bytes(), "the device budget of ",
                      format_bytes(dev_.budget_bytes()), " is too small: this model and micro-batch need at least ",
                      format_bytes(needed), " (", !stream ? "every layer resident"
                                                  : shape_.resident_layers ? str_cat(shape_.resident_layers, " resident layers and two layer slots")
                                                                           : std::string("two layer slots"),
                      ", one layer's activations and workspace, the final norm and ",
                      stream ? "two lm_head chunks" : "the lm_head", "); raise [device] memory to at least ",
                      format_bytes(needed + (1 << 20)), ", or lower micro_batch_size / sequence_len",
                      !stream ? ", or set offload.weights = \"stream\""
                              : shape_.resident_layers ? ", or lower offload.resident_layers" : "");
  allocate(table_);
  LayerPassSlots slots;
  slots.layers = buf_.weight_slots;
  slots.resident_layers = shape_.resident_layers;
  slots.head.assign(buf_.head_slots, buf_.head_slots + (buf_.lm_resident ? 0 : shape_.head_slots));
  slots.lm_resident = buf_.lm_resident;
  slots.final_norm = buf_.norm;
  slots.head_rows = shape_.head_rows;
  layer_pass_ = std::make_unique<LayerPass>(dev_, store_, slots, /*updates=*/true);
  layer_pass_->rope_upload(buf_.inv_freq);
  ws_ = LayerScratch{static_cast<char*>(buf_.workspace), nullptr, shape_.layer_capacity, true};
  if (lora_) {
    STRATA_ASSERT(lora_->layout().bytes == shape_.lora_bytes);
    dev_.copy_h2d(buf_.lora_weights, lora_->image(), shape_.lora_bytes, Stream::compute);
    dev_.memset_zero(buf_.lora_grads, shape_.lora_bytes, Stream::compute);
  }
  dev_.stream_synchronize(Stream::compute);

  // checkpoints: the last layers' inputs stay on the device while the budget allows
  device_ckpt_count_ = device_checkpoint_count();
  std::vector<EngineBuffer> ckpt = engine_checkpoint_table(shape_, device_ckpt_count_, &buf_);
  allocate(ckpt);
  for (EngineBuffer& b : ckpt) table_.push_back(std::move(b));
  keep_activations();
  keep_logits();

  if (shape_.checkpoints == CheckpointMode::nvme) {
    try {
      spill_ = std::make_unique<CheckpointSpill>(dev_, opt_.nvme_dir, opt_.nvme_budget_bytes, L_ * shape_.group,
                                                 shape_.activation_bytes(), buf_.ckpt_ring);
    } catch (...) {
      engine_buffers_free(dev_, table_);
      throw;
    }
  }
  create_events();
  objective_ = std::make_unique<TokenCrossEntropy>();
  if (!lora_) {  // LoRA: lora_optimizer_step
    auto adamw = std::make_unique<HostAdamW>(store_, store_.placement());
    adamw_ = adamw.get();
    optimizer_ = std::move(adamw);
  }
  reduction_ = std::make_unique<NoGradReduction>();
  set_speculated_groups(opt_.speculate_first_group, opt_.speculate_end_group);
}

void Engine::set_loss_objective(std::unique_ptr<LossObjective> objective) {
  STRATA_ASSERT(objective, "a null loss objective");
  synchronize();  // the old objective's queued work is done before it goes
  objective_ = std::move(objective);
}

// Allocates every row of `table` (engine_buffers_allocate); on failure the table's rows built
// before it are freed too.
void Engine::allocate(std::vector<EngineBuffer>& table) {
  try {
    engine_buffers_allocate(dev_, table);
  } catch (...) {
    if (&table != &table_) engine_buffers_free(dev_, table_);
    throw;
  }
}

// offload.recompute: the last kept_layers_ layers' forward activations stay in their own blocks
// until their backward (which then skips the recompute), from what the budget leaves after the
// checkpoints; every other layer uses ws_ alone.
void Engine::keep_activations() {
  const size_t kept = engine_kept_activation_layers(shape_, device_bytes_left());
  std::vector<EngineBuffer> rows = engine_kept_activation_table(shape_, kept, &buf_);
  // "never" asks for all of them, as checkpoints = "device" does: the whole budget, no margin (the plan's check)
  const size_t free = dev_.budget_bytes() - std::min(dev_.budget_bytes(), dev_.used_bytes());
  const bool fits = engine_device_bytes(rows) <= free;
  if (!fits) engine_buffers_free(dev_, table_);  // the constructor fails: nothing it allocated stays
  STRATA_CHECK_BUDGET(fits, "offload.recompute = \"never\" keeps every layer's activations on the device: ",
                      format_bytes(engine_device_bytes(rows)), ", more than the ", format_bytes(free),
                      " the budget leaves; raise [device] memory, or set offload.recompute = \"auto\" (keep what fits)");
  allocate(rows);
  for (EngineBuffer& b : rows) table_.push_back(std::move(b));
  kept_layers_ = kept;
  kept_ws_.assign(L_, ws_);
  const size_t per_layer = layer_kinds_bytes(shape_.layer_kinds, LayerBuffer::activations, shape_.layer_capacity);
  for (size_t k = 0; k < kept; ++k) kept_ws_[L_ - kept + k].activations = buf_.kept_activations + k * per_layer;
}

// offload.recompute, the head: the last kept_chunks_ lm_head chunks keep their logits from the
// stats pass to the backward, from what the budget leaves after the kept activations.
void Engine::keep_logits() {
  const size_t kept = engine_kept_logit_chunks(shape_, device_bytes_left());
  std::vector<EngineBuffer> rows = engine_kept_logits_table(shape_, kept, &buf_);
  allocate(rows);
  for (EngineBuffer& b : rows) table_.push_back(std::move(b));
  kept_chunks_ = kept;
}

float* Engine::kept_logits(size_t chunk, size_t m) const {
  const size_t first = shape_.head_chunks - kept_chunks_;
  if (!backward_pass_ || chunk < first) return nullptr;
  return buf_.kept_logits + ((chunk - first) * shape_.group + m) * engine_kept_logit_floats(shape_);
}

// What the budget leaves for checkpoints and kept activations and logits: the margin, and what
// the backend will still take at its first GEMM and lm_head loss, stay free.
size_t Engine::device_bytes_left() const {
  const size_t used = dev_.used_bytes() + (1 << 20) +  // the margin: placement_plan.cpp's kDeviceMargin
                      dev_.pending_workspace_bytes(Stream::compute) +
                      dev_.pending_lm_head_ce_workspace_bytes(shape_.C, shape_.head_rows);
  return dev_.budget_bytes() > used ? dev_.budget_bytes() - used : 0;
}

size_t Engine::device_checkpoint_count() const {
  switch (shape_.checkpoints) {
    case CheckpointMode::device: return L_;
    case CheckpointMode::host:
    case CheckpointMode::nvme: return 0;
    case CheckpointMode::automatic: break;
  }
  return std::min(L_, device_bytes_left() / (shape_.group * Arena::footprint(shape_.activation_bytes())));
}

void Engine::create_events() {
  for (size_t k = 0; k < 2 * shape_.group; ++k) {
    ev_.pp_saved.push_back(dev_.event_create());
    ev_.ckpt_fetched.push_back(dev_.event_create());
    ev_.stage_free.push_back(dev_.event_create());
  }
  for (int b = 0; b < 2; ++b) ev_.head_grad_copied[b] = std::shared_ptr<Event>(dev_.event_create());
  ev_.compute_done = dev_.event_create();
  ev_.loss_copied = dev_.event_create();
  for (size_t i = 0; i < L_; ++i) ev_.grad_copied.push_back(std::shared_ptr<Event>(dev_.event_create()));
  ev_.norm_grad_copied = std::shared_ptr<Event>(dev_.event_create());
  ev_.dx0_copied = std::shared_ptr<Event>(dev_.event_create());
  ev_.lora_grad_copied = std::shared_ptr<Event>(dev_.event_create());
}

Engine::~Engine() {
  try {
    synchronize();
  } catch (...) {  // an error already reported by the caller's path; still free everything
  }
  spill_.reset();  // before its ring buffers
  engine_buffers_free(dev_, table_);
}

// ---- weights ---------------------------------------------------------------------------

namespace {

// Global-norm clipping's factor on the gradient (torch's clip_grad_norm_: max / (norm + 1e-6)
// when the norm exceeds max; 1 without clipping).
double clip_scale_for(double norm, double max_grad_norm) {
  return max_grad_norm > 0 && norm > max_grad_norm ? max_grad_norm / (norm + 1e-6) : 1.0;
}

// A layer's adapters inside the adapter arena `base` (the weights or their gradients): A, then
// B in the next row (offload/state/lora.h).
template <class Linear>
void lora_view(const LoraLayout& l, size_t layer, float* base, Linear (&out)[kLayerLinears]) {
  for (int t = 0; t < kLayerLinears; ++t) {
    const int64_t a = l.a_row[layer][size_t(t)];
    if (a != kAbsent) {
      out[t].a = base + l.table[size_t(a)].offset / 4;
      out[t].b = base + l.table[size_t(a) + 1].offset / 4;
    }
  }
}

}  // namespace

// Layer `layer`'s weights in `slot` (LayerPass::acquire_layer), with the LoRA adapters' views.
LayerTensors Engine::layer_weights_at(size_t layer, const char* slot) const {
  LayerTensors w = layer_weights_in(store_, slot, layer);
  if (lora_) {
    lora_view(lora_->layout(), layer, buf_.lora_weights, w.lora);
    for (int t = 0; t < kLayerLinears; ++t)  // the masks' keys; each micro-batch's seed: for_micro_batch
      if (w.lora[t].a && lora_dropout_.p > 0)
        w.lora[t] = {w.lora[t].a, w.lora[t].b, lora_dropout_.p, 0, lora_dropout_tensor(layer, t)};
  }
  return w;
}

// A layer's weights as micro-batch m of the pass sees them: LoRA dropout draws its masks from
// m's seed (a layer-major pass runs several micro-batches, each with its own masks).
LayerTensors Engine::for_micro_batch(const LayerTensors& w, size_t m) const {
  LayerTensors x = w;
  if (lora_dropout_.p > 0)
    for (LoraLinear& l : x.lora)
      if (l.a) l.dropout_seed = lora_dropout_.seeds[m];
  return x;
}

// LoRA: no base gradient; the norms' gradients (the kernels always add them) go to scratch.
LayerGradTensors Engine::frozen_grads_at(size_t layer) const {
  const ModelLayer& l = store_.spec().layers[layer];
  LayerGradTensors g;
  for (size_t p = 0; p < l.params.size(); ++p)
    g.param.push_back(l.params[p].always_grad && l.rows[p] != kAbsent ? buf_.norm_grad : nullptr);
  lora_view(lora_->layout(), layer, buf_.lora_mb_grads, g.lora);
  return g;
}

// ---- one pass: tokens, forward ------------------------------------------------------------

double Engine::step(const MicroBatch& mb, StepKind kind, float grad_scale) {
  return run_pass(&mb, 1, kind, grad_scale).front();
}

std::vector<double> Engine::forward_backward_group(const std::vector<MicroBatch>& mbs, float grad_scale) {
  return run_pass(mbs.data(), mbs.size(), StepKind::forward_backward, grad_scale);
}

// One pass over `g` micro-batches, layer-major (top of this file): each layer (and lm_head chunk) runs
// every micro-batch while its weights are on the device. g = 1 is the micro_batch schedule.
std::vector<double> Engine::run_pass(const MicroBatch* mbs, size_t g, StepKind kind, float grad_scale,
                                     const LandedUpdate* landed) {
  STRATA_CHECK(g >= 1 && g <= shape_.group, "a pass of ", g, " micro-batches on an engine built for ", shape_.group,
               " (offload.accumulation = \"layer_major\" sizes it for gradient_accumulation_steps)");
  lora_dropout_.p = 0;
  lora_dropout_.seeds.clear();
  if (lora_ && kind == StepKind::forward_backward && opt_.lora.dropout > 0) {  // this pass's masks
    lora_dropout_.p = opt_.lora.dropout;
    for (size_t m = 0; m < g; ++m, lora_dropout_.next += lora_dropout_.stride)
      lora_dropout_.seeds.push_back(lora_dropout_seed(opt_.lora.seed, lora_dropout_.step, lora_dropout_.next));
  }
  if (kind == StepKind::forward_backward) {  // the gradients change: a gathered norm is stale
    STRATA_ASSERT(!speculation_pending(), "a pass ran between a speculated step's last pass and its optimizer_step");
    group_sq_gathered_ = false;
    if (landed) {
      landed_ = *landed;
      group_sq_.assign(store_.groups().size(), 0.0);
    }
  }
  upload_tokens(mbs, g);
  // the aux loss enters the micro-batch's loss as counted x coef x aux (its mean per token is
  // transformers' loss + coef x aux), so its gradient runs at grad_scale x counted
  for (auto& p : pass_)
    if (p.aux) p.aux->grad_scale = double(grad_scale) * double(p.counted);
  spill_pass_ = spill_ && kind == StepKind::forward_backward;
  backward_pass_ = kind == StepKind::forward_backward;
  forward();
  head_forward();
  fault_point("step");  // STRATA_FAULT=kill@step: mid-step, the forward queued, the backward not
  if (kind == StepKind::forward_backward) {
    head_backward(grad_scale);
    final_norm_backward();
    backward();
  }
  return finish_step(kind);
}

void Engine::upload_tokens(const MicroBatch* mbs, size_t g) {
  const size_t n = size_t(shape_.tokens);
  for (size_t m = 0; m < g; ++m)
    engine_tokens_upload(dev_, shape_, mbs[m],
                         {buf_.ids + m * n, buf_.targets + m * n, buf_.pos + m * n, buf_.doc_start + m * n});
  // The previous pass's scatters still read pass_[m].ids and dx0_host: wait for them (and,
  // the queue being in order, every gradient task before them), but not for the optimizer
  // updates queued after them, which the forward follows group by group (LayerPass::wait_group).
  if (scatter_ticket_) exposed_wait(&d2h_wait_s_, [&] { layer_pass_->host().wait(scatter_ticket_); });
  scatter_ticket_ = 0;
  pass_.resize(g);
  for (size_t m = 0; m < g; ++m) {
    pass_[m].dims = shape_.layer_capacity;
    pass_[m].dims.B = mbs[m].B;
    pass_[m].dims.T = mbs[m].T;
    pass_[m].dims.max_pos = layer_dims_max_pos(mbs[m].pos);
    pass_[m].has_docs = !mbs[m].doc_start.empty();
    pass_[m].ids = mbs[m].ids;
    pass_[m].counted = mbs[m].counted();
    const ModelConfig& cfg = store_.spec().config;
    pass_[m].aux.reset();
    // the load-balancing loss joins the token cross-entropy (SFT, pretraining); the preference
    // objectives' per-sequence losses run without it
    const bool token_ce = dynamic_cast<const TokenCrossEntropy*>(objective_.get()) != nullptr;
    const bool aux = opt_.router_aux_loss < 0 ? cfg.output_router_logits : opt_.router_aux_loss != 0;
    if (aux && token_ce && cfg.num_experts > 0) pass_[m].aux.emplace(cfg.num_experts, cfg.router_aux_loss_coef);
    reduction_->begin_micro_batch(pass_[m].ids.data(), int64_t(pass_[m].ids.size()));
  }
}

TokenContext Engine::token_context(size_t m) const {
  const size_t n = size_t(shape_.tokens);
  return {buf_.pos + m * n, pass_[m].has_docs ? buf_.doc_start + m * n : nullptr, buf_.inv_freq,
          pass_[m].aux ? &*pass_[m].aux : nullptr};
}

HeadTensors Engine::head_tensors(size_t m) const {
  const LayerDims& d = pass_[m].dims;
  return {act(buf_.hn, m), buf_.targets + m * size_t(shape_.tokens), ce_stats(m), d.N(), d.C, shape_.V, m};
}

// Where the input of `layer` for micro-batch m lives on the device.
float* Engine::ckpt_device(size_t layer, size_t m) {
  const size_t first_dev = L_ - device_ckpt_count_;
  if (layer >= first_dev) return buf_.ckpt_dev + ((layer - first_dev) * pass_.size() + m) * act_floats();
  return act(buf_.x_pp[layer % 2], m);
}

// The embedding on the host: rows of the working table gathered into x0 (exact conversion to
// f32), uploaded as layer 0's input, for each micro-batch of the pass.
void Engine::embed_forward() {
  for (size_t m = 0; m < pass_.size(); ++m) {
    const int64_t N = pass_[m].dims.N(), C = shape_.C;
    float* x0 = act(buf_.x0_host, m);
    layer_pass_->embed_gather(x0, pass_[m].ids.data(), N);
    dev_.stream_wait_event(Stream::compute, *pp_saved(0, m));
    dev_.copy_h2d(ckpt_device(0, m), x0, bytes_of<float>(N * C), Stream::compute);
  }
}

// Layer by layer; within a layer the micro-batches run last to first, so that the checkpoint
// order (layer, then micro-batch g-1..0) is exactly the reverse of the backward's (layer L-1..0,
// then micro-batch 0..g-1): the NVMe spill reads back in reverse of what it wrote (spill_index).
void Engine::forward() {
  const Stream s = Stream::compute;
  embed_forward();
  const size_t first_dev = L_ - device_ckpt_count_;
  layer_pass_->for_each_layer(false, [&](size_t i, const char* slot) {
    const LayerTensors w = layer_weights_at(i, slot);
    for (size_t r = 0; r < pass_.size(); ++r) {
      const size_t m = pass_.size() - 1 - r;
      float* out = i + 1 < L_ ? ckpt_device(i + 1, m) : act(buf_.x_final, m);
      const bool out_spills = i + 1 < L_ && i + 1 < first_dev;
      if (out_spills) dev_.stream_wait_event(s, *pp_saved(i + 1, m));  // its last d2h is done
      layer_kind(store_, i).forward(dev_, out, ckpt_device(i, m), for_micro_batch(w, m), token_context(m), kept_ws_[i], pass_[m].dims, s);  // ws_, or the layer's kept activations
      if (out_spills) spill_checkpoint(i + 1, m, out);
    }
  });
  for (size_t m = 0; m < pass_.size(); ++m)
    dev_.rmsnorm_forward(act(buf_.hn, m), buf_.rstd_final + m * size_t(shape_.tokens), act(buf_.x_final, m),
                         layer_pass_->acquire_final_norm(), pass_[m].dims.N(), shape_.C, pass_[m].dims.eps, s);
}

// The input of `layer` for micro-batch m, just computed into `out`, also goes to the host for
// the backward (or to its file).
void Engine::spill_checkpoint(size_t layer, size_t m, const float* out) {
  const Stream s = Stream::compute;
  const size_t act_bytes = bytes_of<float>(pass_[m].dims.N() * shape_.C);
  if (!spill_) {
    dev_.event_record(*ev_.compute_done, s);
    dev_.stream_wait_event(Stream::d2h, *ev_.compute_done);
    dev_.copy_d2h(buf_.ckpt_host + (layer * pass_.size() + m) * act_floats(), out, act_bytes, Stream::d2h);
    dev_.event_record(*pp_saved(layer, m), Stream::d2h);
  } else if (spill_pass_ && spilled_to_nvme(layer)) {
    const size_t j = spill_index(layer, m);
    float* ring = nullptr;
    exposed_wait(&nvme_exposed_s_, [&] { ring = spill_->buffer_for_write(j); });
    dev_.event_record(*ev_.compute_done, s);
    dev_.stream_wait_event(Stream::d2h, *ev_.compute_done);
    dev_.stream_wait_event(Stream::d2h, spill_->consumed(j));  // the backward's copy out of it
    dev_.copy_d2h(ring, out, act_bytes, Stream::d2h);
    dev_.event_record(spill_->copied(j), Stream::d2h);
    dev_.event_record(*pp_saved(layer, m), Stream::d2h);
    spill_->write(j, act_bytes);
  }
}

// ---- one pass: the loss head (engine.h) ------------------------------------------------------

// Forward: online-softmax statistics per token over chunks 0..K-1 (each chunk on the device once
// for every micro-batch of the pass), then the objective's loss per micro-batch.
void Engine::head_forward() {
  const Stream s = Stream::compute;
  const DType lm_type = store_.working_table()[size_t(store_.spec().lm_head_row())].dtype;
  layer_pass_->for_each_head_chunk(false, [&](size_t k, int64_t v0, int64_t vc, const char* w) {
    for (size_t m = 0; m < pass_.size(); ++m) {
      const HeadTensors h = head_tensors(m);
      objective_->chunk_stats(ce_stats(m), h, w, lm_type, v0, vc, k == 0, kept_logits(k, m), dev_, s);
    }
  });
  dev_.memset_zero(buf_.loss, pass_.size() * sizeof(double), s);
  for (size_t m = 0; m < pass_.size(); ++m) objective_->loss(buf_.loss + m, head_tensors(m), dev_, s);
}

// Micro-batch m's share of a gradient whose pass total goes to `total` (device, `bytes`): the
// buffer it is computed into, zeroed. m = 0 computes into `total` itself, later micro-batches
// into `share`, which grad_share_add then adds: total = ((d0 + d1) + d2) + ..., in micro-batch
// order. That is exactly the sum the host accumulation forms in the micro_batch schedule
// (0 + d0, + d1, + d2, ...: 0 + d0 = d0 bit for bit, -0 aside, which the host's 0 + -0 folds the
// same way in both schedules), so the one host add of the total per step gives the same bits.
void* Engine::grad_share(size_t m, void* total, void* share, size_t bytes) {
  void* dst = m == 0 || !share ? total : share;
  dev_.memset_zero(dst, bytes, Stream::compute);
  return dst;
}

void Engine::grad_share_add(void* total, const void* computed_in, size_t bytes) {
  if (computed_in != total)
    dev_.add_inplace(static_cast<float*>(total), static_cast<const float*>(computed_in), int64_t(bytes / 4), Stream::compute);
}

// Backward: chunks K-1..0 again, each adding its share into d(hidden) of each micro-batch and
// sending the pass's dW chunk to the host, where it is added into its rows of the lm_head (or
// embedding) gradient.
void Engine::head_backward(float grad_scale) {
  const Stream s = Stream::compute;
  const int64_t C = shape_.C;
  const DType lm_type = store_.working_table()[size_t(store_.spec().lm_head_row())].dtype;
  dev_.memset_zero(buf_.dhn, pass_.size() * act_floats() * sizeof(float), s);
  // gradients in flight share one slot: each group must be updated as it lands, before the next
  STRATA_ASSERT(lora_ || !store_.options().grads_in_flight ||
                    (landed_.active && (landed_.update || landed_.drop) && !landed_.speculate),
                "a backward that lands gradients without updating each group as it lands, on a store whose "
                "gradients are in flight (HostStoreOptions::grads_in_flight)");
  float* lm_grad = lora_ ? nullptr : store_.grad_of(size_t(store_.spec().lm_head_row()));  // (V, C) host accumulation
  layer_pass_->for_each_head_chunk(true, [&](size_t k, int64_t v0, int64_t vc, const char* w) {
    const size_t b = (shape_.head_chunks - 1 - k) % shape_.head_slots;  // the step-th chunk of the walk: slot step % 2
    const size_t chunk_bytes = bytes_of<float>(vc * C);
    if (lora_) {  // frozen lm_head: d(hidden) only, no weight-gradient matmul
      for (size_t m = 0; m < pass_.size(); ++m)
        objective_->chunk_backward(act(buf_.dhn, m), nullptr, head_tensors(m), w, lm_type, v0, vc, grad_scale,
                                   kept_logits(k, m), dev_, s);
      return;
    }
    dev_.stream_wait_event(s, *ev_.head_grad_copied[b]);  // the slot's previous chunk has left
    for (size_t m = 0; m < pass_.size(); ++m) {
      void* dw = grad_share(m, buf_.head_grad_slots[b], buf_.head_grad_scratch, chunk_bytes);
      objective_->chunk_backward(act(buf_.dhn, m), static_cast<float*>(dw), head_tensors(m), w, lm_type, v0, vc,
                                 grad_scale, kept_logits(k, m), dev_, s);
      grad_share_add(buf_.head_grad_slots[b], dw, chunk_bytes);
    }
    float* staging = buf_.head_grad_staging[b];
    GradReduction* red = reduction_.get();
    head_staging_ticket_[b] = stage_to_host({GradLanding::head_chunk, v0, vc, C}, staging, buf_.head_grad_slots[b],
                                            chunk_bytes, ev_.head_grad_copied[b],
                                            head_staging_ticket_[b], [red, lm_grad, staging, v0, vc, C] {
                                              red->add_head_rows(lm_grad, staging, v0, vc, C);
                                            });
  });
}

// The final norm's backward; d(last layer output) of micro-batch m goes to dx[m], the norm's
// gradient to the host.
void Engine::final_norm_backward() {
  const Stream s = Stream::compute;
  const int64_t C = shape_.C;
  dev_.stream_wait_event(s, *ev_.norm_grad_copied);
  for (size_t m = 0; m < pass_.size(); ++m) {
    void* dnorm = grad_share(m, buf_.norm_grad, lora_ ? nullptr : buf_.norm_grad_scratch, bytes_of<float>(C));
    dev_.rmsnorm_backward(buf_.dx[m], static_cast<float*>(dnorm), act(buf_.dhn, m), act(buf_.x_final, m), buf_.norm,
                          buf_.rstd_final + m * size_t(shape_.tokens), pass_[m].dims.N(), C, s);
    grad_share_add(buf_.norm_grad, dnorm, bytes_of<float>(C));
  }
  if (lora_) return;  // frozen: the norm's gradient is discarded
  float* dst = store_.grad_of(size_t(store_.spec().final_norm));
  float* staging = buf_.norm_grad_staging;
  GradReduction* red = reduction_.get();
  stage_to_host({}, staging, buf_.norm_grad, bytes_of<float>(C), ev_.norm_grad_copied, 0,
                [red, dst, staging, C] { red->add_dense(dst, staging, size_t(C)); });
  update_group_when_landed(store_.groups().size() - 1);  // final norm (and an untied lm_head)
}

// ---- one pass: backward ------------------------------------------------------------------------

// Brings layer i's spilled checkpoint of micro-batch m back into x_pp[i % 2], except for the
// last two layers: the forward's last writes into the ping-pong buffers were exactly their
// inputs, still there (fetching them again would also overwrite a buffer the forward may still
// be reading).
void Engine::fetch_checkpoint(size_t i, size_t m) {
  if (i >= L_ - device_ckpt_count_ || i + 2 >= L_) return;
  const size_t N = size_t(pass_[m].dims.N());
  const size_t bytes = bytes_of<float>(int64_t(N) * shape_.C);
  const float* src = i == 0 ? act(buf_.x0_host, m) : buf_.ckpt_host + (i * pass_.size() + m) * act_floats();
  const size_t j = spill_index(i, m);
  if (spilled_to_nvme(i)) exposed_wait(&nvme_exposed_s_, [&] { src = spill_->wait_read(j); });
  dev_.stream_wait_event(Stream::h2d, *stage_free(i, m));
  dev_.stream_wait_event(Stream::h2d, *pp_saved(i, m));
  dev_.copy_h2d(ckpt_device(i, m), src, bytes, Stream::h2d);
  dev_.event_record(*ckpt_fetched(i, m), Stream::h2d);
  dev_.stream_wait_event(Stream::compute, *ckpt_fetched(i, m));
  if (spilled_to_nvme(i)) {
    dev_.event_record(spill_->consumed(j), Stream::h2d);
    if (j >= pass_.size() + kSpillRing) spill_read_ahead(j - kSpillRing);  // into the buffer just emptied
  }
}

// With checkpoints = "nvme", the layers whose input fetch_checkpoint reads back: 1 .. L-3
// (layer 0's input stays in x0_host, the last two stay in the ping-pong buffers).
bool Engine::spilled_to_nvme(size_t layer) const { return spill_ && layer >= 1 && layer + 2 < L_; }

// A checkpoint's place in the spill file: (layer, micro-batch g-1..0) in the forward's order, so
// the backward (layer L-1..0, micro-batch 0..g-1) reads them in descending order.
size_t Engine::spill_index(size_t layer, size_t m) const { return layer * pass_.size() + (pass_.size() - 1 - m); }

void Engine::spill_read_ahead(size_t j) {
  const size_t m = pass_.size() - 1 - j % pass_.size();
  spill_->read_ahead(j, bytes_of<float>(pass_[m].dims.N() * shape_.C));
}

void Engine::backward() {
  std::vector<float*> dout(buf_.dx.begin(), buf_.dx.begin() + long(pass_.size()));  // d(layer output) per micro-batch
  float* dx = buf_.dx[pass_.size()];
  std::vector<bool> copied_this_step(L_, false);
  if (lora_) {  // this micro-batch's adapter gradients, from zero (lora_grads_land adds them)
    dev_.stream_wait_event(Stream::compute, *ev_.lora_grad_copied);
    dev_.memset_zero(buf_.lora_mb_grads, shape_.lora_bytes, Stream::compute);
  }
  if (spill_ && L_ >= 3)  // the first kSpillRing checkpoints the backward needs, read ahead
    for (size_t r = 0; r < kSpillRing && r < (L_ - 3) * pass_.size(); ++r) spill_read_ahead((L_ - 2) * pass_.size() - 1 - r);
  layer_pass_->for_each_layer(true, [&](size_t i, const char* slot) {
    const LayerTensors w = layer_weights_at(i, slot);
    char* g = buf_.grad_slots[i % 2];
    if (!lora_ && i + 2 < L_ && copied_this_step[i + 2]) dev_.stream_wait_event(Stream::compute, *ev_.grad_copied[i + 2]);
    for (size_t m = 0; m < pass_.size(); ++m) layer_backward_one(i, m, w, g, dout[m], dx), std::swap(dout[m], dx);
    if (!lora_) {  // LoRA: the adapters' gradients stay on the device until the optimizer step
      layer_grad_to_host(i, g);
      copied_this_step[i] = true;
      update_group_when_landed(1 + i);
    }
  });
  if (lora_) lora_grads_land();
  else embed_backward(dout);  // LoRA: the embedding is frozen; d x0 is not needed
}

// LoRA: the micro-batch's adapter gradients g join the step's G in micro-batch order, one
// elementwise G + g: on the device (one process; G crosses the link once per step), or data
// parallel through the gradient reduction on the host (G there; grad_reduction.h: the ranks' g
// summed in the single-process order, so N ranks equal one process accumulating their
// micro-batches, bit for bit over host buffers).
void Engine::lora_grads_land() {
  const size_t n = lora_->layout().floats();
  if (!lora_host_accumulation_) {
    dev_.add_inplace(buf_.lora_grads, buf_.lora_mb_grads, int64_t(n), Stream::compute);
    return;
  }
  GradReduction* red = reduction_.get();
  float* dst = lora_->grad();
  float* staging = buf_.lora_grad_staging;
  lora_staging_ticket_ = stage_to_host({}, staging, buf_.lora_mb_grads, shape_.lora_bytes, ev_.lora_grad_copied,
                                       lora_staging_ticket_, [red, dst, staging, n] { red->add_dense(dst, staging, n); });
}

// Layer i's backward for micro-batch m: its share of dW into the layer's gradient slot `g`
// (grad_share), d(layer input) into dx.
void Engine::layer_backward_one(size_t i, size_t m, const LayerTensors& layer_w, char* g, const float* dout, float* dx) {
  fetch_checkpoint(i, m);
  const LayerTensors w = for_micro_batch(layer_w, m);
  LayerGradTensors lg;
  void* dw = nullptr;
  const size_t bytes = lora_ ? 0 : store_.layer_group(i).f32_bytes;
  if (lora_) lg = frozen_grads_at(i);
  else lg = layer_grads_in(store_, static_cast<char*>(dw = grad_share(m, g, buf_.grad_scratch, bytes)), i);
  if (i + kept_layers_ >= L_)  // its forward's activations were kept: no recompute
    layer_kind(store_, i).backward_saved(dev_, dx, lg, dout, ckpt_device(i, m), w, token_context(m), kept_ws_[i],
                                         pass_[m].dims, Stream::compute);
  else
    layer_kind(store_, i).backward(dev_, dx, lg, dout, ckpt_device(i, m), w, token_context(m), ws_, pass_[m].dims, Stream::compute);
  dev_.event_record(*stage_free(i, m), Stream::compute);
  if (!lora_) grad_share_add(g, dw, bytes);
}

// Layer i's gradient: device slot -> pinned staging -> added into the host accumulation, in
// layer order.
void Engine::layer_grad_to_host(size_t i, char* grad_slot) {
  const size_t b = i % 2;
  const ParamGroup& grp = store_.layer_group(i);
  float* staging = buf_.grad_staging[b];
  float* dst = store_.group_grad(1 + i);
  const size_t count = count_of<float>(grp.f32_bytes);
  staging_ticket_[b] = stage_to_host({}, staging, grad_slot, grp.f32_bytes, ev_.grad_copied[i], staging_ticket_[b],
                                     [red = reduction_.get(), dst, staging, count] { red->add_dense(dst, staging, count); });
}

// The embedding's backward on the host: each micro-batch's d x0 (in dx0[m]) is staged out and
// scatter-added into the table's gradient, micro-batch by micro-batch, in token order.
void Engine::embed_backward(const std::vector<float*>& dx0) {
  const int64_t C = shape_.C;
  float* dtable = store_.grad_of(size_t(store_.spec().embed));
  for (size_t m = 0; m < pass_.size(); ++m) {
    const int64_t N = pass_[m].dims.N();
    float* host = act(buf_.dx0_host, m);
    const int32_t* ids = pass_[m].ids.data();
    scatter_ticket_ = stage_to_host({GradLanding::embedding, 0, N, C}, host, dx0[m], bytes_of<float>(N * C),
                                    ev_.dx0_copied, 0,
                                    [this, dtable, host, ids, N, C] { reduction_->add_embedding(dtable, host, ids, N, C); });
  }
  update_group_when_landed(0);  // the embedding (and a tied lm_head)
}

// The losses back to the host; after a backward also every copy the host tasks wait for.
std::vector<double> Engine::finish_step(StepKind kind) {
  std::vector<double> losses(pass_.size());
  dev_.copy_d2h(losses.data(), buf_.loss, losses.size() * sizeof(double), Stream::compute);
  // the load-balancing loss, summed over the micro-batch's counted tokens like the cross-entropy
  const auto add_aux = [&] {
    for (size_t m = 0; m < pass_.size(); ++m)
      if (pass_[m].aux) losses[m] += double(pass_[m].counted) * pass_[m].aux->loss();
  };
  if (kind == StepKind::forward_only) {
    dev_.stream_synchronize(Stream::compute);
    add_aux();
    return losses;
  }
  dev_.event_record(*ev_.loss_copied, Stream::compute);
  exposed_wait(&d2h_wait_s_, [&] {
    dev_.event_synchronize(*ev_.loss_copied);
    dev_.stream_synchronize(Stream::compute);  // surfaces a kernel's error here
    if (!lora_) dev_.event_synchronize(*ev_.dx0_copied);
  });
  add_aux();
  return losses;
}

// ---- staging ---------------------------------------------------------------------------------

// `bytes` of device memory `src` (the gradient `landing`), just written on the compute stream, go
// to pinned `staging` on the d2h stream, after what the reduction queues there for it (a device
// all-reduce: grad_reduction.h on_device); `copied` is recorded after the copy, and `task` runs
// on the host queue once it has landed. `reuse` (0: none) is the ticket of the host task that
// last read `staging`: the copy waits for it. Returns the ticket of `task`.
uint64_t Engine::stage_to_host(const GradLanding& landing, void* staging, void* src, size_t bytes,
                               const std::shared_ptr<Event>& copied, uint64_t reuse, std::function<void()> task) {
  dev_.event_record(*ev_.compute_done, Stream::compute);
  if (reuse) exposed_wait(&d2h_wait_s_, [&] { layer_pass_->host().wait(reuse); });
  dev_.stream_wait_event(Stream::d2h, *ev_.compute_done);
  CommTicket reduced = reduction_->on_device(landing, static_cast<float*>(src), bytes / sizeof(float), Stream::d2h);
  dev_.copy_d2h(staging, src, bytes, Stream::d2h);
  dev_.event_record(*copied, Stream::d2h);
  // the waits for the collective and the copy are the task's input, not host work (HostQueue::busy_s)
  return layer_pass_->host().enqueue([this, copied, reduced]() mutable {
    reduced.wait();
    dev_.event_synchronize(*copied);
  }, std::move(task));
}

// ---- optimizer -------------------------------------------------------------------------------

void Engine::set_grad_reduction(std::unique_ptr<GradReduction> reduction) {
  STRATA_CHECK(shape_.group == 1, "offload.accumulation = \"layer_major\" runs on one rank in this version (data "
               "parallel all-reduces each micro-batch's gradient): set offload.accumulation = \"micro_batch\" or \"auto\"");
  synchronize();
  reduction_ = std::move(reduction);
  lora_host_accumulation_ = lora_ != nullptr;  // data parallel: the adapters' G on the host
  spec_.allowed = false;  // a rank's landing is not the all-reduced gradient's
}

void Engine::zero_grads() {
  layer_pass_->host().drain();
  if (lora_) {
    dev_.memset_zero(buf_.lora_grads, shape_.lora_bytes, Stream::compute);
    dev_.stream_synchronize(Stream::compute);
    std::memset(lora_->grad(), 0, shape_.lora_bytes);
    return;
  }
  STRATA_ASSERT(!speculation_pending(), "gradients zeroed between a speculated step's last pass and its optimizer_step");
  std::memset(store_.grad(), 0, bytes_of<float>(int64_t(store_.grad_floats())));
  group_sq_gathered_ = false;
}

void Engine::lora_upload() {
  STRATA_ASSERT(lora_, "lora_upload outside LoRA mode");
  synchronize();
  dev_.copy_h2d(buf_.lora_weights, lora_->image(), shape_.lora_bytes, Stream::compute);
  dev_.stream_synchronize(Stream::compute);
}

void Engine::lora_dropout_begin_step(int64_t step, int64_t first, int64_t stride) {
  STRATA_ASSERT(step >= 0 && first >= 0 && stride >= 1);
  lora_dropout_.step = step;
  lora_dropout_.next = first;
  lora_dropout_.stride = stride;
}

void Engine::lora_collect_grads() {
  STRATA_ASSERT(lora_, "lora_collect_grads outside LoRA mode");
  if (lora_host_accumulation_) {  // the reduction's additions into lora.grad() have landed
    exposed_wait(&d2h_wait_s_, [&] { layer_pass_->host().drain(); });
  } else {
    dev_.copy_d2h(lora_->grad(), buf_.lora_grads, shape_.lora_bytes, Stream::compute);
    dev_.memset_zero(buf_.lora_grads, shape_.lora_bytes, Stream::compute);
    dev_.stream_synchronize(Stream::compute);
  }
  lora_->unscale_b();
}

// LoRA: the adapters' gradients cross the link once per step, AdamW runs over them on the host,
// and the new adapters (B scaled) go back; the compute stream orders it before the next forward.
double Engine::lora_optimizer_step(AdamWParams params, double max_grad_norm, double weight_decay) {
  double norm = 0;
  layer_pass_->optimizer_wait([&] {
    lora_collect_grads();
    norm = std::sqrt(sum_of_squares(lora_->grad(), int64_t(lora_->layout().floats())));
  });
  STRATA_CHECK(std::isfinite(norm), "the gradient norm is not finite (", norm,
               "); lower optim.learning_rate or check the data");
  params.clip_scale = clip_scale_for(norm, max_grad_norm);
  layer_pass_->optimizer_wait([&] { lora_->adamw(params, weight_decay); });
  dev_.copy_h2d(buf_.lora_weights, lora_->image(), shape_.lora_bytes, Stream::compute);
  return norm;
}

double Engine::optimizer_step(AdamWParams params, double max_grad_norm, double weight_decay) {
  if (lora_) return lora_optimizer_step(params, max_grad_norm, weight_decay);
  exposed_wait(&d2h_wait_s_, [&] { layer_pass_->host().drain(); });  // every gradient has landed (and its square)
  const bool shared = reduction_->shared_store();     // the ranks of a node share store_
  if (shared) reduction_->all_ranks_here();           // ... and every rank's gradient is in
  if (!group_sq_gathered_ || shared)                  // (a rank's own pass saw only its share)
    layer_pass_->optimizer_wait([&] {
      group_sq_.assign(store_.groups().size(), 0.0);
      for (size_t gi = 0; gi < group_sq_.size(); ++gi) group_sq_[gi] = group_sum_of_squares(gi);
    });
  group_sq_gathered_ = false;
  if (shared) reduction_->all_ranks_here();           // no rank zeroes a gradient another still reads
  const double norm = global_norm();
  params.clip_scale = clip_scale_for(norm, max_grad_norm);
  begin_optimizer_pass(false);
  for (size_t gi = 0; gi < store_.groups().size(); ++gi) {
    if (!reduction_->updates_group(gi)) continue;
    if (spec_.pending.size() > gi && spec_.pending[gi]) optimizer_queue_speculated(gi, params, weight_decay);
    else layer_pass_->queue_update(gi, [this, gi, params, weight_decay] { optimizer_->update(gi, params, weight_decay); });
  }
  layer_pass_->mark_stale();
  if (shared) {  // every group updated (by its rank) before any rank uploads weights again
    layer_pass_->optimizer_wait([&] { layer_pass_->host().drain(); });
    layer_pass_->forget_updates();
    reduction_->all_ranks_here();
  }
  return norm;
}

// The placement learns the order of the updates about to be queued (NVMe reads ahead in it):
// groups 0..G-1 after backward, G-1..0 as gradients land (head, layers L-1..0, embedding).
void Engine::begin_optimizer_pass(bool landed) {
  std::vector<size_t> order(store_.groups().size());
  for (size_t g = 0; g < order.size(); ++g) order[g] = landed ? order.size() - 1 - g : g;
  layer_pass_->host().enqueue([this, order] { store_.placement().begin_pass(order); });
}

double Engine::group_sum_of_squares(size_t gi) const {
  const ParamGroup& g = store_.groups()[gi];
  return sum_of_squares(store_.group_grad(gi), int64_t(count_of<float>(g.f32_bytes)));
}

// Queued on the host right behind the last addition into group gi's gradient of the pass.
void Engine::update_group_when_landed(size_t gi) {
  if (!landed_.active) return;
  if (!landed_.update && landed_.speculate && spec_.offset[gi] != SIZE_MAX) {  // the square, and the update ahead
    const AdamWParams params = landed_.params;
    const double wd = landed_.weight_decay;
    char* backup = spec_.backup.get() + spec_.offset[gi];
    spec_.pending[gi] = 1;
    ++spec_.updates;
    layer_pass_->queue_update(gi, [this, gi, params, wd, backup] {
      group_sq_[gi] = group_sum_of_squares(gi);
      adamw_->speculate(gi, params, wd, backup);
    });
    return;
  }
  if (!landed_.update && landed_.drop) {  // a norm pass: the square, and the gradient's room free again
    layer_pass_->queue_update(gi, [this, gi] {
      group_sq_[gi] = group_sum_of_squares(gi);
      std::memset(store_.group_grad(gi), 0, store_.groups()[gi].f32_bytes);
    });
    return;
  }
  if (!landed_.update) {  // a *_last pass: the square only; optimizer_step updates
    layer_pass_->host().enqueue([this, gi] { group_sq_[gi] = group_sum_of_squares(gi); });
    return;
  }
  const AdamWParams params = landed_.params;
  const double wd = landed_.weight_decay;
  layer_pass_->queue_update(gi, [this, gi, params, wd] {
    group_sq_[gi] = group_sum_of_squares(gi);
    optimizer_->update(gi, params, wd);
  });
}

double Engine::forward_backward_update(const MicroBatch& mb, float grad_scale, AdamWParams params,
                                       double weight_decay) {
  return pass_update(&mb, 1, grad_scale, params, weight_decay).front();
}

std::vector<double> Engine::forward_backward_group_update(const std::vector<MicroBatch>& mbs, float grad_scale,
                                                          AdamWParams params, double weight_decay) {
  return pass_update(mbs.data(), mbs.size(), grad_scale, params, weight_decay);
}

std::vector<double> Engine::pass_update(const MicroBatch* mbs, size_t g, float grad_scale, AdamWParams params,
                                        double weight_decay) {
  if (lora_) {  // the adapters update in one piece after backward (they are small)
    std::vector<double> losses = run_pass(mbs, g, StepKind::forward_backward, grad_scale);
    lora_landed_norm_ = lora_optimizer_step(params, 0.0, weight_decay);
    return losses;
  }
  begin_optimizer_pass(true);
  std::vector<double> losses = landed_pass(mbs, g, grad_scale, {true, true, false, params, weight_decay});
  layer_pass_->mark_stale();
  return losses;
}

double Engine::forward_backward_last(const MicroBatch& mb, float grad_scale, const AdamWParams* speculate,
                                     double weight_decay) {
  return forward_backward_group_last({mb}, grad_scale, speculate, weight_decay).front();
}

std::vector<double> Engine::forward_backward_group_last(const std::vector<MicroBatch>& mbs, float grad_scale,
                                                        const AdamWParams* speculate, double weight_decay) {
  if (lora_ || reduction_->shared_store())  // LoRA: the adapters' norm is lora_optimizer_step's
    return run_pass(mbs.data(), mbs.size(), StepKind::forward_backward, grad_scale);
  LandedUpdate mode{true, false, false, {}, 0, false};
  if (speculate && spec_.bytes > 0 && spec_.allowed) {
    mode.speculate = true;
    mode.params = *speculate;
    mode.params.clip_scale = 1.0;
    mode.weight_decay = weight_decay;
    spec_.params = mode.params;
    spec_.weight_decay = weight_decay;
  }
  std::vector<double> losses = landed_pass(mbs.data(), mbs.size(), grad_scale, mode);
  group_sq_gathered_ = true;
  return losses;
}

std::vector<double> Engine::forward_backward_group_norm(const std::vector<MicroBatch>& mbs, float grad_scale) {
  STRATA_CHECK(!lora_, "a norm pass is for full fine-tuning (LoRA's adapters take their norm in one piece)");
  STRATA_ASSERT(!reduction_->shared_store() && reduction_->updates_group(0), "a norm pass runs on one rank");
  return landed_pass(mbs.data(), mbs.size(), grad_scale, LandedUpdate{true, false, true, {}, 0, false});
}

// One forward_backward pass with landed_ = mode for its landings (then inactive again, also on a throw).
std::vector<double> Engine::landed_pass(const MicroBatch* mbs, size_t g, float grad_scale, const LandedUpdate& mode) {
  std::vector<double> losses;
  try {
    losses = run_pass(mbs, g, StepKind::forward_backward, grad_scale, &mode);
  } catch (...) {
    landed_.active = false;
    throw;
  }
  landed_.active = false;
  return losses;
}

double Engine::global_norm() {
  double sq = 0;
  for (double g : group_sq_) sq += g;
  const double norm = std::sqrt(sq);
  STRATA_CHECK(std::isfinite(norm), "the gradient norm is not finite (", norm,
               "); lower optim.learning_rate or check the data");
  return norm;
}

double Engine::landed_update_norm() {
  if (lora_) return lora_landed_norm_;
  layer_pass_->host().drain();
  return global_norm();
}

// Every stream and the host queue are drained even when one of them failed, so nothing is
// left running on buffers the caller may free next; then the first error is rethrown.
StepOutcome Engine::train_step(const StepWork& work) {
  STRATA_ASSERT(work.micro && !work.micro->empty(), "a step has at least one micro-batch");
  const std::vector<MicroBatch>& micro = *work.micro;
  const float scale = float(1.0 / double(std::max<int64_t>(work.counted, 1)));
  const bool layer_major = opt_.group > 1;
  StepOutcome out;
  if (work.gradients_first) {  // the last pass gathers the norm's squares as the gradients land
    if (layer_major) out.losses = forward_backward_group_last(micro, scale, &work.hyper, work.weight_decay);
    else {
      for (size_t a = 0; a + 1 < micro.size(); ++a) out.losses.push_back(forward_backward(micro[a], scale));
      out.losses.push_back(forward_backward_last(micro.back(), scale, &work.hyper, work.weight_decay));
    }
    out.grad_norm = optimizer_step(work.hyper, work.max_grad_norm, work.weight_decay);
    return out;
  }
  if (work.norm_pass) {  // clipping in two passes: the norm first, then the same pass updating, clipped
    STRATA_CHECK(layer_major || micro.size() == 1, "a norm pass needs one pass a step: layer-major accumulation, "
                 "or one micro-batch a step");
    forward_backward_group_norm(micro, scale);
    AdamWParams hyper = work.hyper;
    hyper.clip_scale = clip_scale_for(landed_update_norm(), work.max_grad_norm);
    out.losses = forward_backward_group_update(micro, scale, hyper, work.weight_decay);
    out.grad_norm = landed_update_norm();  // the same squares again
    return out;
  }
  // no clipping: the last micro-batch (layer-major: the whole pass) updates each group as its gradient lands
  if (layer_major) {
    out.losses = forward_backward_group_update(micro, scale, work.hyper, work.weight_decay);
  } else {
    for (size_t a = 0; a + 1 < micro.size(); ++a) out.losses.push_back(forward_backward(micro[a], scale));
    out.losses.push_back(forward_backward_update(micro.back(), scale, work.hyper, work.weight_decay));
  }
  out.grad_norm = landed_update_norm();
  return out;
}

void Engine::synchronize() {
  scatter_ticket_ = 0;  // the drain below runs it
  layer_pass_->synchronize({[&] { if (spill_) spill_->drain(); },
                            // NVMe write-backs of the last pass have landed (LoRA: the base has no optimizer state)
                            [&] { if (!lora_) store_.placement().flush(); }});
}

template <class F>
void Engine::exposed_wait(double* exposed, F&& wait) {
  *exposed += engine_exposed_wait(dev_, wait);
}

EngineStats Engine::stats() const {
  EngineStats s = layer_pass_->stats();
  s.d2h_wait_s = d2h_wait_s_;
  const StateIoCounters st = lora_ ? StateIoCounters{} : store_.placement().counters();
  s.nvme_read_bytes = st.read_bytes + (spill_ ? spill_->read_bytes() : 0);
  s.nvme_write_bytes = st.write_bytes + (spill_ ? spill_->write_bytes() : 0);
  s.nvme_wait_s = st.wait_s + nvme_exposed_s_;
  s.nvme_busy_s = file_engines_busy_seconds();
  s.speculated_updates = spec_.updates;
  s.speculation_redos = spec_.redos;
  return s;
}

}  // namespace strata
