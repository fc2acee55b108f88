// The zeroth-order step engine (engine_zo.h). Reading order: the buffer table, set-up, the
// weights (clean slots, the perturbed slot), one run (tokens, embedding, layers, head), the
// update.
//
// Events: the clean layer slots and the clean lm_head chunk slots stream through the layer pass
// as in the first-order engine (layer_pass.h, weight_stream.h: loaded[s] on h2d, waited by the
// slot's passes; released[s] on compute once both passes are queued, waited by the next upload
// into s). The perturbed slots and the final norms are written and read on the compute stream
// only (stream order guards them). Host-side: the layer pass's update ticket of group g (its
// ZO-SGD update, before its upload); the pinned x0 buffers and ids_host are rewritten only after
// the previous run synchronised the compute stream (run() ends with the losses' copy).
#include "offload/engine/engine_zo.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "src/core/error.h"
#include "src/device/arena.h"
#include "src/device/host_ops.h"

namespace strata {
namespace {

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
  dev("layer forward workspace", layer_kinds_bytes(s.layer_kinds, LayerBuffer::forward_workspace, s.layer_capacity), bind_at(into ? &into->workspace : nullptr));
  for (size_t p = 0; p < 2; ++p)
    t.push_back({str_cat("embedding output, pass ", p, " (host)"), act, Memory::pinned,
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
                      "perturbed, both passes' activations, one layer's workspace, three lm_head chunks); raise "
                      "[device] memory to at least ", format_bytes(needed + (1 << 20)),
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
// p.sign · ε · z for every tensor of the layer.
const char* ZoEngine::layer_weights_for(const Pass& p, const char* clean, size_t layer, uint64_t seed, float eps) {
  if (p.sign == 0) return clean;
  const ParamGroup& g = store_.layer_group(layer);
  const TensorTable& wt = store_.working_table();
  dev_.copy_d2d(buf_.perturbed, clean, g.working_bytes, Stream::compute);
  for (size_t r = g.first_row; r < g.end_row; ++r)
    dev_.zo_perturb(buf_.perturbed + (wt[r].offset - g.working_offset), wt[r].dtype, seed, uint32_t(r), 0,
                    float(p.sign) * eps, wt[r].numel(), Stream::compute);
  return buf_.perturbed;
}

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
  engine_tokens_upload(dev_, shape_, mb, {buf_.ids, buf_.targets, buf_.pos, buf_.doc_start});
  dims_.B = mb.B;
  dims_.T = mb.T;
  has_docs_ = !mb.doc_start.empty();
  ids_host_ = mb.ids;
}

// Each pass's embedding output on the host: the working table's rows gathered (exact
// conversion to f32), then perturbed with the full table's element indices id·C + c (in f32,
// rounded to bf16 once when the table is bf16: what the device's zo_perturb does to a tensor).
void ZoEngine::embed_forward(const std::vector<Pass>& passes, uint64_t seed, float eps) {
  const int64_t N = dims_.N(), C = dims_.C;
  const size_t row = size_t(store_.spec().embed);
  const bool bf16_table = store_.working_table()[row].dtype == DType::bf16;
  for (size_t p = 0; p < passes.size(); ++p) {
    float* x0 = buf_.x0_host[p];
    const float scale = float(passes[p].sign) * eps;
    layer_pass_->embed_gather(x0, ids_host_.data(), N, [&](int64_t n, float* xr) {
      if (passes[p].sign == 0) return;
      const int32_t id = ids_host_[size_t(n)];
      host_zo_perturb_f32(xr, seed, uint32_t(row), uint64_t(id) * uint64_t(C), scale, C);
      if (bf16_table)
        for (int64_t c = 0; c < C; ++c) xr[c] = bf16_to_f32(f32_to_bf16(xr[c]));
    });
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
  const int64_t N = dims_.N(), C = dims_.C, V = shape_.V;
  const TokenContext ctx{buf_.pos, has_docs_ ? buf_.doc_start : nullptr, buf_.inv_freq};
  layer_pass_->for_each_layer(false, [&](size_t i, const char* clean) {
    for (size_t p = 0; p < P; ++p) {
      const char* w = layer_weights_for(passes[p], clean, i, seed, eps);
      layer_kind(store_, i).forward(dev_, buf_.x[p][(i + 1) % 2], buf_.x[p][i % 2], layer_weights_in(store_, w, i), ctx, ws_, dims_, s);
    }
  });
  // final norm: hn of pass p into the ping-pong buffer the last layer read from
  const float* clean_norm = layer_pass_->acquire_final_norm();
  const uint32_t norm_row = uint32_t(store_.spec().final_norm);
  float* hn[2] = {};
  for (size_t p = 0; p < P; ++p) {
    const float* norm = clean_norm;
    if (passes[p].sign != 0) {
      dev_.copy_d2d(buf_.norm_perturbed, clean_norm, bytes_of<float>(C), s);
      dev_.zo_perturb(buf_.norm_perturbed, DType::f32, seed, norm_row, 0, float(passes[p].sign) * eps, C, s);
      norm = buf_.norm_perturbed;
    }
    hn[p] = buf_.x[p][(L_ + 1) % 2];
    dev_.rmsnorm_forward(hn[p], buf_.rstd_final, buf_.x[p][L_ % 2], norm, N, C, dims_.eps, s);
  }
  // head: each chunk serves both passes
  const uint32_t lm_row = uint32_t(store_.spec().lm_head_row());
  const DType lm_type = store_.working_table()[lm_row].dtype;
  layer_pass_->for_each_head_chunk(false, [&](size_t k, int64_t v0, int64_t vc, const char* clean) {
    for (size_t p = 0; p < P; ++p) {
      const void* w = clean;
      if (passes[p].sign != 0) {
        dev_.copy_d2d(buf_.head_perturbed, clean, size_t(vc) * shape_.lm_row_bytes, s);
        dev_.zo_perturb(buf_.head_perturbed, lm_type, seed, lm_row, uint64_t(v0 * C), float(passes[p].sign) * eps,
                        vc * C, s);
        w = buf_.head_perturbed;
      }
      dev_.lm_head_ce_chunk_stats(buf_.ce_stats[p], hn[p], w, lm_type, buf_.targets, N, C, V, v0, vc, k == 0, nullptr, s);
    }
  });
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
  for (size_t j = 0; j < q; ++j) {
    seeds[j] = host_zo_seed(options.seed, uint64_t(step), uint32_t(j));
    for (size_t k = 0; k < micro.size(); ++k) {
      double* at = &losses[(j * M + k * size_t(par.groups) + size_t(par.group)) * 2];
      if (par.sides == 1) {
        const ZoLosses l = engine.dual_forward(micro[k], seeds[j], eps);
        at[0] = l.plus;
        at[1] = l.minus;
      } else {
        at[par.side] = engine.perturbed_forward(micro[k], seeds[j], eps, par.side == 0 ? 1 : -1);
      }
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
