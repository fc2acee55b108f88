// The zeroth-order step engine (engine_zo.h). Reading order: the buffer table, set-up, the
// weights (clean slots, the perturbed slot), one run (tokens, embedding, layers, head), the
// update.
//
// Events: the clean layer slots and the clean lm_head chunk slots stream through the layer pass
// as in the first-order engine (layer_pass.h, weight_stream.h: loaded[s] on h2d, waited by the
// slot's passes; released[s] on compute once every pass of the run is queued, waited by the next
// upload into s). The perturbed slots and the final norms are written and read on the compute
// stream only (stream order guards them). Host-side: the layer pass's update ticket of group g
// (its ZO-SGD update, before its upload); a pinned x0 buffer is rewritten only after the compute
// stream finished the copy out of it (a synchronize two passes later, or the previous run's end:
// run() ends with the losses' copy), and the micro-batches' token vectors, the source of their
// asynchronous uploads, outlive the run.
#include "offload/engine/engine_zo.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "offload/stream/buffer_binding.h"
#include "src/core/error.h"
#include "src/device/arena.h"
#include "src/device/host_ops.h"

namespace strata {

// ---- the buffer table ----------------------------------------------------------------------

std::vector<EngineBuffer> zo_buffer_table(const EngineShape& s, ZoBuffers* into) {
  const size_t act = s.activation_bytes(), tokens_i32 = bytes_of<int32_t>(s.tokens) * s.group;
  const size_t slot = s.slot_bytes.empty() ? 0 : *std::max_element(s.slot_bytes.begin(), s.slot_bytes.end());
  const size_t head_w = size_t(s.head_rows) * s.lm_row_bytes;
  const size_t clean_slots = std::min<size_t>(2, s.layers), branches = 2 * s.group;
  std::vector<EngineBuffer> t;
  auto dev = [&](std::string name, size_t bytes, std::function<void(void*)> bind) {
    t.push_back({std::move(name), bytes, Memory::device, std::move(bind)});
  };
  if (into) {
    into->slots.assign(clean_slots, nullptr);
    into->ce_stats.assign(branches, nullptr);
    into->x.assign(branches + 1, nullptr);
  }
  for (size_t k = 0; k < clean_slots; ++k)
    dev(str_cat("layer weight slot ", k), slot, bind_at(into ? &into->slots[k] : nullptr));
  dev("perturbed layer weights", slot, bind_at(into ? &into->perturbed : nullptr));
  dev("final norm weight", bytes_of<float>(s.C), bind_at(into ? &into->norm : nullptr));
  dev("perturbed final norm weight", bytes_of<float>(s.C), bind_at(into ? &into->norm_perturbed : nullptr));
  for (size_t k = 0; k < s.head_slots; ++k)
    dev(str_cat("lm_head chunk slot ", k, " (", s.head_rows, " vocab rows)"), head_w,
        bind_at(into ? &into->head_slots[k] : nullptr));
  dev("perturbed lm_head chunk", head_w, bind_at(into ? &into->head_perturbed : nullptr));
  for (size_t b = 0; b < branches; ++b) {
    dev(str_cat("cross-entropy token statistics, branch ", b), bytes_of<double>(3 * s.tokens),
        bind_at(into ? &into->ce_stats[b] : nullptr));
    dev(str_cat("hidden states, branch ", b), act, bind_at(into ? &into->x[b] : nullptr));
  }
  dev("hidden states, spare", act, bind_at(into ? &into->x[branches] : nullptr));
  dev("final norm rstd", bytes_of<float>(s.tokens), bind_at(into ? &into->rstd_final : nullptr));
  dev("input ids", tokens_i32, bind_at(into ? &into->ids : nullptr));
  dev("targets", tokens_i32, bind_at(into ? &into->targets : nullptr));
  dev("positions", tokens_i32, bind_at(into ? &into->pos : nullptr));
  dev("document starts", tokens_i32, bind_at(into ? &into->doc_start : nullptr));
  dev("losses", branches * sizeof(double), bind_at(into ? &into->loss : nullptr));
  dev("rope inv_freq", bytes_of<float>(int64_t(s.rope_floats)), bind_at(into ? &into->inv_freq : nullptr));
  dev("layer forward workspace", layer_kinds_bytes(s.layer_kinds, LayerBuffer::forward_workspace, s.layer_capacity), bind_at(into ? &into->workspace : nullptr));
  for (size_t p = 0; p < 2; ++p)
    t.push_back({str_cat("embedding output ", p, " (host)"), act, Memory::pinned,
                 bind_at(into ? &into->x0_host[p] : nullptr)});
  return t;
}

// ---- set-up ----------------------------------------------------------------------------------

EngineShape zo_engine_shape(const ModelSpec& spec, EngineOptions options) {
  options.weights = WeightsMode::stream;
  options.checkpoints = CheckpointMode::host;
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
  // checked before anything is allocated, so that refusing leaves no device buffer behind
  STRATA_CHECK(store_.placement().in_ram(StateArray::master), "zeroth-order training keeps the fp32 master weights "
               "in RAM (6 bytes per parameter in bf16): set offload.optimizer = \"host\"");
  table_ = zo_buffer_table(shape_, &buf_);
  const size_t needed = engine_device_bytes(table_);
  STRATA_CHECK_BUDGET(needed + dev_.used_bytes() <= dev_.budget_bytes(), "the device budget of ",
                      format_bytes(dev_.budget_bytes()), " is too small for zeroth-order training: this model "
                      "and micro-batch need at least ", format_bytes(needed), " (two clean layer slots and one "
                      "perturbed, the hidden states of ", 2 * shape_.group, " passes, one layer's workspace, three "
                      "lm_head chunks); raise [device] memory to at least ", format_bytes(needed + (1 << 20)),
                      shape_.group > 1 ? ", set offload.accumulation = \"micro_batch\"" : "",
                      ", or lower micro_batch_size / sequence_len");
  engine_buffers_allocate(dev_, table_, "zo: ");
  ws_ = LayerScratch{static_cast<char*>(buf_.workspace), nullptr, shape_.layer_capacity, false};
  LayerPassSlots slots;
  slots.layers = buf_.slots;
  slots.head.assign(buf_.head_slots, buf_.head_slots + shape_.head_slots);
  slots.final_norm = buf_.norm;
  slots.head_rows = shape_.head_rows;
  layer_pass_ = std::make_unique<LayerPass>(dev_, store_, slots, /*updates=*/true);
  layer_pass_->rope_upload(buf_.inv_freq);
  dev_.stream_synchronize(Stream::compute);
  optimizer_ = std::make_unique<HostZoSgd>(store_, store_.placement());
}

ZoEngine::~ZoEngine() {
  try {
    synchronize();
  } catch (...) {  // already reported on the caller's path; still free everything
  }
  engine_buffers_free(dev_, table_);
}

size_t ZoEngine::weight_link_bytes() const {
  const ModelSpec& spec = store_.spec();
  const TensorTable& wt = store_.working_table();
  size_t bytes = wt[size_t(spec.final_norm)].bytes() + wt[size_t(spec.lm_head_row())].bytes();
  for (size_t i = 0; i < L_; ++i) bytes += store_.layer_group(i).working_bytes;
  return bytes;
}

// ---- weights -------------------------------------------------------------------------------

// Pass p's weights of `layer`: the clean slot, or the perturbed slot rebuilt from it with
// p.sign · ε · z for every tensor of the layer (unless it holds that already: `built`).
const char* ZoEngine::layer_weights_for(const Pass& p, const char* clean, size_t layer, float eps, Built& built) {
  if (p.sign == 0) return clean;
  if (built.holds(p)) return buf_.perturbed;
  const ParamGroup& g = store_.layer_group(layer);
  const TensorTable& wt = store_.working_table();
  dev_.copy_d2d(buf_.perturbed, clean, g.working_bytes, Stream::compute);
  for (size_t r = g.first_row; r < g.end_row; ++r)
    dev_.zo_perturb(buf_.perturbed + (wt[r].offset - g.working_offset), wt[r].dtype, p.seed, uint32_t(r), 0,
                    float(p.sign) * eps, wt[r].numel(), Stream::compute);
  built = {p.sign, p.seed};
  return buf_.perturbed;
}

// ---- one run -----------------------------------------------------------------------------------

std::vector<double> ZoEngine::perturbed_forwards(const std::vector<ZoPair>& pairs, float eps,
                                                 const std::vector<int>& signs) {
  STRATA_CHECK(std::isfinite(eps) && eps > 0, "optim.zo_eps must be a positive number, got ", eps);
  STRATA_ASSERT(!pairs.empty() && pairs.size() <= shape_.group, "a run holds at most ", shape_.group, " pairs, not ",
                pairs.size());
  STRATA_ASSERT(!signs.empty() && signs.size() <= 2);
  for (int sign : signs) STRATA_ASSERT(sign == 1 || sign == -1);
  // the run's micro-batches, each once (token rows), and the pairs' order kept in the losses
  std::vector<const MicroBatch*> micro;
  std::vector<size_t> row(pairs.size());
  for (size_t i = 0; i < pairs.size(); ++i) {
    const auto it = std::find(micro.begin(), micro.end(), pairs[i].micro);
    row[i] = size_t(it - micro.begin());
    if (it == micro.end()) micro.push_back(pairs[i].micro);
  }
  // passes of one seed and side next to each other: for each run of pairs with one seed, each
  // side, each pair of that run
  std::vector<Pass> passes;
  std::vector<size_t> at;  // pass -> its place in the result
  for (size_t first = 0; first < pairs.size();) {
    size_t end = first + 1;
    while (end < pairs.size() && pairs[end].seed == pairs[first].seed) ++end;
    for (size_t s = 0; s < signs.size(); ++s)
      for (size_t i = first; i < end; ++i) {
        passes.push_back({signs[s], pairs[i].seed, row[i]});
        at.push_back(i * signs.size() + s);
      }
    first = end;
  }
  run(micro, passes, eps);
  std::vector<double> losses(passes.size());
  for (size_t p = 0; p < passes.size(); ++p) losses[at[p]] = loss_host_[p];
  return losses;
}

ZoLosses ZoEngine::dual_forward(const MicroBatch& mb, uint64_t seed, float eps) {
  const std::vector<double> l = perturbed_forwards({{&mb, seed}}, eps, {+1, -1});
  return {l[0], l[1]};
}

double ZoEngine::perturbed_forward(const MicroBatch& mb, uint64_t seed, float eps, int sign) {
  STRATA_ASSERT(sign == 1 || sign == -1);
  return perturbed_forwards({{&mb, seed}}, eps, {sign})[0];
}

double ZoEngine::forward_loss(const MicroBatch& mb) {
  run({&mb}, {{0, 0, 0}}, 0.f);
  return loss_host_[0];
}

LayerDims ZoEngine::dims_of(const MicroBatch& mb) const {
  LayerDims d = dims_;
  d.B = mb.B;
  d.T = mb.T;
  d.max_pos = layer_dims_max_pos(mb.pos);
  return d;
}

// Micro-batch m's tokens into row m of the token buffers.
void ZoEngine::upload_tokens(const std::vector<const MicroBatch*>& micro) {
  const size_t n = size_t(shape_.tokens);
  for (size_t m = 0; m < micro.size(); ++m)
    engine_tokens_upload(dev_, shape_, *micro[m],
                         {buf_.ids + m * n, buf_.targets + m * n, buf_.pos + m * n, buf_.doc_start + m * n});
}

// Each pass's embedding output on the host: the working table's rows gathered (exact
// conversion to f32), then perturbed with the full table's element indices id·C + c (in f32,
// rounded to bf16 once when the table is bf16: what the device's zo_perturb does to a tensor),
// copied up into the pass's hidden states. The two pinned buffers alternate: before one is
// filled again, the compute stream has finished the copy out of it.
void ZoEngine::embed_forward(const std::vector<const MicroBatch*>& micro, const std::vector<Pass>& passes, float eps) {
  const int64_t C = dims_.C;
  const size_t row = size_t(store_.spec().embed);
  const bool bf16_table = store_.working_table()[row].dtype == DType::bf16;
  for (size_t p = 0; p < passes.size(); ++p) {
    const MicroBatch& mb = *micro[passes[p].micro];
    const int64_t N = mb.B * mb.T;
    float* x0 = buf_.x0_host[p % 2];
    if (p >= 2) dev_.stream_synchronize(Stream::compute);  // the copy out of x0, two passes ago
    const float scale = float(passes[p].sign) * eps;
    const uint64_t seed = passes[p].seed;
    const int32_t* ids = mb.ids.data();
    layer_pass_->embed_gather(x0, ids, N, [&](int64_t n, float* xr) {
      if (passes[p].sign == 0) return;
      host_zo_perturb_f32(xr, seed, uint32_t(row), uint64_t(ids[n]) * uint64_t(C), scale, C);
      if (bf16_table)
        for (int64_t c = 0; c < C; ++c) xr[c] = bf16_to_f32(f32_to_bf16(xr[c]));
    });
    dev_.copy_h2d(buf_.x[p], x0, bytes_of<float>(N * C), Stream::compute);
  }
}

// Tokens, the embedding, every layer (every pass while it is on the device), the final norm and
// the chunked head (every pass's statistics per chunk), the losses back. Pass p's hidden states
// are buf_.x[p]; a layer writes into the spare, which then takes the input's place.
void ZoEngine::run(const std::vector<const MicroBatch*>& micro, const std::vector<Pass>& passes, float eps) {
  const Stream s = Stream::compute;
  const size_t P = passes.size(), n = size_t(shape_.tokens);
  STRATA_ASSERT(P >= 1 && P <= 2 * shape_.group && micro.size() <= shape_.group);
  upload_tokens(micro);
  embed_forward(micro, passes, eps);
  std::vector<float*> x(buf_.x.begin(), buf_.x.begin() + long(P));
  float* spare = buf_.x.back();
  std::vector<LayerDims> dims(micro.size());
  std::vector<TokenContext> ctx(micro.size());
  for (size_t m = 0; m < micro.size(); ++m) {
    dims[m] = dims_of(*micro[m]);
    ctx[m] = {buf_.pos + m * n, micro[m]->doc_start.empty() ? nullptr : buf_.doc_start + m * n, buf_.inv_freq};
  }
  const int64_t C = dims_.C, V = shape_.V;
  layer_pass_->for_each_layer(false, [&](size_t i, const char* clean) {
    Built built;
    for (size_t p = 0; p < P; ++p) {
      const size_t m = passes[p].micro;
      const char* w = layer_weights_for(passes[p], clean, i, eps, built);
      layer_kind(store_, i).forward(dev_, spare, x[p], layer_weights_in(store_, w, i), ctx[m], ws_, dims[m], s);
      std::swap(spare, x[p]);
    }
  });
  // final norm: hn of pass p into the spare, which then holds it as x[p]
  const float* clean_norm = layer_pass_->acquire_final_norm();
  const uint32_t norm_row = uint32_t(store_.spec().final_norm);
  Built norm_built;
  for (size_t p = 0; p < P; ++p) {
    const float* norm = clean_norm;
    if (passes[p].sign != 0) {
      if (!norm_built.holds(passes[p])) {
        dev_.copy_d2d(buf_.norm_perturbed, clean_norm, bytes_of<float>(C), s);
        dev_.zo_perturb(buf_.norm_perturbed, DType::f32, passes[p].seed, norm_row, 0, float(passes[p].sign) * eps, C, s);
        norm_built = {passes[p].sign, passes[p].seed};
      }
      norm = buf_.norm_perturbed;
    }
    const LayerDims& d = dims[passes[p].micro];
    dev_.rmsnorm_forward(spare, buf_.rstd_final, x[p], norm, d.N(), C, d.eps, s);
    std::swap(spare, x[p]);
  }
  // head: each chunk serves every pass
  const uint32_t lm_row = uint32_t(store_.spec().lm_head_row());
  const DType lm_type = store_.working_table()[lm_row].dtype;
  layer_pass_->for_each_head_chunk(false, [&](size_t k, int64_t v0, int64_t vc, const char* clean) {
    Built built;
    for (size_t p = 0; p < P; ++p) {
      const size_t m = passes[p].micro;
      const void* w = clean;
      if (passes[p].sign != 0) {
        if (!built.holds(passes[p])) {
          dev_.copy_d2d(buf_.head_perturbed, clean, size_t(vc) * shape_.lm_row_bytes, s);
          dev_.zo_perturb(buf_.head_perturbed, lm_type, passes[p].seed, lm_row, uint64_t(v0 * C),
                          float(passes[p].sign) * eps, vc * C, s);
          built = {passes[p].sign, passes[p].seed};
        }
        w = buf_.head_perturbed;
      }
      dev_.lm_head_ce_chunk_stats(buf_.ce_stats[p], x[p], w, lm_type, buf_.targets + m * n, dims[m].N(), C, V, v0, vc,
                                  k == 0, nullptr, s);
    }
  });
  dev_.memset_zero(buf_.loss, P * sizeof(double), s);
  for (size_t p = 0; p < P; ++p)
    dev_.lm_head_ce_stats_loss(buf_.loss + p, buf_.ce_stats[p], buf_.targets + passes[p].micro * n,
                               dims[passes[p].micro].N(), V, s);
  loss_host_.resize(P);
  dev_.copy_d2h(loss_host_.data(), buf_.loss, P * sizeof(double), s);
  dev_.stream_synchronize(s);
}

// ---- the update --------------------------------------------------------------------------------

void ZoEngine::queue_update(const ZoSgdEstimate& estimate, double lr, double weight_decay) {
  // the previous update has been waited for group by group by the passes since; make sure
  for (size_t g = 0; g < store_.groups().size(); ++g) layer_pass_->wait_group(g);
  optimizer_->set_estimate(estimate);
  AdamWParams hyper;
  hyper.lr = lr;
  for (size_t g = 0; g < store_.groups().size(); ++g)
    layer_pass_->queue_update(g, [this, g, hyper, weight_decay] { optimizer_->update(g, hyper, weight_decay); });
  layer_pass_->mark_stale();
}

void ZoEngine::synchronize() { layer_pass_->synchronize(); }

EngineStats ZoEngine::stats() const { return layer_pass_->stats(); }

ZoStepOutcome zo_step_run(ZoEngine& engine, const ZoStepOptions& options, const std::vector<MicroBatch>& micro,
                          int64_t counted, int64_t step, double lr, double weight_decay, const ZoParallel& par,
                          Comm* comm) {
  STRATA_ASSERT(counted > 0 && options.perturbations >= 1 && !micro.empty());
  STRATA_ASSERT(par.sides == 1 || par.sides == 2);
  const float eps = float(options.eps);
  const double two_eps = 2.0 * double(eps);
  const size_t q = size_t(options.perturbations), M = micro.size() * size_t(par.groups);
  // losses[(j * M + i) * 2 + s]: side s (0: θ + εz, 1: θ − εz) of global micro-batch i under z_j
  std::vector<double> losses(q * M * 2, 0.0);
  std::vector<uint64_t> seeds(q);
  std::vector<ZoPair> pairs;  // this rank's, perturbation-major
  for (size_t j = 0; j < q; ++j) {
    seeds[j] = host_zo_seed(options.seed, uint64_t(step), uint32_t(j));
    for (const MicroBatch& mb : micro) pairs.push_back({&mb, seeds[j]});
  }
  const std::vector<int> signs = par.sides == 1 ? std::vector<int>{+1, -1} : std::vector<int>{par.side == 0 ? 1 : -1};
  const size_t per_run = engine.shape().group;  // 1: a dual forward at a time; q x k: the step at once
  for (size_t first = 0; first < pairs.size(); first += per_run) {
    const size_t end = std::min(pairs.size(), first + per_run);
    const std::vector<double> l =
        engine.perturbed_forwards(std::vector<ZoPair>(pairs.begin() + long(first), pairs.begin() + long(end)), eps, signs);
    for (size_t i = first; i < end; ++i) {
      const size_t j = i / micro.size(), k = i % micro.size();
      double* at = &losses[(j * M + k * size_t(par.groups) + size_t(par.group)) * 2];
      for (size_t s = 0; s < signs.size(); ++s) at[signs[s] == 1 ? 0 : 1] = l[(i - first) * signs.size() + s];
    }
  }
  ZoStepOutcome out;
  if (comm && comm->size() > 1) {
    comm->all_reduce_sum(losses.data(), losses.size()).wait();
    out.comm_bytes = losses.size() * sizeof(double);
  }
  ZoSgdEstimate est;
  for (size_t j = 0; j < q; ++j) {
    double plus = 0, minus = 0;  // in the single-process order of the micro-batches
    for (size_t i = 0; i < M; ++i) {
      plus += losses[(j * M + i) * 2];
      minus += losses[(j * M + i) * 2 + 1];
    }
    plus /= double(counted);
    minus /= double(counted);
    STRATA_CHECK(std::isfinite(plus) && std::isfinite(minus), "step ", step, ": the perturbed losses are not finite (",
                 plus, ", ", minus, "); lower optim.learning_rate or optim.zo_eps, or check the data");
    const double g = (plus - minus) / two_eps;
    out.projected.push_back(g);
    out.loss_plus += plus / double(q);
    out.loss_minus += minus / double(q);
    out.projected_grad += g / double(q);
    est.seeds.push_back(seeds[j]);
    est.coefs.push_back(float(g / double(q)));
  }
  engine.queue_update(est, lr, weight_decay);
  return out;
}

void ZoEngine::set_step(const ZoStepOptions& options, const ZoParallel& par, Comm* comm) {
  step_options_ = options;
  par_ = par;
  comm_ = comm;
}

StepOutcome ZoEngine::train_step(const StepWork& work) {
  STRATA_ASSERT(work.micro, "a step has micro-batches");
  const ZoStepOutcome z = zo_step_run(*this, step_options_, *work.micro, work.counted, work.step, work.hyper.lr,
                                      work.weight_decay, par_, comm_);
  StepOutcome out;
  out.losses = {z.loss() * double(work.counted)};  // already the whole step's, on every rank
  out.global = true;
  out.grad_norm = std::abs(z.projected_grad);
  out.extra = {{"zo_projected_grad", z.projected_grad}, {"loss_plus", z.loss_plus}, {"loss_minus", z.loss_minus}};
  out.comm_bytes = z.comm_bytes;
  return out;
}

}  // namespace strata
