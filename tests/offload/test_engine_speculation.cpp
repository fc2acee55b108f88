// Speculative updates (offload.speculative_update; offload/engine/engine_speculation.cpp): with
// clipping, the speculated groups' AdamW starts as their gradients land in the step's last pass,
// before the global norm is known, and is committed or redone once it is. Whatever the norm does,
// the run must hold exactly what the serial step (every update after the norm) gives: losses,
// norms, master, m, v and the working copy, to the bit.
#include <algorithm>
#include <catch2/catch.hpp>
#include <string>

#include "offload/plan/placement_plan.h"
#include "tests/offload/engine_step_rig.h"

namespace strata {
namespace {

using engine_step_rig::kLayers;
using engine_step_rig::same_bits;

struct SpecRun {
  size_t first = 0, end = 0;  // speculated groups (first >= end: none, the serial step)
  double clip = 1.0;
  bool layer_major = false;
  DType matrices = DType::bf16;  // f32: the master is the working copy (updated in place)
  DType moments = DType::f32;
  size_t nvme_first = 0;         // > 0: groups from it on keep their state on NVMe
  const char* weights = "stream";
};

struct Result : engine_step_rig::Result {
  std::vector<char> working;
};

Result run(const SpecRun& c) {
  engine_step_rig::Options o;
  o.store.moments = c.moments;
  o.store.state_on_nvme = c.nvme_first > 0;
  o.store.nvme_first_group = c.nvme_first;
  o.matrices = c.matrices;
  o.weights = c.weights;
  o.layer_major = c.layer_major;
  o.speculate_first = c.first;
  o.speculate_end = c.end;
  o.clip = c.clip;
  Result r;
  static_cast<engine_step_rig::Result&>(r) = engine_step_rig::run(o, "speculation", [&](const HostStore& store) {
    if (store.master_is_working()) return;  // f32 matrices: the master compared is the working copy
    const char* working = store.working();
    r.working.assign(working, working + store.working_table().tier_bytes(Tier::host_pinned));
  });
  return r;
}

void check_equal(const Result& spec, const Result& serial) {
  CHECK(spec.losses == serial.losses);  // each next step read the same updated weights
  CHECK(spec.norms == serial.norms);
  CHECK(same_bits(spec.master, serial.master));
  CHECK(spec.m == serial.m);
  CHECK(spec.v == serial.v);
  CHECK(spec.working == serial.working);
  CHECK(spec.final_loss == serial.final_loss);
}

}  // namespace

TEST_CASE("speculative updates equal the serial clipped step bit for bit, committed or redone", "[engine][speculation]") {
  const size_t groups = kLayers + 2;
  const Result probe = run({0, 0, 0.0});  // no clipping: the norms the clips are set from
  const double low = 0.5 * *std::min_element(probe.norms.begin(), probe.norms.end());
  const double high = 2 * *std::max_element(probe.norms.begin(), probe.norms.end());
  struct Case {
    const char* what;
    SpecRun base;
  };
  const Case cases[] = {
      {"bf16 matrices, f32 moments, micro-batch", {}},
      {"layer-major", {0, 0, 0, true}},
      {"f32 matrices (the master is the working copy)", {0, 0, 0, false, DType::f32}},
      {"bf16 moments (stochastic rounding keys)", {0, 0, 0, false, DType::bf16, DType::bf16}},
      {"resident weights", {0, 0, 0, false, DType::bf16, DType::f32, 0, "device"}},
  };
  for (const Case& k : cases)
    for (double clip : {low, high})
      for (size_t first : {size_t(1), size_t(3)}) {
        INFO(k.what << ", clip " << clip << ", groups " << first << ".." << groups);
        SpecRun serial = k.base, ahead = k.base;
        serial.clip = ahead.clip = clip;
        ahead.first = first;
        ahead.end = groups;
        const Result a = run(ahead), s = run(serial);
        check_equal(a, s);
        const uint64_t per_step = groups - first;
        CHECK(a.stats.speculated_updates == 3 * per_step);
        CHECK(a.stats.speculation_redos == (clip == low ? 3 * per_step : 0));
        CHECK(s.stats.speculated_updates == 0);
      }
}

TEST_CASE("speculation covers the RAM groups of a state split with NVMe, bit for bit", "[engine][speculation][nvme]") {
  const size_t groups = kLayers + 2;
  for (double clip : {1e-3, 1e6}) {
    INFO("clip " << clip);
    SpecRun serial{0, 0, clip}, ahead{1, groups - 1, clip};
    serial.nvme_first = ahead.nvme_first = groups - 1;  // lm_head's group on NVMe, the rest in RAM
    const Result a = run(ahead), s = run(serial);
    check_equal(a, s);
    CHECK(a.stats.speculated_updates == 3 * (groups - 2));
  }
  // a speculated group on NVMe is refused: its state moves under the placement's window
  SpecRun bad{1, groups, 1.0};
  bad.nvme_first = groups - 1;
  CHECK_THROWS_WITH(run(bad), Catch::Contains("optimizer state in RAM"));
}

TEST_CASE("speculation: a clip that differs clips, and the backup is the plan's size", "[engine][speculation]") {
  const Result low = run({1, kLayers + 2, 1e-3}), high = run({1, kLayers + 2, 1e6});
  CHECK_FALSE(same_bits(low.master, high.master));  // the redo did apply the clip scale
  auto dev = device_create(DeviceOptions{});
  const ModelSpec spec = model_spec_build(testing::tiny_llama_config({32, 48, kLayers, 300, 64, false}), DType::bf16);
  HostStore store(*dev, spec);
  EngineOptions eo;
  eo.max_batch = 2;
  eo.max_tokens = 17;
  eo.speculate_first_group = 2;
  eo.speculate_end_group = kLayers + 2;
  Engine engine(*dev, store, eo);
  const HostStoreLayout layout = HostStore::layout(spec);
  size_t expect = 0;
  for (size_t g = 2; g < kLayers + 2; ++g) expect += layout.groups[g].f32_bytes / 4 * 12;  // master, m, v in f32
  CHECK(engine.speculation_backup_bytes() == expect);
  CHECK(speculation_backup_bytes(layout, DType::f32, 2, kLayers + 2) == expect);
  engine.set_speculated_groups(0, 0);
  CHECK(engine.speculation_backup_bytes() == 0);
}

}  // namespace strata
