// A host worker thread running tasks in order, with tickets: the engine hands it gradient
// accumulation and optimizer updates so they overlap device work, and waits on a ticket only
// where a result is needed (a staging buffer about to be reused, a layer about to be uploaded).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace strata {

class HostQueue {
 public:
  HostQueue();
  ~HostQueue();
  HostQueue(const HostQueue&) = delete;
  HostQueue& operator=(const HostQueue&) = delete;

  uint64_t enqueue(std::function<void()> task);  // returns the task's ticket (1, 2, ...)
  // A task that first waits for its input (a device copy to land) and then works on it: the
  // wait is not counted in busy_s(), so busy_s() is host work only.
  uint64_t enqueue(std::function<void()> wait_for_input, std::function<void()> work);
  void wait(uint64_t ticket);                     // until that task ran; rethrows its error
  void drain() { wait(issued_); }
  double busy_s() const;                          // seconds spent working (input waits excluded)
  double waited_s() const { return waited_s_; }   // seconds callers spent blocked in wait()

 private:
  void run();
  mutable std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<std::function<void()>> queue_;
  uint64_t issued_ = 0, done_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  double busy_s_ = 0, waited_s_ = 0;
  double task_input_wait_s_ = 0;  // the running task's input wait (worker thread only)
  std::thread thread_;
};

}  // namespace strata
