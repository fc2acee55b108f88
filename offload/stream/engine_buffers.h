// The step engine's buffers as one table (STYLE.md §4): every device allocation and every
// pinned host buffer of offload/engine/engine.cpp is a row — name (what it holds, with its shape),
// bytes, memory — built from one EngineShape. The device budget check, the allocation, the
// placement plan (offload/plan/placement_plan.h) and the frees are all loops over these rows, so
// none of them can drift from the others.
//
// Legend: L layers, N token capacity of one micro-batch (max_batch x max_tokens), C hidden,
// V vocab, R lm_head rows per chunk, g micro-batches per pass (1 unless layer-major): a buffer
// marked "g x" holds one row per micro-batch of the pass, micro-batch m at m x (its row size).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "models/layer_kind.h"
#include "models/micro_batch.h"
#include "offload/modes.h"
#include "offload/state/host_store.h"
#include "offload/state/lora.h"

namespace strata {

// Vocab rows per lm_head chunk (engine.h explains the head).
constexpr int64_t kHeadChunkRows = 4096;
// Pinned ring buffers between the device and the checkpoint file with checkpoints = "nvme"
// (offload/stream/checkpoint_spill.h): one being written, one being read ahead, one in use.
constexpr size_t kSpillRing = 3;

// What an engine is built for (offload/plan/placement_plan.h: run_plan_engine_options makes it
// from a RunPlan; tests set it directly).
struct EngineOptions {
  WeightsMode weights = WeightsMode::stream;  // stream | device (never automatic here)
  // offload.resident_layers with weights = stream: decoder layers [0, resident_layers) keep their
  // own device slot (uploaded once after each update, as with "device"), the rest stream through
  // two shared slots. Fewer than L; lm_head streams. 0: every layer streams.
  size_t resident_layers = 0;
  CheckpointMode checkpoints = CheckpointMode::automatic;  // automatic (device while the budget
                                      // allows) | device | host | nvme (files under nvme_dir,
                                      // offload/stream/checkpoint_spill.h)
  RecomputeMode recompute = RecomputeMode::automatic;  // automatic (keep layers' activations, then
                                      // lm_head chunks' logits, while the budget allows, after the
                                      // checkpoints) | always | never (keep every layer's
                                      // activations; logits as automatic)
  std::string nvme_dir;               // offload.nvme_path
  size_t nvme_budget_bytes = 0;       // offload.nvme_memory; 0: free space minus 10%
  int64_t max_batch = 1, max_tokens = 1;
  int64_t head_chunk_rows = 0;        // 0: kHeadChunkRows (tests set it to compare chunkings)
  LoraOptions lora;                   // r > 0: LoRA mode (frozen base, adapters resident; offload/state/lora.h)
  // Micro-batches one pass runs together, layer-major (offload.accumulation = "layer_major": the
  // step's k; 1 = the micro_batch schedule). Every per-micro-batch buffer has this many rows, and
  // each layer keeps this many checkpoints (engine.cpp, "Layer-major passes"). The zeroth-order
  // engine: (micro-batch, perturbation) pairs per run, q x k layer-major (engine_zo.h).
  int64_t group = 1;
  // offload.speculative_update (engine.cpp "Speculation"): a clipped step's AdamW of groups
  // [speculate_first_group, speculate_end_group) starts as each group's gradient lands in the last
  // backward, with their master and moments kept in a host backup to redo the update exactly when
  // the norm clips. Empty (first >= end): none. Group 0 (the embedding, the last to land) never:
  // its update could start no earlier than the norm. RAM groups only, one rank, not LoRA.
  size_t speculate_first_group = 0, speculate_end_group = 0;
  // Mixture-of-experts models: add the load-balancing loss (models/moe_aux_loss.h, router_aux_loss_coef
  // times transformers' load_balancing_loss_func) to each micro-batch's loss and its gradient to the
  // routers (train.router_aux_loss): 1 yes, 0 no, -1 "auto" (the config's output_router_logits).
  // Dense models have none.
  int router_aux_loss = -1;
};

// The sizes every buffer is derived from: the model's, and the capacity of one micro-batch
// (never the current micro-batch's shape).
struct EngineShape {
  WeightsMode weights = WeightsMode::stream;
  CheckpointMode checkpoints = CheckpointMode::automatic;
  RecomputeMode recompute = RecomputeMode::automatic;
  size_t layers = 0;                 // L
  bool tied = false;                 // lm_head is the embedding table
  int64_t C = 0, V = 0;
  int64_t tokens = 0;                // N capacity
  LayerDims layer_capacity;          // B, T = max_batch, max_tokens: sizes the layer workspace
  std::vector<const LayerKind*> layer_kinds;  // the model's, each once: the workspace fits the largest
  // per layer weight slot: one per resident layer (all L with weights = device, the first
  // resident_layers with stream), then min(2, the rest) shared by the streamed layers
  std::vector<size_t> slot_bytes;
  size_t resident_layers = 0;        // layers with their own slot (L with weights = device)
  size_t layer_grad_bytes = 0;       // the largest layer's f32 gradients
  int64_t head_rows = 0;             // R
  size_t head_chunks = 0;            // ceil(V / R)
  size_t head_slots = 0;             // min(2, head_chunks): one chunk has nothing to prefetch
  size_t lm_row_bytes = 0;           // one lm_head row in its working dtype
  size_t rope_floats = 0;            // D/2
  // LoRA mode (lora_bytes > 0): the base is frozen, so there are no layer, embedding, final norm
  // or lm_head gradients to stage; the adapters and their gradients are resident instead.
  size_t lora_bytes = 0;             // the adapters' f32 arena (offload/state/lora.h), 0: not LoRA
  bool frozen() const { return lora_bytes > 0; }
  size_t group = 1;                  // g: micro-batches per pass (EngineOptions::group)

  static EngineShape of(const ModelSpec& spec, const HostStoreLayout& layout, const EngineOptions& options);
  // The slot layer i's weights are uploaded into (weight_slot_of, as the engine's WeightStream).
  size_t layer_slot(size_t i) const;
  size_t activation_bytes() const { return bytes_of<float>(tokens * C); }  // one (N, C) f32
};

// Vocab rows per lm_head chunk: kHeadChunkRows, or V when smaller (or the test override).
int64_t engine_head_chunk_rows(const ModelSpec& spec, const EngineOptions& options);

// Where the engine keeps its buffers. Filled from the table; device pointers unless marked.
struct EngineBuffers {
  std::vector<char*> weight_slots;   // (slot_bytes) a layer's working weights
  float* norm = nullptr;             // (C) final norm weight
  float* norm_grad = nullptr;        // (C) its gradient; LoRA: (max(C, D, H*D)) scratch the frozen norms' gradients go to
  float* lora_weights = nullptr;     // LoRA: (adapter arena) every layer's A and scaled B
  float* lora_grads = nullptr;       // LoRA: (adapter arena) their gradients, accumulated over a step
  float* lora_mb_grads = nullptr;    // LoRA: (adapter arena) one micro-batch's gradients
  float* lora_grad_staging = nullptr;  // LoRA, pinned: (adapter arena) a micro-batch's, data parallel
  char* lm_resident = nullptr;       // weights = device: (V, C) lm_head
  char* head_slots[2] = {};          // weights = stream: (R, C) lm_head chunks
  float* head_grad_slots[2] = {};    // (R, C) f32 lm_head gradient chunks
  double* ce_stats = nullptr;        // g x (N, 3) per-token online-softmax statistics
  char* grad_slots[2] = {};          // f32, one layer's gradients
  char* grad_scratch = nullptr;      // g > 1: f32, one micro-batch's share of a layer's gradients
  float* head_grad_scratch = nullptr;  // g > 1: (R, C) one micro-batch's share of a chunk's gradient
  float* norm_grad_scratch = nullptr;  // g > 1: (C) one micro-batch's share of the final norm's
  float* x_final = nullptr;          // g x (N, C) output of the last layer
  float* x_pp[2] = {};               // g x (N, C) ping-pong for spilled checkpoints
  float* hn = nullptr;               // g x (N, C) final norm output
  float* dhn = nullptr;              // g x (N, C) its gradient
  std::vector<float*> dx;            // g + 1 x (N, C) d hidden: one per micro-batch and a spare
  float* rstd_final = nullptr;       // g x (N) final norm rstd
  int32_t *ids = nullptr, *targets = nullptr, *pos = nullptr, *doc_start = nullptr;  // g x (N) each
  double* loss = nullptr;            // g x (1) summed loss
  float* inv_freq = nullptr;         // (D/2) rope
  void* workspace = nullptr;         // one layer's activations (models/layer_kind.h: the largest kind's)
  float* ckpt_dev = nullptr;         // (device checkpoints, g, N, C) layer inputs kept on the device
  char* kept_activations = nullptr;  // (kept layers, the largest kind's activation bytes) forward activations kept
                                     // for the backward (offload.recompute; models/layer_kind.h)
  float* kept_logits = nullptr;      // (kept chunks, g, engine_kept_logit_floats) lm_head logits the
                                     // stats pass keeps for the backward (offload.recompute)
  // pinned host
  float* x0_host = nullptr;          // g x (N, C) embedding output = checkpoint 0 when spilled
  float* dx0_host = nullptr;         // g x (N, C) d embedding output, scattered on the host
  float* grad_staging[2] = {};       // one layer's f32 gradients
  float* norm_grad_staging = nullptr;     // (C)
  float* head_grad_staging[2] = {};  // (R, C) lm_head gradient chunks
  float* ckpt_host = nullptr;        // (L - device checkpoints, g, N, C) spilled inputs by layer
                                     // (layer 0 spills into x0_host; its row stays unused)
  float* ckpt_ring[kSpillRing] = {}; // checkpoints = "nvme": (N, C) each, between d2h/h2d and the file
};

enum class Memory : uint8_t { device, pinned };

struct EngineBuffer {
  std::string name;                   // what it holds; the arena names allocations with it
  size_t bytes = 0;
  Memory memory = Memory::device;
  std::function<void(void*)> bind;    // stores the allocation in its EngineBuffers field
  void* ptr = nullptr;                // once allocated
};

// Every buffer but the layer checkpoints, in allocation order; rows bind into `into` (may be
// null when only sizes are wanted).
std::vector<EngineBuffer> engine_buffer_table(const EngineShape& shape, EngineBuffers* into);
// The checkpoint rows once the number kept on the device is known: layers [L - count, L)
// keep their input on the device, the others spill to pinned host memory (with checkpoints =
// "nvme": to a file, through kSpillRing pinned buffers).
std::vector<EngineBuffer> engine_checkpoint_table(const EngineShape& shape, size_t device_count,
                                                  EngineBuffers* into);

// offload.recompute: how many layers keep their forward activations (xn1 .. act) on the device
// until their backward, which then skips the recompute — layers [L - count, L), the first the
// backward reaches. "always": 0; "never": L; "auto": as many as fit in device_bytes_left (what
// the budget leaves after every other row and the device checkpoints). One row of count blocks.
size_t engine_kept_activation_layers(const EngineShape& shape, size_t device_bytes_left);
std::vector<EngineBuffer> engine_kept_activation_table(const EngineShape& shape, size_t count, EngineBuffers* into);
// offload.recompute, the head: how many lm_head chunks keep their logits from the stats pass to
// the backward, which then reads them instead of recomputing (one of the chunk backward's three
// matmuls; the same bits) — chunks [K - count, K), the first the backward reaches. "always": 0;
// "auto" and "never": as many as fit in device_bytes_left, what the budget leaves after the kept
// activations (a layer's activations save about as much work per byte, and "never" asks for
// them all). A chunk's logits: g micro-batches of engine_kept_logit_floats each.
size_t engine_kept_logit_floats(const EngineShape& shape);  // N x R, rounded up to 64 floats
size_t engine_kept_logit_chunks(const EngineShape& shape, size_t device_bytes_left);
std::vector<EngineBuffer> engine_kept_logits_table(const EngineShape& shape, size_t count, EngineBuffers* into);

// Allocates every row — device rows from the arena, named name_prefix + name; pinned rows from
// the device's pinned allocator — and binds each. On failure frees the rows it allocated and
// rethrows. engine_buffers_free frees every allocated row (and forgets it).
void engine_buffers_allocate(Device& dev, std::vector<EngineBuffer>& table, const std::string& name_prefix = "");
void engine_buffers_free(Device& dev, std::vector<EngineBuffer>& table);

// A micro-batch's tokens into the device buffers (N each): checked against the capacity
// (shape.layer_capacity's B x T) and the vocabulary (bad input: Error), then copied on the
// compute stream — ids, targets, positions, and the document starts when the micro-batch has them.
struct DeviceTokens {
  int32_t *ids = nullptr, *targets = nullptr, *pos = nullptr, *doc_start = nullptr;
};
void engine_tokens_upload(Device& dev, const EngineShape& shape, const MicroBatch& mb, const DeviceTokens& to);

// The bytes a table takes: device rows as the arena rounds them, pinned rows as asked.
size_t engine_device_bytes(const std::vector<EngineBuffer>& table);
size_t engine_pinned_bytes(const std::vector<EngineBuffer>& table);

// ---- the generator's rows (offload/engine/generator.h) --------------------------------------
// Legend: B rows, Tp longest prompt, Tcap cache positions per row, Hk kv heads, D head dim,
// N = B x Tp, R lm_head rows per chunk (kHeadChunkRows or V), K chunks.

// What the generator's buffers are sized for.
struct GeneratorShape {
  int64_t max_batch = 1;     // rows per pass
  int64_t max_prompt = 1;    // longest prompt (tokens)
  int64_t max_context = 2;   // cache positions per row: max_prompt + max_new_tokens
};

// Where the weights and the KV cache live on the device.
struct GeneratorPlacement {
  bool weights_resident = true;  // false: two weight slots
  size_t kv_device_layers = 0;   // layers [0, n) keep their cache on the device; the rest spill
                                 // to pinned host memory through min(2, L - n) device cache slots
};

// Where the generator keeps its buffers; device pointers unless marked.
struct GeneratorBuffers {
  void* workspace = nullptr;             // one layer's forward activations (B, Tp)
  float *x_a = nullptr, *x_b = nullptr;  // (N, C) each: a pass's input and output, ping-pong
  int32_t* pos = nullptr;                // (N) positions
  int32_t* start = nullptr;              // (B) each row's first position of the pass
  float* inv_freq = nullptr;             // (D/2) rope
  float* final_norm = nullptr;           // (C)
  float *last = nullptr, *hn = nullptr;  // (B, C) each row's last position, its final norm
  float* rstd = nullptr;                 // (B)
  bf16* hn_bf16 = nullptr;               // (B, C) hn as the lm_head matmul reads it with bf16 weights
  float* logits = nullptr;               // (B, R) one chunk's logits
  std::vector<float*> k_cache, v_cache;  // per device layer (B, Tcap, Hk, D)
  std::vector<float*> k_slot, v_slot;    // the spilled layers' device cache slots, (B, Tcap, Hk, D) each
  std::vector<char*> weight_slots;       // two streamed layer slots (one when L = 1), or one per layer
  std::vector<char*> head_slots;         // (R, C) lm_head chunks: two streamed (one when K = 1), or K
  // pinned host
  std::vector<float*> k_host, v_host;    // per spilled layer (B, Tcap, Hk, D)
  float* x_host = nullptr;               // (N, C) the embedding gathered on the host
};

LayerDims generator_layer_dims(const ModelSpec& spec, int64_t B, int64_t T);
int64_t generator_head_rows(const ModelSpec& spec);  // R: kHeadChunkRows, or V when smaller
size_t generator_kv_layer_bytes(const ModelSpec& spec, const GeneratorShape& shape);  // one of k, v: f32
// Every device row, then the pinned rows; rows bind into `into` (may be null for sizes).
std::vector<EngineBuffer> generator_buffer_table(const ModelSpec& spec, const GeneratorShape& shape,
                                                 const GeneratorPlacement& placement, GeneratorBuffers* into);
// The device bytes of the table for `placement`; the least any placement needs (weights
// streamed, the KV cache spilled as far as that saves).
size_t generator_device_bytes(const ModelSpec& spec, const GeneratorShape& shape, const GeneratorPlacement& placement);
size_t generator_min_device_bytes(const ModelSpec& spec, const GeneratorShape& shape);
// Of the placements whose rows fit in `budget_bytes`, the one moving fewest bytes over the link
// per decoded token (ties: more cache on the device); false when none fits.
bool generator_choose_placement(const ModelSpec& spec, const GeneratorShape& shape, size_t budget_bytes,
                                GeneratorPlacement* placement);

}  // namespace strata
