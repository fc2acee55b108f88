#include "io/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace strata {
namespace {

// The page: two panels sharing the step axis, in SVG user units (pixels).
constexpr double kWidth = 960, kHeight = 690;
constexpr double kLeft = 88, kRight = 30;  // room for y tick labels and the axis title
constexpr double kLossTop = 90, kLossHeight = 334;  // below the title and two caption lines
constexpr double kLrTop = 474, kLrHeight = 146;
// preference runs: two more panels below, reward margins and accuracies (train line, eval markers)
constexpr double kPrefGap = 50, kPrefHeight = 146;
constexpr const char* kMarginColor = "#756bb1";
constexpr const char* kWorkerColor = "#d62728";
constexpr size_t kMaxPolylinePoints = 2000;
constexpr size_t kMaxEvalMarkers = 400;  // beyond this the eval line alone is clearer
constexpr size_t kCaptionChars = 120;    // about the page's width at 13 px

constexpr const char* kRawLossColor = "#9ecae1";
constexpr const char* kLossColor = "#1f5fa8";
constexpr const char* kEvalColor = "#e6550d";
constexpr const char* kLrColor = "#31a354";
constexpr const char* kGridColor = "#e6e6e6";
constexpr const char* kFrameColor = "#9a9a9a";
constexpr const char* kTextColor = "#333333";

std::string num(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::string xml_escape(const std::string& s) {
  std::string out;
  for (unsigned char ch : s) {
    switch (ch) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        if (ch >= 0x20 || ch == '\t') out += char(ch);  // other control bytes are not XML
    }
  }
  return out;
}

double nice_step(double range, int target, double min_step) {
  const double raw = range / double(std::max(1, target));
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double n = raw / mag;
  const double m = n < 1.5 ? 1 : n < 3 ? 2 : n < 7 ? 5 : 10;
  return std::max(m * mag, min_step);
}

std::vector<double> nice_ticks(double lo, double hi, int target, double min_step) {
  if (!std::isfinite(lo) || !std::isfinite(hi)) lo = 0, hi = 1;
  if (hi < lo) std::swap(lo, hi);
  if (hi == lo) {
    const double pad = lo == 0 ? 1 : std::abs(lo) * 0.1;
    lo -= pad, hi += pad;
  }
  const double step = nice_step(hi - lo, target, min_step);
  const double first = std::floor(lo / step + 1e-9), last = std::ceil(hi / step - 1e-9);
  std::vector<double> ticks;
  for (double k = first; k <= last + 0.5; k += 1) ticks.push_back(k * step == 0 ? 0.0 : k * step);
  return ticks;
}

// Tick labels with the fewest decimals that tell them apart; very small or large values share
// one power of ten, returned through *exponent (0: none) for the axis title.
std::vector<std::string> tick_labels(const std::vector<double>& ticks, bool allow_exponent, int* exponent) {
  const double step = ticks.size() > 1 ? ticks[1] - ticks[0] : 1;
  double biggest = 0;
  for (double t : ticks) biggest = std::max(biggest, std::abs(t));
  const int k = int(std::floor(std::log10(step) + 1e-9));
  *exponent = 0;
  if (allow_exponent && biggest > 0 && (biggest < 1e-2 || biggest >= 1e6))
    *exponent = int(std::floor(std::log10(biggest) + 1e-9));
  const int decimals = std::max(0, *exponent - k);
  std::vector<std::string> out;
  for (double t : ticks) out.push_back(t == 0 ? "0" : num(t / std::pow(10.0, *exponent), decimals));
  return out;
}

// A panel maps data (x0..x1, y0..y1) onto its rectangle.
struct Panel {
  double top, height;
  std::vector<double> xticks, yticks;
  double px(double x) const {
    const double x0 = xticks.front(), x1 = xticks.back();
    return kLeft + (x - x0) / (x1 - x0) * (kWidth - kLeft - kRight);
  }
  double py(double y) const {
    const double y0 = yticks.front(), y1 = yticks.back();
    return top + height - (y - y0) / (y1 - y0) * height;
  }
  double right() const { return kWidth - kRight; }
  double bottom() const { return top + height; }
};

// A panel below the learning rate: its series share the step axis; the y axis covers [lo, hi]
// and the series' finite values. markers: also a dot per finite point (eval points).
struct ExtraSeries {
  std::string id;
  const std::vector<int64_t>* x;
  const std::vector<double>* y;
  const char* color;
  bool markers;
};
struct ExtraPanel {
  std::string id, title;
  double lo, hi;
  std::vector<ExtraSeries> series;
};

std::string svg_text(double x, double y, const std::string& text, const std::string& attrs = "") {
  return "<text x=\"" + num(x, 1) + "\" y=\"" + num(y, 1) + "\"" + (attrs.empty() ? "" : " " + attrs) + ">" +
         xml_escape(text) + "</text>\n";
}

// Grid, frame, tick labels and the rotated y title of one panel.
std::string svg_axes(const Panel& p, const std::string& id, const std::string& y_title) {
  std::string s;
  for (double x : p.xticks)
    s += "<line x1=\"" + num(p.px(x), 2) + "\" y1=\"" + num(p.top, 1) + "\" x2=\"" + num(p.px(x), 2) + "\" y2=\"" +
         num(p.bottom(), 1) + "\" stroke=\"" + kGridColor + "\"/>\n";
  for (double y : p.yticks)
    s += "<line x1=\"" + num(kLeft, 1) + "\" y1=\"" + num(p.py(y), 2) + "\" x2=\"" + num(p.right(), 1) + "\" y2=\"" +
         num(p.py(y), 2) + "\" stroke=\"" + kGridColor + "\"/>\n";
  s += "<rect x=\"" + num(kLeft, 1) + "\" y=\"" + num(p.top, 1) + "\" width=\"" + num(p.right() - kLeft, 1) +
       "\" height=\"" + num(p.height, 1) + "\" fill=\"none\" stroke=\"" + kFrameColor + "\"/>\n";
  int exponent = 0;
  std::vector<std::string> labels = tick_labels(p.yticks, true, &exponent);
  s += "<g id=\"" + id + "-y-ticks\" font-size=\"12\" text-anchor=\"end\" fill=\"" + kTextColor + "\">\n";
  for (size_t i = 0; i < p.yticks.size(); ++i) s += svg_text(kLeft - 7, p.py(p.yticks[i]) + 4, labels[i]);
  s += "</g>\n";
  int x_exponent = 0;
  std::vector<std::string> xlabels = tick_labels(p.xticks, false, &x_exponent);
  s += "<g id=\"" + id + "-x-ticks\" font-size=\"12\" text-anchor=\"middle\" fill=\"" + kTextColor + "\">\n";
  for (size_t i = 0; i < p.xticks.size(); ++i) s += svg_text(p.px(p.xticks[i]), p.bottom() + 17, xlabels[i]);
  s += "</g>\n";
  const double cy = p.top + p.height / 2;
  s += "<text transform=\"translate(24," + num(cy, 1) + ") rotate(-90)\" text-anchor=\"middle\" font-size=\"14\" "
       "fill=\"" + std::string(kTextColor) + "\">" + xml_escape(y_title);
  if (exponent != 0)
    s += " (\xC3\x97" "10<tspan baseline-shift=\"super\" font-size=\"10\">" + std::to_string(exponent) + "</tspan>)";
  s += "</text>\n";
  return s;
}

// A series as a polyline; a lone point draws no line, so mark_lone_point marks it with a dot
// (class "<id>-point").
std::string svg_polyline(const Panel& p, const std::string& id, const std::vector<int64_t>& x,
                         const std::vector<double>& y, const char* color, double width, bool mark_lone_point) {
  std::string pts;
  const std::vector<size_t> kept = plot_decimate(y, kMaxPolylinePoints);
  for (size_t i : kept) {
    if (!pts.empty()) pts += ' ';
    pts += num(p.px(double(x[i])), 2) + "," + num(p.py(y[i]), 2);
  }
  std::string s = "<polyline id=\"" + id + "\" fill=\"none\" stroke=\"" + color + "\" stroke-width=\"" +
                  num(width, 1) + "\" stroke-linejoin=\"round\" stroke-linecap=\"round\" points=\"" + pts + "\"/>\n";
  if (mark_lone_point && kept.size() == 1)
    s += "<circle class=\"" + id + "-point\" cx=\"" + num(p.px(double(x[kept[0]])), 2) + "\" cy=\"" +
         num(p.py(y[kept[0]]), 2) + "\" r=\"3.5\" fill=\"" + color + "\"/>\n";
  return s;
}

void finite_range(const std::vector<double>& v, double* lo, double* hi) {
  for (double x : v)
    if (std::isfinite(x)) *lo = std::min(*lo, x), *hi = std::max(*hi, x);
}

// How much to smooth: about a 40th of the run, never less than TensorBoard's default 0.6.
double smoothing_weight(size_t points) {
  const double window = double(points) / 40.0;
  return std::clamp(1.0 - 2.0 / (window + 1.0), 0.6, 0.99);
}

}  // namespace

std::vector<double> plot_nice_ticks(double lo, double hi, int target) { return nice_ticks(lo, hi, target, 0); }

std::vector<size_t> plot_decimate(const std::vector<double>& y, size_t max_points) {
  std::vector<size_t> finite;
  for (size_t i = 0; i < y.size(); ++i)
    if (std::isfinite(y[i])) finite.push_back(i);
  if (finite.size() <= max_points || max_points < 2) return finite;
  const size_t buckets = max_points / 2;
  const size_t per = (finite.size() + buckets - 1) / buckets;
  std::vector<size_t> out;
  for (size_t b = 0; b < finite.size(); b += per) {
    size_t lo = finite[b], hi = finite[b];
    for (size_t j = b; j < std::min(finite.size(), b + per); ++j) {
      if (y[finite[j]] < y[lo]) lo = finite[j];
      if (y[finite[j]] > y[hi]) hi = finite[j];
    }
    out.push_back(std::min(lo, hi));
    if (lo != hi) out.push_back(std::max(lo, hi));
  }
  return out;
}

std::vector<double> plot_smooth_ema(const std::vector<double>& y, double weight) {
  std::vector<double> out(y.size(), NAN);
  double acc = 0, debias = 1;
  for (size_t i = 0; i < y.size(); ++i) {
    if (!std::isfinite(y[i])) continue;
    acc = weight * acc + (1 - weight) * y[i];
    debias *= weight;
    out[i] = acc / (1 - debias);
  }
  return out;
}

std::string svg_plot_training(const MetricsCurves& c, const std::string& title) {
  // ranges: steps of both kinds share the x axis; loss and eval loss share the y axis
  double xlo = INFINITY, xhi = -INFINITY, ylo = INFINITY, yhi = -INFINITY, lrlo = 0, lrhi = -INFINITY;
  for (int64_t s : c.steps) xlo = std::min(xlo, double(s)), xhi = std::max(xhi, double(s));
  for (int64_t s : c.eval_steps) xlo = std::min(xlo, double(s)), xhi = std::max(xhi, double(s));
  finite_range(c.loss, &ylo, &yhi);
  finite_range(c.eval_loss, &ylo, &yhi);
  finite_range(c.lr, &lrlo, &lrhi);
  if (!(xlo <= xhi)) xlo = 0, xhi = 1;
  if (!(ylo <= yhi)) ylo = 0, yhi = 1;
  if (!(lrhi > lrlo)) lrhi = lrlo + (lrlo == 0 ? 1e-3 : std::abs(lrlo) * 0.1);
  Panel loss_panel{kLossTop, kLossHeight, nice_ticks(xlo, xhi, 8, 1), nice_ticks(ylo, yhi, 6, 0)};
  Panel lr_panel{kLrTop, kLrHeight, loss_panel.xticks, nice_ticks(lrlo, lrhi, 3, 0)};

  const double weight = smoothing_weight(plot_decimate(c.loss, SIZE_MAX).size());
  const std::vector<double> smooth = plot_smooth_ema(c.loss, weight);
  int64_t non_finite = 0;
  for (double v : c.loss) non_finite += !std::isfinite(v);
  for (double v : c.eval_loss) non_finite += !std::isfinite(v);

  // caption: where the run ended, the best eval, what was left out
  std::vector<std::string> parts;
  for (size_t i = c.loss.size(); i-- > 0;)
    if (std::isfinite(c.loss[i])) {
      parts.push_back("final loss " + num(c.loss[i], 4) + " at step " + std::to_string(c.steps[i]) + " (smoothed " +
                      num(smooth[i], 4) + ")");
      break;
    }
  if (parts.empty()) parts.push_back(c.steps.empty() ? "no training steps recorded" : "no finite training loss");
  size_t best = SIZE_MAX;
  for (size_t i = 0; i < c.eval_loss.size(); ++i)
    if (std::isfinite(c.eval_loss[i]) && (best == SIZE_MAX || c.eval_loss[i] < c.eval_loss[best])) best = i;
  if (best != SIZE_MAX)
    parts.push_back("best eval loss " + num(c.eval_loss[best], 4) + " at step " + std::to_string(c.eval_steps[best]));
  parts.push_back(std::to_string(c.steps.size()) + (c.steps.size() == 1 ? " step" : " steps"));
  if (non_finite > 0)
    parts.push_back(std::to_string(non_finite) + " non-finite loss" + (non_finite == 1 ? "" : "es") + " not drawn");
  std::vector<std::string> caption(1);  // lines of at most kCaptionChars
  for (const std::string& part : parts) {
    if (!caption.back().empty() && caption.back().size() + 5 + part.size() > kCaptionChars) caption.emplace_back();
    caption.back() += (caption.back().empty() ? "" : "  \xC2\xB7  ") + part;
  }

  // panels below the learning rate: preference rewards, data-parallel worker consistency
  std::vector<ExtraPanel> extra;
  if (c.has_preference()) {  // reward margins, then accuracies: the train line, the eval points as markers
    extra.push_back({"margins", "reward margin", 0, 0, {{"margins", &c.steps, &c.margins, kMarginColor, false},
                                                         {"eval-margins", &c.eval_steps, &c.eval_margins, kEvalColor, true}}});
    extra.push_back({"accuracies", "reward accuracy", 0, 1, {{"accuracies", &c.steps, &c.accuracies, kMarginColor, false},
                                                             {"eval-accuracies", &c.eval_steps, &c.eval_accuracies, kEvalColor, true}}});
  }
  if (c.has_reward())  // GRPO: the mean total reward of each step's completions
    extra.push_back({"reward", "mean reward", 0, 0, {{"reward", &c.steps, &c.reward, kMarginColor, false}}});
  if (!plot_decimate(c.worker_cosine, SIZE_MAX).empty() || !plot_decimate(c.worker_loss_spread, SIZE_MAX).empty()) {
    extra.push_back({"worker-loss-spread", "loss spread (ranks)", 0, 0,
                     {{"worker-loss-spread", &c.worker_steps, &c.worker_loss_spread, kWorkerColor, false}}});
    extra.push_back({"worker-grad-norm-spread", "grad-norm spread", 0, 0,
                     {{"worker-grad-norm-spread", &c.worker_steps, &c.worker_grad_norm_spread, kWorkerColor, false}}});
    extra.push_back({"worker-cosine", "gradient cosine", 0, 1,
                     {{"worker-cosine", &c.worker_steps, &c.worker_cosine, kWorkerColor, false}}});
  }
  const double page_height = kHeight + double(extra.size()) * (kPrefGap + kPrefHeight);
  std::string s;
  s += "<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"no\"?>\n";
  s += "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"" + num(kWidth, 0) + "\" height=\"" +
       num(page_height, 0) + "\" viewBox=\"0 0 " + num(kWidth, 0) + " " + num(page_height, 0) +
       "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n";
  s += "<title>" + xml_escape(title) + "</title>\n";
  s += "<rect x=\"0\" y=\"0\" width=\"" + num(kWidth, 0) + "\" height=\"" + num(page_height, 0) + "\" fill=\"white\"/>\n";
  s += svg_text(kLeft, 30, title, "font-size=\"20\" font-weight=\"bold\" fill=\"#222222\"");
  s += "<g id=\"caption\" font-size=\"13\" fill=\"#555555\">\n";
  for (size_t i = 0; i < caption.size() && i < 2; ++i) s += svg_text(kLeft, 52 + 17 * double(i), caption[i]);
  s += "</g>\n";

  // loss panel
  s += "<g id=\"loss-panel\">\n" + svg_axes(loss_panel, "loss", "loss");
  s += svg_polyline(loss_panel, "loss-raw", c.steps, c.loss, kRawLossColor, 1.0, false);
  s += svg_polyline(loss_panel, "loss-smooth", c.steps, smooth, kLossColor, 2.0, true);
  const std::vector<size_t> marks = plot_decimate(c.eval_loss, SIZE_MAX);  // the finite eval points
  const bool have_eval = !marks.empty();
  if (have_eval) {
    s += svg_polyline(loss_panel, "eval-loss", c.eval_steps, c.eval_loss, kEvalColor, 1.5, false);
    if (marks.size() <= kMaxEvalMarkers)
      for (size_t i : marks)
        s += "<circle class=\"eval-marker\" cx=\"" + num(loss_panel.px(double(c.eval_steps[i])), 2) + "\" cy=\"" +
             num(loss_panel.py(c.eval_loss[i]), 2) + "\" r=\"3.5\" fill=\"" + kEvalColor +
             "\" stroke=\"white\" stroke-width=\"1\"/>\n";
    s += "<circle class=\"eval-best\" cx=\"" + num(loss_panel.px(double(c.eval_steps[best])), 2) + "\" cy=\"" +
         num(loss_panel.py(c.eval_loss[best]), 2) + "\" r=\"7\" fill=\"none\" stroke=\"" + kEvalColor +
         "\" stroke-width=\"1.5\"/>\n";
  }
  // legend, top right, where a falling loss leaves room
  {
    struct Entry {
      std::string label;
      const char* color;
      double width;
      bool marker;
    };
    std::vector<Entry> entries = {{"loss", kRawLossColor, 1.5, false},
                                  {"loss, smoothed (EMA " + num(weight, 2) + ")", kLossColor, 2.0, false}};
    if (have_eval) entries.push_back({"eval loss", kEvalColor, 1.5, true});
    const double w = 230, h = 10 + 21.0 * double(entries.size());
    const double x = loss_panel.right() - w - 10, y = loss_panel.top + 10;
    s += "<g id=\"legend\" font-size=\"13\" fill=\"" + std::string(kTextColor) + "\">\n";
    s += "<rect x=\"" + num(x, 1) + "\" y=\"" + num(y, 1) + "\" width=\"" + num(w, 1) + "\" height=\"" + num(h, 1) +
         "\" fill=\"white\" fill-opacity=\"0.9\" stroke=\"#cccccc\" rx=\"3\"/>\n";
    for (size_t i = 0; i < entries.size(); ++i) {
      const double ly = y + 15 + 21.0 * double(i);
      s += "<line x1=\"" + num(x + 10, 1) + "\" y1=\"" + num(ly, 1) + "\" x2=\"" + num(x + 38, 1) + "\" y2=\"" +
           num(ly, 1) + "\" stroke=\"" + entries[i].color + "\" stroke-width=\"" + num(entries[i].width, 1) + "\"/>\n";
      if (entries[i].marker)
        s += "<circle cx=\"" + num(x + 24, 1) + "\" cy=\"" + num(ly, 1) + "\" r=\"3.5\" fill=\"" + entries[i].color +
             "\"/>\n";
      s += svg_text(x + 46, ly + 4.5, entries[i].label);
    }
    s += "</g>\n";
  }
  s += "</g>\n";

  // learning-rate panel
  s += "<g id=\"lr-panel\">\n" + svg_axes(lr_panel, "lr", "learning rate");
  s += svg_polyline(lr_panel, "lr", c.steps, c.lr, kLrColor, 1.5, true);
  s += "</g>\n";
  for (size_t k = 0; k < extra.size(); ++k) {
    const ExtraPanel& ep = extra[k];
    double lo = ep.lo, hi = ep.hi;  // the range always shows [lo, hi]
    for (const ExtraSeries& es : ep.series) finite_range(*es.y, &lo, &hi);
    if (!(lo <= hi)) lo = 0, hi = 1;
    const Panel panel{kLrTop + kLrHeight + kPrefGap + double(k) * (kPrefGap + kPrefHeight), kPrefHeight,
                      loss_panel.xticks, nice_ticks(lo, hi, 4, 0)};
    s += "<g id=\"" + ep.id + "-panel\">\n" + svg_axes(panel, ep.id, ep.title);
    for (const ExtraSeries& es : ep.series) {
      s += svg_polyline(panel, es.id, *es.x, *es.y, es.color, 1.5, !es.markers);
      for (size_t i = 0; es.markers && i < es.y->size() && i < kMaxEvalMarkers; ++i)
        if (std::isfinite((*es.y)[i]))
          s += "<circle class=\"eval-marker\" cx=\"" + num(panel.px(double((*es.x)[i])), 2) + "\" cy=\"" +
               num(panel.py((*es.y)[i]), 2) + "\" r=\"3.5\" fill=\"" + es.color + "\" stroke=\"white\" stroke-width=\"1\"/>\n";
    }
    s += "</g>\n";
  }
  s += svg_text(kLeft + (kWidth - kLeft - kRight) / 2, page_height - 24, "step",
                "font-size=\"14\" text-anchor=\"middle\" fill=\"" + std::string(kTextColor) + "\"");
  s += "</svg>\n";
  return s;
}

}  // namespace strata
