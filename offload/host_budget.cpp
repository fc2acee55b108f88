#include "offload/host_budget.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "src/core/error.h"
#include "src/device/device.h"

namespace strata {

size_t host_memory_available() {
  std::ifstream f("/proc/meminfo");
  std::string key, unit;
  size_t value = 0;
  while (f >> key >> value) {
    std::getline(f, unit);
    if (key == "MemAvailable:") return value * 1024;  // the file says kB and means KiB
  }
  return 0;
}

HostBudget host_memory_budget(size_t host_memory_bytes, const std::string& host_memory) {
  HostBudget b;
  if (host_memory_bytes > 0) {
    b.bytes = host_memory_bytes;
    b.origin = str_cat("offload.host_memory = \"", host_memory, "\"");
  } else {
    b.bytes = host_memory_available();
    b.origin = "the machine's available memory (MemAvailable in /proc/meminfo; offload.host_memory is unset)";
  }
  return b;
}

HostMemoryEstimate host_memory_estimate(const ModelSpec& spec, const HostStoreOptions& store_options,
                                        const EngineOptions& engine_options) {
  HostMemoryEstimate e = HostStore::estimate(spec, store_options);
  const EngineHostBytes engine = Engine::host_bytes(spec, engine_options);
  e.staging = engine.staging;
  e.checkpoints = engine.checkpoints;
  return e;
}

void host_budget_check(const ModelSpec& spec, const HostStoreOptions& store_options,
                       const EngineOptions& engine_options, const HostBudget& budget) {
  if (budget.bytes == 0) return;  // unknown: nothing to check against
  const HostMemoryEstimate e = host_memory_estimate(spec, store_options, engine_options);
  if (e.total() <= budget.bytes) return;
  auto line = [](std::string what, size_t bytes) {
    what.resize(std::max<size_t>(what.size(), 32), ' ');
    return str_cat("\n  ", what, format_bytes(bytes));
  };
  STRATA_CHECK_BUDGET(
      false, "the host tiers need ", format_bytes(e.total()), " for this model and micro-batch, more than the budget of ",
      format_bytes(budget.bytes), " (", budget.origin, "):",
      line(str_cat("working weights (pinned, ", dtype_name(spec.matrix_dtype), ")"), e.working),
      line("master weights (fp32)", e.master),
      line(str_cat("AdamW moments (", dtype_name(store_options.moments), " m and v)"), e.moments),
      line("gradients (pinned, fp32)", e.grads), line("staging (pinned)", e.staging),
      line("spilled checkpoints (pinned)", e.checkpoints), line("NVMe state buffers", e.nvme_buffers),
      "\nMove the optimizer moments (", format_bytes(e.moments), ") and master weights (", format_bytes(e.master),
      ") to NVMe with offload.optimizer = \"nvme\" and offload.nvme_path, and spilled checkpoints with "
      "offload.checkpoints = \"nvme\"; or use a smaller model, lower micro_batch_size or sequence_len (staging "
      "and checkpoints), set offload.checkpoints = \"device\" if the device has room for them, or raise "
      "offload.host_memory if the machine has the RAM.");
}

}  // namespace strata
