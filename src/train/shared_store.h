// One node's shared host store (distributed.shared_host_store): the ranks map one POSIX
// shared-memory segment holding the HostStore's arrays (working weights, master, moments,
// gradients), so host RAM does not grow with the rank count. Rank 0 creates the segment
// (/dev/shm, named after its pid and a random tag), the name travels by broadcast, every rank
// maps it, and rank 0 unlinks it once all have: nothing is left in /dev/shm whatever happens next.
#pragma once
#include <cstddef>

#include "src/comm/comm.h"

namespace strata {

class SharedHostMemory {
 public:
  SharedHostMemory(Comm& comm, size_t bytes);  // collective: every rank calls it
  ~SharedHostMemory();
  SharedHostMemory(const SharedHostMemory&) = delete;
  SharedHostMemory& operator=(const SharedHostMemory&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace strata
