// Run folders and paths as users expect (issue 10, item 4): command-line paths resolve against
// the current directory and recipe-file paths against the file, the effective recipe stores
// absolute paths, a fresh run into a used output dir is refused (--resume auto / --overwrite),
// one process per output dir (a lock naming the holder's pid), and the "resume with:" hint
// repeats the user's overrides.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "src/core/error.h"
#include "src/recipe/recipe.h"
#include "src/train/run_dir.h"
#include "src/train/trainer.h"
#include "tests/testing.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

// Runs with the current directory set to `dir`, restoring it afterwards.
struct InDir {
  fs::path old = fs::current_path();
  explicit InDir(const fs::path& dir) { fs::current_path(dir); }
  ~InDir() { fs::current_path(old); }
};

Recipe small(const std::string& out, std::vector<std::string> extra = {}) {
  std::vector<std::string> o = {"data.sequence_len=32", "train.log_steps=100", "checkpoint.output_dir=" + out,
                                "device.cpu_threads=2", "train.max_steps=2"};
  o.insert(o.end(), extra.begin(), extra.end());
  return recipe_load(testing::source_path("recipes/quickstart.toml"), o);
}

std::string error_of(const std::function<void()>& f, int* code) {
  try {
    f();
  } catch (const Error& e) {
    *code = e.exit_code();
    return e.what();
  }
  *code = 0;
  return "";
}

}  // namespace

TEST_CASE("command-line paths resolve against the current directory, recipe paths against the recipe file",
          "[recipe][rundir]") {
  testing::TempDir tmp("paths_cwd");
  fs::create_directories(tmp.path / "r");
  const std::string recipe = tmp.file("r/x.toml", "[model]\nconfig = \"m/config.json\"\n[data]\npath = \"d.txt\"\n"
                                                  "[checkpoint]\noutput_dir = \"out\"\n");
  InDir cwd(tmp.path);
  Recipe r = recipe_load("r/x.toml", {"data.eval_path=e.jsonl", "checkpoint.output_dir=runs/a"});
  const std::string here = fs::current_path().string();
  CHECK(r.model_config == here + "/r/m/config.json");  // from the file: against r/
  CHECK(r.data_path == here + "/r/d.txt");
  CHECK(r.eval_path == here + "/e.jsonl");             // from the command line: against the cwd
  CHECK(r.output_dir == here + "/runs/a");
  // the effective recipe holds absolute paths, so it means the same from anywhere
  const std::string toml = r.to_toml();
  CHECK(toml.find("\"" + here + "/r/d.txt\"") != std::string::npos);
  InDir elsewhere("/");
  Recipe again = recipe_parse(toml, "/tmp/elsewhere/recipe.toml", {});
  CHECK(again.data_path == r.data_path);
  CHECK(again.eval_path == r.eval_path);
  CHECK(again.output_dir == r.output_dir);
  (void)recipe;
}

TEST_CASE("the README's example resolves from the repository root and from another directory", "[rundir][cli]") {
  testing::TempDir tmp("paths_readme");
  // relative to the repository root, as the README writes it
  const std::string rel_out = fs::relative(tmp.path / "run", testing::source_path("")).string();
  const std::string args = "train recipes/quickstart.toml data.path=recipes/quickstart/corpus.txt "
                           "checkpoint.output_dir=" + rel_out + " train.max_steps=2 data.sequence_len=32 "
                           "device.cpu_threads=2";
  testing::ProcessResult r = testing::run_shell("cd " + testing::source_path("") + " && " +
                                                testing::strata_binary() + " " + args);
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(fs::exists(tmp.path / "run/final/config.json"));
  // resuming from another directory with the stored (absolute) recipe: no false warnings
  testing::ProcessResult again = testing::run_shell(
      "cd / && " + testing::strata_binary() + " train " + (tmp.path / "run/recipe.toml").string() +
      " train.max_steps=3 --resume auto");
  INFO(again.out);
  CHECK(again.code == 0);
  CHECK(again.out.find("warning") == std::string::npos);
  CHECK(again.out.find("resumed from") != std::string::npos);
}

TEST_CASE("a fresh run into a dir holding a run stops with exit 2, --overwrite starts over", "[rundir]") {
  testing::TempDir tmp("rundir_fresh");
  const std::string out = (tmp.path / "out").string();
  train_run(small(out));
  REQUIRE(fs::exists(out + "/checkpoint-2"));
  int code = 0;
  const std::string msg = error_of([&] { train_run(small(out)); }, &code);
  INFO(msg);
  CHECK(code == 2);
  CHECK(msg.find("--resume auto") != std::string::npos);
  CHECK(msg.find("--overwrite") != std::string::npos);
  CHECK(fs::exists(out + "/checkpoint-2/COMPLETE"));  // nothing was touched

  SECTION("metrics alone are a run too") {
    fs::remove_all(out + "/checkpoint-2");
    fs::remove_all(out + "/final");
    error_of([&] { train_run(small(out)); }, &code);
    CHECK(code == 2);
  }
  SECTION("--overwrite deletes the old run and trains afresh") {
    TrainOptions o;
    o.overwrite = true;
    TrainSummary s = train_run(small(out, {"train.max_steps=1"}), o);
    CHECK(s.losses.size() == 1);
    CHECK(!fs::exists(out + "/checkpoint-2"));
    CHECK(fs::exists(out + "/checkpoint-1/COMPLETE"));
  }
}

TEST_CASE("two runs cannot write one output dir: the second exits 2 naming the first's pid", "[rundir]") {
  testing::TempDir tmp("rundir_lock");
  const std::string out = (tmp.path / "out").string();
  fs::create_directories(out);
  int code = 0;
  {
    RunLock held(out);  // as a running process holds it
    const std::string msg = error_of([&] { train_run(small(out)); }, &code);
    INFO(msg);
    CHECK(code == 2);
    CHECK(msg.find("pid " + std::to_string(::getpid())) != std::string::npos);
  }
  // released with its holder: the run goes ahead
  CHECK(train_run(small(out)).losses.size() == 2);
}

TEST_CASE("the resume hint repeats the overrides, quoted for the shell", "[rundir]") {
  CHECK(run_dir_resume_command("r.toml", {"train.max_steps=6", "data.path=my data.jsonl"}) ==
        "strata train r.toml train.max_steps=6 'data.path=my data.jsonl' --resume auto");
  CHECK(run_dir_resume_command("it's.toml", {}) == "strata train 'it'\\''s.toml' --resume auto");
}

}  // namespace strata

namespace strata {

TEST_CASE("a disk that cannot take one checkpoint is warned about, naming the shortfall", "[rundir]") {
  // issue 43, deliver 3: before step 1, against the plan's checkpoint size
  CHECK(run_dir_space_warning("/out", 100 << 20, 200 << 20).empty());
  CHECK(run_dir_space_warning("/out", 100 << 20, 100 << 20).empty());
  const std::string w = run_dir_space_warning("/out", 100 << 20, 40 << 20);
  INFO(w);
  CHECK(w.find("/out has 40.0 MiB free") != std::string::npos);
  CHECK(w.find("about 100.0 MiB") != std::string::npos);
  CHECK(w.find("60.0 MiB short") != std::string::npos);
  CHECK(w.find("choose a checkpoint.output_dir on a larger disk") != std::string::npos);
}

TEST_CASE("final/'s step is recorded after an export and read back only while final/ exists", "[rundir]") {
  testing::TempDir tmp("final_step");
  const std::string out = tmp.path.string();
  CHECK(run_dir_final_step(out) == -1);
  run_dir_mark_final(out, 7);
  CHECK(run_dir_final_step(out) == -1);  // no final/: the record alone says nothing
  std::filesystem::create_directories(tmp.path / "final");
  CHECK(run_dir_final_step(out) == 7);
}

}  // namespace strata
