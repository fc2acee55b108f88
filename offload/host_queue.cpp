#include "offload/host_queue.h"

#include <chrono>

#include "src/core/threads.h"

namespace strata {

using Clock = std::chrono::steady_clock;

HostQueue::HostQueue() : thread_([this] { run(); }) {}

HostQueue::~HostQueue() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

uint64_t HostQueue::enqueue(std::function<void()> task) {
  std::lock_guard lock(mu_);
  queue_.push_back(std::move(task));
  cv_.notify_all();
  return ++issued_;
}

uint64_t HostQueue::enqueue(std::function<void()> wait_for_input, std::function<void()> work) {
  return enqueue([this, wait = std::move(wait_for_input), work = std::move(work)] {
    const auto t0 = Clock::now();
    wait();
    task_input_wait_s_ += std::chrono::duration<double>(Clock::now() - t0).count();  // worker thread only
    work();
  });
}

void HostQueue::wait(uint64_t ticket) {
  auto t0 = Clock::now();
  std::unique_lock lock(mu_);
  done_cv_.wait(lock, [&] { return done_ >= ticket; });
  waited_s_ += std::chrono::duration<double>(Clock::now() - t0).count();
  if (error_) {
    auto e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

double HostQueue::busy_s() const {
  std::lock_guard lock(mu_);
  return busy_s_;
}

void HostQueue::run() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    auto t0 = Clock::now();
    task_input_wait_s_ = 0;
    std::exception_ptr err;
    try {
      cpu_threads_apply();
      task();
    } catch (...) {
      err = std::current_exception();
    }
    double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    {
      std::lock_guard lock(mu_);
      busy_s_ += dt - task_input_wait_s_;
      if (err && !error_) error_ = err;
      ++done_;
    }
    done_cv_.notify_all();
  }
}

}  // namespace strata
