// The NCCL comm (comm.h, comm_nccl.h): collectives on device buffers, enqueued on the CUDA
// backend's own streams (Device::native_stream), so they run after the work already on that
// stream and before the work queued after them. A ticket is a CUDA event recorded after the
// collective; waiting polls it together with NCCL's asynchronous error, and past the timeout
// aborts the communicator (which frees the stream) and throws.
//
// Built twice, like cuda_device.cpp: against the real CUDA runtime and NCCL (STRATA_HAVE_NCCL),
// and by g++ against tools/cuemu (emulated runtime and NCCL, ranks as threads) for tests.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "src/comm/comm_nccl.h"
#include "src/core/error.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;

// Error(io) naming the failed call and its place, with the library's message, unless ok.
#define STRATA_NCCL_CALL_CHECK(ok, message, call) \
  STRATA_CHECK_IO(ok, __FILE__, ":", __LINE__, ": ", call, " failed: ", message)
#define STRATA_NCCL_CUDA(call)                                                         \
  do {                                                                                 \
    const cudaError_t e_ = (call);                                                     \
    STRATA_NCCL_CALL_CHECK(e_ == cudaSuccess, cudaGetErrorString(e_), #call);          \
  } while (0)
#define STRATA_NCCL(call)                                                              \
  do {                                                                                 \
    const ncclResult_t r_ = (call);                                                    \
    STRATA_NCCL_CALL_CHECK(r_ == ncclSuccess, ncclGetErrorString(r_), #call);          \
  } while (0)

// What the comm and its outstanding tickets share.
struct NcclState {
  ncclComm_t comm = nullptr;
  int rank = 0;
  double timeout_s = 0;
  std::mutex mu;
  std::string broken;   // the first failure; every later collective fails with it
  bool aborted = false;

  std::string broken_message() {
    std::lock_guard<std::mutex> lock(mu);
    return broken;
  }
  [[noreturn]] void fail(const std::string& msg) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (broken.empty()) broken = msg;
      if (!aborted) {
        aborted = true;
        ncclCommAbort(comm);  // unblocks the kernels (and stream) waiting for the lost peer
      }
    }
    throw Error(ErrorKind::io, msg);
  }
};

class NcclWork final : public CommWork {
 public:
  NcclWork(std::shared_ptr<NcclState> state, std::string what, cudaStream_t st)
      : state_(std::move(state)), what_(std::move(what)) {
    STRATA_NCCL_CUDA(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    STRATA_NCCL_CUDA(cudaEventRecord(event_, st));
  }
  ~NcclWork() override {
    if (!finished_ && state_->broken_message().empty()) {
      try {
        wait();
      } catch (const Error&) {
      }
    }
    if (!finished_ && on_done_) on_done_(false);
    cudaEventDestroy(event_);
  }
  // Runs once the collective has completed (true) or was given up (false): scalars copy back,
  // staging is freed.
  void set_on_done(std::function<void(bool)> f) { on_done_ = std::move(f); }

  void wait() override {
    if (finished_) return;
    const auto deadline = Clock::now() + std::chrono::duration<double>(state_->timeout_s);
    auto pause = std::chrono::microseconds(0);
    while (!poll()) {
      if (Clock::now() > deadline)
        state_->fail(str_cat("rank ", state_->rank, ": NCCL ", what_, " did not complete within ",
                             state_->timeout_s, " s: a peer rank died or hangs (NCCL cannot tell "
                             "which; distributed.timeout sets the limit)"));
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2 + std::chrono::microseconds(1), std::chrono::microseconds(500));
    }
  }
  bool done() override { return finished_ || poll(); }

 private:
  bool poll() {
    if (finished_) return true;
    const std::string broken = state_->broken_message();
    if (!broken.empty()) throw Error(ErrorKind::io, broken);
    const cudaError_t e = cudaEventQuery(event_);
    if (e == cudaSuccess) {
      finished_ = true;
      if (on_done_) on_done_(true);
      on_done_ = nullptr;
      return true;
    }
    if (e != cudaErrorNotReady)
      state_->fail(str_cat("rank ", state_->rank, ": NCCL ", what_, ": CUDA error ",
                           cudaGetErrorString(e)));
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(state_->comm, &async);
    if (async != ncclSuccess && async != ncclInProgress)
      state_->fail(str_cat("rank ", state_->rank, ": NCCL ", what_, " failed: ",
                           ncclGetErrorString(async)));
    return false;
  }

  std::shared_ptr<NcclState> state_;
  std::string what_;
  cudaEvent_t event_ = nullptr;
  bool finished_ = false;
  std::function<void(bool)> on_done_;
};

class NcclComm final : public Comm {
 public:
  NcclComm(Device& device, int rank, int size, int local_rank, const CommNcclId& id,
           double timeout_s, std::unique_ptr<Comm> bootstrap)
      : device_(device), size_(size), local_rank_(local_rank), bootstrap_(std::move(bootstrap)),
        state_(std::make_shared<NcclState>()) {
    STRATA_CHECK(device.native_stream(Stream::compute) != nullptr, "the NCCL comm needs the "
                 "cuda device backend (device ", device.name(), " has no CUDA streams)");
    STRATA_CHECK(size >= 1 && rank >= 0 && rank < size, "NCCL rank ", rank, " of ", size);
    STRATA_CHECK(timeout_s > 0, "distributed.timeout must be positive (got ", timeout_s, " s)");
    state_->rank = rank;
    state_->timeout_s = timeout_s;
    ncclUniqueId uid;
    static_assert(sizeof uid == sizeof id.bytes);
    std::memcpy(&uid, id.bytes, sizeof uid);
    STRATA_NCCL(ncclCommInitRank(&state_->comm, size, uid, rank));
    barrier_ = static_cast<float*>(device_.alloc(sizeof(float), "comm barrier word"));
    device_.memset_zero(barrier_, sizeof(float), Stream::compute);
  }
  ~NcclComm() override {
    device_.free(barrier_);
    const bool aborted = !state_->broken_message().empty();
    for (const ScalarBlock& b : pool_->all) {
      if (aborted) continue;  // an aborted collective may still name them; left to the process
      device_.free(b.device);
      device_.free_pinned(b.pinned);
    }
    std::lock_guard<std::mutex> lock(state_->mu);
    if (!state_->aborted) ncclCommDestroy(state_->comm);
  }

  std::string name() const override { return "nccl"; }
  int rank() const override { return state_->rank; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  bool device_buffers() const override { return true; }

  CommTicket all_reduce_sum(float* data, size_t count, Stream s) override {
    check_usable();
    if (count == 0) return {};
    cudaStream_t st = stream(s);
    STRATA_NCCL(ncclAllReduce(data, data, count, ncclFloat32, ncclSum, state_->comm, st));
    return CommTicket(std::make_shared<NcclWork>(state_, str_cat("all-reduce #", ++ops_, " (",
                                                                 count, " f32)"), st));
  }

  // Host doubles: staged through a pinned block and a device block on the compute stream. The
  // blocks come from a pool and go back to it once the ticket completes: cudaFreeHost would
  // synchronize the whole device (under the emulator: every rank's streams, a deadlock).
  CommTicket all_reduce_sum(double* values, size_t count) override {
    check_usable();
    if (count == 0) return {};
    STRATA_CHECK(count <= kScalarBlock, "a scalar all-reduce of ", count, " values (at most ",
                 kScalarBlock, "): reduce long arrays as f32 device buffers");
    const size_t bytes = count * sizeof(double);
    ScalarBlock block = scalar_block_take();
    std::memcpy(block.pinned, values, bytes);
    device_.copy_h2d(block.device, block.pinned, bytes, Stream::compute);
    cudaStream_t st = stream(Stream::compute);
    STRATA_NCCL(ncclAllReduce(block.device, block.device, count, ncclFloat64, ncclSum,
                              state_->comm, st));
    device_.copy_d2h(block.pinned, block.device, bytes, Stream::compute);
    auto work = std::make_shared<NcclWork>(state_, str_cat("all-reduce #", ++ops_, " (", count,
                                                           " f64 scalars)"), st);
    work->set_on_done([pool = pool_, block, values, bytes](bool completed) {
      if (!completed) return;  // given up: the aborted stream may still hold the block
      std::memcpy(values, block.pinned, bytes);
      std::lock_guard<std::mutex> lock(pool->mu);
      pool->free.push_back(block);
    });
    return CommTicket(work);
  }

  CommTicket broadcast(void* data, size_t bytes, int root, Stream s) override {
    check_usable();
    STRATA_ASSERT(root >= 0 && root < size_, "broadcast root ", root, " of ", size_, " ranks");
    if (bytes == 0) return {};
    cudaStream_t st = stream(s);
    STRATA_NCCL(ncclBroadcast(data, data, bytes, ncclUint8, root, state_->comm, st));
    return CommTicket(std::make_shared<NcclWork>(state_, str_cat("broadcast #", ++ops_, " (",
                                                                 bytes, " bytes)"), st));
  }

  void barrier() override {
    check_usable();
    cudaStream_t st = stream(Stream::compute);
    STRATA_NCCL(ncclAllReduce(barrier_, barrier_, 1, ncclFloat32, ncclSum, state_->comm, st));
    NcclWork(state_, str_cat("barrier #", ++ops_), st).wait();
  }

 private:
  static constexpr size_t kScalarBlock = 512;  // doubles per scalar all-reduce
  struct ScalarBlock {
    double* pinned = nullptr;  // (kScalarBlock,) host, pinned
    double* device = nullptr;  // (kScalarBlock,) device
  };
  struct ScalarPool {
    std::mutex mu;
    std::vector<ScalarBlock> free, all;
  };
  ScalarBlock scalar_block_take() {
    std::lock_guard<std::mutex> lock(pool_->mu);
    if (pool_->free.empty()) {
      ScalarBlock b;
      b.pinned = static_cast<double*>(device_.alloc_pinned(kScalarBlock * sizeof(double)));
      b.device = static_cast<double*>(device_.alloc(kScalarBlock * sizeof(double), "comm scalars"));
      pool_->all.push_back(b);
      pool_->free.push_back(b);
    }
    ScalarBlock b = pool_->free.back();
    pool_->free.pop_back();
    return b;
  }

  cudaStream_t stream(Stream s) { return static_cast<cudaStream_t>(device_.native_stream(s)); }
  void check_usable() {
    const std::string broken = state_->broken_message();
    if (!broken.empty()) throw Error(ErrorKind::io, broken);
  }

  Device& device_;
  int size_, local_rank_;
  std::unique_ptr<Comm> bootstrap_;
  std::shared_ptr<NcclState> state_;
  float* barrier_ = nullptr;
  uint64_t ops_ = 0;
  std::shared_ptr<ScalarPool> pool_ = std::make_shared<ScalarPool>();
};

}  // namespace

CommNcclId comm_nccl_unique_id() {
  ncclUniqueId uid;
  STRATA_NCCL(ncclGetUniqueId(&uid));
  CommNcclId id;
  std::memcpy(id.bytes, &uid, sizeof id.bytes);
  return id;
}

std::unique_ptr<Comm> comm_create_nccl(Device& device, int rank, int size, int local_rank,
                                       const CommNcclId& id, double timeout_s,
                                       std::unique_ptr<Comm> bootstrap) {
  return std::make_unique<NcclComm>(device, rank, size, local_rank, id, timeout_s,
                                    std::move(bootstrap));
}

}  // namespace strata
