// cuemu_exec.cpp - runs a kernel grid on the CPU: launch checks, block order, and the two
// executors (ucontext fibers on the stream's worker thread, or one OS thread per CUDA thread),
// with __syncthreads, warp rendezvous for the _sync shuffles/votes, and deadlock detection.
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "tools/cuemu/cuemu.h"
#include "tools/cuemu/cuemu_internal.h"

namespace cuemu::detail {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;

// A set of lanes that rendezvous on one _sync intrinsic with the same mask. Values are
// double-buffered by round parity: a lane can only write round r+2 after every lane of the mask
// arrived at round r+1, i.e. after all of them read round r.
struct WarpGroup {
  unsigned mask = 0;
  unsigned arrived = 0;
  uint64_t round = 0;
  unsigned voters[2] = {0, 0};  // lanes that took part in each round parity
  uint64_t slot[2][32] = {};
};

struct WarpState {
  // Per warp, not per block: a lock shared by the whole block would give ThreadSanitizer a
  // happens-before edge between warps at every shuffle and hide a missing __syncthreads.
  std::mutex m;
  std::deque<WarpGroup> groups;  // deque: waiting lanes hold references across emplace_back
  unsigned exited = 0;  // lanes that returned from the kernel, or that do not exist (partial warp)
  std::condition_variable cv;
};

struct BlockState {
  bool fibers = true;
  std::mutex m;
  std::condition_variable cv;
  unsigned threads = 0;
  unsigned live = 0, arrived = 0;
  uint64_t round = 0;
  int reduce_acc[3] = {0, 1, 0};
  int reduce_result[3] = {0, 0, 0};
  std::vector<WarpState> warps;
  unsigned char* dyn_smem = nullptr;
  uint64_t progress = 0;  // fibers only: bumped when a thread arrives, completes a rendezvous or exits
  std::vector<const char*> waiting_on;   // per thread, for deadlock reports
};

thread_local BlockState* tl_block = nullptr;
thread_local unsigned tl_linear = 0;

// ---- fibers ------------------------------------------------------------------------------------
constexpr size_t kFiberStackBytes = 256 * 1024;

struct FiberStack {
  char* base = nullptr;  // guard page first, then the stack
  size_t bytes = 0;
};

struct FiberRun {
  ucontext_t main_ctx;
  std::vector<ucontext_t> ctx;
  std::vector<uint8_t> done;
  unsigned current = 0;
  const std::function<void()>* body = nullptr;
};
thread_local FiberRun* tl_fibers = nullptr;
// A thread's stacks, unmapped when the thread ends (tests that start threads per case, e.g. ranks
// as threads, would otherwise run out of mappings: vm.max_map_count).
struct FiberStackPool : std::vector<FiberStack> {
  ~FiberStackPool() {
    for (const FiberStack& s : *this) munmap(s.base, s.bytes);
  }
};
thread_local FiberStackPool tl_stack_pool;

void fiber_stacks_reserve(unsigned n) {
  long page = sysconf(_SC_PAGESIZE);
  while (tl_stack_pool.size() < n) {
    size_t bytes = kFiberStackBytes + static_cast<size_t>(page);
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) fatal("cannot map a %zu-byte fiber stack", bytes);
    mprotect(p, static_cast<size_t>(page), PROT_NONE);  // overflow faults instead of corrupting a neighbour
    tl_stack_pool.push_back({static_cast<char*>(p), bytes});
  }
}

void thread_exit_block();

void fiber_main() {
  FiberRun* run = tl_fibers;
  (*run->body)();
  thread_exit_block();
  run->done[run->current] = 1;  // returning switches to uc_link (the scheduler)
}

void fiber_yield(const char* what) {
  FiberRun* run = tl_fibers;
  tl_block->waiting_on[run->current] = what;
  swapcontext(&run->ctx[run->current], &run->main_ctx);
  tl_block->waiting_on[run->current] = nullptr;
}

uint3 thread_index(unsigned linear, dim3 b) { return {linear % b.x, (linear / b.x) % b.y, linear / (b.x * b.y)}; }

// Blocks until done() under the block mutex: fibers yield, OS threads wait on `cv`.
template <class Done>
void block_wait(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, Done done, const char* what) {
  BlockState& b = *tl_block;
  if (b.fibers) {
    while (!done()) {
      lock.unlock();
      fiber_yield(what);
      lock.lock();
    }
    return;
  }
  while (!cv.wait_for(lock, std::chrono::seconds(60), done))
    fatal("deadlock: block (%u,%u,%u) thread %u waited 60 s in %s", blockIdx.x, blockIdx.y, blockIdx.z,
          tl_linear, what);
}

void note_progress(BlockState& b) {
  if (b.fibers) ++b.progress;  // one OS thread runs all fibers: no data race
}

void barrier_complete(BlockState& b) {
  for (int k = 0; k < 3; ++k) b.reduce_result[k] = b.reduce_acc[k];
  b.reduce_acc[0] = 0;
  b.reduce_acc[1] = 1;
  b.reduce_acc[2] = 0;
  b.arrived = 0;
  ++b.round;
  note_progress(b);
  if (!b.fibers) b.cv.notify_all();
}

void group_complete(BlockState& b, WarpState& w, WarpGroup& g) {
  g.voters[g.round & 1] = g.arrived;
  g.arrived = 0;
  ++g.round;
  note_progress(b);
  if (!b.fibers) w.cv.notify_all();
}

bool group_ready(const WarpState& w, const WarpGroup& g) { return ((g.arrived | w.exited) & g.mask) == g.mask; }

void thread_exit_block() {
  BlockState& b = *tl_block;
  {
    std::lock_guard<std::mutex> lock(b.m);
    --b.live;
    note_progress(b);
    if (b.arrived > 0 && b.arrived == b.live) barrier_complete(b);
  }
  WarpState& w = b.warps[tl_linear / 32];
  std::lock_guard<std::mutex> lock(w.m);
  w.exited |= 1u << (tl_linear % 32);
  for (WarpGroup& g : w.groups)
    if (g.arrived != 0 && group_ready(w, g)) group_complete(b, w, g);
}

// One rendezvous of this lane on `mask`; writes `bits` for the round and returns the round's
// (parity, group) so the caller can read the other lanes' values.
struct Rendezvous {
  WarpGroup* group;
  unsigned parity;
};
Rendezvous warp_rendezvous(unsigned mask, uint64_t bits, const char* what) {
  BlockState& b = *tl_block;
  unsigned lane = tl_linear % 32;
  if (!(mask >> lane & 1u))
    fatal("%s called by lane %u of block (%u,%u,%u) thread %u with mask 0x%08x that omits the lane itself", what,
          lane, blockIdx.x, blockIdx.y, blockIdx.z, tl_linear, mask);
  WarpState& w = b.warps[tl_linear / 32];
  std::unique_lock<std::mutex> lock(w.m);
  WarpGroup* g = nullptr;
  for (WarpGroup& x : w.groups) {
    if (x.mask == mask) g = &x;
    else if (x.arrived != 0 && (x.mask & mask) != 0)
      fatal("%s with mask 0x%08x while lanes of the same warp wait with the overlapping mask 0x%08x "
            "(block (%u,%u,%u) thread %u): divergent _sync masks are undefined behaviour",
            what, mask, x.mask, blockIdx.x, blockIdx.y, blockIdx.z, tl_linear);
  }
  if (!g) {
    w.groups.emplace_back();
    g = &w.groups.back();
    g->mask = mask;
  }
  uint64_t round = g->round;
  unsigned parity = static_cast<unsigned>(round & 1);
  g->slot[parity][lane] = bits;
  g->arrived |= 1u << lane;
  note_progress(b);
  if (group_ready(w, *g)) group_complete(b, w, *g);
  else block_wait(lock, w.cv, [&] { return g->round != round; }, what);
  return {g, parity};
}

}  // namespace

// ---- device-side entry points (declared in cuemu.h) --------------------------------------------
unsigned lane_id() { return tl_linear % 32; }
void* dynamic_shared() { return tl_block->dyn_smem; }

void block_sync() { block_sync_reduce(0, 0); }

int block_sync_reduce(int predicate, int kind) {
  BlockState& b = *tl_block;
  std::unique_lock<std::mutex> lock(b.m);
  uint64_t round = b.round;
  b.reduce_acc[0] += predicate != 0;
  b.reduce_acc[1] &= predicate != 0;
  b.reduce_acc[2] |= predicate != 0;
  ++b.arrived;
  note_progress(b);
  if (b.arrived == b.live) barrier_complete(b);
  else block_wait(lock, b.cv, [&] { return b.round != round; }, "__syncthreads");
  return b.reduce_result[kind];
}

void warp_sync(unsigned mask) { warp_rendezvous(mask, 0, "__syncwarp"); }

uint64_t warp_exchange(unsigned mask, uint64_t bits, int src_lane) {
  Rendezvous r = warp_rendezvous(mask, bits, "__shfl_*_sync");
  if (src_lane < 0) return bits;
  // A source lane outside the mask, or one that exited, gives an undefined value on a GPU: hand
  // back all-ones (NaN for floats) so a kernel relying on it fails visibly.
  std::lock_guard<std::mutex> lock(tl_block->warps[tl_linear / 32].m);
  if (!(r.group->voters[r.parity] >> src_lane & 1u)) return ~uint64_t{0};
  return r.group->slot[r.parity][src_lane];
}

void warp_gather(unsigned mask, uint64_t bits, uint64_t* all) {
  Rendezvous r = warp_rendezvous(mask, bits, "nvcuda::wmma::mma_sync");
  std::lock_guard<std::mutex> lock(tl_block->warps[tl_linear / 32].m);
  for (unsigned l = 0; l < 32; ++l)
    all[l] = (r.group->voters[r.parity] >> l & 1u) ? r.group->slot[r.parity][l] : ~uint64_t{0};
}

unsigned warp_ballot(unsigned mask, int predicate) {
  Rendezvous r = warp_rendezvous(mask, predicate != 0, "__ballot_sync/__any_sync/__all_sync");
  std::lock_guard<std::mutex> lock(tl_block->warps[tl_linear / 32].m);
  unsigned out = 0;
  for (unsigned l = 0; l < 32; ++l)
    if ((r.group->voters[r.parity] >> l & 1u) && r.group->slot[r.parity][l]) out |= 1u << l;
  return out;
}

// ---- the grid ----------------------------------------------------------------------------------
namespace {

std::mutex g_kernel_mutex;  // kernels run one at a time: function-static __shared__ stays per block
std::atomic<uint64_t> g_launch_counter{0};

// The OS threads of the thread executor, kept from launch to launch: creating a block's worth of
// threads per launch cost most of a ThreadSanitizer run, and every thread ever created widens
// TSan's vector clocks. Used under g_kernel_mutex (one kernel at a time), so one team suffices.
// Launch -> team thread -> launch hand-offs go through mutexes, which gives TSan the same
// happens-before edges as creating and joining threads did: a kernel's writes are ordered
// before the next kernel on the stream, nothing more.
class ThreadTeam {
 public:
  ThreadTeam() = default;
  ThreadTeam(const ThreadTeam&) = delete;
  ThreadTeam& operator=(const ThreadTeam&) = delete;
  ~ThreadTeam() {
    for (auto& m : members_) {
      {
        std::lock_guard<std::mutex> lock(m->mutex);
        m->stop = true;
      }
      m->cv.notify_one();
      m->thread.join();
    }
  }

  // Runs job(t) for t = 0..n-1, each on its own team thread; returns when all have returned.
  void run(unsigned n, const std::function<void(unsigned)>& job) {
    while (members_.size() < n) {
      auto m = std::make_unique<Member>();
      Member* raw = m.get();
      const auto index = static_cast<unsigned>(members_.size());
      m->thread = std::thread([this, raw, index] { member_loop(*raw, index); });
      members_.push_back(std::move(m));
    }
    {
      std::lock_guard<std::mutex> lock(done_mutex_);
      running_ = n;
    }
    for (unsigned t = 0; t < n; ++t) {
      Member& m = *members_[t];
      {
        std::lock_guard<std::mutex> lock(m.mutex);
        m.job = &job;
      }
      m.cv.notify_one();
    }
    std::unique_lock<std::mutex> lock(done_mutex_);
    done_cv_.wait(lock, [&] { return running_ == 0; });
  }

 private:
  struct Member {
    std::thread thread;
    std::mutex mutex;
    std::condition_variable cv;
    const std::function<void(unsigned)>* job = nullptr;
    bool stop = false;
  };

  void member_loop(Member& m, unsigned index) {
    for (;;) {
      const std::function<void(unsigned)>* job;
      {
        std::unique_lock<std::mutex> lock(m.mutex);
        m.cv.wait(lock, [&] { return m.stop || m.job != nullptr; });
        if (m.stop) return;
        job = m.job;
        m.job = nullptr;
      }
      (*job)(index);
      std::lock_guard<std::mutex> lock(done_mutex_);
      if (--running_ == 0) done_cv_.notify_one();
    }
  }

  std::vector<std::unique_ptr<Member>> members_;
  std::mutex done_mutex_;
  std::condition_variable done_cv_;
  unsigned running_ = 0;
};

ThreadTeam& thread_team() {
  static ThreadTeam team;
  return team;
}

void block_reset(BlockState& b) {
  b.live = b.threads;
  b.arrived = 0;
  b.reduce_acc[0] = 0;
  b.reduce_acc[1] = 1;
  b.reduce_acc[2] = 0;
  for (size_t wi = 0; wi < b.warps.size(); ++wi) {
    WarpState& w = b.warps[wi];
    w.groups.clear();
    unsigned first = static_cast<unsigned>(wi) * 32;
    unsigned lanes = std::min(32u, b.threads - first);
    w.exited = lanes == 32 ? 0u : ~((1u << lanes) - 1u);
  }
}

__attribute__((noinline)) void fiber_prepare(FiberRun& run, unsigned t) {
  size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  getcontext(&run.ctx[t]);
  run.ctx[t].uc_stack.ss_sp = tl_stack_pool[t].base + page;
  run.ctx[t].uc_stack.ss_size = tl_stack_pool[t].bytes - page;
  run.ctx[t].uc_link = &run.main_ctx;
  makecontext(&run.ctx[t], fiber_main, 0);
}

// Separate and not inlined: swapcontext returns twice, which must not clobber the caller's locals.
__attribute__((noinline)) void fiber_resume(FiberRun& run, unsigned t, dim3 block_dim) {
  run.current = t;
  tl_linear = t;
  threadIdx = thread_index(t, block_dim);
  swapcontext(&run.main_ctx, &run.ctx[t]);
}

void run_block_fibers(BlockState& b, dim3 block_dim, const std::function<void()>& body) {
  unsigned n = b.threads;
  fiber_stacks_reserve(n);
  FiberRun run;
  run.ctx.resize(n);
  run.done.assign(n, 0);
  run.body = &body;
  FiberRun* saved = tl_fibers;
  tl_fibers = &run;
  for (unsigned t = 0; t < n; ++t) fiber_prepare(run, t);
  for (unsigned left = n; left > 0;) {
    uint64_t before = b.progress;
    for (unsigned t = 0; t < n; ++t) {
      if (run.done[t]) continue;
      fiber_resume(run, t, block_dim);
      if (run.done[t]) --left;
    }
    if (left > 0 && b.progress == before) {
      std::string who;
      for (unsigned t = 0; t < n && who.size() < 400; ++t)
        if (!run.done[t]) who += " t" + std::to_string(t) + ":" + (b.waiting_on[t] ? b.waiting_on[t] : "?");
      fatal("deadlock in block (%u,%u,%u): no thread can proceed; waiting:%s", blockIdx.x, blockIdx.y, blockIdx.z,
            who.c_str());
    }
  }
  tl_fibers = saved;
}

void run_grid(const LaunchSite& site, const std::function<void()>& body) {
  const Options& opt = options_current();
  dim3 g = site.grid, bd = site.block;
  std::vector<uint3> order;
  order.reserve(static_cast<size_t>(g.x) * g.y * g.z);
  for (unsigned z = 0; z < g.z; ++z)
    for (unsigned y = 0; y < g.y; ++y)
      for (unsigned x = 0; x < g.x; ++x) order.push_back({x, y, z});
  uint64_t launch_no = g_launch_counter.fetch_add(1);
  if (opt.shuffle_blocks) {
    std::mt19937_64 rng(opt.seed * 0x9e3779b97f4a7c15ull + launch_no);
    std::shuffle(order.begin(), order.end(), rng);
  }
  BlockState b;
  b.fibers = opt.executor == Executor::fibers;
  b.threads = bd.x * bd.y * bd.z;
  b.warps = std::vector<WarpState>((b.threads + 31) / 32);
  b.waiting_on.assign(b.threads, nullptr);
  const size_t smem_alloc = (std::max<size_t>(site.dynamic_smem_bytes, 16) + 127) / 128 * 128;
  std::unique_ptr<void, decltype(&std::free)> smem(std::aligned_alloc(128, smem_alloc), &std::free);
  b.dyn_smem = static_cast<unsigned char*>(smem.get());

  std::lock_guard<std::mutex> kernel_lock(g_kernel_mutex);
  if (b.fibers) {
    BlockState* saved = tl_block;
    tl_block = &b;
    blockDim = bd;
    gridDim = g;
    for (const uint3& bi : order) {
      block_reset(b);
      std::memset(b.dyn_smem, 0xff, site.dynamic_smem_bytes);  // shared memory starts as NaN garbage
      blockIdx = bi;
      run_block_fibers(b, bd, body);
    }
    tl_block = saved;
    return;
  }
  // One OS thread per CUDA thread, reused for every block of the launch.
  std::barrier<> between(b.threads);
  thread_team().run(b.threads, [&](unsigned t) {
    tl_block = &b;
    tl_linear = t;
    blockDim = bd;
    gridDim = g;
    threadIdx = thread_index(t, bd);
    for (const uint3& bi : order) {
      if (t == 0) {
        block_reset(b);
        std::memset(b.dyn_smem, 0xff, site.dynamic_smem_bytes);
      }
      between.arrive_and_wait();  // the block starts with every thread live
      blockIdx = bi;
      body();
      thread_exit_block();
      between.arrive_and_wait();  // the block ends before its shared memory is reused
    }
    tl_block = nullptr;
  });
}

}  // namespace

bool launch_validate(const LaunchSite& s) {
  auto reject = [&](cudaError_t e, const std::string& why) {
    report("%s:%d: launch of %s rejected: %s", s.file, s.line, s.kernel_name, why.c_str());
    set_last_error(e);
    return false;
  };
  dim3 b = s.block, g = s.grid;
  uint64_t threads = uint64_t{b.x} * b.y * b.z;
  if (threads == 0 || threads > 1024 || b.x > 1024 || b.y > 1024 || b.z > 64)
    return reject(cudaErrorInvalidConfiguration,
                  "block (" + std::to_string(b.x) + "," + std::to_string(b.y) + "," + std::to_string(b.z) +
                      ") must have 1..1024 threads, x,y <= 1024, z <= 64");
  if (g.x == 0 || g.y == 0 || g.z == 0 || g.x > 0x7fffffffu || g.y > 65535 || g.z > 65535)
    return reject(cudaErrorInvalidConfiguration,
                  "grid (" + std::to_string(g.x) + "," + std::to_string(g.y) + "," + std::to_string(g.z) +
                      ") must be nonzero with x < 2^31, y,z <= 65535");
  size_t limit = kernel_max_dynamic_smem(s.kernel);
  if (s.dynamic_smem_bytes > limit)
    return reject(cudaErrorInvalidValue,
                  std::to_string(s.dynamic_smem_bytes) + " bytes of dynamic shared memory exceed this kernel's " +
                      std::to_string(limit) +
                      " (raise it with cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, "
                      "bytes), at most 232448)");
  if (!stream_known(s.stream)) return reject(cudaErrorInvalidResourceHandle, "unknown or destroyed stream");
  return true;
}

bool launch_check_pointer(const LaunchSite& s, int arg_index, const void* p) {
  if (!p || !options_current().check_pointer_args || is_device_range(p, 0) || is_pinned_range(p, 0)) return true;
  report("%s:%d: launch of %s rejected: argument %d (%p) is neither device nor pinned host memory; a GPU "
         "would fault reading it", s.file, s.line, s.kernel_name, arg_index, p);
  set_last_error(cudaErrorInvalidValue);
  return false;
}

void launch_enqueue(const LaunchSite& site, std::function<void()> thread_body) {
  cudaError_t e = stream_submit(site.stream, [site, body = std::move(thread_body)] { run_grid(site, body); });
  if (e != cudaSuccess) set_last_error(e);
}

}  // namespace cuemu::detail
