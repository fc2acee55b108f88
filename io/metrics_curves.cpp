#include "io/metrics_curves.h"

#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>

#include "io/json.h"
#include "src/core/error.h"

namespace strata {
namespace {

// A loss or lr field: a number, or null for the NaN/inf that JSON cannot hold.
double metrics_number(const nlohmann::json& rec, const char* key, const std::string& where) {
  auto it = rec.find(key);
  if (it == rec.end() || it->is_null()) return NAN;
  STRATA_CHECK(it->is_number(), where, ": \"", key, "\" must be a number or null, found ", it->dump());
  return it->get<double>();
}

}  // namespace

MetricsCurves metrics_read_curves(const std::string& path) {
  std::ifstream in(path);
  STRATA_CHECK_IO(in.is_open(), "cannot open ", path, ": ", std::strerror(errno));
  std::map<int64_t, std::pair<double, double>> train;  // step -> (loss, lr); the last record wins
  std::map<int64_t, double> eval;
  std::map<int64_t, std::pair<double, double>> pref, eval_pref;  // step -> (margins, accuracies)
  std::map<int64_t, double> reward;  // step -> GRPO's mean reward
  std::map<int64_t, std::array<double, 3>> workers;  // step -> (loss spread, grad-norm spread, cosine)
  MetricsCurves out;
  std::string line;
  int64_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    const bool terminated = !in.eof();
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(lineno);
    nlohmann::json rec;
    try {
      rec = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      if (!terminated) {  // a record still being written, or torn by a kill
        ++out.skipped_torn_lines;
        break;
      }
      STRATA_CHECK(false, where, ": not valid JSON (", e.what(), "); fix or delete that line");
    }
    STRATA_CHECK(rec.is_object(), where, ": expected a JSON object, found ", rec.dump());
    auto step = rec.find("step");
    STRATA_CHECK(step != rec.end() && step->is_number_integer() && step->get<int64_t>() >= 0, where,
                 ": expected a non-negative integer \"step\"");
    const int64_t s = step->get<int64_t>();
    if (rec.contains("loss")) train[s] = {metrics_number(rec, "loss", where), metrics_number(rec, "lr", where)};
    if (rec.contains("eval_loss")) eval[s] = metrics_number(rec, "eval_loss", where);
    if (rec.contains("loss"))
      pref[s] = {metrics_number(rec, "rewards/margins", where), metrics_number(rec, "rewards/accuracies", where)};
    if (rec.contains("loss")) reward[s] = metrics_number(rec, "reward", where);
    if (rec.contains("loss")) workers.erase(s);  // the last record of a step wins
    if (rec.contains("loss") && rec.contains("workers")) {
      const nlohmann::json& w = rec["workers"];
      STRATA_CHECK(w.is_object(), where, ": \"workers\" must be an object, found ", w.dump());
      workers[s] = {metrics_number(w, "loss_spread", where), metrics_number(w, "grad_norm_spread", where),
                    metrics_number(w, "cosine", where)};
    }
    if (rec.contains("eval_loss"))
      eval_pref[s] = {metrics_number(rec, "eval_rewards/margins", where),
                      metrics_number(rec, "eval_rewards/accuracies", where)};
  }
  STRATA_CHECK_IO(!in.bad(), "reading ", path, " failed: ", std::strerror(errno));
  for (auto& [s, v] : train) {
    out.steps.push_back(s);
    out.loss.push_back(v.first);
    out.lr.push_back(v.second);
  }
  for (auto& [s, v] : eval) {
    out.eval_steps.push_back(s);
    out.eval_loss.push_back(v);
  }
  for (auto& [s, v] : pref) out.margins.push_back(v.first), out.accuracies.push_back(v.second);
  for (auto& [s, v] : reward) out.reward.push_back(v);
  for (auto& [s, v] : eval_pref) out.eval_margins.push_back(v.first), out.eval_accuracies.push_back(v.second);
  for (auto& [s, v] : workers) {
    out.worker_steps.push_back(s);
    out.worker_loss_spread.push_back(v[0]);
    out.worker_grad_norm_spread.push_back(v[1]);
    out.worker_cosine.push_back(v[2]);
  }
  return out;
}

bool MetricsCurves::has_reward() const {
  for (double x : reward)
    if (std::isfinite(x)) return true;
  return false;
}

bool MetricsCurves::has_preference() const {
  for (const auto* v : {&margins, &accuracies, &eval_margins, &eval_accuracies})
    for (double x : *v)
      if (std::isfinite(x)) return true;
  return false;
}

}  // namespace strata
