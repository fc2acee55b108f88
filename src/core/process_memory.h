// What this process and this machine hold in RAM, as Linux reports it in /proc: the resident
// set (VmRSS), its high-water mark (VmHWM, what metrics.jsonl's host_rss_peak_bytes records) and
// the machine's MemAvailable (the host budget when offload.host_memory is unset). Each returns
// 0 where /proc cannot be read (not Linux, or a sandbox without it): callers treat 0 as unknown.
#pragma once
#include <cstddef>

namespace strata {

size_t process_rss_bytes();       // VmRSS of /proc/self/status
size_t process_rss_peak_bytes();  // VmHWM of /proc/self/status: the largest VmRSS so far
size_t host_memory_available();   // MemAvailable of /proc/meminfo

}  // namespace strata
