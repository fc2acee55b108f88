// The training-curve picture `strata plot` writes: a standalone SVG 1.1 document with two panels
// sharing the step axis (loss, smoothed loss and eval loss above; learning rate below), nice
// ticks, grid, legend, and a caption with the final and best values. Below them, where the
// metrics hold them: preference reward margins and accuracies, and a data-parallel run's worker
// consistency (loss spread and grad-norm spread across ranks, mean pairwise gradient cosine). Text only in, text out, so
// tests check it without files.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/metrics_curves.h"

namespace strata {

// Tick values at a 1, 2 or 5 x 10^k spacing, about `target` of them, covering [lo, hi]: the
// first is <= lo and the last >= hi (the axis then spans first..last). lo == hi is widened.
std::vector<double> plot_nice_ticks(double lo, double hi, int target);

// The point indices a polyline keeps: all when there are at most max_points finite points,
// else the min and the max of each of max_points/2 buckets, in order. Non-finite y are dropped.
std::vector<size_t> plot_decimate(const std::vector<double>& y, size_t max_points);

// TensorBoard's debiased exponential moving average; non-finite values are passed over (and are
// NaN in the result).
std::vector<double> plot_smooth_ema(const std::vector<double>& y, double weight);

// The whole document. `title` is plain text (it is escaped here).
std::string svg_plot_training(const MetricsCurves& c, const std::string& title);

}  // namespace strata
