// Honest metrics (issue 10, item 5): every time field of metrics.jsonl means what its name says
// (recipes/README.md), so compute, waits, exposed optimizer time and saving add up to about
// the step time; MFU, against the device's peak for the run's dtype, stays in (0, 1].
#include <catch2/catch.hpp>
#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/hf_config.h"
#include "models/model_spec.h"
#include "src/device/peak_flops.h"
#include "src/recipe/recipe.h"
#include "src/train/trainer.h"
#include "tests/testing.h"

namespace strata {

TEST_CASE("time fields add up to the step time and MFU stays above 0 and at most 1 on both dtypes", "[mfu][train]") {
  for (const char* dtype : {"f32", "bf16"}) {
    for (const char* clip : {"1.0", "0.0"}) {  // the optimizer after backward, and inside it
      DYNAMIC_SECTION(dtype << " max_grad_norm " << clip) {
        testing::TempDir tmp(std::string("metrics_time_") + dtype + clip);
        const std::string out = (tmp.path / "out").string();
        Recipe rc = recipe_load(testing::source_path("recipes/quickstart.toml"),
                                {"data.sequence_len=64", "train.micro_batch_size=2", "train.log_steps=100",
                                 "checkpoint.output_dir=" + out, "device.cpu_threads=2", "train.max_steps=6",
                                 "checkpoint.save_steps=3", std::string("model.dtype=") + dtype,
                                 std::string("optim.max_grad_norm=") + clip, "device.link_bandwidth=200MB/s"});
        train_run(rc);
        // MFU's parts, computed here: model FLOPs per token (6 per matmul weight, the tied
        // embedding as lm_head, plus causal attention) over this process's peak for the dtype
        const ModelSpec spec = model_spec_build(hf_config_load(rc.model_config), dtype_parse(dtype));
        double matmul_params = 0;
        for (auto& row : spec.params.rows())
          if (row.shape.size() == 2 && row.name != "model.embed_tokens.weight") matmul_params += double(row.numel());
        if (spec.lm_head == kAbsent) matmul_params += double(spec.params[size_t(spec.embed)].numel());
        const auto& c = spec.config;
        const double flops_per_token = 6.0 * matmul_params + 6.0 * double(c.num_hidden_layers * c.num_attention_heads *
                                                                          c.head_dim * rc.sequence_len);
        const double peak = cpu_measured_peak(dtype_parse(dtype)).flops_per_s;
        std::ifstream in(out + "/metrics.jsonl");
        std::string line;
        double step_total = 0, parts_total = 0, saved = 0;
        int steps = 0;
        while (std::getline(in, line)) {
          auto j = nlohmann::json::parse(line);
          if (!j.contains("loss")) continue;
          ++steps;
          const double mfu = j["mfu"];
          CHECK(mfu > 0);
          CHECK(mfu <= 1);
          CHECK(mfu == Approx(std::min(1.0, j["tokens_per_s"].get<double>() * flops_per_token / peak)));
          for (const char* k : {"compute_s", "h2d_wait_s", "d2h_wait_s", "optimizer_s", "optimizer_exposed_s", "save_s"})
            CHECK(j[k].get<double>() >= 0);
          const double parts = j["compute_s"].get<double>() + j["h2d_wait_s"].get<double>() +
                               j["d2h_wait_s"].get<double>() + j["optimizer_exposed_s"].get<double>() +
                               j["save_s"].get<double>();
          INFO("step " << j["step"] << ": parts " << parts << " of step_s " << j["step_s"]);
          CHECK(parts <= 1.2 * j["step_s"].get<double>() + 2e-3);  // nothing counted twice
          step_total += j["step_s"].get<double>();
          parts_total += parts;
          saved += j["save_s"].get<double>();
        }
        CHECK(steps == 6);
        CHECK(saved > 0);  // steps 3 and 6 saved, inside their step time
        INFO("parts " << parts_total << " of " << step_total << " s");
        // a loose bound: the trainer thread's own work (batches, issuing ops) is the rest
        CHECK(parts_total >= 0.7 * step_total);
        CHECK(parts_total <= 1.08 * step_total);
      }
    }
  }
}

}  // namespace strata
