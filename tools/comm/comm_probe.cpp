// strata_comm_probe - runs the MPI comm (src/comm) under mpirun and checks it; the ctest cases
// of label `mpi` (src/comm/comm.cmake) launch it through tests/comm/run_mpi.sh.
//
//   mpirun -np N strata_comm_probe collectives      all-reduce of awkward sizes, scalars,
//                                                   broadcast, barrier, queued tickets; node
//                                                   groups (split_node) beside the world
//   mpirun -np N strata_comm_probe hang RANK SECS   RANK stops answering; the others must fail
//   mpirun -np N strata_comm_probe exit RANK SECS   RANK exits early;   within SECS, naming RANK
//
// Exit 0 when every check passed, 1 on a failed check, the strata error's code (4) on a comm
// error. Every line is prefixed with the rank.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "src/comm/comm.h"
#include "tools/comm/comm_inputs.h"
#include "src/core/error.h"

namespace {

using strata::Comm;
using strata::CommTicket;

int g_rank = -1;
int g_failures = 0;

#define PROBE_CHECK(cond, ...)                                                  \
  do {                                                                          \
    if (!(cond)) {                                                              \
      std::fprintf(stderr, "rank %d: check failed: %s: ", g_rank, #cond);       \
      std::fprintf(stderr, __VA_ARGS__);                                        \
      std::fprintf(stderr, "\n");                                               \
      ++g_failures;                                                             \
    }                                                                           \
  } while (0)

using strata::comm_testing::input;  // rank r's i-th value (tools/comm/comm_inputs.h)
using strata::comm_testing::mix;

template <class T>
std::vector<T> serial_sum(int size, size_t n, uint64_t salt) {  // ((x0 + x1) + x2) + ...
  std::vector<T> s(n);
  for (size_t i = 0; i < n; ++i) {
    T acc = input<T>(0, i, salt);
    for (int r = 1; r < size; ++r) acc += input<T>(r, i, salt);
    s[i] = acc;
  }
  return s;
}

void check_collectives(Comm& comm) {
  const int rank = comm.rank(), size = comm.size();
  // f32 all-reduce of awkward sizes, all queued before any wait (tickets complete in order)
  const size_t sizes[] = {1, 17, 4097, (size_t(1) << 20) + 3, 0};
  std::vector<std::vector<float>> bufs;
  std::vector<CommTicket> tickets;
  for (size_t k = 0; k < std::size(sizes); ++k) {
    std::vector<float> b(sizes[k]);
    for (size_t i = 0; i < b.size(); ++i) b[i] = input<float>(rank, i, k);
    bufs.push_back(std::move(b));
  }
  for (auto& b : bufs) tickets.push_back(comm.all_reduce_sum(b.data(), b.size()));
  for (auto& t : tickets) t.wait();
  for (size_t k = 0; k < std::size(sizes); ++k) {
    const std::vector<float> want = serial_sum<float>(size, sizes[k], k);
    size_t bad = 0;
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      if (std::memcmp(&want[i], &bufs[k][i], sizeof(float)) != 0) ++bad;
      worst = std::max(worst, std::fabs(double(want[i]) - double(bufs[k][i])));
    }
    PROBE_CHECK(bad == 0, "f32 all-reduce of %zu: %zu elements differ from the rank-order serial "
                "sum (max |diff| %g)", sizes[k], bad, worst);
    std::printf("rank %d: all-reduce f32 n=%zu bit-equal to the rank-order serial sum: %s\n", rank,
                sizes[k], bad == 0 ? "yes" : "NO");
  }
  // every rank holds the same bits: broadcast rank 0's largest result and compare
  std::vector<float> theirs = bufs[3];
  comm.broadcast(theirs.data(), theirs.size() * sizeof(float), 0).wait();
  PROBE_CHECK(std::memcmp(theirs.data(), bufs[3].data(), theirs.size() * sizeof(float)) == 0,
              "rank %d's all-reduce result differs from rank 0's", rank);

  // scalar all-reduce (f64)
  std::vector<double> scalars(3);
  for (size_t i = 0; i < scalars.size(); ++i) scalars[i] = input<double>(rank, i, 99);
  comm.all_reduce_sum(scalars.data(), scalars.size()).wait();
  const std::vector<double> want_s = serial_sum<double>(size, scalars.size(), 99);
  PROBE_CHECK(std::memcmp(want_s.data(), scalars.data(), sizeof(double) * 3) == 0,
              "f64 all-reduce: %.17g %.17g %.17g, want %.17g %.17g %.17g", scalars[0], scalars[1],
              scalars[2], want_s[0], want_s[1], want_s[2]);
  std::printf("rank %d: all-reduce f64 x3 = %.17g %.17g %.17g\n", rank, scalars[0], scalars[1],
              scalars[2]);

  // broadcast of bytes from the last rank, an odd length
  std::vector<unsigned char> bytes(1000003);
  for (size_t i = 0; i < bytes.size(); ++i)
    bytes[i] = rank == size - 1 ? (unsigned char)(mix(i) & 0xff) : 0xAA;
  comm.broadcast(bytes.data(), bytes.size(), size - 1).wait();
  size_t bad = 0;
  for (size_t i = 0; i < bytes.size(); ++i) bad += bytes[i] != (unsigned char)(mix(i) & 0xff);
  PROBE_CHECK(bad == 0, "broadcast from rank %d: %zu of %zu bytes wrong", size - 1, bad, bytes.size());

  // barrier: rank 0 makes a directory and broadcasts its name; ranks arrive at staggered times
  // and mark their arrival; after the barrier every mark must be there.
  char dir[256] = {};
  if (rank == 0) {
    std::snprintf(dir, sizeof dir, "%s/strata_comm_probe.XXXXXX",
                  std::filesystem::temp_directory_path().c_str());
    PROBE_CHECK(mkdtemp(dir) != nullptr, "mkdtemp failed");
  }
  comm.broadcast(dir, sizeof dir, 0).wait();
  std::this_thread::sleep_for(std::chrono::milliseconds(150 * rank));
  std::FILE* f = std::fopen((std::string(dir) + "/arrived." + std::to_string(rank)).c_str(), "w");
  PROBE_CHECK(f != nullptr, "cannot write to %s", dir);
  if (f) std::fclose(f);
  comm.barrier();
  int present = 0;
  for (int r = 0; r < size; ++r)
    present += std::filesystem::exists(std::string(dir) + "/arrived." + std::to_string(r));
  PROBE_CHECK(present == size, "after the barrier only %d of %d ranks had arrived", present, size);
  comm.barrier();  // everyone has looked before rank 0 removes the directory
  if (rank == 0) std::filesystem::remove_all(dir);
}

// Node groups (Comm::split_node): the real node (every rank here: one machine) and pretend nodes of
// 2 consecutive ranks; a node's all-reduces, broadcast and barrier interleaved with the world's
// queued ones (their messages must not mix: own tag ranges) give each group's own sums.
void check_nodes(Comm& world) {
  const int rank = world.rank(), size = world.size();
  std::unique_ptr<Comm> machine = world.split_node(0);
  PROBE_CHECK(machine->size() == size && machine->rank() == rank, "the machine's node is rank %d of %d",
              machine->rank(), machine->size());
  std::unique_ptr<Comm> node = world.split_node(2);
  const int first = rank / 2 * 2, members = std::min(size, first + 2) - first;
  PROBE_CHECK(node->size() == members && node->rank() == rank - first && node->local_rank() == rank - first,
              "pretend node: rank %d of %d", node->rank(), node->size());
  std::vector<double> w(1000), n(1000);
  for (int round = 0; round < 3; ++round) {
    for (size_t i = 0; i < w.size(); ++i) w[i] = n[i] = double(rank + 1) * double(i + round);
    CommTicket tw = world.all_reduce_sum(w.data(), w.size());
    CommTicket tn = node->all_reduce_sum(n.data(), n.size());
    tw.wait();
    tn.wait();
    double world_ranks = 0, node_ranks = 0;
    for (int r = 0; r < size; ++r) world_ranks += r + 1;
    for (int r = first; r < first + members; ++r) node_ranks += r + 1;
    for (size_t i = 0; i < w.size(); ++i) {
      PROBE_CHECK(w[i] == world_ranks * double(i + round), "world all-reduce [%zu] = %g", i, w[i]);
      PROBE_CHECK(n[i] == node_ranks * double(i + round), "node all-reduce [%zu] = %g", i, n[i]);
    }
    double from = rank == first ? 100.0 + first : -1;
    node->broadcast(&from, sizeof from, 0).wait();
    PROBE_CHECK(from == 100.0 + first, "node broadcast gave %g", from);
    node->barrier();
  }
}

// One rank stops (hangs or exits) after a first all-reduce; the others' next one must fail.
void check_fault(Comm& comm, bool hang, int victim) {
  std::vector<float> v(4097, 1.0f);
  comm.all_reduce_sum(v.data(), v.size()).wait();
  PROBE_CHECK(v[0] == float(comm.size()), "first all-reduce gave %g", v[0]);
  if (comm.rank() == victim) {
    std::fflush(stdout);
    if (hang) {
      std::fprintf(stderr, "rank %d: stops answering (hang)\n", victim);
      while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    std::fprintf(stderr, "rank %d: exits early with code 0, without MPI_Finalize\n", victim);
    std::_Exit(0);
  }
  comm.all_reduce_sum(v.data(), v.size()).wait();
  std::fprintf(stderr, "rank %d: the all-reduce with a dead rank %d returned\n", comm.rank(), victim);
  ++g_failures;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode != "collectives" && !((mode == "hang" || mode == "exit") && argc == 4)) {
    std::fprintf(stderr, "usage: mpirun -np N strata_comm_probe collectives | hang RANK SECS | "
                 "exit RANK SECS\n");
    return 2;
  }
  try {
    const double timeout_s = mode == "collectives" ? 60 : std::atof(argv[3]);
    std::unique_ptr<Comm> comm = strata::comm_create_mpi(timeout_s);
    g_rank = comm->rank();
    std::printf("rank %d of %d (local rank %d): comm %s\n", comm->rank(), comm->size(),
                comm->local_rank(), comm->name().c_str());
    if (mode == "collectives") {
      check_collectives(*comm);
      check_nodes(*comm);
    }
    else check_fault(*comm, mode == "hang", std::atoi(argv[2]));
    std::fflush(stdout);
    if (g_failures) std::fprintf(stderr, "rank %d: %d checks failed\n", g_rank, g_failures);
    return g_failures ? 1 : 0;
  } catch (const strata::Error& e) {
    std::fprintf(stderr, "strata_comm_probe: error: %s\n", e.what());
    return e.exit_code();
  }
}
