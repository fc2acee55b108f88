#include "offload/stream/checkpoint_spill.h"

#include <cstring>
#include <vector>

#include "src/core/error.h"
#include "src/core/tensor.h"

namespace strata {
namespace {

FileEngineOptions spill_engine_options() {
  FileEngineOptions fo;
  fo.block_bytes = size_t(1) << 20;
  fo.queue_depth = 8;
  return fo;
}

}  // namespace

size_t CheckpointSpill::host_bytes() { return FileEngine::staging_bytes(spill_engine_options()); }

CheckpointSpill::CheckpointSpill(Device& dev, const std::string& nvme_path, size_t budget_bytes, size_t layers,
                                 size_t capacity_bytes, float* const* ring)
    : dev_(dev) {
  STRATA_CHECK(!nvme_path.empty(), "offload.checkpoints = \"nvme\" needs offload.nvme_path: set it to a "
               "directory on a fast local disk");
  const FileEngineOptions fo = spill_engine_options();
  stride_ = (capacity_bytes + fo.block_bytes - 1) / fo.block_bytes * fo.block_bytes;
  run_dir_ = NvmeRunDir::acquire(nvme_path);
  const size_t file_bytes = layers * stride_;
  run_dir_->reserve(file_bytes, nvme_budget_bytes(budget_bytes, nvme_path), "the activation checkpoints");
  for (size_t k = 0; k < kSpillRing; ++k) {
    ring_[k] = ring[k];
    copied_[k] = dev_.event_create();
    consumed_[k] = dev_.event_create();
  }
  io_ = std::make_unique<FileEngine>(fo);
  const std::string path = run_dir_->path() + "/checkpoints.f32";
  file_ = io_->open(path, FileOpen::create);
  // full size first (the last block written; the ones before are holes that read as zeros),
  // so the engine never truncates the reservation below
  const std::vector<char> zeros(fo.block_bytes, 0);
  io_->wait(io_->write(file_, file_bytes - fo.block_bytes, zeros.data(), zeros.size()));
  io_->wait(io_->sync(file_));
  nvme_file_reserve(path, file_bytes);
}

CheckpointSpill::~CheckpointSpill() {
  worker_.drain_quiet();
  try {
    io_->close(file_);
  } catch (...) {  // removed with the run folder next
  }
}

float* CheckpointSpill::buffer_for_write(size_t layer) {
  const size_t k = layer % kSpillRing;
  if (ticket_[k]) worker_.wait(ticket_[k]);
  ticket_[k] = 0;
  return ring_[k];
}

void CheckpointSpill::write(size_t layer, size_t bytes) {
  const size_t k = layer % kSpillRing;
  ticket_[k] = worker_.enqueue([this, k] { dev_.event_synchronize(*copied_[k]); },
                               [this, k, layer, bytes] { io_->wait(io_->write(file_, offset_of(layer), ring_[k], bytes)); });
}

void CheckpointSpill::read_ahead(size_t layer, size_t bytes) {
  const size_t k = layer % kSpillRing;
  ticket_[k] = worker_.enqueue([this, k] { dev_.event_synchronize(*consumed_[k]); },
                               [this, k, layer, bytes] { io_->wait(io_->read(file_, offset_of(layer), ring_[k], bytes)); });
}

const float* CheckpointSpill::wait_read(size_t layer) {
  const size_t k = layer % kSpillRing;
  STRATA_ASSERT(ticket_[k], "checkpoint of layer ", layer, " was not read ahead");
  worker_.wait(ticket_[k]);
  ticket_[k] = 0;
  return ring_[k];
}

void CheckpointSpill::drain() {
  worker_.drain();
  for (auto& t : ticket_) t = 0;
}

uint64_t CheckpointSpill::read_bytes() const { return io_->stats().read_bytes; }
uint64_t CheckpointSpill::write_bytes() const { return io_->stats().write_bytes; }

}  // namespace strata
