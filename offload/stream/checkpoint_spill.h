// Activation checkpoints on NVMe (SSDTrain; DESIGN §8a, offload.checkpoints = "nvme"): the
// input of each layer the backward will fetch is written to a file as the forward produces it
// and read back ahead of the backward, in reverse layer order, overlapped with compute.
//
//   forward, layer j's input:  device --d2h--> pinned ring buffer j % R --file write--> NVMe
//   backward, layer j:         NVMe --file read (issued R layers ahead)--> ring buffer j % R
//                              --h2d--> the device's ping-pong checkpoint buffer
//
// The ring (R pinned buffers of one (N, C) f32 activation each) is a row of the engine's
// buffer table; this class owns the file, the file engine and one worker thread that waits for
// each device copy to land before handing the buffer to the file engine (so neither the trainer
// thread nor the engine's host queue waits on a disk). Per ring buffer: `copied` (recorded on
// d2h after the forward's copy into it) and `consumed` (recorded on h2d after the backward's
// copy out of it) guard its reuse across the device streams; the worker's ticket guards it on
// the host. The bytes go through unchanged, so results are bit-identical to host checkpoints.
//
// File: <run folder>/checkpoints.f32, layer j at j x (capacity rounded up to the block), blocks
// verified by crc32c on every read (io/uring_file.h). Its space is reserved at construction.
#pragma once
#include <atomic>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "io/uring_file.h"
#include "offload/stream/engine_buffers.h"
#include "offload/state/nvme_dir.h"
#include "src/core/task_worker.h"
#include "src/device/device.h"

namespace strata {

class CheckpointSpill {
 public:
  // `ring`: kSpillRing pinned buffers of `capacity_bytes` each (the engine's table rows).
  CheckpointSpill(Device& dev, const std::string& nvme_path, size_t nvme_budget_bytes, size_t layers,
                  size_t capacity_bytes, float* const* ring);
  ~CheckpointSpill();
  CheckpointSpill(const CheckpointSpill&) = delete;
  CheckpointSpill& operator=(const CheckpointSpill&) = delete;

  static size_t host_bytes();  // the file engine's staging (the ring is in the engine's table)

  // forward: the ring buffer for layer j's input, once its previous user is done (blocks the
  // caller; `wait` is what the caller times); then, after the caller's d2h copy into it and
  // its record of copied(j) on the d2h stream, write(j, bytes) queues the file write.
  float* buffer_for_write(size_t layer);
  Event& copied(size_t layer) { return *copied_[layer % kSpillRing]; }
  void write(size_t layer, size_t bytes);
  // backward: queue the read of layer j (after the buffer's previous h2d copy-out); wait for
  // it; the caller copies it out and records consumed(j) on the h2d stream.
  void read_ahead(size_t layer, size_t bytes);
  const float* wait_read(size_t layer);
  Event& consumed(size_t layer) { return *consumed_[layer % kSpillRing]; }

  void drain();  // every queued write and read finished (rethrows the first error)
  uint64_t read_bytes() const;
  uint64_t write_bytes() const;

 private:
  uint64_t offset_of(size_t layer) const { return uint64_t(layer) * stride_; }

  Device& dev_;
  std::shared_ptr<NvmeRunDir> run_dir_;
  size_t stride_ = 0;
  float* ring_[kSpillRing] = {};
  std::unique_ptr<Event> copied_[kSpillRing], consumed_[kSpillRing];
  uint64_t ticket_[kSpillRing] = {};  // the worker task that last used each buffer
  std::unique_ptr<FileEngine> io_;
  int file_ = -1;
  TaskWorker worker_{TaskWorker::AfterError::run_all};  // last: its thread uses everything above
};

}  // namespace strata
