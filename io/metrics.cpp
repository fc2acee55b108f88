#include "io/metrics.h"

#include <cerrno>
#include <cstring>

#include "src/core/error.h"

namespace strata {

MetricsWriter::MetricsWriter(const std::string& path, bool append) : path_(path) {
  f_ = std::fopen(path.c_str(), append ? "a" : "w");
  STRATA_CHECK_IO(f_, "cannot open ", path, " for writing: ", std::strerror(errno));
}

MetricsWriter::~MetricsWriter() {
  if (f_) std::fclose(f_);
}

void MetricsWriter::write(const nlohmann::json& record) {
  std::string line = record.dump() + "\n";
  size_t n = std::fwrite(line.data(), 1, line.size(), f_);
  STRATA_CHECK_IO(n == line.size() && std::fflush(f_) == 0, "writing ", path_, " failed: ",
                  std::strerror(errno));
}

}  // namespace strata
