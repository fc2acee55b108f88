// The external reward program (reward_command.h): fork/exec through /bin/sh, two pipes, a
// poll() loop with a deadline per batch.
#include "src/train/reward_command.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>

#include "src/core/error.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;

void close_fd(int* fd) {
  if (*fd >= 0) ::close(*fd);
  *fd = -1;
}

}  // namespace

RewardCommand::RewardCommand(const std::string& command, double timeout_s) : command_(command), timeout_s_(timeout_s) {
  STRATA_CHECK(!command.empty(), "grpo.reward_command is empty; give a command line or leave the key out");
  STRATA_CHECK(timeout_s > 0, "grpo.reward_timeout must be > 0 seconds (got ", timeout_s, ")");
  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ign, nullptr);  // a write to a dead child: EPIPE, not a signal
  int in[2], out[2];
  STRATA_CHECK_IO(::pipe2(in, O_CLOEXEC) == 0 && ::pipe2(out, O_CLOEXEC) == 0, "grpo.reward_command: pipe failed: ",
                  std::strerror(errno));
  pid_ = ::fork();
  STRATA_CHECK_IO(pid_ >= 0, "grpo.reward_command: fork failed: ", std::strerror(errno));
  if (pid_ == 0) {  // child: stdin from in[0], stdout to out[1]
    ::dup2(in[0], 0);
    ::dup2(out[1], 1);
    ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(in[0]);
  ::close(out[1]);
  to_child_ = in[1];
  from_child_ = out[0];
  ::fcntl(to_child_, F_SETFL, ::fcntl(to_child_, F_GETFL) | O_NONBLOCK);
  ::fcntl(from_child_, F_SETFL, ::fcntl(from_child_, F_GETFL) | O_NONBLOCK);
}

RewardCommand::~RewardCommand() {
  close_fd(&to_child_);  // EOF on its stdin: a well-behaved program exits
  if (pid_ > 0) {
    const auto end = Clock::now() + std::chrono::seconds(2);
    int status = 0;
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
      if (Clock::now() >= end) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        break;
      }
      ::usleep(10000);
    }
    pid_ = -1;
  }
  close_fd(&from_child_);
}

std::string RewardCommand::reap(bool kill_first) {
  close_fd(&to_child_);
  close_fd(&from_child_);
  if (pid_ <= 0) return "gone";
  if (kill_first) ::kill(pid_, SIGKILL);
  int status = 0;
  pid_t r;
  do r = ::waitpid(pid_, &status, 0);
  while (r < 0 && errno == EINTR);
  pid_ = -1;
  if (r < 0) return "gone";
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "was killed by signal " + std::to_string(WTERMSIG(status));
  return "ended";
}

std::vector<double> RewardCommand::score(const std::vector<RewardSample>& samples) {
  STRATA_CHECK_IO(pid_ > 0, "grpo.reward_command (", command_, ") is no longer running");
  std::string out;  // the batch's requests, one JSON line per completion
  for (const RewardSample& s : samples) {
    nlohmann::json j = s.fields.is_object() ? s.fields : nlohmann::json::object();
    j["prompt"] = s.prompt;
    j["completion"] = s.completion;
    out += j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    out += '\n';
  }
  std::vector<double> rewards;
  rewards.reserve(samples.size());
  size_t written = 0;
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s_);
  char buf[65536];
  while (rewards.size() < samples.size()) {
    const size_t line = replies_ + 1;  // the reply line awaited, counted over the run
    const double left_ms = std::chrono::duration<double, std::milli>(deadline - Clock::now()).count();
    if (left_ms <= 0) {
      const std::string how = reap(true);
      STRATA_CHECK_IO(false, "grpo.reward_command (", command_, ") gave no reply line ", line, " within ",
                      timeout_s_, " s (grpo.reward_timeout) and was killed (", how, "); the last checkpoint is kept");
    }
    pollfd fds[2] = {{from_child_, POLLIN, 0}, {written < out.size() ? to_child_ : -1, POLLOUT, 0}};
    const int n = ::poll(fds, 2, int(std::min(left_ms, 1e9)) + 1);
    if (n < 0 && errno == EINTR) continue;
    STRATA_CHECK_IO(n >= 0, "grpo.reward_command: poll failed: ", std::strerror(errno));
    if (fds[1].revents & (POLLOUT | POLLERR | POLLHUP)) {
      const ssize_t w = ::write(to_child_, out.data() + written, out.size() - written);
      if (w < 0 && errno != EAGAIN && errno != EINTR) {
        const std::string how = reap(true);
        STRATA_CHECK_IO(false, "grpo.reward_command (", command_, ") stopped reading its input before reply line ",
                        line, " (", std::strerror(errno), "; it ", how, "); the last checkpoint is kept");
      }
      if (w > 0) written += size_t(w);
    }
    if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      const ssize_t r = ::read(from_child_, buf, sizeof buf);
      if (r == 0) {
        const std::string how = reap(false);
        STRATA_CHECK_IO(false, "grpo.reward_command (", command_, ") closed its output before reply line ", line,
                        " (it ", how, "); the last checkpoint is kept");
      }
      if (r < 0 && errno != EAGAIN && errno != EINTR) {
        const std::string how = reap(true);
        STRATA_CHECK_IO(false, "grpo.reward_command: reading reply line ", line, " failed: ", std::strerror(errno),
                        " (it ", how, ")");
      }
      if (r > 0) pending_.append(buf, size_t(r));
      size_t nl;
      while (rewards.size() < samples.size() && (nl = pending_.find('\n')) != std::string::npos) {
        std::string text = pending_.substr(0, nl);
        pending_.erase(0, nl + 1);
        if (!text.empty() && text.back() == '\r') text.pop_back();
        const size_t at = ++replies_;
        nlohmann::json j;
        try {
          j = nlohmann::json::parse(text);
        } catch (const nlohmann::json::out_of_range&) {  // 1e999: a number no double holds
          reap(true);
          STRATA_CHECK(false, "grpo.reward_command reply line ", at, " has a non-finite reward: ", text.substr(0, 200),
                       "; the last checkpoint is kept");
        } catch (const nlohmann::json::exception&) {
          reap(true);
          STRATA_CHECK(false, "grpo.reward_command reply line ", at, " is not JSON: \"", text.substr(0, 200),
                       "\"; each reply must be one line {\"reward\": x}; the last checkpoint is kept");
        }
        if (!j.is_object() || !j.contains("reward") || !j["reward"].is_number()) {
          reap(true);
          STRATA_CHECK(false, "grpo.reward_command reply line ", at, " has no numeric \"reward\": ", text.substr(0, 200),
                       "; the last checkpoint is kept");
        }
        const double x = j["reward"].get<double>();
        if (!std::isfinite(x)) {
          reap(true);
          STRATA_CHECK(false, "grpo.reward_command reply line ", at, " has a non-finite reward: ", text.substr(0, 200),
                       "; the last checkpoint is kept");
        }
        rewards.push_back(x);
      }
    }
  }
  return rewards;
}

}  // namespace strata
