// The `strata` subcommands. Each takes its arguments after the subcommand name and returns the
// process exit code (0 done, 2 bad input, 3 memory budget, 4 I/O error, 130 interrupted).
// Errors are thrown as strata::Error; main() prints them and maps them to exit codes.
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "models/micro_batch.h"
#include "offload/plan/placement_plan.h"
#include "offload/state/host_store.h"

namespace strata {

int cmd_grad(const std::vector<std::string>& args);
int cmd_zo_probe(const std::vector<std::string>& args);

// The batch file of `strata grad` and `strata zo-probe` ({"input_ids": [[...]], "labels":
// [[...]]}, labels optional, -100 ignored) as a micro-batch; an error when nothing is labelled.
MicroBatch cli_read_batch(const std::string& batch_path);
// The model of a numerics check (`strata grad`, `strata zo-probe`): config.json and weights from
// dir, computed in dtype_name ("f32" | "bf16") on a CPU device with a `memory` arena, and the
// placement plan of `in` (no budgets: the device's arena checks its own) that its host store was
// built from and its engine is built from (offload/plan/run_engines.h). What the store holds
// beside the weights is the plan's: AdamW's gradients (and master and moments), nothing with
// LoRA, the master alone for zo-sgd.
struct CliModel {
  ModelSpec spec;
  RunPlan plan;
  std::unique_ptr<Device> dev;
  std::unique_ptr<HostStore> store;
};
CliModel cli_load_model(const std::string& dir, const std::string& dtype_name, const std::string& memory,
                        const PlanInputs& in);
int cmd_train(const std::vector<std::string>& args);     // fine-tune or align from a recipe
int cmd_estimate(const std::vector<std::string>& args);  // the placement plan and step time, nothing run
int cmd_prepare(const std::vector<std::string>& args);   // tokenize a data set into shards once
// tokenize / detokenize text, and render a chat template, one JSON line per stdin line
int cmd_tokenize(const std::vector<std::string>& args);
int cmd_detokenize(const std::vector<std::string>& args);
int cmd_chat_template(const std::vector<std::string>& args);
int cmd_plot(const std::vector<std::string>& args);      // metrics.jsonl as SVG charts
int cmd_generate(const std::vector<std::string>& args);  // sample from a model or checkpoint
int cmd_quantize(const std::vector<std::string>& args);  // a model dir as bitsandbytes' NF4 (offload/state/nf4_hf.h)

// f(line, line_no) for each non-blank line of standard input (a CRLF's CR dropped), numbered
// from 1 as the messages name them.
void cli_for_each_stdin_line(const std::function<void(const std::string& line, size_t line_no)>& f);

}  // namespace strata
