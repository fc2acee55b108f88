// `strata grad`: loss and d loss / d parameter for one batch, the numerics check users run when
// porting a model. HF causal-LM convention: cross-entropy of logits[:, :-1] against
// labels[:, 1:], mean over positions whose label is not -100.
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/files.h"
#include "io/safetensors.h"
#include "offload/engine.h"
#include "offload/model_io.h"
#include "src/cli/cli_args.h"
#include "src/cli/commands.h"
#include "src/core/error.h"
#include "src/recipe/recipe.h"

namespace strata {
namespace {

std::vector<std::vector<int32_t>> read_rows(const nlohmann::json& j, const char* key,
                                            const std::string& path) {
  STRATA_CHECK(j[key].is_array(), path, ": \"", key, "\" must be a list of rows of token ids");
  std::vector<std::vector<int32_t>> rows;
  for (size_t b = 0; b < j[key].size(); ++b) {
    const auto& row = j[key][b];
    STRATA_CHECK(row.is_array(), path, ": ", key, "[", b, "] must be a list of integers");
    std::vector<int32_t> r;
    for (size_t t = 0; t < row.size(); ++t) {
      STRATA_CHECK(row[t].is_number_integer(), path, ": ", key, "[", b, "][", t, "] is not an integer");
      r.push_back(row[t].get<int32_t>());
    }
    rows.push_back(std::move(r));
  }
  return rows;
}

}  // namespace

MicroBatch cli_read_batch(const std::string& batch_path) {
  const std::string batch_text = file_read(batch_path, "batch file", "check --batch", ErrorKind::input);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(batch_text);
  } catch (const nlohmann::json::parse_error& e) {
    STRATA_CHECK(false, batch_path, " is not valid JSON: ", e.what());
  }
  STRATA_CHECK(j.is_object() && j.contains("input_ids"), batch_path, " must be an object with \"input_ids\"");
  auto ids = read_rows(j, "input_ids", batch_path);
  std::vector<std::vector<int32_t>> labels;
  if (j.contains("labels") && !j["labels"].is_null()) labels = read_rows(j, "labels", batch_path);
  MicroBatch mb = micro_batch_from_labels(ids, labels);
  STRATA_CHECK(mb.counted() > 0, batch_path, ": every label is -100, so there is no loss to differentiate");
  return mb;
}

int cmd_grad(const std::vector<std::string>& args) {
  CLI::App app{"Loss and gradients of one batch, for checking strata's numerics against another implementation",
               "strata grad"};
  std::string model_dir, batch_path, out_path, dtype_name = "f32", memory = "4GiB";
  app.add_option("--model", model_dir, "Hugging Face model directory (config.json + safetensors)")->required();
  app.add_option("--batch", batch_path, "JSON {\"input_ids\": [[...]], \"labels\": [[...]]}; labels optional, -100 ignored")->required();
  app.add_option("--out", out_path, "where to write the gradients (safetensors, F32, HF names)")->required();
  app.add_option("--dtype", dtype_name, "compute dtype of the weights: f32 or bf16")->check(CLI::IsMember({"f32", "bf16"}));
  app.add_option("--device-memory", memory, "device arena budget");
  int rc = 0;
  if (!parse_args(app, args, &rc)) return rc;

  MicroBatch mb = cli_read_batch(batch_path);
  const int64_t counted = mb.counted();

  ModelConfig cfg = hf_config_load(model_dir);
  ModelSpec spec = model_spec_build(cfg, dtype_parse(dtype_name));
  DeviceOptions dopt;
  dopt.memory_bytes = parse_bytes(memory, "--device-memory");
  auto dev = device_create(dopt);
  HostStore store(*dev, spec);
  model_load_weights(store, model_dir);
  EngineOptions eopt;
  eopt.weights = "device";
  eopt.max_batch = mb.B;
  eopt.max_tokens = mb.T;
  Engine engine(*dev, store, eopt);
  const double loss_sum = engine.forward_backward(mb, float(1.0 / double(counted)));
  engine.synchronize();

  std::vector<TensorToWrite> out;
  for (size_t i = 0; i < store.f32_table().size(); ++i) {
    const TensorSpec& r = store.f32_table()[i];
    out.push_back(TensorToWrite{r.name, DType::f32, r.shape, store.grad_of(i)});
  }
  safetensors_write_file(out_path, out);
  nlohmann::json result = {{"loss", loss_sum / double(counted)}, {"tokens", counted}};
  std::printf("%s\n", result.dump().c_str());
  return 0;
}

}  // namespace strata
