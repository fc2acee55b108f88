// cuemu_nccl.cpp - the NCCL calls strata's comm layer makes (src/comm/comm_nccl.cpp), emulated
// with the ranks as threads of one process: ncclGetUniqueId, ncclCommInitRank (a rendezvous of
// `nranks` threads on the id), ncclAllReduce (sum of f32/f64), ncclBroadcast, ncclGroupStart /
// ncclGroupEnd (calls inside a group are submitted at the outermost GroupEnd, in call order),
// ncclCommAbort / Destroy / GetAsyncError / Count / UserRank, ncclGetErrorString.
//
// A collective is queued on its emulated stream like a kernel; the n-th collective of every rank
// of a communicator meets the others' n-th on their stream threads. The last to arrive computes
// the result once (so every rank receives the same bits, as with NCCL's ring and tree
// algorithms) and each rank copies it into its receive buffer. The sum is taken in ring order
// (chunk c of n starts at rank c+1 and ends at rank c), not in rank order, like NCCL's ring
// reduce-scatter: a test must not mistake NCCL for a rank-order sum. Mismatched collectives
// (count, type, kind or root differing between ranks) are reported and abort, as they would
// hang or corrupt on real NCCL. A rank that never arrives leaves the others waiting, as on
// real NCCL, until their communicator is aborted.
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "tools/cuemu/cuemu_internal.h"

namespace {

using cuemu::detail::report;

enum class Kind { all_reduce, broadcast };

struct Slot {  // one collective, as the ranks arrive
  int arrived = 0, departed = 0;
  bool ready = false;
  Kind kind{};
  size_t count = 0;
  ncclDataType_t type{};
  int root = 0;
  std::vector<const void*> send;
  std::vector<char> result;
};

struct Clique {  // the ranks of one communicator
  int nranks = 0;
  std::mutex mu;
  std::condition_variable cv;
  std::set<int> joined;
  std::map<uint64_t, Slot> slots;  // by collective number
};

size_t type_bytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}

template <class T>
void ring_sum(char* out, const std::vector<const void*>& send, size_t count) {
  const size_t n = send.size();
  T* o = reinterpret_cast<T*>(out);
  for (size_t i = 0; i < count; ++i) {
    const size_t chunk = i * n / count;
    const size_t start = (chunk + 1) % n;
    T acc = static_cast<const T*>(send[start])[i];
    for (size_t k = 1; k < n; ++k) acc += static_cast<const T*>(send[(start + k) % n])[i];
    o[i] = acc;
  }
}

std::mutex g_registry_mu;
std::map<std::string, std::shared_ptr<Clique>> g_registry;  // cliques still gathering, by id
std::atomic<uint64_t> g_next_id{1};

thread_local int tl_group_depth = 0;
thread_local std::vector<std::pair<cudaStream_t, std::function<void()>>> tl_group_ops;

}  // namespace

struct ncclComm {
  std::shared_ptr<Clique> clique;
  int rank = 0;
  uint64_t next_seq = 0;
  std::shared_ptr<std::atomic<bool>> aborted = std::make_shared<std::atomic<bool>>(false);
};

namespace {

// Runs on rank `rank`'s stream thread.
void meet(const std::shared_ptr<Clique>& c, const std::shared_ptr<std::atomic<bool>>& aborted,
          uint64_t seq, int rank, Kind kind, const void* send, void* recv, size_t count,
          ncclDataType_t type, int root) {
  const char* name = kind == Kind::all_reduce ? "ncclAllReduce" : "ncclBroadcast";
  std::unique_lock<std::mutex> lock(c->mu);
  Slot& s = c->slots[seq];
  if (s.arrived == 0) {
    s.kind = kind, s.count = count, s.type = type, s.root = root;
    s.send.assign(size_t(c->nranks), nullptr);
  } else if (s.kind != kind || s.count != count || s.type != type || s.root != root) {
    cuemu::detail::fatal("NCCL collective #%llu: rank %d called %s(count %zu, type %d, root %d) "
                         "but an earlier rank called %s(count %zu, type %d, root %d): every rank "
                         "must issue the same collectives in the same order",
                         (unsigned long long)seq, rank, name, count, int(type), root,
                         s.kind == Kind::all_reduce ? "ncclAllReduce" : "ncclBroadcast", s.count,
                         int(s.type), s.root);
  }
  s.send[size_t(rank)] = send;
  const size_t bytes = count * type_bytes(type);
  if (++s.arrived == c->nranks) {
    s.result.resize(bytes);
    if (kind == Kind::broadcast) {
      std::memcpy(s.result.data(), s.send[size_t(root)], bytes);
    } else if (type == ncclFloat32) {
      ring_sum<float>(s.result.data(), s.send, count);
    } else {
      ring_sum<double>(s.result.data(), s.send, count);
    }
    s.ready = true;
    c->cv.notify_all();
  } else {
    c->cv.wait(lock, [&] { return s.ready || aborted->load(); });
    if (!s.ready) return;  // this rank's communicator was aborted
  }
  lock.unlock();
  std::memcpy(recv, s.result.data(), bytes);  // result is immutable until every rank departs
  lock.lock();
  if (++s.departed == c->nranks) c->slots.erase(seq);
}

ncclResult_t enqueue(ncclComm_t comm, cudaStream_t stream, Kind kind, const void* send,
                     void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op, int root) {
  const char* name = kind == Kind::all_reduce ? "ncclAllReduce" : "ncclBroadcast";
  if (!comm || !comm->clique) return ncclInvalidArgument;
  const size_t eb = type_bytes(type);
  if (eb == 0) {
    report("%s: unsupported data type %d", name, int(type));
    return ncclInvalidArgument;
  }
  if (kind == Kind::all_reduce && (op != ncclSum || (type != ncclFloat32 && type != ncclFloat64))) {
    report("%s: the emulator implements ncclSum of ncclFloat32 / ncclFloat64 (got op %d, type %d)",
           name, int(op), int(type));
    return ncclInvalidArgument;
  }
  if (root < 0 || root >= comm->clique->nranks) {
    report("%s: root %d of %d ranks", name, root, comm->clique->nranks);
    return ncclInvalidArgument;
  }
  const size_t bytes = count * eb;
  const bool sends = kind == Kind::all_reduce || comm->rank == root;
  if (bytes && ((sends && !cuemu::detail::is_device_range(send, bytes)) ||
                !cuemu::detail::is_device_range(recv, bytes))) {
    report("%s: rank %d's buffers (send %p, recv %p, %zu bytes) are not device memory", name,
           comm->rank, send, recv, bytes);
    return ncclInvalidArgument;
  }
  if (!cuemu::detail::stream_known(stream)) return ncclInvalidArgument;
  auto op_fn = [c = comm->clique, aborted = comm->aborted, seq = comm->next_seq++,
                rank = comm->rank, kind, send, recv, count, type, root] {
    meet(c, aborted, seq, rank, kind, send, recv, count, type, root);
  };
  if (tl_group_depth > 0) {
    tl_group_ops.emplace_back(stream, std::move(op_fn));
    return ncclSuccess;
  }
  return cuemu::detail::stream_submit(stream, std::move(op_fn)) == cudaSuccess ? ncclSuccess
                                                                               : ncclUnhandledCudaError;
}

}  // namespace

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (!id) return ncclInvalidArgument;
  std::memset(id->internal, 0, sizeof id->internal);
  const std::string tag = "cuemu-nccl-" + std::to_string(g_next_id++);
  std::memcpy(id->internal, tag.data(), tag.size());
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  if (!comm || nranks < 1 || rank < 0 || rank >= nranks) {
    report("ncclCommInitRank: rank %d of %d", rank, nranks);
    return ncclInvalidArgument;
  }
  const std::string key(id.internal, sizeof id.internal);
  std::shared_ptr<Clique> c;
  {
    std::lock_guard<std::mutex> lock(g_registry_mu);
    auto& slot = g_registry[key];
    if (!slot) {
      slot = std::make_shared<Clique>();
      slot->nranks = nranks;
    }
    c = slot;
  }
  std::unique_lock<std::mutex> lock(c->mu);
  if (c->nranks != nranks || c->joined.count(rank)) {
    report("ncclCommInitRank: rank %d of %d joins a communicator of %d ranks%s", rank, nranks,
           c->nranks, c->joined.count(rank) ? " where that rank has already joined" : "");
    return ncclInvalidUsage;
  }
  c->joined.insert(rank);
  c->cv.notify_all();
  // Real NCCL blocks until every rank has joined; so does this (a minute, then an error).
  if (!c->cv.wait_for(lock, std::chrono::seconds(60), [&] { return int(c->joined.size()) == nranks; })) {
    report("ncclCommInitRank: only %zu of %d ranks joined within 60 s", c->joined.size(), nranks);
    c->joined.erase(rank);
    return ncclSystemError;
  }
  lock.unlock();
  {
    std::lock_guard<std::mutex> reg(g_registry_mu);
    g_registry.erase(key);  // an id makes one communicator
  }
  *comm = new ncclComm;
  (*comm)->clique = c;
  (*comm)->rank = rank;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  comm->aborted->store(true);
  {
    std::lock_guard<std::mutex> lock(comm->clique->mu);  // no waiter misses the flag
  }
  comm->clique->cv.notify_all();
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  if (!comm || !async_error) return ncclInvalidArgument;
  *async_error = ncclSuccess;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (!comm || !count) return ncclInvalidArgument;
  *count = comm->clique->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (!comm || !rank) return ncclInvalidArgument;
  *rank = comm->rank;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return enqueue(comm, stream, Kind::all_reduce, sendbuff, recvbuff, count, datatype, op, 0);
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           int root, ncclComm_t comm, cudaStream_t stream) {
  return enqueue(comm, stream, Kind::broadcast, sendbuff, recvbuff, count, datatype, ncclSum, root);
}

ncclResult_t ncclGroupStart() {
  ++tl_group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (tl_group_depth == 0) {
    report("ncclGroupEnd without ncclGroupStart");
    return ncclInvalidUsage;
  }
  if (--tl_group_depth > 0) return ncclSuccess;
  auto ops = std::move(tl_group_ops);
  tl_group_ops.clear();
  for (auto& [stream, fn] : ops)
    if (cuemu::detail::stream_submit(stream, std::move(fn)) != cudaSuccess) return ncclUnhandledCudaError;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}
