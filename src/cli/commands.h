// The `strata` subcommands. Each takes its arguments after the subcommand name and returns the
// process exit code (0 done, 2 bad input, 3 memory budget, 4 I/O error, 130 interrupted).
// Errors are thrown as strata::Error; main() prints them and maps them to exit codes.
#pragma once
#include <string>
#include <vector>

#include <memory>

#include "models/micro_batch.h"
#include "offload/state/host_store.h"

namespace strata {

int cmd_grad(const std::vector<std::string>& args);
int cmd_zo_probe(const std::vector<std::string>& args);

// The batch file of `strata grad` and `strata zo-probe` ({"input_ids": [[...]], "labels":
// [[...]]}, labels optional, -100 ignored) as a micro-batch; an error when nothing is labelled.
MicroBatch cli_read_batch(const std::string& batch_path);
// The model of a numerics check (`strata grad`, `strata zo-probe`): config.json and weights from
// dir, computed in dtype_name ("f32" | "bf16") on a CPU device with a `memory` arena.
struct CliModel {
  ModelSpec spec;
  std::unique_ptr<Device> dev;
  std::unique_ptr<HostStore> store;
};
// `store`: what the host store holds beside the weights (strata grad: gradients; with --lora:
// nothing, weights_only; zo-probe: the master alone).
CliModel cli_load_model(const std::string& dir, const std::string& dtype_name, const std::string& memory,
                        const HostStoreOptions& store = {});
int cmd_train(const std::vector<std::string>& args);
int cmd_estimate(const std::vector<std::string>& args);
int cmd_prepare(const std::vector<std::string>& args);
int cmd_tokenize(const std::vector<std::string>& args);
int cmd_detokenize(const std::vector<std::string>& args);
int cmd_chat_template(const std::vector<std::string>& args);
int cmd_plot(const std::vector<std::string>& args);
int cmd_generate(const std::vector<std::string>& args);

}  // namespace strata
