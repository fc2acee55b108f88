#include "offload/plan/layer_probe.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "offload/plan/step_estimate.h"
#include "offload/stream/engine_buffers.h"
#include "offload/stream/layer_views.h"
#include "src/core/bf16.h"
#include "src/core/error.h"
#include "src/device/peak_flops.h"

namespace strata {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The device's time in memory-bound ops (the kinds DeviceWork::elementwise_bytes counts).
double memory_bound_s(const DeviceCounters& c) {
  return c.op_s[int(OpKind::norm)] + c.op_s[int(OpKind::rope)] + c.op_s[int(OpKind::elementwise)];
}

// The probe's inputs: the weights as the engine would lay out a streamed layer ("auto" taken as
// streamed: a layer's work is the same either way).
PlanInputs probe_inputs(const PlanInputs& in) {
  PlanInputs p = in;
  if (p.weights == WeightsMode::automatic) p.weights = WeightsMode::stream;
  return p;
}

constexpr size_t kArenaSlack = size_t(16) << 20;  // the CPU device's own alignment and bookkeeping

}  // namespace

// the device buffers, in their allocation order
enum LayerProbe::Buffer : size_t {
  kWeights,    // the layer's working weights (one layer group)
  kGrads,      // its f32 gradient slot
  kWorkspace,  // the layer kind's workspace (LayerBuffer::workspace)
  kX,          // (N, C) the layer's input
  kDy,         // (N, C) the gradient into its output
  kY,          // (N, C) its output
  kHidden,     // (N, C) the head's input
  kDx,         // (N, C) the layer's input gradient, then the head's
  kChunk,      // (R, C) lm_head rows in their working dtype
  kChunkGrad,  // (R, C) f32
  kStats,      // (N, 3) double
  kIds,        // (2N) positions, then targets
  kInvFreq,    // (D/2) RoPE's inverse frequencies
  kLoss,       // one double
  kBuffers
};

LayerProbe::Shape LayerProbe::shape_of(const ModelSpec& spec, const HostStoreLayout& layout, const PlanInputs& in) {
  const EngineShape engine = placement_engine_shape(spec, layout, probe_inputs(in), 1);
  Shape sh;
  sh.d = engine.layer_capacity;
  sh.d.max_pos = int32_t(sh.d.T - 1);  // fill's positions: 0 .. T-1 per row
  sh.N = sh.d.N(), sh.C = sh.d.C, sh.V = engine.V, sh.R = engine.head_rows;
  sh.lm_type = layout.working[size_t(spec.lm_head_row())].dtype;
  const ParamGroup& g = layout.groups[1];
  const size_t act = bytes_of<float>(sh.N * sh.C), chunk = size_t(sh.R * sh.C) * dtype_size(sh.lm_type);
  sh.sizes = {g.device_bytes, g.f32_bytes, spec.layers[0].kind->bytes(LayerBuffer::workspace, sh.d), act, act, act, act,
              act, chunk, bytes_of<float>(sh.R * sh.C), size_t(sh.N) * 3 * sizeof(double),
              size_t(sh.N) * sizeof(int32_t) * 2, bytes_of<float>(sh.d.D), sizeof(double)};
  for (size_t b : sh.sizes) sh.total_bytes += (b + 4095) / 4096 * 4096 + 4096;
  return sh;
}

LayerProbe::LayerProbe(const ModelSpec& spec, const PlanInputs& in)
    : layout_(HostStore::layout(spec)), kind_(spec.layers[0].kind) {
  const Shape sh = shape_of(spec, layout_, in);
  d_ = sh.d;
  N_ = sh.N, C_ = sh.C, V_ = sh.V, R_ = sh.R;
  lm_type_ = sh.lm_type;
  sizes_ = sh.sizes;
  total_bytes_ = sh.total_bytes;
}

std::unique_ptr<LayerProbe> LayerProbe::create(const ModelSpec& spec, const PlanInputs& in) {
  std::unique_ptr<LayerProbe> probe(new LayerProbe(spec, in));
  if (probe->total_bytes_ > kLayerProbeMaxBytes) return nullptr;
  probe->allocate(spec);
  return probe;
}

size_t LayerProbe::host_bytes(const ModelSpec& spec, const HostStoreLayout& layout, const PlanInputs& in) {
  const Shape sh = shape_of(spec, layout, in);
  if (sh.total_bytes > kLayerProbeMaxBytes) return 0;
  return sh.total_bytes + kArenaSlack + *std::max_element(sh.sizes.begin(), sh.sizes.end());
}

void LayerProbe::allocate(const ModelSpec& spec) {
  DeviceOptions o;
  o.memory_bytes = total_bytes_ + kArenaSlack;
  dev_ = device_create(o);
  for (size_t i = 0; i < kBuffers; ++i) buf_.push_back(static_cast<char*>(dev_->alloc(sizes_[i], "layer probe")));
  fill(spec);
  w_ = layer_weights_in(spec, layout_, buf_[kWeights], 0);
  lg_ = layer_grads_in(spec, layout_, buf_[kGrads], 0);
  ws_ = LayerScratch{buf_[kWorkspace], nullptr, d_, true};
}

// weights 0.02 (a bf16 pattern reads as ~0.02 in the f32 norms too), activations and gradients
// of order one, positions 0 .. T-1 per row, targets spread over the vocabulary
void LayerProbe::fill(const ModelSpec& spec) {
  const bool bf = spec.matrix_dtype == DType::bf16 || lm_type_ == DType::bf16;
  const float w32 = 0.02f;
  const bf16 w16 = f32_to_bf16(0.02f);
  for (Buffer k : {kWeights, kChunk}) bf ? fill_buffer(k, &w16, sizeof w16) : fill_buffer(k, &w32, sizeof w32);
  std::vector<float> x(size_t(N_ * C_));
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * float(i));
  for (Buffer k : {kX, kDy, kHidden}) dev_->copy_h2d(buf_[k], x.data(), sizes_[k], Stream::compute);
  std::vector<int32_t> token_ids(size_t(2 * N_));
  for (int64_t t = 0; t < N_; ++t)
    token_ids[size_t(t)] = int32_t(t % d_.T), token_ids[size_t(N_ + t)] = int32_t((t * 7919) % V_);
  dev_->copy_h2d(buf_[kIds], token_ids.data(), token_ids.size() * sizeof(int32_t), Stream::compute);
  const std::vector<float> inv_freq = model_rope_inv_freq(spec.config);
  dev_->copy_h2d(buf_[kInvFreq], inv_freq.data(), inv_freq.size() * sizeof(float), Stream::compute);
  dev_->stream_synchronize(Stream::compute);  // the copies read the vectors above
}

// Buffer k filled with copies of one value of `value_bytes` (a host copy of the buffer, then h2d).
void LayerProbe::fill_buffer(Buffer k, const void* value, size_t value_bytes) {
  std::vector<char> h(sizes_[k] + value_bytes);
  for (size_t at = 0; at + value_bytes <= h.size(); at += value_bytes)
    std::copy_n(static_cast<const char*>(value), value_bytes, h.data() + at);
  dev_->copy_h2d(buf_[k], h.data(), sizes_[k], Stream::compute);
  dev_->stream_synchronize(Stream::compute);  // the copy reads h
}

const int32_t* LayerProbe::ids() const { return reinterpret_cast<const int32_t*>(buf_[kIds]); }

void LayerProbe::layer() {
  const Stream s = Stream::compute;
  const TokenContext ctx{ids(), nullptr, reinterpret_cast<const float*>(buf_[kInvFreq])};
  kind_->forward(*dev_, f(kY), f(kX), w_, ctx, ws_, d_, s);
  dev_->memset_zero(buf_[kGrads], sizes_[kGrads], s);
  kind_->backward(*dev_, f(kDx), lg_, f(kDy), f(kX), w_, ctx, ws_, d_, s);
  dev_->stream_synchronize(s);
}

void LayerProbe::head() {
  const Stream s = Stream::compute;
  const int32_t* targets = ids() + N_;
  auto* stats = reinterpret_cast<double*>(buf_[kStats]);
  dev_->lm_head_ce_chunk_stats(stats, f(kHidden), buf_[kChunk], lm_type_, targets, N_, C_, V_, 0, R_, true, nullptr, s);
  dev_->lm_head_ce_stats_loss(reinterpret_cast<double*>(buf_[kLoss]), stats, targets, N_, V_, s);
  dev_->memset_zero(buf_[kChunkGrad], sizes_[kChunkGrad], s);
  dev_->lm_head_ce_chunk_backward(f(kDx), f(kChunkGrad), f(kHidden), buf_[kChunk], lm_type_, stats, targets, N_, C_,
                                  V_, 0, R_, 1.f / float(N_), nullptr, s);
  dev_->stream_synchronize(s);
}

void LayerProbe::round() {
  layer();  // untimed: brings the layer's activations back into the caches other work evicted, where
            // a run finds them (one layer's output is the next one's input)
  const double mm0 = op_s(OpKind::matmul), at0 = op_s(OpKind::attention), rest0 = memory_bound_s(dev_->counters());
  layer();
  mm_s_.push_back(std::max(1e-9, op_s(OpKind::matmul) - mm0));
  attn_s_.push_back(std::max(1e-9, op_s(OpKind::attention) - at0));
  rest_s_.push_back(std::max(1e-9, memory_bound_s(dev_->counters()) - rest0));
  const auto t0 = Clock::now();
  head();
  head_s_.push_back(seconds_since(t0));
}

LayerRates LayerProbe::rates(const ModelSpec& spec) const {
  const DeviceWork work = layer_work(spec, 0, d_.B, d_.T), chunk = head_work(spec, N_, R_, 0);
  LayerRates r;
  r.matmul_flops_per_s = work.matmul_flops / median_seconds(mm_s_);
  r.attention_flops_per_s = work.attention_flops / median_seconds(attn_s_);
  r.elementwise_bytes_per_s = work.elementwise_bytes / median_seconds(rest_s_);
  r.head_flops_per_s = chunk.head_flops / median_seconds(head_s_);
  return r;
}

LayerRates layer_probe_run_rates(const ModelSpec& spec, const PlanInputs& in) {
  const std::unique_ptr<LayerProbe> probe = LayerProbe::create(spec, in);
  if (!probe) return {};
  probe->round();  // touches the pages, builds oneDNN's primitives
  for (int r = 0; r < kLayerProbeRunRounds; ++r) probe->round();
  return probe->rates(spec);
}

}  // namespace strata
