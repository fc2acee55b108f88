// safetensors reading (mmap + full validation), model-directory loading, tensor-set checks, and
// atomic writing of single files and HF-style sharded directories. See safetensors.h.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

#include "io/files.h"
#include "io/json.h"
#include "src/core/error.h"

namespace strata {

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

std::string errno_text(int err) { return std::strerror(err); }

// Problems with the file's content: kind input, message starts with the path.
template <class... Args>
[[noreturn]] void st_bad(const std::string& path, const Args&... args) {
  throw Error(ErrorKind::input, str_cat("safetensors file ", path, ": ", args...));
}

const char* json_type_name(const json& j) { return j.type_name(); }

// A non-negative JSON integer that fits in u64; false for floats, negatives, other types.
bool json_get_u64(const json& j, uint64_t* out) {
  if (j.is_number_unsigned()) {
    *out = j.get<uint64_t>();
    return true;
  }
  if (j.is_number_integer()) {
    int64_t v = j.get<int64_t>();
    if (v < 0) return false;
    *out = uint64_t(v);
    return true;
  }
  return false;
}

std::string shape_of_json(const json& j) {
  std::string s = j.dump();
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

// Bytes of a tensor with this dtype and shape; false on negative dims or overflow.
bool tensor_bytes(DType t, const std::vector<int64_t>& shape, uint64_t* out) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return false;
    if (__builtin_mul_overflow(n, uint64_t(d), &n)) return false;
  }
  if (__builtin_mul_overflow(n, uint64_t(dtype_size(t)), &n)) return false;
  if (n > uint64_t(INT64_MAX)) return false;
  *out = n;
  return true;
}

// A name or value from the file, cut short for messages (a hostile header can hold 100 MB strings).
std::string clip(const std::string& s) { return s.size() <= 200 ? s : s.substr(0, 200) + "..."; }

std::string span_text(uint64_t b, uint64_t e) { return str_cat("[", b, ", ", e, "]"); }

// Parses the header JSON. Rejects duplicate tensor names (nlohmann would keep the last silently)
// and nesting deeper than a header can have (root object, entry object, shape/offsets array).
json header_parse(const std::string& path, const char* p, size_t n) {
  std::set<std::string> seen;
  auto cb = [&](int depth, json::parse_event_t ev, json& parsed) -> bool {
    if ((ev == json::parse_event_t::object_start || ev == json::parse_event_t::array_start) && depth >= 3)
      st_bad(path, "header nests objects/arrays deeper than a safetensors header can (3 levels)");
    if (ev == json::parse_event_t::key && depth == 1 && parsed.is_string()) {
      if (!seen.insert(parsed.get<std::string>()).second)
        st_bad(path, "duplicate tensor name '", clip(parsed.get<std::string>()), "' in the header");
    }
    return true;
  };
  try {
    return json::parse(p, p + n, cb, /*allow_exceptions=*/true);
  } catch (const json::parse_error& e) {
    st_bad(path, "header is not valid JSON (", e.what(), ")");
  } catch (const json::exception& e) {  // e.g. out_of_range for a number like 1e999
    st_bad(path, "header is not valid JSON (", e.what(), ")");
  }
}

SafetensorsEntry entry_parse(const std::string& path, const std::string& name, const json& j,
                             uint64_t data_bytes) {
  SafetensorsEntry e;
  e.name = name;
  const std::string nm = clip(name);
  if (!j.is_object()) st_bad(path, "header entry '", nm, "' must be an object, got ", json_type_name(j));
  auto dt = j.find("dtype");
  auto sh = j.find("shape");
  auto off = j.find("data_offsets");
  if (dt == j.end()) st_bad(path, "tensor '", nm, "' has no \"dtype\"");
  if (sh == j.end()) st_bad(path, "tensor '", nm, "' has no \"shape\"");
  if (off == j.end()) st_bad(path, "tensor '", nm, "' has no \"data_offsets\"");
  if (!dt->is_string()) st_bad(path, "tensor '", nm, "' dtype must be a string, got ", json_type_name(*dt));
  const std::string& dts = dt->get_ref<const std::string&>();
  if (!dtype_from_safetensors(dts, &e.dtype))
    st_bad(path, "tensor '", nm, "' has unsupported dtype '", clip(dts),
           "' (strata reads F32, BF16, F16, I32, I64)");
  if (!sh->is_array()) st_bad(path, "tensor '", nm, "' shape must be an array, got ", json_type_name(*sh));
  for (const json& d : *sh) {
    uint64_t v;
    if (!json_get_u64(d, &v) || v > uint64_t(INT64_MAX))
      st_bad(path, "tensor '", nm, "' shape ", shape_of_json(*sh),
             " must hold non-negative integers (below 2^63)");
    e.shape.push_back(int64_t(v));
  }
  if (!off->is_array() || off->size() != 2)
    st_bad(path, "tensor '", nm, "' data_offsets must be an array [begin, end], got ", shape_of_json(*off));
  if (!json_get_u64((*off)[0], &e.begin) || !json_get_u64((*off)[1], &e.end))
    st_bad(path, "tensor '", nm, "' data_offsets ", shape_of_json(*off),
           " must be non-negative integers");
  if (e.begin > e.end)
    st_bad(path, "tensor '", nm, "' data_offsets ", span_text(e.begin, e.end), " have begin > end");
  if (e.end > data_bytes)
    st_bad(path, "tensor '", nm, "' data_offsets ", span_text(e.begin, e.end),
           " are out of range: the data section holds ", data_bytes, " bytes (file truncated?)");
  uint64_t want;
  if (!tensor_bytes(e.dtype, e.shape, &want))
    st_bad(path, "tensor '", nm, "' shape ", safetensors_format_shape(e.shape), " is too large");
  if (want != e.end - e.begin)
    st_bad(path, "tensor '", nm, "' size mismatch: ", dts, " ", safetensors_format_shape(e.shape), " needs ",
           want, " bytes but data_offsets ", span_text(e.begin, e.end), " span ", e.end - e.begin);
  return e;
}

uint64_t to_write_bytes(const TensorToWrite& t) {
  uint64_t n;
  STRATA_CHECK(tensor_bytes(t.dtype, t.shape, &n), "tensor '", t.name, "' has an invalid shape ",
               safetensors_format_shape(t.shape), " (negative or too large)");
  STRATA_CHECK(n == 0 || t.data != nullptr || t.stream || t.fill, "tensor '", t.name, "' has no data pointer");
  return n;
}

}  // namespace

int64_t SafetensorsEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string safetensors_format_shape(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// ---- SafetensorsFile ------------------------------------------------------------------------

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  STRATA_CHECK_IO(fd >= 0, "cannot open safetensors file ", path, ": ", errno_text(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw Error(ErrorKind::io, str_cat("cannot stat safetensors file ", path, ": ", errno_text(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    st_bad(path, "is not a regular file");
  }
  uint64_t size = uint64_t(st.st_size);
  if (size < 8) {
    ::close(fd);
    st_bad(path, "file is truncated: ", size, " bytes, shorter than the 8-byte header length");
  }
  void* m = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int map_err = errno;
  ::close(fd);  // the mapping keeps the file referenced
  STRATA_CHECK_IO(m != MAP_FAILED, "cannot mmap safetensors file ", path, " (", size, " bytes): ",
                  errno_text(map_err));
  f.map_ = m;
  f.map_bytes_ = size;

  const auto* bytes = static_cast<const unsigned char*>(m);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];  // little-endian u64
  if (n > kSafetensorsMaxHeaderBytes)
    st_bad(path, "header length ", n, " is absurd (limit ", kSafetensorsMaxHeaderBytes, " bytes; file is ",
           size, " bytes): not a safetensors file or corrupted");
  if (n > size - 8)
    st_bad(path, "header length ", n, " runs beyond the end of the file (file is ", size,
           " bytes): file truncated or corrupted");
  f.data_offset_ = 8 + n;
  const uint64_t data_bytes = size - f.data_offset_;

  json h = header_parse(path, reinterpret_cast<const char*>(bytes + 8), size_t(n));
  if (!h.is_object()) st_bad(path, "header must be a JSON object, got ", json_type_name(h));
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (it->is_null()) continue;
      if (!it->is_object()) st_bad(path, "__metadata__ must be an object, got ", json_type_name(*it));
      for (auto m2 = it->begin(); m2 != it->end(); ++m2) {
        if (!m2->is_string())
          st_bad(path, "__metadata__ value of '", clip(m2.key()), "' must be a string, got ", json_type_name(*m2));
        f.metadata_[m2.key()] = m2->get<std::string>();
      }
      continue;
    }
    f.entries_.push_back(entry_parse(path, it.key(), *it, data_bytes));
  }
  std::sort(f.entries_.begin(), f.entries_.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  // Non-empty spans must not overlap; empty tensors occupy no bytes.
  const SafetensorsEntry* prev = nullptr;
  for (const auto& e : f.entries_) {
    if (e.begin == e.end) continue;
    if (prev && prev->end > e.begin)
      st_bad(path, "tensors '", clip(prev->name), "' ", span_text(prev->begin, prev->end), " and '", clip(e.name), "' ",
             span_text(e.begin, e.end), " overlap in the data section");
    prev = &e;
  }
  for (size_t i = 0; i < f.entries_.size(); ++i) f.by_name_.emplace(f.entries_[i].name, i);
  return f;
}

const SafetensorsEntry* SafetensorsFile::find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &entries_[it->second];
}

const void* SafetensorsFile::data(const SafetensorsEntry& e) const {
  STRATA_ASSERT(map_ && e.end <= map_bytes_ - data_offset_ && e.begin <= e.end, "entry not from ", path_);
  return static_cast<const char*>(map_) + data_offset_ + e.begin;
}

void SafetensorsFile::release(const SafetensorsEntry& e) const {
  if (e.begin == e.end) return;
  const char* first = static_cast<const char*>(data(e));
  const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  const uintptr_t lo = uintptr_t(first) / page * page, hi = (uintptr_t(first) + e.bytes() + page - 1) / page * page;
  ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);  // advice: a failure only keeps the pages
}

void SafetensorsFile::unmap() {
  if (map_) ::munmap(map_, map_bytes_);  // cannot fail for a mapping we made
  map_ = nullptr;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept { *this = std::move(o); }

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this != &o) {
    unmap();
    path_ = std::move(o.path_);
    map_ = o.map_;
    map_bytes_ = o.map_bytes_;
    data_offset_ = o.data_offset_;
    entries_ = std::move(o.entries_);
    by_name_ = std::move(o.by_name_);
    metadata_ = std::move(o.metadata_);
    o.map_ = nullptr;
    o.map_bytes_ = 0;
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() { unmap(); }

// ---- SafetensorsDir -------------------------------------------------------------------------

SafetensorsDir SafetensorsDir::open(const std::string& dir) {
  SafetensorsDir d;
  d.dir_ = dir;
  std::error_code ec;
  STRATA_CHECK_IO(fs::is_directory(dir, ec), "model directory ", dir, " does not exist or is not a directory");
  const std::string single = (fs::path(dir) / "model.safetensors").string();
  const std::string index = (fs::path(dir) / "model.safetensors.index.json").string();
  if (fs::exists(single, ec)) {
    d.files_.push_back(SafetensorsFile::open(single));
    for (const auto& e : d.files_[0].entries()) d.by_name_.emplace(e.name, Loc{0, &e});
    return d;
  }
  STRATA_CHECK_IO(fs::exists(index, ec), "model directory ", dir,
                  " has neither model.safetensors nor model.safetensors.index.json");
  d.sharded_ = true;

  // Read and validate the index.
  const std::string text = file_read(index, "index");
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    STRATA_CHECK(false, "index ", index, " is not valid JSON (", e.what(), ")");
  }
  STRATA_CHECK(j.is_object(), "index ", index, " must be a JSON object");
  auto wm = j.find("weight_map");
  STRATA_CHECK(wm != j.end() && wm->is_object(), "index ", index, " has no \"weight_map\" object");
  std::map<std::string, size_t> file_index;  // shard file name -> index in files_
  std::map<std::string, std::string> want;   // tensor -> shard file name
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    STRATA_CHECK(it->is_string(), "index ", index, ": weight_map entry '", it.key(), "' must be a file name string");
    const std::string& file = it->get_ref<const std::string&>();
    STRATA_CHECK(!file.empty() && file.find('/') == std::string::npos && file != "." && file != "..",
                 "index ", index, ": weight_map entry '", it.key(), "' names '", file,
                 "', which is not a plain file name in the model directory");
    want[it.key()] = file;
    file_index.emplace(file, 0);
  }
  for (auto& [file, idx] : file_index) {
    std::string p = (fs::path(dir) / file).string();
    STRATA_CHECK_IO(fs::exists(p, ec), "shard ", p, " named in ", index, " is missing");
    idx = d.files_.size();
    d.files_.push_back(SafetensorsFile::open(p));
  }
  // The index must list exactly what the shards hold.
  std::vector<std::string> problems;
  for (size_t fi = 0; fi < d.files_.size(); ++fi) {
    const SafetensorsFile& f = d.files_[fi];
    std::string base = fs::path(f.path()).filename().string();
    for (const auto& e : f.entries()) {
      auto w = want.find(e.name);
      if (w == want.end()) {
        problems.push_back(str_cat("tensor '", e.name, "' is in shard ", f.path(), " but not in the index"));
      } else if (w->second != base) {
        // Either listed under another shard, or present in two shards.
        problems.push_back(str_cat("tensor '", e.name, "' is in shard ", f.path(), " but the index puts it in ",
                                   w->second));
      } else {
        d.by_name_.emplace(e.name, Loc{fi, &e});
      }
    }
  }
  for (const auto& [name, file] : want) {
    if (!d.by_name_.count(name))
      problems.push_back(str_cat("index names tensor '", name, "' in ", file, " but that shard lacks it"));
  }
  if (!problems.empty()) {
    std::string msg = str_cat("model directory ", dir, ": ", index, " does not match its shards:");
    for (const auto& p : problems) msg += "\n  " + p;
    throw Error(ErrorKind::input, msg);
  }
  return d;
}

std::vector<std::string> SafetensorsDir::names() const {
  std::vector<std::string> out;
  out.reserve(by_name_.size());
  for (const auto& [name, loc] : by_name_) out.push_back(name);
  return out;
}

const SafetensorsDir::Loc* SafetensorsDir::locate(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &it->second;
}

const SafetensorsEntry* SafetensorsDir::find(std::string_view name) const {
  const Loc* l = locate(name);
  return l ? l->entry : nullptr;
}

const std::string& SafetensorsDir::file_of(std::string_view name) const {
  const Loc* l = locate(name);
  STRATA_CHECK(l, "tensor '", name, "' is not in model directory ", dir_);
  return files_[l->file].path();
}

void SafetensorsDir::release(std::string_view name) const {
  const Loc* l = locate(name);
  STRATA_CHECK(l, "tensor '", name, "' is not in model directory ", dir_);
  files_[l->file].release(*l->entry);
}

void SafetensorsFile::read(const SafetensorsEntry& e, DType dst_type, void* dst) const {
  auto is_float = [](DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; };
  STRATA_CHECK(e.dtype == dst_type || (is_float(e.dtype) && is_float(dst_type)), "tensor '", e.name, "' in ", path_,
               " is ", dtype_safetensors_name(e.dtype), " and cannot be read as ", dtype_name(dst_type));
  const size_t n = size_t(e.numel());
  if (n == 0) return;
  const char* src = static_cast<const char*>(data(e));
  const size_t es = dtype_size(e.dtype);
  if (e.dtype == dst_type || reinterpret_cast<uintptr_t>(src) % es == 0) {
    dtype_convert(dst, dst_type, src, e.dtype, n);
    return;
  }
  // The data section need not be aligned for this dtype: convert through an aligned bounce buffer.
  alignas(64) static thread_local char bounce[1 << 16];
  const size_t per = sizeof bounce / es;
  char* out = static_cast<char*>(dst);
  for (size_t i = 0; i < n; i += per) {
    size_t k = std::min(per, n - i);
    std::memcpy(bounce, src + i * es, k * es);
    dtype_convert(out + i * dtype_size(dst_type), dst_type, bounce, e.dtype, k);
  }
}

void SafetensorsDir::read(std::string_view name, DType dst_type, void* dst) const {
  const Loc* l = locate(name);
  STRATA_CHECK(l, "tensor '", name, "' is not in model directory ", dir_);
  files_[l->file].read(*l->entry, dst_type, dst);
}

void safetensors_check_tensors(const SafetensorsDir& dir, const std::vector<ExpectedTensor>& expected,
                               const std::string& why) {
  std::vector<std::string> missing, unexpected, mismatched;
  std::set<std::string_view> wanted;
  for (const auto& x : expected) {
    wanted.insert(x.name);
    const SafetensorsEntry* e = dir.find(x.name);
    if (!e) {
      missing.push_back(str_cat(x.name, " (expected shape ", safetensors_format_shape(x.shape), ")"));
    } else if (e->shape != x.shape) {
      mismatched.push_back(str_cat(x.name, " in ", dir.file_of(x.name), ": shape on disk ",
                                   safetensors_format_shape(e->shape), ", expected ",
                                   safetensors_format_shape(x.shape)));
    }
  }
  for (const auto& name : dir.names())
    if (!wanted.count(name)) unexpected.push_back(str_cat(name, " (in ", dir.file_of(name), ")"));
  if (missing.empty() && unexpected.empty() && mismatched.empty()) return;
  std::string msg = str_cat("the checkpoint in ", dir.dir(), " does not match the model (", why, "): ",
                            missing.size(), " missing, ", unexpected.size(), " unexpected, ", mismatched.size(),
                            " with the wrong shape");
  auto section = [&](const char* title, const std::vector<std::string>& v) {
    if (v.empty()) return;
    msg += str_cat("\n", title, ":");
    for (const auto& s : v) msg += "\n  " + s;
  };
  section("missing tensors", missing);
  section("unexpected tensors", unexpected);
  section("shape mismatches", mismatched);
  msg += "\ncheck that config.json belongs to these weights";
  throw Error(ErrorKind::input, msg);
}

// ---- writing --------------------------------------------------------------------------------

void safetensors_write_file(const std::string& path, const std::vector<TensorToWrite>& tensors,
                            const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  nlohmann::ordered_json meta = nlohmann::ordered_json::object();
  meta["format"] = "pt";
  for (const auto& [k, v] : metadata) meta[k] = v;
  h["__metadata__"] = meta;
  std::vector<uint64_t> sizes;
  uint64_t off = 0;
  for (const auto& t : tensors) {
    STRATA_CHECK(t.name != "__metadata__", "a tensor cannot be named __metadata__ (writing ", path, ")");
    STRATA_CHECK(!h.contains(t.name), "tensor '", t.name, "' is listed twice (writing ", path, ")");
    uint64_t n = to_write_bytes(t);
    nlohmann::ordered_json e;
    e["dtype"] = dtype_safetensors_name(t.dtype);
    e["shape"] = t.shape;
    e["data_offsets"] = {off, off + n};
    h[t.name] = std::move(e);
    sizes.push_back(n);
    off += n;
  }
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data section starts 8-byte aligned
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(uint64_t(text.size()) >> (8 * i));
  AtomicFile f(path);
  f.write(len, 8);
  f.write(text.data(), text.size());
  std::vector<unsigned char> piece;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].data || sizes[i] == 0) {
      f.write(tensors[i].data, sizes[i]);
      continue;
    }
    if (tensors[i].stream) {
      uint64_t streamed = 0;
      tensors[i].stream([&](const void* bytes, size_t n) {
        STRATA_ASSERT(streamed + n <= sizes[i], "tensor '", tensors[i].name, "' streamed more than its ", sizes[i], " bytes");
        f.write(bytes, n);
        streamed += n;
      });
      STRATA_ASSERT(streamed == sizes[i], "tensor '", tensors[i].name, "' streamed ", streamed, " of its ", sizes[i], " bytes");
      continue;
    }
    // a piece is a whole number of elements (the element size divides kSafetensorsFillBytes)
    piece.resize(size_t(std::min<uint64_t>(sizes[i], kSafetensorsFillBytes)));
    for (uint64_t at = 0; at < sizes[i]; at += piece.size()) {
      const size_t len = size_t(std::min<uint64_t>(piece.size(), sizes[i] - at));
      tensors[i].fill(at, piece.data(), len);
      f.write(piece.data(), len);
    }
  }
  f.commit();
}

void safetensors_write_dir(const std::string& dir, const std::vector<TensorToWrite>& tensors,
                           uint64_t max_shard_bytes) {
  STRATA_CHECK(max_shard_bytes > 0, "max shard size must be positive (writing ", dir, ")");
  std::error_code ec;
  fs::create_directories(dir, ec);
  STRATA_CHECK_IO(!ec, "cannot create directory ", dir, ": ", ec.message());

  // Greedy split in the given order; a tensor bigger than the limit gets its own shard.
  std::vector<std::vector<size_t>> shards;
  uint64_t cur = 0, total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    uint64_t n = to_write_bytes(tensors[i]);
    total += n;
    if (shards.empty() || n > max_shard_bytes || cur + n > max_shard_bytes) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().push_back(i);
    cur += n;
    if (n > max_shard_bytes) cur = max_shard_bytes + 1;  // nothing joins an oversized tensor
  }

  const fs::path d(dir);
  std::set<std::string> written;
  if (shards.size() <= 1) {
    safetensors_write_file((d / "model.safetensors").string(), tensors);
    written.insert("model.safetensors");
  } else {
    json weight_map = json::object();
    char name[64];
    for (size_t s = 0; s < shards.size(); ++s) {
      std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
      std::vector<TensorToWrite> part;
      for (size_t i : shards[s]) {
        part.push_back(tensors[i]);
        weight_map[tensors[i].name] = name;
      }
      safetensors_write_file((d / name).string(), part);
      written.insert(name);
    }
    json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    std::string text = index.dump(2) + "\n";
    file_write_atomic((d / "model.safetensors.index.json").string(), text.data(), text.size());
    written.insert("model.safetensors.index.json");
  }

  // Remove files of another layout so that loaders cannot pick up stale weights.
  for (const auto& ent : fs::directory_iterator(d, ec)) {
    std::string fn = ent.path().filename().string();
    bool ours = fn == "model.safetensors" || fn == "model.safetensors.index.json" ||
                (fn.rfind("model-", 0) == 0 && fn.find("-of-") != std::string::npos && fn.size() > 12 &&
                 fn.compare(fn.size() - 12, 12, ".safetensors") == 0);
    if (ours && !written.count(fn)) {
      STRATA_CHECK_IO(::unlink(ent.path().c_str()) == 0 || errno == ENOENT, "cannot remove stale ",
                      ent.path().string(), ": ", errno_text(errno));
    }
  }
  STRATA_CHECK_IO(!ec, "cannot list directory ", dir, ": ", ec.message());
}

}  // namespace strata
