// The single comm, the launch environment and the factory (comm.h).
#include "src/comm/comm.h"

#include <cstdlib>
#include <string>

#include "src/core/error.h"
#if defined(STRATA_HAVE_NCCL)
#include "src/comm/comm_nccl.h"
#endif

namespace strata {
namespace {

// -1 when unset; a clear error when set to something that is not a number.
int env_rank_number(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return -1;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  STRATA_CHECK(*end == '\0' && x >= 0 && x < (1 << 24), "environment variable ", name, "='", v,
               "' is not a rank number; launch strata with mpirun, or unset it");
  return int(x);
}

class SingleComm final : public Comm {
 public:
  std::string name() const override { return "single"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  bool device_buffers() const override { return false; }
  CommTicket all_reduce_sum(float*, size_t, Stream) override { return {}; }
  CommTicket all_reduce_sum(double*, size_t) override { return {}; }
  CommTicket broadcast(void*, size_t, int root, Stream) override {
    STRATA_ASSERT(root == 0, "broadcast root ", root, " of a single comm");
    return {};
  }
  void barrier() override {}
  std::unique_ptr<Comm> split_node(int) override { return std::make_unique<SingleComm>(); }
};

}  // namespace

std::unique_ptr<Comm> Comm::split_node(int) {
  STRATA_CHECK(false, "the ", name(), " comm cannot be split by node; split the MPI comm it was bootstrapped over");
  return nullptr;
}

CommLaunch comm_launch_from_env() {
  CommLaunch l;
  int rank = env_rank_number("OMPI_COMM_WORLD_RANK");
  if (rank < 0) rank = env_rank_number("PMIX_RANK");
  const int size = env_rank_number("OMPI_COMM_WORLD_SIZE");
  const int local = env_rank_number("OMPI_COMM_WORLD_LOCAL_RANK");
  if (rank < 0 && size < 0) return l;
  STRATA_CHECK(rank >= 0 && size >= 1 && rank < size, "the launcher's environment says rank ",
               rank, " of ", size, " (OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE); launch strata "
               "with mpirun, or unset them");
  l.rank = rank;
  l.size = size;
  l.local_rank = local >= 0 ? local : 0;
  l.launched = true;
  return l;
}

std::unique_ptr<Comm> comm_create_single() { return std::make_unique<SingleComm>(); }

bool comm_have_mpi() {
#if defined(STRATA_HAVE_MPI)
  return true;
#else
  return false;
#endif
}

bool comm_have_nccl() {
#if defined(STRATA_HAVE_NCCL)
  return true;
#else
  return false;
#endif
}

#if !defined(STRATA_HAVE_MPI)
std::unique_ptr<Comm> comm_create_mpi(double) {
  STRATA_CHECK(false, "this strata was built without MPI: install OpenMPI (Debian: "
               "libopenmpi-dev openmpi-bin, scripts/setup.sh) and rebuild");
  return nullptr;
}
#endif

std::unique_ptr<Comm> comm_create(const CommOptions& options) {
  const CommBackend b = options.backend;
  STRATA_CHECK(options.timeout_s > 0, "distributed.timeout must be positive (got ",
               options.timeout_s, " s)");
  const CommLaunch launch = comm_launch_from_env();
  if (!launch.launched || b == CommBackend::single) {
    STRATA_CHECK(!launch.launched || launch.size == 1, "distributed.backend = 'single' but the "
                 "launcher started ", launch.size, " ranks; use auto, mpi or nccl");
    return comm_create_single();
  }
  const bool cuda = options.device_backend == DeviceBackend::cuda;
  const bool nccl = b == CommBackend::nccl || (b == CommBackend::automatic && cuda);
  if (!nccl) return comm_create_mpi(options.timeout_s);

  STRATA_CHECK(cuda && options.device,
               "distributed.backend = 'nccl' needs the cuda device backend (device.backend = "
               "\"cuda\"); use mpi with the cpu backend");
  // NCCL's unique id travels over MPI; the MPI comm stays as the NCCL comm's bootstrap.
  std::unique_ptr<Comm> mpi = comm_create_mpi(options.timeout_s);
  Comm& bootstrap = *mpi;
  return comm_create_nccl_over(bootstrap, *options.device, options.timeout_s, std::move(mpi));
}

std::unique_ptr<Comm> comm_create_nccl_over(Comm& bootstrap, Device& device, double timeout_s,
                                            std::unique_ptr<Comm> keep) {
  STRATA_CHECK(device.native_stream(Stream::compute) != nullptr, "distributed.backend = \"nccl\" needs the "
               "cuda device backend (device ", device.name(), " has no CUDA streams); use mpi with the cpu backend");
#if defined(STRATA_HAVE_NCCL)
  CommNcclId id{};
  if (bootstrap.rank() == 0) id = comm_nccl_unique_id();
  bootstrap.broadcast(&id, sizeof id, 0).wait();
  return comm_create_nccl(device, bootstrap.rank(), bootstrap.size(), bootstrap.local_rank(), id, timeout_s,
                          std::move(keep));
#else
  (void)bootstrap;
  (void)timeout_s;
  (void)keep;
  STRATA_CHECK(false, "this strata was built without NCCL (it needs the CUDA backend and NCCL "
               "under /usr/local/cuda); use distributed.backend = \"mpi\"");
  return nullptr;
#endif
}

}  // namespace strata
