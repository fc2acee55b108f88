// A watchdog for tests of code that could hang: runs a body on its own thread and fails the test
// (instead of hanging the suite) when it has not finished in time. The body's state lives on the
// heap with the thread, so a body that hangs is left behind, detached, and the suite goes on.
#pragma once
#include <catch2/catch.hpp>

#include <chrono>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <thread>

namespace strata::testing {

// True when body finished within `seconds` (an exception it threw is rethrown here).
inline bool finishes_within(double seconds, std::function<void()> body) {
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> result = done->get_future();
  std::thread([done, body = std::move(body)] {
    try {
      body();
      done->set_value();
    } catch (...) {
      done->set_exception(std::current_exception());
    }
  }).detach();
  if (result.wait_for(std::chrono::duration<double>(seconds)) != std::future_status::ready) return false;
  result.get();
  return true;
}

}  // namespace strata::testing
