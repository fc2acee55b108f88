// Golden tests of the preference objectives through the streaming engine: for llama, mistral,
// qwen2 and qwen3 (tiny models of tests/golden/<family>) and dpo, ipo, simpo and orpo, the loss,
// the pairs' log-prob sums and every parameter gradient against the fp64 torch reference of
// tools/golden/make_preference_grad_goldens.py (tests/golden/preference/<family>/). Also
// `strata grad --objective` itself: its JSON, its gradient file, and the contract's default
// reference (the model's own sums: DPO's loss is then exactly log 2).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "offload/objective/preference_head.h"
#include "src/recipe/recipe_modes.h"
#include "tests/testing.h"

namespace strata {
namespace {

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("missing " + path);
  return nlohmann::json::parse(in);
}

std::vector<std::vector<int32_t>> rows_of(const nlohmann::json& j) {
  std::vector<std::vector<int32_t>> rows;
  for (auto& r : j) rows.push_back(r.get<std::vector<int32_t>>());
  return rows;
}

// Relative L2 error of each tensor of `table`: ||got - want|| / ||want||.
double worst_rel_l2(const TensorTable& table, const std::vector<float>& got, const std::vector<float>& want,
                    std::string* worst_name) {
  double worst = 0;
  for (const auto& row : table.rows()) {
    const float* a = got.data() + row.offset / 4;
    const float* b = want.data() + row.offset / 4;
    double num = 0, den = 0;
    for (int64_t i = 0; i < row.numel(); ++i) {
      num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
      den += double(b[i]) * b[i];
    }
    const double e = std::sqrt(num / std::max(den, 1e-300));
    INFO(row.name << " rel L2 " << e);
    CHECK(e <= 1e-4);
    if (e >= worst) worst = e, *worst_name = row.name;
  }
  return worst;
}

struct PreferenceGolden {
  std::string model_dir, dir;
  MicroBatch mb;
  PreferenceLayout layout;
};

PreferenceGolden load_batch(const std::string& family) {
  PreferenceGolden g;
  g.model_dir = testing::source_path("tests/golden/" + family);
  g.dir = testing::source_path("tests/golden/preference/" + family);
  const nlohmann::json b = read_json(g.dir + "/batch.json");
  g.mb = preference_micro_batch(rows_of(b["chosen_input_ids"]), rows_of(b["chosen_labels"]),
                                rows_of(b["rejected_input_ids"]), rows_of(b["rejected_labels"]), &g.layout);
  g.layout.ref_chosen = b["ref_chosen_logps"].get<std::vector<double>>();
  g.layout.ref_rejected = b["ref_rejected_logps"].get<std::vector<double>>();
  g.layout.totals = preference_layout_totals(g.mb, g.layout);
  return g;
}

}  // namespace

TEST_CASE("preference objectives in f32 match the fp64 torch goldens for every family",
          "[golden][preference][models]") {
  for (const char* family : {"llama", "mistral", "qwen2", "qwen3"}) {
    const PreferenceGolden g = load_batch(family);
    for (const char* objective : {"dpo", "ipo", "simpo", "orpo"}) {
      INFO(family << " " << objective);
      const nlohmann::json want = read_json(g.dir + "/" + objective + ".json");
      PreferenceParams params;
      params.objective = preference_objective_parse(objective);
      params.beta = want["beta"].get<double>();
      params.gamma = want["gamma"].get<double>();
      for (const char* weights : {"device", "stream"}) {
        INFO("offload.weights = " << weights);
        auto dev = device_create(DeviceOptions{});
        HostStore store(*dev, model_spec_build(hf_config_load(g.model_dir), DType::f32));
        model_load_weights(store, g.model_dir);
        EngineOptions eo;
        eo.weights = weights_mode_parse(weights);
        eo.checkpoints = std::string(weights) == "device" ? CheckpointMode::device : CheckpointMode::host;
        eo.max_batch = g.mb.B;
        eo.max_tokens = g.mb.T;
        Engine engine(*dev, store, eo);
        auto owned = std::make_unique<PreferenceHead>(*dev, params, g.mb.B * g.mb.T);
        PreferenceHead* head = owned.get();
        head->set_layout(g.layout);
        engine.set_loss_objective(std::move(owned));
        const double loss = engine.forward_backward(g.mb, 1.f);
        engine.synchronize();
        const double want_loss = want["loss"].get<double>();
        CHECK(std::abs(loss - want_loss) <= 1e-5 * std::abs(want_loss));
        const auto wc = want["chosen_logps"].get<std::vector<double>>();
        const auto wr = want["rejected_logps"].get<std::vector<double>>();
        REQUIRE(head->pairs().size() == wc.size());
        for (size_t i = 0; i < wc.size(); ++i) {
          CHECK(std::abs(head->pairs()[i].chosen_logp - wc[i]) <= 1e-5 * std::abs(wc[i]));
          CHECK(std::abs(head->pairs()[i].rejected_logp - wr[i]) <= 1e-5 * std::abs(wr[i]));
        }
        std::vector<float> grads(store.grad(), store.grad() + store.f32_floats());
        // the reference gradients, laid out like the store's f32 table
        SafetensorsFile file = SafetensorsFile::open(g.dir + "/" + objective + "_grads.safetensors");
        std::vector<float> want_grads(grads.size(), 0.f);
        for (const auto& row : store.f32_table().rows()) {
          const SafetensorsEntry* e = file.find(row.name);
          REQUIRE(e);
          REQUIRE(e->shape == row.shape);
          const float* w = static_cast<const float*>(file.data(*e));
          std::copy(w, w + row.numel(), want_grads.begin() + std::ptrdiff_t(row.offset / 4));
        }
        std::string worst_name;
        const double worst = worst_rel_l2(store.f32_table(), grads, want_grads, &worst_name);
        if (std::string(weights) == "device")
          std::printf("preference golden %-8s %-5s loss %.10f (want %.10f) worst grad rel L2 %.2e (%s)\n", family,
                      objective, loss, want_loss, worst, worst_name.c_str());
      }
    }
  }
}

TEST_CASE("strata grad --objective prints the loss and sums and writes the gradients", "[golden][preference][cli]") {
  testing::TempDir tmp("preference_grad_cli");
  const std::string tmpd = tmp.path.string();
  const std::string dir = testing::source_path("tests/golden/preference/qwen3");
  const std::string model = testing::source_path("tests/golden/qwen3");
  const nlohmann::json want = read_json(dir + "/orpo.json");
  const testing::ProcessResult r = testing::run_strata(
      "grad --model " + model + " --batch " + dir + "/batch.json --out " + tmpd + "/g.safetensors --objective orpo --beta 0.25",
      /*stdout_only=*/true);
  REQUIRE(r.code == 0);
  const nlohmann::json got = nlohmann::json::parse(r.out);
  CHECK(got["pairs"].get<int>() == 3);
  CHECK(std::abs(got["loss"].get<double>() - want["loss"].get<double>()) <= 1e-5 * want["loss"].get<double>());
  const auto wc = want["chosen_logps"].get<std::vector<double>>();
  const auto gc = got["chosen_logps"].get<std::vector<double>>();
  REQUIRE(gc.size() == wc.size());
  for (size_t i = 0; i < wc.size(); ++i) CHECK(std::abs(gc[i] - wc[i]) <= 1e-5 * std::abs(wc[i]));
  CHECK(got["rejected_logps"].size() == 3);
  // the written gradients are the golden's
  SafetensorsFile file = SafetensorsFile::open(tmpd + "/g.safetensors");
  SafetensorsFile ref = SafetensorsFile::open(dir + "/orpo_grads.safetensors");
  for (const char* name : {"model.norm.weight", "model.embed_tokens.weight", "lm_head.weight"}) {
    INFO(name);
    const SafetensorsEntry* a = file.find(name);
    const SafetensorsEntry* b = ref.find(name);
    REQUIRE(a);
    REQUIRE(b);
    const float* x = static_cast<const float*>(file.data(*a));
    const float* y = static_cast<const float*>(ref.data(*b));
    CHECK(testing::max_rel_error(x, y, size_t(b->numel())) <= 1e-4);
  }

  // No reference sums: the model's own, so DPO's margin is 0 and its loss log 2.
  nlohmann::json batch = read_json(dir + "/batch.json");
  batch.erase("ref_chosen_logps");
  batch.erase("ref_rejected_logps");
  {
    std::ofstream f(tmpd + "/noref.json");
    f << batch.dump();
  }
  const testing::ProcessResult r2 = testing::run_strata(
      "grad --model " + model + " --batch " + tmpd + "/noref.json --out " + tmpd + "/g2.safetensors --objective dpo",
      true);
  REQUIRE(r2.code == 0);
  CHECK(std::abs(nlohmann::json::parse(r2.out)["loss"].get<double>() - std::log(2.0)) <= 1e-12);

  // A preference objective needs a preference batch: exit 2 naming the fields.
  const testing::ProcessResult r3 = testing::run_strata("grad --model " + model + " --batch " + model +
                                                        "/batch.json --out " + tmpd + "/g3.safetensors --objective simpo");
  CHECK(r3.code == 2);
  CHECK(r3.out.find("chosen_input_ids") != std::string::npos);
}

}  // namespace strata
