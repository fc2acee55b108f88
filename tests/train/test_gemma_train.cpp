// Every training path on a tiny Gemma 3 (models/gemma_layer.h): SFT lowers the held-out loss, LoRA
// lowers the loss and exports PEFT's adapter, DPO trains adapters on the frozen base; one
// OLMo 2 SFT run; and Phi-3 (models/phi3_layer.h, LongRoPE's long table on the 64-token rows): SFT,
// and LoRA on its fused projections exported under PEFT's names. The model is a random initialisation of a Gemma 3 config with the bundled tiny
// chat model's tokenizer and chat template (recipes/sft-tiny/models/tiny), its sliding window
// shorter than the rows so the local layers mask.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "src/recipe/recipe.h"
#include "src/train/trainer.h"
#include "tests/testing.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

// dir/recipe.toml: `model` (the [model] table's lines) trained on the bundled chat data.
void write_recipe(const std::string& dir, const std::string& model) {
  std::ofstream(dir + "/recipe.toml") << "[model]\n" << model << "\n[data]\npath = \""
                                      << testing::source_path("recipes/sft-tiny/data/chat.jsonl")
                                      << "\"\nsequence_len = 64\npacking = true\n[train]\nseed = 7\n";
}

// The first n lines of file `from` into `to`.
void head_lines(const std::string& from, const std::string& to, int n) {
  std::ifstream in(from);
  std::ofstream out(to);
  std::string line;
  for (int i = 0; i < n && std::getline(in, line); ++i) out << line << "\n";
}

// A model dir of config `cfg` holding the tiny chat model's tokenizer files (no weights: the
// recipe there initialises from model.config and reads the tokenizer from data.tokenizer) and a
// recipe.toml training on the bundled chat data.
std::string tiny_dir(const char* name, const nlohmann::json& cfg) {
  const std::string dir = testing::fresh_path("strata_gemma", name);
  fs::create_directories(dir);
  const std::string tiny = testing::source_path("recipes/sft-tiny/models/tiny");
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) fs::copy_file(tiny + "/" + f, dir + "/" + f);
  std::ofstream(dir + "/config.json") << cfg.dump(2);
  write_recipe(dir, "config = \"config.json\"\ninit_seed = 3");
  return dir;
}

nlohmann::json gemma_config() {
  return {{"architectures", {"Gemma3ForCausalLM"}}, {"model_type", "gemma3_text"}, {"hidden_size", 48},
          {"intermediate_size", 96}, {"num_hidden_layers", 3}, {"num_attention_heads", 4},
          {"num_key_value_heads", 2}, {"head_dim", 16}, {"vocab_size", 640}, {"sliding_window", 16},
          {"sliding_window_pattern", 3}, {"query_pre_attn_scalar", 16}, {"max_position_embeddings", 512},
          {"eos_token_id", 594}, {"pad_token_id", 592}, {"tie_word_embeddings", true}};
}

Recipe recipe(const std::string& dir, const std::string& out, std::vector<std::string> extra) {
  std::vector<std::string> o = {"data.tokenizer=" + dir, "train.micro_batch_size=4",
                                "train.gradient_accumulation_steps=1", "train.log_steps=100",
                                "optim.learning_rate=3e-3", "optim.warmup_steps=1", "checkpoint.save_steps=0",
                                "device.cpu_threads=2", "checkpoint.output_dir=" + out};
  o.insert(o.end(), extra.begin(), extra.end());
  return recipe_load(dir + "/recipe.toml", o);
}

// The first and last eval losses of a run's metrics.
std::pair<double, double> eval_losses(const std::string& out) {
  const auto rec = testing::metrics_records(out, "eval_loss");
  REQUIRE(rec.size() >= 2);
  return {rec.front()["eval_loss"].get<double>(), rec.back()["eval_loss"].get<double>()};
}

}  // namespace

TEST_CASE("SFT on a tiny Gemma 3 lowers the held-out loss", "[gemma][train]") {
  const std::string dir = tiny_dir("sft_model", gemma_config());
  const std::string out = testing::fresh_path("strata_gemma", "sft");
  const TrainSummary s = train_run(recipe(dir, out, {"train.max_steps=16", "train.eval_steps=2",
                                                     "data.eval_split=0.1"}));
  REQUIRE(s.losses.size() == 16);
  const auto [first, last] = eval_losses(out);
  std::printf("gemma3 sft: train loss %.4f -> %.4f, held-out %.4f -> %.4f\n", s.losses.front(), s.losses.back(),
              first, last);
  CHECK(last < first - 0.1);
  CHECK(fs::exists(out + "/final/config.json"));
  // the export is Gemma 3's: norms named as transformers names them, no lm_head (tied)
  SafetensorsDir exported = SafetensorsDir::open(out + "/final");
  CHECK(exported.find("model.layers.0.pre_feedforward_layernorm.weight"));
  CHECK(exported.find("model.layers.2.post_feedforward_layernorm.weight"));
  CHECK_FALSE(exported.find("lm_head.weight"));
}

TEST_CASE("LoRA SFT and DPO on a tiny Gemma 3", "[gemma][train][lora]") {
  // LoRA adapts a pretrained base: eight SFT steps from the random initialisation make one
  const std::string dir = tiny_dir("lora_model", gemma_config());
  const std::string base = testing::fresh_path("strata_gemma", "lora_base");
  REQUIRE(train_run(recipe(dir, base, {"train.max_steps=8"})).losses.size() == 8);
  write_recipe(dir, "path = \"" + base + "/final\"");
  const std::string out = testing::fresh_path("strata_gemma", "lora");
  // a few samples seen again and again: the adapters alone must fit them (on the whole chat data
  // twelve steps of an eight-step base move the loss by less than its batch-to-batch noise, for
  // the llama family too)
  const std::string chats = dir + "/chats.jsonl", pairs = dir + "/pairs.jsonl";
  head_lines(testing::source_path("recipes/sft-tiny/data/chat.jsonl"), chats, 6);
  head_lines(testing::source_path("recipes/dpo-tiny/data/pairs.jsonl"), pairs, 8);
  const TrainSummary s = train_run(recipe(dir, out, {"train.max_steps=12", "lora.r=8", "lora.alpha=16",
                                                     "optim.learning_rate=1e-2", "data.path=" + chats}));
  REQUIRE(s.losses.size() == 12);
  // batches differ: the mean of the first three steps against the last three's
  const double first = (s.losses[0] + s.losses[1] + s.losses[2]) / 3, last = (s.losses[9] + s.losses[10] + s.losses[11]) / 3;
  std::printf("gemma3 lora sft: mean loss of steps 1-3 %.4f, of steps 10-12 %.4f\n", first, last);
  CHECK(last < first - 0.05);
  CHECK(fs::exists(out + "/final/adapter/adapter_model.safetensors"));

  const std::string dpo = testing::fresh_path("strata_gemma", "dpo");
  const TrainSummary d = train_run(recipe(dir, dpo, {"train.max_steps=6", "lora.r=8", "lora.alpha=16",
                                                     "train.objective=dpo", "optim.learning_rate=1e-2",
                                                     "data.path=" + pairs}));
  REQUIRE(d.losses.size() == 6);
  std::printf("gemma3 lora dpo: loss %.4f -> %.4f\n", d.losses.front(), d.losses.back());
  CHECK(std::abs(d.losses[0] - std::log(2.0)) < 1e-3);  // the policy starts as the reference (B = 0)
  CHECK(d.losses.back() < d.losses.front());
}

TEST_CASE("SFT on a tiny OLMo 2 lowers the held-out loss", "[gemma][train]") {
  const nlohmann::json cfg = {{"architectures", {"Olmo2ForCausalLM"}}, {"model_type", "olmo2"}, {"hidden_size", 48},
                              {"intermediate_size", 96}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
                              {"num_key_value_heads", 2}, {"vocab_size", 640}, {"max_position_embeddings", 512},
                              {"eos_token_id", 594}, {"pad_token_id", 592}};
  const std::string dir = tiny_dir("olmo2_model", cfg);
  const std::string out = testing::fresh_path("strata_gemma", "olmo2_sft");
  const TrainSummary s = train_run(recipe(dir, out, {"train.max_steps=12", "train.eval_steps=2",
                                                     "data.eval_split=0.1"}));
  const auto [first, last] = eval_losses(out);
  std::printf("olmo2 sft: train loss %.4f -> %.4f, held-out %.4f -> %.4f\n", s.losses.front(), s.losses.back(),
              first, last);
  CHECK(last < first - 0.1);
}

TEST_CASE("Gemma 3 with its optimizer state on NVMe trains bit for bit as in RAM", "[gemma][train][nvme]") {
  const std::string dir = tiny_dir("nvme_model", gemma_config());
  const std::string ram = testing::fresh_path("strata_gemma", "ram"), disk = testing::fresh_path("strata_gemma", "nvme");
  const std::vector<std::string> common = {"train.max_steps=3", "checkpoint.save_dtype=f32"};
  const TrainSummary a = train_run(recipe(dir, ram, common));
  std::vector<std::string> on_nvme = common;
  on_nvme.push_back("offload.optimizer=nvme");
  on_nvme.push_back("offload.checkpoints=nvme");
  on_nvme.push_back("offload.nvme_path=" + testing::process_dir("strata_gemma_nvme"));
  const TrainSummary b = train_run(recipe(dir, disk, on_nvme));
  REQUIRE(a.losses.size() == 3);
  CHECK(a.losses == b.losses);
  SafetensorsDir wa = SafetensorsDir::open(ram + "/final"), wb = SafetensorsDir::open(disk + "/final");
  REQUIRE(wa.names() == wb.names());
  size_t differ = 0;
  for (const std::string& n : wa.names()) {
    const int64_t count = wa.find(n)->numel();
    std::vector<float> x(static_cast<size_t>(count)), y(static_cast<size_t>(count));
    wa.read(n, DType::f32, x.data());
    wb.read(n, DType::f32, y.data());
    differ += x != y;
  }
  std::printf("gemma3 nvme state: losses %.6f %.6f %.6f, %zu of %zu tensors differ from the RAM run\n", b.losses[0],
              b.losses[1], b.losses[2], differ, wa.names().size());
  CHECK(differ == 0);
}

nlohmann::json phi3_config() {
  std::vector<double> short_f, long_f;
  for (int j = 0; j < 6; ++j) short_f.push_back(1.0 + 0.05 * j), long_f.push_back(1.5 + 0.5 * j);
  return {{"architectures", {"Phi3ForCausalLM"}}, {"model_type", "phi3"}, {"hidden_size", 48},
          {"intermediate_size", 80}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
          {"num_key_value_heads", 2}, {"vocab_size", 640}, {"max_position_embeddings", 256},
          {"original_max_position_embeddings", 32}, {"sliding_window", 24},
          {"rope_scaling", {{"type", "longrope"}, {"short_factor", short_f}, {"long_factor", long_f}}},
          {"eos_token_id", 594}, {"pad_token_id", 592}};
}

TEST_CASE("SFT and LoRA on a tiny Phi-3 lower the loss", "[phi3][train][lora]") {
  const std::string dir = tiny_dir("phi3_model", phi3_config());
  const std::string base = testing::fresh_path("strata_gemma", "phi3_sft");
  const TrainSummary s = train_run(recipe(dir, base, {"train.max_steps=12", "train.eval_steps=2",
                                                      "data.eval_split=0.1"}));
  const auto [first, last] = eval_losses(base);
  std::printf("phi3 sft: train loss %.4f -> %.4f, held-out %.4f -> %.4f\n", s.losses.front(), s.losses.back(),
              first, last);
  CHECK(last < first - 0.1);
  SafetensorsDir exported = SafetensorsDir::open(base + "/final");  // the checkpoint's fused layout
  CHECK(exported.find("model.layers.1.self_attn.qkv_proj.weight"));
  CHECK(exported.find("model.layers.0.mlp.gate_up_proj.weight"));

  write_recipe(dir, "path = \"" + base + "/final\"");
  const std::string chats = dir + "/chats.jsonl", out = testing::fresh_path("strata_gemma", "phi3_lora");
  head_lines(testing::source_path("recipes/sft-tiny/data/chat.jsonl"), chats, 6);
  const TrainSummary l = train_run(recipe(dir, out, {"train.max_steps=12", "lora.r=8", "lora.alpha=16",
                                                     "lora.dropout=0.1", "optim.learning_rate=1e-2",
                                                     "data.path=" + chats,
                                                     "lora.target_modules=qkv_proj,o_proj,gate_up_proj,down_proj"}));
  REQUIRE(l.losses.size() == 12);
  const double a = (l.losses[0] + l.losses[1] + l.losses[2]) / 3, b = (l.losses[9] + l.losses[10] + l.losses[11]) / 3;
  std::printf("phi3 lora sft: mean loss of steps 1-3 %.4f, of steps 10-12 %.4f\n", a, b);
  CHECK(b < a - 0.05);
  // PEFT's names: one A and one B per fused projection
  SafetensorsFile adapter = SafetensorsFile::open(out + "/final/adapter/adapter_model.safetensors");
  const SafetensorsEntry* qkv_b = adapter.find("base_model.model.model.layers.0.self_attn.qkv_proj.lora_B.weight");
  REQUIRE(qkv_b);
  CHECK(qkv_b->shape == Shape{48 + 2 * 24, 8});
  CHECK(adapter.find("base_model.model.model.layers.1.mlp.gate_up_proj.lora_A.weight"));
  CHECK_FALSE(adapter.find("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"));
  std::ifstream cfg_in(out + "/final/adapter/adapter_config.json");
  const nlohmann::json cfg = nlohmann::json::parse(cfg_in);
  CHECK(cfg["target_modules"] == nlohmann::json({"o_proj", "down_proj", "qkv_proj", "gate_up_proj"}));
}

}  // namespace strata
