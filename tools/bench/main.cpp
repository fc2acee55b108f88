// strata-bench: the benchmark program (not a test; DESIGN §7). Dispatches to a subcommand;
// each prints a table and ends with one JSON line of its figures. Timings never fail anything:
// the exit code is 0 unless the arguments are wrong (2) or the run itself fails.
#include <cstdio>
#include <new>
#include <string>
#include <vector>

#include "src/core/error.h"

namespace strata::bench {
// One entry per subcommand, defined in tools/bench/bench_<name>.cpp.
int bench_adamw(const std::vector<std::string>& args);     // the host AdamW against STREAM and torch
int bench_attention(const std::vector<std::string>& args);  // the device's attention forward + backward
int bench_pipeline(const std::vector<std::string>& args);  // a streamed step against its compute and link
int bench_zo(const std::vector<std::string>& args);        // z generation and the ZO-SGD update
int bench_nvme(const std::vector<std::string>& args);      // the NVMe file engine against fio
int bench_nvme_checksum(const std::vector<std::string>& args);  // the file engine's checksums, 1 vs N threads
int bench_peer(const std::vector<std::string>& args);      // training steps against PyTorch's
int bench_estimate(const std::vector<std::string>& args);  // strata estimate against strata train
int bench_plan_choice(const std::vector<std::string>& args);  // auto's plan against every forced one
int bench_nf4(const std::vector<std::string>& args);       // NF4 quantize / dequantize on the host
int bench_moe_decode(const std::vector<std::string>& args);  // routed against whole-layer MoE decode
int bench_gemma_head(const std::vector<std::string>& args);  // the chunked head at a 262k vocabulary
}  // namespace strata::bench

namespace {

struct BenchCommand {
  const char* name;
  int (*run)(const std::vector<std::string>&);
  const char* help;
};

// What each measures; `strata-bench <name> --help` gives its options.
const BenchCommand kBenchCommands[] = {
    {"adamw", strata::bench::bench_adamw, "CPU AdamW params/s against a STREAM-triad bound and torch.optim.AdamW"},
    {"attention", strata::bench::bench_attention, "the device's causal GQA attention forward + backward, TFLOP/s"},
    {"pipeline", strata::bench::bench_pipeline, "the streaming engine on the CPU backend with a throttled link"},
    {"zo", strata::bench::bench_zo, "the ZO host side: z generation and the ZO-SGD update against a plain pass"},
    {"nvme", strata::bench::bench_nvme, "sequential write and read through strata's NVMe file engine against fio"},
    {"nvme-checksum", strata::bench::bench_nvme_checksum, "the NVMe file engine with its checksums on 1 thread against N"},
    {"peer", strata::bench::bench_peer, "strata against PyTorch training the same model on the same batches"},
    {"estimate", strata::bench::bench_estimate, "strata estimate --measure's step time against strata train's on this host"},
    {"plan", strata::bench::bench_plan_choice, "auto's plan against every forced alternative, measured interleaved"},
    {"nf4", strata::bench::bench_nf4, "NF4 quantization and bf16 dequantization on the host against a plain pass"},
    {"moe-decode", strata::bench::bench_moe_decode, "MoE decode with streamed weights: routed experts against whole layers"},
    {"gemma-head", strata::bench::bench_gemma_head, "a training step's chunked loss head at Gemma 3's 262k vocabulary against 32k"},
};

void bench_print_usage(FILE* f) {
  std::fprintf(f, "strata-bench: benchmarks with ratios to ceilings measured in the same run\n\n"
                  "usage: strata-bench <benchmark> [options]\n\nbenchmarks:\n");
  for (const auto& c : kBenchCommands) std::fprintf(f, "  %-14s %s\n", c.name, c.help);
  std::fprintf(f, "\n'strata-bench <benchmark> --help' describes its options. Each ends with one JSON line.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    bench_print_usage(stderr);
    return 2;
  }
  const std::string name = argv[1];
  if (name == "--help" || name == "-h" || name == "help") {
    bench_print_usage(stdout);
    return 0;
  }
  const std::vector<std::string> args(argv + 2, argv + argc);
  for (const auto& c : kBenchCommands) {
    if (name != c.name) continue;
    try {
      return c.run(args);
    } catch (const strata::Error& e) {
      std::fprintf(stderr, "strata-bench %s: error: %s\n", c.name, e.what());
      return e.exit_code();
    } catch (const std::bad_alloc&) {
      std::fprintf(stderr, "strata-bench %s: error: out of host memory; try a smaller size\n", c.name);
      return 3;
    }
  }
  std::fprintf(stderr, "strata-bench: unknown benchmark '%s'\n\n", name.c_str());
  bench_print_usage(stderr);
  return 2;
}
