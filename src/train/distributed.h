// A training run's place in a distributed launch (DESIGN §8, recipes/README.md [distributed]):
// `mpirun -np N strata train RECIPE.toml` starts N ranks; each reads its rank, the rank count
// and its rank on the node from the launcher's environment (src/comm/comm.h), picks its GPU by
// its node rank, and builds the communicator the recipe asks for. Without mpirun there is one
// rank and nothing else changes.
//
// Nodes: node() is the comm of this rank's node (Comm::split_node: the ranks sharing its memory,
// or distributed.ranks_per_node consecutive ranks, to pretend several nodes on one machine).
// Shared host store (distributed.shared_host_store, one per node): src/train/shared_store.h holds
// it; each node's first rank (node_leader) loads weights and checkpoints into its node's store and
// writes the gradient accumulation there; the optimizer update is split over the node's ranks
// (offload/reduce/comm_reduction.h, device_reduction.h, engine.cpp). The gradients are all-reduced over
// every rank of every node, so every node's store receives the same bits and applies the same
// update: the stores stay identical, and equal to one process's.
//
// Roles: rank 0 alone writes the run directory (lock, recipe.toml, metrics.jsonl, checkpoints,
// the export) and prints progress; the other ranks' informational output goes to /dev/null and
// their errors to their stderr, prefixed "rank R:" (distributed_error_stream, used by main).
//
// Data parallel (first-order): the global order of micro-batches is the single-process order
// with gradient_accumulation_steps x N; rank r runs micro-batches r, r + N, ... of each step and
// offload/reduce/comm_reduction.h sums the gradients in host memory (MPI) so that every rank holds the
// gradient one process would have accumulated, bit for bit; each rank then runs the same
// optimizer on it. On the cuda backend with NCCL (device_comm), offload/reduce/device_reduction.h
// all-reduces each gradient on the device before its copy to the host instead (bit-identical
// for 2 ranks with one micro-batch each per step; rounding-close otherwise).
#pragma once
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "offload/reduce/comm_reduction.h"
#include "src/comm/comm.h"
#include "src/recipe/recipe.h"
#include "src/train/checkpoint.h"

namespace strata {

class Distributed {
 public:
  // Reads the launch; under mpirun builds the comm (MPI over host buffers) and, on rank > 0,
  // silences informational output. Call before the device is created (it picks the GPU).
  explicit Distributed(const Recipe& rc);
  ~Distributed();

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool primary() const { return rank_ == 0; }
  bool data_parallel() const { return size_ > 1; }
  Comm& comm() { return *comm_; }
  Comm& node() { return *node_; }  // this rank's node (see above)
  bool node_leader() const { return node_->rank() == 0; }

  // distributed.shared_host_store for this run, the same answer on every rank (collective): "false"
  // never; "true" where the run supports a shared store, else an error saying why not; "auto" where
  // it supports one and some node runs more than one rank. Supported: first order (not zo-sgd), not GRPO,
  // without LoRA, with the optimizer state in RAM (not on NVMe). Says the choice on rank 0.
  bool choose_shared_store(const Recipe& rc, bool optimizer_on_nvme);
  // The comm the gradients are reduced over on the device, once `dev` exists: NCCL (its unique id
  // broadcast over comm()) with distributed.backend = "nccl", or "auto" on the cuda backend in a
  // build with NCCL; null where they are reduced in host memory over comm() (MPI: the cpu backend,
  // "mpi", a build without NCCL). The caller keeps it, and frees it before
  // the device.
  std::unique_ptr<Comm> device_comm(Device& dev);

  // The sum of per-micro-batch values in the global micro-batch order, ((0 + v0) + v1) + ...,
  // where this rank holds the values of micro-batches rank, rank + N, ... (mine[j] is global
  // micro-batch j * N + rank). The same bits on every rank, and as one process sums them.
  double sum_in_global_order(const std::vector<double>& mine);
  // values <- the elementwise sum over ranks (rank order).
  void all_reduce_sum(std::vector<double>& values);
  // Every rank's value of a per-rank quantity, in rank order.
  std::vector<double> gather(double mine);
  // True on every rank when it is true on any rank (a stop request must stop every rank).
  bool any(bool flag);
  void barrier();

 private:
  int rank_ = 0, size_ = 1;
  CommBackend backend_ = CommBackend::automatic;
  double timeout_s_ = 300;
  std::unique_ptr<Comm> comm_;
  std::unique_ptr<Comm> node_;  // after comm_: freed first (it shares comm_'s MPI worker)
};

// Worker consistency (metrics.jsonl "workers"): each rank's loss over its micro-batches and its
// local gradient norm (CommDiagnostics), their spread (max - min), and the mean pairwise cosine
// between the ranks' local gradients, sum_{r != s} g_r.g_s / sum_{r != s} |g_r||g_s|, from
// |sum_r g_r|^2 - sum_r |g_r|^2: scalar all-reduces only. Every rank calls it.
nlohmann::json distributed_worker_diagnostics(Distributed& dist, double local_loss_sum, int64_t local_tokens,
                                              const CommDiagnostics& d);

// Rank 0's state to every rank (collective): a resume into shared host stores, which the node
// leaders alone load.
void distributed_share_state(Distributed& dist, TrainState& state);

// Where errors go: stderr (kept when a rank > 0 silences its informational output).
std::FILE* distributed_error_stream();
// "rank R: " under a launcher with more than one rank, else "".
std::string distributed_rank_prefix();

}  // namespace strata
