// Reading datasets into samples: the formats, the length policy, the eval split and the
// trainer's entry point (see io/datasets.h). Records are tokenized in parallel chunks and merged
// in file order, so the result never depends on the thread count.
#include "io/datasets.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string_view>

#include "io/chat_template.h"
#include "io/json.h"
#include "io/tokenizer/tokenizer.h"
#include "src/core/error.h"

namespace strata {

using Json = nlohmann::ordered_json;

namespace {

bool ends_with(const std::string& s, const char* e) {
  const size_t n = std::char_traits<char>::length(e);
  return s.size() >= n && s.compare(s.size() - n, n, e) == 0;
}

bool is_blank(const std::string& line) { return line.find_first_not_of(" \t\r") == std::string::npos; }

bool is_chat_format(const std::string& f) {
  return f == "alpaca" || f == "sharegpt" || f == "messages" || f == "preference";
}

// ---- is it text? ----------------------------------------------------------------------------

// The offset in `s` of the first byte that is not part of well-formed UTF-8 (RFC 3629: no
// overlong forms, no UTF-16 surrogates, nothing above U+10FFFF), or npos.
size_t utf8_first_invalid(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    if (p[i] < 0x80) {  // ASCII, the bulk of most corpora
      ++i;
      continue;
    }
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xbf;  // the range of the second byte
    if (p[i] >= 0xc2 && p[i] <= 0xdf) {
      len = 2;
    } else if (p[i] >= 0xe0 && p[i] <= 0xef) {
      len = 3;
      if (p[i] == 0xe0) lo = 0xa0;  // overlong
      if (p[i] == 0xed) hi = 0x9f;  // surrogates
    } else if (p[i] >= 0xf0 && p[i] <= 0xf4) {
      len = 4;
      if (p[i] == 0xf0) lo = 0x90;  // overlong
      if (p[i] == 0xf4) hi = 0x8f;  // above U+10FFFF
    } else {
      return i;  // a continuation byte without a lead, an overlong lead (c0, c1) or f5..ff
    }
    if (i + len > n || p[i + 1] < lo || p[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k)
      if (p[i + k] < 0x80 || p[i + k] > 0xbf) return i;
    i += len;
  }
  return std::string::npos;
}

// What a file that is not text most likely is, from its first bytes ("" when nothing known).
std::string binary_file_hint(std::string_view head) {
  auto starts = [&](std::string_view magic) { return head.substr(0, magic.size()) == magic; };
  if (starts("\x7f" "ELF")) return " (it starts like an ELF executable or library)";
  if (starts("\x1f\x8b")) return " (it starts like a gzip file: decompress it first)";
  if (starts("\x28\xb5\x2f\xfd")) return " (it starts like a zstd file: decompress it first)";
  if (starts("PK\x03\x04")) return " (it starts like a zip archive: extract it first)";
  return "";
}

// A data file must be text. The byte tokenizer turns any byte into an id, so an executable, an
// archive or an image given as data.path would otherwise train without a word; this stops it at
// its first offending byte. NUL bytes mark a binary file in every line-based format (text and
// JSON Lines never hold one raw); for "text", whose lines go to the tokenizer as they are, every
// byte must also be well-formed UTF-8 (JSON formats leave that to the JSON parser, a bad line
// that data.skip_bad_lines may skip). `offset` is the line's offset in the file.
void check_is_text(const std::string& path, std::string_view line, int64_t offset, int64_t lineno, bool utf8) {
  size_t at = line.find('\0');
  if (utf8) at = std::min(at, utf8_first_invalid(line));
  if (at == std::string::npos) return;
  char byte[8];
  std::snprintf(byte, sizeof byte, "0x%02x", unsigned(static_cast<unsigned char>(line[at])));
  STRATA_CHECK(false, "dataset ", path, " is not text", offset == 0 ? binary_file_hint(line) : std::string(),
               ": the byte at offset ", offset + int64_t(at), " (line ", lineno, ") is ", byte,
               line[at] == '\0' ? ", a NUL byte" : ", not part of well-formed UTF-8",
               "; training data must be UTF-8 text: plain text (.txt, documents separated by blank lines) or "
               "JSON Lines (.jsonl); give pre-tokenized ids as {\"input_ids\": [[...], ...]} in a .json file "
               "(data.format = \"tokens\"), and re-encode text in another encoding to UTF-8 (iconv -t UTF-8)");
}

// ---- record fields --------------------------------------------------------------------------

const std::string& field_string(const Json& j, const char* field) {
  auto it = j.find(field);
  STRATA_CHECK(it != j.end(), "missing field \"", field, "\"");
  STRATA_CHECK(it->is_string(), "field \"", field, "\" must be a string, not ", it->type_name());
  return it->get_ref<const std::string&>();
}

// An optional string field: "" when absent or null.
std::string field_optional_string(const Json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return "";
  STRATA_CHECK(it->is_string(), "field \"", field, "\" must be a string, not ", it->type_name());
  return it->get_ref<const std::string&>();
}

Json message(const char* role, const std::string& content) {
  Json m = Json::object();
  m["role"] = role;
  m["content"] = content;
  return m;
}

// A message list as the messages format holds it: roles system/user/assistant/tool, content a
// string (or null / absent beside tool_calls). `where` names it in errors ("messages", "chosen").
const Json& checked_messages(const Json& list, const std::string& where) {
  STRATA_CHECK(list.is_array(), "field \"", where, "\" must be a list of {role, content} messages, not ", list.type_name());
  for (size_t i = 0; i < list.size(); ++i) {
    const Json& m = list[i];
    const std::string at = where + "[" + std::to_string(i) + "]";
    STRATA_CHECK(m.is_object(), "field \"", at, "\" must be a {role, content} object");
    auto r = m.find("role");
    STRATA_CHECK(r != m.end(), "missing field \"", at, ".role\"");
    STRATA_CHECK(r->is_string(), "field \"", at, ".role\" must be a string");
    const std::string& role = r->get_ref<const std::string&>();
    STRATA_CHECK(role == "system" || role == "user" || role == "assistant" || role == "tool", "unknown role \"",
                 role, "\" in ", at, ".role: use system, user, assistant or tool");
    auto c = m.find("content");
    const bool tool_calls = m.contains("tool_calls") && !m["tool_calls"].is_null();
    if (c == m.end() || c->is_null())
      STRATA_CHECK(tool_calls, "missing field \"", at, ".content\"");
    else
      STRATA_CHECK(c->is_string(), "field \"", at, ".content\" must be a string, not ", c->type_name());
  }
  return list;
}

const Json& field_messages(const Json& j, const char* field) {
  auto it = j.find(field);
  STRATA_CHECK(it != j.end(), "missing field \"", field, "\"");
  return checked_messages(*it, field);
}

// A preference side: a string (one message of `role`) or a message list.
Json preference_side(const Json& j, const char* field, const char* role) {
  auto it = j.find(field);
  STRATA_CHECK(it != j.end(), "missing field \"", field, "\"");
  if (it->is_string()) return Json::array({message(role, it->get_ref<const std::string&>())});
  STRATA_CHECK(it->is_array(), "field \"", field, "\" must be a string or a list of messages, not ", it->type_name());
  return checked_messages(*it, field);
}

Json sharegpt_messages(const Json& j) {
  auto it = j.find("conversations");
  STRATA_CHECK(it != j.end(), "missing field \"conversations\"");
  STRATA_CHECK(it->is_array(), "field \"conversations\" must be a list of {from, value}");
  Json out = Json::array();
  const std::string system = field_optional_string(j, "system");
  if (!system.empty()) out.push_back(message("system", system));
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& m = (*it)[i];
    const std::string at = "conversations[" + std::to_string(i) + "]";
    STRATA_CHECK(m.is_object(), "field \"", at, "\" must be a {from, value} object");
    auto f = m.find("from");
    STRATA_CHECK(f != m.end(), "missing field \"", at, ".from\"");
    STRATA_CHECK(f->is_string(), "field \"", at, ".from\" must be a string");
    auto v = m.find("value");
    STRATA_CHECK(v != m.end(), "missing field \"", at, ".value\"");
    STRATA_CHECK(v->is_string(), "field \"", at, ".value\" must be a string, not ", v->type_name());
    const std::string& from = f->get_ref<const std::string&>();
    const char* role = from == "human" || from == "user"                          ? "user"
                       : from == "gpt" || from == "assistant" || from == "model"   ? "assistant"
                       : from == "system"                                          ? "system"
                       : from == "tool" || from == "observation" || from == "function" ? "tool"
                                                                                    : nullptr;
    STRATA_CHECK(role, "unknown role \"", from, "\" in ", at,
                 ".from: use human/user, gpt/assistant/model, system or tool/observation/function");
    out.push_back(message(role, v->get_ref<const std::string&>()));
  }
  return out;
}

// ---- samples --------------------------------------------------------------------------------

Sample chat_sample(const TextEncoder& enc, const Json& messages, const Json& tools, TrainOn on, size_t first_turn) {
  ChatRender r = chat_render_spans(enc.chat_template(), messages, tools, on, first_turn);
  std::vector<ByteSpan> offsets;
  Sample s;
  s.ids = enc.encode_chat(r.text, &offsets);
  if (on == TrainOn::all) {
    s.labels.assign(s.ids.size(), 1);
    if (!s.labels.empty()) s.labels[0] = 0;
  } else {
    s.labels = chat_labels_from_spans(offsets, r.assistant_spans);
  }
  return s;
}

enum class Fate { kept, truncated, overlong, unlabelled };

// data.overlong and the "no trained token" rule on one sample.
Fate length_policy(Sample* s, const DatasetOptions& opt) {
  Fate fate = Fate::kept;
  const bool bounded = !(s->may_split && opt.packing);
  if (bounded && int64_t(s->ids.size()) > opt.sequence_len) {
    if (opt.drop_overlong) return Fate::overlong;
    s->ids.resize(size_t(opt.sequence_len));
    s->labels.resize(size_t(opt.sequence_len));
    fate = Fate::truncated;
  }
  if (std::find(s->labels.begin(), s->labels.end(), uint8_t(1)) == s->labels.end()) return Fate::unlabelled;
  return fate;
}

struct Record {
  int64_t line = 0;  // 1-based line of the record (of a text document: its first line)
  std::string text;  // a JSONL line, or a text document
};

struct RecordResult {
  Sample sample, rejected;
  bool has_rejected = false;
  Fate fate = Fate::kept;
  bool failed = false;
  ErrorKind error_kind = ErrorKind::input;
  std::string error;
  std::exception_ptr other;  // anything but strata::Error, rethrown in order
};

// One record to its sample(s); may throw strata::Error (the caller adds path:line).
void record_process(const Record& rec, const std::string& format, const TextEncoder& enc, const DatasetOptions& opt,
                    RecordResult* out) {
  if (format == "text") {
    out->sample = sample_from_document(enc.encode_text(rec.text));
  } else {
    Json j;
    try {
      j = Json::parse(rec.text);
    } catch (const Json::exception& e) {
      STRATA_CHECK(false, "not valid JSON (", e.what(), ")");
    }
    STRATA_CHECK(j.is_object(), "expected a JSON object, not ", j.type_name());
    if (format == "jsonl") {
      out->sample = sample_from_document(enc.encode_text(field_string(j, "text")));
    } else if (format == "alpaca") {
      Json msgs = Json::array();
      const std::string system = field_optional_string(j, "system");
      if (!system.empty()) msgs.push_back(message("system", system));
      const std::string& instruction = field_string(j, "instruction");
      const std::string input = field_optional_string(j, "input");
      const std::string& output = field_string(j, "output");
      msgs.push_back(message("user", input.empty() ? instruction : instruction + "\n\n" + input));
      msgs.push_back(message("assistant", output));
      out->sample = chat_sample(enc, msgs, nullptr, opt.train_on, 0);
    } else if (format == "sharegpt") {
      out->sample = chat_sample(enc, sharegpt_messages(j), nullptr, opt.train_on, 0);
    } else if (format == "messages") {
      const Json& msgs = field_messages(j, "messages");
      Json tools = nullptr;
      if (auto t = j.find("tools"); t != j.end() && !t->is_null()) {
        STRATA_CHECK(t->is_array(), "field \"tools\" must be a list of tool schemas");
        tools = *t;
      }
      out->sample = chat_sample(enc, msgs, tools, opt.train_on, 0);
    } else if (format == "preference") {
      const Json prompt = preference_side(j, "prompt", "user");
      Json chosen = prompt, rejected = prompt;
      for (const Json& m : preference_side(j, "chosen", "assistant")) chosen.push_back(m);
      for (const Json& m : preference_side(j, "rejected", "assistant")) rejected.push_back(m);
      out->sample = chat_sample(enc, chosen, nullptr, opt.train_on, prompt.size());
      out->rejected = chat_sample(enc, rejected, nullptr, opt.train_on, prompt.size());
      out->has_rejected = true;
    } else {
      STRATA_ASSERT(false, "unhandled format ", format);
    }
  }
  out->fate = length_policy(&out->sample, opt);
  if (out->has_rejected && (out->fate == Fate::kept || out->fate == Fate::truncated)) {
    Fate r = length_policy(&out->rejected, opt);  // a pair lives or dies together
    if (r != Fate::kept) out->fate = r;
  }
}

std::string extension_format(const std::string& path) {
  if (ends_with(path, ".txt")) return "text";
  if (ends_with(path, ".json")) return "tokens";
  if (ends_with(path, ".jsonl")) return "";
  STRATA_CHECK(false, "cannot tell the format of ", path, " from its extension (.txt, .jsonl or .json): set data.format "
               "to \"text\", \"jsonl\", \"alpaca\", \"sharegpt\", \"messages\", \"preference\" or \"tokens\"");
}

// Accumulates record results in file order: counts, the skip policy, errors.
struct Merger {
  Dataset* d;
  const DatasetOptions* opt;
  int64_t skipped_named = 0;

  void add(const Record& rec, RecordResult& r) {
    DatasetStats& st = d->stats;
    if (r.failed) {
      if (r.other) std::rethrow_exception(r.other);
      const std::string where = str_cat(d->path, ":", rec.line, ": ");
      if (!opt->skip_bad_lines || r.error_kind != ErrorKind::input) throw Error(r.error_kind, where + r.error);
      ++st.skipped_lines;
      if (++skipped_named <= 5) std::fprintf(stderr, "strata data: skipping %s%s\n", where.c_str(), r.error.c_str());
      return;
    }
    switch (r.fate) {
      case Fate::overlong: ++st.dropped_overlong; return;
      case Fate::unlabelled: ++st.dropped_unlabelled; return;
      case Fate::truncated: ++st.truncated; break;
      case Fate::kept: break;
    }
    ++st.samples;
    st.tokens += int64_t(r.sample.ids.size());
    st.labelled += std::count(r.sample.labels.begin(), r.sample.labels.end(), uint8_t(1));
    d->samples.push_back(std::move(r.sample));
    if (r.has_rejected) d->rejected.push_back(std::move(r.rejected));
  }
};

void read_records(Dataset* d, const DatasetOptions& opt, const TextEncoder& enc) {
  std::ifstream in(d->path, std::ios::binary);
  STRATA_CHECK(in, "cannot open dataset ", d->path, ": check data.path");
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(d->path, ec);
  const int64_t total = ec ? 0 : int64_t(size);
  if (is_chat_format(d->format)) enc.chat_template();  // a broken template is one error, not one per record
  Merger merger{d, &opt};
  std::vector<Record> chunk;
  std::vector<RecordResult> results;
  size_t chunk_bytes = 0;
  int64_t bytes_read = 0;
  auto flush = [&] {
    results.assign(chunk.size(), RecordResult{});
    const std::string& format = d->format;
#pragma omp parallel for schedule(dynamic, 4)
    for (int64_t i = 0; i < int64_t(chunk.size()); ++i) {
      RecordResult& r = results[size_t(i)];
      try {
        record_process(chunk[size_t(i)], format, enc, opt, &r);
      } catch (const Error& e) {
        r.failed = true;
        r.error_kind = e.kind();
        r.error = e.what();
      } catch (...) {
        r.failed = true;
        r.other = std::current_exception();
      }
    }
    for (size_t i = 0; i < chunk.size(); ++i) merger.add(chunk[i], results[i]);
    chunk.clear();
    chunk_bytes = 0;
    if (opt.progress) opt.progress(DatasetProgress{d->path, bytes_read, total, d->stats.samples, d->stats.tokens});
  };
  auto push = [&](Record rec) {
    chunk_bytes += rec.text.size();
    chunk.push_back(std::move(rec));
    if (chunk.size() >= 4096 || chunk_bytes >= (8u << 20)) flush();
  };
  std::string line;
  if (d->format == "text") {  // documents separated by blank lines
    Record doc;
    for (int64_t lineno = 1; std::getline(in, line); ++lineno) {
      check_is_text(d->path, line, bytes_read, lineno, true);
      bytes_read += int64_t(line.size()) + 1;
      if (is_blank(line)) {
        if (!doc.text.empty()) push(std::move(doc));
        doc = Record{};
      } else {
        if (doc.text.empty()) doc.line = lineno;
        doc.text += line;
        doc.text += '\n';
      }
    }
    if (!doc.text.empty()) push(std::move(doc));
  } else {
    for (int64_t lineno = 1; std::getline(in, line); ++lineno) {
      check_is_text(d->path, line, bytes_read, lineno, false);  // UTF-8 is the JSON parser's to check
      bytes_read += int64_t(line.size()) + 1;
      if (is_blank(line)) continue;
      push(Record{lineno, std::move(line)});
    }
  }
  STRATA_CHECK_IO(!in.bad(), "reading dataset ", d->path, " failed");
  bytes_read = std::min(bytes_read, total);
  flush();
}

void read_tokens(Dataset* d, const DatasetOptions& opt) {
  std::ifstream in(d->path, std::ios::binary);
  STRATA_CHECK(in, "cannot open dataset ", d->path, ": check data.path");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    STRATA_CHECK(false, d->path, ": not valid JSON (", e.what(), ")");
  }
  STRATA_CHECK(j.is_object() && j.contains("input_ids") && j["input_ids"].is_array(), d->path,
               ": expected {\"input_ids\": [[...], ...]}");
  Merger merger{d, &opt};
  const auto& rows = j["input_ids"];
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& row = rows[i];
    STRATA_CHECK(row.is_array(), d->path, ": input_ids[", i, "] is not a list");
    Document doc;
    doc.reserve(row.size());
    for (auto& x : row) {
      STRATA_CHECK(x.is_number_integer() && x.get<int64_t>() >= 0 && x.get<int64_t>() <= INT32_MAX, d->path,
                   ": input_ids[", i, "] holds something that is not a token id");
      doc.push_back(x.get<int32_t>());
    }
    if (doc.empty()) continue;
    RecordResult r;
    r.sample = sample_from_document(std::move(doc));
    r.fate = length_policy(&r.sample, opt);
    merger.add(Record{}, r);
  }
}

}  // namespace

bool dataset_format_renders_chat(const std::string& format, const std::string& path, bool skip_bad_lines) {
  const std::string f = format != "auto" ? format : path.empty() ? std::string() : dataset_detect_format(path, skip_bad_lines);
  return f == "alpaca" || f == "sharegpt" || f == "messages" || f == "preference";
}

std::string dataset_detect_format(const std::string& path, bool skip_bad_lines) {
  std::string ext = extension_format(path);
  if (!ext.empty()) return ext;
  std::ifstream in(path, std::ios::binary);
  STRATA_CHECK(in, "cannot open dataset ", path, ": check data.path");
  std::string line, first_bad;  // with skip_bad_lines: the first skipped line's "LINE: why"
  int64_t offset = 0, skipped = 0;
  for (int64_t lineno = 1; std::getline(in, line); ++lineno) {
    check_is_text(path, line, offset, lineno, false);
    offset += int64_t(line.size()) + 1;
    if (is_blank(line)) continue;
    Json j = Json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      std::string why;
      try {
        j = Json::parse(line);
        why = str_cat("expected a JSON object, not ", j.type_name());
      } catch (const Json::exception& e) {
        why = str_cat("not valid JSON (", e.what(), ")");
      }
      STRATA_CHECK(skip_bad_lines, path, ":", lineno, ": ", why);
      if (++skipped == 1) first_bad = str_cat(lineno, ": ", why);
      continue;
    }
    auto has = [&](const char* k) { return j.contains(k); };
    if (has("prompt") && has("chosen") && has("rejected")) return "preference";
    if (has("messages")) return "messages";
    if (has("conversations")) return "sharegpt";
    if (has("instruction") && has("output")) return "alpaca";
    if (has("text")) return "jsonl";
    std::string fields;
    for (auto it = j.begin(); it != j.end(); ++it) fields += (fields.empty() ? "" : ", ") + ("\"" + it.key() + "\"");
    STRATA_CHECK(false, path, ":", lineno, ": cannot tell the dataset format from the fields {", fields,
                 "}: expected \"text\", \"instruction\" + \"output\", \"conversations\", \"messages\" or \"prompt\" + "
                 "\"chosen\" + \"rejected\"; or set data.format");
  }
  STRATA_CHECK_IO(!in.bad(), "reading dataset ", path, " failed");
  // Every line bad and skipped must not read as an empty file: say how many, and the first.
  STRATA_CHECK(skipped == 0, "dataset ", path, " holds no records: all ", skipped, " of its non-blank lines are bad "
               "JSON (malformed, or not a JSON object), skipped because data.skip_bad_lines = true (the first, ",
               path, ":", first_bad, "); fix the data, or set data.skip_bad_lines = false to stop at each bad line "
               "with its error");
  STRATA_CHECK(false, "dataset ", path, " is empty: it holds no records");
}

Dataset dataset_read(const std::string& path, const DatasetOptions& opt, const TextEncoder& enc) {
  Dataset d;
  d.path = path;
  STRATA_CHECK(opt.sequence_len >= 2, "data.sequence_len must be at least 2");
  d.format = opt.format == "auto" ? dataset_detect_format(path, opt.skip_bad_lines) : opt.format;
  if (d.format == "tokens") {
    read_tokens(&d, opt);
  } else {
    STRATA_CHECK(d.format == "text" || d.format == "jsonl" || is_chat_format(d.format), "unknown data.format '",
                 d.format, "': use \"auto\", \"text\", \"jsonl\", \"alpaca\", \"sharegpt\", \"messages\", \"preference\" or \"tokens\"");
    read_records(&d, opt, enc);
  }
  const DatasetStats& st = d.stats;
  if (d.samples.empty()) {
    STRATA_CHECK(st.skipped_lines + st.dropped_overlong + st.dropped_unlabelled > 0, "dataset ", path,
                 " holds no samples: it is empty");
    STRATA_CHECK(false, "dataset ", path, " holds no usable samples: ", st.skipped_lines, " bad lines skipped, ",
                 st.dropped_overlong, " longer than data.sequence_len = ", opt.sequence_len, " dropped, ",
                 st.dropped_unlabelled, " without a trained token dropped (check data.train_on and the data)",
                 st.skipped_lines > 0 ? "; data.skip_bad_lines = true skipped the bad lines: the first are named "
                                        "above, or set it to false to stop at the first with its error"
                                      : "");
  }
  return d;
}

std::string dataset_stats_line(const Dataset& d) {
  const DatasetStats& s = d.stats;
  return str_cat(d.path, " (", d.format, "): ", s.samples, " samples, ", s.tokens, " tokens, ", s.labelled,
                 " trained on; skipped ", s.skipped_lines, " bad lines, truncated ", s.truncated, ", dropped ",
                 s.dropped_overlong + s.dropped_unlabelled, " (", s.dropped_overlong, " over sequence_len, ",
                 s.dropped_unlabelled, " without a trained token)");
}

Dataset dataset_split_eval(Dataset* train, double fraction) {
  STRATA_CHECK(fraction > 0 && fraction < 1, "data.eval_split must be in (0, 1), not ", fraction);
  Dataset eval, keep;
  eval.path = keep.path = train->path;
  eval.format = keep.format = train->format;
  keep.stats = train->stats;
  keep.stats.samples = keep.stats.tokens = keep.stats.labelled = 0;
  const bool pairs = !train->rejected.empty();
  for (size_t i = 0; i < train->samples.size(); ++i) {
    const bool held = std::floor(double(i + 1) * fraction) > std::floor(double(i) * fraction);
    Dataset& to = held ? eval : keep;
    Sample& s = train->samples[i];
    ++to.stats.samples;
    to.stats.tokens += int64_t(s.ids.size());
    to.stats.labelled += std::count(s.labels.begin(), s.labels.end(), uint8_t(1));
    to.samples.push_back(std::move(s));
    if (pairs) to.rejected.push_back(std::move(train->rejected[i]));
  }
  const size_t n = train->samples.size();
  STRATA_CHECK(!eval.samples.empty(), "data.eval_split = ", fraction, " of ", n,
               " samples holds none out: raise it or set data.eval_path");
  STRATA_CHECK(!keep.samples.empty(), "data.eval_split = ", fraction, " of ", n,
               " samples leaves none to train on: lower it");
  *train = std::move(keep);
  return eval;
}

TrainingSamples samples_read(const SamplesOptions& o, const TextEncoder& enc,
                             const std::function<void(const DatasetProgress&)>& progress) {
  DatasetOptions opt = o.dataset;
  opt.progress = progress;
  TrainingSamples out;
  out.train = dataset_read(o.path, opt, enc);
  out.report = dataset_stats_line(out.train);
  if (!o.eval_path.empty()) {
    out.eval = dataset_read(o.eval_path, opt, enc);
    out.report += "\n" + dataset_stats_line(out.eval);
  } else if (o.eval_split > 0) {
    const size_t n = out.train.samples.size();
    out.eval = dataset_split_eval(&out.train, o.eval_split);
    out.report += str_cat("\neval split: ", out.eval.samples.size(), " of ", n, " samples held out (evenly spaced: i with "
                          "floor((i+1)*", o.eval_split, ") > floor(i*", o.eval_split, "))");
  }
  return out;
}

void training_samples_check_vocab(const TrainingSamples& s, int64_t vocab_size) {
  auto check = [&](const Dataset& d, const std::vector<Sample>& samples) {
    for (size_t i = 0; i < samples.size(); ++i)
      for (int32_t id : samples[i].ids)
        STRATA_CHECK(id >= 0 && id < vocab_size, d.path, ": sample ", i, " holds token id ", id,
                     " but the model's vocab_size is ", vocab_size, " (byte-level text needs vocab_size >= 256)");
  };
  for (const Dataset* d : {&s.train, &s.eval}) {
    check(*d, d->samples);
    check(*d, d->rejected);
  }
}

// The pretraining reader kept for existing callers: the documents of a text, {"text"} JSONL or
// tokens file (documents of one token, which train nothing, are dropped).
std::vector<Document> dataset_read_documents(const std::string& path, const std::string& format,
                                             const Tokenizer* tokenizer) {
  STRATA_CHECK(format == "auto" || format == "text" || format == "jsonl" || format == "tokens", "unknown data.format '",
               format, "': use \"auto\", \"text\", \"jsonl\" or \"tokens\"");
  DatasetOptions opt;
  opt.format = format;
  if (format == "auto") {
    opt.format = extension_format(path);
    if (opt.format.empty()) opt.format = "jsonl";
  }
  opt.packing = true;
  opt.sequence_len = INT64_MAX;
  const TextEncoder enc = tokenizer ? TextEncoder::from_tokenizer(*tokenizer) : TextEncoder::bytes();
  Dataset d = dataset_read(path, opt, enc);
  std::vector<Document> docs;
  docs.reserve(d.samples.size());
  for (Sample& s : d.samples) docs.push_back(std::move(s.ids));
  return docs;
}

}  // namespace strata
