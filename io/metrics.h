// metrics.jsonl: one JSON object per optimizer step, flushed as it is written so a crashed or
// interrupted run keeps every finished step (DESIGN §7).
#pragma once
#include <cstdio>
#include <string>

#include "io/json.h"

namespace strata {

class MetricsWriter {
 public:
  explicit MetricsWriter(const std::string& path, bool append = false);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  void write(const nlohmann::json& record);

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
};

}  // namespace strata
