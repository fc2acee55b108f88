// cuemu_pinned.cpp - pinned host memory and the in-flight-copy hazard detector.
//
// HAZARD: on a GPU, an async copy reads (host->device) or writes (device->host) a pinned buffer at
// some later time; a host access to that buffer before the copy's completion is observed is a race
// that only shows when copies are slow. cuemu makes it fault instead: while a copy is queued or
// running, the pages holding its host side are write-protected (host->device source) or made
// inaccessible (device->host destination). The copy engine itself goes through /proc/self/mem,
// which ignores page protection. A SIGSEGV handler tells our faults from others (which it passes
// on), reports the address, and either aborts or, under HazardPolicy::record, records the hazard,
// unprotects the page and lets the program continue.
//
// Under ThreadSanitizer the copy engine's /proc/self/mem transfers would hide the pinned side of
// every copy (the kernel, not instrumented code, touches it); mem_io reports that side to TSan as
// a read or write by the stream's thread, so a host access to a pinned buffer that is not ordered
// after its copy's completion is a TSan race as well as (while the copy is in flight) a hazard.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "tools/cuemu/cuemu_internal.h"

#if defined(__SANITIZE_THREAD__)
// libtsan's entry points for an access of a whole range (declared as GCC's built-ins are).
extern "C" void __tsan_read_range(void* addr, long size);
extern "C" void __tsan_write_range(void* addr, long size);
#endif

namespace cuemu::detail {
namespace {

const uintptr_t kPage = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));

// Pinned ranges, as a lock-free table for the signal handler plus page counters under a mutex.
constexpr int kMaxRanges = 4096;
struct RangeSlot {
  std::atomic<uintptr_t> begin{0}, end{0};
};
RangeSlot g_ranges[kMaxRanges];

// Copies in flight (host side), also lock-free for the handler.
constexpr int kMaxCopies = 4096;
struct CopySlot {
  std::atomic<uintptr_t> begin{0}, end{0};
  std::atomic<bool> to_host{false};
  std::atomic<bool> used{false};
};
CopySlot g_copies[kMaxCopies];

struct PageCount {
  int reads = 0;   // in-flight host->device copies reading the page
  int writes = 0;  // in-flight device->host copies writing the page
};
std::mutex g_mutex;
std::map<uintptr_t, PageCount> g_pages;  // page address -> in-flight counts

// Hazards recorded under HazardPolicy::record.
constexpr int kMaxHazards = 256;
struct HazardSlot {
  std::atomic<uintptr_t> address{0}, buffer{0};
  std::atomic<bool> host_wrote{false}, to_host{false};
};
HazardSlot g_hazards[kMaxHazards];
std::atomic<int> g_hazard_count{0};

struct sigaction g_previous;
std::atomic<int> g_mem_fd{-1};  // /proc/self/mem, opened on first use by whichever stream copies first

int range_find(uintptr_t a) {
  for (int i = 0; i < kMaxRanges; ++i) {
    uintptr_t b = g_ranges[i].begin.load(std::memory_order_acquire);
    if (b && a >= b && a < g_ranges[i].end.load(std::memory_order_acquire)) return i;
  }
  return -1;
}

// The range whose pages hold `a` (a registered buffer need not be page-aligned, so its first and
// last pages may hold other data that protection also covers).
int range_find_page(uintptr_t a) {
  for (int i = 0; i < kMaxRanges; ++i) {
    uintptr_t b = g_ranges[i].begin.load(std::memory_order_acquire);
    uintptr_t e = g_ranges[i].end.load(std::memory_order_acquire);
    if (b && a >= (b & ~(kPage - 1)) && a < ((e + kPage - 1) & ~(kPage - 1))) return i;
  }
  return -1;
}

void page_reprotect(uintptr_t page, const PageCount& c) {
  int prot = c.writes ? PROT_NONE : c.reads ? PROT_READ : PROT_READ | PROT_WRITE;
  mprotect(reinterpret_cast<void*>(page), kPage, prot);
}

void write_stderr(const char* s) { (void)!write(2, s, strlen(s)); }

void on_segv(int sig, siginfo_t* info, void* uctx) {
  uintptr_t a = reinterpret_cast<uintptr_t>(info->si_addr);
  int r = range_find_page(a);
  if (r < 0) {  // not ours: hand it to whoever handled SIGSEGV before us
    if (g_previous.sa_flags & SA_SIGINFO) {
      if (g_previous.sa_sigaction) return g_previous.sa_sigaction(sig, info, uctx);
    } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
      return g_previous.sa_handler(sig);
    }
    signal(SIGSEGV, SIG_DFL);  // the access faults again, now fatally, with a normal core/trace
    return;
  }
  bool host_wrote = false;
#if defined(__x86_64__)
  host_wrote = (static_cast<ucontext_t*>(uctx)->uc_mcontext.gregs[REG_ERR] & 2) != 0;
#endif
  int copy = -1;
  for (int i = 0; i < kMaxCopies && copy < 0; ++i)
    if (g_copies[i].used.load() && a >= g_copies[i].begin.load() && a < g_copies[i].end.load()) copy = i;
  void* page = reinterpret_cast<void*>(a & ~(kPage - 1));
  if (copy < 0) {
    // The page is protected for a copy of a neighbouring part of it: not a hazard. Let the access
    // through (this page goes unwatched until its copies end).
    mprotect(page, kPage, PROT_READ | PROT_WRITE);
    return;
  }
  bool to_host = g_copies[copy].to_host.load();
  uintptr_t buffer = g_ranges[r].begin.load();
  char msg[512];
  snprintf(msg, sizeof msg,
           "cuemu: HAZARD: host %s of pinned buffer %p at offset %zu (address %p) while an async %s copy "
           "using it is in flight; wait for the copy (cudaEventSynchronize / cudaStreamSynchronize) first\n",
           host_wrote ? "write" : "read", reinterpret_cast<void*>(buffer), static_cast<size_t>(a - buffer),
           info->si_addr, to_host ? "device->host" : "host->device");
  write_stderr(msg);
  if (options_current().hazard_policy != HazardPolicy::record) abort();
  int n = g_hazard_count.fetch_add(1);
  if (n < kMaxHazards) {
    g_hazards[n].address = a;
    g_hazards[n].buffer = buffer;
    g_hazards[n].host_wrote = host_wrote;
    g_hazards[n].to_host = to_host;
  }
  mprotect(page, kPage, PROT_READ | PROT_WRITE);
}

// Catch2 and sanitizers install their own SIGSEGV handlers; put ours in front again whenever a
// copy starts, keeping theirs as the fallback for faults that are not hazards.
void handler_ensure() {
  struct sigaction current;
  sigaction(SIGSEGV, nullptr, &current);
  if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == on_segv) return;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &g_previous);
}

void mem_io(bool write_to, void* local, uintptr_t remote, size_t bytes) {
  int fd = g_mem_fd.load(std::memory_order_acquire);
  if (fd < 0) {
    std::lock_guard<std::mutex> lock(g_mutex);
    fd = g_mem_fd.load(std::memory_order_relaxed);
    if (fd < 0) {
      fd = open("/proc/self/mem", O_RDWR | O_CLOEXEC);
      if (fd < 0) fatal("cannot open /proc/self/mem for the emulated copy engine");
      g_mem_fd.store(fd, std::memory_order_release);
    }
  }
#if defined(__SANITIZE_THREAD__)
  if (write_to) __tsan_write_range(reinterpret_cast<void*>(remote), static_cast<long>(bytes));
  else __tsan_read_range(reinterpret_cast<void*>(remote), static_cast<long>(bytes));
#endif
  char* p = static_cast<char*>(local);
  while (bytes > 0) {
    ssize_t n = write_to ? pwrite(fd, p, bytes, static_cast<off_t>(remote))
                         : pread(fd, p, bytes, static_cast<off_t>(remote));
    if (n <= 0) fatal("copy engine: /proc/self/mem %s of %zu bytes at %p failed", write_to ? "write" : "read", bytes,
                      reinterpret_cast<void*>(remote));
    p += n;
    remote += static_cast<uintptr_t>(n);
    bytes -= static_cast<size_t>(n);
  }
}

}  // namespace

void pinned_register(void* p, size_t bytes) {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (int i = 0; i < kMaxRanges; ++i)
    if (!g_ranges[i].begin.load()) {
      g_ranges[i].end.store(reinterpret_cast<uintptr_t>(p) + bytes, std::memory_order_release);
      g_ranges[i].begin.store(reinterpret_cast<uintptr_t>(p), std::memory_order_release);
      return;
    }
  fatal("more than %d pinned ranges at once", kMaxRanges);
}

bool pinned_unregister(void* p) {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (int i = 0; i < kMaxRanges; ++i)
    if (g_ranges[i].begin.load() == reinterpret_cast<uintptr_t>(p)) {
      g_ranges[i].begin.store(0);
      g_ranges[i].end.store(0);
      return true;
    }
  return false;
}

bool is_pinned_range(const void* p, size_t bytes) {
  uintptr_t a = reinterpret_cast<uintptr_t>(p);
  int r = range_find(a);
  return r >= 0 && a + bytes <= g_ranges[r].end.load();
}

PinnedCopy pinned_copy_begin(const void* host, size_t bytes, bool copy_to_host) {
  uintptr_t a = reinterpret_cast<uintptr_t>(host);
  if (bytes == 0 || range_find(a) < 0) return {};
  handler_ensure();
  std::lock_guard<std::mutex> lock(g_mutex);
  int slot = -1;
  for (int i = 0; i < kMaxCopies && slot < 0; ++i)
    if (!g_copies[i].used.load()) slot = i;
  if (slot < 0) fatal("more than %d pinned copies in flight", kMaxCopies);
  g_copies[slot].begin = a;
  g_copies[slot].end = a + bytes;
  g_copies[slot].to_host = copy_to_host;
  g_copies[slot].used = true;
  for (uintptr_t pg = a & ~(kPage - 1); pg < a + bytes; pg += kPage) {
    PageCount& c = g_pages[pg];
    (copy_to_host ? c.writes : c.reads)++;
    page_reprotect(pg, c);
  }
  return {slot};
}

void pinned_copy_end(PinnedCopy c) {
  if (c.slot < 0) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  CopySlot& s = g_copies[c.slot];
  uintptr_t a = s.begin, e = s.end;
  bool to_host = s.to_host;
  for (uintptr_t pg = a & ~(kPage - 1); pg < e; pg += kPage) {
    auto it = g_pages.find(pg);
    (to_host ? it->second.writes : it->second.reads)--;
    page_reprotect(pg, it->second);
    if (it->second.reads == 0 && it->second.writes == 0) g_pages.erase(it);
  }
  s.used = false;
}

void pinned_read(void* dst, const void* pinned_src, size_t bytes) {
  mem_io(false, dst, reinterpret_cast<uintptr_t>(pinned_src), bytes);
}
void pinned_write(void* pinned_dst, const void* src, size_t bytes) {
  mem_io(true, const_cast<void*>(src), reinterpret_cast<uintptr_t>(pinned_dst), bytes);
}

}  // namespace cuemu::detail

namespace cuemu {
std::vector<Hazard> cuemu_take_hazards() {
  int n = std::min(detail::g_hazard_count.exchange(0), detail::kMaxHazards);
  std::vector<Hazard> out;
  for (int i = 0; i < n; ++i) {
    Hazard h;
    h.address = detail::g_hazards[i].address;
    h.buffer = detail::g_hazards[i].buffer;
    h.offset = h.address - h.buffer;
    h.host_wrote = detail::g_hazards[i].host_wrote;
    h.copy_to_host = detail::g_hazards[i].to_host;
    out.push_back(h);
  }
  return out;
}
}  // namespace cuemu
