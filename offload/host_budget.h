// The host memory budget (DESIGN §2): before anything is allocated, what the host tiers will
// hold for a model and engine options — the store's working weights, fp32 master weights,
// AdamW moments and fp32 gradients, the engine's pinned staging and spilled checkpoints —
// checked against offload.host_memory (unset: the machine's MemAvailable). Too much is an error
// (exit code 3) that lists the bytes per tier and says what could move to NVMe.
#pragma once
#include <cstddef>
#include <string>

#include "offload/engine.h"
#include "offload/host_store.h"

namespace strata {

struct HostBudget {
  size_t bytes = 0;    // 0: unknown (no /proc/meminfo), nothing is checked
  std::string origin;  // what set it, for messages: offload.host_memory = "24GiB", or MemAvailable
};

// The budget from the recipe's offload.host_memory, parsed (bytes) and as written (for messages);
// 0 bytes = unset: the machine's available memory.
HostBudget host_memory_budget(size_t host_memory_bytes, const std::string& host_memory);
// MemAvailable of /proc/meminfo in bytes; 0 when it cannot be read.
size_t host_memory_available();

// Every host tier's bytes: HostStore::estimate plus the engine's staging and checkpoints.
HostMemoryEstimate host_memory_estimate(const ModelSpec& spec, const HostStoreOptions& store_options,
                                        const EngineOptions& engine_options);

// Throws Error(budget) (exit 3) when the estimate exceeds the budget; call before allocating.
void host_budget_check(const ModelSpec& spec, const HostStoreOptions& store_options,
                       const EngineOptions& engine_options, const HostBudget& budget);

}  // namespace strata
