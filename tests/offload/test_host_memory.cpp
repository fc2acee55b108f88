// Host memory: the estimate of every host tier (hand-worked, and equal to what the store
// allocates), the host budget check (exit code 3, a message with the bytes per tier and what
// would move to NVMe), and the fallback to pageable memory when pinning fails (one warning
// stating the cost, the bytes counted as host, results unchanged).
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "offload/host_budget.h"
#include "offload/model_io.h"
#include "src/recipe/recipe.h"
#include "src/core/error.h"

namespace strata {
namespace {

// Every tensor a multiple of 256 bytes in both tables, so no alignment padding: C 64, kv 2 x 16,
// F 128, V 256. Matrices 4096 (q, o), 2048 (k, v), 8192 (gate, up, down) elements; 256 x 64 for
// embed and lm_head; norms 64 floats.
ModelSpec budget_spec(bool tied) {
  nlohmann::json j = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"},
                      {"hidden_size", 64}, {"intermediate_size", 128}, {"num_hidden_layers", 3},
                      {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"vocab_size", 256},
                      {"max_position_embeddings", 256}, {"tie_word_embeddings", tied}};
  return model_spec_build(hf_config_parse(j.dump(), "test config"), DType::bf16);
}

EngineOptions budget_engine(const std::string& checkpoints) {
  EngineOptions eo;
  eo.weights = "stream";
  eo.checkpoints = checkpoints;
  eo.max_batch = 2;
  eo.max_tokens = 16;
  return eo;
}

// Captures what is written to file descriptor 2 while it lives.
class StderrCapture {
 public:
  StderrCapture() {
    std::fflush(stderr);
    saved_ = dup(2);
    file_ = std::tmpfile();
    dup2(fileno(file_), 2);
  }
  std::string finish() {
    std::fflush(stderr);
    dup2(saved_, 2);
    close(saved_);
    saved_ = -1;
    std::rewind(file_);
    std::string text;
    char buf[4096];
    size_t got;
    while ((got = std::fread(buf, 1, sizeof buf, file_)) > 0) text.append(buf, got);
    std::fclose(file_);
    file_ = nullptr;
    return text;
  }
  ~StderrCapture() {
    if (saved_ >= 0) finish();
  }

 private:
  int saved_ = -1;
  FILE* file_ = nullptr;
};

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("the host memory estimate is hand-worked and matches what the store allocates", "[host-budget]") {
  for (bool tied : {false, true}) {
    INFO((tied ? "tied" : "untied"));
    const ModelSpec spec = budget_spec(tied);
    // per layer: 2 x 4096 + 2 x 2048 + 3 x 8192 matrix elements, 2 x 64 norm floats
    const size_t layer_matrix = 2 * 4096 + 2 * 2048 + 3 * 8192, layer_norm = 2 * 64;
    const size_t matrix = 3 * layer_matrix + (tied ? 1 : 2) * 256 * 64, norm = 3 * layer_norm + 64;
    REQUIRE(size_t(spec.parameter_count()) == matrix + norm);
    const HostMemoryEstimate store = HostStore::estimate(spec, HostStoreOptions{});
    CHECK(store.working == matrix * 2 + norm * 4);  // bf16 matrices, f32 norms
    CHECK(store.master == (matrix + norm) * 4);
    CHECK(store.moments == (matrix + norm) * 8);
    CHECK(store.grads == (matrix + norm) * 4);
    CHECK(store.staging == 0);
    CHECK(HostStore::estimate(spec, HostStoreOptions{DType::bf16}).moments == (matrix + norm) * 4);

    const HostMemoryEstimate all = host_memory_estimate(spec, HostStoreOptions{}, budget_engine("host"));
    const size_t act = 2 * 16 * 64 * 4, layer_grad = (layer_matrix + layer_norm) * 4;
    // x0, dx0, two layer gradient stagings, the final norm gradient, one lm_head gradient chunk
    // (all 256 rows: one chunk, so one slot)
    CHECK(all.staging == 2 * act + 2 * layer_grad + 64 * 4 + 256 * 64 * 4);
    EngineOptions small_chunks = budget_engine("host");
    small_chunks.head_chunk_rows = 100;  // chunks of 100, 100, 56 rows: two slots of 100
    CHECK(host_memory_estimate(spec, HostStoreOptions{}, small_chunks).staging ==
          2 * act + 2 * layer_grad + 64 * 4 + 2 * 100 * 64 * 4);
    CHECK(all.checkpoints == 3 * act);
    CHECK(host_memory_estimate(spec, HostStoreOptions{}, budget_engine("device")).checkpoints == 0);
    CHECK(all.total() == store.total() + all.staging + all.checkpoints);

    auto dev = device_create(DeviceOptions{});
    HostStore hs(*dev, spec);
    CHECK(hs.pinned_bytes() == store.working + store.grads);
    CHECK(hs.host_bytes() == store.master + store.moments);
    Engine engine(*dev, hs, budget_engine("host"));  // asserts its staging equals the estimate
  }
}

TEST_CASE("a host budget that is exceeded is an error before allocating, with the bytes per tier", "[host-budget]") {
  const ModelSpec spec = budget_spec(false);
  const HostMemoryEstimate e = host_memory_estimate(spec, HostStoreOptions{}, budget_engine("auto"));
  HostBudget budget{e.total() - 1, "offload.host_memory = \"test\""};
  try {
    host_budget_check(spec, HostStoreOptions{}, budget_engine("auto"), budget);
    FAIL("no error for a budget one byte short");
  } catch (const Error& err) {
    const std::string msg = err.what();
    INFO(msg);
    CHECK(err.kind() == ErrorKind::budget);
    CHECK(err.exit_code() == 3);
    CHECK(msg.find(format_bytes(e.total())) != std::string::npos);
    CHECK(msg.find(format_bytes(budget.bytes)) != std::string::npos);
    CHECK(msg.find("offload.host_memory = \"test\"") != std::string::npos);
    for (const char* tier : {"working weights (pinned, bf16)", "master weights (fp32)", "AdamW moments (f32 m and v)",
                             "gradients (pinned, fp32)", "staging (pinned)", "spilled checkpoints (pinned)"})
      CHECK(msg.find(tier) != std::string::npos);
    CHECK(msg.find("Move the optimizer moments (" + format_bytes(e.moments) + ") and master weights (" +
                   format_bytes(e.master) + ") to NVMe with offload.optimizer = \"nvme\"") != std::string::npos);
    CHECK(msg.find("raise offload.host_memory") != std::string::npos);
  }
  budget.bytes = e.total();
  CHECK_NOTHROW(host_budget_check(spec, HostStoreOptions{}, budget_engine("auto"), budget));
  budget.bytes = 0;  // unknown: nothing to check against
  CHECK_NOTHROW(host_budget_check(spec, HostStoreOptions{}, budget_engine("auto"), budget));
}

TEST_CASE("the host budget comes from offload.host_memory, else from MemAvailable", "[host-budget]") {
  const Recipe rc = recipe_parse("[model]\nconfig = \"c.json\"\n[data]\npath = \"d.txt\"\n[train]\nmax_steps = 1\n",
                                 "test.toml", {"offload.host_memory=24GiB"});
  const HostBudget set = host_memory_budget(rc.host_memory_bytes, rc.host_memory);
  CHECK(set.bytes == (size_t(24) << 30));
  CHECK(set.origin == "offload.host_memory = \"24GiB\"");
  // parsed when the recipe loads: a bad size stops there, naming the key
  CHECK_THROWS_WITH(recipe_parse("[model]\nconfig = \"c.json\"\n[data]\npath = \"d.txt\"\n[train]\nmax_steps = 1\n",
                                 "test.toml", {"offload.host_memory=lots"}),
                    Catch::Contains("offload.host_memory") && Catch::Contains("is not a size"));
  // MemAvailable as /proc/meminfo states it (kB meaning KiB)
  std::ifstream f("/proc/meminfo");
  std::string line;
  size_t kib = 0;
  while (std::getline(f, line))
    if (line.rfind("MemAvailable:", 0) == 0) kib = std::stoull(line.substr(13));
  REQUIRE(kib > 0);
  const HostBudget unset = host_memory_budget(0, "");
  CHECK(unset.origin.find("MemAvailable") != std::string::npos);
  // the machine's free memory moves between the two reads: within 1 GiB
  CHECK(std::llabs((long long)unset.bytes - (long long)(kib * 1024)) < (1ll << 30));
}

TEST_CASE("a failed pinned allocation falls back to pageable memory with one warning, counted as host", "[pinned]") {
  const ModelSpec spec = budget_spec(true);
  const HostMemoryEstimate e = host_memory_estimate(spec, HostStoreOptions{}, budget_engine("host"));
  MicroBatch mb;
  mb.B = 2;
  mb.T = 16;
  for (int i = 0; i < 32; ++i) {
    mb.ids.push_back((i * 37) % 256);
    mb.targets.push_back(i % 16 == 15 ? -100 : ((i + 1) * 37) % 256);
    mb.pos.push_back(i % 16);
  }
  auto run = [&](bool fail, std::string* warning, size_t* pinned, size_t* host, size_t* fallback) {
    if (fail) setenv("STRATA_FAKE_PINNED_FAIL", "1", 1);
    StderrCapture capture;
    auto dev = device_create(DeviceOptions{});
    unsetenv("STRATA_FAKE_PINNED_FAIL");  // read once, when the device is made
    std::vector<float> grads;
    double loss;
    {
      HostStore store(*dev, spec);
      model_init_weights(store, 5);
      Engine engine(*dev, store, budget_engine("host"));
      loss = engine.forward_backward(mb, 1.f / float(mb.counted()));
      engine.synchronize();
      grads.assign(store.grad(), store.grad() + store.f32_floats());
      *pinned = store.pinned_bytes();
      *host = store.host_bytes();
      *fallback = dev->pageable_fallback_bytes();
    }
    CHECK(dev->pageable_fallback_bytes() == 0);  // all freed
    *warning = capture.finish();
    return std::make_pair(loss, grads);
  };
  std::string warn_pinned, warn_fallback;
  size_t pinned = 0, host = 0, fallback = 0;
  const auto normal = run(false, &warn_pinned, &pinned, &host, &fallback);
  CHECK(pinned == e.working + e.grads);
  CHECK(host == e.master + e.moments);
  CHECK(fallback == 0);
  CHECK(warn_pinned.find("pageable") == std::string::npos);

  const auto fell_back = run(true, &warn_fallback, &pinned, &host, &fallback);
  INFO(warn_fallback);
  CHECK(pinned == 0);
  CHECK(host == e.working + e.grads + e.master + e.moments);
  // the store's two arrays, the engine's staging and its spilled checkpoints
  CHECK(fallback == e.working + e.grads + e.staging + e.checkpoints);
  CHECK(count_of(warn_fallback, "warning: cannot pin") == 1);  // said once, not per allocation
  CHECK(warn_fallback.find("cannot pin " + format_bytes(e.working) + " of host memory") != std::string::npos);
  CHECK(warn_fallback.find("about half the bandwidth") != std::string::npos);
  CHECK(warn_fallback.find("block the host thread") != std::string::npos);
  // the memory is slower, not different: the same results to the bit
  CHECK(std::memcmp(&normal.first, &fell_back.first, sizeof(double)) == 0);
  CHECK(std::memcmp(normal.second.data(), fell_back.second.data(), normal.second.size() * 4) == 0);
}

}  // namespace strata
