// The device interface (DESIGN §5): CUDA-shaped and asynchronous. Every copy and op is
// enqueued on a stream and returns at once; ordering across streams is expressed with
// events only. The engine is written once against this interface; the CPU backend
// (cpu_device.cpp) runs streams as worker threads, the CUDA backend (issue 5) maps it to
// CUDA streams. Pointers passed to ops are device pointers from alloc(); int arrays
// (ids, positions, targets, doc starts) are device arrays too.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "src/core/dtype.h"
#include "src/device/peak_flops.h"

namespace strata {

enum class Stream : uint8_t { compute = 0, h2d = 1, d2h = 2 };
constexpr int kStreamCount = 3;

// An event marks a point in one stream's queue. record() moves the mark; wait() makes another
// stream (or the host, via synchronize) block until the work before the mark has finished.
class Event {
 public:
  virtual ~Event() = default;
};

// device.backend (parsed from the recipe by src/recipe/recipe_modes.h); automatic: the CPU.
enum class DeviceBackend : uint8_t { cpu, cuda, automatic };

struct DeviceOptions {
  DeviceBackend backend = DeviceBackend::cpu;
  size_t memory_bytes = 512ull << 20;  // the device arena budget
  double link_bytes_per_s = 0;        // CPU backend: throttle host<->device copies (0 = off)
};

// The CUDA backend's cuBLAS workspace, per stream that runs matmuls (only the compute stream).
inline constexpr size_t kCudaCublasWorkspaceBytes = size_t(8) << 20;
// The arena bytes the CUDA backend takes for itself at a training step's first GEMM and first
// lm_head loss over chunks of vc vocab rows at hidden size c: the cuBLAS workspace and the
// lm_head_ce workspace (Device::pending_workspace_bytes and pending_lm_head_ce_workspace_bytes
// until then). The placement plan counts them for a CUDA device.
size_t cuda_backend_workspace_bytes(int64_t c, int64_t vc);
// The CPU backend's kernels keep scratch on the compute stream's thread from one call to the
// next, outside the arena (kernels/cpu/ops.h: attention's bf16 input copies and kept dS, the
// lm_head loss's row tiles, each kernel thread's GEMM tile buffers: the product before beta = 1
// adds it, and the widened bf16 tiles on a CPU without native bf16 GEMMs), at most this much for micro-batches of b rows of t tokens, h query and hk kv
// heads of size d, hidden size c, intermediate size f, lm_head chunks of vc rows, dtype the
// matrices'. The placement plan counts it as host memory.
struct CpuScratchShape {
  int64_t b = 0, t = 0, h = 0, hk = 0, d = 0, c = 0, vc = 0, f = 0;
  DType dtype = DType::f32;
};
// threads: the kernel thread count it is for (0: device.cpu_threads as set, cpu_threads_count()).
size_t cpu_backend_scratch_bytes(const CpuScratchShape& shape, int threads = 0);
// The CPU backend's attention kernel, by name (amx_bf16, avx512_bf16 or portable: the best this
// CPU offers, or STRATA_ATTENTION_ISA's choice), for the run's start lines and benchmarks.
const char* cpu_backend_attention_kernel();

// Op families, for the per-op time split the trainer reports (matmul share, attention, ...).
enum class OpKind : uint8_t { matmul, attention, cross_entropy, norm, rope, elementwise, embedding, count };
const char* op_kind_name(OpKind k);

struct DeviceCounters {
  size_t h2d_bytes = 0, d2h_bytes = 0;
  double h2d_busy_s = 0, d2h_busy_s = 0, compute_busy_s = 0;
  double op_s[int(OpKind::count)] = {};  // time spent in each op family (all streams)
  double stream_wait_s[kStreamCount] = {};  // time each stream spent blocked on events
};

class Device {
 public:
  virtual ~Device() = default;
  virtual std::string name() const = 0;

  // ---- memory ----
  virtual void* alloc(size_t bytes, const std::string& tensor) = 0;  // budgeted arena
  virtual void free(void* p) = 0;
  virtual size_t budget_bytes() const = 0;
  virtual size_t used_bytes() const = 0;
  virtual size_t peak_bytes() const = 0;
  virtual void reset_peak() = 0;
  // Host memory usable by async copies. When pinning fails (cudaMallocHost out of pinned
  // memory; STRATA_FAKE_PINNED_FAIL=1 in the environment simulates it on either backend) the
  // allocation falls back to pageable memory, with one warning per device on stderr that states
  // the cost; host_is_pinned() then says false for it and pageable_fallback_bytes() counts it.
  virtual void* alloc_pinned(size_t bytes) = 0;
  virtual void free_pinned(void* p) = 0;
  virtual bool host_is_pinned(const void* p) const = 0;
  virtual size_t pageable_fallback_bytes() const = 0;
  // Page-locks host memory the caller owns (e.g. a node's shared host store,
  // src/train/shared_store.h) for async copies, as alloc_pinned's is (cuda: cudaHostRegister).
  // False where pinning fails (the same one warning as alloc_pinned's fallback): the copies then
  // go through pageable memory, correct but slower. The cpu backend has nothing to lock: true
  // (false under STRATA_FAKE_PINNED_FAIL=1). unregister_host(p) before the memory goes, for each
  // registration that returned true.
  virtual bool register_host(void* p, size_t bytes) = 0;
  virtual void unregister_host(void* p) = 0;

  // ---- streams, events, copies ----
  virtual std::unique_ptr<Event> event_create() = 0;
  virtual void event_record(Event& e, Stream s) = 0;
  virtual void stream_wait_event(Stream s, Event& e) = 0;
  virtual void event_synchronize(Event& e) = 0;
  virtual void stream_synchronize(Stream s) = 0;
  void synchronize() {
    for (int s = 0; s < kStreamCount; ++s) stream_synchronize(Stream(s));
  }
  virtual void copy_h2d(void* dst, const void* src, size_t bytes, Stream s) = 0;
  virtual void copy_d2h(void* dst, const void* src, size_t bytes, Stream s) = 0;
  virtual void copy_d2d(void* dst, const void* src, size_t bytes, Stream s) = 0;
  virtual void memset_zero(void* dst, size_t bytes, Stream s) = 0;
  virtual DeviceCounters counters() const = 0;
  // Peak dense matmul FLOP/s for inputs of `ab` (f32 or bf16), the MFU denominator
  // (src/device/peak_flops.h): measured on the CPU backend, a datasheet entry or a measured
  // cuBLAS GEMM on CUDA. Call it while the device is idle (it may run GEMMs); cached.
  virtual DevicePeak peak_flops(DType ab) = 0;
  // The backend's own handle of stream s (a cudaStream_t on the CUDA backend, null on the CPU
  // backend), for libraries that enqueue work on it: the NCCL comm (src/comm).
  virtual void* native_stream(Stream s) { return nullptr; }
  // Device memory the backend will still take from the budget at the first op on stream s (the
  // CUDA backend's cuBLAS workspace, 8 MiB per stream that runs matmuls, allocated at its first
  // GEMM; 0 after that, and on the CPU backend). A planner that fills the budget leaves it free.
  virtual size_t pending_workspace_bytes(Stream s) const { return 0; }
  // Likewise what the chunked lm_head loss over vc vocab rows at hidden size c will still take
  // (the CUDA backend's lm_head_ce workspace, grown at its first call; 0 on the CPU backend).
  virtual size_t pending_lm_head_ce_workspace_bytes(int64_t c, int64_t vc) const { return 0; }

  // ---- ops (kernels/cpu/ops.h documents shapes and semantics) ----
  // One argument order everywhere (STYLE.md §2), as in kernels/cpu/ops.h, kernels/cuda/ops.h
  // and models/decoder_layer.h: outputs, inputs, saved tensors, sizes, then the stream.
  virtual void matmul(float* c, const void* a, const void* b, DType ab, int64_t m,
                      int64_t n, int64_t k, bool trans_a, bool trans_b, float beta, Stream s) = 0;
  virtual void rmsnorm_forward(float* out, float* rstd, const float* in,
                               const float* weight, int64_t n, int64_t c, float eps, Stream s) = 0;
  // The same, also writing out rounded to bf16 into out_b for the bf16 matmuls that read it (one
  // pass where rmsnorm_forward and cast_f32_to_bf16 made two; the same bits).
  virtual void rmsnorm_forward_bf16(float* out, bf16* out_b, float* rstd, const float* in, const float* weight,
                                    int64_t n, int64_t c, float eps, Stream s) = 0;
  virtual void rmsnorm_backward(float* din, float* dweight, const float* dout,
                                const float* in, const float* weight, const float* rstd,
                                int64_t n, int64_t c, Stream s) = 0;
  // rot: the leading dims of each head that turn (even, <= d; partial_rotary_factor), the rest pass
  virtual void rope_forward(float* out, const float* in, const int32_t* pos,
                            const float* inv_freq, int64_t n, int64_t nh, int64_t d, int64_t rot, Stream s) = 0;
  virtual void rope_backward(float* din, const float* dout, const int32_t* pos,
                             const float* inv_freq, int64_t n, int64_t nh, int64_t d, int64_t rot, Stream s) = 0;
  virtual void swiglu_forward(float* out, const float* gate, const float* up,
                              int64_t n, Stream s) = 0;
  // The same, also writing out rounded to bf16 into out_b (as rmsnorm_forward_bf16).
  virtual void swiglu_forward_bf16(float* out, bf16* out_b, const float* gate, const float* up, int64_t n,
                                   Stream s) = 0;
  virtual void swiglu_backward(float* dgate, float* dup, const float* dout,
                               const float* gate, const float* up, int64_t n, Stream s) = 0;
  // The same gradients rounded to bf16, for the bf16 matmuls that read them (one pass where
  // swiglu_backward and two cast_f32_to_bf16 made three).
  virtual void swiglu_backward_bf16(bf16* dgate, bf16* dup, const float* dout, const float* gate,
                                    const float* up, int64_t n, Stream s) = 0;
  virtual void bias_forward(float* y, const float* b, int64_t n, int64_t o, Stream s) = 0;
  virtual void bias_backward(float* db, const float* dy, int64_t n, int64_t o, Stream s) = 0;
  virtual void embedding_forward(float* out, const void* table, DType table_type,
                                 const int32_t* ids, int64_t n, int64_t c, Stream s) = 0;
  virtual void embedding_backward(float* dtable, const float* dout,
                                  const int32_t* ids, int64_t n, int64_t c, Stream s) = 0;
  // Causal GQA attention (kernels/cpu/ops.h). window > 0: a sliding window, query t sees keys
  // s > t - window only; 0: no window. On CUDA,
  // dot_type bf16 runs on tensor cores (kernels/cuda/attention_tc.cu), f32 on CUDA cores.
  virtual void attention_forward(float* out, float* lse, const float* q,
                                 const float* k, const float* v, const int32_t* doc_start,
                                 int64_t b, int64_t t, int64_t h, int64_t hk, int64_t d,
                                 float scale, DType dot_type, Stream s,
                                 int64_t window = 0) = 0;
  virtual void attention_backward(float* dq, float* dk, float* dv, const float* dout,
                                  const float* q, const float* k, const float* v,
                                  const float* out, const float* lse, const int32_t* doc_start,
                                  int64_t b, int64_t t, int64_t h, int64_t hk, int64_t d,
                                  float scale, DType dot_type, Stream s,
                                  int64_t window = 0) = 0;
  // Generation (offload/engine/generator.h): queries continuing each row against a KV cache,
  // kernels/cpu/attention_cached.h. q (B,Tq,H,D), caches (B,Tcap,Hk,D), start (B) device ints;
  // dot_type as attention_forward's (bf16: q, k, v rounded to bf16 as read); window as there.
  virtual void attention_cached_forward(float* out, const float* q, const float* k_cache,
                                        const float* v_cache, const int32_t* start, int64_t b,
                                        int64_t tq, int64_t tcap, int64_t h, int64_t hk, int64_t d,
                                        float scale, DType dot_type, Stream s, int64_t window = 0) = 0;
  // lm_head + cross-entropy with lm_head in vocab chunks (ops.h: lm_head_ce_chunk_*; the whole
  // vocabulary is the one-chunk case v0 = 0, vc = V):
  // w_chunk (vc,C) holds vocab rows [v0, v0 + vc) of the (V,C) lm_head, stats (N,3) double the
  // rows' online-softmax statistics (first = this chunk initialises them). The backward pass
  // accumulates dh (N,C) and dw_chunk (vc,C); the loss adds the summed loss into *loss_sum.
  // Kept logits (offload.recompute): keep_logits (N, vc, device) not null, the stats pass leaves
  // the chunk's logits there; the backward given them as kept_logits reads them instead of
  // recomputing (one of its three matmuls) and overwrites them. Same bits as a recompute.
  virtual void lm_head_ce_chunk_stats(double* stats, const float* h, const void* w_chunk,
                                      DType w_type, const int32_t* targets, int64_t n, int64_t c,
                                      int64_t v, int64_t v0, int64_t vc, bool first, float* keep_logits,
                                      Stream s) = 0;
  // The stats pass with each row's softmax entropy as well (GRPO's `entropy` metric; ops.h:
  // lm_head_ce_chunk_stats_entropy): stats as lm_head_ce_chunk_stats (the same bits), and ent (N)
  // = Σ exp(z - max) (z - max) over the chunks so far, rescaled as the max moves (first: set);
  // row i's entropy is then H = log(sum) - ent / sum (sum = stats[3 i + 1]). Ignored rows: 0.
  virtual void lm_head_ce_chunk_stats_entropy(double* stats, double* ent, const float* h, const void* w_chunk,
                                              DType w_type, const int32_t* targets, int64_t n, int64_t c,
                                              int64_t v, int64_t v0, int64_t vc, bool first, float* keep_logits,
                                              Stream s) = 0;
  virtual void lm_head_ce_stats_loss(double* loss_sum, const double* stats,
                                     const int32_t* targets, int64_t n, int64_t v, Stream s) = 0;
  virtual void lm_head_ce_chunk_backward(float* dh, float* dw_chunk, const float* h,
                                         const void* w_chunk, DType w_type, const double* stats,
                                         const int32_t* targets, int64_t n, int64_t c, int64_t v,
                                         int64_t v0, int64_t vc, float grad_scale, float* kept_logits,
                                         Stream s) = 0;
  // The preference objectives' head (ops.h: lm_head_ce_stats_seq_sums and
  // lm_head_ce_chunk_backward_weighted): per-sequence {Σ log p, count} (num_seqs, 2) from the
  // final stats, seq (N) naming each row's sequence (-1: none); and the chunk backward with row
  // i's dlogits scaled by token_weight[i] * grad_scale.
  virtual void lm_head_ce_stats_seq_sums(double* seq_sums, const double* stats, const int32_t* targets,
                                         const int32_t* seq, int64_t n, int64_t v, int64_t num_seqs,
                                         Stream s) = 0;
  virtual void lm_head_ce_chunk_backward_weighted(float* dh, float* dw_chunk, const float* h,
                                                  const void* w_chunk, DType w_type, const double* stats,
                                                  const int32_t* targets, const float* token_weight,
                                                  int64_t n, int64_t c, int64_t v, int64_t v0, int64_t vc,
                                                  float grad_scale, float* kept_logits, Stream s) = 0;
  // Mixture of experts (kernels/cpu/ops.h, kernels/cpu/ref/moe.h): out (N,C) += sum over token
  // t's k routed rows r = token_row[t*k + j] of w[r] y[r] (w null: 1), in j order; and its
  // backward dy (M,C) = w[r] dout[row_token[r]], dw (M) = dout[row_token[r]] . y[r] (dw null: none).
  virtual void moe_combine_forward(float* out, const float* y, const float* w, const int32_t* token_row, int64_t n,
                                   int64_t k, int64_t c, Stream s) = 0;
  virtual void moe_combine_backward(float* dy, float* dw, const float* dout, const float* y, const float* w,
                                    const int32_t* row_token, int64_t m, int64_t c, Stream s) = 0;
  virtual void add_inplace(float* y, const float* x, int64_t n, Stream s) = 0;
  // Gemma (models/gemma_layer.h): GeGLU out = gelu_tanh(gate) * up and its backward (ops.h), and
  // y = a x + b elementwise (y may be x).
  virtual void geglu_forward(float* out, const float* gate, const float* up, int64_t n, Stream s) = 0;
  virtual void geglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                              int64_t n, Stream s) = 0;
  virtual void affine(float* y, const float* x, float a, float b, int64_t n, Stream s) = 0;
  virtual void cast_f32_to_bf16(bf16* out, const float* in, int64_t n, Stream s) = 0;
  // NF4 dequantization (kernels/cpu/nf4.h; a frozen base of lora.base_dtype = "nf4", dequantized
  // into its layer's slot): w (n) = bf16(NF4[code] · absmax[i/64]), codes (ceil(n/2)); with
  // qabsmax non-null the absmax are first dequantized from the double quantization: qabsmax
  // (ceil(n/64)), absmax the nested absmax (ceil(n/64/256)), offset their mean (a host scalar).
  // w_type bf16, or f32 holding the same bf16 values widened (an f32 base: `strata grad --dtype
  // f32`, the exact check against fp64 goldens). bitsandbytes' bits on every backend.
  virtual void nf4_dequantize(void* w, DType w_type, const uint8_t* codes, const uint8_t* qabsmax, const float* absmax,
                              float offset, int64_t n, Stream s) = 0;

  // ---- zeroth-order perturbations (kernels/cpu/zo.h; the same bits on every backend) ----
  // z (n) = z(seed, tensor, offset + i), the Gaussian of kernels/common/zo_rng.h.
  virtual void zo_generate(float* z, uint64_t seed, uint32_t tensor, uint64_t offset, int64_t n,
                           Stream s) = 0;
  // p (n, f32 or bf16) += scale * z(seed, tensor, offset + i), in f32 (bf16 rounded once).
  virtual void zo_perturb(void* p, DType p_type, uint64_t seed, uint32_t tensor, uint64_t offset,
                          float scale, int64_t n, Stream s) = 0;

  // ---- LoRA dropout (kernels/cpu/dropout.h; the same mask and bits on every backend) ----
  // out (n) = mask(seed, tensor, i) · in / (1 − p), or out += that when accumulate: the mask of
  // kernels/common/dropout_mask.h, element i of the call being element i of the tensor.
  virtual void dropout_apply(float* out, const float* in, uint64_t seed, uint32_t tensor, double p, int64_t n,
                             bool accumulate, Stream s) = 0;
};

// The bookkeeping both backends share: device allocations carved from one reserved block by a
// budgeted Arena under a lock (a backend reserves the block, calls arena_init, and adds its
// own poisoning in alloc()), and the pinned host allocations that fell back to pageable memory.
class ArenaDevice : public Device {
 public:
  ArenaDevice();
  ~ArenaDevice() override;
  void free(void* p) override;
  size_t budget_bytes() const override;
  size_t used_bytes() const override;
  size_t peak_bytes() const override;
  void reset_peak() override;
  bool host_is_pinned(const void* p) const override;
  size_t pageable_fallback_bytes() const override;

 protected:
  void arena_init(char* base, size_t bytes);
  char* arena_alloc(size_t bytes, const std::string& tensor);
  // Pinned allocation failed (`why`: the runtime's error): pageable memory instead, recorded,
  // and the cost said once.
  void* pageable_fallback_alloc(size_t bytes, const std::string& why);
  void pageable_warning(size_t bytes, const std::string& why);  // said once per device
  bool pageable_fallback_free(void* p);  // true when p was a fallback (and is now freed)
  bool pinned_fail_forced() const { return pinned_fail_forced_; }  // STRATA_FAKE_PINNED_FAIL=1

 private:
  mutable std::mutex arena_mu_;
  std::unique_ptr<class Arena> arena_;
  bool pinned_fail_forced_ = false;
  bool pageable_warned_ = false;
  size_t pageable_bytes_ = 0;
  std::map<const void*, size_t> pageable_;  // fallback allocations -> bytes
};

// Creates the backend named in options; a clear error when it is unavailable.
std::unique_ptr<Device> device_create(const DeviceOptions& options);

}  // namespace strata
