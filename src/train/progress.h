// Training progress on stderr: a progress bar redrawn in place when stderr is a terminal, plain
// log lines when it is not (a batch job's log file gets no escape codes at all).
//
//   bar:   step 120/300 [#######.....]  40% loss 1.234 lr 2.9e-03 gnorm 0.81 17.1k tok/s mfu 28%
//          eta 1m05s dev 19.0MiB host 12.1MiB pinned 4.0MiB   (one line; the least useful fields
//          go first when the terminal is narrow: pinned, host, dev, mfu, gnorm, eval, lr, tok/s, bar)
//   plain: step 10/300  loss 1.2345  lr 3.000e-03  grad_norm 0.812  17.1k tok/s  mfu 28.1%  eta 1m05s
//
// Plain lines come every log_steps, at the first step reported and at the last step. In bar mode
// only the bar is drawn (metrics.jsonl keeps every step's numbers); messages (eval results,
// saves) appear above it. The mode is chosen by STRATA_PROGRESS=plain|bar|auto, else by isatty;
// tests pass it explicitly.
//
// The trainer calls step() once per optimizer step, message() for any other log line while
// training (eval results, "saved ...") and finish() at the end (the destructor also finishes, so
// an error message never lands on the bar's line). Long phases that are not steps (loading,
// initialising, tokenizing, saving, exporting) are announced with phase(): a line of their own
// before training, and in bar mode the bar says "saving..." in place of the ETA while one runs.
// The ETA counts the checkpoint saves still to come (set_save_plan, saved) as well as the steps.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <optional>
#include <string>

namespace strata {

// One optimizer step as the trainer measured it. NaN marks a value that is not known.
struct StepReport {
  int64_t step = 0;                // 1-based
  int64_t total = 0;               // the run's last step (0: the total given to Progress)
  double loss = NAN;
  double lr = 0;
  double grad_norm = NAN;          // before clipping
  double tokens_per_s = 0;
  double mfu = NAN;                // fraction of the measured peak, 0..1; NaN: not shown
  double step_s = 0;               // this step's wall time; the ETA is smoothed from these
  size_t device_bytes = 0;         // device memory in use (or at peak)
  size_t host_pinned_bytes = 0;    // pinned host memory (part of host_bytes)
  size_t host_bytes = 0;           // all host memory of the model state, pinned included
  double eval_loss = NAN;          // an eval result at this step (NaN: none): printed as a line
  std::string extra;               // the objective's own fields, e.g. "margin 0.41 acc 0.75" (preference)
};

enum class ProgressMode { plain, bar };

// "12s", "3m05s", "1h02m" (seconds rounded to the nearest; "?" for a negative or NaN time).
std::string progress_format_duration(double seconds);
// "950", "17.1k", "2.35M": a token rate, short.
std::string progress_format_rate(double per_s);

class Progress {
 public:
  // mode: nullopt picks STRATA_PROGRESS, else bar when f is a terminal. width: columns of the
  // bar line; 0 asks the terminal each redraw (TIOCGWINSZ, then $COLUMNS, then 100).
  Progress(int64_t total_steps, int64_t log_steps, std::FILE* f = stderr,
           std::optional<ProgressMode> mode = std::nullopt, int width = 0);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void set_total(int64_t total_steps) { total_ = total_steps; }
  // Checkpoints are saved every save_steps (0: only at the end) and at the last step.
  void set_save_plan(int64_t save_steps) { save_steps_ = save_steps; }
  void saved(double seconds);  // a save (or the export) took this long
  // A long phase starts ("loading model weights from ..."); "" when it is over.
  void phase(const std::string& what);

  void step(const StepReport& r);
  // A log line (a trailing newline is optional). In bar mode it appears above the bar.
  void message(const std::string& line);
  // Leaves the last bar (bar mode) or prints the last step's line if it was not printed yet
  // (plain mode, e.g. a run interrupted between log steps). Idempotent.
  void finish();

  ProgressMode mode() const { return mode_; }
  // Seconds left: the mean of the last 50 step times (the first step, which pays one-time set-up
  // costs, only counts while it is the only one) times the steps left, plus the mean save time
  // times the saves left (the final save and export included). NaN before any step.
  double eta_s() const;
  int64_t saves_left(int64_t after_step) const;  // saves still due after this step (the final one included)

  // The text of the lines, for tests and for callers that log elsewhere.
  std::string plain_line(const StepReport& r) const;
  std::string bar_line(const StepReport& r, int width) const;

 private:
  int terminal_width() const;
  void redraw();
  void write(const std::string& s);

  int64_t total_, log_steps_;
  std::FILE* f_;
  ProgressMode mode_;
  int width_;
  std::optional<StepReport> last_;  // the newest step reported
  double last_eval_ = NAN;          // the newest eval loss, shown in the bar
  bool last_printed_ = false;       // plain mode: the newest step's line was printed
  bool bar_shown_ = false;          // bar mode: a bar is on the current line
  bool finished_ = false;
  int64_t steps_seen_ = 0;
  double first_step_s_ = 0;
  std::deque<double> recent_s_;     // step times after the first, newest last
  int64_t save_steps_ = 0;
  double save_s_sum_ = 0;           // saves seen and their time, for the ETA
  int64_t saves_seen_ = 0;
  std::string phase_;               // the long phase under way ("" = none)
};

}  // namespace strata
