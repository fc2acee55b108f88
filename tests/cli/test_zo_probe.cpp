// `strata zo-probe` on the four golden families (tests/golden), in f32, checked end to end
// through files: the z it writes, models written as θ ± εz with that z and reloaded by
// `strata grad`, and the gradient `strata grad` gives for θ.
//   - loss_plus and loss_minus equal the reloaded models' losses within 1e-6 relative;
//   - projected_grad equals their central difference;
//   - projected_grad − ∇L·z shrinks as ε² (a central difference's truncation error), measured as
//     the slope of log |error| against log ε, not as a fixed tolerance.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>

#include "io/safetensors.h"
#include "offload/state/host_store.h"
#include "offload/state/model_io.h"
#include "tests/testing.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using testing::Golden;

struct Probe {
  double loss = 0, plus = 0, minus = 0, g = 0, eps = 0;
};

Probe zo_probe(const std::string& model, const std::string& batch, uint64_t seed, double eps, const std::string& z_out) {
  const auto r = testing::run_strata("zo-probe --model " + model + " --batch " + batch + " --seed " +
                                         std::to_string(seed) + " --eps " + std::to_string(eps) + " --out " + z_out,
                                     /*stdout_only=*/true);
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(r.out);
  return {j["loss"].get<double>(), j["loss_plus"].get<double>(), j["loss_minus"].get<double>(),
          j["projected_grad"].get<double>(), j["eps"].get<double>()};
}

// `strata grad` on a model dir: the loss; the gradients land in grads_out.
double strata_grad_loss(const std::string& model, const std::string& batch, const std::string& grads_out) {
  const auto r = testing::run_strata("grad --model " + model + " --batch " + batch + " --out " + grads_out, true);
  INFO(r.out);
  REQUIRE(r.code == 0);
  return nlohmann::json::parse(r.out)["loss"].get<double>();
}

// A tensor of a safetensors file as floats (the data may be unaligned).
std::vector<float> read_f32(const SafetensorsFile& f, const std::string& name) {
  const SafetensorsEntry* e = f.find(name);
  REQUIRE(e != nullptr);
  REQUIRE(e->dtype == DType::f32);
  std::vector<float> v(size_t(e->end - e->begin) / 4);
  std::memcpy(v.data(), f.data(*e), v.size() * 4);
  return v;
}

// θ + sign·ε·z for every parameter (z from the probe's file), written as an HF model dir: the
// product rounded to f32, then the sum (volatile keeps the compiler from fusing them, as the
// generator's kernels never do).
void write_perturbed(const Golden& g, const SafetensorsFile& z, float eps, int sign, const std::string& dir) {
  auto dev = device_create(DeviceOptions{});
  HostStore store(*dev, model_spec_build(hf_config_load(g.dir), DType::f32));
  model_load_weights(store, g.dir);
  const TensorTable& params = store.spec().params;
  for (size_t r = 0; r < params.size(); ++r) {
    std::vector<float> w(size_t(params[r].numel()));
    store.get_param(r, w.data());
    const std::vector<float> zr = read_f32(z, params[r].name);
    REQUIRE(zr.size() == w.size());
    const float scale = float(sign) * eps;
    for (size_t i = 0; i < w.size(); ++i) {
      volatile float step = scale * zr[i];
      w[i] = w[i] + step;
    }
    store.set_param(r, w.data());
  }
  model_save_hf(store, dir, DType::f32);
}

// ∇L·z in fp64 over every parameter of the gradient file (tied embeddings once in both files).
double grad_dot_z(const std::string& grads_path, const SafetensorsFile& z) {
  const SafetensorsFile g = SafetensorsFile::open(grads_path);
  REQUIRE(g.entries().size() == z.entries().size());
  double dot = 0;
  for (const auto& e : g.entries()) {
    const std::vector<float> gv = read_f32(g, e.name), zv = read_f32(z, e.name);
    REQUIRE(gv.size() == zv.size());
    for (size_t i = 0; i < gv.size(); ++i) dot += double(gv[i]) * double(zv[i]);
  }
  return dot;
}

}  // namespace

TEST_CASE("zo-probe: L(θ ± εz) are the losses of the models θ ± εz written with its z and reloaded", "[zo][cli]") {
  testing::for_each_golden([](const char* name, const Golden& g) {
    testing::TempDir tmp(std::string("zo_probe_") + name);
    const std::string batch = g.dir + "/batch.json", z_path = (tmp.path / "z.safetensors").string();
    const uint64_t seed = 20260415;
    const Probe p = zo_probe(g.dir, batch, seed, 1e-3, z_path);
    const SafetensorsFile z = SafetensorsFile::open(z_path);
    // every parameter under its HF name, F32, a tied lm_head once (as the embedding)
    const ModelSpec spec = model_spec_build(hf_config_load(g.dir), DType::f32);
    CHECK(z.entries().size() == spec.params.size());
    CHECK((z.find("lm_head.weight") == nullptr) == (spec.lm_head == kAbsent));

    const std::string plus_dir = (tmp.path / "plus").string(), minus_dir = (tmp.path / "minus").string();
    write_perturbed(g, z, float(p.eps), +1, plus_dir);
    write_perturbed(g, z, float(p.eps), -1, minus_dir);
    const double ref_plus = strata_grad_loss(plus_dir, batch, (tmp.path / "gp.safetensors").string());
    const double ref_minus = strata_grad_loss(minus_dir, batch, (tmp.path / "gm.safetensors").string());
    const double ref_clean = strata_grad_loss(g.dir, batch, (tmp.path / "g.safetensors").string());
    std::printf("zo-probe %-8s L %.9f L+ %.9f (reloaded %.9f) L- %.9f (reloaded %.9f) g %.6f\n", name, p.loss,
                p.plus, ref_plus, p.minus, ref_minus, p.g);
    CHECK(std::abs(p.plus - ref_plus) <= 1e-6 * std::abs(ref_plus));
    CHECK(std::abs(p.minus - ref_minus) <= 1e-6 * std::abs(ref_minus));
    CHECK(std::abs(p.loss - ref_clean) <= 1e-6 * std::abs(ref_clean));
    CHECK(std::abs(p.loss - g.loss) <= 2e-6 * std::abs(g.loss));  // and the clean loss is the torch golden's
    // The central difference of the reloaded losses: the losses agree to 1e-6 relative, so the
    // quotients to 1e-6 |L| / ε.
    const double central = (ref_plus - ref_minus) / (2 * p.eps);
    CHECK(std::abs(p.g - central) <= 1e-6 * std::abs(ref_plus) / p.eps);
    // z is not a zero or constant tensor: the perturbation moved the loss
    CHECK(p.plus != p.minus);
  });
}

TEST_CASE("zo-probe: projected_grad approaches ∇L·z as ε shrinks, as a second-order difference", "[zo][cli]") {
  testing::for_each_golden([](const char* name, const Golden& g) {
    testing::TempDir tmp(std::string("zo_conv_") + name);
    const std::string batch = g.dir + "/batch.json", z_path = (tmp.path / "z.safetensors").string();
    const std::string grads = (tmp.path / "g.safetensors").string();
    strata_grad_loss(g.dir, batch, grads);
    const uint64_t seed = 77;
    std::vector<double> eps_list = {0.01, 0.005, 0.0025, 0.00125}, err;
    double dot = 0;
    for (double eps : eps_list) {
      const Probe p = zo_probe(g.dir, batch, seed, eps, z_path);
      if (err.empty()) dot = grad_dot_z(grads, SafetensorsFile::open(z_path));
      err.push_back(std::abs(p.g - dot));
      std::printf("zo-probe %-8s eps %.3g projected_grad %.8f grad.z %.8f |diff| %.3e\n", name, p.eps, p.g, dot,
                  err.back());
    }
    // each halving of ε divides the error by about 4 (slope 2 in log-log); a first-order
    // (one-sided) difference or a z that differs from the written one would give slope <= 1
    for (size_t i = 1; i < err.size(); ++i) {
      const double slope = std::log(err[i - 1] / err[i]) / std::log(eps_list[i - 1] / eps_list[i]);
      INFO("eps " << eps_list[i - 1] << " -> " << eps_list[i] << ": slope " << slope);
      CHECK(slope > 1.6);
      CHECK(slope < 2.4);
    }
  });
}

}  // namespace strata
