// The training progress display: the plain log lines a batch job's log gets (exact text, which
// steps, no escape codes), the in-place bar a terminal gets, and fitting the bar to the width.
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "src/core/error.h"
#include "src/train/progress.h"
#include "tests/testing.h"

namespace strata {
namespace {

// A FILE* whose contents the test can read back.
struct Capture {
  char* buf = nullptr;
  size_t size = 0;
  std::FILE* f = open_memstream(&buf, &size);
  ~Capture() {
    std::fclose(f);
    std::free(buf);
  }
  std::string text() {
    std::fflush(f);
    return std::string(buf, size);
  }
};

StepReport report(int64_t step, int64_t total, double step_s) {
  StepReport r;
  r.step = step;
  r.total = total;
  r.loss = 1.2345;
  r.lr = 3e-3;
  r.grad_norm = 0.812;
  r.tokens_per_s = 17100;
  r.mfu = 0.281;
  r.step_s = step_s;
  r.device_bytes = size_t(19.0 * 1024 * 1024);
  r.host_pinned_bytes = size_t(4) << 20;
  r.host_bytes = size_t(12.1 * 1024 * 1024);
  return r;
}

}  // namespace

TEST_CASE("durations and rates are formatted short", "[progress]") {
  CHECK(progress_format_duration(0) == "0s");
  CHECK(progress_format_duration(12.4) == "12s");
  CHECK(progress_format_duration(59.6) == "1m00s");
  CHECK(progress_format_duration(185) == "3m05s");
  CHECK(progress_format_duration(3599.4) == "59m59s");
  CHECK(progress_format_duration(3720) == "1h02m");
  CHECK(progress_format_duration(7199.6) == "2h00m");
  CHECK(progress_format_duration(100 * 3600 + 59 * 60 + 31) == "101h00m");
  CHECK(progress_format_duration(NAN) == "?");
  CHECK(progress_format_duration(-1) == "?");
  CHECK(progress_format_rate(950) == "950");
  CHECK(progress_format_rate(999.4) == "999");
  CHECK(progress_format_rate(999.6) == "1.0k");
  CHECK(progress_format_rate(17100) == "17.1k");
  CHECK(progress_format_rate(2.35e6) == "2.35M");
}

TEST_CASE("plain mode prints the first step, every log_steps and the last, with no escape codes", "[progress]") {
  Capture cap;
  {
    Progress p(25, 10, cap.f, ProgressMode::plain);
    for (int64_t s = 1; s <= 25; ++s) {
      StepReport r = report(s, 25, s == 1 ? 5.0 : 2.0);  // the first step pays set-up costs
      if (s == 20) r.eval_loss = 1.5;
      p.step(r);
      if (s == 12) p.message("strata train: saved out/checkpoint-12\n");
    }
    p.finish();
  }
  // ETA: step 1 knows only its own 5 s (x 24 left); later steps average the 2 s steps after it
  CHECK(cap.text() ==
        "step 1/25  loss 1.2345  lr 3.000e-03  grad_norm 0.812  17.1k tok/s  mfu 28.1%  eta 2m00s\n"
        "step 10/25  loss 1.2345  lr 3.000e-03  grad_norm 0.812  17.1k tok/s  mfu 28.1%  eta 30s\n"
        "strata train: saved out/checkpoint-12\n"
        "step 20/25  loss 1.2345  lr 3.000e-03  grad_norm 0.812  17.1k tok/s  mfu 28.1%  eta 10s\n"
        "step 20/25  eval_loss 1.5000\n"
        "step 25/25  loss 1.2345  lr 3.000e-03  grad_norm 0.812  17.1k tok/s  mfu 28.1%  eta 0s\n");
  CHECK(cap.text().find('\x1b') == std::string::npos);
  CHECK(cap.text().find('\r') == std::string::npos);
}

TEST_CASE("plain mode: a run stopped between log steps prints its last step on finish, a resumed run "
          "prints its first", "[progress]") {
  Capture cap;
  {
    Progress p(100, 10, cap.f, ProgressMode::plain);
    for (int64_t s = 31; s <= 43; ++s) p.step(report(s, 0, 1.0));  // total 0: the constructor's
  }  // the destructor finishes
  const std::string t = cap.text();
  CHECK(testing::count_occurrences(t, "\n") == 3);
  CHECK(t.rfind("step 31/100  loss", 0) == 0);
  CHECK(t.find("\nstep 40/100  loss") != std::string::npos);
  CHECK(t.find("\nstep 43/100  loss 1.2345  lr 3.000e-03  grad_norm 0.812  17.1k tok/s  mfu 28.1%  eta 57s\n") !=
        std::string::npos);
}

TEST_CASE("an unknown grad norm or MFU is left out of the line", "[progress]") {
  Progress p(10, 1, stderr, ProgressMode::plain);
  StepReport r = report(1, 10, 1.0);
  r.mfu = NAN;
  r.grad_norm = NAN;
  CHECK(p.plain_line(r) == "step 1/10  loss 1.2345  lr 3.000e-03  17.1k tok/s  eta ?");
}

TEST_CASE("bar mode redraws one line in place and keeps it below messages", "[progress]") {
  Capture cap;
  Progress p(10, 5, cap.f, ProgressMode::bar, 200);
  p.step(report(1, 10, 2.0));
  p.step(report(2, 10, 2.0));
  std::string t = cap.text();
  CHECK(testing::count_occurrences(t, "\r\x1b[2K") == 2);  // two bar draws and nothing else
  CHECK(t.find("loss 1.2345") == std::string::npos);          // on a terminal only the bar is drawn
  CHECK(t.find("\r\x1b[2Kstep  1/10 [####") == 0);
  CHECK(t.find("\r\x1b[2Kstep  2/10 [########") != std::string::npos);
  CHECK(t.back() != '\n');                                     // the bar stays on its line

  p.step(report(5, 10, 2.0));
  const std::string bar = p.bar_line(report(5, 10, 2.0), 200);
  CHECK(bar.find("[" + std::string(20, '#') + std::string(20, '.') + "]  50%") != std::string::npos);
  p.message("strata train: saved out/checkpoint-5");
  t = cap.text();
  const std::string tail = "\r\x1b[2Kstrata train: saved out/checkpoint-5\n\r\x1b[2K" + bar;
  REQUIRE(t.size() >= tail.size());
  CHECK(t.substr(t.size() - tail.size()) == tail);  // the message above, the bar redrawn below
  p.finish();
  t = cap.text();
  CHECK(t.substr(t.size() - bar.size() - 1) == bar + "\n");  // the last bar stays, with a newline
  p.finish();
  CHECK(cap.text() == t);  // idempotent
}

TEST_CASE("the bar holds every field when wide and drops the least useful ones when narrow", "[progress]") {
  Capture cap;
  Progress p(300, 10, cap.f, ProgressMode::bar, 120);
  for (int64_t s = 1; s <= 120; ++s) {
    StepReport r = report(s, 300, 0.5);
    if (s == 100) r.eval_loss = 1.3;
    p.step(r);
  }
  StepReport r = report(120, 300, 0.5);
  const std::string wide = p.bar_line(r, 400);
  CHECK(wide == "step 120/300 [################........................]  40% loss 1.234 eval 1.300 lr 3.0e-03 "
                "gnorm 0.81 17.1k tok/s mfu 28% eta 1m30s dev 19.0MiB host 12.1MiB pinned 4.0MiB");
  std::string previous = wide;
  for (int width = 200; width >= 14; --width) {
    const std::string line = p.bar_line(r, width);
    INFO("width " << width << ": " << line);
    CHECK(int(line.size()) <= width - 1);  // the last column stays free
    CHECK(line.rfind("step 120/300", 0) == 0);
    // every field left at this width was also there at the wider one
    for (const char* f : {"loss", "eval", "lr ", "gnorm", "tok/s", "mfu", "eta", "dev", "host", "pinned", "["})
      if (line.find(f) != std::string::npos) CHECK(previous.find(f) != std::string::npos);
    previous = line;
  }
  const std::string w80 = p.bar_line(r, 80);
  CHECK(w80.find("loss 1.234") != std::string::npos);
  CHECK(w80.find("eta 1m30s") != std::string::npos);
  CHECK(w80.find("[") != std::string::npos);
  CHECK(w80.find("pinned") == std::string::npos);
  CHECK(w80.find("host") == std::string::npos);
  const std::string w40 = p.bar_line(r, 40);
  CHECK(w40 == "step 120/300  40% loss 1.234 eta 1m30s");
  CHECK(p.bar_line(r, 8) == "step 12");  // narrower than one field: cut, never wrapped
}

TEST_CASE("STRATA_PROGRESS forces the mode, otherwise a file that is not a terminal gets plain lines",
          "[progress]") {
  Capture cap;
  ::unsetenv("STRATA_PROGRESS");
  CHECK(Progress(10, 1, cap.f).mode() == ProgressMode::plain);
  ::setenv("STRATA_PROGRESS", "bar", 1);
  CHECK(Progress(10, 1, cap.f).mode() == ProgressMode::bar);
  CHECK(Progress(10, 1, cap.f, ProgressMode::plain).mode() == ProgressMode::plain);  // a test's choice wins
  ::setenv("STRATA_PROGRESS", "plain", 1);
  CHECK(Progress(10, 1, cap.f).mode() == ProgressMode::plain);
  ::setenv("STRATA_PROGRESS", "fancy", 1);
  CHECK_THROWS_AS(Progress(10, 1, cap.f), Error);
  ::unsetenv("STRATA_PROGRESS");
  CHECK(cap.text().empty());  // nothing is written before a step
}

}  // namespace strata

namespace strata {

TEST_CASE("the ETA counts the saves still to come", "[progress]") {
  Progress p(10, 1, stderr, ProgressMode::plain);
  p.set_save_plan(4);  // saves after steps 4, 8 and 10
  p.step(report(1, 10, 2.0));
  p.step(report(2, 10, 1.0));
  CHECK(p.saves_left(2) == 3);
  CHECK(p.eta_s() == Approx(8 * 1.0));  // no save timed yet: steps only
  p.saved(5.0);
  CHECK(p.eta_s() == Approx(8 * 1.0 + 3 * 5.0));
  CHECK(p.saves_left(4) == 2);
  CHECK(p.saves_left(8) == 1);
  CHECK(p.saves_left(9) == 1);
  CHECK(p.saves_left(10) == 0);
  Progress q(10, 1, stderr, ProgressMode::plain);
  q.set_save_plan(0);  // only the final save
  CHECK(q.saves_left(3) == 1);
}

TEST_CASE("long phases are said: a line before training, the bar's ETA replaced while one runs", "[progress]") {
  Capture cap;
  Progress p(10, 1, cap.f, ProgressMode::bar, 200);
  p.phase("loading model weights from m");
  CHECK(cap.text() == "strata train: loading model weights from m...\n");
  p.step(report(10, 10, 2.0));
  CHECK(cap.text().find("eta 0s") != std::string::npos);
  p.phase("saving checkpoint-10");
  std::string t = cap.text();
  const std::string last_draw = t.substr(t.rfind("\r\x1b[2K"));
  CHECK(last_draw.find("saving checkpoint-10...") != std::string::npos);
  CHECK(last_draw.find("eta") == std::string::npos);  // not "100% eta 0s" while it saves
  p.phase("");
  t = cap.text();
  CHECK(t.substr(t.rfind("\r\x1b[2K")).find("eta 0s") != std::string::npos);
  Capture plain;
  Progress q(10, 1, plain.f, ProgressMode::plain);
  q.phase("exporting the model to out/final");
  CHECK(plain.text() == "strata train: exporting the model to out/final...\n");
}

}  // namespace strata
