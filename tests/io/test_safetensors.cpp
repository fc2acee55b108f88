// Tests for io/safetensors: bitwise round trips, sharded directories, a corpus of bad files and
// directories (each error must name the file and the problem), tensor-set checks, write failures,
// and a seeded mutation run (every mutant must open or throw strata::Error, never crash).
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "io/safetensors.h"
#include "src/core/error.h"
#include "tests/testing.h"
#include "tools/fuzz/safetensors_mutator.h"

namespace fs = std::filesystem;
using namespace strata;
using nlohmann::json;

namespace {

// A fresh directory under /tmp, removed at scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() / ("strata_io_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
  REQUIRE(f.good());
}

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

std::string u64_le(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = char(v >> (8 * i));
  return s;
}

// A safetensors file from a header text and data bytes; header length as given unless overridden.
std::string make_file(const std::string& header, const std::string& data, int64_t len_override = -1) {
  return u64_le(len_override >= 0 ? uint64_t(len_override) : header.size()) + header + data;
}

// Opens `path` expecting strata::Error of `kind` whose message names the path and `phrase`.
void require_open_error(const std::string& path, const std::string& phrase, ErrorKind kind = ErrorKind::input) {
  try {
    SafetensorsFile::open(path);
    FAIL("opened a bad file; expected an error containing '" << phrase << "'");
  } catch (const Error& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).find(path) != std::string::npos);
    CHECK(std::string(e.what()).find(phrase) != std::string::npos);
    CHECK(e.kind() == kind);
  }
}

void require_dir_error(const std::string& dir, const std::vector<std::string>& phrases,
                       ErrorKind kind = ErrorKind::input) {
  INFO("model directory " << dir);
  try {
    SafetensorsDir::open(dir);
    FAIL("opened a bad model directory");
  } catch (const Error& e) {
    INFO(e.what());
    for (const auto& p : phrases) CHECK(std::string(e.what()).find(p) != std::string::npos);
    CHECK(e.kind() == kind);
  }
}

template <class T>
TensorToWrite tw(const std::string& name, DType t, std::vector<int64_t> shape, const std::vector<T>& v) {
  return TensorToWrite{name, t, std::move(shape), v.data()};
}

std::vector<uint16_t> random_halves(size_t n, uint64_t seed) {  // any bit pattern, NaNs included
  std::mt19937_64 rng(seed);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = uint16_t(rng());
  return v;
}

}  // namespace

TEST_CASE("safetensors: write then read is bitwise for f32/bf16/f16/i32/i64 and empty tensors", "[io]") {
  TempDir tmp;
  const std::string path = tmp / "model.safetensors";
  auto f32 = testing::random_floats(17, 1);
  f32[3] = -0.0f;
  f32[4] = std::numeric_limits<float>::infinity();
  auto bf = random_halves(15, 2);  // (3, 5)
  auto hf = random_halves(1, 3);   // (1,)
  std::vector<int32_t> i32 = {-7, 2147483647};
  std::vector<int64_t> i64 = {-(int64_t(1) << 40)};
  std::vector<float> none;
  std::vector<TensorToWrite> ts = {tw("a.weight", DType::f32, {17}, f32), tw("b", DType::bf16, {3, 5}, bf),
                                   tw("c", DType::f16, {1}, hf),          tw("ids", DType::i32, {2}, i32),
                                   tw("scalar", DType::i64, {}, i64),     tw("empty", DType::f32, {0, 4}, none)};
  safetensors_write_file(path, ts, {{"step", "12"}});
  REQUIRE(!fs::exists(path + ".tmp"));

  // Independent check of the layout: parse the bytes by hand.
  const std::string raw = read_bytes(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(raw[i]);
  CHECK(n % 8 == 0);  // data section 8-byte aligned
  json h = json::parse(raw.substr(8, n));
  const std::string hs = raw.substr(8, n);
  CHECK(hs.find_first_not_of(' ', hs.find_last_of('}') + 1) == std::string::npos);  // padded with spaces
  CHECK(h["__metadata__"] == json({{"format", "pt"}, {"step", "12"}}));
  uint64_t off = 0;  // tensors are contiguous in the given order
  for (const auto& t : ts) {
    const json& e = h[t.name];
    CHECK(e["dtype"] == dtype_safetensors_name(t.dtype));
    CHECK(e["shape"].get<std::vector<int64_t>>() == t.shape);
    uint64_t bytes = dtype_size(t.dtype);
    for (auto d : t.shape) bytes *= uint64_t(d);
    CHECK(e["data_offsets"] == json({off, off + bytes}));
    if (bytes > 0) CHECK(std::memcmp(raw.data() + 8 + n + off, t.data, bytes) == 0);
    off += bytes;
  }
  CHECK(8 + n + off == raw.size());

  // Read back through SafetensorsFile.
  SafetensorsFile f = SafetensorsFile::open(path);
  CHECK(f.entries().size() == ts.size());
  CHECK(f.metadata().at("format") == "pt");
  CHECK(f.metadata().at("step") == "12");
  CHECK(f.find("missing") == nullptr);
  for (const auto& t : ts) {
    const SafetensorsEntry* e = f.find(t.name);
    REQUIRE(e);
    CHECK(e->dtype == t.dtype);
    CHECK(e->shape == t.shape);
    if (e->bytes() > 0) CHECK(std::memcmp(f.data(*e), t.data, e->bytes()) == 0);
  }
  CHECK(f.find("empty")->bytes() == 0);
  CHECK(f.find("scalar")->numel() == 1);

  // Moving keeps the mapping valid; the moved-from object owns nothing.
  SafetensorsFile g = std::move(f);
  CHECK(std::memcmp(g.data(*g.find("b")), bf.data(), bf.size() * 2) == 0);

  // Converting reads through SafetensorsDir against dtype.h's scalar conversions.
  SafetensorsDir d = SafetensorsDir::open(tmp.path.string());
  CHECK(!d.sharded());
  CHECK(d.names() == std::vector<std::string>{"a.weight", "b", "c", "empty", "ids", "scalar"});
  CHECK(d.file_of("b") == path);
  std::vector<float> bf_as_f32(15), hf_as_f32(1), f32_same(17);
  std::vector<bf16> f32_as_bf(17);
  d.read("b", DType::f32, bf_as_f32.data());
  d.read("c", DType::f32, hf_as_f32.data());
  d.read("a.weight", DType::bf16, f32_as_bf.data());
  d.read("a.weight", DType::f32, f32_same.data());
  for (size_t i = 0; i < 15; ++i) {
    float want = bf16_to_f32(bf16{bf[i]});
    CHECK(std::memcmp(&bf_as_f32[i], &want, 4) == 0);
  }
  float want_h = f16_to_f32(hf[0]);
  CHECK(std::memcmp(&hf_as_f32[0], &want_h, 4) == 0);
  for (size_t i = 0; i < 17; ++i) CHECK(f32_as_bf[i].bits == f32_to_bf16(f32[i]).bits);
  CHECK(std::memcmp(f32_same.data(), f32.data(), 17 * 4) == 0);
  std::vector<int32_t> ids(2);
  d.read("ids", DType::i32, ids.data());
  CHECK(ids == i32);
  d.read("empty", DType::bf16, nullptr);  // zero elements: nothing touched
  CHECK_THROWS_AS(d.read("ids", DType::f32, ids.data()), Error);
  CHECK_THROWS_WITH(d.read("nope", DType::f32, ids.data()), Catch::Contains("'nope'"));
}

TEST_CASE("safetensors: unaligned tensor data converts correctly", "[io]") {
  // A 1-element bf16 tensor first puts the next f32 tensor at data offset 2 (not 4-aligned).
  TempDir tmp;
  std::vector<uint16_t> one = {0x3f80};
  auto v = testing::random_floats(70001, 7);  // more than one bounce buffer (16384 f32)
  safetensors_write_file(tmp / "model.safetensors", {tw("x", DType::bf16, {1}, one), tw("y", DType::f32, {70001}, v)});
  SafetensorsDir d = SafetensorsDir::open(tmp.path.string());
  CHECK(d.find("y")->begin == 2);
  std::vector<bf16> out(70001);
  d.read("y", DType::bf16, out.data());
  size_t bad = 0;
  for (size_t i = 0; i < v.size(); ++i) bad += out[i].bits != f32_to_bf16(v[i]).bits;
  CHECK(bad == 0);
  std::vector<float> same(70001);
  d.read("y", DType::f32, same.data());
  CHECK(std::memcmp(same.data(), v.data(), v.size() * 4) == 0);
}

TEST_CASE("safetensors: a streamed tensor writes the same bytes as a pointer, released pages read back the same", "[io]") {
  TempDir tmp;
  // awkward sizes: pieces of 7 floats over 4097 elements (a tail of 2), one empty tensor
  const std::vector<float> a = testing::random_floats(4097, 7), b = testing::random_floats(15, 8);
  std::vector<TensorToWrite> plain = {tw("a", DType::f32, {4097}, a), tw("b", DType::f32, {3, 5}, b),
                                      TensorToWrite{"e", DType::f32, {0}, nullptr}};
  std::vector<TensorToWrite> streamed = plain;
  streamed[0].data = nullptr;
  streamed[0].stream = [&](const TensorSink& write) {
    for (size_t i = 0; i < a.size(); i += 7) write(a.data() + i, std::min<size_t>(7, a.size() - i) * 4);
  };
  safetensors_write_file(tmp / "plain.safetensors", plain);
  safetensors_write_file(tmp / "streamed.safetensors", streamed);
  CHECK(read_bytes(tmp / "plain.safetensors") == read_bytes(tmp / "streamed.safetensors"));

  const SafetensorsFile f = SafetensorsFile::open(tmp / "streamed.safetensors");
  const SafetensorsEntry* e = f.find("a");
  REQUIRE(e);
  std::vector<float> first(4097), again(4097);
  std::memcpy(first.data(), f.data(*e), e->bytes());
  f.release(*e);  // the pages go; reading maps them back from the file
  std::memcpy(again.data(), f.data(*e), e->bytes());
  CHECK(std::memcmp(first.data(), a.data(), e->bytes()) == 0);
  CHECK(std::memcmp(again.data(), a.data(), e->bytes()) == 0);
  f.release(*f.find("e"));  // empty: nothing to do
}

TEST_CASE("safetensors: sharded write splits greedily, writes the HF index, reads back", "[io]") {
  TempDir tmp;
  const std::string dir = tmp / "out";
  // Byte sizes: 40, 24, 60, 200 (over the limit), 8, 0, 36 with max_shard_bytes = 64:
  // greedy -> [a, b] (64), [c] (60), [big] (200), [d, e, f] (8 + 0 + 36 = 44).
  std::vector<std::vector<float>> vals;
  std::vector<int64_t> numels = {10, 6, 15, 50, 2, 0, 9};
  std::vector<std::string> names = {"a", "b", "c", "big", "d", "e", "f"};
  for (size_t i = 0; i < numels.size(); ++i) vals.push_back(testing::random_floats(size_t(numels[i]), 100 + i));
  std::vector<TensorToWrite> ts;
  for (size_t i = 0; i < names.size(); ++i) ts.push_back(tw(names[i], DType::f32, {numels[i]}, vals[i]));

  // A stale single file from an earlier run must not survive (transformers would prefer it).
  fs::create_directories(dir);
  write_bytes(dir + "/model.safetensors", "stale");
  write_bytes(dir + "/model-00009-of-00009.safetensors", "stale");
  safetensors_write_dir(dir, ts, 64);
  CHECK(!fs::exists(dir + "/model.safetensors"));
  CHECK(!fs::exists(dir + "/model-00009-of-00009.safetensors"));

  const std::vector<std::vector<std::string>> want_shards = {{"a", "b"}, {"c"}, {"big"}, {"d", "e", "f"}};
  json index = json::parse(read_bytes(dir + "/model.safetensors.index.json"));
  CHECK(index["metadata"]["total_size"] == 40 + 24 + 60 + 200 + 8 + 0 + 36);
  CHECK(index["weight_map"].size() == names.size());
  for (size_t s = 0; s < want_shards.size(); ++s) {
    char fn[64];
    std::snprintf(fn, sizeof fn, "model-%05zu-of-00004.safetensors", s + 1);
    REQUIRE(fs::exists(dir + "/" + fn));
    SafetensorsFile f = SafetensorsFile::open(dir + "/" + fn);
    std::vector<std::string> got;
    for (const auto& e : f.entries()) got.push_back(e.name);
    CHECK(got == want_shards[s]);  // entries are sorted by offset = given order
    for (const auto& name : want_shards[s]) CHECK(index["weight_map"][name] == fn);
  }
  SafetensorsDir d = SafetensorsDir::open(dir);
  CHECK(d.sharded());
  CHECK(d.files().size() == 4);
  CHECK(d.names() == std::vector<std::string>{"a", "b", "big", "c", "d", "e", "f"});
  CHECK(d.file_of("big") == dir + "/model-00003-of-00004.safetensors");
  for (size_t i = 0; i < names.size(); ++i) {
    std::vector<float> out(vals[i].size());
    d.read(names[i], DType::f32, out.data());
    CHECK(out == vals[i]);  // bitwise for these finite values
  }

  // Rewriting with a large limit gives one model.safetensors and removes the shards and index.
  safetensors_write_dir(dir, ts, 1 << 20);
  CHECK(fs::exists(dir + "/model.safetensors"));
  CHECK(!fs::exists(dir + "/model.safetensors.index.json"));
  CHECK(!fs::exists(dir + "/model-00001-of-00004.safetensors"));
  CHECK(SafetensorsDir::open(dir).names().size() == names.size());

  // A single tensor over the limit is one shard, which HF writes as model.safetensors.
  const std::string dir1 = tmp / "one";
  safetensors_write_dir(dir1, {ts[3]}, 16);
  CHECK(fs::exists(dir1 + "/model.safetensors"));
  CHECK(!fs::exists(dir1 + "/model.safetensors.index.json"));
}

TEST_CASE("safetensors: corpus of bad files, each error names the file and the problem", "[io]") {
  TempDir tmp;
  int k = 0;
  auto bad = [&](const std::string& bytes, const std::string& phrase) {
    std::string p = tmp / ("bad" + std::to_string(k++) + ".safetensors");
    write_bytes(p, bytes);
    INFO("case " << p << " expecting '" << phrase << "'");
    require_open_error(p, phrase);
  };
  const std::string f8 = std::string(8, '\0');  // data for one F32 [2]
  auto hdr = [](const std::string& entries) { return "{" + entries + "}"; };
  const std::string ok_entry = R"("t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";

  bad("", "truncated");
  bad("\x10\0\0\0\0", "truncated");
  bad(make_file(hdr(ok_entry), f8, 4096), "runs beyond the end of the file");
  bad(make_file(hdr(ok_entry), f8, int64_t(1) << 62), "absurd");
  bad(make_file(hdr(ok_entry).substr(0, 20), f8), "not valid JSON");
  bad(make_file("{\"t\":{\"dtype\":\"F32\",,}}", ""), "line 1, column");
  bad(make_file("[1,2]", ""), "header must be a JSON object");
  bad(make_file(R"({"t":[1]})", ""), "header entry 't' must be an object");
  bad(make_file(R"({"t":{"shape":[2],"data_offsets":[0,8]}})", f8), "tensor 't' has no \"dtype\"");
  bad(make_file(R"({"t":{"dtype":"F32","data_offsets":[0,8]}})", f8), "tensor 't' has no \"shape\"");
  bad(make_file(R"({"t":{"dtype":"F32","shape":[2]}})", f8), "tensor 't' has no \"data_offsets\"");
  bad(make_file(R"({"t":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", f8), "unsupported dtype 'F64'");
  bad(make_file(R"({"t":{"dtype":7,"shape":[1],"data_offsets":[0,8]}})", f8), "dtype must be a string");
  bad(make_file(R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", f8), "non-negative integers");
  bad(make_file(R"({"t":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", f8), "non-negative integers");
  bad(make_file(R"({"t":{"dtype":"F32","shape":"2","data_offsets":[0,8]}})", f8), "shape must be an array");
  bad(make_file(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", f8), "data_offsets must be an array");
  bad(make_file(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,-8]}})", f8), "must be non-negative integers");
  bad(make_file(R"({"t":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", f8), "begin > end");
  bad(make_file(R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", f8), "out of range");
  bad(make_file(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", f8), "out of range");
  bad(make_file(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", f8), "size mismatch");
  bad(make_file(R"({"t":{"dtype":"BF16","shape":[2],"data_offsets":[0,8]}})", f8), "size mismatch");
  bad(make_file(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", f8), "too large");
  bad(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", f8),
      "overlap");
  bad(make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", f8),
      "duplicate tensor name 'a'");
  bad(make_file(R"({"__metadata__":{"format":"pt","step":3}})", ""), "value of 'step' must be a string");
  bad(make_file(R"({"__metadata__":[1]})", ""), "__metadata__ must be an object");
  bad(make_file(R"({"t":{"dtype":"F32","shape":[[2]],"data_offsets":[0,8]}})", f8), "nests");
  bad(make_file(std::string(100000, '[') , ""), "nests");  // no deep recursion

  // Not a file, and no file: kind io for the missing one.
  require_open_error(tmp.path.string(), "not a regular file");
  require_open_error(tmp / "absent.safetensors", "No such file", ErrorKind::io);

  // Valid edge cases: no tensors, padding spaces, an empty tensor inside another's span, gaps.
  auto good = [&](const std::string& bytes) {
    std::string p = tmp / ("good" + std::to_string(k++) + ".safetensors");
    write_bytes(p, bytes);
    INFO(p);
    CHECK_NOTHROW(SafetensorsFile::open(p));
  };
  good(make_file("{}", ""));
  good(make_file("{}      ", ""));
  good(make_file(R"({"__metadata__":null})", ""));
  good(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                 R"("e":{"dtype":"F32","shape":[0,3],"data_offsets":[4,4]}})", f8));
  good(make_file(R"({"a":{"dtype":"I64","shape":[],"data_offsets":[8,16]}})", std::string(20, 'x')));
}

TEST_CASE("safetensors: bad model directories (missing shard, index/shard disagreement)", "[io]") {
  TempDir tmp;
  std::vector<float> v = testing::random_floats(6, 9);
  auto mk = [&](const std::string& name) {  // shard 1: x, y; shard 2: z
    std::string d = tmp / name;
    safetensors_write_dir(d, {tw("x", DType::f32, {3}, v), tw("y", DType::f32, {3}, v), tw("z", DType::f32, {3}, v)},
                          24);
    return d;
  };
  const std::string shard1 = "model-00001-of-00002.safetensors", shard2 = "model-00002-of-00002.safetensors";

  std::string d = mk("missing_shard");
  fs::remove(d + "/" + shard2);
  require_dir_error(d, {d + "/" + shard2, "is missing", "model.safetensors.index.json"}, ErrorKind::io);

  d = mk("index_names_absent_tensor");
  json idx = json::parse(read_bytes(d + "/model.safetensors.index.json"));
  idx["weight_map"]["w"] = shard1;
  write_bytes(d + "/model.safetensors.index.json", idx.dump());
  require_dir_error(d, {"'w'", shard1, "lacks it", d});

  d = mk("shard_has_unindexed_tensor");
  idx = json::parse(read_bytes(d + "/model.safetensors.index.json"));
  idx["weight_map"].erase("y");
  write_bytes(d + "/model.safetensors.index.json", idx.dump());
  require_dir_error(d, {"'y'", "not in the index", d});

  d = mk("index_wrong_shard");
  idx = json::parse(read_bytes(d + "/model.safetensors.index.json"));
  idx["weight_map"]["y"] = shard2;
  write_bytes(d + "/model.safetensors.index.json", idx.dump());
  require_dir_error(d, {"'y'", "index puts it in " + shard2, "lacks it"});

  d = mk("index_bad_json");
  write_bytes(d + "/model.safetensors.index.json", "{\"weight_map\": {");
  require_dir_error(d, {d + "/model.safetensors.index.json", "not valid JSON"});

  d = mk("index_escapes_dir");
  write_bytes(d + "/model.safetensors.index.json", R"({"weight_map": {"x": "../x.safetensors"}})");
  require_dir_error(d, {"not a plain file name"});

  d = mk("bad_shard");
  write_bytes(d + "/" + shard1, "abc");
  require_dir_error(d, {d + "/" + shard1, "truncated"});

  d = tmp / "empty_dir";
  fs::create_directories(d);
  require_dir_error(d, {d, "neither model.safetensors nor"}, ErrorKind::io);
  require_dir_error(tmp / "no_such_dir", {"does not exist"}, ErrorKind::io);
}

TEST_CASE("safetensors: check_tensors lists every missing, unexpected and mis-shaped tensor at once", "[io]") {
  TempDir tmp;
  std::vector<float> v = testing::random_floats(6, 11);
  safetensors_write_file(tmp / "model.safetensors", {tw("model.embed_tokens.weight", DType::f32, {2, 3}, v),
                                                     tw("model.norm.weight", DType::f32, {6}, v),
                                                     tw("extra.bias", DType::f32, {1}, v),
                                                     tw("lm_head.weight", DType::f32, {3, 2}, v)});
  SafetensorsDir d = SafetensorsDir::open(tmp.path.string());
  std::vector<ExpectedTensor> exact = {{"model.embed_tokens.weight", {2, 3}}, {"model.norm.weight", {6}},
                                       {"extra.bias", {1}}, {"lm_head.weight", {3, 2}}};
  CHECK_NOTHROW(safetensors_check_tensors(d, exact, "test"));

  std::vector<ExpectedTensor> expected = {{"model.embed_tokens.weight", {2, 3}},
                                          {"model.norm.weight", {7}},
                                          {"lm_head.weight", {2, 3}},
                                          {"model.layers.0.mlp.up_proj.weight", {4, 2}},
                                          {"model.layers.1.mlp.up_proj.weight", {4, 2}}};
  try {
    safetensors_check_tensors(d, expected, "config.json says qwen3 with 2 layers");
    FAIL("mismatch not reported");
  } catch (const Error& e) {
    std::string m = e.what();
    INFO(m);
    CHECK(e.kind() == ErrorKind::input);
    CHECK(m.find("config.json says qwen3 with 2 layers") != std::string::npos);
    CHECK(m.find("2 missing, 1 unexpected, 2 with the wrong shape") != std::string::npos);
    CHECK(m.find("model.layers.0.mlp.up_proj.weight (expected shape [4, 2])") != std::string::npos);
    CHECK(m.find("model.layers.1.mlp.up_proj.weight (expected shape [4, 2])") != std::string::npos);
    CHECK(m.find("extra.bias (in " + tmp / "model.safetensors" + ")") != std::string::npos);
    CHECK(m.find("model.norm.weight in " + tmp / "model.safetensors" + ": shape on disk [6], expected [7]") !=
          std::string::npos);
    CHECK(m.find("lm_head.weight in " + tmp / "model.safetensors" + ": shape on disk [3, 2], expected [2, 3]") !=
          std::string::npos);
    CHECK(m.find("embed_tokens") == std::string::npos);  // the matching tensor is not listed
  }
}

TEST_CASE("safetensors: write failures throw kind io naming the path and errno text", "[io]") {
  TempDir tmp;
  std::vector<float> v = testing::random_floats(64 * 1024, 5);  // 256 KiB
  const std::string nodir = tmp / "no/such/dir/model.safetensors";
  try {
    safetensors_write_file(nodir, {tw("x", DType::f32, {int64_t(v.size())}, v)});
    FAIL("wrote into a missing directory");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::io);
    CHECK_THAT(e.what(), Catch::Contains(nodir + ".tmp") && Catch::Contains("No such file"));
  }

  // A file-size limit makes write() fail with EFBIG part-way, as ENOSPC would; the previous file
  // must survive untouched and the temp file must be gone.
  const std::string path = tmp / "model.safetensors";
  std::vector<float> small = {1.f, 2.f};
  safetensors_write_file(path, {tw("x", DType::f32, {2}, small)});
  const std::string before = read_bytes(path);
  std::string msg;
  ErrorKind kind = ErrorKind::input;
  try {
    testing::FileSizeLimit limit(64 * 1024);
    safetensors_write_file(path, {tw("x", DType::f32, {int64_t(v.size())}, v)});
  } catch (const Error& e) {
    msg = e.what();
    kind = e.kind();
  }
  INFO(msg);
  CHECK(kind == ErrorKind::io);
  CHECK(msg.find(path + ".tmp") != std::string::npos);
  CHECK(msg.find("File too large") != std::string::npos);
  CHECK(read_bytes(path) == before);
  CHECK(!fs::exists(path + ".tmp"));

  // Bad arguments are input errors.
  CHECK_THROWS_WITH(safetensors_write_file(path, {tw("x", DType::f32, {2}, small), tw("x", DType::f32, {2}, small)}),
                    Catch::Contains("listed twice"));
  CHECK_THROWS_WITH(safetensors_write_file(path, {tw("x", DType::f32, {-2}, small)}), Catch::Contains("invalid shape"));
}

TEST_CASE("safetensors: 3000 seeded mutations of a valid file (the fuzzer's mutator) open or throw strata::Error", "[io]") {
  TempDir tmp;
  auto a = testing::random_floats(7, 1);
  auto b = random_halves(6, 2);
  std::vector<int64_t> c = {1, 2, 3};
  std::vector<float> none;
  safetensors_write_file(tmp / "base.safetensors",
                         {tw("model.a", DType::f32, {7}, a), tw("b", DType::bf16, {2, 3}, b), tw("e", DType::f32, {0}, none),
                          tw("c", DType::i64, {3}, c), tw("h", DType::f16, {1, 1, 3}, b)},
                         {{"note", "x"}});
  const std::string base = read_bytes(tmp / "base.safetensors");
  std::mt19937_64 rng(20240611);
  int opened = 0, rejected = 0;
  const std::string p = tmp / "m.safetensors";
  for (int it = 0; it < 3000; ++it) {
    fs::remove(p);  // a fresh file: ext4 flushes a truncated-and-rewritten file on close (slow)
    write_bytes(p, safetensors_mutator::mutate(base, rng));
    try {
      SafetensorsFile f = SafetensorsFile::open(p);
      uint64_t sum = 0;
      for (const auto& e : f.entries()) {
        const auto* q = static_cast<const unsigned char*>(f.data(e));
        for (uint64_t i = 0; i < e.bytes(); ++i) sum += q[i];
      }
      (void)sum;
      ++opened;
    } catch (const Error& e) {
      ++rejected;
      if (std::string(e.what()).find(p) == std::string::npos) FAIL("error without the path: " << e.what());
    }
  }
  INFO("opened " << opened << ", rejected " << rejected);
  CHECK(opened > 100);    // the mutator keeps some files valid (e.g. bit flips in data)
  CHECK(rejected > 1000); // and breaks most
}
