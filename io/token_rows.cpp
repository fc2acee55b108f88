#include "io/token_rows.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/tokenizer/tokenizer.h"
#include "src/core/error.h"

namespace strata {
namespace {

Document bytes_of(const std::string& text) {
  Document d;
  d.reserve(text.size());
  for (unsigned char c : text) d.push_back(int32_t(c));
  return d;
}

std::string extension_format(const std::string& path) {
  auto ends = [&](const char* s) {
    std::string e = s;
    return path.size() >= e.size() && path.compare(path.size() - e.size(), e.size(), e) == 0;
  };
  if (ends(".txt")) return "text";
  if (ends(".jsonl")) return "jsonl";
  if (ends(".json")) return "tokens";
  STRATA_CHECK(false, "cannot tell the format of ", path,
               " from its extension: set data.format to \"text\", \"jsonl\" or \"tokens\"");
}

}  // namespace

std::vector<Document> dataset_read_documents(const std::string& path, const std::string& format_in,
                                             const Tokenizer* tokenizer) {
  auto bytes_of = [&](const std::string& text) {
    return tokenizer ? tokenizer->encode(text, true) : strata::bytes_of(text);
  };
  std::ifstream in(path, std::ios::binary);
  STRATA_CHECK(in, "cannot open dataset ", path, ": check data.path");
  const std::string format = format_in == "auto" ? extension_format(path) : format_in;
  std::vector<Document> docs;
  if (format == "text") {
    std::string line, current;
    while (std::getline(in, line)) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) {
        if (!current.empty()) docs.push_back(bytes_of(current));
        current.clear();
      } else {
        current += line + "\n";
      }
    }
    if (!current.empty()) docs.push_back(bytes_of(current));
  } else if (format == "jsonl") {
    std::string line;
    for (int64_t lineno = 1; std::getline(in, line); ++lineno) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const nlohmann::json::parse_error& e) {
        STRATA_CHECK(false, path, ":", lineno, ": not valid JSON (", e.what(), ")");
      }
      STRATA_CHECK(j.is_object() && j.contains("text") && j["text"].is_string(), path, ":", lineno,
                   ": expected an object with a string \"text\"");
      docs.push_back(bytes_of(j["text"].get<std::string>()));
    }
  } else if (format == "tokens") {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::parse_error& e) {
      STRATA_CHECK(false, path, ": not valid JSON (", e.what(), ")");
    }
    STRATA_CHECK(j.is_object() && j.contains("input_ids") && j["input_ids"].is_array(), path,
                 ": expected {\"input_ids\": [[...], ...]}");
    for (size_t i = 0; i < j["input_ids"].size(); ++i) {
      const auto& row = j["input_ids"][i];
      STRATA_CHECK(row.is_array(), path, ": input_ids[", i, "] is not a list");
      Document d;
      for (auto& x : row) {
        STRATA_CHECK(x.is_number_integer() && x.get<int64_t>() >= 0, path, ": input_ids[", i,
                     "] holds something that is not a token id");
        d.push_back(x.get<int32_t>());
      }
      docs.push_back(std::move(d));
    }
  } else {
    STRATA_CHECK(false, "unknown data.format '", format, "': use \"auto\", \"text\", \"jsonl\" or \"tokens\"");
  }
  std::erase_if(docs, [](const Document& d) { return d.empty(); });
  STRATA_CHECK(!docs.empty(), "dataset ", path, " holds no documents");
  return docs;
}

TokenRows pack_documents(const std::vector<Document>& docs, int64_t T, bool packing) {
  STRATA_ASSERT(T >= 2);
  TokenRows r;
  r.T = T;
  auto push = [&](int32_t id, int32_t target, int32_t pos, int32_t start) {
    r.ids.push_back(id);
    r.targets.push_back(target);
    r.pos.push_back(pos);
    r.doc_start.push_back(start);
  };
  if (packing) {
    int64_t col = 0;
    for (const Document& d : docs) {
      int32_t start = int32_t(col), pos = 0;
      for (size_t i = 0; i < d.size(); ++i) {
        if (col == T) {  // row full: the document continues in the next row
          col = 0;
          start = 0;
          pos = 0;
        }
        bool last_in_row = col == T - 1, last_in_doc = i + 1 == d.size();
        push(d[i], last_in_row || last_in_doc ? -100 : d[i + 1], pos++, start);
        ++col;
      }
    }
    // drop the unfinished last row: every row of a packed dataset is full
    r.ids.resize(size_t(r.rows() * T));
    r.targets.resize(r.ids.size());
    r.pos.resize(r.ids.size());
    r.doc_start.resize(r.ids.size());
    STRATA_CHECK(r.rows() > 0, "the dataset has fewer tokens than one row of data.sequence_len = ",
                 T, ": lower sequence_len or add data");
  } else {
    for (const Document& d : docs) {
      const int64_t n = std::min<int64_t>(T, int64_t(d.size()));
      for (int64_t t = 0; t < T; ++t) {
        if (t < n) push(d[size_t(t)], t + 1 < n ? d[size_t(t + 1)] : -100, int32_t(t), 0);
        else push(0, -100, int32_t(t - n), int32_t(n));  // padding: its own document
      }
    }
  }
  return r;
}

}  // namespace strata
