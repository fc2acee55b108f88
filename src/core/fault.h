// Fault injection: one interface for the fault-injection suite (tests/faults) and the unit tests
// that need a failure at a named place. Release builds carry it; unset, a fault point costs one
// load and one branch on a flag set once at start-up.
//
//   STRATA_FAULT=<kind>@<point>[:<N>][,<kind>@<point>[:<N>] ...]
//
// fires at the N-th time (default 1, counted per process from start-up) the running code reaches
// <point>. Kinds:
//   kill     the process SIGKILLs itself there (a power cut, the OOM killer, `kill -9`)
//   throw    a std::runtime_error is thrown there (a bug in a task: never an Error, so nothing
//            maps it to an exit code on the way up but the CLI's last catch)
//   alloc    the allocation there fails as the allocator would report it (host: bad_alloc /
//            nullptr; the device arena: out of its budget)
//   thread   the thread creation there fails with EAGAIN (as under ulimit -v or -u)
//   eio, enospc, efbig, einval, short
//            at point `io`: the N-th kernel I/O request of a file engine fails with that errno or
//            transfers half (the older STRATA_IO_FAULT=<kind>@<N> means <kind>@io:<N>); at another
//            point: the write there fails as that errno would (fault_point returns `io`)
// The points are named where the code calls fault_point(); tests/faults/README.md lists them.
// A malformed value is bad input (exit 2) at the first fault point, naming the variable.
#pragma once
#include <cstdint>
#include <string>

namespace strata {

enum class FaultKind : uint8_t { none, kill, throw_error, alloc, thread, io };

namespace fault_detail {
extern bool armed;  // STRATA_FAULT (or STRATA_IO_FAULT) was set at start-up
FaultKind hit(const char* point);
}  // namespace fault_detail

// The fault armed for `point`, if this is the hit it fires on. `kill` never returns and `throw`
// throws; `alloc`, `thread` and `io` are returned for the caller to fail as it would for real.
inline FaultKind fault_point(const char* point) {
  if (!fault_detail::armed) [[likely]] return FaultKind::none;
  return fault_detail::hit(point);
}

// For the I/O kinds at point `io`: the errno name ("eio", "short", ...) and N of the armed I/O
// fault, or false when none is armed. The file engine injects it itself (io/uring_file.h).
bool fault_io_armed(std::string* kind, uint64_t* n);

// Re-reads the environment: for tests that set STRATA_FAULT in their own process.
void fault_reload_for_tests();

}  // namespace strata
