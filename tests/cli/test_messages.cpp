// Messages and exit codes a new user meets (issue 10, item 7), each as it was seen.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/text_encoder.h"
#include "tests/testing.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using testing::run_strata;

std::string quickstart(const std::string& out, const std::string& extra) {
  return "train " + testing::source_path("recipes/quickstart.toml") + " checkpoint.output_dir=" + out +
         " data.sequence_len=32 device.cpu_threads=2 train.max_steps=1 " + extra;
}

}  // namespace

TEST_CASE("resume of a missing dir says it does not exist (CLI)", "[messages][cli]") {
  testing::TempDir tmp("msg_resume");
  auto r = run_strata(quickstart((tmp.path / "o").string(), "--resume " + (tmp.path / "nope").string()));
  testing::check_run(r, 2, {"no such directory"}, {"COMPLETE"});
}

TEST_CASE("NaN in the loaded weights blames the model file, not the learning rate", "[messages][cli]") {
  testing::TempDir tmp("msg_nan");
  const fs::path model = tmp.path / "model";
  fs::copy(testing::source_path("recipes/sft-tiny/models/tiny"), model);
  {  // the embedding table's first element (BF16) becomes NaN
    std::fstream f(model / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    uint64_t header = 0;
    f.read(reinterpret_cast<char*>(&header), 8);
    std::string text(header, '\0');
    f.read(text.data(), std::streamsize(header));
    const auto j = nlohmann::json::parse(text);
    const uint64_t off = j["model.embed_tokens.weight"]["data_offsets"][0];
    f.seekp(std::streamoff(8 + header + off));
    const unsigned char nan_bf16[2] = {0xc0, 0x7f};
    f.write(reinterpret_cast<const char*>(nan_bf16), 2);
  }
  auto r = run_strata("train " + testing::source_path("recipes/sft-tiny/recipe.toml") + " model.path=" +
                      model.string() + " checkpoint.output_dir=" + (tmp.path / "o").string() + " train.max_steps=1");
  testing::check_run(r, 2, {"holds NaN", "model.embed_tokens.weight"}, {"lower optim.learning_rate", "step 1/"});
}

TEST_CASE("recipe values: NaN is not a number, a bad override blames the command line", "[messages][cli]") {
  testing::TempDir tmp("msg_values");
  auto r = run_strata(quickstart((tmp.path / "o").string(), "optim.learning_rate=nan"));
  testing::check_run(r, 2, {"optim.learning_rate is nan, not a number"});
  r = run_strata(quickstart((tmp.path / "o").string(), "train.micro_batch_size=two"));
  testing::check_run(r, 2, {"command line: train.micro_batch_size must be an integer (it is \"two\")"},
                     {"quickstart.toml:"});
  r = run_strata(quickstart((tmp.path / "o").string(), "train.micro_batch_size=0"));
  testing::check_run(r, 2, {"command line: train.micro_batch_size must be at least 1"});
}

TEST_CASE("missing inputs are exit 2 naming their key", "[messages][cli]") {
  testing::TempDir tmp("msg_missing");
  auto r = run_strata(quickstart((tmp.path / "o").string(), "data.eval_path=" + (tmp.path / "eval.jsonl").string()));
  testing::check_run(r, 2, {"data.eval_path"});
  r = run_strata(quickstart((tmp.path / "o2").string(), "model.config= model.path=" + (tmp.path / "no_model").string()));
  testing::check_run(r, 2, {"model.path", "does not exist"});  // like a missing dataset, not an I/O error
}

TEST_CASE("eval_steps without eval data and a sequence longer than the model's positions warn", "[messages][cli]") {
  testing::TempDir tmp("msg_warn");
  auto r = run_strata(quickstart((tmp.path / "o").string(), "train.eval_steps=1"));
  testing::check_run(r, 0, {"warning: train.eval_steps is 1 but there is no eval data"});
  r = run_strata("train " + testing::source_path("recipes/sft-tiny/recipe.toml") + " checkpoint.output_dir=" +
                 (tmp.path / "o2").string() + " train.max_steps=1 data.sequence_len=4096");
  INFO(r.out);
  CHECK(r.out.find("is longer than the model's max_position_embeddings") != std::string::npos);
}

TEST_CASE("tokenize and detokenize --help work, errors carry one prefix", "[messages][cli]") {
  for (const char* cmd : {"tokenize", "detokenize"}) {
    auto r = run_strata(std::string(cmd) + " --help");
    INFO(r.out);
    CHECK(r.code == 0);
    CHECK(r.out.find(std::string("usage: strata ") + cmd) != std::string::npos);
    r = run_strata(std::string(cmd) + " --bogus");
    CHECK(r.code == 2);
    CHECK(r.out.find(std::string("strata ") + cmd + ": error: unknown argument") != std::string::npos);
    CHECK(r.out.find(std::string("error: strata ") + cmd) == std::string::npos);
  }
}

TEST_CASE("strata --version, and the help lists exit code 5", "[messages][cli]") {
  auto r = run_strata("--version", true);
  CHECK(r.code == 0);
  CHECK(r.out.rfind("strata ", 0) == 0);
  CHECK(r.out.find("backend") != std::string::npos);
  r = run_strata("--help", true);
  CHECK(r.out.find("5 stopped at once") != std::string::npos);
  CHECK(r.out.find("--version") != std::string::npos);
}

TEST_CASE("binary bytes in an error are escaped", "[messages][cli]") {
  auto r = run_strata("train \"$(printf 'bad\\001\\377name.toml')\"");
  testing::check_run(r, 2, {"bad\\x01\\xffname.toml"});
  CHECK(r.out.find('\x01') == std::string::npos);
  CHECK(r.out.find('\xff') == std::string::npos);
}

TEST_CASE("on a terminal only the bar is drawn, and the adamw notice comes before it", "[messages][cli]") {
  testing::TempDir tmp("msg_bar");
  auto r = run_strata("train " + testing::source_path("recipes/quickstart.toml") + " checkpoint.output_dir=" +
                      (tmp.path / "o").string() + " data.sequence_len=32 train.max_steps=3 train.log_steps=1");
  REQUIRE(r.code == 0);
  auto bar = testing::run_shell("STRATA_PROGRESS=bar " + testing::strata_binary() + " train " +
                                testing::source_path("recipes/quickstart.toml") + " checkpoint.output_dir=" +
                                (tmp.path / "b").string() + " data.sequence_len=32 train.max_steps=3 train.log_steps=1");
  INFO(bar.out);
  REQUIRE(bar.code == 0);
  const size_t first_bar = bar.out.find("\r\x1b[2K");
  REQUIRE(first_bar != std::string::npos);
  const size_t notice = bar.out.find("adamw:");
  if (notice != std::string::npos) CHECK(notice < first_bar);
  CHECK(bar.out.find("\nstep 1/3  loss") == std::string::npos);  // no plain lines beside the bar
  CHECK(r.out.find("step 1/3  loss") != std::string::npos);      // not a terminal: plain lines
  CHECK(r.out.find("\x1b[") == std::string::npos);
}

TEST_CASE("a chat model trained with the ChatML fallback exports that template", "[messages][cli]") {
  testing::TempDir tmp("msg_chatml");
  const fs::path model = tmp.path / "model";
  fs::copy(testing::source_path("recipes/sft-tiny/models/tiny"), model);
  auto cfg = nlohmann::json::parse(testing::read_file(model / "tokenizer_config.json"));
  cfg.erase("chat_template");
  std::ofstream(model / "tokenizer_config.json") << cfg.dump(2);
  auto r = run_strata("train " + testing::source_path("recipes/sft-tiny/recipe.toml") + " model.path=" +
                      model.string() + " checkpoint.output_dir=" + (tmp.path / "o").string() + " train.max_steps=1");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("built-in ChatML template") != std::string::npos);
  auto exported = nlohmann::json::parse(testing::read_file(tmp.path / "o/final/tokenizer_config.json"));
  REQUIRE(exported.contains("chat_template"));
  CHECK(exported["chat_template"] == TextEncoder::chatml_source());
  // a model with its own template keeps it
  auto own = run_strata("train " + testing::source_path("recipes/sft-tiny/recipe.toml") + " checkpoint.output_dir=" +
                        (tmp.path / "o2").string() + " train.max_steps=1");
  REQUIRE(own.code == 0);
  CHECK(testing::read_file(tmp.path / "o2/final/tokenizer_config.json") ==
        testing::read_file(testing::source_path("recipes/sft-tiny/models/tiny/tokenizer_config.json")));
}

}  // namespace strata
