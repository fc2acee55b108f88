// The communication layer (DESIGN §8): the collectives a distributed run needs, written once
// against this interface by the engine and the trainers. Implementations:
//   single  one rank; every collective is the identity (no copies, no threads);
//   mpi     OpenMPI over host buffers (comm_mpi.cpp, STRATA_HAVE_MPI): the CPU backend's path,
//           and the one every distributed test runs here under `mpirun -np N`;
//   nccl    NCCL over device buffers on the CUDA backend's streams (comm_nccl.cpp, built with
//           the CUDA backend; tested under tools/cuemu's emulated NCCL, ranks as threads).
//
// Asynchronous like the device's copies: a collective is queued and returns a CommTicket; its
// buffer belongs to the collective until ticket.wait() returns. Buffers live where
// device_buffers() says: device memory for nccl (the collective runs on the given device
// stream, after the work already queued there, so later work on that stream sees the result),
// host memory for mpi and single (the comm's own queue runs collectives in call order; make
// the data ready, e.g. event_synchronize its d2h copy, before the call). Scalar all-reduces
// always take host doubles.
//
// Every rank must issue the same collectives in the same order. A peer that died or hangs
// never hangs the caller: wait() throws a strata::Error (ErrorKind::io, exit code 4) after
// `timeout_s`, naming the rank(s) that did not answer where the transport can tell (mpi names
// them; NCCL cannot tell which peer stalled and says so). After such an error the comm is
// broken: every later collective fails at once with the same message.
//
// Determinism: all-reduce results are bit-identical on every rank and do not depend on timing.
//   mpi:    each element is summed in rank order, ((x0 + x1) + x2) + ..., by the rank that owns
//           its chunk, and the sums are then copied to every rank: bit-equal to the serial
//           left-to-right sum over ranks.
//   nccl:   ncclAllReduce computes each element once (ring/tree) and copies it to all ranks, so
//           ranks agree bit for bit; the order of the additions is NCCL's (fixed for a given
//           topology, NCCL version and NCCL_ALGO/NCCL_PROTO), equal to the serial sum for 2 ranks
//           (a + b = b + a), not in general for more.
#pragma once
#include <cstdint>
#include <cstddef>
#include <memory>
#include <string>

#include "src/device/device.h"

namespace strata {

// Where this process sits in the launch, read from the launcher's environment (OpenMPI's
// OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK, or PMIx's PMIX_RANK with OMPI_COMM_WORLD_SIZE).
// Without a launcher: rank 0 of 1, launched = false.
struct CommLaunch {
  int rank = 0, size = 1, local_rank = 0;
  bool launched = false;
};
CommLaunch comm_launch_from_env();

// distributed.backend (parsed from the recipe by src/recipe/recipe_modes.h).
enum class CommBackend : uint8_t { automatic, nccl, mpi, single };

struct CommOptions {
  CommBackend backend = CommBackend::automatic;
  DeviceBackend device_backend = DeviceBackend::cpu;  // the run's; automatic = nccl for cuda, else mpi
  double timeout_s = 300;              // a collective not done after this long is an error
  Device* device = nullptr;            // nccl: the CUDA device whose streams carry the collectives
};

// One queued collective. wait() blocks until it has completed (throws on timeout or a peer's
// failure); done() asks without blocking. Waiting twice is fine.
class CommWork {
 public:
  virtual ~CommWork() = default;
  virtual void wait() = 0;
  virtual bool done() = 0;
};

class CommTicket {
 public:
  CommTicket() = default;  // an empty ticket is complete
  explicit CommTicket(std::shared_ptr<CommWork> work) : work_(std::move(work)) {}
  void wait() {
    if (work_) work_->wait();
  }
  bool done() { return !work_ || work_->done(); }

 private:
  std::shared_ptr<CommWork> work_;
};

class Comm {
 public:
  virtual ~Comm() = default;
  virtual std::string name() const = 0;  // "single" | "mpi" | "nccl"
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int local_rank() const = 0;    // rank among the ranks of this node
  virtual bool device_buffers() const = 0;

  // data[0, count) <- the sum over ranks of every rank's data[0, count), in place.
  virtual CommTicket all_reduce_sum(float* data, size_t count, Stream s = Stream::compute) = 0;
  // The same for host doubles (losses, token counts, norms); the result is in values once
  // wait() has returned.
  virtual CommTicket all_reduce_sum(double* values, size_t count) = 0;
  // Every rank's data[0, bytes) <- root's.
  virtual CommTicket broadcast(void* data, size_t bytes, int root, Stream s = Stream::compute) = 0;
  // Returns when every rank has called barrier() (or throws after the timeout).
  virtual void barrier() = 0;
  // The comm of this rank's node (DESIGN §8: one host store per node): the ranks that share its
  // memory, or with ranks_per_node > 0 the block of that many consecutive ranks holding this one
  // (several nodes pretended on one machine, distributed.ranks_per_node). Ranks keep their order;
  // the node comm's collectives never mix with this comm's. No collective: every rank knows its
  // node's ranks since the launch. mpi and single only (an error elsewhere).
  virtual std::unique_ptr<Comm> split_node(int ranks_per_node);
};

// Picks the implementation: without a launcher (comm_launch_from_env().launched false) a single
// comm whatever the backend asks; otherwise "auto" = nccl for the cuda device backend, mpi for
// cpu. A backend this build lacks is a clear error (ErrorKind::input).
std::unique_ptr<Comm> comm_create(const CommOptions& options);
std::unique_ptr<Comm> comm_create_single();
// The NCCL comm of this rank on `device` (the cuda backend): rank 0's NCCL unique id is
// broadcast over `bootstrap` (the MPI comm), whose rank, size and node rank it takes; `keep` (may
// be null) is kept alive with it. Throws (ErrorKind::input) when this build has no NCCL or the
// device is not the cuda backend.
std::unique_ptr<Comm> comm_create_nccl_over(Comm& bootstrap, Device& device, double timeout_s,
                                            std::unique_ptr<Comm> keep = nullptr);
// The mpi comm of this process (MPI_Init happens here, on the comm's thread). Throws when the
// build has no MPI.
std::unique_ptr<Comm> comm_create_mpi(double timeout_s);
bool comm_have_mpi();
bool comm_have_nccl();

}  // namespace strata
