#include "src/train/signals.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <initializer_list>

namespace strata {
namespace {

std::atomic<int> g_signals{0};
std::atomic<bool> g_setup{false};

void say(const char* msg, size_t n) {
  ssize_t ignored = ::write(2, msg, n);
  (void)ignored;
}

extern "C" void on_stop_signal(int) {
  if (g_setup.load()) {
    const char msg[] = "\nstrata train: stopped during set-up; nothing was trained or saved\n";
    say(msg, sizeof msg - 1);
    ::_exit(kExitInterrupted);
  }
  if (g_signals.fetch_add(1) == 0) {
    const char msg[] = "\nstrata train: stopping after this step and saving a checkpoint "
                       "(signal again to stop at once without saving)\n";
    say(msg, sizeof msg - 1);
    return;
  }
  const char msg[] = "\nstrata train: second signal: stopped at once; earlier checkpoints are intact\n";
  say(msg, sizeof msg - 1);
  ::_exit(kExitStoppedAtOnce);
}

}  // namespace

void train_install_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &sa, nullptr);
}

void train_request_stop() { g_signals.fetch_add(1); }
bool train_stop_requested() { return g_signals.load() > 0; }
void train_signal_phase_setup(bool setup) { g_setup.store(setup); }
void train_signals_reset() { g_signals.store(0); }

}  // namespace strata
