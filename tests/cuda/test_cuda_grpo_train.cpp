// `strata train`'s GRPO loop (src/train/grpo_trainer.h: the [grpo] table of recipes/grpo-tiny, its
// chat-rendered prompts, the built-in rewards, completions.jsonl) on the CUDA backend against the
// same loop on the CPU backend, from the bundled random tiny model: step 1 samples the same
// completions with the same rewards and logs the same completions.jsonl lines, with the update's
// gradient norm as close as the backends' f32 arithmetic; step 2 runs on the CUDA device's
// updated weights. (Later steps drift apart by more than the arithmetic: test_cuda_grpo.cpp says why.)
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "io/hf_config.h"
#include "offload/state/model_io.h"
#include "src/recipe/recipe.h"
#include "src/train/grpo_trainer.h"
#include "src/train/training_data.h"
#include "tests/cuda/cuda_testing.h"
#include "tests/testing.h"

namespace strata {
namespace {

struct GrpoTrainRig {
  Recipe rc;
  ModelConfig cfg;
  std::unique_ptr<Device> dev;
  std::unique_ptr<HostStore> store;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<GrpoTrainer> grpo;

  GrpoTrainRig(std::unique_ptr<Device> device, const std::string& out) : dev(std::move(device)) {
    std::filesystem::create_directories(out);
    rc = recipe_load(testing::source_path("recipes/grpo-tiny/recipe.toml"),
                     {"checkpoint.output_dir=" + out, "model.path=" + testing::source_path("recipes/sft-tiny/models/tiny"),
                      "train.micro_batch_size=8", "train.gradient_accumulation_steps=1", "grpo.num_generations=4",
                      "grpo.max_completion_length=5", "grpo.reward_funcs=accuracy,format", "grpo.format_regex=[aeiou]",
                      "grpo.log_completions=2"});
    cfg = hf_config_load(rc.model_path);
    store = std::make_unique<HostStore>(*dev, model_spec_build(cfg, DType::f32));
    model_load_weights(*store, rc.model_path);
    EngineOptions eo;
    eo.weights = WeightsMode::device;
    eo.checkpoints = CheckpointMode::device;
    eo.max_batch = rc.micro_batch_size;
    eo.max_tokens = rc.sequence_len;
    engine = std::make_unique<Engine>(*dev, *store, eo);
    const TextEncoder enc = training_encoder(rc, cfg.vocab_size);
    GrpoPromptData data = grpo_prompts_read({rc.data_path, rc.sequence_len - rc.grpo_max_completion_length - 1}, enc);
    grpo = std::make_unique<GrpoTrainer>(rc, std::move(data), cfg, *dev, *store, *engine);
  }
  GrpoTrainerOutcome step(const std::vector<int64_t>& prompts, int64_t step) {
    AdamWParams ap;
    ap.lr = rc.learning_rate;
    ap.step = step;
    return grpo->step(prompts, step, ap, rc.max_grad_norm, rc.weight_decay, true);
  }
};

}  // namespace

TEST_CASE("strata train's GRPO loop on the CUDA backend follows the CPU backend's", "[cuda-emu][grpo]") {
  auto cuda = cuda_testing::test_device();
  if (!cuda) return;
  const std::string a = testing::fresh_path("strata_cuda_grpo_train", "cuda"),
                    b = testing::fresh_path("strata_cuda_grpo_train", "cpu");
  GrpoTrainRig on_cuda(std::move(cuda), a), on_cpu(device_create(DeviceOptions{}), b);
  REQUIRE(on_cuda.grpo->prompts_per_step() == 2);
  const GrpoTrainerOutcome x = on_cuda.step({7, 42}, 1), y = on_cpu.step({7, 42}, 1);
  std::printf("cuda-emu grpo train step 1: reward %.4f (cpu %.4f) grad norm %.9f (cpu %.9f)\n",
              x.metrics["reward"].get<double>(), y.metrics["reward"].get<double>(), x.grad_norm, y.grad_norm);
  CHECK(testing::read_file(a + "/completions.jsonl") == testing::read_file(b + "/completions.jsonl"));
  CHECK(x.metrics["reward"] == y.metrics["reward"]);
  CHECK(x.metrics["rewards/format/mean"] == y.metrics["rewards/format/mean"]);
  CHECK(x.completion_tokens == y.completion_tokens);
  CHECK(y.grad_norm > 0);
  CHECK(std::abs(x.grad_norm - y.grad_norm) <= 1e-5 * y.grad_norm);
  CHECK(std::abs(x.loss - y.loss) <= 1e-5 * std::abs(y.loss) + 1e-8);
  const GrpoTrainerOutcome z = on_cuda.step({3, 99}, 2);
  CHECK(std::isfinite(z.loss));
  CHECK(std::isfinite(z.grad_norm));
  CHECK(z.metrics.contains("completions/mean_length"));
}

}  // namespace strata
