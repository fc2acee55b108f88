// The zeroth-order engine (offload/engine/engine_zo.h) on the families beyond the Llama one: its
// clean forward on the transformers goldens (Gemma 3, OLMo 2, Phi-3 with LongRoPE's short and long
// tables, Qwen3-MoE, Mixtral) gives transformers' float64 loss within 1e-5 relative (the engine
// returns the sum over counted tokens), and its dual forward's two losses differ and average to
// the clean loss up to the second-order term (measured <= 1e-4 relative at eps 1e-3).
// Each kind runs its forward through the ZO engine's own buffers and dims (LayerDims::max_pos for
// LongRoPE, the MoE kind's host routing), not the first-order engine's.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>

#include "offload/engine/engine_zo.h"
#include "offload/state/model_io.h"
#include "tests/testing.h"

namespace strata {

TEST_CASE("ZO forwards match transformers' float64 loss on Gemma 3, OLMo 2, Phi-3 and the MoE goldens",
          "[zo][engine][gemma][phi3][moe]") {
  auto dev = device_create(DeviceOptions{});
  for (const char* name : {"gemma3", "olmo2", "phi3", "phi3_long", "qwen3_moe", "mixtral"}) {
    INFO(name);
    const testing::Golden g = testing::Golden::load(name);
    HostStore store(*dev, model_spec_build(hf_config_load(g.dir), DType::f32));
    model_load_weights(store, g.dir);
    EngineOptions eo;
    eo.max_batch = g.batch.B;
    eo.max_tokens = g.batch.T;
    eo.checkpoints = CheckpointMode::host;
    ZoEngine engine(*dev, store, eo);
    const double clean = engine.forward_loss(g.batch);  // summed over the counted tokens
    const double err = std::abs(clean / double(g.tokens) - g.loss) / std::abs(g.loss);
    const float eps = 1e-3f;
    const ZoLosses l = engine.dual_forward(g.batch, 77, eps);
    const double mid = 0.5 * (l.plus + l.minus);
    std::printf("zo %-10s clean loss rel err %.2e; L+ %.7f L- %.7f, their mean - clean %.2e\n", name, err, l.plus,
                l.minus, mid - clean);
    CHECK(err <= 1e-5);
    CHECK(l.plus != l.minus);
    // the mean of f(θ + εz) and f(θ − εz) is f(θ) + (ε² / 2) zᵀHz + ...
    CHECK(std::abs(mid - clean) <= 1e-3 * std::abs(clean));
  }
}

}  // namespace strata
