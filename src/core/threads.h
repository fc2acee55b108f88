// The CPU thread count used by kernels, as one process-wide setting (recipe device.cpu_threads).
// OpenMP keeps the count per OS thread, so every worker thread (device streams, the host
// queue) applies it before each task. Results never depend on it (kernels/cpu/ops.h).
#pragma once

namespace strata {

void cpu_threads_set(int n);  // 0: OpenMP's default (OMP_NUM_THREADS or all cores)
void cpu_threads_apply();     // on the calling thread
int cpu_threads_count();      // the count cpu_threads_apply sets

// The OS threads that may each open OpenMP parallel regions in one run: the main thread, the
// device's three streams and the engine's host queue. libgomp keeps a pool of
// cpu_threads_count() - 1 threads for each of them, for the life of that thread, as long as its
// regions keep that size (a larger one adds threads, a smaller one ends the extra ones; one
// thread leaves the pool alone). Every kernel region runs at cpu_threads_count() or at one.
constexpr int kCpuThreadPools = 5;

// Start-up check that the kernels' threads can exist (a device calls it when it is made): creates
// and holds the worst case, kCpuThreadPools pools of cpu_threads_count() - 1 threads with the
// stack libgomp gives them (OMP_STACKSIZE, else the pthread default) plus the workers' own, then
// releases them and starts the calling thread's team (cpu_threads_start_team). A thread libgomp
// cannot create ends the process from inside libgomp (exit 1, or a crash under ulimit -v);
// found here it is Error(budget), exit 3, naming device.cpu_threads and the limits (ulimit -v,
// ulimit -u). Once per count: later calls at the same or a smaller count return at once.
// STRATA_FAULT=thread@thread-start fails the N-th thread it creates as pthread_create does
// (EAGAIN).
void cpu_threads_start();

// Makes the calling thread's OpenMP team of cpu_threads_count() threads now, so that its later
// kernels create no thread: the threads are first created and held as above (the same error
// when they cannot be). The device's compute stream and the host queue call it as they start.
void cpu_threads_start_team();

}  // namespace strata
