// The NCCL comm (comm.h): device buffers, collectives on the CUDA backend's streams. Built with
// the CUDA backend when NCCL is found (STRATA_HAVE_NCCL) and, for tests, by g++ against
// tools/cuemu's emulated NCCL, where the ranks are threads of one process.
#pragma once
#include <memory>

#include "src/comm/comm.h"

namespace strata {

// ncclUniqueId's bytes: made by rank 0 (comm_nccl_unique_id) and handed to every rank (over
// MPI by comm_create, by the test itself when the ranks are threads).
struct CommNcclId {
  char bytes[128];
};
CommNcclId comm_nccl_unique_id();

// Joins the NCCL communicator `id` as `rank` of `size` (blocks until all ranks have joined).
// `device` must be the CUDA backend (its streams carry the collectives) and the calling
// thread's current CUDA device its GPU. `bootstrap` (may be null) is kept alive with the comm.
std::unique_ptr<Comm> comm_create_nccl(Device& device, int rank, int size, int local_rank,
                                       const CommNcclId& id, double timeout_s,
                                       std::unique_ptr<Comm> bootstrap = nullptr);

}  // namespace strata
