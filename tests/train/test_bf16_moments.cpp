// bf16 AdamW moments (optim.moments_dtype = "bf16", issue 13): the host store keeps m and v in
// bf16 (half the bytes, in RAM and on NVMe), a short SFT run lowers the loss and tracks the
// f32-moment run, the checkpoint carries the moments as bf16 and resumes bit-exactly in RAM,
// on NVMe and across the two, a checkpoint with the other moments dtype resumes converted, and
// the settings that keep no such moments refuse the key.

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "io/hf_config.h"
#include "io/safetensors.h"
#include "models/model_spec.h"
#include "offload/state/host_store.h"
#include "src/core/bf16.h"
#include "src/core/error.h"
#include "src/device/device.h"
#include "src/recipe/recipe.h"
#include "src/train/trainer.h"
#include "tests/testing.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

std::string fresh(const char* name) { return testing::fresh_path("strata_bf16_moments", name); }

std::string nvme_dir() {  // one per test process; each run's folder goes with the run
  return testing::process_dir("strata_bf16_moments_disk");
}

Recipe quick(const std::string& out, const std::string& moments, std::vector<std::string> extra) {
  std::vector<std::string> o = {"data.sequence_len=64", "train.micro_batch_size=2", "optim.warmup_steps=2",
                                "train.log_steps=100", "checkpoint.output_dir=" + out, "checkpoint.save_dtype=f32",
                                "device.cpu_threads=2", "optim.moments_dtype=" + moments};
  o.insert(o.end(), extra.begin(), extra.end());
  return recipe_load(testing::source_path("recipes/quickstart.toml"), o);
}

Recipe nvme_or_ram(const std::string& out, bool nvme) {
  std::vector<std::string> o = {"train.max_steps=4", "checkpoint.save_steps=2", "train.gradient_accumulation_steps=2"};
  if (nvme) {
    o.push_back("offload.optimizer=nvme");
    o.push_back("offload.nvme_path=" + nvme_dir());
  }
  return quick(out, "bf16", o);
}

DType moment_dtype_of(const std::string& checkpoint) {
  const auto f = SafetensorsFile::open(checkpoint + "/optimizer_state.safetensors");
  DType d = DType::i32;
  for (const auto& e : f.entries())
    if (e.name.rfind("exp_avg", 0) == 0) {
      if (d != DType::i32) REQUIRE(e.dtype == d);  // all moments alike
      d = e.dtype;
    }
  return d;
}

// Runs `first` until it stops (as if signalled) after step `stop_at`, then `then` resumed from
// the checkpoint that wrote: the two summaries.
std::pair<TrainSummary, TrainSummary> stop_and_resume(const Recipe& first, const Recipe& then, int64_t stop_at) {
  TrainOptions stop, resume;
  stop.stop_at_step = stop_at;
  resume.resume_latest = true;
  TrainSummary a = train_run(first, stop);
  REQUIRE(a.interrupted);
  return {std::move(a), train_run(then, resume)};
}

}  // namespace

TEST_CASE("bf16 moments take half the moments' bytes in the store, in RAM and on NVMe", "[bf16-moments]") {
  const std::string cfg = testing::source_path("recipes/quickstart/config.json");
  const ModelSpec spec = model_spec_build(hf_config_load(cfg), DType::bf16);
  const size_t f32_bytes = HostStore::layout(spec).f32.tier_bytes(Tier::host);
  const size_t params = f32_bytes / 4;
  auto dev = device_create(DeviceOptions{});
  HostStoreOptions f32o, bf16o;
  bf16o.moments = DType::bf16;
  HostStore a(*dev, spec, f32o), b(*dev, spec, bf16o);
  CHECK(a.host_bytes() - b.host_bytes() == params * 4);  // m and v: 8 B/param -> 4 B/param
  CHECK(HostStore::estimate(spec, bf16o).moments == params * 4);
  CHECK(HostStore::estimate(spec, f32o).moments == params * 8);
  // NVMe: the moment files are half the size (each group rounded to whole blocks)
  for (HostStoreOptions* o : {&f32o, &bf16o}) {
    o->state_on_nvme = true;
    o->nvme_path = nvme_dir();
    o->nvme_block_bytes = 4096;
    o->nvme_chunk_bytes = 8192;
  }
  const HostMemoryEstimate ea = HostStore::estimate(spec, f32o), eb = HostStore::estimate(spec, bf16o);
  std::printf("bf16-moments | store bytes/param: RAM f32 moments %.3f, bf16 %.3f; NVMe files f32 %.3f, bf16 %.3f\n",
              double(a.host_bytes()) / double(params), double(b.host_bytes()) / double(params),
              double(ea.nvme) / double(params), double(eb.nvme) / double(params));
  CHECK(eb.nvme < ea.nvme);
  CHECK(double(ea.nvme - eb.nvme) >= 0.98 * double(params * 4));  // master 4 + m, v 8 -> master 4 + m, v 4
  // the state round-trips through the NVMe files: values as bf16 (rounded to nearest even)
  HostStore nv(*dev, spec, bf16o);
  std::vector<float> x(size_t(spec.params[1].numel())), y(x.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = 1.0f + float(i) * 1e-3f;
  nv.write_state(StateArray::v, 1, 0, int64_t(x.size()), x.data());
  nv.read_state(StateArray::v, 1, 0, int64_t(y.size()), y.data());
  for (size_t i = 0; i < x.size(); ++i) REQUIRE(y[i] == bf16_to_f32(f32_to_bf16(x[i])));
}

TEST_CASE("an SFT run with bf16 moments lowers the loss and tracks the f32-moment run", "[bf16-moments][sft]") {
  // 40 steps of the quickstart model. Bound: over the last 10 steps the mean |loss difference|
  // is within 3% of the f32 run's mean loss, and the bf16 run's loss falls by more than a third.
  const int steps = 40;
  const std::string a = fresh("f32"), b = fresh("bf16");
  const TrainSummary f = train_run(quick(a, "f32", {"train.max_steps=" + std::to_string(steps)}));
  const TrainSummary h = train_run(quick(b, "bf16", {"train.max_steps=" + std::to_string(steps)}));
  REQUIRE(f.losses.size() == size_t(steps));
  REQUIRE(h.losses.size() == size_t(steps));
  double diff = 0, mean = 0, worst = 0;
  for (int i = steps - 10; i < steps; ++i) {
    diff += std::abs(h.losses[size_t(i)] - f.losses[size_t(i)]) / 10;
    mean += f.losses[size_t(i)] / 10;
  }
  for (int i = 0; i < steps; ++i)
    worst = std::max(worst, std::abs(h.losses[size_t(i)] - f.losses[size_t(i)]) / f.losses[size_t(i)]);
  std::printf("bf16-moments | loss step 1 %.4f -> step %d: f32 moments %.4f, bf16 %.4f; last-10 mean |diff| %.4f "
              "(%.2f%% of %.4f), worst step %.2f%%\n",
              h.losses[0], steps, f.losses.back(), h.losses.back(), diff, 100 * diff / mean, mean, 100 * worst);
  CHECK(h.losses.back() < h.losses.front() * 2 / 3);
  CHECK(diff <= 0.03 * mean);
  CHECK(h.losses != f.losses);  // the moments really are bf16
}

TEST_CASE("bf16 moments resume bit for bit in RAM, on NVMe and across the two", "[bf16-moments][checkpoint][nvme]") {
  const std::string ram = fresh("ram"), nv = fresh("nvme");
  const TrainSummary a = train_run(nvme_or_ram(ram, false));
  const TrainSummary b = train_run(nvme_or_ram(nv, true));
  REQUIRE(a.losses.size() == 4);
  CHECK(b.losses == a.losses);  // NVMe ranges round the same bits as RAM
  CHECK(moment_dtype_of(ram + "/checkpoint-4") == DType::bf16);
  CHECK(testing::read_file(ram + "/checkpoint-4/optimizer_state.safetensors") ==
        testing::read_file(nv + "/checkpoint-4/optimizer_state.safetensors"));
  testing::require_same_tensors(ram + "/final", nv + "/final");
  for (const auto& [from_nvme, to_nvme] : {std::pair{false, false}, {true, true}, {true, false}, {false, true}}) {
    INFO((from_nvme ? "NVMe" : "RAM") << " -> " << (to_nvme ? "NVMe" : "RAM"));
    const std::string out = fresh("resumed");
    const auto [first, rest] = stop_and_resume(nvme_or_ram(out, from_nvme), nvme_or_ram(out, to_nvme), 2);
    REQUIRE(rest.losses.size() == 2);
    CHECK(first.losses[0] == a.losses[0]);
    CHECK(first.losses[1] == a.losses[1]);
    CHECK(rest.losses[0] == a.losses[2]);
    CHECK(rest.losses[1] == a.losses[3]);
    testing::require_same_tensors(ram + "/final", out + "/final");
    CHECK(testing::read_file(ram + "/checkpoint-4/optimizer_state.safetensors") ==
          testing::read_file(out + "/checkpoint-4/optimizer_state.safetensors"));
  }
  CHECK(fs::is_empty(nvme_dir()));
}

TEST_CASE("a checkpoint with the other moments dtype resumes converted", "[bf16-moments][checkpoint]") {
  for (const auto& [saved, resumed] : {std::pair{"f32", "bf16"}, {"bf16", "f32"}}) {
    INFO(saved << " checkpoint, " << resumed << " run");
    const std::string out = fresh("convert");
    const std::vector<std::string> o = {"train.max_steps=4", "checkpoint.save_steps=2"};
    const auto [first, rest] = stop_and_resume(quick(out, saved, o), quick(out, resumed, o), 2);
    CHECK(moment_dtype_of(out + "/checkpoint-2") == dtype_parse(saved));
    REQUIRE(rest.losses.size() == 2);
    CHECK(std::isfinite(rest.losses[1]));
    CHECK(moment_dtype_of(out + "/checkpoint-4") == dtype_parse(resumed));
  }
}

TEST_CASE("optim.moments_dtype is refused where there are no such moments, or with a bad value", "[bf16-moments][recipe]") {
  auto refused = [](std::vector<std::string> o, const char* says) {
    try {
      recipe_load(testing::source_path("recipes/quickstart.toml"), o);
      FAIL("expected an error");
    } catch (const Error& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find(says) != std::string::npos);
      CHECK(e.exit_code() == 2);
    }
  };
  refused({"optim.moments_dtype=f16"}, "must be \"f32\" or \"bf16\"");
  refused({"optim.moments_dtype=bf16", "optim.type=zo-sgd"}, "keeps none");
  refused({"optim.moments_dtype=bf16", "distributed.shared_host_store=true"}, "shared_host_store");
  CHECK(recipe_load(testing::source_path("recipes/quickstart.toml"), {"optim.moments_dtype=bf16"}).moments_dtype == "bf16");
}

}  // namespace strata
