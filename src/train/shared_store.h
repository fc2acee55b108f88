// One node's shared host store (distributed.shared_host_store): the ranks of a node map one POSIX
// shared-memory segment holding the HostStore's arrays (working weights, master, moments,
// gradients), so host RAM does not grow with the rank count. `node` is the node's comm
// (Comm::split_node): its rank 0 creates the segment (/dev/shm, named after its pid and a random
// tag), the name travels by broadcast, every rank of the node maps it, and node rank 0 unlinks it
// once all have: nothing is left in /dev/shm whatever happens next. Each node has its own.
//
// With `dev`, each rank page-locks its mapping for the device's async copies
// (Device::register_host: cudaHostRegister on the cuda backend; pageable with a warning where
// that fails) and unlocks it before unmapping.
#pragma once
#include <cstddef>

#include "src/comm/comm.h"

namespace strata {

class SharedHostMemory {
 public:
  SharedHostMemory(Comm& node, size_t bytes, Device* dev = nullptr);  // collective over the node
  ~SharedHostMemory();
  SharedHostMemory(const SharedHostMemory&) = delete;
  SharedHostMemory& operator=(const SharedHostMemory&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  bool pinned() const { return registered_; }  // registered with dev

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device* dev_ = nullptr;
  bool registered_ = false;
};

}  // namespace strata
