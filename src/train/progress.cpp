#include "src/train/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "src/core/error.h"
#include "src/core/tensor.h"

namespace strata {
namespace {

constexpr size_t kEtaWindow = 50;       // step times the ETA averages
constexpr int kFallbackWidth = 100;     // columns when the terminal does not say
constexpr int kBarMin = 10, kBarMax = 40;
constexpr const char* kClearLine = "\r\x1b[2K";

template <class... Args>
std::string format(const char* fmt, Args... args) {
  char buf[256];
  std::snprintf(buf, sizeof buf, fmt, args...);
  return buf;
}

// format_bytes without the space ("19.0MiB"): the bar is short of room.
std::string bytes_compact(size_t bytes) {
  std::string s = format_bytes(bytes);
  s.erase(std::remove(s.begin(), s.end(), ' '), s.end());
  return s;
}

std::optional<ProgressMode> mode_from_env() {
  const char* v = std::getenv("STRATA_PROGRESS");
  if (!v || !*v || std::strcmp(v, "auto") == 0) return std::nullopt;
  if (std::strcmp(v, "plain") == 0) return ProgressMode::plain;
  if (std::strcmp(v, "bar") == 0) return ProgressMode::bar;
  STRATA_CHECK(false, "STRATA_PROGRESS is \"", v, "\"; use plain (log lines), bar (a progress bar) or auto "
               "(a bar when stderr is a terminal)");
  return std::nullopt;
}

}  // namespace

std::string progress_format_duration(double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds)) return "?";
  const int64_t s = std::llround(seconds);
  if (s < 60) return format("%llds", (long long)s);
  if (s < 3600) return format("%lldm%02llds", (long long)(s / 60), (long long)(s % 60));
  const int64_t m = (s + 30) / 60;  // minutes, rounded
  return format("%lldh%02lldm", (long long)(m / 60), (long long)(m % 60));
}

std::string progress_format_rate(double per_s) {
  if (!std::isfinite(per_s)) return "?";
  if (per_s < 999.5) return format("%.0f", per_s);
  if (per_s < 999.5e3) return format("%.1fk", per_s / 1e3);
  if (per_s < 999.5e6) return format("%.2fM", per_s / 1e6);
  return format("%.2fG", per_s / 1e9);
}

Progress::Progress(int64_t total_steps, int64_t log_steps, std::FILE* f, std::optional<ProgressMode> mode,
                   int width)
    : total_(total_steps), log_steps_(std::max<int64_t>(1, log_steps)), f_(f), width_(width) {
  if (!mode) mode = mode_from_env();
  if (!mode) mode = ::isatty(::fileno(f)) ? ProgressMode::bar : ProgressMode::plain;
  mode_ = *mode;
}

Progress::~Progress() { finish(); }

double Progress::eta_s() const {
  if (!last_) return NAN;
  double mean = first_step_s_;
  if (!recent_s_.empty()) {
    mean = 0;
    for (double s : recent_s_) mean += s;
    mean /= double(recent_s_.size());
  }
  const int64_t total = last_->total > 0 ? last_->total : total_;
  const double save_mean = saves_seen_ ? save_s_sum_ / double(saves_seen_) : 0.0;
  return mean * double(std::max<int64_t>(0, total - last_->step)) + save_mean * double(saves_left(last_->step));
}

int64_t Progress::saves_left(int64_t after_step) const {
  const int64_t total = last_ && last_->total > 0 ? last_->total : total_;
  if (after_step >= total) return 0;
  int64_t periodic = 0;  // multiples of save_steps in (after_step, total)
  if (save_steps_ > 0) periodic = (total - 1) / save_steps_ - after_step / save_steps_;
  return std::max<int64_t>(0, periodic) + 1;  // + the save at the last step
}

void Progress::saved(double seconds) {
  save_s_sum_ += seconds;
  ++saves_seen_;
}

void Progress::phase(const std::string& what) {
  phase_ = what;
  if (what.empty()) {
    if (mode_ == ProgressMode::bar && bar_shown_ && last_) write(kClearLine + bar_line(*last_, terminal_width()));
    return;
  }
  if (mode_ == ProgressMode::bar && bar_shown_ && last_) write(kClearLine + bar_line(*last_, terminal_width()));
  else message("strata train: " + what + "...");
}

std::string Progress::plain_line(const StepReport& r) const {
  const int64_t total = r.total > 0 ? r.total : total_;
  std::string s = format("step %lld/%lld  loss %.4f  lr %.3e", (long long)r.step, (long long)total, r.loss, r.lr);
  if (!std::isnan(r.grad_norm)) s += format("  grad_norm %.3f", r.grad_norm);
  s += "  " + progress_format_rate(r.tokens_per_s) + " tok/s";
  if (!std::isnan(r.mfu)) s += format("  mfu %.1f%%", 100.0 * r.mfu);
  if (!r.extra.empty()) s += "  " + r.extra;
  s += "  eta " + progress_format_duration(eta_s());
  return s;
}

std::string Progress::bar_line(const StepReport& r, int width) const {
  const int64_t total = r.total > 0 ? r.total : total_;
  const double frac = total > 0 ? std::clamp(double(r.step) / double(total), 0.0, 1.0) : 0.0;
  // Fields in display order; `keep` ranks them: the lowest goes first when the line is too long.
  struct Field {
    std::string text;
    int keep;
  };
  const std::string kBar = "\x01";  // stands for the bar, whose width is decided last
  // step and percent are padded to their widest so the bar does not shift as they grow
  const int step_digits = int(std::to_string(total).size());
  std::vector<Field> fields = {
      {format("step %*lld/%lld", step_digits, (long long)r.step, (long long)total), 100},
      {kBar, 70},
      {format("%3.0f%%", std::floor(100.0 * frac)), 80},
      {format("loss %.3f", r.loss), 95},
  };
  if (!r.extra.empty()) fields.push_back({r.extra, 85});
  if (!std::isnan(last_eval_)) fields.push_back({format("eval %.3f", last_eval_), 45});
  fields.push_back({format("lr %.1e", r.lr), 50});
  if (!std::isnan(r.grad_norm)) fields.push_back({format("gnorm %.2f", r.grad_norm), 40});
  fields.push_back({progress_format_rate(r.tokens_per_s) + " tok/s", 60});
  if (!std::isnan(r.mfu)) fields.push_back({format("mfu %.0f%%", 100.0 * r.mfu), 35});
  fields.push_back({phase_.empty() ? "eta " + progress_format_duration(eta_s()) : phase_ + "...", 90});
  fields.push_back({"dev " + bytes_compact(r.device_bytes), 30});
  fields.push_back({"host " + bytes_compact(r.host_bytes), 25});
  if (r.host_pinned_bytes > 0) fields.push_back({"pinned " + bytes_compact(r.host_pinned_bytes), 20});

  // The last column stays empty: a character there makes some terminals wrap.
  const int room = std::max(1, width - 1);
  auto length = [&](int bar_inner) {
    int n = 0;
    for (auto& f : fields) n += (f.text == kBar ? bar_inner + 2 : int(f.text.size())) + 1;
    return n - 1;
  };
  while (fields.size() > 1 && length(kBarMin) > room) {
    auto lowest = std::min_element(fields.begin(), fields.end(),
                                   [](const Field& a, const Field& b) { return a.keep < b.keep; });
    fields.erase(lowest);
  }
  const int bar_inner = std::clamp(kBarMin + room - length(kBarMin), kBarMin, kBarMax);
  const int filled = int(std::floor(frac * bar_inner));
  std::string line;
  for (auto& f : fields) {
    if (!line.empty()) line += ' ';
    if (f.text == kBar) {
      line += '[';
      line.append(size_t(filled), '#');
      line.append(size_t(bar_inner - filled), '.');
      line += ']';
    } else {
      line += f.text;
    }
  }
  if (int(line.size()) > room) line.resize(size_t(room));  // a terminal narrower than one field
  return line;
}

int Progress::terminal_width() const {
  if (width_ > 0) return width_;
  struct winsize ws {};
  if (::ioctl(::fileno(f_), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return int(ws.ws_col);
  if (const char* c = std::getenv("COLUMNS")) {
    int n = std::atoi(c);
    if (n > 0) return n;
  }
  return kFallbackWidth;
}

void Progress::write(const std::string& s) {
  std::fwrite(s.data(), 1, s.size(), f_);
  std::fflush(f_);  // progress is for watching: never sit in a buffer
}

void Progress::step(const StepReport& r) {
  const bool first = steps_seen_ == 0;
  ++steps_seen_;
  if (first) first_step_s_ = r.step_s;
  else {
    recent_s_.push_back(r.step_s);
    if (recent_s_.size() > kEtaWindow) recent_s_.pop_front();
  }
  last_ = r;
  phase_.clear();  // a step means whatever phase was announced is over
  if (!std::isnan(r.eval_loss)) last_eval_ = r.eval_loss;
  finished_ = false;
  const int64_t total = r.total > 0 ? r.total : total_;
  const bool log_due = first || r.step % log_steps_ == 0 || r.step == total;
  last_printed_ = false;

  std::string out;
  if (mode_ == ProgressMode::plain) {
    if (log_due) {
      out = plain_line(r) + "\n";
      last_printed_ = true;
    }
  } else {
    out = kClearLine + bar_line(r, terminal_width());  // a terminal gets the bar alone
    bar_shown_ = true;
  }
  write(out);
  if (!std::isnan(r.eval_loss))
    message(format("step %lld/%lld  eval_loss %.4f", (long long)r.step, (long long)total, r.eval_loss));
}

void Progress::message(const std::string& line) {
  std::string text = line;
  if (!text.empty() && text.back() == '\n') text.pop_back();
  if (mode_ == ProgressMode::bar && bar_shown_ && last_)
    write(kClearLine + text + "\n" + kClearLine + bar_line(*last_, terminal_width()));
  else
    write(text + "\n");
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  if (mode_ == ProgressMode::bar) {
    if (bar_shown_) write("\n");
    bar_shown_ = false;
  } else if (last_ && !last_printed_) {
    write(plain_line(*last_) + "\n");
    last_printed_ = true;
  }
}

}  // namespace strata
