// A training run's place in a distributed launch (distributed.h).
#include "src/train/distributed.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "src/core/error.h"

namespace strata {
namespace {

std::FILE* g_error_stream = nullptr;  // a dup of the original stderr once a rank is silenced

// The GPU of this rank: the node rank's entry of CUDA_VISIBLE_DEVICES (or GPU `local_rank`
// when it is unset), made the only visible device before any CUDA call.
void select_gpu(const CommLaunch& l) {
  std::string visible = std::getenv("CUDA_VISIBLE_DEVICES") ? std::getenv("CUDA_VISIBLE_DEVICES") : "";
  std::string pick = std::to_string(l.local_rank);
  if (!visible.empty()) {
    std::vector<std::string> ids;
    std::stringstream ss(visible);
    for (std::string id; std::getline(ss, id, ',');) ids.push_back(id);
    if (ids.size() == 1) return;  // the launcher (or a scheduler) already gave each rank one GPU
    STRATA_CHECK(size_t(l.local_rank) < ids.size(), "rank ", l.rank, " is rank ", l.local_rank, " on its node but "
                 "CUDA_VISIBLE_DEVICES lists ", ids.size(), " GPUs (", visible, "): start at most one rank per GPU");
    pick = ids[size_t(l.local_rank)];
  }
  setenv("CUDA_VISIBLE_DEVICES", pick.c_str(), 1);
}

// Informational output of a rank > 0 goes to /dev/null; errors keep the original stderr.
void silence_stderr() {
  std::fflush(stderr);
  const int saved = dup(2);
  const int null_fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (saved < 0 || null_fd < 0) return;  // keep printing: noisy, not wrong
  g_error_stream = fdopen(saved, "w");
  if (!g_error_stream) return;
  setvbuf(g_error_stream, nullptr, _IOLBF, 0);
  dup2(null_fd, 2);
  close(null_fd);
}

}  // namespace

Distributed::Distributed(const Recipe& rc) {
  const CommLaunch launch = comm_launch_from_env();
  if (!launch.launched || launch.size == 1) {
    comm_ = comm_create_single();
    node_ = comm_create_single();
    return;
  }
  rank_ = launch.rank;
  size_ = launch.size;
  const DeviceBackend device = rc.modes.device;
  const CommBackend backend = rc.modes.distributed;
  if (device == DeviceBackend::cuda || device == DeviceBackend::automatic) select_gpu(launch);
  STRATA_CHECK(backend != CommBackend::nccl || device != DeviceBackend::cpu, "distributed.backend = \"nccl\" "
               "reduces gradients on GPUs: it needs device.backend = \"cuda\"; use \"mpi\" (or \"auto\") with the "
               "cpu backend");
  STRATA_CHECK(backend != CommBackend::nccl || comm_have_nccl(), "distributed.backend = \"nccl\" but this "
               "strata was built without NCCL (it needs the CUDA backend and NCCL under /usr/local/cuda): rebuild "
               "with NCCL, or use \"mpi\" (gradients reduced in host memory)");
  backend_ = backend;
  timeout_s_ = rc.distributed_timeout_s;
  comm_ = comm_create_mpi(rc.distributed_timeout_s);
  STRATA_CHECK(comm_->rank() == rank_ && comm_->size() == size_, "MPI says rank ", comm_->rank(), " of ",
               comm_->size(), " but the launcher's environment says ", rank_, " of ", size_);
  node_ = comm_->split_node(int(rc.distributed_ranks_per_node));
  if (rank_ > 0) silence_stderr();
}

Distributed::~Distributed() = default;

bool Distributed::choose_shared_store(const Recipe& rc, bool optimizer_on_nvme) {
  if (size_ == 1 || rc.modes.shared_host_store == Toggle::off) return false;
  std::string why_not;
  if (rc.objective == "grpo")
    why_not = "GRPO keeps a store per rank (each pass scales the final norm's weight in its store by 1 / temperature)";
  else if (rc.modes.optimizer == OptimizerKind::zo_sgd)
    why_not = "zo-sgd ranks each keep their own store (working weights + fp32 master; each applies the same update)";
  else if (rc.lora_enabled)
    why_not = "LoRA keeps a store per rank";
  else if (dtype_parse(rc.moments_dtype) != DType::f32)
    why_not = "a shared store keeps f32 moments (optim.moments_dtype = \"bf16\" keeps a store per rank)";
  else if (optimizer_on_nvme)
    why_not = "the optimizer state is on NVMe (offload.optimizer = \"nvme\", or the placement plan's choice for "
              "\"auto\" when RAM is short); a shared store keeps it in shared RAM: set offload.optimizer = \"host\"";
  // every rank answers alike (the plan may differ by a rank's own memory use)
  double votes[2] = {why_not.empty() ? 0.0 : 1.0, node_->size() > 1 ? 1.0 : 0.0};
  comm_->all_reduce_sum(votes, 2).wait();
  const bool supported = votes[0] == 0, crowded = votes[1] > 0;
  if (rc.modes.shared_host_store == Toggle::on) {
    STRATA_CHECK(supported, "distributed.shared_host_store = true: ",
                 why_not.empty() ? std::string("another rank's run cannot share a store") : why_not,
                 "; set distributed.shared_host_store = \"auto\" (shared where it can be) or false");
  } else if (!supported || !crowded) {
    if (primary())
      std::fprintf(stderr, "strata train: one host store per rank (distributed.shared_host_store = \"auto\": %s)\n",
                   !crowded ? "every node runs one rank" : why_not.empty() ? "another rank cannot share" : why_not.c_str());
    return false;
  }
  double nodes = node_leader() ? 1.0 : 0.0;
  comm_->all_reduce_sum(&nodes, 1).wait();
  if (primary())
    std::fprintf(stderr, "strata train: one shared host store per node (%d nodes, %d ranks; distributed."
                 "shared_host_store = %s): each node's ranks split the optimizer update\n", int(nodes), size_,
                 rc.distributed_shared_host_store.c_str());
  return true;
}

std::unique_ptr<Comm> Distributed::device_comm(Device& dev) {
  if (size_ == 1) return nullptr;
  const bool cuda = dev.native_stream(Stream::compute) != nullptr;
  if (backend_ == CommBackend::mpi || !cuda || (backend_ == CommBackend::automatic && !comm_have_nccl())) return nullptr;
  return comm_create_nccl_over(*comm_, dev, timeout_s_);
}

double Distributed::sum_in_global_order(const std::vector<double>& mine) {
  const size_t k = mine.size(), n = size_t(size_);
  std::vector<double> all(k * n, 0.0);
  for (size_t j = 0; j < k; ++j) all[j * n + size_t(rank_)] = mine[j];
  if (n > 1) {
    double count = double(k);
    comm_->all_reduce_sum(&count, 1).wait();
    STRATA_ASSERT(count == double(k * n), "ranks ran different numbers of micro-batches");
    comm_->all_reduce_sum(all.data(), all.size()).wait();
  }
  double sum = 0;
  for (double v : all) sum += v;
  return sum;
}

void Distributed::all_reduce_sum(std::vector<double>& values) {
  if (size_ > 1 && !values.empty()) comm_->all_reduce_sum(values.data(), values.size()).wait();
}

std::vector<double> Distributed::gather(double mine) {
  std::vector<double> all(size_t(size_), 0.0);
  all[size_t(rank_)] = mine;
  if (size_ > 1) comm_->all_reduce_sum(all.data(), all.size()).wait();
  return all;
}

bool Distributed::any(bool flag) {
  if (size_ == 1) return flag;
  double v = flag ? 1 : 0;
  comm_->all_reduce_sum(&v, 1).wait();
  return v > 0;
}

void Distributed::barrier() {
  if (size_ > 1) comm_->barrier();
}

nlohmann::json distributed_worker_diagnostics(Distributed& dist, double local_loss_sum, int64_t local_tokens,
                                              const CommDiagnostics& d) {
  const std::vector<double> loss = dist.gather(local_tokens > 0 ? local_loss_sum / double(local_tokens) : 0.0);
  const std::vector<double> sq = dist.gather(d.local_sq);
  std::vector<double> norm(sq.size());
  double sum_local_sq = 0, sum_norm = 0, sum_norm_sq = 0;
  for (size_t r = 0; r < sq.size(); ++r) {
    norm[r] = std::sqrt(sq[r]);
    sum_local_sq += sq[r];
    sum_norm += norm[r];
    sum_norm_sq += sq[r];
  }
  const double cross = sum_norm * sum_norm - sum_norm_sq;  // sum_{r != s} |g_r||g_s|
  const double cosine = cross > 0 ? (d.sum_sq - sum_local_sq) / cross : 1.0;
  auto spread = [](const std::vector<double>& v) {
    return *std::max_element(v.begin(), v.end()) - *std::min_element(v.begin(), v.end());
  };
  return {{"loss", loss}, {"grad_norm", norm}, {"loss_spread", spread(loss)},
          {"grad_norm_spread", spread(norm)}, {"cosine", cosine}};
}

void distributed_share_state(Distributed& dist, TrainState& st) {
  if (!dist.data_parallel()) return;
  std::ostringstream os;  // a plain text form: numbers, the order, then the RNG text
  os.precision(17);
  os << st.step << ' ' << st.max_steps << ' ' << st.rows << ' ' << st.data_hash << ' ' << st.cursor << ' '
     << st.epoch << ' ' << st.tokens_seen << ' ' << st.order.size();
  for (int64_t r : st.order) os << ' ' << r;
  os << ' ' << st.rng;
  std::string text = os.str();
  double bytes = double(text.size());
  dist.comm().broadcast(&bytes, sizeof bytes, 0).wait();
  text.resize(size_t(bytes));
  dist.comm().broadcast(text.data(), text.size(), 0).wait();
  if (dist.primary()) return;
  std::istringstream is(text);
  size_t n = 0;
  is >> st.step >> st.max_steps >> st.rows >> st.data_hash >> st.cursor >> st.epoch >> st.tokens_seen >> n;
  st.order.resize(n);
  for (auto& r : st.order) is >> r;
  is.get();
  std::getline(is, st.rng, '\0');
  STRATA_ASSERT(!is.bad(), "rank 0's training state did not arrive whole");
}

std::FILE* distributed_error_stream() { return g_error_stream ? g_error_stream : stderr; }

std::string distributed_rank_prefix() {
  try {
    const CommLaunch l = comm_launch_from_env();
    return l.launched && l.size > 1 ? "rank " + std::to_string(l.rank) + ": " : "";
  } catch (const Error&) {
    return "";
  }
}

}  // namespace strata
