// Training rows from documents: read plain text, {"text"} JSONL or pre-tokenized JSON, turn
// text into ids (a tokenizer.json, or UTF-8 bytes), and pack
// documents into fixed-length rows with per-token positions and document starts, so attention
// never crosses documents and positions restart at each one. Targets are the next token's id
// within the same document, -100 at each document's last token and on padding.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace strata {

using Document = std::vector<int32_t>;

class Tokenizer;

// format: "auto" (by extension: .txt text, .jsonl jsonl, .json tokens), "text", "jsonl", "tokens".
// Text documents in a .txt file are separated by blank lines. Bad lines are errors naming the line.
// Text becomes ids through `tokenizer` (with its special tokens, e.g. BOS), or as UTF-8 bytes
// when it is null.
std::vector<Document> dataset_read_documents(const std::string& path, const std::string& format,
                                             const Tokenizer* tokenizer = nullptr);

struct TokenRows {
  int64_t T = 0;
  std::vector<int32_t> ids, targets, pos, doc_start;  // (rows, T) each
  int64_t rows() const { return T ? int64_t(ids.size()) / T : 0; }
};

// packing: documents are concatenated and cut into rows of T (a document longer than the rest
// of a row continues in the next row); otherwise one document per row, truncated and padded
// with id 0 (targets -100).
TokenRows pack_documents(const std::vector<Document>& docs, int64_t T, bool packing);

}  // namespace strata
