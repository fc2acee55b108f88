#include "src/core/process_memory.h"

#include <fstream>
#include <string>

namespace strata {
namespace {

// The value of "key:  <n> kB" in a /proc file, in bytes (the files say kB and mean KiB).
size_t proc_kib_field(const char* path, const std::string& key) {
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line))  // line by line: most fields are not numbers ("Name:  strata")
    if (line.compare(0, key.size(), key) == 0) return size_t(std::stoull(line.substr(key.size()))) * 1024;
  return 0;
}

}  // namespace

size_t process_rss_bytes() { return proc_kib_field("/proc/self/status", "VmRSS:"); }
size_t process_rss_peak_bytes() { return proc_kib_field("/proc/self/status", "VmHWM:"); }
size_t host_memory_available() { return proc_kib_field("/proc/meminfo", "MemAvailable:"); }

}  // namespace strata
