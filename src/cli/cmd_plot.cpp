// `strata plot OUTPUT_DIR [--out FILE.svg]`: draws a run's metrics.jsonl (loss, smoothed loss,
// eval loss and learning rate against step; preference rewards and data-parallel worker
// consistency where recorded) as a standalone SVG file, OUTPUT_DIR/plot.svg by
// default. Prints the file's path on stdout. Works on a run still training: a last line being
// written is skipped.
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "io/files.h"
#include "io/metrics_curves.h"
#include "io/svg_plot.h"
#include "io/safetensors.h"
#include "src/core/cli_args.h"
#include "src/cli/commands.h"
#include "src/core/error.h"

namespace strata {

int cmd_plot(const std::vector<std::string>& args) {
  CLI::App app{"Draw a run's loss, eval loss and learning rate against step as an SVG file", "strata plot"};
  std::string dir, out;
  app.add_option("output_dir", dir, "the run's checkpoint.output_dir (holds metrics.jsonl)")->required();
  app.add_option("--out", out, "the SVG file to write (default: OUTPUT_DIR/plot.svg)");
  int rc = 0;
  if (!parse_args(app, args, &rc)) return rc;

  namespace fs = std::filesystem;
  STRATA_CHECK(fs::is_directory(dir), dir, " is not a directory; give the output_dir of a "
               "training run (checkpoint.output_dir in its recipe)");
  const std::string metrics = (fs::path(dir) / "metrics.jsonl").string();
  STRATA_CHECK(fs::exists(metrics), dir, " holds no metrics.jsonl; run `strata train` with "
               "checkpoint.output_dir = \"", dir, "\" first");
  MetricsCurves curves = metrics_read_curves(metrics);
  if (curves.skipped_torn_lines)
    std::fprintf(stderr, "strata plot: %s: skipped an unfinished last line (a run still writing, or killed)\n",
                 metrics.c_str());
  STRATA_CHECK(!curves.steps.empty() || !curves.eval_steps.empty(), metrics,
               " holds no training steps yet; plot again once the run has logged a step");

  // the run's name for the title: the directory's own name, even when given as "." or "out/"
  fs::path name = fs::path(dir).lexically_normal();
  if (name.filename().empty()) name = name.parent_path();
  std::string run = name.filename().string();
  if (run.empty() || run == "." || run == "..") run = fs::absolute(name).lexically_normal().filename().string();
  const std::string svg = svg_plot_training(curves, "training run: " + run);

  if (out.empty()) out = (fs::path(dir) / "plot.svg").string();
  file_write_atomic(out, svg.data(), svg.size());
  std::fprintf(stderr, "strata plot: %zu training step%s, %zu eval point%s\n", curves.steps.size(),
               curves.steps.size() == 1 ? "" : "s", curves.eval_steps.size(), curves.eval_steps.size() == 1 ? "" : "s");
  std::cout << out << "\n";
  std::cout.flush();
  STRATA_CHECK_IO(std::cout.good(), "writing to stdout failed");
  return 0;
}

}  // namespace strata
