// strata: the command-line entry point. Dispatches to a subcommand and maps errors to the
// documented exit codes: 0 done, 2 bad recipe or input, 3 memory budget, 4 I/O error,
// 5 stopped at once by a second signal, 130 interrupted (after saving, once a step has run).
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "src/cli/commands.h"
#include "src/core/error.h"
#include "src/train/distributed.h"

namespace {

constexpr const char* kVersion = "0.1.0";

struct Command {
  const char* name;
  int (*run)(const std::vector<std::string>&);
  const char* help;
};

const Command kCommands[] = {
    {"train", strata::cmd_train, "train a model from a recipe: strata train RECIPE.toml [key=value ...]"},
    {"estimate", strata::cmd_estimate, "will a run fit, where every byte goes, how fast a step is: strata estimate RECIPE.toml|--model DIR [--gpu NAME] [--json]"},
    {"prepare", strata::cmd_prepare, "tokenize a recipe's data once into shards in data.prepared_dir: strata prepare RECIPE.toml [key=value ...]"},
    {"plot", strata::cmd_plot, "draw a run's loss, eval loss and lr as an SVG: strata plot OUTPUT_DIR [--out FILE.svg]"},
    {"grad", strata::cmd_grad, "loss and gradients of one batch: strata grad --model DIR --batch FILE --out GRADS.safetensors"},
    {"zo-probe", strata::cmd_zo_probe, "one zeroth-order perturbation of one batch: strata zo-probe --model DIR --batch FILE --seed S [--eps E] --out Z.safetensors"},
    {"generate", strata::cmd_generate, "text from a model: {\"prompt\"} or {\"messages\"} JSON lines on stdin -> {\"text\", \"tokens\", \"finish_reason\"} lines: strata generate --model DIR [--max-new-tokens N] [--temperature T]"},
    {"tokenize", strata::cmd_tokenize, "{\"text\"} JSON lines on stdin -> {\"ids\"} lines: strata tokenize --tokenizer DIR [--add-special-tokens]"},
    {"detokenize", strata::cmd_detokenize, "{\"ids\"} JSON lines on stdin -> {\"text\"} lines: strata detokenize --tokenizer DIR"},
    {"chat-template", strata::cmd_chat_template, "render chat templates: {\"messages\", \"add_generation_prompt\", \"tools\"} lines -> {\"text\"} lines: strata chat-template --tokenizer DIR"},
};

void print_usage(FILE* f) {
  std::fprintf(f, "strata: fine-tune large language models on one workstation\n\nusage: strata <command> [options]\n\ncommands:\n");
  for (const auto& c : kCommands) std::fprintf(f, "  %-15s %s\n", c.name, c.help);
  std::fprintf(f, "  %-15s %s\n", "--version", "print strata's version and the backends it was built with");
  std::fprintf(f, "\n'strata <command> --help' describes a command's options.\n"
                  "exit codes: 0 done, 2 bad recipe or input, 3 memory budget, 4 I/O error, 5 stopped at once by a "
                  "second signal (earlier checkpoints intact), 130 interrupted (a checkpoint saved once a step has run)\n");
}

void print_version() {
#ifdef STRATA_HAVE_CUDA
  const char* cuda = "CPU and CUDA backends";
#else
  const char* cuda = "CPU backend (built without CUDA)";
#endif
  std::printf("strata %s (%s)\n", kVersion, cuda);
}

// An error message as the terminal should show it: control characters and bytes that are not
// UTF-8 (a binary file named in a message, a path with odd bytes) escaped as \xHH.
std::string printable(const std::string& s) {
  std::string out;
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    bool ok = len > 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) ok = (p[i + k] & 0xc0) == 0x80;
    if (ok && len == 1 && (c < 0x20 || c == 0x7f) && c != '\n' && c != '\t') ok = false;
    if (ok) {
      out.append(s, i, len);
      i += len;
    } else {
      char buf[5];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
      ++i;
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    print_usage(stderr);
    return 2;
  }
  // A file-size limit (ulimit -f) then fails the write with EFBIG, reported like a full disk,
  // instead of killing the process mid-save.
  std::signal(SIGXFSZ, SIG_IGN);
  std::string name = argv[1];
  if (name == "--help" || name == "-h" || name == "help") {
    print_usage(stdout);
    return 0;
  }
  if (name == "--version" || name == "-V" || name == "version") {
    print_version();
    return 0;
  }
  std::vector<std::string> args(argv + 2, argv + argc);
  for (const auto& c : kCommands) {
    if (name != c.name) continue;
    try {
      return c.run(args);
    } catch (const strata::Error& e) {  // under mpirun: "rank R: ", on the rank's own stderr
      std::fprintf(strata::distributed_error_stream(), "strata %s: %serror: %s\n", c.name,
                   strata::distributed_rank_prefix().c_str(), printable(e.what()).c_str());
      return e.exit_code();
    } catch (const std::bad_alloc&) {
      std::fprintf(strata::distributed_error_stream(), "strata %s: %serror: out of host memory\n", c.name,
                   strata::distributed_rank_prefix().c_str());
      return 3;
    }
  }
  std::fprintf(stderr, "strata: unknown command '%s'\n\n", printable(name).c_str());
  print_usage(stderr);
  return 2;
}
