// `strata zo-probe`: one zeroth-order perturbation on one batch (the `strata grad` batch format),
// the check users and tests run on the ZO path: prints {"loss", "loss_plus", "loss_minus",
// "projected_grad", "eps"} and writes z for every parameter under its Hugging Face name (F32;
// a tied lm_head is the embedding, written once). L± are the losses of the weights θ ± εz with
// exactly this z, so a model written as θ ± εz and run through `strata grad` gives the same
// losses, and projected_grad = (L+ − L−) / (2ε) approaches ∇L · z as ε shrinks.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "io/files.h"
#include "io/safetensors.h"
#include "offload/plan/run_engines.h"
#include "offload/state/model_io.h"
#include "src/core/cli_args.h"
#include "src/cli/commands.h"
#include "src/core/error.h"
#include "src/recipe/recipe.h"
#include "src/train/zo_step.h"

namespace strata {
namespace {

// z of every parameter, made by the device's zo_generate piece by piece and brought back (the same
// bits the perturbation used: kernels/common/zo_rng.h), in the order of the model's table. One
// device buffer of at most 4 MiB and at most half of what the arena has left.
std::vector<std::vector<float>> zo_probe_directions(Device& dev, const ModelSpec& spec, uint64_t seed) {
  constexpr int64_t kPiece = int64_t(1) << 20;  // elements per zo_generate
  int64_t largest = 1;
  for (const TensorSpec& row : spec.params.rows()) largest = std::max(largest, row.numel());
  const size_t left = dev.budget_bytes() > dev.used_bytes() ? dev.budget_bytes() - dev.used_bytes() : 0;
  const int64_t piece = std::max<int64_t>(1, std::min({largest, kPiece, int64_t(left / 2 / sizeof(float))}));
  float* buf = static_cast<float*>(dev.alloc(bytes_of<float>(piece), "zo-probe z"));
  std::vector<std::vector<float>> z(spec.params.size());
  for (size_t r = 0; r < spec.params.size(); ++r) {
    const int64_t n = spec.params[r].numel();
    z[r].resize(size_t(n));
    for (int64_t at = 0; at < n; at += piece) {
      const int64_t len = std::min(piece, n - at);
      dev.zo_generate(buf, seed, uint32_t(r), uint64_t(at), len, Stream::compute);
      dev.copy_d2h(z[r].data() + at, buf, bytes_of<float>(len), Stream::compute);
      dev.stream_synchronize(Stream::compute);
    }
  }
  dev.free(buf);
  return z;
}

}  // namespace

int cmd_zo_probe(const std::vector<std::string>& args) {
  CLI::App app{"One zeroth-order perturbation of one batch: L(θ + εz), L(θ − εz), the projected gradient, and z",
               "strata zo-probe"};
  std::string model_dir, batch_path, out_path, dtype_name = "f32", memory = "4GiB";
  uint64_t seed = 0;
  double eps = 1e-3;
  app.add_option("--model", model_dir, "Hugging Face model directory (config.json + safetensors)")->required();
  app.add_option("--batch", batch_path, "JSON {\"input_ids\": [[...]], \"labels\": [[...]]}; labels optional, -100 ignored")->required();
  app.add_option("--seed", seed, "the perturbation's seed (z = z(seed, parameter row, element))")->required();
  app.add_option("--eps", eps, "perturbation size epsilon (default 1e-3)");
  app.add_option("--out", out_path, "where to write z (safetensors, F32, HF names)")->required();
  app.add_option("--dtype", dtype_name, "compute dtype of the weights: f32 or bf16")->check(CLI::IsMember({"f32", "bf16"}));
  app.add_option("--device-memory", memory, "device arena budget");
  int rc = 0;
  if (!parse_args(app, args, &rc)) return rc;
  STRATA_CHECK(std::isfinite(eps) && eps > 0, "--eps must be a positive number, got ", eps);

  const MicroBatch mb = cli_read_batch(batch_path);
  const int64_t counted = mb.counted();
  PlanInputs in;  // the zeroth-order engine over the master alone, in RAM
  in.optimizer_kind = OptimizerKind::zo_sgd;
  in.optimizer = StateTier::host;
  in.micro_batch = mb.B;
  in.sequence_len = mb.T;
  CliModel model = cli_load_model(model_dir, dtype_name, memory, in);
  std::unique_ptr<ZoEngine> engine = run_plan_zo_engine(*model.dev, *model.store, model.plan);
  const double loss = engine->forward_loss(mb) / double(counted);
  const ZoLosses l = engine->dual_forward(mb, seed, float(eps));
  engine->synchronize();
  engine.reset();  // its device buffers back to the arena, for z's
  const double used = zo_eps_used(eps);
  const double plus = l.plus / double(counted), minus = l.minus / double(counted);

  const ModelSpec& spec = model.spec;
  const std::vector<std::vector<float>> z = zo_probe_directions(*model.dev, spec, seed);
  std::vector<TensorToWrite> out;
  for (size_t r = 0; r < spec.params.size(); ++r) {
    const TensorSpec& row = spec.params[r];
    out.push_back(TensorToWrite{row.name, DType::f32, row.shape, z[r].data()});
  }
  safetensors_write_file(out_path, out);
  nlohmann::json result = {{"loss", loss},         {"loss_plus", plus}, {"loss_minus", minus},
                           {"projected_grad", (plus - minus) / (2 * used)}, {"eps", used},
                           {"seed", seed},         {"tokens", counted}};
  std::printf("%s\n", result.dump(-1, ' ', false, nlohmann::json::error_handler_t::strict).c_str());
  return 0;
}

}  // namespace strata
