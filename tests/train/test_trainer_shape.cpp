// The trainer stays readable (issue 11, item 3): train_run is a short loop of named steps and
// no function of the trainer is longer than about 80 lines; recipes/README.md says nothing
// stale (issue 10, item 7).
#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/testing.h"

namespace strata {
namespace {

std::vector<std::string> lines_of(const std::string& rel) {
  std::ifstream in(testing::source_path(rel));
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// Functions defined at column 0 ("... name(...) {" up to the next "}" at column 0), with lengths.
std::vector<std::pair<std::string, size_t>> function_lengths(const std::string& rel) {
  auto lines = lines_of(rel);
  std::vector<std::pair<std::string, size_t>> out;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& l = lines[i];
    if (l.empty() || l[0] == ' ' || l[0] == '/' || l[0] == '#' || l.back() != '{' || l.find('(') == std::string::npos)
      continue;
    size_t j = i + 1;
    while (j < lines.size() && lines[j].rfind("}", 0) != 0) ++j;
    out.emplace_back(l, j - i + 1);
    i = j;
  }
  return out;
}

}  // namespace

TEST_CASE("no trainer function is longer than 80 lines, and train_run reads as its steps", "[train][shape]") {
  size_t functions = 0;
  for (const char* f : {"src/train/trainer.cpp", "src/train/checkpoint.cpp", "src/train/run_dir.cpp",
                        "src/train/progress.cpp", "src/train/signals.cpp"}) {
    for (auto& [name, length] : function_lengths(f)) {
      INFO(f << ": " << name);
      CHECK(length <= 80);
      ++functions;
    }
  }
  CHECK(functions > 30);  // the scan found the functions
  size_t run_lines = 0;
  for (auto& [name, length] : function_lengths("src/train/trainer.cpp"))
    if (name.find("TrainSummary train_run(") == 0) run_lines = length;
  CHECK(run_lines > 0);
  CHECK(run_lines <= 25);
}

TEST_CASE("recipes/README.md has no stale lines", "[recipe][shape]") {
  const std::string text = testing::read_file(testing::source_path("recipes/README.md"));
  CHECK(text.find("not built yet") == std::string::npos);
  CHECK(text.find("land with the CLI issue") == std::string::npos);
  CHECK(text.find("`compute_s`") != std::string::npos);  // the metrics fields are documented
  CHECK(text.find("`d2h_wait_s`") != std::string::npos);
  CHECK(text.find("`optimizer_exposed_s`") != std::string::npos);
}

}  // namespace strata
