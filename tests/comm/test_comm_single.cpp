// The single comm and the factory's choice from the launch environment (src/comm/comm.h).
// The MPI comm runs under mpirun (ctest label mpi, tools/comm/comm_probe.cpp); the NCCL comm
// under the emulated NCCL (tests/cuda/test_comm_nccl.cpp, label cuda-emu).
#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "src/comm/comm.h"
#include "src/recipe/recipe_modes.h"
#include "src/core/error.h"

using namespace strata;

namespace {

// Sets (or unsets) an environment variable for the scope, then restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_) setenv(name_, old_->c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace

TEST_CASE("single comm: size 1, collectives leave the data as it is", "[comm]") {
  std::unique_ptr<Comm> c = comm_create_single();
  CHECK(c->name() == "single");
  CHECK(c->rank() == 0);
  CHECK(c->size() == 1);
  CHECK(c->local_rank() == 0);
  CHECK_FALSE(c->device_buffers());
  for (size_t n : {size_t(1), size_t(17), size_t(4097)}) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = float(i) * 0.37f - 3.0f;
    const std::vector<float> before = v;
    CommTicket t = c->all_reduce_sum(v.data(), n);
    t.wait();
    CHECK(t.done());
    CHECK(std::memcmp(v.data(), before.data(), n * sizeof(float)) == 0);
  }
  double s[2] = {1.5, -2.25};
  c->all_reduce_sum(s, 2).wait();
  CHECK(s[0] == 1.5);
  CHECK(s[1] == -2.25);
  char bytes[5] = "abcd";
  c->broadcast(bytes, 5, 0).wait();
  CHECK(std::string(bytes) == "abcd");
  c->barrier();
  CommTicket empty;
  CHECK(empty.done());
  empty.wait();
}

TEST_CASE("comm_create: single without a launcher, the launcher's environment is read", "[comm]") {
  ScopedEnv r("OMPI_COMM_WORLD_RANK", nullptr), s("OMPI_COMM_WORLD_SIZE", nullptr),
      l("OMPI_COMM_WORLD_LOCAL_RANK", nullptr), p("PMIX_RANK", nullptr);
  CHECK_FALSE(comm_launch_from_env().launched);
  for (const char* backend : {"auto", "mpi", "nccl", "single"}) {
    CommOptions o;
    o.backend = comm_backend_parse(backend);
    CHECK(comm_create(o)->name() == "single");
  }
  CommOptions bad;
  CHECK_THROWS_WITH(comm_backend_parse("gloo"), Catch::Contains("distributed.backend must be \"auto\", \"nccl\", \"mpi\" or \"single\""));
  bad.backend = CommBackend::automatic;
  bad.timeout_s = 0;
  CHECK_THROWS_WITH(comm_create(bad), Catch::Contains("distributed.timeout"));

  {
    ScopedEnv r2("OMPI_COMM_WORLD_RANK", "3"), s2("OMPI_COMM_WORLD_SIZE", "4"),
        l2("OMPI_COMM_WORLD_LOCAL_RANK", "1");
    const CommLaunch launch = comm_launch_from_env();
    CHECK(launch.launched);
    CHECK(launch.rank == 3);
    CHECK(launch.size == 4);
    CHECK(launch.local_rank == 1);
    CommOptions o;
    o.backend = CommBackend::single;
    CHECK_THROWS_WITH(comm_create(o), Catch::Contains("launcher started 4 ranks"));
    o.backend = CommBackend::nccl;  // nccl with the cpu backend is refused before MPI is touched
    CHECK_THROWS_WITH(comm_create(o), Catch::Contains("needs the cuda device backend"));
  }
  {
    ScopedEnv r2("OMPI_COMM_WORLD_RANK", "4"), s2("OMPI_COMM_WORLD_SIZE", "4");
    CHECK_THROWS_WITH(comm_launch_from_env(), Catch::Contains("rank 4 of 4"));
  }
  {
    ScopedEnv r2("OMPI_COMM_WORLD_RANK", "x1"), s2("OMPI_COMM_WORLD_SIZE", "2");
    CHECK_THROWS_WITH(comm_launch_from_env(), Catch::Contains("is not a rank number"));
  }
}
