// Host weights streamed through device slots (DESIGN §3): the protocol the three engines share
// (offload/engine/engine.h, offload/engine/engine_zo.h, offload/engine/generator.h). A block of host weights — one
// layer's group, or one chunk of lm_head rows — is copied into slot `block % slots` on the h2d
// stream while the compute stream works on what another slot holds (layer i+1 crosses while
// layer i computes). A slot is overwritten only after the compute stream has released it, and
// read only after its copy has landed. With as many slots as blocks (resident weights) every
// block is uploaded once and stays until invalidate(). A block the compute stream alone uploads
// and reads (the final norm) is a ResidentBlock.
//
// Events, one pair per slot:
//   event        recorded on (after)         waited by (before)            guards against
//   loaded[s]    h2d (the upload into s)     compute (reading slot s)      reading weights not yet uploaded
//   released[s]  compute (its last read)     h2d (the next upload into s)  overwriting weights still read
// Host side: acquire()'s before_upload runs only when a copy is needed, before it is queued
// (the engines wait there for an optimizer update of the block's working copy). A filled block
// (HostBlock::fill: a derived working copy) is written into the next staging buffer on the
// calling thread, after the copy that last read that buffer has landed (a host wait on its
// event), then copied from there like any other.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "models/layer_kind.h"
#include "offload/state/host_store.h"
#include "src/core/error.h"

namespace strata {

// A block of host weights: `bytes` at `src` (pinned memory of the host store's working copy),
// or, for a layer whose working copy is derived (offload.working_weights = "derived"), `fill`,
// which writes the block's bytes into a staging buffer the stream uploads from.
struct HostBlock {
  const char* src = nullptr;
  size_t bytes = 0;
  std::function<void(char*)> fill;
};

// The slot of `block` when blocks [0, resident) have slots [0, resident) to themselves and the
// others take turns in the `slots - resident` slots after them (offload.resident_layers).
inline size_t weight_slot_of(size_t block, size_t resident, size_t slots) {
  if (block < resident) return block;
  STRATA_ASSERT(slots > resident, "block ", block, " streams, but every one of the ", slots, " slots is resident");
  return resident + (block - resident) % (slots - resident);
}

class WeightStream {
 public:
  // slots: device buffers, each as large as the largest block (none when nothing streams).
  // staging_bytes > 0: the pinned staging of filled blocks, kDerivedStagingBuffers buffers of
  // staging_bytes / kDerivedStagingBuffers bytes (HostStore::derived_staging_bytes), allocated here.
  // resident: blocks [0, resident) have slots [0, resident) to themselves (uploaded once after each
  // invalidate()); the other blocks take turns in the slots after them.
  WeightStream(Device& dev, std::vector<char*> slots, size_t staging_bytes = 0, size_t resident = 0);
  ~WeightStream();
  WeightStream(const WeightStream&) = delete;
  WeightStream& operator=(const WeightStream&) = delete;

  size_t slot_count() const { return slots_.size(); }
  size_t slot_of(size_t block) const { return weight_slot_of(block, resident_, slots_.size()); }

  // Block number `block` (its host copy: `from`) in its slot, the compute stream waiting for it;
  // copied on the h2d stream only when the slot holds something else, after before_upload().
  char* acquire(size_t block, HostBlock from, const std::function<void()>& before_upload = {});
  // The compute stream has queued its last read of `block`: the next upload into its slot may go.
  void release(size_t block);
  // The host copies changed (an optimizer update): no slot holds a current block.
  void invalidate();

 private:
  Device& dev_;
  std::vector<char*> slots_;
  size_t resident_ = 0;
  std::vector<int64_t> held_;  // the block each slot holds (-1: none, or stale)
  std::vector<std::unique_ptr<Event>> loaded_, released_;
  // filled blocks: staging buffer k is refilled only after the copy out of it (staged_[k]) landed
  std::vector<char*> staging_;
  size_t staging_each_ = 0, next_staging_ = 0;
  std::vector<std::unique_ptr<Event>> staged_;
  std::vector<bool> staging_used_;
};

// One host block kept whole on the device (the final norm; lm_head with weights = "device"):
// uploaded on the compute stream the first time it is read after invalidate(). Written and read
// on the compute stream only, so stream order guards it: no events.
class ResidentBlock {
 public:
  ResidentBlock(Device& dev, char* dst) : dev_(dev), dst_(dst) {}
  // The device copy of `from`; uploaded, after before_upload(), when stale.
  char* acquire(HostBlock from, const std::function<void()>& before_upload = {});
  void invalidate() { stale_ = true; }

 private:
  Device& dev_;
  char* dst_;
  bool stale_ = true;
};

// A layer's tensors inside a device block laid out as its parameter group, in its kind's
// parameter order (models/layer_kind.h): weights in the working dtype as the device slot lays
// them out (HostStore::device_table(); an NF4 layer is dequantized there), or f32
// gradients (a gradient slot). Absent tensors are null.
inline const LayerKind& layer_kind(const HostStore& store, size_t layer) { return *store.spec().layers[layer].kind; }
LayerTensors layer_weights_in(const HostStore& store, const char* base, size_t layer);
LayerGradTensors layer_grads_in(const HostStore& store, char* base, size_t layer);

// Blocks of the store's working copy: one layer's group, one tensor, or the lm_head rows of
// chunk `chunk` (`rows` vocab rows per chunk, the last one shorter).
HostBlock layer_host_block(HostStore& store, size_t layer);
HostBlock tensor_host_block(HostStore& store, int64_t row);
HostBlock lm_head_chunk_block(HostStore& store, size_t chunk, int64_t rows);

}  // namespace strata
