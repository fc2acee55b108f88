// strata-bench peer: strata against PyTorch on the same model and batches, interleaved. The
// benchmark itself is the committed script tools/bench/peer.py (torch has to run in Python); this
// entry finds it and the strata binary beside strata-bench, and hands over the options.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "src/core/error.h"

namespace strata::bench {

int bench_peer(const std::vector<std::string>& args) {
  namespace fs = std::filesystem;
  for (const auto& a : args)
    if (a == "--help" || a == "-h") {
      std::printf("usage: strata-bench peer [--config quickstart|mid|mid-bf16|all] [--rounds R] [--steps S]\n"
                  "                         [--threads N] [--keep DIR] [--weights auto|stream|device]\n"
                  "Trains the same Llama-family model on the same token rows with PyTorch (Debian's python3-torch:\n"
                  "OpenBLAS, OMP_WAIT_POLICY=PASSIVE, autocast for bf16) and with strata, interleaved over R rounds\n"
                  "(default 3) of S steps (default 6; the first is not timed), and prints tokens/s of each and the\n"
                  "ratio. --weights is strata's offload.weights (default auto: resident when the model fits, as a\n"
                  "user's run would be; stream measures the streaming engine). Needs /usr/bin/python3 with torch\n"
                  "and, for the fast torch, libopenblas0-pthread\n"
                  "(bash scripts/setup.sh --bench). Ends with one JSON line {\"peer\": {\"configs\": [...]}}.\n");
      return 0;
    }
  const fs::path script = fs::path(STRATA_SOURCE_DIR) / "tools/bench/peer.py";
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  const fs::path strata = self.parent_path() / "strata";
  STRATA_CHECK(fs::exists(script, ec), "the peer benchmark script ", script.string(),
               " is missing: run strata-bench from the build of a strata checkout");
  STRATA_CHECK(fs::exists(strata, ec), strata.string(), " is missing: build the strata target first");
  STRATA_CHECK(access("/usr/bin/python3", X_OK) == 0,
               "/usr/bin/python3 is missing: bash scripts/setup.sh --bench installs python3-torch");
  std::vector<std::string> argv_s = {"/usr/bin/python3", script.string(), "--strata", strata.string()};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  execv(argv[0], argv.data());
  STRATA_CHECK(false, "could not run /usr/bin/python3: ", std::strerror(errno));
  return 1;
}

}  // namespace strata::bench
