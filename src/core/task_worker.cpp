#include "src/core/task_worker.h"

#include <chrono>

#include "src/core/threads.h"

namespace strata {

using Clock = std::chrono::steady_clock;

TaskWorker::TaskWorker(AfterError after_error) : after_error_(after_error), thread_([this] { run(); }) {}

TaskWorker::~TaskWorker() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

uint64_t TaskWorker::push(Task task) {
  uint64_t ticket;
  {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(task));  // strong guarantee: a bad_alloc here queues nothing
    ticket = ++issued_;
  }
  cv_.notify_all();
  return ticket;
}

uint64_t TaskWorker::enqueue(std::function<void()> task) { return push(Task{std::move(task), {}}); }

uint64_t TaskWorker::enqueue_marker(std::function<void(std::exception_ptr)> marker) {
  return push(Task{{}, std::move(marker)});
}

uint64_t TaskWorker::enqueue(std::function<void()> wait_for_input, std::function<void()> work) {
  return enqueue([this, wait = std::move(wait_for_input), work = std::move(work)] {
    const auto t0 = Clock::now();
    wait();
    task_input_wait_s_ += std::chrono::duration<double>(Clock::now() - t0).count();  // worker thread only
    work();
  });
}

void TaskWorker::wait(uint64_t ticket) {
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

void TaskWorker::drain() {
  uint64_t last;
  {
    std::lock_guard lock(mu_);
    last = issued_;
  }
  wait(last);
}

void TaskWorker::drain_quiet() noexcept {
  try {
    drain();
  } catch (...) {
  }
}

double TaskWorker::busy_s() const {
  std::lock_guard lock(mu_);
  return busy_s_;
}

double TaskWorker::waited_s() const {
  std::lock_guard lock(mu_);
  return waited_s_;
}

void TaskWorker::run() {
  for (;;) {
    Task task;
    bool skip;
    std::exception_ptr kept;  // what a marker is told
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
      skip = error_ && after_error_ == AfterError::skip_until_wait;
      kept = error_;
    }
    auto t0 = Clock::now();
    task_input_wait_s_ = 0;
    std::exception_ptr err;
    try {
      if (task.marker) {
        task.marker(kept);
      } else if (!skip) {
        cpu_threads_apply();
        task.run();
      }
    } catch (...) {
      err = std::current_exception();
    }
    task = Task{};  // what the task held goes before it is counted done (its owner may free it then)
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
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
