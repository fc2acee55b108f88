// Golden tests of the GRPO objectives through the streaming engine (issue 41): for llama,
// mistral, qwen2 and qwen3 and every case of tools/golden/make_grpo_goldens.py (each loss_type
// with and without beta, old log-probs with clipping active, temperatures != 1), the loss, the
// clip ratio and KL, and every parameter gradient against TRL 1.16's float64 _compute_loss
// (tests/models/grpo_golden.h: 1e-5 relative loss, 1e-4 relative L2 per tensor). Also
// `strata grad --objective grpo` itself, and the host loss's derivatives against differences.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "io/hf_config.h"
#include "offload/objective/grpo_head.h"
#include "offload/objective/grpo_loss.h"
#include "offload/state/host_store.h"
#include "offload/state/model_io.h"
#include "tests/models/grpo_golden.h"
#include "tests/testing.h"

namespace strata {

TEST_CASE("GRPO losses in f32 match TRL's float64 goldens for every family", "[golden][grpo][models]") {
  auto dev = device_create(DeviceOptions{});
  for (const char* family : grpo_golden::kFamilies)
    for (const char* name : grpo_golden::kCases) {
      for (WeightsMode w : {WeightsMode::device, WeightsMode::stream}) {
        const grpo_golden::CaseResult r = grpo_golden::run_case(*dev, family, name, w);
        if (w == WeightsMode::device)
          std::printf("grpo golden %-8s %-10s loss %.10f worst grad rel L2 %.2e (%s)\n", family, name, r.loss,
                      r.worst_grad_rel_l2, r.worst_name.c_str());
      }
    }
}

// d loss / d logp of the host loss against central differences of its value, every loss_type,
// with old log-probs far enough from the policy's that both clip bounds bite.
TEST_CASE("GRPO host loss derivatives match finite differences", "[grpo]") {
  std::vector<GrpoRow> rows(3);
  uint64_t seed = 7;
  auto next = [&seed] {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    return double(seed >> 11) / double(1ull << 53);
  };
  const int64_t lens[] = {5, 1, 4};
  for (size_t b = 0; b < rows.size(); ++b) {
    rows[b].advantage = b == 1 ? -0.8 : (b == 0 ? 1.3 : 0.4);
    for (int64_t t = 0; t < lens[b]; ++t) {
      const double lp = -0.1 - 3 * next();
      rows[b].logp.push_back(lp);
      rows[b].old_logp.push_back(lp + (next() - 0.5));
      rows[b].ref_logp.push_back(lp + (next() - 0.5) * 2);
    }
  }
  for (const char* type : {"grpo", "bnpo", "dr_grpo", "dapo"}) {
    GrpoParams p;
    p.loss_type = grpo_loss_type_parse(type);
    p.beta = 0.07;
    p.epsilon = 0.1;
    p.epsilon_high = 0.15;
    p.max_completion_length = 6;
    const GrpoStepTotals totals{2, 17};  // a step of two micro-batches, 17 tokens
    const GrpoLoss got = grpo_loss(p, rows, totals);
    CHECK(got.metrics.clip_low + got.metrics.clip_high > 0);
    for (size_t b = 0; b < rows.size(); ++b)
      for (size_t t = 0; t < rows[b].logp.size(); ++t) {
        auto at = [&](double h) {
          std::vector<GrpoRow> q = rows;
          q[b].logp[t] += h;
          return grpo_loss(p, q, totals).loss;
        };
        const double h = 1e-6, fd = (at(h) - at(-h)) / (2 * h);
        INFO(type << " row " << b << " token " << t << " fd " << fd << " got " << got.d_logp[b][t]);
        CHECK(std::abs(fd - got.d_logp[b][t]) <= 1e-7 + 1e-6 * std::abs(fd));
      }
  }
  CHECK_THROWS_WITH(grpo_loss_type_parse("ppo"), Catch::Contains("grpo, bnpo, dr_grpo or dapo"));
}

TEST_CASE("strata grad --objective grpo prints the loss and writes the gradients", "[golden][grpo][cli]") {
  testing::TempDir tmp("grpo_grad_cli");
  const std::string tmpd = tmp.path.string();
  const std::string model = testing::source_path("tests/golden/qwen2");
  const nlohmann::json all = grpo_golden::read_cases("qwen2");
  const nlohmann::json& c = all["cases"]["dr_grpo_kl"];
  {
    std::ofstream f(tmpd + "/batch.json");
    f << grpo_golden::case_batch(all, "dr_grpo_kl").dump();
  }
  char flags[256];
  std::snprintf(flags, sizeof flags, " --beta %.17g --epsilon %.17g --epsilon-high %.17g --temperature %.17g "
                "--loss-type dr_grpo --max-completion-length %d", c["beta"].get<double>(), c["epsilon"].get<double>(),
                c["epsilon_high"].get<double>(), c["temperature"].get<double>(), c["max_completion_length"].get<int>());
  const testing::ProcessResult r = testing::run_strata("grad --model " + model + " --batch " + tmpd +
                                                       "/batch.json --out " + tmpd + "/g.safetensors --objective grpo" +
                                                       flags, /*stdout_only=*/true);
  REQUIRE(r.code == 0);
  const nlohmann::json got = nlohmann::json::parse(r.out);
  CHECK(std::abs(got["loss"].get<double>() - c["loss"].get<double>()) <= 1e-5 * std::abs(c["loss"].get<double>()));
  CHECK(got["tokens"].get<int64_t>() == c["tokens"].get<int64_t>());
  CHECK(std::abs(got["clip_ratio"].get<double>() - c["clip_ratio"].get<double>()) <= 1e-6);  // TRL logs it in float32
  SafetensorsFile file = SafetensorsFile::open(tmpd + "/g.safetensors");
  SafetensorsFile ref = SafetensorsFile::open(testing::source_path("tests/golden/grpo/qwen2/dr_grpo_kl_grads.safetensors"));
  for (const char* name : {"model.norm.weight", "model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight"}) {
    INFO(name);
    const SafetensorsEntry* a = file.find(name);
    const SafetensorsEntry* b = ref.find(name);
    REQUIRE(a);
    REQUIRE(b);
    CHECK(testing::max_rel_error(static_cast<const float*>(file.data(*a)), static_cast<const float*>(ref.data(*b)),
                                 size_t(b->numel())) <= 1e-4);
  }
  // beta > 0 without reference log-probs: exit 2 naming the key
  nlohmann::json noref = grpo_golden::case_batch(all, "dr_grpo_kl");
  noref.erase("ref_per_token_logps");
  {
    std::ofstream f(tmpd + "/noref.json");
    f << noref.dump();
  }
  const testing::ProcessResult r2 = testing::run_strata("grad --model " + model + " --batch " + tmpd +
                                                        "/noref.json --out " + tmpd + "/g2.safetensors --objective grpo --beta 0.1");
  CHECK(r2.code == 2);
  CHECK(r2.out.find("ref_per_token_logps") != std::string::npos);
  // dr_grpo without its denominator
  const testing::ProcessResult r3 = testing::run_strata("grad --model " + model + " --batch " + tmpd +
                                                        "/noref.json --out " + tmpd + "/g3.safetensors --objective grpo --loss-type dr_grpo");
  CHECK(r3.code == 2);
  CHECK(r3.out.find("--max-completion-length") != std::string::npos);
}

TEST_CASE("GRPO's temperature scales the final norm to logits / T, Gemma's (1 + w) norm included", "[grpo]") {
  // logits / T = rmsnorm(x) · s / T W^T with s = g (Llama) or 1 + g (Gemma): the passes must see
  // s / T, and after them the weight is back bit for bit and its gradient scaled by 1 / T
  for (const char* family : {"llama", "gemma3"}) {
    INFO(family);
    auto dev = device_create(DeviceOptions{});
    const ModelConfig config = hf_config_load(testing::source_path(std::string("tests/golden/") + family + "/config.json"));
    HostStore store(*dev, model_spec_build(config, DType::f32));
    model_init_weights(store, 3);
    const size_t row = size_t(store.spec().final_norm);
    const int64_t n = store.working_table()[row].numel();
    float* w = static_cast<float*>(store.working_of(row));
    for (int64_t i = 0; i < n; ++i) w[i] = 0.3f + 0.01f * float(i % 17);  // not all ones: the offset matters
    const std::vector<float> before(w, w + n);
    const bool plus_one = model_norm_plus_one(config);
    CHECK(plus_one == (std::string(family) == "gemma3"));
    const double T = 0.7;
    {
      GrpoTemperature t(store, T);
      for (int64_t i = 0; i < n; ++i) {
        const double s = plus_one ? 1.0 + before[size_t(i)] : before[size_t(i)];
        const double scaled = plus_one ? 1.0 + w[i] : w[i];
        CHECK(scaled == Approx(s / T).epsilon(1e-6));
      }
      float* g = store.grad_of(row);
      for (int64_t i = 0; i < n; ++i) g[i] = 1.f;
      t.finish();
      for (int64_t i = 0; i < n; ++i) CHECK(g[i] == Approx(1 / T).epsilon(1e-6));
    }
    CHECK(std::equal(before.begin(), before.end(), w));
  }
}

}  // namespace strata
