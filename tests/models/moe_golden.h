// The mixture-of-experts golden harness (tests/golden/qwen3_moe, tests/golden/mixtral, from
// tools/golden/make_moe_goldens.py: transformers' own Qwen3MoeForCausalLM / MixtralForCausalLM in
// float64): one engine step on either backend, with or without the load-balancing loss, and the
// errors the issue states its bar in (loss relative, each gradient's relative L2).
#pragma once
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/testing.h"

namespace strata::moe_testing {

// A golden's reference with (aux) or without the load-balancing loss.
struct MoeReference {
  double loss = 0;
  std::vector<float> grads;  // laid out like the step's table
};

inline nlohmann::json moe_expected(const testing::Golden& g) {
  std::ifstream in(g.dir + "/expected.json");
  return nlohmann::json::parse(in);
}

inline MoeReference moe_reference(const testing::Golden& g, const TensorTable& table, size_t floats, bool aux) {
  MoeReference r;
  r.loss = moe_expected(g)[aux ? "loss_aux" : "loss"].get<double>();
  SafetensorsFile file = SafetensorsFile::open(g.dir + (aux ? "/grads_aux.safetensors" : "/grads.safetensors"));
  REQUIRE(file.entries().size() == table.size());
  r.grads.assign(floats, 0.f);
  for (const auto& row : table.rows()) {
    const SafetensorsEntry* e = file.find(row.name);
    INFO(row.name);
    REQUIRE(e);
    REQUIRE(e->shape == row.shape);
    const float* w = static_cast<const float*>(file.data(*e));
    std::copy(w, w + row.numel(), r.grads.begin() + std::ptrdiff_t(row.offset / 4));
  }
  return r;
}

// ||got - want||_2 / ||want||_2 over one tensor.
inline double rel_l2(const float* got, const float* want, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = double(got[i]) - double(want[i]);
    num += d * d;
    den += double(want[i]) * double(want[i]);
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

struct MoeErrors {
  double loss_rel = 0, worst_l2 = 0, worst_inf = 0, global_l2 = 0;
  std::string worst_name;
};

// One step of golden `name` on dev (weights, checkpoints as eo says; aux: the load-balancing loss),
// compared with its reference: the loss within loss_tol, and every tensor's relative L2 within
// grad_tol (each_tensor), or all gradients together (not each_tensor: bf16, where a token whose
// top-k margin bf16 rounding crosses moves a few experts' gradients wholesale).
inline MoeErrors moe_golden_check(Device& dev, const std::string& name, DType dtype, EngineOptions eo, bool aux,
                                  double loss_tol, double grad_tol, testing::GoldenStep* step_out = nullptr,
                                  bool each_tensor = true) {
  const testing::Golden g = testing::Golden::load(name);
  eo.router_aux_loss = aux;
  const testing::GoldenStep r = testing::golden_step(dev, g, dtype, eo);
  const MoeReference ref = moe_reference(g, r.table, r.grads.size(), aux);
  MoeErrors e;
  e.loss_rel = std::abs(r.loss - ref.loss) / std::abs(ref.loss);
  CHECK(r.tokens == g.tokens);
  CHECK(e.loss_rel <= loss_tol);
  for (const auto& row : r.table.rows()) {
    const float* a = r.grads.data() + row.offset / 4;
    const float* b = ref.grads.data() + row.offset / 4;
    const double l2 = rel_l2(a, b, size_t(row.numel()));
    INFO(row.name << " relative L2 error " << l2);
    if (each_tensor) CHECK(l2 <= grad_tol);
    if (l2 >= e.worst_l2) e.worst_l2 = l2, e.worst_name = row.name;
    e.worst_inf = std::max(e.worst_inf, testing::max_rel_error(a, b, size_t(row.numel())));
  }
  e.global_l2 = rel_l2(r.grads.data(), ref.grads.data(), r.grads.size());
  if (!each_tensor) CHECK(e.global_l2 <= grad_tol);
  std::printf("moe golden %-9s %-4s %s%s loss %.9f (want %.9f, rel %.1e) worst grad rel L2 %.2e (%s), rel inf %.2e, all grads rel L2 %.2e\n",
              name.c_str(), dtype_name(dtype), dev.name().c_str(), aux ? " +aux" : "", r.loss, ref.loss, e.loss_rel,
              e.worst_l2, e.worst_name.c_str(), e.worst_inf, e.global_l2);
  if (step_out) *step_out = r;
  return e;
}

}  // namespace strata::moe_testing
