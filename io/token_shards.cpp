// Binary token shards and the prepared-data manifest (see io/token_shards.h).
#include "io/token_shards.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "io/checksum.h"
#include "io/files.h"
#include "io/tokenizer/tokenizer.h"
#include "src/core/error.h"

namespace strata {

static_assert(std::endian::native == std::endian::little, "shards are little-endian");

namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'S', 'T', 'R', 'A', 'T', 'A', 'S', 'H'};
// 2: a CRC-32C trailer. Version 1 shards had none, so a changed byte that still made a valid
// token id trained silently; they are refused (rerun prepare) rather than read unverified.
constexpr uint32_t kVersion = 2;
constexpr uint32_t kFlagMaySplit = 1;
constexpr uint64_t kTrailerBytes = 4;  // u32 CRC-32C of every byte before it
static_assert(sizeof(uint32_t) == kTrailerBytes);
// The prepared directory's format (manifest and shards together); 2: shards of version 2.
constexpr int kManifestVersion = 2;
// Bumped when the samples a dataset turns into change meaning (masks, formats), so older
// shards read as stale.
constexpr int kSamplesVersion = 1;

struct ShardHeader {
  char magic[8];
  uint32_t version, token_bytes;
  uint64_t vocab_size, sample_count, token_count;
  uint64_t tokens_offset, labels_offset, offsets_offset;
  uint64_t fingerprint_hash;
  uint32_t flags, reserved;
  uint8_t zero[48];
};
static_assert(sizeof(ShardHeader) == 128);

uint64_t align8(uint64_t x) { return (x + 7) & ~uint64_t(7); }

std::string rerun(const std::string& path) {
  return str_cat(path, ": rerun `strata prepare RECIPE.toml` to rebuild data.prepared_dir");
}

// What a prepared file of another format version says: older ones are rebuilt, never read.
std::string version_advice(const char* what, int64_t have, int64_t want, const std::string& path) {
  return have < want ? str_cat(what, " format version ", have, " was written by an older strata (this one reads ", want,
                               ", whose shards carry a CRC-32C checksum); ", rerun(path))
                     : str_cat(what, " format version ", have, " was written by a newer strata (this one reads ", want,
                               "); use that strata, or ", rerun(path));
}

// A read-only mapping of a whole file.
struct Mapped {
  const uint8_t* data = nullptr;
  size_t size = 0;
  explicit Mapped(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    STRATA_CHECK_IO(fd >= 0, "cannot open shard ", path, ": ", std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      int err = errno;
      ::close(fd);
      STRATA_CHECK_IO(false, "cannot stat shard ", path, ": ", std::strerror(err));
    }
    size = size_t(st.st_size);
    if (size > 0) {
      void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
      int err = errno;
      ::close(fd);
      STRATA_CHECK_IO(p != MAP_FAILED, "cannot map shard ", path, ": ", std::strerror(err));
      data = static_cast<const uint8_t*>(p);
    } else {
      ::close(fd);
    }
  }
  ~Mapped() {
    if (data) ::munmap(const_cast<uint8_t*>(data), size);
  }
  Mapped(const Mapped&) = delete;
  Mapped& operator=(const Mapped&) = delete;
};


std::string hex64(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// Identity of a data file: its absolute path, size and modification time ("missing" when it
// is gone: shards may travel to a machine without the raw data).
nlohmann::json file_identity(const std::string& path) {
  std::error_code ec;
  fs::path abs = fs::weakly_canonical(path, ec);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {{"path", ec ? path : abs.string()}, {"missing", true}};
  return {{"path", ec ? path : abs.string()},
          {"size", int64_t(st.st_size)},
          {"mtime_ns", int64_t(st.st_mtim.tv_sec) * 1000000000 + int64_t(st.st_mtim.tv_nsec)}};
}

// Content hash of a file, or "absent".
std::string file_hash(const fs::path& p) {
  if (!fs::exists(p)) return "absent";
  std::string text = file_read(p.string(), "tokenizer file");
  return hex64(fnv1a64(text.data(), text.size()));
}

nlohmann::json dataset_stats_json(const Dataset& d) {
  const DatasetStats& s = d.stats;
  return {{"path", d.path},         {"format", d.format},       {"samples", s.samples},
          {"tokens", s.tokens},     {"labelled", s.labelled},   {"skipped_lines", s.skipped_lines},
          {"truncated", s.truncated}, {"dropped_overlong", s.dropped_overlong},
          {"dropped_unlabelled", s.dropped_unlabelled}};
}

Dataset dataset_from_stats_json(const nlohmann::json& j) {
  Dataset d;
  d.path = j.at("path").get<std::string>();
  d.format = j.at("format").get<std::string>();
  DatasetStats& s = d.stats;
  s.samples = j.at("samples");
  s.tokens = j.at("tokens");
  s.labelled = j.at("labelled");
  s.skipped_lines = j.at("skipped_lines");
  s.truncated = j.at("truncated");
  s.dropped_overlong = j.at("dropped_overlong");
  s.dropped_unlabelled = j.at("dropped_unlabelled");
  return d;
}

}  // namespace

uint64_t fnv1a64(const void* data, size_t n, uint64_t h) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

void shard_write(const std::string& path, const std::vector<Sample>& samples, int64_t vocab_size,
                 uint64_t fingerprint_hash) {
  STRATA_ASSERT(vocab_size > 0);
  ShardHeader h{};
  std::memcpy(h.magic, kMagic, 8);
  h.version = kVersion;
  h.token_bytes = vocab_size <= 65536 ? 2 : 4;
  h.vocab_size = uint64_t(vocab_size);
  h.sample_count = samples.size();
  uint64_t tokens = 0;
  bool may_split = !samples.empty() && samples[0].may_split;
  for (const Sample& s : samples) {
    STRATA_ASSERT(s.may_split == may_split, "a shard holds one kind of sample");
    STRATA_ASSERT(s.ids.size() == s.labels.size());
    tokens += s.ids.size();
  }
  h.token_count = tokens;
  h.tokens_offset = sizeof(ShardHeader);
  h.labels_offset = h.tokens_offset + tokens * h.token_bytes;
  h.offsets_offset = align8(h.labels_offset + tokens);
  h.fingerprint_hash = fingerprint_hash;
  h.flags = may_split ? kFlagMaySplit : 0;
  {
    AtomicFile file(path);
    uint32_t crc = 0;  // of every byte written, chained as they go out
    auto put = [&](const void* data, size_t bytes) {
      crc = crc32c(data, bytes, crc);
      file.write(data, bytes);
    };
    put(&h, sizeof h);
    std::vector<uint8_t> buf;
    buf.reserve(1 << 20);
    auto drain = [&](bool force) {
      if (buf.size() >= (1u << 20) || (force && !buf.empty())) {
        put(buf.data(), buf.size());
        buf.clear();
      }
    };
    for (const Sample& s : samples)
      for (int32_t id : s.ids) {
        STRATA_ASSERT(id >= 0 && uint64_t(id) < h.vocab_size, "token id ", id, " outside the vocabulary of ", vocab_size);
        uint32_t v = uint32_t(id);
        buf.insert(buf.end(), reinterpret_cast<uint8_t*>(&v), reinterpret_cast<uint8_t*>(&v) + h.token_bytes);
        drain(false);
      }
    for (const Sample& s : samples) {
      buf.insert(buf.end(), s.labels.begin(), s.labels.end());
      drain(false);
    }
    buf.resize(buf.size() + size_t(h.offsets_offset - h.labels_offset - tokens));  // zero padding to 8 bytes
    uint64_t at = 0;
    for (size_t i = 0; i <= samples.size(); ++i) {
      buf.insert(buf.end(), reinterpret_cast<uint8_t*>(&at), reinterpret_cast<uint8_t*>(&at) + 8);
      if (i < samples.size()) at += samples[i].ids.size();
      drain(false);
    }
    drain(true);
    STRATA_ASSERT(file.written() == h.offsets_offset + 8 * (h.sample_count + 1));
    file.write(&crc, sizeof crc);
    file.commit();
  }
}

std::vector<Sample> shard_read(const std::string& path, int64_t max_vocab_size, uint64_t fingerprint_hash) {
  Mapped m(path);
  ShardHeader h{};
  STRATA_CHECK(m.size >= sizeof h, "shard is truncated: ", m.size, " bytes, shorter than its header; ", rerun(path));
  std::memcpy(&h, m.data, sizeof h);
  STRATA_CHECK(std::memcmp(h.magic, kMagic, 8) == 0, "not a strata shard (bad magic); ", rerun(path));
  STRATA_CHECK(h.version == kVersion, version_advice("shard", h.version, kVersion, path));
  STRATA_CHECK(h.vocab_size > 0 && h.token_bytes == (h.vocab_size <= 65536 ? 2u : 4u),
               "shard header is corrupt (vocab_size ", h.vocab_size, ", token_bytes ", h.token_bytes, "); ", rerun(path));
  const uint64_t size = m.size;
  // each count bounded by the file size first, so the products below cannot overflow
  const bool sizes_ok = h.token_count <= size && h.sample_count <= size / 8 && h.tokens_offset == sizeof h &&
                        h.labels_offset == h.tokens_offset + h.token_count * h.token_bytes &&
                        h.offsets_offset == align8(h.labels_offset + h.token_count) &&
                        size == h.offsets_offset + 8 * (h.sample_count + 1) + kTrailerBytes;
  STRATA_CHECK(sizes_ok, "shard is truncated or its header is corrupt (", size, " bytes on disk; the header says ",
               h.sample_count, " samples, ", h.token_count, " tokens); ", rerun(path));
  // One pass over the mapped bytes (CRC-32C runs at memory speed on SSE4.2), before anything
  // below trusts them: a changed byte that still reads as a valid token id is caught here.
  uint32_t stored = 0;
  std::memcpy(&stored, m.data + size - kTrailerBytes, kTrailerBytes);
  const uint32_t computed = crc32c(m.data, size - kTrailerBytes);
  STRATA_CHECK(computed == stored, "shard is damaged: its bytes do not match its CRC-32C checksum (computed ",
               crc32c_hex(computed), ", stored ", crc32c_hex(stored), "); ", rerun(path));
  STRATA_CHECK(h.fingerprint_hash == fingerprint_hash, "shard belongs to another preparation than manifest.json; ",
               rerun(path));
  STRATA_CHECK(h.vocab_size <= uint64_t(max_vocab_size), "shard was prepared for a vocabulary of ", h.vocab_size,
               " ids but the model's vocab_size is ", max_vocab_size, "; ", rerun(path));
  std::vector<uint64_t> offsets(h.sample_count + 1);
  std::memcpy(offsets.data(), m.data + h.offsets_offset, offsets.size() * 8);
  STRATA_CHECK(offsets.front() == 0 && offsets.back() == h.token_count, "shard's sample offsets do not span its ",
               h.token_count, " tokens; ", rerun(path));
  for (size_t i = 0; i + 1 < offsets.size(); ++i)
    STRATA_CHECK(offsets[i] < offsets[i + 1], "shard's sample offsets are not ascending at sample ", i, "; ", rerun(path));
  const uint8_t* tokens = m.data + h.tokens_offset;
  const uint8_t* labels = m.data + h.labels_offset;
  std::vector<Sample> out(h.sample_count);
  for (size_t i = 0; i < out.size(); ++i) {
    Sample& s = out[i];
    const size_t b = offsets[i], n = offsets[i + 1] - offsets[i];
    s.may_split = (h.flags & kFlagMaySplit) != 0;
    s.ids.resize(n);
    if (h.token_bytes == 2) {
      for (size_t t = 0; t < n; ++t) {
        uint16_t v;
        std::memcpy(&v, tokens + 2 * (b + t), 2);
        s.ids[t] = int32_t(v);
      }
    } else {
      for (size_t t = 0; t < n; ++t) {
        uint32_t v;
        std::memcpy(&v, tokens + 4 * (b + t), 4);
        STRATA_CHECK(v < h.vocab_size, "shard holds token id ", v, " at sample ", i, ", not below its vocab_size ",
                     h.vocab_size, "; ", rerun(path));
        s.ids[t] = int32_t(v);
      }
    }
    if (h.token_bytes == 2)
      for (size_t t = 0; t < n; ++t)
        STRATA_CHECK(uint64_t(s.ids[t]) < h.vocab_size, "shard holds token id ", s.ids[t], " at sample ", i,
                     ", not below its vocab_size ", h.vocab_size, "; ", rerun(path));
    s.labels.assign(labels + b, labels + b + n);
    for (uint8_t l : s.labels)
      STRATA_CHECK(l <= 1, "shard holds a label flag of ", int(l), " at sample ", i, " (0 or 1 expected); ", rerun(path));
  }
  return out;
}

nlohmann::json prepared_fingerprint(const SamplesOptions& o, const TextEncoder& enc) {
  // Keyed by the recipe's names, with the values as a recipe writes them (manifests written
  // before io took plain options compare equal).
  const DatasetOptions& d = o.dataset;
  nlohmann::json f;
  f["samples_version"] = kSamplesVersion;
  f["data.path"] = file_identity(o.path);
  f["data.eval_path"] = o.eval_path.empty() ? nlohmann::json(nullptr) : file_identity(o.eval_path);
  f["data.format"] = d.format;
  f["data.train_on"] = d.train_on == TrainOn::assistant ? "assistant" : d.train_on == TrainOn::last ? "last" : "all";
  f["data.overlong"] = d.drop_overlong ? "drop" : "truncate";
  f["data.sequence_len"] = d.sequence_len;
  f["data.packing"] = d.packing;
  f["data.skip_bad_lines"] = d.skip_bad_lines;
  f["data.eval_split"] = o.eval_split;
  if (enc.is_bytes()) {
    f["tokenizer"] = "bytes";
  } else if (enc.dir().empty()) {
    f["tokenizer"] = "in-memory";
  } else {
    const fs::path dir(enc.dir());
    f["tokenizer"] = {{"tokenizer.json", file_hash(dir / "tokenizer.json")},
                      {"tokenizer_config.json", file_hash(dir / "tokenizer_config.json")},
                      {"chat_template.jinja", file_hash(dir / "chat_template.jinja")}};
  }
  return f;
}

bool prepared_exists(const std::string& dir) { return fs::exists(fs::path(dir) / "manifest.json"); }

void prepared_write(const std::string& dir, const TrainingSamples& s, const nlohmann::json& fingerprint,
                    int64_t vocab_size) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  STRATA_CHECK_IO(!ec, "cannot create data.prepared_dir ", dir, ": ", ec.message());
  const fs::path manifest = fs::path(dir) / "manifest.json";
  fs::remove(manifest, ec);  // shards being replaced are never paired with an old manifest
  STRATA_CHECK_IO(!ec, "cannot remove the old ", manifest.string(), ": ", ec.message());
  const std::string fp_text = fingerprint.dump();
  const uint64_t fp_hash = fnv1a64(fp_text.data(), fp_text.size());
  nlohmann::json m;
  m["strata_prepared"] = kManifestVersion;
  m["fingerprint"] = fingerprint;
  m["fingerprint_hash"] = hex64(fp_hash);
  m["vocab_size"] = vocab_size;
  m["report"] = s.report;
  nlohmann::json splits = nlohmann::json::object();
  auto put = [&](const char* name, const Dataset& d) {
    if (d.samples.empty()) return;
    nlohmann::json e = dataset_stats_json(d);
    e["file"] = std::string(name) + ".bin";
    shard_write((fs::path(dir) / e["file"].get<std::string>()).string(), d.samples, vocab_size, fp_hash);
    if (!d.rejected.empty()) {
      e["rejected_file"] = std::string(name) + ".rejected.bin";
      shard_write((fs::path(dir) / e["rejected_file"].get<std::string>()).string(), d.rejected, vocab_size, fp_hash);
    }
    splits[name] = e;
  };
  put("train", s.train);
  put("eval", s.eval);
  m["splits"] = splits;
  const std::string text = m.dump(2) + "\n";
  file_write_atomic(manifest.string(), text);
}

TrainingSamples prepared_read(const std::string& dir, const SamplesOptions& options, const TextEncoder& enc,
                              int64_t model_vocab_size) {
  const std::string manifest_path = (fs::path(dir) / "manifest.json").string();
  nlohmann::json m = nlohmann::json::parse(file_read(manifest_path, "manifest", "rerun `strata prepare RECIPE.toml`"), nullptr, false);
  STRATA_CHECK(!m.is_discarded() && m.is_object() && m.contains("strata_prepared") &&
                   m["strata_prepared"].is_number_integer(),
               "manifest is not one strata wrote; ", rerun(manifest_path));
  const int64_t version = m["strata_prepared"].get<int64_t>();
  STRATA_CHECK(version == kManifestVersion, version_advice("prepared data", version, kManifestVersion, manifest_path));
  STRATA_CHECK(m.contains("fingerprint") && m.contains("fingerprint_hash") && m.contains("splits") &&
                   m["splits"].is_object(),
               "manifest is not one this strata wrote; ", rerun(manifest_path));
  const nlohmann::json want = prepared_fingerprint(options, enc);
  const nlohmann::json& have = m["fingerprint"];
  for (auto it = want.begin(); it != want.end(); ++it) {
    if (it.value().is_object() && it.value().contains("missing")) {
      std::fprintf(stderr, "strata data: %s %s is not here: using the shards prepared from it (its other settings "
                           "still checked)\n", it.key().c_str(), it.value()["path"].get<std::string>().c_str());
      continue;
    }
    const bool same = have.contains(it.key()) && have[it.key()] == it.value();
    STRATA_CHECK(same, "data.prepared_dir ", dir, " is stale: ", it.key(), " was ",
                 have.contains(it.key()) ? have[it.key()].dump() : std::string("absent"), " when it was prepared and is ",
                 it.value().dump(), " now; rerun `strata prepare RECIPE.toml`");
  }
  const std::string fp_text = have.dump();
  const uint64_t fp_hash = fnv1a64(fp_text.data(), fp_text.size());
  STRATA_CHECK(m["fingerprint_hash"] == hex64(fp_hash), "manifest's fingerprint hash does not match; ", rerun(manifest_path));
  TrainingSamples out;
  out.report = m.value("report", std::string());
  auto get = [&](const char* name, Dataset* d) {
    if (!m["splits"].contains(name)) return;
    const nlohmann::json& e = m["splits"][name];
    try {
      *d = dataset_from_stats_json(e);
      d->samples = shard_read((fs::path(dir) / e.at("file").get<std::string>()).string(), model_vocab_size, fp_hash);
      if (e.contains("rejected_file"))
        d->rejected = shard_read((fs::path(dir) / e.at("rejected_file").get<std::string>()).string(), model_vocab_size, fp_hash);
    } catch (const nlohmann::json::exception& ex) {
      STRATA_CHECK(false, "manifest's \"", name, "\" entry is malformed (", ex.what(), "); ", rerun(manifest_path));
    }
    STRATA_CHECK(int64_t(d->samples.size()) == d->stats.samples &&
                     (d->rejected.empty() || d->rejected.size() == d->samples.size()),
                 "shards of \"", name, "\" do not hold the samples the manifest lists; ", rerun(manifest_path));
  };
  get("train", &out.train);
  get("eval", &out.eval);
  STRATA_CHECK(!out.train.samples.empty(), "manifest lists no train shard; ", rerun(manifest_path));
  return out;
}

}  // namespace strata
