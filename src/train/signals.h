// Stopping a training run by signal. SIGINT, SIGTERM and SIGHUP (a closed terminal or ssh
// session) all mean "stop": while the run is being set up (loading or initialising weights,
// tokenizing) the process exits at once with 130 — nothing was trained, nothing needs saving;
// once training has begun the first signal lets the current step finish, saves a checkpoint and
// returns (the CLI exits 130), and a second signal exits at once with kExitStoppedAtOnce (every
// save is atomic, so what was saved before stays intact).
#pragma once

namespace strata {

inline constexpr int kExitInterrupted = 130;
inline constexpr int kExitStoppedAtOnce = 5;

void train_install_signal_handlers();
void train_request_stop();         // as a first signal would (tests)
bool train_stop_requested();
// Set-up (true: a signal exits at once) or training (false: a signal stops after the step).
void train_signal_phase_setup(bool setup);
void train_signals_reset();        // a new run starts with no stop requested

}  // namespace strata
