// Checkpoints (issue 6): everything a run needs to continue bit-exactly, plus a Hugging Face
// export other tools load. Layout under output_dir:
//
//   checkpoint-<step>/
//     optimizer_state.safetensors   f32 master weights, AdamW exp_avg and exp_avg_sq per parameter
//                                   (in optim.moments_dtype, f32 or bf16; zo-sgd: the master
//                                   alone; the store's needs() say which)
//     trainer_state.json            step, data position (cursor, row count, data hash, RNG state),
//                                   schedule, tokens seen
//     data_order.bin                the current epoch's row order (int64 little-endian)
//     recipe.toml                   the effective recipe
//     hf/                           config.json, safetensors (save_dtype), tokenizer files
//     manifest.json                 size and CRC-32C of every file above, read back after writing
//     COMPLETE                      written last: a checkpoint without it is ignored
//
// Writing is atomic: everything goes to `.checkpoint-<step>.tmp/`, every file and directory is
// fsync'd, the directory is renamed into place, the parent fsync'd, then COMPLETE is written.
// A save that fails (full disk, I/O error) removes its temp dir, leaves earlier checkpoints as
// they were, and throws strata::Error of kind io.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "offload/state/host_store.h"
#include "offload/state/lora.h"
#include "src/core/dtype.h"

namespace strata {

struct TrainState {
  int64_t step = 0;              // optimizer steps done
  int64_t max_steps = 0;         // the run's total when it was saved
  int64_t rows = 0;              // training rows; resume requires the same data
  uint64_t data_hash = 0;        // hash of the training rows' ids and targets
  uint64_t cursor = 0;           // next position in `order`
  std::vector<int64_t> order;    // this epoch's shuffled row order
  std::string rng;               // std::mt19937_64 state, as its operator<< writes it
  int64_t epoch = 0;
  double tokens_seen = 0;
  // How the step's rows were dealt (0 in checkpoints from before these were recorded): the rank
  // count, and the global batch, rows per optimizer step (micro_batch_size x
  // gradient_accumulation_steps x data groups). A resume continues the run exactly when the
  // global batch is the same, whatever the split.
  int64_t ranks = 0;
  int64_t global_batch = 0;
  int64_t micro_batch = 0;    // train.micro_batch_size
  int64_t accumulation = 0;   // train.gradient_accumulation_steps
};

struct CheckpointFiles {
  std::string tokenizer_dir;  // tokenizer.json etc. are copied from here into hf/ ("" = none)
  std::string model_dir;      // generation_config.json is copied from here ("" = none)
  // The chat template training rendered with when the tokenizer has none of its own (the
  // built-in ChatML): written into the exported tokenizer_config.json so the model is
  // prompted as it was trained ("" = the tokenizer's own template, or no chat data).
  std::string chat_template;
};

// Writes output_dir/checkpoint-<state.step> and prunes to the newest keep_last (0 = keep all).
// Returns the checkpoint's path. LoRA (`lora` given): the base is frozen and not saved (it is
// model.path); optimizer_state.safetensors holds the adapters' master, exp_avg and exp_avg_sq
// (PEFT names) and adapter/ (a PEFT adapter dir) replaces hf/.
std::string checkpoint_save(const std::string& output_dir, const HostStore& store, const TrainState& state,
                            const std::string& recipe_toml, DType save_dtype, const CheckpointFiles& files,
                            int64_t keep_last, const LoraStore* lora = nullptr);

// About the bytes one checkpoint_save writes (the state file, hf/ or adapter/, the data order):
// what `strata train` compares with the output dir's free space before step 1.
size_t checkpoint_bytes_estimate(const HostStore& store, DType save_dtype, size_t order_rows,
                                 const LoraStore* lora = nullptr);

// The newest complete checkpoint-<step> under output_dir; "" when there is none. Removes
// leftover temp dirs of saves that were interrupted.
std::string checkpoint_find_latest(const std::string& output_dir);

// Restores master and working weights and the moments into `store` and returns the trainer
// state. The checkpoint must match the store's parameters (names and shapes) exactly. Before
// anything is used, every file is checked against manifest.json (size and CRC-32C) and the data
// position against itself (the row order a permutation of the saved row count, the cursor
// inside it): a damaged checkpoint is an Error (exit 2) naming the file and the older
// checkpoints to resume from instead.
// LoRA: the adapters' state goes into `lora` (the base store is left as loaded from model.path).
// The batch split of a checkpoint's run (TrainState's ranks, global_batch, micro_batch and
// accumulation; zeros when its trainer_state.json does not say), read before the model is set
// up so that a resumed run keeps it. Nothing is verified here: checkpoint_load does that.
TrainState checkpoint_batch_split(const std::string& dir);

TrainState checkpoint_load(const std::string& dir, HostStore& store, LoraStore* lora = nullptr);

// An HF model dir: config.json, safetensors in `dtype`, tokenizer files copied. Atomic the same
// way (temp dir, fsync, rename; an existing dir of that name is replaced only after the new
// one is complete).
void export_hf_atomic(const HostStore& store, const std::string& dir, DType dtype, const CheckpointFiles& files);

// LoRA's export under dir: adapter/ (a PEFT adapter dir: adapter_config.json naming files.model_dir
// as the base, adapter_model.safetensors, the tokenizer files), and with merge also merged/ (an HF
// model dir of W + (alpha / r) B A, offload/state/lora.h: lora_merge_into). Each written atomically.
// With merge the store's working copy holds the merged weights afterwards.
void lora_export(const LoraStore& lora, HostStore& store, const std::string& dir, bool merge, DType dtype,
                 const CheckpointFiles& files);

}  // namespace strata
