// Recipes (strict schema, nearest-key suggestions, overrides), packing of documents into rows,
// CPU AdamW against its fp64 reference, and the learning-rate schedule.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "io/token_rows.h"
#include "offload/state/adamw.h"
#include "src/core/error.h"
#include "src/recipe/recipe.h"
#include "src/train/trainer.h"
#include "tests/testing.h"

namespace strata {

static const char* kRecipe = R"(
[model]
config = "m/config.json"
[data]
path = "d/corpus.txt"
sequence_len = 64
[train]
max_steps = 6
[optim]
learning_rate = 1e-5
)";

TEST_CASE("recipe keys parse, paths resolve against the recipe's folder, overrides apply", "[recipe]") {
  Recipe r = recipe_parse(kRecipe, "/tmp/r/x.toml", {"train.max_steps=9", "optim.lr_scheduler_type=linear"});
  CHECK(r.max_steps == 9);
  CHECK(r.learning_rate == Approx(1e-5));
  CHECK(r.lr_scheduler_type == "linear");
  CHECK(r.model_config == "/tmp/r/m/config.json");
  CHECK(r.data_path == "/tmp/r/d/corpus.txt");
  CHECK(r.micro_batch_size == 1);  // default
  Recipe again = recipe_parse(r.to_toml(), "/elsewhere/y.toml", {});
  CHECK(again.max_steps == 9);
  CHECK(again.data_path == r.data_path);  // absolute paths survive the round trip
}

TEST_CASE("a misspelt recipe key is an error naming the closest valid key", "[recipe]") {
  std::string text = std::string(kRecipe) + "[checkpoint]\nouput_dir = \"o\"\n";
  try {
    recipe_parse(text, "r.toml", {});
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::input);
    CHECK(std::string(e.what()).find("checkpoint.output_dir") != std::string::npos);
  }
  try {
    recipe_parse(kRecipe, "r.toml", {"train.learning_rate=1"});
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("optim.learning_rate") != std::string::npos);
  }
  CHECK_THROWS_AS(recipe_parse(kRecipe, "r.toml", {"train.max_steps=many"}), Error);
  CHECK_THROWS_AS(recipe_parse(kRecipe, "r.toml", {"train.max_steps"}), Error);
  CHECK_THROWS_AS(recipe_parse("[data\n", "r.toml", {}), Error);
  CHECK_THROWS_AS(recipe_parse(kRecipe, "r.toml", {"optim.adam_beta2=1.5"}), Error);
}

TEST_CASE("packing cuts documents into full rows with restarting positions and no cross-document targets", "[data]") {
  std::vector<Document> docs = {{1, 2, 3}, {4, 5}, {6, 7, 8, 9, 10}};
  TokenRows r = pack_documents(docs, 4, true);
  REQUIRE(r.rows() == 2);  // 10 tokens -> 2 full rows, the rest dropped
  CHECK(r.ids == std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8});
  CHECK(r.targets == std::vector<int32_t>{2, 3, -100, -100, -100, 7, 8, -100});
  CHECK(r.pos == std::vector<int32_t>{0, 1, 2, 0, 0, 0, 1, 2});  // 5 continues its document in a new row: positions restart
  CHECK(r.doc_start == std::vector<int32_t>{0, 0, 0, 3, 0, 1, 1, 1});

  TokenRows u = pack_documents(docs, 4, false);
  REQUIRE(u.rows() == 3);
  CHECK(std::vector<int32_t>(u.ids.begin() + 4, u.ids.begin() + 8) == std::vector<int32_t>{4, 5, 0, 0});
  CHECK(std::vector<int32_t>(u.targets.begin() + 4, u.targets.begin() + 8) == std::vector<int32_t>{5, -100, -100, -100});
  CHECK(std::vector<int32_t>(u.targets.begin() + 8, u.targets.end()) == std::vector<int32_t>{7, 8, 9, -100});
}

TEST_CASE("datasets: bad lines name the line, a too-small dataset says what to do", "[data]") {
  auto dir = std::filesystem::temp_directory_path() / "strata_test_data";
  std::filesystem::create_directories(dir);
  {
    std::ofstream(dir / "bad.jsonl") << "{\"text\": \"ok\"}\n{\"text\": oops}\n";
    std::ofstream(dir / "tiny.txt") << "hi\n";
  }
  try {
    dataset_read_documents((dir / "bad.jsonl").string(), "auto");
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("bad.jsonl:2") != std::string::npos);
  }
  auto docs = dataset_read_documents((dir / "tiny.txt").string(), "auto");
  CHECK_THROWS_AS(pack_documents(docs, 64, true), Error);
  CHECK_THROWS_AS(dataset_read_documents((dir / "missing.txt").string(), "auto"), Error);
}

TEST_CASE("CPU AdamW matches the fp64 reference element-wise at odd sizes", "[optim]") {
  for (int64_t n : {1, 15, 17, 4097}) {
    auto g0 = testing::random_floats(size_t(n), 1 + uint64_t(n));
    auto p0 = testing::random_floats(size_t(n), 2 + uint64_t(n));
    std::vector<float> p = p0, m(size_t(n), 0.f), v(size_t(n), 0.f);
    std::vector<float> working(size_t(n), 0.f);
    std::vector<double> pd(p0.begin(), p0.end()), md(size_t(n), 0.0), vd(size_t(n), 0.0);
    AdamWParams ap;
    ap.lr = 1e-2f;
    ap.weight_decay = 0.1f;
    ap.clip_scale = 0.5f;
    for (int64_t step = 1; step <= 5; ++step) {
      ap.step = step;
      std::vector<float> g = g0;
      for (auto& x : g) x *= float(step);  // a gradient that changes over steps
      std::vector<double> gd(g.begin(), g.end());
      adamw_update(p.data(), m.data(), v.data(), g.data(), working.data(), DType::f32, n, ap);
      adamw_update_ref(pd.data(), md.data(), vd.data(), gd.data(), n, ap);
    }
    // f32 vs fp64 over 5 steps: relative to the parameter scale
    CHECK(testing::max_rel_error(p, pd) < 2e-6);
    CHECK(testing::max_rel_error(m, md) < 2e-6);
    CHECK(testing::max_rel_error(v, vd) < 2e-6);
    CHECK(working == p);
  }
}

TEST_CASE("learning-rate schedules follow the Hugging Face shapes", "[optim]") {
  CHECK(lr_schedule(LrSchedule::cosine, 0, 100, 10, 0.0) == 0.0);
  CHECK(lr_schedule(LrSchedule::cosine, 5, 100, 10, 0.0) == Approx(0.5));
  CHECK(lr_schedule(LrSchedule::cosine, 10, 100, 10, 0.0) == Approx(1.0));
  CHECK(lr_schedule(LrSchedule::cosine, 55, 100, 10, 0.0) == Approx(0.5));
  CHECK(lr_schedule(LrSchedule::cosine, 100, 100, 10, 0.1) == Approx(0.1));
  CHECK(lr_schedule(LrSchedule::linear, 55, 100, 10, 0.0) == Approx(0.5));
  CHECK(lr_schedule(LrSchedule::constant, 90, 100, 10, 0.0) == 1.0);
}

}  // namespace strata

namespace strata {

TEST_CASE("distributed.shared_host_store takes auto, true or false, ranks_per_node >= 0", "[recipe]") {
  CHECK(recipe_parse(kRecipe, "r.toml", {}).distributed_shared_host_store == "auto");  // the default
  CHECK(recipe_parse(kRecipe, "r.toml", {}).distributed_ranks_per_node == 0);
  for (const char* v : {"true", "false", "\"true\"", "\"false\"", "auto", "\"auto\""}) {
    INFO(v);
    const Recipe r = recipe_parse(kRecipe, "r.toml", {std::string("distributed.shared_host_store=") + v});
    std::string want = v;
    want.erase(std::remove(want.begin(), want.end(), '"'), want.end());
    CHECK(r.distributed_shared_host_store == want);
    CHECK(recipe_parse(r.to_toml(), "r.toml", {}).distributed_shared_host_store == want);  // round trip
  }
  const Recipe in_file = recipe_parse(std::string(kRecipe) + "[distributed]\nshared_host_store = false\n"
                                      "ranks_per_node = 2\n", "r.toml", {});
  CHECK(in_file.distributed_shared_host_store == "false");
  CHECK(in_file.distributed_ranks_per_node == 2);
  CHECK_THROWS_WITH(recipe_parse(kRecipe, "r.toml", {"distributed.shared_host_store=maybe"}),
                    Catch::Contains("must be \"auto\", true or false"));
  CHECK_THROWS_WITH(recipe_parse(kRecipe, "r.toml", {"distributed.shared_host_store=1"}),
                    Catch::Contains("must be a string"));
  CHECK_THROWS_WITH(recipe_parse(kRecipe, "r.toml", {"distributed.ranks_per_node=-1"}),
                    Catch::Contains("distributed.ranks_per_node must be >= 0"));
}

TEST_CASE("every recipe key is documented in recipes/README.md", "[recipe]") {
  const std::string doc = testing::read_file(testing::source_path("recipes/README.md"));
  for (const auto& k : recipe_schema()) {
    INFO(k.name);
    CHECK(doc.find(std::string("`") + k.name + "`") != std::string::npos);
  }
}

}  // namespace strata
