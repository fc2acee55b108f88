// Checkpoints refuse damage (issue 10, item 3): every file carries a CRC-32C in manifest.json,
// written before COMPLETE; resume verifies every file and the data position before step 1, and
// a damaged checkpoint is exit 2 naming the file and the older checkpoints to resume from.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <cstring>

#include "io/checksum.h"
#include "src/core/error.h"
#include "src/recipe/recipe.h"
#include "src/train/checkpoint.h"
#include "src/train/trainer.h"
#include "tests/testing.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> overrides_for(const std::string& out) {
  return {"data.sequence_len=64",  "train.micro_batch_size=2", "train.log_steps=100",
          "checkpoint.output_dir=" + out, "device.cpu_threads=2", "train.max_steps=6",
          "checkpoint.save_steps=3"};
}

Recipe recipe_for(const std::string& out) {
  return recipe_load(testing::source_path("recipes/quickstart.toml"), overrides_for(out));
}

// A finished 6-step run with checkpoint-3 and checkpoint-6, shared by the cases below (copied
// per case so each damages its own). Names carry the pid: ctest runs cases in parallel processes.
std::string pid_name(const std::string& name) { return name + "_" + std::to_string(::getpid()); }

const std::string& saved_run() {
  static testing::TempDir dir(pid_name("ckpt_damage_src"));  // removed at exit
  static const std::string out = [] {
    const std::string d = (dir.path / "run").string();
    train_run(recipe_for(d));
    return d;
  }();
  return out;
}

// A copy of the saved run in a temp dir removed when the case ends.
struct RunCopy {
  testing::TempDir dir;
  std::string out;
  explicit RunCopy(const std::string& name) : dir(pid_name("ckpt_damage_" + name)), out((dir.path / "run").string()) {
    fs::copy(saved_run(), out, fs::copy_options::recursive);
  }
};

void flip_bit(const std::string& path, size_t from_end) {
  std::string b = testing::read_file(path);
  REQUIRE(b.size() > from_end);
  b[b.size() - 1 - from_end] ^= 0x04;
  testing::write_file(path, b);
}

// Rewrites a file's entry in manifest.json as if the file had been saved like this: a
// checkpoint that is consistent with itself but wrong inside (the index checks must catch it).
void reseal(const std::string& ckpt, const std::string& rel) {
  nlohmann::json m = nlohmann::json::parse(testing::read_file(ckpt + "/manifest.json"));
  uint64_t bytes = 0;
  const uint32_t crc = crc32c_file(ckpt + "/" + rel, &bytes);
  for (auto& f : m["files"])
    if (f["path"] == rel) f["bytes"] = bytes, f["crc32c"] = crc32c_hex(crc);
  testing::write_file(ckpt + "/manifest.json", m.dump(1));
}

// Resuming `out` must fail with exit 2 before step 1, naming `file`; returns the message.
std::string refused(const std::string& out, const std::string& file) {
  TrainOptions resume;
  resume.resume_latest = true;
  Recipe rc = recipe_for(out);
  rc.max_steps = 9;
  try {
    train_run(rc, resume);
  } catch (const Error& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK(e.exit_code() == 2);
    CHECK(msg.find(file) != std::string::npos);
    return msg;
  }
  FAIL("a damaged checkpoint was accepted");
  return "";
}

}  // namespace

TEST_CASE("a checkpoint's manifest lists every file with its size and CRC-32C", "[checkpoint][damage]") {
  const std::string ckpt = saved_run() + "/checkpoint-6";
  nlohmann::json m = nlohmann::json::parse(testing::read_file(ckpt + "/manifest.json"));
  CHECK(m["checksum"] == "crc32c");
  std::vector<std::string> listed, on_disk;
  for (auto& f : m["files"]) {
    const std::string rel = f["path"];
    listed.push_back(rel);
    uint64_t bytes = 0;
    CHECK(crc32c_hex(crc32c_file(ckpt + "/" + rel, &bytes)) == f["crc32c"]);
    CHECK(bytes == f["bytes"].get<uint64_t>());
  }
  for (auto& e : fs::recursive_directory_iterator(ckpt))
    if (e.is_regular_file()) on_disk.push_back(fs::relative(e.path(), ckpt).generic_string());
  std::sort(listed.begin(), listed.end());
  std::sort(on_disk.begin(), on_disk.end());
  std::vector<std::string> expected = listed;
  expected.push_back("COMPLETE");
  expected.push_back("manifest.json");
  std::sort(expected.begin(), expected.end());
  CHECK(on_disk == expected);
  for (const char* f : {"optimizer_state.safetensors", "trainer_state.json", "data_order.bin", "recipe.toml",
                        "hf/config.json", "hf/model.safetensors"})
    CHECK(std::find(listed.begin(), listed.end(), f) != listed.end());
}

TEST_CASE("one flipped bit in any checkpoint file is refused before step 1, naming the file", "[checkpoint][damage]") {
  for (const char* file : {"optimizer_state.safetensors", "data_order.bin", "trainer_state.json",
                           "hf/model.safetensors", "recipe.toml"}) {
    DYNAMIC_SECTION(file) {
      RunCopy copy("bit");
      const std::string& out = copy.out;
      flip_bit(out + "/checkpoint-6/" + file, 3);
      const std::string msg = refused(out, std::string("checkpoint-6/") + file);
      CHECK(msg.find("--resume") != std::string::npos);
      CHECK(msg.find("checkpoint-3") != std::string::npos);  // the older one to use instead
      CHECK(!fs::exists(out + "/checkpoint-7"));
    }
  }
}

TEST_CASE("a missing or truncated checkpoint file, or a missing manifest, is refused", "[checkpoint][damage]") {
  SECTION("truncated") {
    RunCopy copy("trunc");
    const std::string& out = copy.out;
    const std::string f = out + "/checkpoint-6/optimizer_state.safetensors";
    testing::write_file(f, testing::read_file(f).substr(0, 1000));
    refused(out, "optimizer_state.safetensors");
  }
  SECTION("missing") {
    RunCopy copy("missing");
    const std::string& out = copy.out;
    fs::remove(out + "/checkpoint-6/data_order.bin");
    refused(out, "data_order.bin");
  }
  SECTION("no manifest") {
    RunCopy copy("nomanifest");
    const std::string& out = copy.out;
    fs::remove(out + "/checkpoint-6/manifest.json");
    refused(out, "manifest.json");
  }
}

TEST_CASE("row ids outside the data, repeated rows and a cursor past the order are refused, never run",
          "[checkpoint][damage]") {
  auto order_with = [](const std::string& out, int64_t at, int64_t value) {
    const std::string f = out + "/checkpoint-6/data_order.bin";
    std::string b = testing::read_file(f);
    std::memcpy(b.data() + size_t(at) * 8, &value, 8);
    testing::write_file(f, b);
    reseal(out + "/checkpoint-6", "data_order.bin");
  };
  SECTION("a row id past the row count") {
    RunCopy copy("row_high");
    const std::string& out = copy.out;
    order_with(out, 5, int64_t(1) << 40);
    CHECK(refused(out, "data_order.bin").find("outside [0, ") != std::string::npos);
  }
  SECTION("a negative row id") {
    RunCopy copy("row_neg");
    const std::string& out = copy.out;
    order_with(out, 0, -3);
    CHECK(refused(out, "data_order.bin").find("outside [0, ") != std::string::npos);
  }
  SECTION("a row twice") {
    RunCopy copy("row_twice");
    const std::string& out = copy.out;
    int64_t first = 0;
    std::memcpy(&first, testing::read_file(out + "/checkpoint-6/data_order.bin").data(), 8);
    order_with(out, 1, first);
    CHECK(refused(out, "data_order.bin").find("a second time") != std::string::npos);
  }
  SECTION("a cursor past the order") {
    RunCopy copy("cursor");
    const std::string& out = copy.out;
    const std::string f = out + "/checkpoint-6/trainer_state.json";
    nlohmann::json j = nlohmann::json::parse(testing::read_file(f));
    j["cursor"] = j["order_count"].get<uint64_t>() + 5;
    testing::write_file(f, j.dump(2));
    reseal(out + "/checkpoint-6", "trainer_state.json");
    CHECK(refused(out, "trainer_state.json").find("cursor") != std::string::npos);
  }
}

TEST_CASE("heavy damage through the binary exits 2 promptly (no crash, no hang)", "[checkpoint][damage][cli]") {
  RunCopy copy("heavy");
  const std::string& out = copy.out;
  {
    const std::string f = out + "/checkpoint-6/data_order.bin";
    std::string b = testing::read_file(f);
    for (size_t i = 0; i + 8 <= b.size(); i += 24) {
      const int64_t v = -3;
      std::memcpy(b.data() + i, &v, 8);
    }
    testing::write_file(f, b);
    reseal(out + "/checkpoint-6", "data_order.bin");
  }
  std::string args;
  for (auto& o : overrides_for(out)) args += " " + o;
  testing::ProcessResult r = testing::run_strata("train " + testing::source_path("recipes/quickstart.toml") + args +
                                                 " train.max_steps=9 --resume auto");
  INFO(r.out);
  CHECK(r.code == 2);
  CHECK(r.out.find("data_order.bin") != std::string::npos);
  CHECK(r.out.find("step 7/") == std::string::npos);
}

TEST_CASE("resuming from a directory that does not exist says so", "[checkpoint][damage]") {
  RunCopy copy("nodir");
  const std::string& out = copy.out;
  TrainOptions resume;
  resume.resume = out + "/checkpoint-99";
  const std::string msg = testing::error_of([&] { train_run(recipe_for(out), resume); }, ErrorKind::input);  // exit 2
  INFO(msg);
  CHECK(msg.find("no such directory") != std::string::npos);
  CHECK(msg.find("COMPLETE") == std::string::npos);
}

}  // namespace strata
