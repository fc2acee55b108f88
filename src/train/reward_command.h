// The external reward program of GRPO (`grpo.reward_command`, issue 41): one child process
// started once for the run (/bin/sh -c COMMAND), fed one JSON line per completion on its stdin
// — {"prompt", "completion", ...the example's fields} — and answering one line per completion
// on its stdout, {"reward": x}, in order. Each batch has `grpo.reward_timeout` seconds.
// Failures end the run with a message naming the reply line (counted from 1 over the run) and
// leave the last checkpoint as it was:
//   a reply that is not JSON, lacks a numeric "reward" or holds a non-finite one: exit 2;
//   a program that exits, closes its stdout or stdin, or times out: exit 4 (a timed-out child
//   is killed); the child is always reaped. Writes and reads interleave under poll(), so a
//   program that answers before reading everything cannot deadlock the pipes; SIGPIPE is
//   ignored (a write to a dead child is EPIPE, reported as its death).
#pragma once
#include <sys/types.h>

#include <string>
#include <vector>

#include "src/train/rewards.h"

namespace strata {

class RewardCommand {
 public:
  RewardCommand(const std::string& command, double timeout_s);
  ~RewardCommand();  // closes its stdin, waits up to 2 s for it to exit, then kills; reaps
  RewardCommand(const RewardCommand&) = delete;
  RewardCommand& operator=(const RewardCommand&) = delete;

  std::vector<double> score(const std::vector<RewardSample>& samples);
  pid_t pid() const { return pid_; }

 private:
  // The child's end: kill (when still running) and reap; its exit described for a message.
  std::string reap(bool kill_first);
  std::string command_;
  double timeout_s_ = 60;
  pid_t pid_ = -1;
  int to_child_ = -1, from_child_ = -1;
  std::string pending_;      // read but not yet a whole line
  size_t replies_ = 0;       // reply lines read over the run
};

}  // namespace strata
