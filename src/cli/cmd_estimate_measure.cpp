// `strata estimate --measure` (estimate.h): this host's rates as strata's own code sees them, each
// the median of its rounds: the host's (CPU AdamW, memory bandwidth, crc32c), on the CPU backend
// the device's at this model's shapes (a decoder layer and an lm_head chunk through the Device's
// ops), and with an NVMe directory its write and read bandwidth through the io_uring engine.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>

#include "io/checksum.h"
#include "io/uring_file.h"
#include "models/layer_kind.h"
#include "offload/state/adamw.h"
#include "offload/state/host_store.h"
#include "offload/stream/engine_buffers.h"
#include "offload/stream/layer_views.h"
#include "src/cli/estimate.h"
#include "src/core/bf16.h"
#include "src/core/error.h"
#include "src/core/threads.h"
#include "src/device/device.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The median of a probe's rounds: the step it is compared with is a median too (strata-bench
// estimate and the validation test take the median step), so the rates stand for the same
// machine, busy as it usually is, rather than for its quietest moment.
double median_of(std::vector<double> v) {
  STRATA_ASSERT(!v.empty(), "a probe without rounds");
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The rounds of --measure: at least kProbeRounds, and on until kProbeWindow seconds have passed.
// Every round runs every probe once, interleaved, so a burst of other work on a shared machine
// lands on all the rates alike instead of on one of them.
constexpr double kProbeWindow = 2.0;
constexpr int kProbeRounds = 7;

template <class Round>
void probe_rounds(Round&& round) {
  round();  // touches the pages, builds oneDNN's primitives
  const auto start = Clock::now();
  for (int r = 0; r < kProbeRounds || seconds_since(start) < kProbeWindow; ++r) round();
}

// --measure: this host's rates as strata's own code sees them, each the median of its rounds
// (probe_rounds): the host's (HostProbe) and, on the CPU backend, the device's at this model's
// shapes (LayerProbe). Memory: one layer, one chunk, up to 160 MiB of AdamW state, 128 MiB of memcpy.

// The host's probes: CPU AdamW as the optimizer runs it on the host (offload/state/adamw.h; the
// model's parameters, at most 8M, in its working dtype), the host's memory bandwidth (a parallel
// memcpy over 64 MiB, read + write counted) and crc32c on one core.
struct HostProbe {
  static constexpr size_t kCopyBytes = size_t(64) << 20;
  const DType working_type, moments;
  const int64_t n;
  std::vector<float> master, m, v, grad;
  std::vector<char> working, src, dst;
  AdamWParams p;
  std::vector<double> adamw_s, copy_s, crc_s;

  HostProbe(const ModelSpec& spec, const PlanInputs& in)
      : working_type(spec.matrix_dtype),
        moments(in.moments),
        // as many parameters as the model has, up to 8M (a state past the caches either way)
        n(std::clamp<int64_t>(int64_t(spec.parameter_count()), int64_t(1) << 20, int64_t(8) << 20)),
        master(size_t(n), 0.5f), m(size_t(n), 0.f), v(size_t(n), 0.f), grad(size_t(n), 1e-3f),
        working(size_t(n) * dtype_size(spec.matrix_dtype)), src(kCopyBytes, 1), dst(kCopyBytes, 0) {
    p.stochastic_round = moments == DType::bf16;
  }

  void round() {
    auto t0 = Clock::now();
    ++p.step;
    if (moments == DType::bf16)  // the recipe's optim.moments_dtype: bf16 moments, stochastically rounded as trained
      adamw_update_bf16_moments(master.data(), reinterpret_cast<bf16*>(m.data()), reinterpret_cast<bf16*>(v.data()),
                                grad.data(), working.data(), working_type, n, p);
    else
      adamw_update(master.data(), m.data(), v.data(), grad.data(), working.data(), working_type, n, p);
    adamw_s.push_back(seconds_since(t0));
    t0 = Clock::now();
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < 64; ++k)
      std::memcpy(dst.data() + size_t(k) * (kCopyBytes / 64), src.data() + size_t(k) * (kCopyBytes / 64), kCopyBytes / 64);
    copy_s.push_back(seconds_since(t0));
    t0 = Clock::now();
    volatile uint32_t crc = crc32c(src.data(), kCopyBytes);  // one core, as the file engine's I/O thread sums
    (void)crc;
    crc_s.push_back(seconds_since(t0));
  }

  void rates(MeasuredRates& r) const {
    r.adamw_params_per_s = double(n) / median_of(adamw_s);
    r.host_bytes_per_s = 2 * double(kCopyBytes) / median_of(copy_s);
    r.checksum_bytes_per_s = double(kCopyBytes) / median_of(crc_s);
  }
};

// The device's time in memory-bound ops (the kinds DeviceWork::elementwise_bytes counts).
double memory_bound_s(const DeviceCounters& c) {
  return c.op_s[int(OpKind::norm)] + c.op_s[int(OpKind::rope)] + c.op_s[int(OpKind::elementwise)];
}

// The CPU backend's probe: one decoder layer's forward and backward (with its recompute and the
// gradient slot's zeroing, as the engine runs them) at the micro-batch's B x T and one lm_head
// chunk's statistics, loss and backward, through the Device's ops on a CPU device of their size,
// timed by the device's own per-op counters (as metrics.jsonl's op_s): the layer's GEMMs give the
// GEMM rate, its attention kernel the attention rate, its norms, RoPE, SwiGLU, adds and casts the
// memory-bound rate over DeviceWork's bytes, the chunk (its wall time) the head's rate.
class LayerProbe {
 public:
  // nullptr when the layer and chunk need more than 2 GiB: a 405B layer is no probe (the
  // square-GEMM peak prices it).
  static std::unique_ptr<LayerProbe> create(const ModelSpec& spec, const PlanInputs& in) {
    std::unique_ptr<LayerProbe> probe(new LayerProbe(spec, in));
    if (probe->total_bytes_ > (size_t(2) << 30)) return nullptr;
    probe->allocate(spec);
    return probe;
  }

  void round() {
    layer();  // untimed: brings the layer's activations back into the caches AdamW's and memcpy's pass evicted,
              // where a run finds them (one layer's output is the next one's input)
    const double mm0 = op_s(OpKind::matmul), at0 = op_s(OpKind::attention), rest0 = memory_bound_s(dev_->counters());
    layer();
    mm_s_.push_back(op_s(OpKind::matmul) - mm0);
    attn_s_.push_back(op_s(OpKind::attention) - at0);
    rest_s_.push_back(std::max(1e-9, memory_bound_s(dev_->counters()) - rest0));
    const auto t0 = Clock::now();
    head();
    head_s_.push_back(seconds_since(t0));
  }

  void rates(const ModelSpec& spec, MeasuredRates& r) const {
    const DeviceWork layer = layer_work(spec, 0, d_.B, d_.T), head = head_work(spec, N_, R_, 0);
    r.matmul_flops_per_s = layer.matmul_flops / median_of(mm_s_);
    r.attention_flops_per_s = layer.attention_flops / median_of(attn_s_);
    r.elementwise_bytes_per_s = layer.elementwise_bytes / median_of(rest_s_);
    r.head_flops_per_s = head.head_flops / median_of(head_s_);
  }

 private:
  // the device buffers, in their allocation order
  enum Buffer : size_t {
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

  LayerProbe(const ModelSpec& spec, const PlanInputs& in) : layout_(HostStore::layout(spec)), kind_(spec.layers[0].kind) {
    const EngineShape shape = placement_engine_shape(spec, layout_, in, 1);
    d_ = shape.layer_capacity;
    d_.max_pos = int32_t(d_.T - 1);  // fill's positions: 0 .. T-1 per row
    N_ = d_.N(), C_ = d_.C, V_ = shape.V, R_ = shape.head_rows;
    lm_type_ = layout_.working[size_t(spec.lm_head_row())].dtype;
    const ParamGroup& g = layout_.groups[1];
    const size_t act = bytes_of<float>(N_ * C_), chunk = size_t(R_ * C_) * dtype_size(lm_type_);
    sizes_ = {g.device_bytes, g.f32_bytes, kind_->bytes(LayerBuffer::workspace, d_), act, act, act, act, act,
              chunk, bytes_of<float>(R_ * C_), size_t(N_) * 3 * sizeof(double),
              size_t(N_) * sizeof(int32_t) * 2, bytes_of<float>(d_.D), sizeof(double)};
    for (size_t b : sizes_) total_bytes_ += (b + 4095) / 4096 * 4096 + 4096;
  }

  void allocate(const ModelSpec& spec) {
    DeviceOptions o;
    o.memory_bytes = total_bytes_ + (size_t(16) << 20);
    dev_ = device_create(o);
    for (size_t i = 0; i < kBuffers; ++i) buf_.push_back(static_cast<char*>(dev_->alloc(sizes_[i], "estimate probe")));
    fill(spec);
    w_ = layer_weights_in(spec, layout_, buf_[kWeights], 0);
    lg_ = layer_grads_in(spec, layout_, buf_[kGrads], 0);
    ws_ = LayerScratch{buf_[kWorkspace], nullptr, d_, true};
  }

  // weights 0.02 (a bf16 pattern reads as ~0.02 in the f32 norms too), activations and gradients
  // of order one, positions 0 .. T-1 per row, targets spread over the vocabulary
  void fill(const ModelSpec& spec) {
    const bool bf = spec.matrix_dtype == DType::bf16 || lm_type_ == DType::bf16;
    if (bf) fill_with(kWeights, f32_to_bf16(0.02f)), fill_with(kChunk, f32_to_bf16(0.02f));
    else fill_with(kWeights, 0.02f), fill_with(kChunk, 0.02f);
    std::vector<float> x(size_t(N_ * C_));
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * float(i));
    for (Buffer k : {kX, kDy, kHidden}) dev_->copy_h2d(buf_[k], x.data(), sizes_[k], Stream::compute);
    std::vector<int32_t> ids(size_t(2 * N_));
    for (int64_t t = 0; t < N_; ++t) ids[size_t(t)] = int32_t(t % d_.T), ids[size_t(N_ + t)] = int32_t((t * 7919) % V_);
    dev_->copy_h2d(buf_[kIds], ids.data(), ids.size() * sizeof(int32_t), Stream::compute);
    const std::vector<float> inv_freq = model_rope_inv_freq(spec.config);
    dev_->copy_h2d(buf_[kInvFreq], inv_freq.data(), inv_freq.size() * sizeof(float), Stream::compute);
    dev_->stream_synchronize(Stream::compute);
  }

  template <class T>
  void fill_with(Buffer k, T value) {
    std::vector<T> h(sizes_[k] / sizeof(value) + 1, value);
    dev_->copy_h2d(buf_[k], h.data(), sizes_[k], Stream::compute);
    dev_->stream_synchronize(Stream::compute);  // the copy reads h
  }

  float* f(Buffer k) const { return reinterpret_cast<float*>(buf_[k]); }
  const int32_t* ids() const { return reinterpret_cast<const int32_t*>(buf_[kIds]); }
  double op_s(OpKind k) const { return dev_->counters().op_s[int(k)]; }

  void layer() {
    const Stream s = Stream::compute;
    const TokenContext ctx{ids(), nullptr, reinterpret_cast<const float*>(buf_[kInvFreq])};
    kind_->forward(*dev_, f(kY), f(kX), w_, ctx, ws_, d_, s);
    dev_->memset_zero(buf_[kGrads], sizes_[kGrads], s);
    kind_->backward(*dev_, f(kDx), lg_, f(kDy), f(kX), w_, ctx, ws_, d_, s);
    dev_->stream_synchronize(s);
  }

  void head() {
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

  HostStoreLayout layout_;
  const LayerKind* kind_;  // layer 0's: the one probed
  LayerDims d_;
  int64_t N_ = 0, C_ = 0, V_ = 0, R_ = 0;
  DType lm_type_ = DType::f32;
  std::vector<size_t> sizes_;
  size_t total_bytes_ = 0;
  std::unique_ptr<Device> dev_;
  std::vector<char*> buf_;
  LayerTensors w_{};
  LayerGradTensors lg_{};
  LayerScratch ws_{};
  std::vector<double> mm_s_, attn_s_, rest_s_, head_s_;
};

MeasuredRates measure_rates(const ModelSpec& spec, const PlanInputs& in, bool cpu_device) {
  HostProbe host(spec, in);
  const std::unique_ptr<LayerProbe> layer = cpu_device ? LayerProbe::create(spec, in) : nullptr;
  probe_rounds([&] {
    host.round();
    if (layer) layer->round();
  });
  MeasuredRates r;
  host.rates(r);
  if (layer) layer->rates(spec, r);
  return r;
}

// --measure with --nvme-path: sequential write (with fsync) and read of 512 MiB through strata's
// io_uring engine, in a temporary file under the directory, removed afterwards.
std::pair<double, double> measure_nvme(const std::string& dir) {
  const size_t bytes = size_t(512) << 20, piece = size_t(16) << 20;
  const std::string path = (fs::path(dir) / str_cat(".strata_estimate_", ::getpid())).string();
  IoBuffer buf = io_buffer_alloc(piece);
  std::memset(buf.get(), 0x5a, piece);
  FileEngine io;
  io.register_memory(buf.get(), piece);
  double write_s = 0, read_s = 0;
  auto remove_files = [&] {
    std::error_code ec;
    fs::remove(path, ec);
    fs::remove(path + ".crc32c", ec);
  };
  try {
    int f = io.open(path, FileOpen::create);
    auto t0 = Clock::now();
    for (size_t off = 0; off < bytes; off += piece) io.write(f, off, buf.get(), piece);
    io.wait(io.sync(f));
    io.wait_all();
    write_s = seconds_since(t0);
    io.close(f);
    f = io.open(path, FileOpen::existing);
    t0 = Clock::now();
    for (size_t off = 0; off < bytes; off += piece) io.wait(io.read(f, off, buf.get(), piece));
    read_s = seconds_since(t0);
    io.close(f);
  } catch (...) {
    remove_files();
    throw;
  }
  remove_files();
  return {double(bytes) / read_s, double(bytes) / write_s};
}

}  // namespace

void estimate_measure(const Recipe& recipe, const ModelSpec& spec, const PlanInputs& in, const PlanBudgets& budgets,
                      EstimateRates& r) {
  cpu_threads_set(int(recipe.device_cpu_threads));  // the kernels' thread count, as `strata train` sets it
  cpu_threads_apply();
  StepRates& rates = r.rates;
  const bool cpu = r.source["device"] == "measured here (CPU GEMM)";
  const MeasuredRates m = measure_rates(spec, in, cpu);
  if (cpu && m.matmul_flops_per_s > 0) {
    rates.mfu_peak_flops_per_s = rates.device_flops_per_s;  // MFU stays against the square-GEMM peak, as the trainer's
    rates.device_flops_per_s = m.matmul_flops_per_s;
    rates.attention_flops_per_s = m.attention_flops_per_s;
    rates.elementwise_bytes_per_s = m.elementwise_bytes_per_s;
    rates.head_flops_per_s = m.head_flops_per_s;
    r.source["device"] = "measured here (a layer's GEMMs at this model's shapes)";
    r.source["attention"] = r.source["elementwise"] = r.source["head"] = "measured here (a layer and an lm_head chunk)";
  }
  rates.adamw_params_per_s = m.adamw_params_per_s;
  rates.host_bytes_per_s = m.host_bytes_per_s;
  rates.checksum_bytes_per_s = m.checksum_bytes_per_s;
  r.source["adamw"] = r.source["host"] = r.source["checksum"] = "measured here";
  if (r.source["link"] == "memcpy (host bandwidth)") rates.link_bytes_per_s = rates.host_bytes_per_s;
  if (!budgets.nvme_dir.empty()) {
    const auto [read_bytes_per_s, write_bytes_per_s] = measure_nvme(budgets.nvme_dir);
    rates.nvme_read_bytes_per_s = read_bytes_per_s;
    rates.nvme_write_bytes_per_s = write_bytes_per_s;
    r.source["nvme_read"] = r.source["nvme_write"] = "measured here (" + budgets.nvme_dir + ")";
  }
}

}  // namespace strata
