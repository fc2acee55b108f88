// The repository stands alone: no tracked file may refer to the workspace outside it (the
// "../" + "shared" folder the project was started from). A fresh clone must build, test and be
// read without anything beside it.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "tests/testing.h"

namespace fs = std::filesystem;

namespace {

// The files git tracks in the source tree; outside a git checkout (a source tarball), every file
// below it but the build trees and .git.
std::vector<fs::path> repository_files() {
  const fs::path root = STRATA_SOURCE_DIR;
  std::vector<fs::path> files;
  auto r = strata::testing::run_shell("git -C '" + root.string() + "' ls-files -z", true);
  if (r.code == 0 && !r.out.empty()) {
    std::string name;
    std::istringstream in(r.out);
    while (std::getline(in, name, '\0'))
      if (!name.empty()) files.push_back(root / name);
    return files;
  }
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator(); ++it) {
    const std::string base = it->path().filename().string();
    if (it->is_directory() && (base == ".git" || base.rfind("build", 0) == 0 || base == "out")) {
      it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file()) files.push_back(it->path());
  }
  return files;
}

// "path:line" of the first occurrence of needle in each file that holds it.
std::vector<std::string> references_in(const std::vector<fs::path>& files, const fs::path& root,
                                       const std::string& needle) {
  std::vector<std::string> found;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    REQUIRE(in.good());
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t at = text.find(needle);
    if (at == std::string::npos) continue;
    const size_t line = 1 + size_t(std::count(text.begin(), text.begin() + std::ptrdiff_t(at), '\n'));
    found.push_back(fs::relative(f, root).string() + ":" + std::to_string(line));
  }
  return found;
}

}  // namespace

TEST_CASE("repository: no tracked file refers to the workspace outside the repository", "[repo]") {
  const std::string needle = std::string("..") + "/shared";  // split so this file does not match itself
  const auto files = repository_files();
  REQUIRE(files.size() > 100);  // the scan saw the tree (git or the walk worked)
  const auto offenders = references_in(files, STRATA_SOURCE_DIR, needle);
  INFO("files that refer to " << needle << ": keep what they need inside the repository");
  for (const auto& o : offenders) UNSCOPED_INFO(o);
  CHECK(offenders.empty());
}

TEST_CASE("repository: the scan reports a file that refers outside, with its line", "[repo]") {
  strata::testing::TempDir dir("repo_scan");
  const std::string needle = std::string("..") + "/shared";
  const fs::path bad = dir.file("bad.md", "# title\nsee " + needle + "/DESIGN.md\n");
  const fs::path good = dir.file("good.md", "see docs/ARCHITECTURE.md\n");
  CHECK(references_in({bad, good}, dir.path, needle) == std::vector<std::string>{"bad.md:2"});
}

// ctest registers each test case by name through a CMake list (catch_discover_tests): a name
// with an unbalanced '[' merged the ~190 cases after it into one ctest entry that ran none of them.
TEST_CASE("repository: no test name holds a character that breaks ctest's discovery", "[repo]") {
  const auto& tests = Catch::getRegistryHub().getTestCaseRegistry().getAllTests();
  REQUIRE(tests.size() > 100);
  for (const Catch::TestCase& t : tests) {
    INFO(t.name);
    CHECK(t.name.find_first_of("[]") == std::string::npos);
  }
}
