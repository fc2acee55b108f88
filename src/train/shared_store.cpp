// One node's shared host store (shared_store.h).
#include "src/train/shared_store.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>

#include "src/core/error.h"
#include "src/core/tensor.h"

namespace strata {

SharedHostMemory::SharedHostMemory(Comm& comm, size_t bytes, Device* dev) : bytes_(bytes), dev_(dev) {
  char name[64] = {};
  int created = 0;  // node rank 0: 1 once the segment exists and has its size
  if (comm.rank() == 0) {
    std::snprintf(name, sizeof name, "/strata-%d-%08x", int(getpid()), unsigned(std::random_device{}()));
    const int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd >= 0) {
      if (ftruncate(fd, off_t(bytes)) == 0) created = 1;
      else shm_unlink(name);
      close(fd);
    }
  }
  double ok = created;
  comm.broadcast(name, sizeof name, 0).wait();
  comm.broadcast(&ok, sizeof ok, 0).wait();
  STRATA_CHECK(ok == 1, "distributed.shared_host_store: the node's first rank cannot create ", format_bytes(bytes),
               " of POSIX shared memory (/dev/shm too small or not writable?): enlarge /dev/shm (docker: "
               "--shm-size) or set distributed.shared_host_store = false");
  const int fd = shm_open(name, O_RDWR, 0600);
  const int open_errno = errno;
  void* p = fd >= 0 ? mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  if (fd >= 0) close(fd);
  double mapped = p != MAP_FAILED ? 1 : 0;
  comm.all_reduce_sum(&mapped, 1).wait();  // every rank has mapped it (or failed): unlink now
  if (comm.rank() == 0) shm_unlink(name);
  if (p == MAP_FAILED && fd < 0) errno = open_errno;
  STRATA_CHECK(p != MAP_FAILED, "node rank ", comm.rank(), ": cannot map the shared host store ", name, " (",
               std::strerror(errno), "); set distributed.shared_host_store = false");
  STRATA_CHECK(mapped == double(comm.size()), "a rank could not map the shared host store; set "
               "distributed.shared_host_store = false");
  data_ = p;
  if (dev_) registered_ = dev_->register_host(data_, bytes_);
}

SharedHostMemory::~SharedHostMemory() {
  if (registered_) dev_->unregister_host(data_);
  if (data_) munmap(data_, bytes_);
}

}  // namespace strata
