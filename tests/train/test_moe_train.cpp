// Mixture-of-experts models through `strata train`: a tiny random qwen3_moe (8 experts, top 2,
// the load-balancing loss on through output_router_logits) learns the quickstart corpus, its
// held-out loss falls; LoRA on its attention projections trains on the frozen experts; and a
// qwen3_moe with the tiny chat tokenizer runs SFT, DPO and `strata generate` end to end.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/testing.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

// A qwen3_moe beside the quickstart's llama (vocab 256: bytes; 640: recipes/sft-tiny's tokenizer),
// written into dir.
std::string tiny_moe_config(const std::string& dir, int64_t vocab = 256) {
  fs::create_directories(dir);
  const nlohmann::json j = {{"architectures", {"Qwen3MoeForCausalLM"}}, {"model_type", "qwen3_moe"},
                            {"hidden_size", 64}, {"intermediate_size", 96}, {"num_hidden_layers", 2},
                            {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 16},
                            {"vocab_size", vocab}, {"max_position_embeddings", 512}, {"num_experts", 8},
                            {"num_experts_per_tok", 2}, {"moe_intermediate_size", 40}, {"norm_topk_prob", true},
                            {"output_router_logits", true}, {"router_aux_loss_coef", 0.01},
                            {"tie_word_embeddings", true}, {"torch_dtype", "float32"}};
  std::ofstream(dir + "/config.json") << j.dump(2);
  return dir + "/config.json";
}

std::vector<double> metric(const std::string& out, const char* key) {
  std::vector<double> v;
  std::ifstream in(out + "/metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains(key)) v.push_back(j[key].get<double>());
  }
  return v;
}

}  // namespace

TEST_CASE("SFT on a tiny qwen3_moe lowers its held-out loss, and LoRA trains its attention", "[moe][train]") {
  const std::string root = testing::fresh_path("strata_moe_train", "sft");
  const std::string config = tiny_moe_config(root + "/model");
  const std::string common = " model.config=" + config + " train.max_steps=40 train.micro_batch_size=4" +
                             " data.sequence_len=128 data.eval_split=0.05 train.eval_steps=20 optim.warmup_steps=4" +
                             " checkpoint.save_steps=0";
  const testing::ProcessResult r = testing::run_strata("train " + testing::source_path("recipes/quickstart.toml") +
                                                       common + " checkpoint.output_dir=" + root + "/out");
  INFO(r.out);
  REQUIRE(r.code == 0);
  const std::vector<double> loss = metric(root + "/out", "loss"), eval = metric(root + "/out", "eval_loss");
  REQUIRE(loss.size() == 40);
  REQUIRE(eval.size() == 2);
  CHECK(loss.front() > 5.0);                  // ~log(256) = 5.55 at init
  CHECK(loss.back() < loss.front() - 1.0);    // a clear fall
  CHECK(eval[1] < eval[0]);
  CHECK(eval[1] < loss.front() - 1.0);

  // LoRA on q_proj and v_proj of every layer of the trained model (its experts frozen with the base)
  const testing::ProcessResult l = testing::run_strata(
      "train " + testing::source_path("recipes/quickstart.toml") + " model.config= model.path=" + root +
      "/out/final data.tokenizer=bytes train.max_steps=30 train.micro_batch_size=4 data.sequence_len=128" +
      " optim.warmup_steps=4 checkpoint.save_steps=0 lora.r=8 lora.target_modules=q_proj,v_proj" +
      " optim.learning_rate=1e-2 checkpoint.output_dir=" + root + "/lora");
  INFO(l.out);
  REQUIRE(l.code == 0);
  const std::vector<double> lora_loss = metric(root + "/lora", "loss");
  REQUIRE(lora_loss.size() == 30);
  CHECK(lora_loss.back() < lora_loss.front() - 0.05);  // measured: 3.20 -> 3.08
  CHECK(fs::exists(root + "/lora/final/adapter/adapter_model.safetensors"));
}

TEST_CASE("LoRA on a tiny qwen3_moe's router and experts (target_parameters) lowers the loss", "[moe][train][lora]") {
  // a briefly trained base (5 steps), then LoRA on the router and the experts alone (PEFT's
  // target_parameters: one A and B per expert) with the attention frozen; the export is PEFT's
  const std::string root = testing::fresh_path("strata_moe_train", "lora_experts");
  const std::string config = tiny_moe_config(root + "/model");
  const std::string common = " train.micro_batch_size=4 data.sequence_len=128 optim.warmup_steps=2 checkpoint.save_steps=0";
  const testing::ProcessResult b = testing::run_strata("train " + testing::source_path("recipes/quickstart.toml") +
                                                       " model.config=" + config + " train.max_steps=5" + common +
                                                       " checkpoint.output_dir=" + root + "/base");
  INFO(b.out);
  REQUIRE(b.code == 0);
  const testing::ProcessResult l = testing::run_strata(
      "train " + testing::source_path("recipes/quickstart.toml") + " model.config= model.path=" + root +
      "/base/final data.tokenizer=bytes train.max_steps=30" + common + " lora.r=4 lora.target_modules=[]" +
      " lora.target_parameters=mlp.experts.gate_up_proj,mlp.experts.down_proj,mlp.gate.weight" +
      " optim.learning_rate=1e-2 checkpoint.output_dir=" + root + "/lora");
  INFO(l.out);
  REQUIRE(l.code == 0);
  const std::vector<double> loss = metric(root + "/lora", "loss");
  REQUIRE(loss.size() == 30);
  std::printf("moe lora on the router and experts: loss %.4f -> %.4f\n", loss.front(), loss.back());
  CHECK(loss.back() < loss.front() - 0.05);
  const nlohmann::json cfg = nlohmann::json::parse(testing::read_file(root + "/lora/final/adapter/adapter_config.json"));
  CHECK(cfg["target_parameters"] ==
        nlohmann::json({"mlp.gate.weight", "mlp.experts.gate_up_proj", "mlp.experts.down_proj"}));
  const SafetensorsFile f = SafetensorsFile::open(root + "/lora/final/adapter/adapter_model.safetensors");
  const SafetensorsEntry* b_up = f.find("base_model.model.model.layers.0.mlp.experts.base_layer.lora_B.weight");
  REQUIRE(b_up);
  CHECK(b_up->shape == Shape{2 * 40, 8 * 4});  // (2I, E*r): PEFT's layout
  CHECK(f.find("base_model.model.model.layers.1.mlp.gate.lora_A.weight"));
}

TEST_CASE("a qwen3_moe runs SFT, DPO and generate end to end through the CLI", "[moe][train][preference][generate]") {
  const std::string root = testing::fresh_path("strata_moe_train", "dpo");
  const std::string config = tiny_moe_config(root + "/model", 640);
  const std::string tiny = testing::source_path("recipes/sft-tiny/models/tiny");
  const testing::ProcessResult sft = testing::run_strata(
      "train " + testing::source_path("recipes/sft-tiny/recipe.toml") + " model.path= model.config=" + config +
      " data.tokenizer=" + tiny + " train.max_steps=20 checkpoint.save_steps=0 checkpoint.output_dir=" + root + "/sft");
  INFO(sft.out);
  REQUIRE(sft.code == 0);
  const std::vector<double> sft_loss = metric(root + "/sft", "loss");
  REQUIRE(sft_loss.size() == 20);
  CHECK(sft_loss.back() < sft_loss.front() - 0.5);  // measured: 6.51 -> 5.39

  const testing::ProcessResult dpo = testing::run_strata(
      "train " + testing::source_path("recipes/dpo-tiny/recipe.toml") + " model.path=" + root +
      "/sft/final train.max_steps=10 train.eval_steps=10 checkpoint.save_steps=0 checkpoint.output_dir=" + root + "/dpo");
  INFO(dpo.out);
  REQUIRE(dpo.code == 0);
  const std::vector<double> dpo_loss = metric(root + "/dpo", "loss");
  REQUIRE(dpo_loss.size() == 10);
  CHECK(std::abs(dpo_loss.front() - std::log(2.0)) < 1e-3);  // DPO starts at log 2 (policy = reference)
  for (double l : dpo_loss) CHECK(std::isfinite(l));

  const testing::ProcessResult gen = testing::run_shell(
      "echo '{\"messages\": [{\"role\": \"user\", \"content\": \"Repeat the word tiger.\"}]}' | " +
          testing::strata_binary() + " generate --model " + root + "/sft/final --max-new-tokens 8",
      true);
  INFO(gen.out);
  REQUIRE(gen.code == 0);
  const nlohmann::json j = nlohmann::json::parse(gen.out.substr(0, gen.out.find('\n')));
  CHECK(j["tokens"].get<int64_t>() == 8);
  CHECK(j["ids"].size() == 8);
}

TEST_CASE("an MoE run gives the same losses under layer-major accumulation and NVMe state", "[moe][train][engine]") {
  // the load-balancing loss on (output_router_logits), untied lm_head (layer-major needs it), 3
  // micro-batches a step: the micro-batch schedule in RAM, layer-major, and NVMe checkpoints and
  // optimizer state give the same loss bits at every step
  const std::string root = testing::fresh_path("strata_moe_train", "schedules");
  const std::string config = tiny_moe_config(root + "/model");
  {
    std::ifstream in(config);
    nlohmann::json j = nlohmann::json::parse(in);
    j["tie_word_embeddings"] = false;
    std::ofstream(config) << j.dump(2);
  }
  fs::create_directories(root + "/nvme");
  const std::string common = "train " + testing::source_path("recipes/quickstart.toml") + " model.config=" + config +
                             " train.max_steps=4 train.micro_batch_size=2 train.gradient_accumulation_steps=3" +
                             " offload.weights=stream data.sequence_len=128 checkpoint.save_steps=0";
  std::vector<std::vector<double>> losses;
  for (const std::string& variant : {std::string(" offload.accumulation=micro_batch"),
                                     std::string(" offload.accumulation=layer_major"),
                                     " offload.accumulation=micro_batch offload.checkpoints=nvme offload.optimizer=nvme"
                                     " offload.nvme_path=" + root + "/nvme"}) {
    const std::string out = root + "/run" + std::to_string(losses.size());
    const testing::ProcessResult r = testing::run_strata(common + variant + " checkpoint.output_dir=" + out);
    INFO(variant << "\n" << r.out);
    REQUIRE(r.code == 0);
    losses.push_back(metric(out, "loss"));
    REQUIRE(losses.back().size() == 4);
  }
  CHECK(losses[1] == losses[0]);
  CHECK(losses[2] == losses[0]);
}

}  // namespace strata
