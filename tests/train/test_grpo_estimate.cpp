// GRPO's phases priced (offload/plan/grpo_estimate.h) against hand counts on the bundled tiny
// llama's shapes (hidden 64, 4 heads of 16, 2 kv heads, ffn 176, vocab 640 tied, bf16): a
// decoder layer holds q 64x64, k and v 64x32, o 64x64 and gate, up, down 64x176 = 46,080 bf16
// matrix parameters (92,160 bytes) and two f32 norms (512 bytes); the tied lm_head 640 x 64 bf16
// (81,920 bytes), the final norm 256 bytes. Link-bound (6 layers, the generator streamed with its
// whole KV cache on the device): every pass moves the weights; compute-bound (resident): the
// forward's 2 FLOPs per matrix parameter and token and the head's 2 x V x C per sampled row.
// And `strata estimate --json` on recipes/grpo-tiny shows the GRPO step as training + sampling +
// the reference pass, and the plan's device tier GRPO's larger phase beside the engine.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>

#include "io/hf_config.h"
#include "offload/engine/token_scorer.h"
#include "offload/plan/grpo_estimate.h"
#include "tests/testing.h"

namespace strata {
namespace {

constexpr double kLayerMatrixParams = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 176;  // 46,080
constexpr double kLayerBytes = 2 * kLayerMatrixParams + 2 * 64 * 4;                      // 92,672
constexpr double kHeadBytes = 640 * 64 * 2 + 64 * 4;                                    // lm_head + final norm

// The tiny llama with `layers` decoder layers, bf16.
ModelSpec tiny_spec(int layers) {
  const std::string dir = testing::fresh_path("strata_grpo_estimate", "model" + std::to_string(layers));
  std::filesystem::create_directories(dir);
  std::string cfg = testing::read_file(testing::source_path("recipes/sft-tiny/models/tiny/config.json"));
  const std::string key = "\"num_hidden_layers\": 2";
  REQUIRE(cfg.find(key) != std::string::npos);
  cfg.replace(cfg.find(key), key.size(), "\"num_hidden_layers\": " + std::to_string(layers));
  std::ofstream(dir + "/config.json") << cfg;
  return model_spec_build(hf_config_load(dir), DType::bf16);
}

GrpoPhaseShape shape() {
  GrpoPhaseShape s;
  s.prompts = 2;
  s.generations = 4;
  s.prompt_tokens = 12;
  s.completion_tokens = 6;  // a prefill and 5 decode passes per prompt
  s.reference = true;
  s.micro_batches = 2;
  s.micro_batch_rows = 4;
  s.micro_batch_tokens = 19;
  return s;
}

}  // namespace

TEST_CASE("GRPO's sampling and reference pass priced as hand counts of link bytes and FLOPs", "[grpo][estimate]") {
  SECTION("link-bound: the generator streams every layer and the head each pass") {
    const ModelSpec spec = tiny_spec(6);
    for (size_t i = 0; i < spec.layers.size(); ++i) CHECK(grpo_layer_weight_bytes(spec, i) == kLayerBytes);
    StepRates rates;
    rates.device_flops_per_s = 1e30;  // compute free
    rates.link_bytes_per_s = 1e6;
    // room for the streamed generator with its whole KV cache, not for resident weights
    const GeneratorShape gshape{4, 12, 18};
    const size_t left = generator_device_bytes(spec, gshape, {false, spec.layers.size()});
    const GrpoPhaseEstimate e = grpo_phase_estimate(spec, shape(), left, rates);
    REQUIRE(e.placement_fits);
    CHECK_FALSE(e.placement.weights_resident);
    CHECK(e.placement.kv_device_layers == 6);
    CHECK(e.generator_device_bytes == left);
    const double weights = 6 * kLayerBytes + kHeadBytes;  // 638,208
    CHECK(e.passes == 2 * 6);
    CHECK(e.sampling_link_bytes == 12 * weights);
    CHECK(std::abs(e.sampling_s - 12 * weights / 1e6) <= 1e-9 * e.sampling_s);  // 7.658496 s
    CHECK(e.reference_link_bytes == 2 * weights);
    CHECK(std::abs(e.reference_s - 2 * weights / 1e6) <= 1e-9 * e.reference_s);  // 1.276416 s
    CHECK(e.rows().at("sampling") == e.sampling_s);
  }
  SECTION("compute-bound: resident weights cross once, the passes' FLOPs decide") {
    const ModelSpec spec = tiny_spec(6);
    StepRates rates;
    rates.device_flops_per_s = 1e9;
    rates.head_flops_per_s = 1e9;
    rates.attention_flops_per_s = 1e30;  // attention free: the hand count is the GEMMs'
    rates.link_bytes_per_s = 1e30;
    const GrpoPhaseEstimate e = grpo_phase_estimate(spec, shape(), size_t(1) << 40, rates);
    REQUIRE(e.placement_fits);
    CHECK(e.placement.weights_resident);
    CHECK(e.sampling_link_bytes == 6 * kLayerBytes + kHeadBytes);  // once per step
    const double head = 2.0 * 4 * 640 * 64;                       // each row's last position
    const double prefill = 2 * kLayerMatrixParams * 6 * 4 * 12 + head;
    const double decode = 2 * kLayerMatrixParams * 6 * 4 + head;
    const double sampling = 2 * (prefill + 5 * decode) / 1e9;  // 0.07913472 s
    CHECK(std::abs(e.sampling_s - sampling) <= 1e-9 * sampling);
    CHECK(std::abs(e.sampling_compute_s - sampling) <= 1e-9 * sampling);
    const double reference = 2 * (2 * kLayerMatrixParams * 6 * 4 * 19 + 2.0 * 4 * 19 * 640 * 64) / 1e9;  // 0.09650176 s
    CHECK(std::abs(e.reference_s - reference) <= 1e-9 * reference);
  }
  SECTION("beta = 0: no reference pass") {
    GrpoPhaseShape s = shape();
    s.reference = false;
    StepRates rates;
    rates.device_flops_per_s = 1e9;
    rates.link_bytes_per_s = 1e9;
    const GrpoPhaseEstimate e = grpo_phase_estimate(tiny_spec(2), s, size_t(1) << 40, rates);
    CHECK(e.reference_s == 0);
    CHECK(e.sampling_s > 0);
  }
}

TEST_CASE("strata estimate shows a GRPO step as training plus sampling plus the reference pass", "[grpo][estimate]") {
  const std::string model = testing::source_path("recipes/sft-tiny/models/tiny");
  const nlohmann::json j = testing::estimate_json(testing::source_path("recipes/grpo-tiny/recipe.toml") +
                                                  " model.path=" + model + " model.dtype=bf16 grpo.beta=0.04 --gpu 'H100 SXM'");
  REQUIRE(j["step"].contains("grpo"));
  const nlohmann::json& g = j["step"]["grpo"];
  INFO(g.dump());
  // 16 x 2 completions / 8 generations = 4 prompts, each a prefill and 5 decode passes
  CHECK(g["sampling_passes"].get<double>() == 4 * 6);
  // the tiny model is resident on an H100: its weights cross once a step (2 layers, the tied head)
  CHECK(g["generator_weights_resident"].get<bool>());
  CHECK(g["sampling_link_bytes"].get<double>() == 2 * kLayerBytes + kHeadBytes);
  CHECK(g["reference_link_bytes"].get<double>() == 2 * (2 * kLayerBytes + kHeadBytes));  // 2 micro-batches
  CHECK(g["reference_s"].get<double>() > 0);
  CHECK(std::abs(g["seconds"].get<double>() - (j["step"]["seconds"].get<double>() + g["sampling_s"].get<double>() +
                                              g["reference_s"].get<double>())) <= 1e-12 * g["seconds"].get<double>());
  // the plan's device tier holds GRPO's larger phase beside the engine: the generator at its least
  // (8 rows, prompts of 32 - 6 - 1 = 25 tokens, 31 positions) or the reference pass (16 x 32)
  const ModelSpec spec = tiny_spec(2);
  const size_t gen = generator_min_device_bytes(spec, {8, 25, 31}), ref = token_scorer_device_bytes(spec, 16, 32);
  size_t row = 0;
  for (const auto& st : j["states"])
    if (st["kind"].get<std::string>().rfind("GRPO phases beside the engine", 0) == 0) row = st["bytes"].get<size_t>();
  CHECK(row == std::max(gen, ref));
  CHECK(row > 0);
  // the text report says it too
  const testing::ProcessResult r = testing::run_strata(
      "estimate " + testing::source_path("recipes/grpo-tiny/recipe.toml") + " model.path=" + model + " --gpu 'H100 SXM'",
      true);
  CHECK(r.code == 0);
  CHECK(r.out.find("grpo step:") != std::string::npos);
  CHECK(r.out.find("sampling") != std::string::npos);
}

}  // namespace strata
