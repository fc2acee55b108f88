// Training with the NVMe tier (offload.optimizer = StateTier::nvme, offload.checkpoints = CheckpointMode::nvme): the
// losses, the exported model and the checkpoint's optimizer state equal the RAM run's bit for
// bit (f32 and bf16); a checkpoint saved from an NVMe run resumes in a RAM run and vice versa,
// bit-exactly (the format is unchanged); metrics.jsonl counts the NVMe traffic; bad NVMe paths
// are exit 2 before any work, a budget too small exit 3; injected I/O errors and a real full
// disk are exit 4 naming the file, with the previous checkpoint intact and the run's NVMe
// folder removed.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/hf_config.h"
#include "io/safetensors.h"
#include "offload/state/model_io.h"
#include "offload/state/nvme_state.h"
#include "src/core/error.h"
#include "src/recipe/recipe.h"
#include "src/train/checkpoint.h"
#include "src/train/trainer.h"
#include "tests/testing.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

std::string fresh(const std::string& name) {
  std::string d = (fs::temp_directory_path() / "strata_nvme_train" / name).string();
  fs::remove_all(d);
  return d;
}

std::string nvme_dir() {
  // one per test process: ctest runs the cases in parallel, and they check it is left empty
  return testing::process_dir("strata_nvme_train_disk");
}

bool nvme_dir_empty() { return fs::is_empty(nvme_dir()); }

std::vector<std::string> overrides(const std::string& out, const std::string& dtype, bool nvme) {
  std::vector<std::string> o = {"data.sequence_len=64", "train.micro_batch_size=2",
                                "train.gradient_accumulation_steps=2", "optim.warmup_steps=2",
                                "train.log_steps=100", "checkpoint.output_dir=" + out,
                                "checkpoint.save_dtype=f32", "device.cpu_threads=2", "model.dtype=" + dtype,
                                "train.max_steps=4", "checkpoint.save_steps=2"};
  if (nvme) {
    o.push_back("offload.optimizer=nvme");
    o.push_back("offload.checkpoints=nvme");
    o.push_back("offload.nvme_path=" + nvme_dir());
  } else {
    o.push_back("offload.checkpoints=host");
  }
  return o;
}

Recipe recipe(const std::string& out, const std::string& dtype, bool nvme) {
  return recipe_load(testing::source_path("recipes/quickstart.toml"), overrides(out, dtype, nvme));
}

std::string bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

using testing::require_same_tensors;

std::vector<nlohmann::json> step_records(const std::string& out) {
  std::ifstream in(out + "/metrics.jsonl");
  std::string line;
  std::vector<nlohmann::json> r;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) r.push_back(j);
  }
  return r;
}

std::string args_of(const std::vector<std::string>& o) {
  std::string s;
  for (auto& x : o) s += " " + x;
  return s;
}

}  // namespace

TEST_CASE("training with state and checkpoints on NVMe equals RAM, and resumes across the two bit for bit",
          "[nvme][checkpoint]") {
  for (const char* dtype : {"f32", "bf16"}) {
    INFO(dtype);
    const std::string ram = fresh(std::string("ram_") + dtype), nv = fresh(std::string("nvme_") + dtype);
    const TrainSummary a = train_run(recipe(ram, dtype, false));
    const TrainSummary b = train_run(recipe(nv, dtype, true));
    REQUIRE(a.losses.size() == 4);
    CHECK(b.losses == a.losses);
    require_same_tensors(ram + "/final", nv + "/final");
    CHECK(bytes_of(ram + "/checkpoint-4/optimizer_state.safetensors") ==
          bytes_of(nv + "/checkpoint-4/optimizer_state.safetensors"));
    CHECK(nvme_dir_empty());
    // metrics: RAM moves nothing; NVMe reads and writes the state (and checkpoints) every step
    for (const auto& j : step_records(ram)) CHECK(j.at("nvme_read_bytes").get<uint64_t>() == 0);
    for (const auto& j : step_records(nv)) {
      CHECK(j.at("nvme_read_bytes").get<uint64_t>() > 0);
      CHECK(j.at("nvme_write_bytes").get<uint64_t>() > 0);
      CHECK(j.at("nvme_wait_s").get<double>() >= 0);
    }
    for (bool from_nvme : {true, false}) {
      INFO((from_nvme ? "NVMe -> RAM" : "RAM -> NVMe"));
      const std::string out = fresh(std::string("cross_") + dtype);
      TrainOptions stop;
      stop.stop_at_step = 2;
      const TrainSummary first = train_run(recipe(out, dtype, from_nvme), stop);
      REQUIRE(first.interrupted);
      TrainOptions resume;
      resume.resume_latest = true;
      const TrainSummary rest = train_run(recipe(out, dtype, !from_nvme), resume);
      REQUIRE(rest.losses.size() == 2);
      CHECK(first.losses[0] == a.losses[0]);
      CHECK(first.losses[1] == a.losses[1]);
      CHECK(rest.losses[0] == a.losses[2]);
      CHECK(rest.losses[1] == a.losses[3]);
      require_same_tensors(ram + "/final", out + "/final");
      CHECK(bytes_of(ram + "/checkpoint-4/optimizer_state.safetensors") ==
            bytes_of(out + "/checkpoint-4/optimizer_state.safetensors"));
      CHECK(nvme_dir_empty());
    }
  }
}

TEST_CASE("bad NVMe settings are refused before any work: exit 2, or 3 for a budget too small", "[nvme][cli]") {
  const std::string out = fresh("bad");
  const std::string base = "train " + testing::source_path("recipes/quickstart.toml") +
                           args_of(overrides(out, "f32", false));
  auto run = [&](const std::string& extra) { return testing::run_strata(base + extra); };

  testing::ProcessResult r = run(" offload.optimizer=nvme");
  CHECK(r.code == 2);
  CHECK(r.out.find("offload.nvme_path") != std::string::npos);
  r = run(" offload.checkpoints=nvme");
  CHECK(r.code == 2);
  CHECK(r.out.find("offload.nvme_path") != std::string::npos);
  r = run(" offload.optimizer=nvme offload.nvme_path=" + out + "/no/such/dir");
  CHECK(r.code == 2);
  CHECK(r.out.find("does not exist") != std::string::npos);
  fs::create_directories(out);
  { std::ofstream(out + "/a_file") << "x"; }
  r = run(" offload.optimizer=nvme offload.nvme_path=" + out + "/a_file");
  CHECK(r.code == 2);
  CHECK(r.out.find("is not a directory") != std::string::npos);
  r = run(" offload.optimizer=nvme offload.nvme_path=" + nvme_dir() + " offload.nvme_memory=64KiB --overwrite");
  INFO(r.out);
  CHECK(r.code == 3);
  CHECK(r.out.find("offload.nvme_memory") != std::string::npos);
  CHECK(nvme_dir_empty());
  r = run(" offload.optimizer=bogus");
  CHECK(r.code == 2);

  SECTION("a read-only directory, where mount namespaces are allowed") {
    const std::string ro = fresh("ro");
    fs::create_directories(ro);
    if (testing::run_shell("unshare -m sh -c 'mount -t tmpfs -o ro,size=1M tmpfs " + ro + "'").code != 0) {
      WARN("skipped: cannot mount a tmpfs here (needs root and unshare)");
      return;
    }
    r = testing::run_shell("unshare -m sh -c 'mount -t tmpfs -o ro,size=1M tmpfs " + ro + " && " +
                           testing::strata_binary() + " " + base + " offload.optimizer=nvme offload.nvme_path=" + ro +
                           " --overwrite'");
    INFO(r.out);
    CHECK(r.code == 2);
    CHECK(r.out.find("not writable") != std::string::npos);
  }
}

TEST_CASE("NVMe I/O errors in training are exit 4 naming the file, nothing saved before is lost", "[nvme][cli]") {
  const std::string out = fresh("fault");
  const std::string recipe_path = testing::source_path("recipes/quickstart.toml");
  std::vector<std::string> o = overrides(out, "bf16", true);
  REQUIRE(testing::run_strata("train " + recipe_path + args_of(o)).code == 0);  // checkpoint-2, -4
  const std::string before = bytes_of(out + "/checkpoint-4/optimizer_state.safetensors");
  o.push_back("train.max_steps=8");
  // the N-th kernel request of each file engine fails: at set-up, during the steps, during a save
  for (const char* fault : {"eio@1", "eio@40", "enospc@150", "eio@400", "enospc@700"}) {
    INFO(fault);
    testing::ProcessResult r =
        testing::run_shell(std::string("STRATA_IO_FAULT=") + fault + " " + testing::strata_binary() + " train " +
                           recipe_path + args_of(o) + " --resume auto");
    INFO(r.out);
    if (r.code == 0) {  // the fault count was past the end of this run's requests
      WARN("no fault hit with " << fault);
      continue;
    }
    CHECK(r.code == 4);
    CHECK((r.out.find("/state.") != std::string::npos || r.out.find("checkpoints.f32") != std::string::npos));
    CHECK(bytes_of(out + "/checkpoint-4/optimizer_state.safetensors") == before);  // nothing saved is lost
    for (auto& e : fs::directory_iterator(out)) CHECK(e.path().filename().string().find(".tmp") == std::string::npos);
    CHECK(nvme_dir_empty());
  }
  // a short transfer is resubmitted: the run completes, from the newest checkpoint a faulty
  // run left (so that one is complete and verifies)
  o.push_back("train.max_steps=12");
  testing::ProcessResult r = testing::run_shell(std::string("STRATA_IO_FAULT=short@30 ") + testing::strata_binary() +
                                                " train " + recipe_path + args_of(o) + " --resume auto");
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(nvme_dir_empty());
}

TEST_CASE("an NVMe error while saving loses nothing saved before and leaves no temp files", "[nvme][checkpoint]") {
  const std::string out = fresh("save_fault");
  nlohmann::json j = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"},
                      {"hidden_size", 32}, {"intermediate_size", 48}, {"num_hidden_layers", 2},
                      {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"vocab_size", 300},
                      {"max_position_embeddings", 64}};
  auto dev = device_create(DeviceOptions{});
  HostStoreOptions so;
  so.state_on_nvme = true;
  so.nvme_path = nvme_dir();
  {
    HostStore store(*dev, model_spec_build(hf_config_parse(j.dump(), "test"), DType::bf16), so);
    model_init_weights(store, 5);
    TrainState st;
    st.step = 1;
    st.rows = 2;
    st.order = {1, 0};
    checkpoint_save(out, store, st, "", DType::f32, CheckpointFiles{}, 0);
    const std::string before = bytes_of(out + "/checkpoint-1/optimizer_state.safetensors");
    for (IoFault fault : {IoFault::eio, IoFault::enospc, IoFault::einval}) {
      dynamic_cast<NvmeStatePlacement&>(store.placement()).io().inject_fault(fault, 4);
      st.step = 2;
      try {
        checkpoint_save(out, store, st, "", DType::f32, CheckpointFiles{}, 0);
        FAIL("no error");
      } catch (const Error& e) {
        INFO(e.what());
        CHECK(e.exit_code() == 4);
        CHECK(std::string(e.what()).find("/state.") != std::string::npos);
      }
      CHECK(checkpoint_find_latest(out) == out + "/checkpoint-1");
      CHECK(bytes_of(out + "/checkpoint-1/optimizer_state.safetensors") == before);
      for (auto& e : fs::directory_iterator(out)) CHECK(e.path().filename().string() == "checkpoint-1");
    }
    // and a save after the errors still works and resumes into a RAM store bit for bit
    st.step = 3;
    checkpoint_save(out, store, st, "", DType::f32, CheckpointFiles{}, 0);
    HostStore ram(*dev, store.spec());
    checkpoint_load(out + "/checkpoint-3", ram);
    for (size_t r = 0; r < store.spec().params.size(); ++r)
      for (StateArray a : {StateArray::master, StateArray::m, StateArray::v}) {
        std::vector<float> x(size_t(store.f32_table()[r].numel())), y(x.size());
        store.read_state(a, r, 0, int64_t(x.size()), x.data());
        ram.read_state(a, r, 0, int64_t(y.size()), y.data());
        CHECK(x == y);
      }
  }
  CHECK(nvme_dir_empty());
}

TEST_CASE("a real full NVMe disk is exit 4 naming the file, and the run folder is removed", "[nvme][cli]") {
  const std::string out = fresh("full"), disk = fresh("full_disk");
  fs::create_directories(disk);
  if (testing::run_shell("unshare -m sh -c 'mount -t tmpfs -o size=1M tmpfs " + disk + "'").code != 0) {
    WARN("skipped: cannot mount a tmpfs here (needs root and unshare)");
    return;
  }
  std::vector<std::string> o = overrides(out, "bf16", false);
  o.push_back("offload.optimizer=nvme");
  o.push_back("offload.nvme_path=" + disk);
  o.push_back("offload.nvme_memory=1GiB");  // the budget allows it; the disk does not
  const std::string script = "mount -t tmpfs -o size=1M tmpfs " + disk + " || exit 90; " + testing::strata_binary() +
                             " train " + testing::source_path("recipes/quickstart.toml") + args_of(o) +
                             "; echo \"code=$?\"; echo LISTING; ls -A " + disk;
  testing::ProcessResult r = testing::run_shell("unshare -m sh -c '" + script + "'");
  INFO(r.out);
  CHECK(r.out.find("code=4") != std::string::npos);
  CHECK(r.out.find("No space left on device") != std::string::npos);
  CHECK(r.out.find("/state.") != std::string::npos);
  const std::string listing = r.out.substr(r.out.find("LISTING"));
  CHECK(listing.find("strata-") == std::string::npos);  // the run folder is gone
}

}  // namespace strata
