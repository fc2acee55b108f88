// The MPI comm (comm.h): host buffers, OpenMPI point-to-point messages, one worker thread (shared
// by the world comm and its node group, split_node).
//
// Every MPI call happens on the comm's worker thread (MPI_THREAD_FUNNELED: it is the thread that
// called MPI_Init), which runs the queued collectives in call order. Each collective is a set of
// nonblocking sends and receives polled against a deadline, so a peer that died or hangs becomes
// an error naming the ranks whose messages never came, never a hang.
//
// All-reduce (rank-order sum, bit-identical on every rank): the buffer is cut into `size` chunks;
// rank c owns chunk c. Phase 1 sends every chunk to its owner; the owner sums the `size`
// contributions in rank order, ((x0 + x1) + x2) + ...; phase 2 sends each owner's sums to every
// rank. Each rank sends and receives (size-1)/size of the buffer per phase, as a ring does.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "src/comm/comm.h"
#include "src/core/error.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;

template <class T>
MPI_Datatype mpi_type();
template <>
MPI_Datatype mpi_type<float>() { return MPI_FLOAT; }
template <>
MPI_Datatype mpi_type<double>() { return MPI_DOUBLE; }
template <>
MPI_Datatype mpi_type<char>() { return MPI_BYTE; }

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return std::string(text, size_t(len));
}

// A queued collective: `run` executes on the worker; wait() blocks on its completion.
class MpiWork final : public CommWork {
 public:
  explicit MpiWork(std::function<void()> run) : run_(std::move(run)) {}
  void execute(const std::string& broken) {
    std::string error = broken;
    if (error.empty()) {
      try {
        run_();
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
    run_ = nullptr;
    std::lock_guard<std::mutex> lock(mu_);
    error_ = error;
    finished_ = true;
    cv_.notify_all();
  }
  const std::string& error() const { return error_; }  // after execute
  void wait() override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return finished_; });
    if (!error_.empty()) throw Error(ErrorKind::io, error_);
  }
  bool done() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_ && !error_.empty()) throw Error(ErrorKind::io, error_);
    return finished_;
  }

 private:
  std::function<void()> run_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool finished_ = false;
  std::string error_;
};

// The worker thread every MpiComm of this process shares: MPI_Init_thread ran on it
// (MPI_THREAD_FUNNELED), so every MPI call is made there, in the order the comms queue them.
// Ends (and finalizes MPI when the world comm asked) once the last comm using it is gone.
class MpiWorker {
 public:
  MpiWorker() {
    std::promise<std::string> started;
    auto started_f = started.get_future();
    thread_ = std::thread([this, &started] { main(started); });
    const std::string error = started_f.get();
    if (!error.empty()) {
      stop();
      throw Error(ErrorKind::input, error);
    }
  }
  ~MpiWorker() { stop(); }

  CommTicket submit(std::function<void()> run) {
    auto work = std::make_shared<MpiWork>(std::move(run));
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(work);
    }
    cv_.notify_one();
    return CommTicket(work);
  }
  std::string broken() const {
    std::lock_guard<std::mutex> lock(mu_);
    return broken_;
  }
  void set_broken(const std::string& msg) {
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_.empty()) broken_ = msg;
  }

  int world_rank = 0, world_size = 1;
  std::vector<int> node_ranks;  // the world ranks sharing this node's memory (MPI_COMM_TYPE_SHARED)
  bool finalize = false;        // worker thread only: MPI_Finalize when the thread ends

 private:
  void main(std::promise<std::string>& started) {
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
      started.set_value("MPI_Init_thread failed: is strata running under mpirun?");
      return;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    MPI_Comm node;  // the ranks sharing this node's memory
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &node);
    int node_size = 1;
    MPI_Comm_size(node, &node_size);
    MPI_Group world_group, node_group;
    MPI_Comm_group(MPI_COMM_WORLD, &world_group);
    MPI_Comm_group(node, &node_group);
    std::vector<int> in_node(size_t(node_size), 0);
    for (int i = 0; i < node_size; ++i) in_node[size_t(i)] = i;
    node_ranks.assign(size_t(node_size), 0);
    MPI_Group_translate_ranks(node_group, node_size, in_node.data(), world_group, node_ranks.data());
    MPI_Group_free(&node_group);
    MPI_Group_free(&world_group);
    MPI_Comm_free(&node);
    started.set_value("");
    while (true) {
      std::shared_ptr<MpiWork> work;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) break;
        work = queue_.front();
        queue_.pop_front();
      }
      work->execute(broken());
    }
    if (finalize) MPI_Finalize();
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<MpiWork>> queue_;
  bool stop_ = false;
  std::string broken_;
  std::thread thread_;
};

// A group of ranks over MPI_COMM_WORLD's point-to-point messages: the world (members 0..size-1),
// or a node's ranks (split_node). A group's collectives use their own tag range, so its messages
// never match another group's (and no MPI communicator is created: nothing blocks without the
// deadline). Messages name world ranks.
class MpiComm final : public Comm {
 public:
  MpiComm(std::shared_ptr<MpiWorker> worker, double timeout_s, std::vector<int> members, int tag_base)
      : worker_(std::move(worker)), timeout_s_(timeout_s), members_(std::move(members)), tag_base_(tag_base) {
    world_ = tag_base_ == 0;
    size_ = int(members_.size());
    const auto me = std::find(members_.begin(), members_.end(), worker_->world_rank);
    STRATA_ASSERT(me != members_.end(), "rank ", worker_->world_rank, " is not in its own group");
    rank_ = int(me - members_.begin());
    const auto& node = worker_->node_ranks;
    local_rank_ = world_ ? int(std::find(node.begin(), node.end(), worker_->world_rank) - node.begin()) : rank_;
  }

  ~MpiComm() override {
    if (!world_) return;
    // Finalize only after every rank is known to be here: MPI_Finalize waits for all ranks, so
    // with a dead peer it would hang. A broken comm leaves MPI unfinalized (the launcher then
    // ends the other ranks).
    try {
      if (worker_->broken().empty()) barrier();
    } catch (const Error& e) {
      std::fprintf(stderr, "strata: rank %d: %s; leaving MPI without MPI_Finalize\n", worker_->world_rank, e.what());
    }
    MpiWorker* w = worker_.get();
    submit([w] { w->finalize = w->broken().empty(); });
  }

  std::string name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  bool device_buffers() const override { return false; }

  // The node's ranks: those sharing this node's memory, or (ranks_per_node > 0) the block of
  // ranks_per_node consecutive world ranks holding this one, which must share its memory.
  std::unique_ptr<Comm> split_node(int ranks_per_node) override {
    STRATA_ASSERT(world_, "split_node of a group that is not the world");
    std::vector<int> members = worker_->node_ranks;
    if (ranks_per_node > 0) {
      const int first = rank_ / ranks_per_node * ranks_per_node;
      members.clear();
      for (int r = first; r < std::min(size_, first + ranks_per_node); ++r) members.push_back(r);
      for (int r : members)
        STRATA_CHECK(std::count(worker_->node_ranks.begin(), worker_->node_ranks.end(), r), "distributed."
                     "ranks_per_node = ", ranks_per_node, " puts ranks ", members.front(), "..", members.back(),
                     " on one node, but rank ", r, " runs on another machine than rank ", rank_, ": set "
                     "distributed.ranks_per_node = 0 (the real nodes) or at most the ranks each machine runs");
    }
    return std::make_unique<MpiComm>(worker_, timeout_s_, std::move(members), kGroupTags);
  }

  CommTicket all_reduce_sum(float* data, size_t count, Stream) override {
    return submit([this, data, count] { all_reduce(data, count, "all-reduce of f32"); });
  }
  CommTicket all_reduce_sum(double* values, size_t count) override {
    return submit([this, values, count] { all_reduce(values, count, "all-reduce of f64"); });
  }
  CommTicket broadcast(void* data, size_t bytes, int root, Stream) override {
    STRATA_ASSERT(root >= 0 && root < size_, "broadcast root ", root, " of ", size_, " ranks");
    return submit([this, data, bytes, root] {
      const int tag = next_tag();
      Exchange x(*this, "broadcast", bytes);
      if (rank_ == root) {
        for (int p = 0; p < size_; ++p)
          if (p != rank_) x.send(static_cast<char*>(data), bytes, p, tag);
      } else {
        x.recv(static_cast<char*>(data), bytes, root, tag);
      }
      x.complete();
    });
  }
  void barrier() override {
    submit([this] {
      const int tag = next_tag();
      Exchange x(*this, "barrier", 0);
      char none = 0;
      for (int p = 0; p < size_; ++p) {
        if (p == rank_) continue;
        x.send(&none, 0, p, tag);
        x.recv(&none, 0, p, tag);
      }
      x.complete();
    }).wait();
  }

 private:
  static constexpr int kGroupTags = 1 << 14;  // world tags [0, 2^14), a node group's [2^14, 2^15)

  // Nonblocking sends and receives of one collective, completed together against the deadline.
  // Peers are ranks of the group.
  class Exchange {
   public:
    Exchange(MpiComm& c, const char* what, size_t bytes) : c_(c), what_(what), bytes_(bytes) {}
    template <class T>
    void send(const T* p, size_t n, int peer, int tag) { post(const_cast<T*>(p), n, peer, tag, true); }
    template <class T>
    void recv(T* p, size_t n, int peer, int tag) { post(p, n, peer, tag, false); }

    void complete() {
      const auto deadline = Clock::now() + std::chrono::duration<double>(c_.timeout_s_);
      auto pause = std::chrono::microseconds(0);
      while (true) {
        int all = 0;
        const int rc = MPI_Testall(int(reqs_.size()), reqs_.data(), &all, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) fail(str_cat("MPI_Testall failed (", mpi_error_text(rc), ")"));
        if (all) return;
        if (Clock::now() > deadline) fail("no answer");
        // MPI progresses only inside its calls: poll, backing off to 200 us to spare the cores.
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2 + std::chrono::microseconds(1), std::chrono::microseconds(200));
      }
    }

   private:
    template <class T>
    void post(T* p, size_t n, int peer, int tag, bool is_send) {
      const int world_peer = c_.members_[size_t(peer)];
      // MPI counts are int: long buffers go as several messages (kept in order by MPI).
      constexpr size_t kPiece = size_t(1) << 30;
      size_t done = 0;
      do {
        const size_t piece = std::min(kPiece, n - done);
        MPI_Request r;
        const int rc = is_send
            ? MPI_Isend(p + done, int(piece), mpi_type<T>(), world_peer, tag, MPI_COMM_WORLD, &r)
            : MPI_Irecv(p + done, int(piece), mpi_type<T>(), world_peer, tag, MPI_COMM_WORLD, &r);
        if (rc != MPI_SUCCESS)
          fail(str_cat(is_send ? "MPI_Isend to" : "MPI_Irecv from", " rank ", world_peer, " failed (",
                       mpi_error_text(rc), ")"));
        reqs_.push_back(r);
        peers_.push_back(world_peer);
        done += piece;
      } while (done < n);
    }

    [[noreturn]] void fail(const std::string& why) {
      std::set<int> silent;  // peers whose messages never completed
      for (size_t i = 0; i < reqs_.size(); ++i) {
        int flag = 0;
        if (reqs_[i] != MPI_REQUEST_NULL) MPI_Test(&reqs_[i], &flag, MPI_STATUS_IGNORE);
        if (!flag && reqs_[i] != MPI_REQUEST_NULL) silent.insert(peers_[i]);
      }
      std::string who;
      for (int p : silent) who += str_cat(who.empty() ? "" : ", ", p);
      const int me = c_.worker_->world_rank;
      std::string msg = why == "no answer"
          ? str_cat("rank ", me, ": ", what_, " #", c_.ops_, " (", bytes_, " bytes) got no "
                    "answer from rank ", who, " within ", c_.timeout_s_, " s: that rank died or "
                    "hangs (distributed.timeout sets the limit)")
          : str_cat("rank ", me, ": ", what_, " #", c_.ops_, ": ", why);
      c_.worker_->set_broken(msg);
      throw Error(ErrorKind::io, msg);
    }

    MpiComm& c_;
    const char* what_;
    size_t bytes_;
    std::vector<MPI_Request> reqs_;
    std::vector<int> peers_;  // world ranks
  };

  template <class T>
  void all_reduce(T* data, size_t count, const char* what) {
    if (size_ == 1 || count == 0) return;
    const int n = size_;
    auto begin = [&](int c) { return count / size_t(n) * size_t(c) + std::min<size_t>(c, count % n); };
    auto length = [&](int c) { return begin(c + 1) - begin(c); };
    const size_t mine = length(rank_), my_begin = begin(rank_);
    // scratch[r] holds rank r's contribution to my chunk (mine: read in place).
    scratch_.resize(std::max(scratch_.size(), (size_t(n) * mine * sizeof(T) + 7) / 8));
    T* scratch = reinterpret_cast<T*>(scratch_.data());

    const int tag = next_tag();
    {  // phase 1: every chunk to its owner
      Exchange x(*this, what, count * sizeof(T));
      for (int p = 0; p < n; ++p) {
        if (p == rank_) continue;
        if (mine) x.recv(scratch + size_t(p) * mine, mine, p, tag);
        if (length(p)) x.send(data + begin(p), length(p), p, tag);
      }
      x.complete();
    }
    // the owner's sum, in rank order
    T* acc = scratch + size_t(rank_) * mine;  // my own slot is free
    std::memcpy(acc, rank_ == 0 ? data + my_begin : scratch, mine * sizeof(T));  // rank 0's
    for (int r = 1; r < n; ++r) {
      const T* x = r == rank_ ? data + my_begin : scratch + size_t(r) * mine;
      for (size_t i = 0; i < mine; ++i) acc[i] += x[i];
    }
    std::memcpy(data + my_begin, acc, mine * sizeof(T));
    {  // phase 2: every owner's sums to every rank
      Exchange x(*this, what, count * sizeof(T));
      for (int p = 0; p < n; ++p) {
        if (p == rank_) continue;
        if (length(p)) x.recv(data + begin(p), length(p), p, tag + 1);
        if (mine) x.send(data + my_begin, mine, p, tag + 1);
      }
      x.complete();
    }
  }

  int next_tag() {
    ++ops_;
    return tag_base_ + int((ops_ % 8192) * 2);  // two tags per collective (phases); MPI keeps per-pair order
  }

  CommTicket submit(std::function<void()> run) { return worker_->submit(std::move(run)); }

  std::shared_ptr<MpiWorker> worker_;
  const double timeout_s_;
  const std::vector<int> members_;  // world rank of each rank of the group
  const int tag_base_;
  bool world_ = true;
  int rank_ = 0, size_ = 1, local_rank_ = 0;
  uint64_t ops_ = 0;                 // collectives issued (worker thread only)
  std::vector<uint64_t> scratch_;   // all-reduce receive space (worker thread only)
};

}  // namespace

std::unique_ptr<Comm> comm_create_mpi(double timeout_s) {
  STRATA_CHECK(timeout_s > 0, "distributed.timeout must be positive (got ", timeout_s, " s)");
  auto worker = std::make_shared<MpiWorker>();
  std::vector<int> world(size_t(worker->world_size));
  for (size_t r = 0; r < world.size(); ++r) world[r] = int(r);
  return std::make_unique<MpiComm>(worker, timeout_s, std::move(world), 0);
}

}  // namespace strata
