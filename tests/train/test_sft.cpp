// SFT end to end through the strata binary, on the bundled tiny chat model
// (recipes/sft-tiny): the contract recipe as written, its output layout, a model that learns,
// eval loss, `strata prepare` shards giving the same run, resume from the CLI, and bad data.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/chat_template.h"
#include "io/safetensors.h"
#include "io/tokenizer/tokenizer.h"
#include "tests/testing.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

using Run = testing::ProcessResult;
Run strata(const std::string& args) { return testing::run_strata(args); }

std::string fresh(const char* name) {
  const std::string d = testing::fresh_path("strata_sft", name);
  fs::create_directories(d);
  return d;
}

const std::string kRecipe = testing::source_path("recipes/sft-tiny/recipe.toml");

struct Metrics {
  std::vector<double> loss, eval_loss;
  std::vector<int64_t> loss_tokens;
};

Metrics read_metrics(const std::string& out) {
  Metrics m;
  std::ifstream in(out + "/metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) {
      m.loss.push_back(j["loss"].get<double>());
      m.loss_tokens.push_back(j["loss_tokens"].get<int64_t>());
    }
    if (j.contains("eval_loss")) m.eval_loss.push_back(j["eval_loss"].get<double>());
  }
  return m;
}

}  // namespace

TEST_CASE("the SFT contract recipe runs as written and lays out checkpoints and exports", "[sft][cli]") {
  const std::string out = fresh("contract");
  Run r = strata("train " + kRecipe + " checkpoint.output_dir=" + out);
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("(messages)") != std::string::npos);  // the format was auto-detected
  Metrics m = read_metrics(out);
  REQUIRE(m.loss.size() == 6);
  CHECK(m.loss.back() < m.loss.front());
  // assistant-only loss: far fewer labelled tokens than the 2 x 2 x 256 tokens of a step
  for (int64_t t : m.loss_tokens) {
    CHECK(t > 0);
    CHECK(t < 2 * 2 * 256 / 2);
  }
  for (const char* ck : {"checkpoint-3", "checkpoint-6", "final"}) {
    const std::string hf = out + "/" + ck + (std::string(ck) == "final" ? "" : "/hf");
    INFO(hf);
    for (const char* f : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"})
      CHECK(fs::exists(hf + "/" + f));
  }
  CHECK(fs::exists(out + "/checkpoint-6/COMPLETE"));

  // the export is a model dir other tools load: weights bf16 by default, the tokenizer and
  // chat template as they came
  SafetensorsDir st = SafetensorsDir::open(out + "/final");
  CHECK(st.find("model.embed_tokens.weight")->dtype == DType::bf16);
  const std::string model = testing::source_path("recipes/sft-tiny/models/tiny");
  Tokenizer a = Tokenizer::load(model), b = Tokenizer::load(out + "/final");
  CHECK(a.encode("What is the capital of France?") == b.encode("What is the capital of France?"));
  nlohmann::json msgs = nlohmann::json::parse(R"([{"role":"user","content":"hi"}])");
  CHECK(ChatTemplate::load(model).render(msgs, true) == ChatTemplate::load(out + "/final").render(msgs, true));

  SECTION("--resume auto continues from checkpoint-6") {
    Run more = strata("train " + kRecipe + " checkpoint.output_dir=" + out + " train.max_steps=9 --resume auto");
    INFO(more.out);
    REQUIRE(more.code == 0);
    CHECK(more.out.find("resumed from " + out + "/checkpoint-6 at step 6 of 9") != std::string::npos);
    Metrics after = read_metrics(out);
    CHECK(after.loss.size() == 9);
    for (size_t i = 0; i < 6; ++i) CHECK(after.loss[i] == m.loss[i]);
  }
}

TEST_CASE("SFT on the tiny chat model learns, with eval loss on a held-out split", "[sft][cli]") {
  const std::string out = fresh("learn");
  Run r = strata("train " + kRecipe + " checkpoint.output_dir=" + out +
                 " train.max_steps=60 checkpoint.save_steps=0 data.eval_split=0.05 train.eval_steps=30");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("15 of 300 samples held out") != std::string::npos);
  Metrics m = read_metrics(out);
  REQUIRE(m.loss.size() == 60);
  REQUIRE(m.eval_loss.size() == 2);  // steps 30 and 60
  CHECK(m.loss.front() > 6.0);       // ~log(640) = 6.46 at init
  CHECK(m.loss.back() < m.loss.front() - 1.5);  // a clear fall, not noise
  CHECK(m.eval_loss[1] < m.eval_loss[0]);
  CHECK(m.eval_loss[1] < m.loss.front() - 1.0);
  Run plot = strata("plot " + out);
  CHECK(plot.code == 0);
  CHECK(fs::file_size(out + "/plot.svg") > 1000);
}

TEST_CASE("training from `strata prepare` shards equals training from the JSONL", "[sft][cli]") {
  const std::string out = fresh("prepared"), direct = fresh("direct");
  Run p = strata("prepare " + kRecipe + " data.prepared_dir=" + out + "/shards");
  INFO(p.out);
  REQUIRE(p.code == 0);
  Run a = strata("train " + kRecipe + " checkpoint.output_dir=" + out + " data.prepared_dir=" + out + "/shards");
  Run b = strata("train " + kRecipe + " checkpoint.output_dir=" + direct);
  INFO(a.out);
  REQUIRE(a.code == 0);
  REQUIRE(b.code == 0);
  CHECK(a.out.find("tokenizing") == std::string::npos);  // the shards were read, not the JSONL
  CHECK(read_metrics(out).loss == read_metrics(direct).loss);

  // shards made for other settings are refused, and say how to fix it
  Run stale = strata("train " + kRecipe + " checkpoint.output_dir=" + out + " data.prepared_dir=" + out +
                     "/shards data.train_on=all --overwrite");
  CHECK(stale.code == 2);
  CHECK(stale.out.find("strata prepare") != std::string::npos);
}

TEST_CASE("a chat dataset with a broken line stops with file:line, or is skipped and counted", "[sft][cli]") {
  const std::string out = fresh("broken");
  const std::string data = out + "/chat.jsonl";
  {
    std::ifstream in(testing::source_path("recipes/sft-tiny/data/chat.jsonl"));
    std::ofstream o(data);
    std::string line;
    for (int i = 0; std::getline(in, line); ++i) {
      o << line << "\n";
      if (i == 4) o << "{\"messages\": [{\"role\": \"user\", \"content\": \"unterminated\"\n";
    }
  }
  Run r = strata("train " + kRecipe + " checkpoint.output_dir=" + out + "/run data.path=" + data);
  INFO(r.out);
  CHECK(r.code == 2);
  CHECK(r.out.find(data + ":6") != std::string::npos);
  CHECK(r.out.find("step 1/") == std::string::npos);

  Run skip = strata("train " + kRecipe + " checkpoint.output_dir=" + out + "/run data.path=" + data +
                    " data.skip_bad_lines=true train.max_steps=1");
  INFO(skip.out);
  CHECK(skip.code == 0);
  CHECK(skip.out.find("skipped 1 bad line") != std::string::npos);
}

}  // namespace strata
