// strata-bench peer: strata against today's PyTorch on the same model and batches, interleaved. The
// benchmark itself is the committed script tools/bench/peer.py (torch has to run in Python); this
// entry picks the python that runs it, finds the strata binary beside strata-bench, and hands over
// the options. The python: --torch PYTHON, else the venv `bash scripts/setup.sh --bench` makes
// (.venv-bench/ in the source tree: torch from PyPI's CPU index, transformers), else Debian's
// /usr/bin/python3 (python3-torch 1.13: no torch.compile, no transformers), named as the fallback.
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
  const fs::path venv_python = fs::path(STRATA_SOURCE_DIR) / ".venv-bench/bin/python";
  for (const auto& a : args)
    if (a == "--help" || a == "-h") {
      std::printf(
          "usage: strata-bench peer [--config all|quickstart|mid|mid-bf16|large|large-bf16] [--rounds R] [--steps S]\n"
          "                         [--threads N] [--keep DIR] [--weights auto|stream|device] [--torch PYTHON]\n"
          "                         [--forms eager,compile,transformers] [--profile]\n"
          "Trains the same Llama-family model on the same token rows with strata and with PyTorch in three forms\n"
          "(eager with scaled_dot_product_attention, torch.compile'd regions, transformers' LlamaForCausalLM;\n"
          "autocast for bf16; AdamW(fused=True)), interleaved over R rounds (default 3) of S steps (default 6;\n"
          "the first is not timed, nor torch.compile's warm-up), and prints tokens/s of each and the ratio\n"
          "strata / fastest torch form, with strata's MFU against the GEMM peak its run measured. --profile\n"
          "adds each side's time per op. --weights is strata's offload.weights (default auto).\n"
          "--torch: the python with torch (default %s, made by bash scripts/setup.sh --bench;\n"
          "else /usr/bin/python3 with Debian's torch, named in the output as the fallback).\n"
          "Ends with one JSON line {\"peer\": {\"versions\": ..., \"cpu\": ..., \"configs\": [...]}}.\n",
          venv_python.c_str());
      return 0;
    }
  std::string python, origin;
  std::vector<std::string> rest;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--torch") {
      STRATA_CHECK(i + 1 < args.size(), "--torch needs a python: strata-bench peer --torch /path/to/venv/bin/python");
      python = args[++i];
      origin = "given with --torch";
    } else if (args[i].rfind("--torch=", 0) == 0) {
      python = args[i].substr(8);
      origin = "given with --torch";
    } else {
      rest.push_back(args[i]);
    }
  }
  if (python.empty() && access(venv_python.c_str(), X_OK) == 0) {
    python = venv_python.string();
    origin = "the venv of scripts/setup.sh --bench";
  }
  if (python.empty()) {
    python = "/usr/bin/python3";
    origin = "FALLBACK: Debian's python3; bash scripts/setup.sh --bench makes the venv with PyPI's torch";
    std::fprintf(stderr, "strata-bench peer: no %s: falling back to %s (Debian's torch 1.13 is not today's\n"
                 "PyTorch; bash scripts/setup.sh --bench makes the venv)\n", venv_python.c_str(), python.c_str());
  }
  const fs::path script = fs::path(STRATA_SOURCE_DIR) / "tools/bench/peer.py";
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  const fs::path strata = self.parent_path() / "strata";
  STRATA_CHECK(fs::exists(script, ec), "the peer benchmark script ", script.string(),
               " is missing: run strata-bench from the build of a strata checkout");
  STRATA_CHECK(fs::exists(strata, ec), strata.string(), " is missing: build the strata target first");
  STRATA_CHECK(access(python.c_str(), X_OK) == 0, python,
               " is not an executable python: bash scripts/setup.sh --bench makes one, or name one with --torch");
  std::vector<std::string> argv_s = {python, script.string(), "--strata", strata.string(), "--torch-origin", origin};
  argv_s.insert(argv_s.end(), rest.begin(), rest.end());
  std::vector<char*> argv;
  for (auto& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  execv(argv[0], argv.data());
  STRATA_CHECK(false, "could not run ", python, ": ", std::strerror(errno));
  return 1;
}

}  // namespace strata::bench
