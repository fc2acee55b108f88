// The CPU thread count used by kernels, as one process-wide setting (recipe device.cpu_threads).
// OpenMP keeps the count per OS thread, so every worker thread (device streams, the host
// queue) applies it before each task. Results never depend on it (kernels/cpu/ops.h).
#pragma once

namespace strata {

void cpu_threads_set(int n);  // 0: OpenMP's default (OMP_NUM_THREADS or all cores)
void cpu_threads_apply();     // on the calling thread
int cpu_threads_count();      // the count cpu_threads_apply sets

}  // namespace strata
