// Training rows: samples (token ids plus a per-token "trained on" flag) packed into fixed-length
// rows with per-token positions and document starts, so attention never crosses documents and
// positions restart at each one. Targets are the next token's id when that token is labelled and
// in the same document and row, else -100 (no loss), as Hugging Face's labels shifted by one.
// Reading files into samples lives in io/datasets.h; the plain-text reader below is the
// pretraining path kept for existing callers.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace strata {

using Document = std::vector<int32_t>;

// One training sample: a pretraining document or a rendered chat. labels[i] = 1 when token i is
// trained on, i.e. predicted from token i-1; labels[0] is always 0 (nothing predicts it).
struct Sample {
  std::vector<int32_t> ids;
  std::vector<uint8_t> labels;  // same length as ids, 0 or 1
  bool may_split = false;       // pretraining text: with packing it may continue into the next row
};

// A pretraining sample: every token but the first labelled.
Sample sample_from_document(Document ids);

class Tokenizer;

// format: "auto" (by extension: .txt text, .jsonl jsonl, .json tokens), "text", "jsonl", "tokens".
// Text documents in a .txt file are separated by blank lines. Bad lines are errors naming the line.
// Text becomes ids through `tokenizer` (with its special tokens, e.g. BOS), or as UTF-8 bytes
// when it is null. (Implemented in io/datasets.cpp on top of dataset_read.)
std::vector<Document> dataset_read_documents(const std::string& path, const std::string& format,
                                             const Tokenizer* tokenizer = nullptr);

struct TokenRows {
  int64_t T = 0;
  std::vector<int32_t> ids, targets, pos, doc_start;  // (rows, T) each
  int64_t rows() const { return T ? int64_t(ids.size()) / T : 0; }
};

// Packs samples into rows of T tokens.
//   packing, pretraining samples (may_split): concatenated; a sample longer than the rest of a row
//     continues in the next row (positions restart there).
//   packing, whole samples (chat): first fit in dataset order, never split; when a sample does not
//     fit the rest of the current row, the rest is padding and the sample starts the next row.
//   no packing: one sample per row.
// Padding is id 0, target -100, its own document. A sample longer than T that cannot continue is
// cut to T (io/datasets.cpp applies data.overlong and counts before this). The last unfinished
// row is padded, except that a dataset of only pretraining samples drops it (every row full)
// unless pad_last_row. A packed pretraining dataset shorter than one row is an error.
TokenRows pack_samples(const std::vector<Sample>& samples, int64_t T, bool packing, bool pad_last_row = false);

// Pretraining documents through pack_samples (every token but each first labelled).
TokenRows pack_documents(const std::vector<Document>& docs, int64_t T, bool packing);

}  // namespace strata
