// Data faults seen from the command line (issue 43, "nothing lost"): each stops `strata` with exit
// 2 and a message that names the file and what to do, before a step is trained: a binary file
// given as text (with the byte tokenizer, which would take any byte), a file of only bad JSON
// lines under data.skip_bad_lines, and a prepared shard with one changed byte.
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>

#include "tests/testing.h"

namespace fs = std::filesystem;
using strata::testing::TempDir;

namespace {

const std::string kTinyModel = STRATA_SOURCE_DIR "/recipes/sft-tiny/models/tiny";

// r.toml in `dir`: the tiny model, the [data] keys given, one training step into dir/out.
std::string tiny_recipe(const TempDir& dir, const std::string& data_keys) {
  return dir.file("r.toml", "[model]\npath = \"" + kTinyModel + "\"\n[data]\n" + data_keys +
                                "[train]\nmax_steps = 1\n[checkpoint]\noutput_dir = \"" + (dir.path / "out").string() +
                                "\"\n");
}

}  // namespace

TEST_CASE("strata train refuses a binary data file, even with the byte tokenizer (exit 2)", "[data-faults]") {
  TempDir dir("data_faults_binary");
  // the strata executable itself, as a plain-text corpus
  const std::string binary = strata::testing::strata_binary();
  const std::string recipe =
      tiny_recipe(dir, "path = \"" + binary + "\"\nformat = \"text\"\ntokenizer = \"bytes\"\nsequence_len = 32\n");
  // its first NUL: offset 7 or 8, as the OS/ABI byte of its ELF header is 0 or not
  const size_t nul = strata::testing::read_file(binary).find('\0');
  strata::testing::check_run(strata::testing::run_strata("train " + recipe), 2,
                             {"dataset " + binary + " is not text", "ELF executable",
                              "offset " + std::to_string(nul) + " (line 1) is 0x00, a NUL byte",
                              "training data must be UTF-8 text"},
                             {"step 1"});
}

TEST_CASE("strata train: only bad JSON lines under skip_bad_lines gives their count (exit 2)", "[data-faults]") {
  TempDir dir("data_faults_bad_lines");
  dir.file("junk.jsonl", "not json\n{\"messages\": [\nnor this\n");
  const std::string recipe = tiny_recipe(dir, "path = \"" + (dir.path / "junk.jsonl").string() +
                                                  "\"\nskip_bad_lines = true\nsequence_len = 32\n");
  strata::testing::check_run(strata::testing::run_strata("train " + recipe), 2,
                             {"all 3 of its non-blank lines are bad JSON", "junk.jsonl:1: not valid JSON",
                              "data.skip_bad_lines = false"});
}

TEST_CASE("strata train: a prepared shard with one changed token id stops the run (exit 2)", "[data-faults]") {
  TempDir dir("data_faults_shard");
  dir.file("chat.jsonl",
           R"({"messages": [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4."}]})"
           "\n");
  const std::string recipe = tiny_recipe(dir, "path = \"" + (dir.path / "chat.jsonl").string() +
                                                  "\"\nsequence_len = 32\nprepared_dir = \"" +
                                                  (dir.path / "prep").string() + "\"\n");
  REQUIRE(strata::testing::run_strata("prepare " + recipe).code == 0);
  const std::string shard = (dir.path / "prep" / "train.bin").string();
  std::string bytes = strata::testing::read_file(shard);
  REQUIRE(bytes.size() > 130);
  bytes[128] = char(uint8_t(bytes[128]) ^ 1);  // the first uint16 id, still below the vocabulary (640)
  strata::testing::write_file(shard, bytes);
  strata::testing::check_run(strata::testing::run_strata("train " + recipe), 2,
                             {shard, "damaged", "CRC-32C", "rerun `strata prepare"}, {"step 1"});
}
