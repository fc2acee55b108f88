// Checkpoints and resume (issue 6): bit-exact resume, keep_last, the newest complete checkpoint
// wins, damaged or foreign checkpoints are refused, the HF export reloads, SIGTERM mid-run saves
// and exits 130, a second signal stops at once, and a save that hits a full disk leaves the
// previous checkpoint intact.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/safetensors.h"
#include "models/model_spec.h"
#include "io/hf_config.h"
#include "offload/state/host_store.h"
#include "offload/state/model_io.h"
#include "src/core/error.h"
#include "src/recipe/recipe.h"
#include "src/train/checkpoint.h"
#include "src/train/trainer.h"
#include "tests/testing.h"

namespace strata {
namespace {

using testing::require_same_tensors;

namespace fs = std::filesystem;

std::vector<std::string> small_overrides(const std::string& out) {
  return {"data.sequence_len=64", "train.micro_batch_size=2", "train.gradient_accumulation_steps=2",
          "optim.warmup_steps=2", "train.log_steps=100", "checkpoint.output_dir=" + out,
          "checkpoint.save_dtype=f32", "device.cpu_threads=2"};
}

Recipe small(const std::string& out, std::vector<std::string> extra) {
  auto o = small_overrides(out);
  o.insert(o.end(), extra.begin(), extra.end());
  return recipe_load(testing::source_path("recipes/quickstart.toml"), o);
}

std::string fresh(const char* name) { return testing::fresh_path("strata_ckpt", name); }

std::vector<std::string> checkpoint_dirs(const std::string& out) {
  std::vector<std::string> names;
  for (auto& e : fs::directory_iterator(out))
    if (e.path().filename().string().find("checkpoint-") != std::string::npos) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}


std::vector<double> metric_losses(const std::string& out) {
  std::ifstream in(out + "/metrics.jsonl");
  std::string line;
  std::vector<double> losses;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) losses.push_back(j["loss"].get<double>());
  }
  return losses;
}

std::string strata_bin() { return testing::strata_binary(); }

int run_shell(const std::string& cmd, std::string* output) {
  testing::ProcessResult r = testing::run_shell(cmd);
  *output += r.out;
  return r.code;
}

}  // namespace

TEST_CASE("a run stopped at step K and resumed equals the straight run bit for bit", "[checkpoint]") {
  const std::string a = fresh("straight"), b = fresh("resumed");
  TrainSummary straight = train_run(small(a, {"train.max_steps=6", "checkpoint.save_steps=3"}));
  REQUIRE(straight.losses.size() == 6);
  CHECK(checkpoint_dirs(a) == std::vector<std::string>{"checkpoint-3", "checkpoint-6"});

  TrainOptions stop;
  stop.stop_at_step = 2;  // as if SIGTERM arrived during step 2: finish it, save, return
  TrainSummary first = train_run(small(b, {"train.max_steps=6", "checkpoint.save_steps=3"}), stop);
  CHECK(first.interrupted);
  CHECK(first.losses.size() == 2);
  CHECK(checkpoint_dirs(b) == std::vector<std::string>{"checkpoint-2"});
  CHECK_FALSE(fs::exists(b + "/final"));

  TrainOptions resume;
  resume.resume_latest = true;
  TrainSummary rest = train_run(small(b, {"train.max_steps=6", "checkpoint.save_steps=3"}), resume);
  REQUIRE(rest.losses.size() == 4);
  for (size_t i = 0; i < 4; ++i) CHECK(rest.losses[i] == straight.losses[2 + i]);
  CHECK(first.losses[0] == straight.losses[0]);
  CHECK(first.losses[1] == straight.losses[1]);
  require_same_tensors(a + "/final", b + "/final");
  // optimizer state (master weights and both moments) and data position, byte for byte
  CHECK(testing::read_file(a + "/checkpoint-6/optimizer_state.safetensors") ==
        testing::read_file(b + "/checkpoint-6/optimizer_state.safetensors"));
  CHECK(testing::read_file(a + "/checkpoint-6/data_order.bin") == testing::read_file(b + "/checkpoint-6/data_order.bin"));
  // metrics.jsonl of the resumed run reads as one run: steps 1..6, the same losses
  CHECK(metric_losses(b) == straight.losses);

  SECTION("resuming a finished run asks for more steps") {
    CHECK_THROWS_AS(train_run(small(a, {"train.max_steps=6"}), resume), Error);
    TrainSummary more = train_run(small(a, {"train.max_steps=8", "checkpoint.save_steps=3"}), resume);
    CHECK(more.losses.size() == 2);
  }
  SECTION("resuming with other data is refused") {
    try {
      train_run(small(b, {"train.max_steps=6", "data.sequence_len=32"}), resume);
      FAIL("expected an error");
    } catch (const Error& e) {
      CHECK(std::string(e.what()).find("differs from this run's") != std::string::npos);
      CHECK(e.exit_code() == 2);
    }
  }
}

TEST_CASE("keep_last prunes old checkpoints, the newest complete one is found, leftovers are cleaned", "[checkpoint]") {
  const std::string out = fresh("keep");
  train_run(small(out, {"train.max_steps=5", "checkpoint.save_steps=1", "checkpoint.keep_last=2"}));
  CHECK(checkpoint_dirs(out) == std::vector<std::string>{"checkpoint-4", "checkpoint-5"});
  CHECK(checkpoint_find_latest(out) == out + "/checkpoint-5");

  // a checkpoint whose save never wrote its marker is not a checkpoint
  fs::remove(out + "/checkpoint-5/COMPLETE");
  CHECK(checkpoint_find_latest(out) == out + "/checkpoint-4");
  // a temp dir of an interrupted save is removed
  fs::create_directories(out + "/.checkpoint-9.tmp/hf");
  CHECK(checkpoint_find_latest(out) == out + "/checkpoint-4");
  CHECK_FALSE(fs::exists(out + "/.checkpoint-9.tmp"));

  // resuming from the incomplete one by path is refused with a reason
  auto resume_error = [&](const std::string& checkpoint) {
    TrainOptions by_path;
    by_path.resume = checkpoint;
    return testing::error_of([&] { train_run(small(out, {"train.max_steps=8"}), by_path); }, std::nullopt);
  };
  CHECK(testing::contains(resume_error(out + "/checkpoint-5"), "not a complete checkpoint"));
  // a damaged trainer_state.json is named
  std::ofstream(out + "/checkpoint-4/trainer_state.json") << "{\"step\": 4";
  CHECK(testing::contains(resume_error(out + "/checkpoint-4"), "trainer_state.json is damaged"));
}

TEST_CASE("the HF export reloads to the checkpoint's master weights", "[checkpoint]") {
  const std::string out = fresh("export");
  train_run(small(out, {"train.max_steps=2", "checkpoint.save_dtype=bf16"}));
  const std::string ck = out + "/checkpoint-2";
  for (const char* f : {"optimizer_state.safetensors", "trainer_state.json", "data_order.bin", "recipe.toml",
                        "COMPLETE", "hf/config.json", "hf/model.safetensors"})
    CHECK(fs::exists(ck + "/" + f));
  CHECK(testing::read_file(ck + "/hf/model.safetensors") == testing::read_file(out + "/final/model.safetensors"));

  ModelConfig cfg = hf_config_load(ck + "/hf");
  CHECK(cfg.raw["torch_dtype"] == "bfloat16");
  auto dev = device_create(DeviceOptions{});
  HostStore reloaded(*dev, model_spec_build(cfg, DType::f32));
  model_load_weights(reloaded, ck + "/hf");
  SafetensorsFile state = SafetensorsFile::open(ck + "/optimizer_state.safetensors");
  const ModelSpec& spec = reloaded.spec();
  for (size_t i = 0; i < spec.params.size(); ++i) {
    const SafetensorsEntry* e = state.find("master/" + spec.params[i].name);
    REQUIRE(e != nullptr);
    std::vector<float> master(size_t(e->numel())), got(master.size());
    std::memcpy(master.data(), state.data(*e), master.size() * 4);
    reloaded.get_param(i, got.data());
    INFO(spec.params[i].name);
    REQUIRE(got == testing::round_bf16(master));  // the export is the master rounded to bf16
  }
}

TEST_CASE("SIGTERM mid-run saves and exits 130, resume finishes the run as if uninterrupted", "[checkpoint][cli]") {
  const std::string a = fresh("sig_straight"), b = fresh("sig_resumed");
  const std::string recipe = testing::source_path("recipes/quickstart.toml");
  std::string args;
  for (auto& o : small_overrides(b)) args += " " + o;
  args += " train.max_steps=30 train.log_steps=1";

  // start, wait for the second step's log line, then SIGTERM
  size_t fired = 0;
  testing::ProcessResult run =
      testing::run_strata_signalled("train " + recipe + args, {{"step 2/30", SIGTERM}}, &fired);
  const std::string& err = run.out;
  INFO(err);
  REQUIRE(fired == 1);
  CHECK(run.code == 130);
  CHECK(err.find("--resume auto") != std::string::npos);
  std::string latest = checkpoint_find_latest(b);
  REQUIRE(!latest.empty());
  const int64_t stopped = std::stoll(latest.substr(latest.rfind('-') + 1));
  CHECK(stopped >= 2);
  CHECK(stopped < 30);

  std::string out;
  int code = run_shell(strata_bin() + " train " + recipe + args + " --resume auto", &out);
  INFO(out);
  REQUIRE(code == 0);
  TrainSummary straight = train_run(small(a, {"train.max_steps=30"}));
  CHECK(metric_losses(b) == straight.losses);
  require_same_tensors(a + "/final", b + "/final");
}

TEST_CASE("a second signal stops at once, leaving earlier checkpoints intact", "[checkpoint][cli]") {
  const std::string b = fresh("sig_twice");
  const std::string recipe = testing::source_path("recipes/quickstart.toml");
  std::string args;
  for (auto& o : small_overrides(b)) args += " " + o;
  // a throttled link makes each step long enough that the second signal lands mid-step or mid-save
  args += " train.max_steps=200 train.log_steps=1 checkpoint.save_steps=2 device.link_bandwidth=20MB/s";
  size_t fired = 0;
  testing::ProcessResult run = testing::run_strata_signalled(
      "train " + recipe + args, {{"step 5/200", SIGINT}, {"signal again to stop at once", SIGINT}}, &fired);
  INFO(run.out);
  REQUIRE(fired == 2);
  CHECK(run.code == kExitStoppedAtOnce);
  // checkpoint-2 and -4 were complete before the signals; whatever else is there is not complete
  std::string latest = checkpoint_find_latest(b);
  REQUIRE(!latest.empty());
  TrainOptions resume;
  resume.resume_latest = true;
  TrainSummary rest = train_run(small(b, {"train.max_steps=8"}), resume);
  CHECK(!rest.losses.empty());
}

TEST_CASE("a save that hits a full disk fails with exit 4 and loses nothing saved before", "[checkpoint][cli]") {
  const std::string recipe = testing::source_path("recipes/quickstart.toml");
  auto args_for = [&](const std::string& out, const char* steps) {
    std::string args;
    for (auto& o : small_overrides(out)) args += " " + o;
    return args + " train.max_steps=" + steps + " checkpoint.save_steps=3";
  };

  SECTION("a file-size limit (EFBIG), anywhere") {
    const std::string out = fresh("fsize");
    std::string log;
    REQUIRE(run_shell(strata_bin() + " train " + recipe + args_for(out, "3"), &log) == 0);
    const std::string before = testing::read_file(out + "/checkpoint-3/optimizer_state.safetensors");
    // 1 MiB per file: metrics and configs fit, the optimizer state (about 9 MiB) does not
    log.clear();
    int code = run_shell("sh -c 'ulimit -f 2048; exec " + strata_bin() + " train " + recipe + args_for(out, "6") +
                             " --resume auto'",
                         &log);
    INFO(log);
    CHECK(code == 4);
    CHECK(log.find("optimizer_state.safetensors") != std::string::npos);
    CHECK(checkpoint_dirs(out) == std::vector<std::string>{"checkpoint-3"});  // no temp dir, no half checkpoint
    CHECK(testing::read_file(out + "/checkpoint-3/optimizer_state.safetensors") == before);
    CHECK(checkpoint_find_latest(out) == out + "/checkpoint-3");
    // and the run can go on from it once there is room
    log.clear();
    CHECK(run_shell(strata_bin() + " train " + recipe + args_for(out, "6") + " --resume auto", &log) == 0);
  }

  SECTION("a small tmpfs (ENOSPC), where mount namespaces are allowed") {
    const std::string out = fresh("tmpfs");
    fs::create_directories(out);
    std::string probe;
    if (run_shell("unshare -m sh -c 'mount -t tmpfs -o size=1M tmpfs " + out + "'", &probe) != 0) {
      WARN("skipped: cannot mount a tmpfs here (needs root and unshare): " << probe);
      return;
    }
    // 22 MiB holds the first run (checkpoint-3 about 12.3 MiB with f32 export, final/ 3 MiB)
    // but not a second checkpoint
    const std::string script =
        "mount -t tmpfs -o size=22M tmpfs " + out + " || exit 90; " +
        strata_bin() + " train " + recipe + args_for(out, "3") + " || exit 91; " +
        "sum_before=$(cksum < " + out + "/checkpoint-3/optimizer_state.safetensors); " +
        strata_bin() + " train " + recipe + args_for(out, "6") + " --resume auto; echo \"second=$?\"; " +
        "test \"$sum_before\" = \"$(cksum < " + out + "/checkpoint-3/optimizer_state.safetensors)\" && echo same; " +
        "echo LISTING; ls -a " + out + "; test -f " + out + "/checkpoint-3/COMPLETE && echo intact";
    std::string log;
    int code = run_shell("unshare -m sh -c '" + script + "'", &log);
    INFO(log);
    REQUIRE(code == 0);
    CHECK(log.find("second=4") != std::string::npos);
    CHECK(log.find("No space left on device") != std::string::npos);
    const std::string listing = log.substr(log.find("LISTING"));
    CHECK(listing.find("intact") != std::string::npos);
    CHECK(log.find("\nsame\n") != std::string::npos);
    CHECK(listing.find("checkpoint-6") == std::string::npos);
    CHECK(listing.find(".tmp") == std::string::npos);
  }
}

}  // namespace strata
