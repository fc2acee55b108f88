// The NVMe tier's storage side (offload/state/nvme_state.h, offload/stream/checkpoint_spill.h): optimizer
// state in files and activation checkpoints in a file give the all-RAM run's losses, master
// weights, moments and working copy bit for bit — f32 and bf16 compute, streamed and resident
// weights, clipping on (forward_backward + optimizer_step) and off (forward_backward_update),
// with gradient accumulation; NVMe traffic is counted exactly; the store holds no master or
// moment array in RAM; in f32 mode the master is the working copy; an injected I/O error
// names the file and is an I/O error (exit 4); the run folder is removed when the store goes.
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "io/hf_config.h"
#include "src/recipe/recipe_modes.h"
#include "offload/engine/engine.h"
#include "offload/state/model_io.h"
#include "offload/state/nvme_state.h"
#include "src/core/error.h"
#include "tests/seeded_inputs.h"
#include "tests/offload/store_testing.h"
#include "tests/testing.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

std::string nvme_root() {
  // one root per test process: ctest runs the cases in parallel, and they count run folders here
  return testing::process_dir("strata_nvme_state");
}

size_t run_folders(const std::string& root) {
  size_t n = 0;
  for (auto& e : fs::directory_iterator(root)) n += e.path().filename().string().rfind("strata-", 0) == 0;
  return n;
}

ModelSpec nvme_spec(DType dtype, bool tied, int64_t layers = 8) {
  return model_spec_build(testing::tiny_llama_config({32, 48, layers, 300, 64, tied}), dtype);
}

HostStoreOptions nvme_options(bool on_nvme) {
  HostStoreOptions o;
  o.state_on_nvme = on_nvme;
  o.nvme_path = nvme_root();
  o.nvme_block_bytes = 4096;  // small blocks and chunks: every group is several ranges
  o.nvme_chunk_bytes = 8192;
  return o;
}

struct Setup {
  DType dtype = DType::bf16;
  bool state_nvme = false;
  std::string checkpoints = "host";
  std::string weights = "stream";
  bool clip = true;
  bool tied = false;
};

struct Result {
  std::vector<double> losses, norms;
  std::vector<float> master, m, v;
  std::vector<char> working;
  std::vector<EngineStats> stats;  // after each step
};

Result run(const Setup& s) {
  auto dev = device_create(DeviceOptions{});
  HostStore store(*dev, nvme_spec(s.dtype, s.tied), nvme_options(s.state_nvme));
  model_init_weights(store, 11);
  EngineOptions eo;
  eo.weights = weights_mode_parse(s.weights);
  eo.checkpoints = checkpoint_mode_parse(s.checkpoints);
  eo.nvme_dir = nvme_root();
  eo.max_batch = 2;
  eo.max_tokens = 17;
  Engine engine(*dev, store, eo);
  Result r;
  for (int step = 1; step <= 3; ++step) {
    // two accumulation micro-batches, the second shorter than the capacity
    const MicroBatch mb0 = testing::state_test_batch(step, 0, 17), mb1 = testing::state_test_batch(step, 1, 13);
    AdamWParams ap;
    ap.lr = 2e-3;
    ap.step = step;
    const float scale = 1.f / float(mb0.counted() + mb1.counted());
    double loss = engine.forward_backward(mb0, scale);
    if (s.clip) {
      loss += engine.forward_backward(mb1, scale);
      r.norms.push_back(engine.optimizer_step(ap, 0.05, 0.01));  // the norm is well above: clipped
    } else {
      loss += engine.forward_backward_update(mb1, scale, ap, 0.01);
      r.norms.push_back(engine.landed_update_norm());
    }
    r.losses.push_back(loss);
    engine.synchronize();
    r.stats.push_back(engine.stats());
  }
  r.losses.push_back(engine.forward_loss(testing::state_test_batch(9, 0, 17)));  // the last update, seen by a forward
  engine.synchronize();
  r.master = testing::state_array(store, StateArray::master);
  r.m = testing::state_array(store, StateArray::m);
  r.v = testing::state_array(store, StateArray::v);
  const size_t wb = store.working_table().tier_bytes(Tier::host_pinned);
  r.working.assign(store.working(), store.working() + wb);
  return r;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

void require_same(const Result& got, const Result& want) {
  REQUIRE(got.losses.size() == want.losses.size());
  for (size_t i = 0; i < want.losses.size(); ++i) CHECK(got.losses[i] == want.losses[i]);
  for (size_t i = 0; i < want.norms.size(); ++i) CHECK(got.norms[i] == want.norms[i]);
  CHECK(same_bits(got.master, want.master));
  CHECK(same_bits(got.m, want.m));
  CHECK(same_bits(got.v, want.v));
  CHECK(got.working == want.working);
}

}  // namespace

TEST_CASE("optimizer state and checkpoints on NVMe give the all-RAM run bit for bit", "[nvme]") {
  const std::string root = nvme_root();
  for (DType dtype : {DType::bf16, DType::f32})
    for (bool clip : {true, false})
      for (const char* weights : {"stream", "device"}) {
        Setup ram;
        ram.dtype = dtype;
        ram.clip = clip;
        ram.weights = weights;
        ram.tied = !clip;  // both head layouts over the runs
        INFO(dtype_name(dtype) << (clip ? " clipped" : " landed updates") << ", weights " << weights);
        const Result want = run(ram);
        REQUIRE(want.losses[3] < want.losses[0]);  // it trains
        Setup state = ram;
        state.state_nvme = true;
        const Result got_state = run(state);
        require_same(got_state, want);
        Setup ckpt = ram;
        ckpt.checkpoints = "nvme";
        const Result got_ckpt = run(ckpt);
        require_same(got_ckpt, want);
        Setup both = state;
        both.checkpoints = "nvme";
        require_same(run(both), want);
        CHECK(run_folders(root) == 0);  // every run removed its folder
      }
}

TEST_CASE("NVMe traffic per step is what the layout says, and RAM runs move nothing", "[nvme]") {
  const ModelSpec spec = nvme_spec(DType::bf16, false);
  const HostStoreLayout layout = HostStore::layout(spec);
  const NvmeStateSizes sizes = nvme_state_sizes(layout, nvme_options(true), true);
  size_t per_array = 0;  // each group's span is a whole number of 4096-byte blocks
  for (const ParamGroup& g : layout.groups) per_array += (g.f32_bytes + 4095) / 4096 * 4096;
  CHECK(sizes.file_bytes == 3 * per_array);
  CHECK(sizes.chunk_bytes == 8192);
  Setup s;
  s.state_nvme = true;
  s.checkpoints = "nvme";
  const Result r = run(s);
  // per step: the optimizer's pass reads and writes every array once; the two micro-batches
  // write and read the checkpoints of layers 1 .. L-3 (5 layers) at their token counts
  const uint64_t ckpt = 5 * (2 * 17 + 2 * 13) * 32 * 4;
  for (size_t i = 1; i < r.stats.size(); ++i) {
    CHECK(r.stats[i].nvme_read_bytes - r.stats[i - 1].nvme_read_bytes == sizes.file_bytes + ckpt);
    CHECK(r.stats[i].nvme_write_bytes - r.stats[i - 1].nvme_write_bytes == sizes.file_bytes + ckpt);
    CHECK(r.stats[i].nvme_wait_s >= r.stats[i - 1].nvme_wait_s);
  }
  Setup ram;
  const Result rr = run(ram);
  CHECK(rr.stats.back().nvme_read_bytes == 0);
  CHECK(rr.stats.back().nvme_write_bytes == 0);
  CHECK(rr.stats.back().nvme_wait_s == 0);
}

TEST_CASE("the store keeps no master or moments in RAM on NVMe, and no second f32 copy in f32 mode", "[nvme]") {
  auto dev = device_create(DeviceOptions{});
  const std::string root = nvme_root();
  for (DType dtype : {DType::bf16, DType::f32}) {
    INFO(dtype_name(dtype));
    const ModelSpec spec = nvme_spec(dtype, false);
    const bool f32 = dtype == DType::f32;
    const size_t f32_bytes = HostStore::layout(spec).f32.tier_bytes(Tier::host);
    const HostMemoryEstimate ram = HostStore::estimate(spec, HostStoreOptions{});
    CHECK(ram.master == (f32 ? 0 : f32_bytes));
    CHECK(ram.moments == 2 * f32_bytes);
    {
      HostStore store(*dev, spec);
      CHECK(store.host_bytes() == ram.master + ram.moments);
      CHECK((store.master() == reinterpret_cast<float*>(store.working())) == f32);
    }
    const HostMemoryEstimate nv = HostStore::estimate(spec, nvme_options(true));
    CHECK(nv.master == 0);
    CHECK(nv.moments == 0);
    HostStore store(*dev, spec, nvme_options(true));
    CHECK(store.m() == nullptr);
    CHECK(store.v() == nullptr);
    CHECK((store.master() != nullptr) == f32);  // f32: the working copy; bf16: on NVMe
    CHECK(store.host_bytes() == nv.nvme_buffers);
    auto& p = dynamic_cast<NvmeStatePlacement&>(store.placement());
    CHECK(nv.nvme == p.sizes().file_bytes);
    // the files: one per array on NVMe, at full size, in a run folder under nvme_path
    size_t files = 0, bytes = 0;
    for (auto& e : fs::directory_iterator(p.dir()))
      if (e.path().extension() == ".f32") ++files, bytes += fs::file_size(e.path());
    CHECK(files == (f32 ? 2u : 3u));
    CHECK(bytes == p.sizes().file_bytes);
    // values go through: set, get, and m/v at an awkward span
    std::vector<float> row(size_t(store.f32_table()[3].numel())), back(row.size());
    for (size_t i = 0; i < row.size(); ++i) row[i] = float(i) * 0.25f - 3.f;
    store.set_param(3, row.data());
    store.get_param(3, back.data());
    CHECK(back == row);
    store.write_state(StateArray::v, 3, 5, 17, row.data());
    std::vector<float> span(17);
    store.read_state(StateArray::v, 3, 5, 17, span.data());
    CHECK(std::equal(span.begin(), span.end(), row.begin()));
  }
  CHECK(run_folders(root) == 0);
}

TEST_CASE("an I/O error in the NVMe optimizer pass is an I/O error naming the file", "[nvme]") {
  auto dev = device_create(DeviceOptions{});
  const std::string root = nvme_root();
  for (IoFault fault : {IoFault::eio, IoFault::enospc}) {
    {
      HostStore store(*dev, nvme_spec(DType::bf16, false, 3), nvme_options(true));
      model_init_weights(store, 1);
      EngineOptions eo;
      eo.max_batch = 2;
      eo.max_tokens = 17;
      Engine engine(*dev, store, eo);
      const MicroBatch mb = testing::state_test_batch(1, 0, 17);
      engine.forward_backward(mb, 1.f / float(mb.counted()));
      engine.synchronize();
      dynamic_cast<NvmeStatePlacement&>(store.placement()).io().inject_fault(fault, 7);
      try {
        engine.optimizer_step(AdamWParams{}, 1.0, 0.0);
        engine.synchronize();
        FAIL("no error");
      } catch (const Error& e) {
        INFO(e.what());
        CHECK(e.exit_code() == 4);
        CHECK(std::string(e.what()).find("/state.") != std::string::npos);
        CHECK(std::string(e.what()).find(fault == IoFault::eio ? "EIO" : "ENOSPC") != std::string::npos);
      }
    }
    CHECK(run_folders(root) == 0);
  }
  // a short transfer is resubmitted for the rest: nothing fails, nothing changes
  Setup s;
  s.state_nvme = true;
  const Result want = run(s);
  setenv("STRATA_IO_FAULT", "short@5", 1);
  const Result got = run(s);
  unsetenv("STRATA_IO_FAULT");
  require_same(got, want);
}

}  // namespace strata
