#include "src/core/threads.h"

#include <omp.h>
#include <pthread.h>
#include <sys/resource.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "src/core/error.h"
#include "src/core/fault.h"

namespace strata {

static std::atomic<int> g_threads{0};
static const int g_default = omp_get_max_threads();

void cpu_threads_set(int n) { g_threads = n; }

int cpu_threads_count() {
  const int n = g_threads.load();
  return n > 0 ? n : g_default;
}

void cpu_threads_apply() {
  const int want = cpu_threads_count();
  if (omp_get_max_threads() != want) omp_set_num_threads(want);
}

namespace {

// The stack libgomp gives its threads: OMP_STACKSIZE (or GOMP_STACKSIZE) as libgomp parses it
// (a size with an optional B, K, M or G suffix, K when none), else 0: the pthread default.
size_t omp_stack_bytes() {
  for (const char* var : {"OMP_STACKSIZE", "GOMP_STACKSIZE"}) {
    const char* v = std::getenv(var);
    if (!v || !*v) continue;
    char* end = nullptr;
    const unsigned long long n = std::strtoull(v, &end, 10);
    if (end == v) return 0;  // libgomp ignores it too
    while (std::isspace(static_cast<unsigned char>(*end))) ++end;
    const char unit = char(std::tolower(static_cast<unsigned char>(*end)));
    const int shift = unit == 'b' ? 0 : unit == 'm' ? 20 : unit == 'g' ? 30 : 10;
    return size_t(n) << shift;
  }
  return 0;
}

std::string limit_text(int resource, const char* unit_name, unsigned long long unit) {
  rlimit r{};
  if (getrlimit(resource, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return "unlimited";
  return std::to_string(static_cast<unsigned long long>(r.rlim_cur) / unit) + unit_name;
}

// Threads created and parked until release(): how many the OS lets this process have now.
class ParkedThreads {
 public:
  ~ParkedThreads() { release(); }
  // 0, or the error of the thread that could not be made (then fewer are parked)
  int create(int count, size_t stack_bytes) {
    threads_.reserve(size_t(count));
    pthread_attr_t attr;
    int err = pthread_attr_init(&attr);
    if (err) return err;
    if (stack_bytes) pthread_attr_setstacksize(&attr, stack_bytes);  // refused: libgomp keeps the default too
    for (int i = 0; i < count && !err; ++i) {
      pthread_t t;
      // STRATA_FAULT=thread@thread-start: fails as pthread_create does when the limits are reached
      err = fault_point("thread-start") == FaultKind::thread ? EAGAIN : pthread_create(&t, &attr, park, this);
      if (!err) threads_.push_back(t);
    }
    pthread_attr_destroy(&attr);
    return err;
  }
  int count() const { return int(threads_.size()); }
  void release() noexcept {
    {
      std::lock_guard lock(mu_);
      released_ = true;
    }
    cv_.notify_all();
    for (pthread_t t : threads_) pthread_join(t, nullptr);
    threads_.clear();
  }

 private:
  static void* park(void* self) {
    auto* p = static_cast<ParkedThreads*>(self);
    {
      std::unique_lock lock(p->mu_);
      p->cv_.wait(lock, [&] { return p->released_; });
    }
    // Ends through pthread_exit, as libgomp's pool threads do when their team goes: glibc loads
    // its unwinder (libgcc_s) at the first pthread_exit, and under ulimit -v that load fails
    // later ("libgcc_s.so.1 must be installed for unwinding to work", abort) but not now.
    pthread_exit(nullptr);
  }
  std::mutex mu_;
  std::condition_variable cv_;
  bool released_ = false;
  std::vector<pthread_t> threads_;
};

// Creates and holds `want` threads, then lets them go; Error(budget) when the OS refuses one.
void check_threads_can_start(int want, int pools, int n) {
  const size_t stack_bytes = omp_stack_bytes();
  ParkedThreads parked;
  const int err = parked.create(want, stack_bytes);
  const int made = parked.count();
  parked.release();
  if (err == 0) return;
  std::string stack = "the default stack (ulimit -s)";
  if (stack_bytes) stack = str_cat(stack_bytes >> 20, " MiB of stack (OMP_STACKSIZE)");
  STRATA_CHECK_BUDGET(false, "cannot start the CPU kernels' threads: thread ", made + 1, " of the ", want,
                      " needed could not be created (", std::strerror(err), "): ", pools, " OpenMP pool",
                      pools > 1 ? "s" : "", " of device.cpu_threads - 1 = ", n - 1, " threads, with ", stack,
                      ". Lower device.cpu_threads (now ", n, ") in the recipe, or raise the process limits: "
                      "ulimit -v (address space, now ", limit_text(RLIMIT_AS, " KiB", 1024), "), ulimit -u "
                      "(processes, now ", limit_text(RLIMIT_NPROC, "", 1), ")");
}

}  // namespace

void cpu_threads_start_team() {
  const int n = cpu_threads_count();
  if (n > 1) check_threads_can_start(n - 1, 1, n);
  cpu_threads_apply();
  std::atomic<int> team{0};
#pragma omp parallel num_threads(n)
  team.fetch_add(1, std::memory_order_relaxed);
}

void cpu_threads_start() {
  static std::mutex mu;
  static int started = 0;  // the largest count checked so far
  std::lock_guard lock(mu);
  const int n = cpu_threads_count();
  if (n <= started) return;
  // every pool at its largest, and the workers themselves (streams, host queue, checkpoint
  // spill, file engine) that are not all there yet
  constexpr int kWorkers = kCpuThreadPools + 2;
  check_threads_can_start(kCpuThreadPools * (n - 1) + kWorkers, kCpuThreadPools, n);
  cpu_threads_start_team();
  started = n;
}

}  // namespace strata
