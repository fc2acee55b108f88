// The optimizer state split between RAM and NVMe by group (HostStoreOptions::nvme_first_group,
// offload/state/split_state.h): a split at 1 (embed alone in RAM), in the middle and at the last
// group (the head alone on NVMe) gives the all-RAM run's and the all-NVMe run's losses, master,
// moments and working copy bit for bit (f32 and bf16 compute, f32 and bf16 moments, clipping on
// and off); the store allocates exactly what estimate() and nvme_state_sizes() count (RAM arrays
// for the prefix, files for the NVMe groups alone); values route to the right side; a checkpoint
// saved from a split store has the RAM store's bytes and resumes into another split bit for bit;
// an I/O error on the NVMe part is an I/O error naming the file; a split past the last group is
// refused.
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "offload/engine/engine.h"
#include "offload/state/model_io.h"
#include "offload/state/nvme_state.h"
#include "offload/state/split_state.h"
#include "src/core/error.h"
#include "src/train/checkpoint.h"
#include "tests/seeded_inputs.h"
#include "tests/offload/store_testing.h"
#include "tests/testing.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

constexpr int kRam = -1;  // the split's place: kRam (all in RAM), 0 (all on NVMe), or the first NVMe group
constexpr int64_t kLayers = 8;  // groups: embed, 8 layers, head

std::string nvme_root() { return testing::process_dir("strata_nvme_split"); }

size_t run_folders() {
  size_t n = 0;
  for (auto& e : fs::directory_iterator(nvme_root())) n += e.path().filename().string().rfind("strata-", 0) == 0;
  return n;
}

ModelSpec split_spec(DType dtype, bool tied = false) {
  return model_spec_build(testing::tiny_llama_config({32, 48, kLayers, 300, 64, tied}), dtype);
}

HostStoreOptions split_options(int first, DType moments = DType::f32) {
  HostStoreOptions o;
  o.moments = moments;
  o.state_on_nvme = first != kRam;
  o.nvme_first_group = first == kRam ? 0 : size_t(first);
  o.nvme_path = nvme_root();
  o.nvme_block_bytes = 4096;  // small blocks and chunks: every NVMe group is several ranges
  o.nvme_chunk_bytes = 8192;
  return o;
}

struct Result {
  std::vector<double> losses;
  std::vector<float> master, m, v;
  std::vector<char> working;
};

// Optimizer steps [from, to] on `store` (two accumulation micro-batches each, the second shorter),
// with a fresh engine, as a resumed run sets one up.
void train_steps(Device& dev, HostStore& store, int from, int to, bool clip, Result* r) {
  EngineOptions eo;
  eo.max_batch = 2;
  eo.max_tokens = 17;
  Engine engine(dev, store, eo);
  for (int step = from; step <= to; ++step) {
    const MicroBatch mb0 = testing::state_test_batch(step, 0, 17), mb1 = testing::state_test_batch(step, 1, 13);
    AdamWParams ap;
    ap.lr = 2e-3;
    ap.step = step;
    const float scale = 1.f / float(mb0.counted() + mb1.counted());
    double loss = engine.forward_backward(mb0, scale);
    if (clip) {
      loss += engine.forward_backward(mb1, scale);
      engine.optimizer_step(ap, 0.05, 0.01);  // the norm is well above: clipped
    } else {
      loss += engine.forward_backward_update(mb1, scale, ap, 0.01);
    }
    engine.synchronize();
    r->losses.push_back(loss);
  }
  r->losses.push_back(engine.forward_loss(testing::state_test_batch(9, 0, 17)));  // the last update, seen by a forward
  engine.synchronize();
}

void read_back(HostStore& store, Result* r) {
  r->master = testing::state_array(store, StateArray::master);
  r->m = testing::state_array(store, StateArray::m);
  r->v = testing::state_array(store, StateArray::v);
  const size_t wb = store.working_table().tier_bytes(Tier::host_pinned);
  r->working.assign(store.working(), store.working() + wb);
}

Result run(DType dtype, int first, bool clip, DType moments = DType::f32) {
  auto dev = device_create(DeviceOptions{});
  HostStore store(*dev, split_spec(dtype, !clip), split_options(first, moments));
  model_init_weights(store, 11);
  Result r;
  train_steps(*dev, store, 1, 3, clip, &r);
  read_back(store, &r);
  return r;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

void require_same(const Result& got, const Result& want) {
  REQUIRE(got.losses.size() == want.losses.size());
  for (size_t i = 0; i < want.losses.size(); ++i) CHECK(got.losses[i] == want.losses[i]);
  CHECK(same_bits(got.master, want.master));
  CHECK(same_bits(got.m, want.m));
  CHECK(same_bits(got.v, want.v));
  CHECK(got.working == want.working);
}

size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

std::string bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A checkpoint of `store` at step 2 (two rows in the order 1, 0) under `dir`: its optimizer state's bytes.
std::string save_step2(const HostStore& store, const std::string& dir) {
  TrainState st;
  st.step = 2;
  st.rows = 2;
  st.order = {1, 0};
  checkpoint_save(dir, store, st, "", DType::f32, CheckpointFiles{}, 0);
  return bytes_of(dir + "/checkpoint-2/optimizer_state.safetensors");
}

}  // namespace

TEST_CASE("a RAM/NVMe split of the optimizer state gives the all-RAM and all-NVMe runs bit for bit", "[nvme][split]") {
  const int groups = int(kLayers) + 2;
  for (DType dtype : {DType::bf16, DType::f32})
    for (bool clip : {true, false}) {
      INFO(dtype_name(dtype) << (clip ? " clipped" : " landed updates"));
      const Result want = run(dtype, kRam, clip);
      REQUIRE(want.losses.back() < want.losses.front());  // it trains
      require_same(run(dtype, 0, clip), want);
      for (int first : {1, groups / 2, groups - 1}) {
        INFO("NVMe from group " << first);
        require_same(run(dtype, first, clip), want);
      }
      CHECK(run_folders() == 0);  // every run removed its folder
    }
  // bf16 moments: rounded stochastically by (step, row, element), the same bits on either side
  const Result want = run(DType::bf16, kRam, true, DType::bf16);
  require_same(run(DType::bf16, 4, true, DType::bf16), want);
  require_same(run(DType::bf16, 0, true, DType::bf16), want);
}

TEST_CASE("a split store allocates what estimate() and nvme_state_sizes() count, RAM for the prefix alone",
          "[nvme][split]") {
  auto dev = device_create(DeviceOptions{});
  for (DType dtype : {DType::bf16, DType::f32})
    for (DType moments : {DType::f32, DType::bf16})
      for (int first : {0, 1, 5, int(kLayers) + 1}) {
        INFO(dtype_name(dtype) << " compute, " << dtype_name(moments) << " moments, NVMe from group " << first);
        const ModelSpec spec = split_spec(dtype);
        const HostStoreLayout layout = HostStore::layout(spec);
        const bool f32 = dtype == DType::f32;  // the master is the working copy
        const size_t mb = dtype_size(moments);
        const HostStoreOptions o = split_options(first, moments);
        const size_t prefix = first == 0 ? 0 : layout.groups[size_t(first)].f32_offset;
        CHECK(f32_prefix_bytes(layout, size_t(first)) == prefix);
        CHECK(state_ram_f32_bytes(layout, o) == prefix);
        // counted independently: each NVMe group's span of each array in whole blocks
        size_t files = 0, largest = 0;
        for (size_t g = size_t(first); g < layout.groups.size(); ++g) {
          const size_t b = layout.groups[g].f32_bytes;
          files += (f32 ? 0 : round_up(b, 4096)) + 2 * round_up(b / 4 * mb, 4096);
          largest = std::max(largest, round_up(b, 4096 * (4 / mb)));
        }
        const NvmeStateSizes sizes = nvme_state_sizes(layout, o, !f32);
        CHECK(sizes.file_bytes == files);
        CHECK(sizes.chunk_bytes == std::min(round_up(8192, 4096 * (4 / mb)), largest));
        const HostMemoryEstimate est = HostStore::estimate(spec, o);
        CHECK(est.master == (f32 ? 0 : prefix));
        CHECK(est.moments == 2 * prefix / 4 * mb);
        CHECK(est.nvme == files);
        CHECK(est.nvme_buffers == sizes.host_bytes);
        HostStore store(*dev, spec, o);
        CHECK(store.host_bytes() == est.master + est.moments + est.nvme_buffers);
        CHECK((store.m() != nullptr) == (first > 0));
        CHECK((store.master() != nullptr) == (f32 || first > 0));
        CHECK(store.placement().in_ram(StateArray::master) == f32);
        CHECK_FALSE(store.placement().in_ram(StateArray::m));
        auto* split = dynamic_cast<SplitStatePlacement*>(&store.placement());
        CHECK((split != nullptr) == (first > 0));
        if (split) CHECK(split->first_group() == size_t(first));
        NvmeStatePlacement* nv = state_placement_nvme(store.placement());
        REQUIRE(nv);
        CHECK(nv->sizes().file_bytes == files);
        size_t on_disk = 0, count = 0;  // the files: the NVMe groups' alone, at full size
        for (auto& e : fs::directory_iterator(nv->dir()))
          if (e.path().extension() != ".crc32c") ++count, on_disk += fs::file_size(e.path());
        CHECK(count == (f32 ? 2u : 3u));
        CHECK(on_disk == files);
      }
  // without state_on_nvme the split is ignored: everything in RAM
  HostStoreOptions ram = split_options(kRam);
  ram.nvme_first_group = 5;
  const ModelSpec spec = split_spec(DType::bf16);
  const size_t f32_bytes = HostStore::layout(spec).f32.tier_bytes(Tier::host);
  const HostMemoryEstimate est = HostStore::estimate(spec, ram);
  CHECK(est.master == f32_bytes);
  CHECK(est.moments == 2 * f32_bytes);
  CHECK(est.nvme == 0);
  CHECK(run_folders() == 0);
}

TEST_CASE("a split store routes values to RAM below the split and to NVMe above it", "[nvme][split]") {
  auto dev = device_create(DeviceOptions{});
  const ModelSpec spec = split_spec(DType::bf16);
  HostStore store(*dev, spec, split_options(5));
  const ParamGroup& split_at = store.groups()[5];
  for (size_t row : {size_t(0), split_at.first_row - 1, split_at.first_row, spec.params.size() - 1}) {
    INFO("row " << spec.params[row].name);
    const bool in_ram = row < split_at.first_row;
    const int64_t n = store.f32_table()[row].numel();
    std::vector<float> vals(static_cast<size_t>(n)), back(static_cast<size_t>(n));
    for (size_t i = 0; i < vals.size(); ++i) vals[i] = float(i % 97) * 0.125f - float(row);
    store.set_param(row, vals.data());
    store.get_param(row, back.data());
    CHECK(back == vals);
    store.write_state(StateArray::v, row, 3, 17, vals.data());  // an awkward span
    std::vector<float> span(17);
    store.read_state(StateArray::v, row, 3, 17, span.data());
    CHECK(std::equal(span.begin(), span.end(), vals.begin()));
    if (in_ram) {  // in the store's arrays, at the row's own offset
      const float* ram_v = static_cast<const float*>(store.v()) + store.f32_table()[row].offset / 4 + 3;
      CHECK(std::memcmp(ram_v, vals.data(), 17 * 4) == 0);
      CHECK(std::memcmp(store.master() + store.f32_table()[row].offset / 4, vals.data(), size_t(n) * 4) == 0);
    }
  }
  const NvmeStatePlacement* nv = state_placement_nvme(store.placement());
  const StateIoCounters io = nv->counters();
  CHECK(io.write_bytes > 0);  // the rows above the split went to the files
}

TEST_CASE("a checkpoint of a split store has the RAM store's bytes and resumes into another split bit for bit",
          "[nvme][split][checkpoint]") {
  testing::TempDir tmp("nvme_split_ckpt");
  auto dev = device_create(DeviceOptions{});
  const ModelSpec spec = split_spec(DType::bf16);
  Result want;  // 3 steps, all in RAM
  std::string ram_state;
  {
    HostStore store(*dev, spec, split_options(kRam));
    model_init_weights(store, 11);
    train_steps(*dev, store, 1, 2, true, &want);
    ram_state = save_step2(store, (tmp.path / "ram").string());
    want.losses.clear();
    train_steps(*dev, store, 1, 0, true, &want);  // no step: the forward after step 2
    train_steps(*dev, store, 3, 3, true, &want);
    read_back(store, &want);
  }
  for (auto [save_first, load_first] : {std::pair{5, 2}, std::pair{int(kLayers) + 1, kRam}, std::pair{1, 0}}) {
    INFO("saved with NVMe from group " << save_first << ", resumed with " << load_first);
    const std::string out = (tmp.path / ("split" + std::to_string(save_first))).string();
    Result got;
    {
      HostStore store(*dev, spec, split_options(save_first));
      model_init_weights(store, 11);
      train_steps(*dev, store, 1, 2, true, &got);
      CHECK(save_step2(store, out) == ram_state);
    }
    got.losses.clear();
    HostStore store(*dev, spec, split_options(load_first));
    const TrainState st = checkpoint_load(out + "/checkpoint-2", store);
    CHECK(st.step == 2);
    train_steps(*dev, store, 1, 0, true, &got);
    train_steps(*dev, store, 3, 3, true, &got);
    read_back(store, &got);
    require_same(got, want);
  }
}

TEST_CASE("an I/O error on a split's NVMe part is an I/O error naming the file, and nothing hangs", "[nvme][split]") {
  auto dev = device_create(DeviceOptions{});
  for (IoFault fault : {IoFault::eio, IoFault::enospc}) {
    {
      HostStore store(*dev, split_spec(DType::bf16), split_options(5));
      model_init_weights(store, 1);
      EngineOptions eo;
      eo.max_batch = 2;
      eo.max_tokens = 17;
      Engine engine(*dev, store, eo);
      const MicroBatch mb = testing::state_test_batch(1, 0, 17);
      engine.forward_backward(mb, 1.f / float(mb.counted()));
      engine.synchronize();
      state_placement_nvme(store.placement())->io().inject_fault(fault, 7);
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
    CHECK(run_folders() == 0);
  }
  // a short transfer on the NVMe part is resubmitted for the rest: nothing changes
  const Result want = run(DType::bf16, 5, true);
  setenv("STRATA_IO_FAULT", "short@5", 1);
  const Result got = run(DType::bf16, 5, true);
  unsetenv("STRATA_IO_FAULT");
  require_same(got, want);
}

TEST_CASE("a split past the last group is refused, by the store and by its estimate", "[nvme][split]") {
  auto dev = device_create(DeviceOptions{});
  const ModelSpec spec = split_spec(DType::bf16);
  for (int first : {int(kLayers) + 2, 1000}) {
    INFO("NVMe from group " << first);
    const HostStoreOptions o = split_options(first);
    try {
      HostStore store(*dev, spec, o);
      FAIL("accepted");
    } catch (const Error& e) {
      CHECK(e.exit_code() == 2);
      CHECK_THAT(std::string(e.what()), Catch::Contains("parameter group " + std::to_string(first)) &&
                                            Catch::Contains(std::to_string(kLayers + 2) + " groups"));
    }
    REQUIRE_THROWS_WITH(HostStore::estimate(spec, o), Catch::Contains("parameter group " + std::to_string(first)));
  }
  CHECK(run_folders() == 0);
}

}  // namespace strata
