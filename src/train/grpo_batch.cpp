// Reading the GRPO grad batch (grpo_batch.h).
#include "src/train/grpo_batch.h"

#include "src/core/error.h"

namespace strata {
namespace {

template <class T>
std::vector<std::vector<T>> grpo_rows(const nlohmann::json& j, const char* key, const std::string& path,
                                      const std::vector<std::vector<int32_t>>* like) {
  STRATA_CHECK(j.contains(key) && j[key].is_array(), path, ": \"", key, "\" must be a list of rows");
  STRATA_CHECK(!like || j[key].size() == like->size(), path, ": \"", key, "\" has ", j[key].size(),
               " rows but input_ids has ", like ? like->size() : 0);
  std::vector<std::vector<T>> rows;
  for (size_t b = 0; b < j[key].size(); ++b) {
    const auto& row = j[key][b];
    STRATA_CHECK(row.is_array(), path, ": ", key, "[", b, "] must be a list of numbers");
    STRATA_CHECK(!like || row.size() == (*like)[b].size(), path, ": ", key, "[", b, "] has ", row.size(),
                 " entries but input_ids[", b, "] has ", like ? (*like)[b].size() : 0);
    std::vector<T> r;
    for (size_t t = 0; t < row.size(); ++t) {
      if constexpr (std::is_same_v<T, int32_t>) {
        STRATA_CHECK(row[t].is_number_integer(), path, ": ", key, "[", b, "][", t, "] is not an integer");
      } else {
        STRATA_CHECK(row[t].is_number(), path, ": ", key, "[", b, "][", t, "] is not a number");
      }
      r.push_back(row[t].get<T>());
    }
    rows.push_back(std::move(r));
  }
  return rows;
}

}  // namespace

GrpoBatch grpo_batch_from_json(const nlohmann::json& j, const std::string& path, bool need_ref) {
  for (const char* key : {"input_ids", "completion_mask", "advantages"})
    STRATA_CHECK(j.contains(key), path, ": a GRPO batch needs \"", key, "\" (input_ids, completion_mask, advantages; "
                 "old_per_token_logps and ref_per_token_logps optional)");
  const auto ids = grpo_rows<int32_t>(j, "input_ids", path, nullptr);
  const auto mask = grpo_rows<int32_t>(j, "completion_mask", path, &ids);
  GrpoBatch b;
  b.mb = grpo_micro_batch(ids, mask);
  STRATA_CHECK(b.mb.counted() > 0, path, ": completion_mask counts no token after position 0, so there is no loss");
  GrpoLayout& l = b.layout;
  l.rows = b.mb.B;
  l.cols = b.mb.T;
  STRATA_CHECK(j["advantages"].is_array() && j["advantages"].size() == ids.size(), path,
               ": \"advantages\" must be a list of ", ids.size(), " numbers (one per row)");
  for (size_t i = 0; i < ids.size(); ++i) {
    STRATA_CHECK(j["advantages"][i].is_number(), path, ": advantages[", i, "] is not a number");
    l.advantages.push_back(j["advantages"][i].get<double>());
  }
  if (j.contains("old_per_token_logps") && !j["old_per_token_logps"].is_null())
    l.old_logp = grpo_by_position(grpo_rows<double>(j, "old_per_token_logps", path, &ids), l.cols);
  const bool has_ref = j.contains("ref_per_token_logps") && !j["ref_per_token_logps"].is_null();
  STRATA_CHECK(has_ref || !need_ref, path, ": --beta > 0 needs \"ref_per_token_logps\" (the reference model's "
               "per-token log-probabilities, aligned with input_ids)");
  if (has_ref) l.ref_logp = grpo_by_position(grpo_rows<double>(j, "ref_per_token_logps", path, &ids), l.cols);
  l.totals.micro_batches = 1;
  l.totals.tokens = b.mb.counted();
  return b;
}

}  // namespace strata
