// Packing samples into fixed-length training rows (see io/token_rows.h).
#include "io/token_rows.h"

#include <algorithm>

#include "src/core/error.h"

namespace strata {

Sample sample_from_document(Document ids) {
  Sample s;
  s.labels.assign(ids.size(), 1);
  if (!s.labels.empty()) s.labels[0] = 0;
  s.ids = std::move(ids);
  s.may_split = true;
  return s;
}

TokenRows pack_samples(const std::vector<Sample>& samples, int64_t T, bool packing, bool pad_last_row) {
  STRATA_ASSERT(T >= 2);
  TokenRows r;
  r.T = T;
  bool only_text = true;
  size_t total = 0;
  for (const Sample& s : samples) {
    STRATA_ASSERT(s.labels.size() == s.ids.size(), "a sample's labels and ids differ in length");
    only_text = only_text && s.may_split;
    total += s.ids.size();
  }
  r.ids.reserve(total + size_t(T));
  r.targets.reserve(total + size_t(T));
  r.pos.reserve(total + size_t(T));
  r.doc_start.reserve(total + size_t(T));
  auto push = [&](int32_t id, int32_t target, int32_t pos, int32_t start) {
    r.ids.push_back(id);
    r.targets.push_back(target);
    r.pos.push_back(pos);
    r.doc_start.push_back(start);
  };
  int64_t col = 0;  // next free column of the current row; T = the row is full
  // The rest of the current row becomes padding: id 0, no loss, a document of its own.
  auto pad_row = [&] {
    if (col == 0) return;
    const int32_t start = int32_t(col);
    for (int64_t t = col; t < T; ++t) push(0, -100, int32_t(t - start), start);
    col = 0;
  };
  for (const Sample& s : samples) {
    int64_t n = int64_t(s.ids.size());
    if (n == 0) continue;
    const bool split = packing && s.may_split;
    if (!split) {
      n = std::min(n, T);
      if (!packing || col + n > T) pad_row();
    }
    int32_t start = int32_t(col), pos = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (col == T) {  // row full: a pretraining document continues in the next row
        col = 0;
        start = 0;
        pos = 0;
      }
      const bool next_in_row = i + 1 < n && col + 1 < T;
      const int32_t target = next_in_row && s.labels[size_t(i + 1)] ? s.ids[size_t(i + 1)] : -100;
      push(s.ids[size_t(i)], target, pos++, start);
      ++col;
    }
    if (!packing) pad_row();
  }
  if (col == T) {
    col = 0;
  } else if (col > 0) {
    if (only_text && !pad_last_row) {
      // drop the unfinished last row: every row of a packed pretraining dataset is full
      const size_t keep = r.ids.size() - size_t(col);
      r.ids.resize(keep);
      r.targets.resize(keep);
      r.pos.resize(keep);
      r.doc_start.resize(keep);
    } else {
      pad_row();
    }
  }
  STRATA_CHECK(r.rows() > 0 || !packing || !only_text,
               "the dataset has fewer tokens than one row of data.sequence_len = ", T,
               ": lower sequence_len or add data");
  return r;
}

TokenRows pack_documents(const std::vector<Document>& docs, int64_t T, bool packing) {
  std::vector<Sample> samples;
  samples.reserve(docs.size());
  for (const Document& d : docs) samples.push_back(sample_from_document(d));
  return pack_samples(samples, T, packing);
}

}  // namespace strata
