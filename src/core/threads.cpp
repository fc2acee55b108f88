#include "src/core/threads.h"

#include <omp.h>

#include <atomic>

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

}  // namespace strata
