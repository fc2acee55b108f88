#include "src/core/threads.h"

#include <omp.h>

#include <atomic>

namespace strata {

static std::atomic<int> g_threads{0};
static const int g_default = omp_get_max_threads();

void cpu_threads_set(int n) { g_threads = n; }

void cpu_threads_apply() {
  int n = g_threads.load();
  int want = n > 0 ? n : g_default;
  if (omp_get_max_threads() != want) omp_set_num_threads(want);
}

}  // namespace strata
