#include "models/micro_batch.h"

#include "src/core/error.h"

namespace strata {

int64_t MicroBatch::counted() const {
  int64_t n = 0;
  for (int32_t t : targets) n += t != -100;
  return n;
}

MicroBatch micro_batch_from_labels(const std::vector<std::vector<int32_t>>& input_ids,
                                   const std::vector<std::vector<int32_t>>& labels) {
  STRATA_CHECK(!input_ids.empty() && !input_ids[0].empty(), "the batch has no tokens");
  STRATA_CHECK(labels.empty() || labels.size() == input_ids.size(), "labels has ", labels.size(),
               " rows but input_ids has ", input_ids.size());
  MicroBatch mb;
  mb.B = int64_t(input_ids.size());
  mb.T = int64_t(input_ids[0].size());
  for (size_t b = 0; b < input_ids.size(); ++b) {
    const auto& row = input_ids[b];
    const auto& lab = labels.empty() ? row : labels[b];
    STRATA_CHECK(int64_t(row.size()) == mb.T, "input_ids row ", b, " has ", row.size(),
                 " tokens but row 0 has ", mb.T, ": rows must have equal length");
    STRATA_CHECK(lab.size() == row.size(), "labels row ", b, " has ", lab.size(),
                 " entries but input_ids row has ", row.size());
    for (int64_t t = 0; t < mb.T; ++t) {
      mb.ids.push_back(row[size_t(t)]);
      mb.targets.push_back(t + 1 < mb.T ? lab[size_t(t + 1)] : -100);
      mb.pos.push_back(int32_t(t));
    }
  }
  return mb;
}

}  // namespace strata
