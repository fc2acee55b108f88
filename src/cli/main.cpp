// strata: the command-line entry point. Dispatches to a subcommand and maps errors to the
// documented exit codes: 0 done, 1 an unexpected failure (a bug), 2 bad recipe or input,
// 3 memory budget (also host memory, threads or address space exhausted), 4 I/O error,
// 5 stopped at once by a second signal, 130 interrupted (after saving, once a step has run).
// Whatever a command throws, on any thread (a device stream or the host queue hands its task's
// failure to the thread that waits on it), ends here as one line and an exit code; an exception
// that cannot travel (out of an OpenMP region, a destructor) is reported by the terminate handler
// the same way.
#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <ios>
#include <new>
#include <string>
#include <system_error>
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
    {"quantize", strata::cmd_quantize, "a model dir as transformers saves a bitsandbytes 4-bit NF4 model: strata quantize --model DIR --out DIR2 [--no-double-quant]"},
    {"tokenize", strata::cmd_tokenize, "{\"text\"} JSON lines on stdin -> {\"ids\"} lines: strata tokenize --tokenizer DIR [--add-special-tokens]"},
    {"detokenize", strata::cmd_detokenize, "{\"ids\"} JSON lines on stdin -> {\"text\"} lines: strata detokenize --tokenizer DIR"},
    {"chat-template", strata::cmd_chat_template, "render chat templates: {\"messages\", \"add_generation_prompt\", \"tools\"} lines -> {\"text\"} lines: strata chat-template --tokenizer DIR"},
};

void print_usage(FILE* f) {
  std::fprintf(f, "strata: fine-tune large language models on one workstation\n\nusage: strata <command> [options]\n\ncommands:\n");
  for (const auto& c : kCommands) std::fprintf(f, "  %-15s %s\n", c.name, c.help);
  std::fprintf(f, "  %-15s %s\n", "--version", "print strata's version and the backends it was built with");
  std::fprintf(f, "\n'strata <command> --help' describes a command's options.\n"
                  "exit codes: 0 done, 1 an unexpected failure (a bug: please report it), 2 bad recipe or input, 3 memory "
                  "budget (or host memory, threads, address space exhausted), 4 I/O error, 5 stopped at once by a "
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

// An exception as the user's line and exit code: strata::Error by its kind; a failed allocation
// and a thread the OS would not create (EAGAIN: ulimit -u or -v) are memory (3); a file-system
// or stream error is I/O (4); anything else is a failure strata did not expect (1).
struct Failure {
  int code = 1;
  std::string message;
};

Failure failure_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const strata::Error& x) {
    return {x.exit_code(), x.what()};
  } catch (const std::bad_alloc&) {
    return {3, "out of host memory (or of address space: ulimit -v); lower the memory the recipe needs (a smaller "
               "model, micro_batch_size or sequence_len), or device.cpu_threads"};
  } catch (const std::filesystem::filesystem_error& x) {
    return {4, x.what()};
  } catch (const std::ios_base::failure& x) {
    return {4, x.what()};
  } catch (const std::system_error& x) {
    if (x.code() == std::errc::resource_unavailable_try_again || x.code() == std::errc::not_enough_memory)
      return {3, std::string("cannot create a thread (") + x.what() + "): the process is out of threads or address "
                 "space; lower device.cpu_threads in the recipe, or raise ulimit -u (processes) / ulimit -v (address "
                 "space)"};
    return {1, std::string(x.what()) + " (an unexpected system error; please report it)"};
  } catch (const std::exception& x) {
    return {1, std::string(x.what()) + " (an unexpected failure inside strata; please report it)"};
  } catch (...) {
    return {1, "an unknown exception (an unexpected failure inside strata; please report it)"};
  }
}

void print_failure(const char* command, const Failure& f) {
  std::fprintf(strata::distributed_error_stream(), "strata %s: %serror: %s\n", command,
               strata::distributed_rank_prefix().c_str(), printable(f.message).c_str());
}

const char* g_command = "";  // the running subcommand's name, for the terminate handler

// An exception that could not be caught where it was thrown (out of an OpenMP region or a
// library's noexcept code): still one line and the exit code where it is an error strata knows
// (memory, I/O, bad input), else an internal error (abort). It may run with the heap exhausted:
// nothing here allocates.
[[noreturn]] void on_terminate() {
  std::FILE* err = strata::distributed_error_stream();
  if (const std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const strata::Error& x) {
      std::fprintf(err, "strata %s: error: %s\n", g_command, x.what());
      std::_Exit(x.exit_code());
    } catch (const std::bad_alloc&) {
      std::fprintf(err, "strata %s: error: out of host memory (or of address space: ulimit -v); lower the memory "
                   "the recipe needs (a smaller model, micro_batch_size or sequence_len), or device.cpu_threads\n",
                   g_command);
      std::_Exit(3);
    } catch (const std::system_error& x) {
      const bool no_thread = x.code() == std::errc::resource_unavailable_try_again;
      std::fprintf(err, "strata %s: error: %s%s\n", g_command, x.what(),
                   no_thread ? ": cannot create a thread; lower device.cpu_threads, or raise ulimit -u / ulimit -v"
                             : " (an unexpected system error; please report it)");
      if (no_thread) std::_Exit(3);
    } catch (const std::exception& x) {
      std::fprintf(err, "strata %s: internal error: %s (an exception nothing could catch; please report it)\n",
                   g_command, x.what());
    } catch (...) {
      std::fprintf(err, "strata %s: internal error: an unknown exception nothing could catch (please report it)\n",
                   g_command);
    }
  } else {
    std::fprintf(err, "strata %s: internal error: terminate called without an exception (please report it)\n",
                 g_command);
  }
  std::abort();
}

// Under an address-space limit (ulimit -v). glibc gives each thread that allocates its own malloc
// arena, each reserving 64 MiB of address space, up to 8 per core: with the kernels' OpenMP
// threads that is most of a few-GiB limit, and the first allocation it starves may be one that
// a library does not check (oneDNN's JIT writes through a null code buffer: SIGSEGV). So the
// arenas are capped at an eighth of the limit (no cap without a limit, or with MALLOC_ARENA_MAX
// set), and a crash under a limit says what most likely caused it.
char g_crash_note[512];
size_t g_crash_note_bytes = 0;

void on_crash(int sig) {
  (void)!::write(2, g_crash_note, g_crash_note_bytes);
  std::raise(sig);  // the default action again (SA_RESETHAND): the crash, its exit status and core as before
}

void address_space_limit_prepare() {
  rlimit r{};
  if (getrlimit(RLIMIT_AS, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return;
  const unsigned long long limit = r.rlim_cur;
  if (!std::getenv("MALLOC_ARENA_MAX")) {
    const long cores = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
    const unsigned long long arenas = std::clamp<unsigned long long>(limit / 8 / (64ull << 20), 1, 8ull * cores);
    mallopt(M_ARENA_MAX, int(arenas));
  }
  const int n = std::snprintf(g_crash_note, sizeof g_crash_note,
                              "strata: crashed under an address-space limit (ulimit -v %llu KiB): most likely an "
                              "allocation failed inside a library that does not check it; raise ulimit -v, or "
                              "lower device.cpu_threads and the memory the recipe needs\n",
                              limit >> 10);
  g_crash_note_bytes = n > 0 ? std::min(size_t(n), sizeof g_crash_note - 1) : 0;
  struct sigaction sa {};
  sa.sa_handler = on_crash;
  sa.sa_flags = SA_RESETHAND | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGSEGV, SIGBUS}) sigaction(sig, &sa, nullptr);
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
  address_space_limit_prepare();
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
    g_command = c.name;
    std::set_terminate(on_terminate);
    try {
      return c.run(args);
    } catch (...) {  // under mpirun: "rank R: ", on the rank's own stderr
      const Failure f = failure_of(std::current_exception());
      print_failure(c.name, f);
      return f.code;
    }
  }
  std::fprintf(stderr, "strata: unknown command '%s'\n\n", printable(name).c_str());
  print_usage(stderr);
  return 2;
}
