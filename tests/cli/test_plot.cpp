// `strata plot`: reading metrics.jsonl back (last record of a step wins, broken lines named by
// file:line), nice axis ticks, decimation, and the SVG itself (well-formed, the expected points,
// markers, ticks and caption), through the in-process CLI runner.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "io/metrics_curves.h"
#include "io/svg_plot.h"
#include "src/cli/commands.h"
#include "src/core/error.h"
#include "tests/testing.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

std::string plot_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / "strata_plot" / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Tags balance, every tag closes, '&' starts an entity, and the root is an <svg> with the SVG
// namespace. Returns "" when well-formed, else what is wrong.
std::string svg_problem(const std::string& s) {
  if (s.rfind("<?xml", 0) != 0) return "no XML declaration";
  std::vector<std::string> open;
  size_t i = s.find("?>") + 2;
  bool seen_root = false;
  while (true) {
    const size_t lt = s.find('<', i);
    const std::string text = s.substr(i, lt == std::string::npos ? std::string::npos : lt - i);
    for (size_t a = text.find('&'); a != std::string::npos; a = text.find('&', a + 1)) {
      const std::string rest = text.substr(a, 6);
      if (rest.rfind("&amp;", 0) && rest.rfind("&lt;", 0) && rest.rfind("&gt;", 0) && rest.rfind("&quot;", 0) &&
          rest.rfind("&apos;", 0))
        return "a bare & in text";
    }
    if (lt == std::string::npos) break;
    const size_t gt = s.find('>', lt);
    if (gt == std::string::npos) return "an unclosed tag";
    std::string tag = s.substr(lt + 1, gt - lt - 1);
    if (tag.find('<') != std::string::npos) return "'<' inside a tag: " + tag;
    if (tag.size() >= 2 && tag[0] == '/') {
      if (open.empty() || open.back() != tag.substr(1)) return "</" + tag.substr(1) + "> closes nothing open";
      open.pop_back();
    } else {
      const std::string name = tag.substr(0, tag.find_first_of(" \t\n/"));
      if (!seen_root) {
        if (name != "svg" || tag.find("xmlns=\"http://www.w3.org/2000/svg\"") == std::string::npos)
          return "the root is not an <svg xmlns=...>";
        seen_root = true;
      } else if (open.empty()) {
        return "an element after the root";
      }
      if (tag.back() != '/') open.push_back(name);
    }
    i = gt + 1;
  }
  if (!open.empty()) return "<" + open.back() + "> is never closed";
  return seen_root ? "" : "no root element";
}

// The (x, y) points of the polyline with this id; empty when there is none.
std::vector<std::pair<double, double>> polyline_points(const std::string& svg, const std::string& id) {
  std::vector<std::pair<double, double>> out;
  size_t at = svg.find("<polyline id=\"" + id + "\"");
  if (at == std::string::npos) return out;
  size_t p = svg.find("points=\"", at) + 8, end = svg.find('"', p);
  std::istringstream in(svg.substr(p, end - p));
  double x, y;
  char comma;
  while (in >> x >> comma >> y) out.push_back({x, y});
  return out;
}

// The texts inside <g id="...">.
std::vector<std::string> group_texts(const std::string& svg, const std::string& id) {
  std::vector<std::string> out;
  size_t at = svg.find("<g id=\"" + id + "\"");
  if (at == std::string::npos) return out;
  const size_t end = svg.find("</g>", at);
  for (size_t t = svg.find("<text", at); t < end; t = svg.find("<text", t + 1)) {
    size_t a = svg.find('>', t) + 1, b = svg.find("</text>", a);
    out.push_back(svg.substr(a, b - a));
  }
  return out;
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t i = s.find(what); i != std::string::npos; i = s.find(what, i + 1)) ++n;
  return n;
}

std::string step_line(int64_t step, const std::string& loss, double lr) {
  return "{\"step\":" + std::to_string(step) + ",\"loss\":" + loss + ",\"lr\":" + std::to_string(lr) +
         ",\"grad_norm\":0.5,\"tokens\":2048}\n";
}

int run_plot(const std::vector<std::string>& args, std::string* out = nullptr) {
  int rc = -1;
  std::string o = testing::run_cli(cmd_plot, args, "", &rc);
  if (out) *out = o;
  return rc;
}

// The error a command throws, or "" when it returns.
std::string plot_error(const std::vector<std::string>& args, int* exit_code) {
  try {
    run_plot(args);
  } catch (const Error& e) {
    *exit_code = e.exit_code();
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("ticks fall on 1, 2 and 5 times a power of ten and cover the range", "[plot]") {
  auto check = [](std::vector<double> got, std::vector<double> want) {
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < want.size(); ++i) CHECK(got[i] == Approx(want[i]).margin(1e-12));
  };
  check(plot_nice_ticks(0, 1, 5), {0, 0.2, 0.4, 0.6, 0.8, 1.0});
  check(plot_nice_ticks(1, 300, 8), {0, 50, 100, 150, 200, 250, 300});
  check(plot_nice_ticks(1.37, 5.52, 6), {1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 5.5, 6.0});
  check(plot_nice_ticks(0, 3e-3, 3), {0, 1e-3, 2e-3, 3e-3});
  check(plot_nice_ticks(2.07, 2.31, 5), {2.05, 2.10, 2.15, 2.20, 2.25, 2.30, 2.35});
  check(plot_nice_ticks(-7, 12, 4), {-10, -5, 0, 5, 10, 15});
  check(plot_nice_ticks(1000, 1000, 4), {900, 950, 1000, 1050, 1100});  // a single value is widened
}

TEST_CASE("decimation keeps every finite point of a short series and the extremes of a long one", "[plot]") {
  std::vector<double> y = {1, NAN, 3, INFINITY, 5};
  CHECK(plot_decimate(y, 2000) == std::vector<size_t>{0, 2, 4});
  std::vector<double> big(10000);
  for (size_t i = 0; i < big.size(); ++i) big[i] = 2.0 + 0.1 * std::sin(double(i));
  big[5003] = 9.0;   // a spike
  big[7777] = -1.0;  // a dip
  std::vector<size_t> kept = plot_decimate(big, 2000);
  CHECK(kept.size() <= 2000);
  CHECK(kept.size() >= 1000);
  CHECK(std::is_sorted(kept.begin(), kept.end()));
  CHECK(std::find(kept.begin(), kept.end(), 5003) != kept.end());
  CHECK(std::find(kept.begin(), kept.end(), 7777) != kept.end());
}

TEST_CASE("the EMA is debiased and passes over non-finite values", "[plot]") {
  std::vector<double> s = plot_smooth_ema({2.0, NAN, 4.0}, 0.5);
  CHECK(s[0] == Approx(2.0));  // debiased: the first value is itself
  CHECK(std::isnan(s[1]));
  CHECK(s[2] == Approx((0.5 * 0.5 * 2.0 + 0.5 * 4.0) / (1 - 0.25)));
}

TEST_CASE("metrics.jsonl: the last record of a step wins, eval lines are their own series, null is NaN",
          "[plot]") {
  const std::string dir = plot_dir("read");
  write_text(dir + "/metrics.jsonl",
             step_line(1, "5.0", 0.001) + step_line(2, "4.0", 0.002) + step_line(3, "9.9", 0.003) +
             "{\"step\":2,\"eval_loss\":4.5,\"eval_tokens\":100}\n" +
             step_line(3, "3.0", 0.003) +  // a resumed run wrote step 3 again
             "\n" + step_line(4, "null", 0.004) + "{\"step\":4,\"eval_loss\":3.5}\n" +
             "{\"step\":4,\"eval_loss\":3.25}\n");
  MetricsCurves c = metrics_read_curves(dir + "/metrics.jsonl");
  CHECK(c.steps == std::vector<int64_t>{1, 2, 3, 4});
  CHECK(c.loss[2] == 3.0);
  CHECK(std::isnan(c.loss[3]));
  CHECK(c.lr[1] == Approx(0.002));
  CHECK(c.eval_steps == std::vector<int64_t>{2, 4});
  CHECK(c.eval_loss == std::vector<double>{4.5, 3.25});
  CHECK(c.skipped_torn_lines == 0);
}

TEST_CASE("metrics.jsonl: a broken line is named by file:line, an unfinished last line is skipped", "[plot]") {
  const std::string dir = plot_dir("broken");
  const std::string path = dir + "/metrics.jsonl";
  write_text(path, step_line(1, "5.0", 0.001) + step_line(2, "4.0", 0.002) + "{\"step\":3,\"loss\":\n" +
                       step_line(4, "3.0", 0.004));
  try {
    metrics_read_curves(path);
    FAIL("a broken line was accepted");
  } catch (const Error& e) {
    CHECK(e.exit_code() == 2);
    CHECK(std::string(e.what()).find(path + ":3: not valid JSON") != std::string::npos);
  }
  write_text(path, step_line(1, "5.0", 0.001) + "{\"loss\":1}\n");
  CHECK_THROWS_WITH(metrics_read_curves(path), Catch::Contains(path + ":2: expected a non-negative integer \"step\""));
  write_text(path, step_line(1, "5.0", 0.001) + "{\"step\":2,\"loss\":\"x\"}\n");
  CHECK_THROWS_WITH(metrics_read_curves(path), Catch::Contains(path + ":2: \"loss\" must be a number or null"));
  write_text(path, step_line(1, "5.0", 0.001) + step_line(2, "4.0", 0.002) + "{\"step\":3,\"lo");
  MetricsCurves c = metrics_read_curves(path);
  CHECK(c.steps.size() == 2);
  CHECK(c.skipped_torn_lines == 1);
}

TEST_CASE("the SVG is well-formed and draws one loss point per finite step, left to right", "[plot]") {
  MetricsCurves c;
  for (int64_t s = 1; s <= 25; ++s) {
    c.steps.push_back(s);
    c.loss.push_back(s == 7 || s == 8 ? NAN : 5.52 - (5.52 - 1.37) * double(s - 1) / 24.0);
    c.lr.push_back(3e-3 * double(s) / 25.0);
  }
  c.eval_steps = {10, 20, 25};
  c.eval_loss = {3.0, 2.0, 2.5};
  const std::string svg = svg_plot_training(c, "training run: a&b <test>");
  INFO(svg);
  CHECK(svg_problem(svg) == "");
  CHECK(svg.find("<title>training run: a&amp;b &lt;test&gt;</title>") != std::string::npos);

  auto raw = polyline_points(svg, "loss-raw");
  CHECK(raw.size() == 23);  // 25 steps, 2 NaN
  for (size_t i = 1; i < raw.size(); ++i) CHECK(raw[i].first > raw[i - 1].first);
  CHECK(raw.front().second < raw.back().second);  // the loss falls; SVG y grows downwards
  CHECK(polyline_points(svg, "loss-smooth").size() == 23);
  CHECK(polyline_points(svg, "lr").size() == 25);
  CHECK(polyline_points(svg, "eval-loss").size() == 3);
  CHECK(count(svg, "class=\"eval-marker\"") == 3);
  CHECK(count(svg, "class=\"eval-best\"") == 1);

  CHECK(group_texts(svg, "loss-y-ticks") ==
        std::vector<std::string>{"1.0", "1.5", "2.0", "2.5", "3.0", "3.5", "4.0", "4.5", "5.0", "5.5", "6.0"});
  CHECK(group_texts(svg, "loss-x-ticks") == std::vector<std::string>{"0", "5", "10", "15", "20", "25"});
  CHECK(group_texts(svg, "lr-y-ticks") == std::vector<std::string>{"0", "1", "2", "3"});
  CHECK(svg.find("learning rate (\xC3\x97" "10<tspan baseline-shift=\"super\" font-size=\"10\">-3</tspan>)") !=
        std::string::npos);

  const std::vector<std::string> caption = {"final loss 1.3700 at step 25", "best eval loss 2.0000 at step 20",
                                            "25 steps", "2 non-finite losses not drawn"};
  for (const auto& part : caption) CHECK(svg.find(part) != std::string::npos);
  CHECK(svg.find("<script") == std::string::npos);
  CHECK(svg.find("@font-face") == std::string::npos);
}

TEST_CASE("the SVG of a single step, of no eval data and of 10000 steps", "[plot]") {
  MetricsCurves one;
  one.steps = {5};
  one.loss = {2.5};
  one.lr = {1e-4};
  std::string svg = svg_plot_training(one, "one");
  CHECK(svg_problem(svg) == "");
  CHECK(polyline_points(svg, "loss-raw").size() == 1);
  CHECK(count(svg, "class=\"loss-smooth-point\"") == 1);  // one point draws no line, so it is marked
  CHECK(count(svg, "class=\"lr-point\"") == 1);
  CHECK(group_texts(svg, "loss-x-ticks") == std::vector<std::string>{"4", "5", "6"});
  CHECK(svg.find("eval-loss") == std::string::npos);
  CHECK(svg.find("eval loss") == std::string::npos);  // nor in the legend
  CHECK(svg.find("1 step") != std::string::npos);

  MetricsCurves big;
  for (int64_t s = 1; s <= 10000; ++s) {
    big.steps.push_back(s);
    big.loss.push_back(2.0 + 0.2 * std::sin(double(s)) + (s == 6000 ? 3.0 : 0.0));
    big.lr.push_back(1e-3);
  }
  svg = svg_plot_training(big, "big");
  CHECK(svg_problem(svg) == "");
  auto raw = polyline_points(svg, "loss-raw");
  CHECK(raw.size() <= 2000);
  CHECK(raw.size() >= 1000);
  for (size_t i = 1; i < raw.size(); ++i) CHECK(raw[i].first >= raw[i - 1].first);
  // the spike survived: the highest point drawn is the highest loss, on the panel's scale
  double top = 1e9;
  for (auto& p : raw) top = std::min(top, p.second);
  const std::vector<std::string> yt = group_texts(svg, "loss-y-ticks");
  const double y0 = std::stod(yt.front()), y1 = std::stod(yt.back()), spike = big.loss[5999];
  const double panel_top = 90, panel_height = 334;
  CHECK(top == Approx(panel_top + panel_height * (1 - (spike - y0) / (y1 - y0))).margin(0.01));
  CHECK(polyline_points(svg, "loss-smooth").size() <= 2000);
  CHECK(group_texts(svg, "loss-x-ticks") == std::vector<std::string>{"0", "1000", "2000", "3000", "4000", "5000",
                                                                      "6000", "7000", "8000", "9000", "10000"});
}

TEST_CASE("strata plot writes OUTPUT_DIR/plot.svg (or --out) and prints its path", "[plot]") {
  const std::string dir = plot_dir("run & co");
  write_text(dir + "/metrics.jsonl", step_line(1, "5.0", 0.001) + step_line(2, "4.0", 0.002) +
                                         "{\"step\":2,\"eval_loss\":4.5}\n" + step_line(3, "3.5", 0.003) +
                                         step_line(2, "3.9", 0.002) + step_line(3, "3.4", 0.003));
  std::string out;
  REQUIRE(run_plot({dir}, &out) == 0);
  CHECK(out == dir + "/plot.svg\n");
  const std::string svg = read_text(dir + "/plot.svg");
  CHECK(svg_problem(svg) == "");
  CHECK(svg.find("training run: run &amp; co") != std::string::npos);
  CHECK(polyline_points(svg, "loss-raw").size() == 3);
  CHECK(count(svg, "class=\"eval-marker\"") == 1);
  CHECK(svg.find("final loss 3.4000 at step 3") != std::string::npos);  // the resumed run's record

  const std::string other = plot_dir("elsewhere") + "/curves.svg";
  REQUIRE(run_plot({dir + "/", "--out", other}, &out) == 0);
  CHECK(out == other + "\n");
  CHECK(read_text(other) == svg);  // a trailing slash names the same run
}

TEST_CASE("strata plot: a missing dir, a dir without metrics and a broken line exit 2 and say what to do",
          "[plot]") {
  int code = 0;
  const std::string missing = (fs::temp_directory_path() / "strata_plot" / "no such run").string();
  fs::remove_all(missing);
  CHECK_THAT(plot_error({missing}, &code), Catch::Contains("is not a directory"));
  CHECK(code == 2);
  const std::string empty = plot_dir("empty");
  code = 0;
  CHECK_THAT(plot_error({empty}, &code), Catch::Contains("holds no metrics.jsonl; run `strata train`"));
  CHECK(code == 2);
  write_text(empty + "/metrics.jsonl", step_line(1, "5.0", 0.001) + "not json\n" + step_line(3, "4.0", 0.002));
  code = 0;
  CHECK_THAT(plot_error({empty}, &code), Catch::Contains(empty + "/metrics.jsonl:2: not valid JSON"));
  CHECK(code == 2);
  CHECK(!fs::exists(empty + "/plot.svg"));
  CHECK(run_plot({}) == 2);  // usage
}

TEST_CASE("strata plot draws a data-parallel run's worker consistency from metrics.jsonl", "[plot]") {
  // Every 2nd step carries the "workers" record distributed.diagnostics_steps = 2 writes; step 4
  // is written twice (a resume): the last record wins, here without workers.
  const std::string dir = plot_dir("workers");
  std::string text;
  for (int64_t s = 1; s <= 10; ++s) {
    std::string line = step_line(s, std::to_string(3.0 - 0.1 * double(s)), 1e-3);
    if (s % 2 == 0) {
      const double loss_spread = 0.01 * double(s), norm_spread = 0.5 / double(s), cosine = s == 6 ? -0.25 : 0.9;
      line.insert(line.size() - 2, ",\"workers\":{\"loss\":[2.5,2.6],\"grad_norm\":[1.0,1.5],\"loss_spread\":" +
                                       std::to_string(loss_spread) + ",\"grad_norm_spread\":" +
                                       std::to_string(norm_spread) + ",\"cosine\":" + std::to_string(cosine) + "}");
    }
    text += line;
  }
  text += step_line(4, "2.6", 1e-3);  // resumed: step 4 again, no diagnostics this time
  write_text(dir + "/metrics.jsonl", text);

  const MetricsCurves c = metrics_read_curves(dir + "/metrics.jsonl");
  CHECK(c.worker_steps == std::vector<int64_t>{2, 6, 8, 10});
  CHECK(c.worker_loss_spread == std::vector<double>{0.02, 0.06, 0.08, 0.1});
  REQUIRE(c.worker_grad_norm_spread.size() == 4);
  CHECK(c.worker_grad_norm_spread[0] == 0.25);
  CHECK(c.worker_grad_norm_spread[1] == Approx(0.5 / 6).epsilon(1e-5));  // 6 decimals in the file
  CHECK(c.worker_grad_norm_spread[3] == 0.05);
  CHECK(c.worker_cosine == std::vector<double>{0.9, -0.25, 0.9, 0.9});

  std::string out;
  REQUIRE(run_plot({dir}, &out) == 0);
  const std::string svg = read_text(dir + "/plot.svg");
  INFO(svg);
  CHECK(svg_problem(svg) == "");
  for (const char* id : {"worker-loss-spread", "worker-grad-norm-spread", "worker-cosine"}) {
    CAPTURE(id);
    CHECK(svg.find(std::string("<g id=\"") + id + "-panel\"") != std::string::npos);
    const auto pts = polyline_points(svg, id);
    REQUIRE(pts.size() == 4);
    for (size_t i = 1; i < pts.size(); ++i) CHECK(pts[i].first > pts[i - 1].first);
    // the same x as the loss curve's points of those steps
    const auto loss = polyline_points(svg, "loss-raw");
    CHECK(pts[0].first == Approx(loss[1].first));
    CHECK(pts[3].first == Approx(loss[9].first));
  }
  const auto spread = polyline_points(svg, "worker-loss-spread");  // growing spread: y goes up
  CHECK(spread[3].second < spread[0].second);
  const auto cosine = polyline_points(svg, "worker-cosine");
  CHECK(cosine[1].second > cosine[0].second);  // the dip at step 6 sits lower
  CHECK(cosine[0].second == Approx(cosine[2].second));
  // the cosine axis covers [-0.25, 1] at least; the page grew by three panels
  const auto ticks = group_texts(svg, "worker-cosine-y-ticks");
  REQUIRE(!ticks.empty());
  CHECK(std::stod(ticks.front()) <= -0.25);
  CHECK(std::stod(ticks.back()) >= 1.0);
  CHECK(svg.find("height=\"" + std::to_string(690 + 3 * (50 + 146)) + "\"") != std::string::npos);

  // A run without diagnostics draws no worker panel.
  MetricsCurves p;
  p.steps = c.steps;
  p.loss = c.loss;
  p.lr = c.lr;
  const std::string plain = svg_plot_training(p, "plain");
  CHECK(plain.find("worker-cosine") == std::string::npos);
}

}  // namespace strata
