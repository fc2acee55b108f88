// Binary token shards and `strata prepare`: training from prepared shards gives exactly the rows
// of tokenizing on the fly; every kind of damage (truncation, a flipped magic, any changed byte,
// an id outside the vocabulary, a bad label, a stale fingerprint, a garbled manifest) and shards
// of an older format are clear input errors that name the file and say to rerun `strata prepare`.
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "io/checksum.h"
#include "io/datasets.h"
#include "src/train/training_data.h"
#include "io/token_shards.h"
#include "src/cli/commands.h"
#include "src/core/error.h"
#include "src/recipe/recipe.h"
#include "tests/testing.h"

using namespace strata;
namespace fs = std::filesystem;

namespace {

const std::string kTinyModel = STRATA_SOURCE_DIR "/recipes/sft-tiny/models/tiny";

using testing::contains;
using testing::error_of;
using testing::TempDir;

// r.toml in `dir`: the tiny model, the [data] keys given, one training step.
std::string tiny_recipe(const TempDir& dir, const std::string& data_keys) {
  return dir.file("r.toml", "[model]\npath = \"" + kTinyModel + "\"\n[data]\n" + data_keys + "[train]\nmax_steps = 1\n");
}

void check_same_rows(const TokenRows& a, const TokenRows& b) {
  CHECK(a.T == b.T);
  CHECK(a.rows() == b.rows());
  CHECK(a.ids == b.ids);
  CHECK(a.targets == b.targets);
  CHECK(a.pos == b.pos);
  CHECK(a.doc_start == b.doc_start);
}

// A shard's bytes with the CRC-32C trailer recomputed: damage the checksum would stop, carried
// past it to the checks behind it (which stay, for a writer's own bugs).
std::string resealed(std::string bytes) {
  const uint32_t crc = crc32c(bytes.data(), bytes.size() - 4);
  std::memcpy(bytes.data() + bytes.size() - 4, &crc, 4);
  return bytes;
}

int prepare(const std::string& recipe, const std::vector<std::string>& overrides = {}) {
  std::vector<std::string> args = {recipe};
  args.insert(args.end(), overrides.begin(), overrides.end());
  int rc = -1;
  testing::run_cli(cmd_prepare, args, "", &rc);
  return rc;
}

// Paths on the command line are relative to the current directory: the cases that pass them
// run from the recipe's folder, as a user would.
struct InDir {
  fs::path old = fs::current_path();
  explicit InDir(const fs::path& dir) { fs::current_path(dir); }
  ~InDir() { fs::current_path(old); }
};

}  // namespace

TEST_CASE("strata prepare, then training reads the shards: rows identical to tokenizing on the fly", "[shards]") {
  TempDir dir("shards_roundtrip");
  fs::copy_file(STRATA_SOURCE_DIR "/recipes/sft-tiny/data/chat.jsonl", dir.path / "chat.jsonl");
  const std::string recipe =
      tiny_recipe(dir, "path = \"chat.jsonl\"\nsequence_len = 96\neval_split = 0.1\nprepared_dir = \"prep\"\n");
  const Recipe rc = recipe_load(recipe, {});
  TrainingData fly = training_data_load(rc, 640);  // prepared_dir holds nothing yet
  CHECK(fly.eval.rows() > 0);
  REQUIRE(prepare(recipe) == 0);
  const fs::path prep = dir.path / "prep";
  CHECK(fs::exists(prep / "manifest.json"));
  CHECK(fs::exists(prep / "train.bin"));
  CHECK(fs::exists(prep / "eval.bin"));
  CHECK(!fs::exists(prep / "train.rejected.bin"));
  const std::string head = testing::read_file(prep / "train.bin").substr(0, 16);
  CHECK(head.substr(0, 8) == "STRATASH");
  uint32_t token_bytes = 0;
  std::memcpy(&token_bytes, head.data() + 12, 4);
  CHECK(token_bytes == 2);  // 595 ids fit uint16
  TrainingData shards = training_data_load(rc, 640);
  CHECK(contains(shards.report, "prepared shards"));
  check_same_rows(shards.train, fly.train);
  check_same_rows(shards.eval, fly.eval);

  // pretraining text with the byte tokenizer, packing off: the same again
  dir.file("corpus.txt", "first document\nwith two lines\n\nsecond one\n\n\nthird, a little longer than the rest\n");
  InDir cwd(dir.path);
  const std::vector<std::string> text = {"data.path=\"corpus.txt\"", "data.tokenizer=\"bytes\"", "data.packing=false",
                                         "data.sequence_len=16", "data.eval_split=0.0", "data.prepared_dir=\"prep_text\""};
  const Recipe rt = recipe_load(recipe, text);
  TrainingData fly_text = training_data_load(rt, 640);
  REQUIRE(prepare(recipe, text) == 0);
  TrainingData shard_text = training_data_load(rt, 640);
  CHECK(contains(shard_text.report, "prepared shards"));
  check_same_rows(shard_text.train, fly_text.train);
  CHECK(fly_text.train.rows() == 3);
}

TEST_CASE("shards: preference pairs keep their rejected side", "[shards]") {
  TempDir dir("shards_pref");
  fs::copy_file(STRATA_SOURCE_DIR "/tests/fixtures/datasets/formats/preference.jsonl", dir.path / "pref.jsonl");
  const std::string recipe = tiny_recipe(dir, "path = \"pref.jsonl\"\nprepared_dir = \"prep\"\n");
  REQUIRE(prepare(recipe) == 0);
  const Recipe rc = recipe_load(recipe, {});
  TextEncoder enc = training_encoder(rc, 640);
  TrainingSamples fly = training_samples_read(rc, enc);
  TrainingSamples got = prepared_read(rc.prepared_dir, samples_options(rc), enc, 640);
  REQUIRE(got.train.samples.size() == 2);
  REQUIRE(got.train.rejected.size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    CHECK(got.train.samples[i].ids == fly.train.samples[i].ids);
    CHECK(got.train.samples[i].labels == fly.train.samples[i].labels);
    CHECK(got.train.rejected[i].ids == fly.train.rejected[i].ids);
    CHECK(got.train.rejected[i].labels == fly.train.rejected[i].labels);
  }
  CHECK(got.train.stats.samples == 2);
  CHECK(got.train.format == "preference");
}

TEST_CASE("shards: uint32 ids above 65535 round-trip, a model too small for them is an error", "[shards]") {
  TempDir dir("shards_u32");
  std::vector<Sample> samples(2);
  samples[0].ids = {70000, 1, 65536};
  samples[0].labels = {0, 1, 1};
  samples[1].ids = {5, 69999};
  samples[1].labels = {0, 0};
  const std::string path = (dir.path / "s.bin").string();
  shard_write(path, samples, 70001, 42);
  CHECK(fs::file_size(path) == 128 + 5 * 4 + 5 + 7 /* labels end at 153: pad to 160 */ + 3 * 8 + 4 /* CRC */);
  std::vector<Sample> back = shard_read(path, 70001, 42);
  REQUIRE(back.size() == 2);
  CHECK(back[0].ids == samples[0].ids);
  CHECK(back[0].labels == samples[0].labels);
  CHECK(back[1].ids == samples[1].ids);
  CHECK(!back[1].may_split);
  CHECK(contains(error_of([&] { shard_read(path, 70000, 42); }), "model's vocab_size is 70000"));
  CHECK(contains(error_of([&] { shard_read(path, 70001, 43); }), "another preparation"));
}

TEST_CASE("shards: corruption and staleness are clear errors that say to rerun strata prepare", "[shards]") {
  TempDir dir("shards_corrupt");
  dir.file("chat.jsonl",
           R"({"messages": [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "2 + 2 = 4."}]})"
           "\n"
           R"({"messages": [{"role": "user", "content": "Repeat: cat dog"}, {"role": "assistant", "content": "cat dog"}]})"
           "\n");
  const std::string recipe = tiny_recipe(dir, "path = \"chat.jsonl\"\nsequence_len = 64\nprepared_dir = \"prep\"\n");
  REQUIRE(prepare(recipe) == 0);
  const Recipe rc = recipe_load(recipe, {});
  const fs::path shard = dir.path / "prep" / "train.bin", manifest = dir.path / "prep" / "manifest.json";
  const std::string good = testing::read_file(shard), good_manifest = testing::read_file(manifest);
  REQUIRE(good.size() > 200);
  auto load_error = [&] { return error_of([&] { training_data_load(rc, 640); }); };
  auto check_says_rerun = [&](const std::string& e) { CHECK(contains(e, "rerun `strata prepare")); };

  SECTION("truncated file") {
    testing::write_file(shard, good.substr(0, good.size() - 3));
    std::string e = load_error();
    CHECK(contains(e, "truncated"));
    check_says_rerun(e);
    testing::write_file(shard, good.substr(0, 50));
    CHECK(contains(load_error(), "shorter than its header"));
  }
  SECTION("flipped magic") {
    std::string bad = good;
    bad[0] ^= 0x20;
    testing::write_file(shard, bad);
    std::string e = load_error();
    CHECK(contains(e, "bad magic"));
    check_says_rerun(e);
  }
  SECTION("token id >= vocab size") {
    std::string bad = good;
    bad[128] = char(0xff);  // the first token, uint16: 0x..ff
    bad[129] = char(0xff);
    testing::write_file(shard, resealed(bad));
    std::string e = load_error();
    CHECK(contains(e, "token id 65535"));
    check_says_rerun(e);
  }
  SECTION("label flag other than 0 or 1") {
    uint64_t labels_offset = 0;
    std::memcpy(&labels_offset, good.data() + 48, 8);
    std::string bad = good;
    bad[labels_offset + 1] = 7;
    testing::write_file(shard, resealed(bad));
    CHECK(contains(load_error(), "label flag of 7"));
  }
  SECTION("offsets out of order") {
    uint64_t offsets_offset = 0, two = 2;
    std::memcpy(&offsets_offset, good.data() + 56, 8);
    std::string bad = good;
    std::memcpy(bad.data() + offsets_offset + 8, &two, 8);  // sample 0 ends at token 2 ...
    std::memcpy(bad.data() + offsets_offset, &two, 8);      // ... and starts there too
    testing::write_file(shard, resealed(bad));
    std::string e = load_error();
    CHECK(contains(e, "sample offsets do not span"));
    check_says_rerun(e);
  }
  SECTION("stale: a recipe setting changed") {
    const Recipe longer = recipe_load(recipe, {"data.sequence_len=128"});
    std::string e = error_of([&] { training_data_load(longer, 640); });
    CHECK(contains(e, "stale"));
    CHECK(contains(e, "data.sequence_len was 64"));
    CHECK(contains(e, "rerun `strata prepare"));
    const Recipe bytes = recipe_load(recipe, {"data.tokenizer=\"bytes\""});
    CHECK(contains(error_of([&] { training_data_load(bytes, 640); }), "tokenizer was"));
  }
  SECTION("stale: the data file changed") {
    std::ofstream(dir.path / "chat.jsonl", std::ios::app)
        << R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]})" << "\n";
    std::string e = load_error();
    CHECK(contains(e, "stale"));
    CHECK(contains(e, "data.path"));
  }
  SECTION("garbled manifest") {
    testing::write_file(manifest, good_manifest.substr(0, good_manifest.size() / 2));
    check_says_rerun(load_error());
  }
  SECTION("the raw data is gone: the shards are enough") {
    fs::rename(dir.path / "chat.jsonl", dir.path / "elsewhere.jsonl");
    TrainingData td = training_data_load(rc, 640);
    CHECK(td.train.rows() == 1);
  }
  SECTION("the intact shards still load") {
    TrainingData td = training_data_load(rc, 640);
    CHECK(td.train.rows() == 1);
  }
}

TEST_CASE("shards: a changed byte that still reads as valid data fails the checksum, older formats say rerun",
          "[shards][data-faults]") {
  TempDir dir("shards_checksum");
  dir.file("chat.jsonl",
           R"({"messages": [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "2 + 2 = 4."}]})"
           "\n");
  const std::string recipe = tiny_recipe(dir, "path = \"chat.jsonl\"\nsequence_len = 64\nprepared_dir = \"prep\"\n");
  REQUIRE(prepare(recipe) == 0);
  const Recipe rc = recipe_load(recipe, {});
  const fs::path shard = dir.path / "prep" / "train.bin", manifest = dir.path / "prep" / "manifest.json";
  const std::string good = testing::read_file(shard.string());
  uint64_t labels_offset = 0;
  std::memcpy(&labels_offset, good.data() + 48, 8);
  REQUIRE(labels_offset > 130);
  auto load_error = [&] { return error_of([&] { training_data_load(rc, 640); }); };
  auto check_damaged = [&](const std::string& e) {
    CHECK(contains(e, "damaged"));
    CHECK(contains(e, "CRC-32C"));
    CHECK(contains(e, shard.string()));
    CHECK(contains(e, "rerun `strata prepare"));
  };

  SECTION("one token id changed to another valid id") {
    std::string bad = good;
    bad[128] = char(uint8_t(bad[128]) ^ 1);  // the first uint16 id; the vocabulary (640) is even, so it stays below
    testing::write_file(shard.string(), bad);
    check_damaged(load_error());
  }
  SECTION("a label flipped between 0 and 1") {
    std::string bad = good;
    bad[labels_offset + 1] = char(uint8_t(bad[labels_offset + 1]) ^ 1);
    testing::write_file(shard.string(), bad);
    check_damaged(load_error());
  }
  SECTION("the stored checksum itself changed") {
    std::string bad = good;
    bad.back() = char(uint8_t(bad.back()) ^ 0x10);
    testing::write_file(shard.string(), bad);
    check_damaged(load_error());
  }
  SECTION("a version 1 shard, from before checksums") {
    std::string old = good.substr(0, good.size() - 4);  // version 1 had no trailer
    const uint32_t one = 1;
    std::memcpy(old.data() + 8, &one, 4);
    testing::write_file(shard.string(), old);
    const std::string e = load_error();
    CHECK(contains(e, "shard format version 1 was written by an older strata"));
    CHECK(contains(e, shard.string()));
    CHECK(contains(e, "rerun `strata prepare"));
  }
  SECTION("a shard of a newer format") {
    std::string newer = good;
    const uint32_t nine = 9;
    std::memcpy(newer.data() + 8, &nine, 4);
    testing::write_file(shard.string(), newer);
    CHECK(contains(load_error(), "newer strata"));
  }
  SECTION("a manifest of prepared-data format 1") {
    nlohmann::json m = nlohmann::json::parse(testing::read_file(manifest.string()));
    REQUIRE(m["strata_prepared"] == 2);
    m["strata_prepared"] = 1;
    testing::write_file(manifest.string(), m.dump(2));
    const std::string e = load_error();
    CHECK(contains(e, "prepared data format version 1 was written by an older strata"));
    CHECK(contains(e, manifest.string()));
    CHECK(contains(e, "rerun `strata prepare"));
  }
  SECTION("intact, the shards load") {
    CHECK(training_data_load(rc, 640).train.rows() == 1);
  }
}

TEST_CASE("strata prepare: bad usage and bad data are errors naming what to fix", "[shards]") {
  TempDir dir("shards_cli");
  dir.file("chat.jsonl", R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})"
                         "\n");
  const std::string recipe = tiny_recipe(dir, "path = \"chat.jsonl\"\n");
  InDir cwd(dir.path);
  CHECK(contains(error_of([&] { prepare(recipe); }), "data.prepared_dir is not set"));
  CHECK(contains(error_of([&] { prepare(recipe, {"data.prepared_dir=\"p\"", "data.path=\"missing.jsonl\""}); }),
                 "missing.jsonl"));
  dir.file("bad.jsonl", "{\"messages\": [}\n");
  CHECK(contains(error_of([&] { prepare(recipe, {"data.prepared_dir=\"p\"", "data.path=\"bad.jsonl\""}); }),
                 "bad.jsonl:1:"));
  // pre-tokenized ids beyond the model's vocabulary
  dir.file("ids.json", "{\"input_ids\": [[1, 2, 3], [4, 5000]]}");
  CHECK(contains(error_of([&] { prepare(recipe, {"data.prepared_dir=\"p\"", "data.path=\"ids.json\""}); }),
                 "token id 5000"));
  CHECK(!fs::exists(dir.path / "p" / "manifest.json"));
  CHECK(prepare(recipe, {"data.prepared_dir=\"p\""}) == 0);
  CHECK(fs::exists(dir.path / "p" / "manifest.json"));
  int rc = -1;
  testing::run_cli(cmd_prepare, {"--help"}, "", &rc);
  CHECK(rc == 0);
}
