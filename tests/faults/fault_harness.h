// The fault-injection suite's harness (tests/faults/README.md): runs a strata command line in a
// process group of its own under a watchdog, and tells how it ended. A run past its bound is
// killed (the whole group) and reported as hung, so a regression fails the test instead of
// hanging the suite; a process of the group still alive after the run ended is reported too.
#pragma once
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <string>
#include <thread>

namespace strata::testing {

struct BoundedRun {
  int code = -1;        // exit status; -1 when ended by a signal
  int signal = 0;       // the signal that ended it
  bool hung = false;    // still running at the bound: the group was killed
  bool leftover = false;  // a process of its group outlived it (killed by the harness)
  double seconds = 0;
  std::string out;      // stdout and stderr together
};

// `command` run by /bin/sh in a new process group, for at most bound_s seconds.
inline BoundedRun run_bounded(const std::string& command, double bound_s) {
  BoundedRun r;
  int fd[2];
  if (::pipe(fd) != 0) return r;
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t pid = ::fork();
  if (pid < 0) return r;
  if (pid == 0) {
    ::setpgid(0, 0);
    ::dup2(fd[1], 1);
    ::dup2(fd[1], 2);
    ::close(fd[0]);
    ::close(fd[1]);
    ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // both sides set it: no race with the child's exec
  ::close(fd[1]);
  ::fcntl(fd[0], F_SETFL, O_NONBLOCK);
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  int status = 0;
  bool exited = false, eof = false;
  while (!exited || !eof) {
    if (!exited && ::waitpid(pid, &status, WNOHANG) == pid) exited = true;
    if (elapsed() > bound_s) {
      r.hung = !exited;
      ::kill(-pid, SIGKILL);
      if (!exited) ::waitpid(pid, &status, 0);
      exited = true;
      break;
    }
    pollfd p{fd[0], POLLIN, 0};
    if (!eof && ::poll(&p, 1, 50) > 0) {
      char buf[4096];
      const ssize_t n = ::read(fd[0], buf, sizeof buf);
      if (n > 0) r.out.append(buf, size_t(n));
      else if (n == 0 || (errno != EAGAIN && errno != EINTR)) eof = true;
    } else if (eof) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  ::close(fd[0]);
  r.seconds = elapsed();
  if (WIFEXITED(status)) r.code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  // what is left of the group: given a moment to go, then killed and reported
  for (int i = 0; i < 50 && ::kill(-pid, 0) == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (::kill(-pid, 0) == 0) {
    r.leftover = true;
    ::kill(-pid, SIGKILL);
  }
  return r;
}

}  // namespace strata::testing
