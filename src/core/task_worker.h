// One worker thread running tasks in the order they were queued, with tickets: the CPU
// device's streams (src/device/cpu_device.cpp) and the engine's host queue
// (offload/host_queue.h) are each one of these. A task that throws does not stop the worker;
// the first error is kept and rethrown by the next wait(), which then clears it.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace strata {

class TaskWorker {
 public:
  // What runs after a task has thrown, until a wait() collects the error:
  //   run_all:         every task still runs (the host queue: later tasks are independent);
  //   skip_until_wait: tasks are dequeued and counted done without running (a device stream:
  //                    what follows a failed kernel would read garbage), so events still fire.
  enum class AfterError : uint8_t { run_all, skip_until_wait };

  explicit TaskWorker(AfterError after_error);
  ~TaskWorker();  // runs what is queued, then joins
  TaskWorker(const TaskWorker&) = delete;
  TaskWorker& operator=(const TaskWorker&) = delete;

  uint64_t enqueue(std::function<void()> task);  // returns the task's ticket (1, 2, ...)
  // A task that first waits for its input (a device copy to land) and then works on it: the
  // wait is not counted in busy_s(), so busy_s() is work only.
  uint64_t enqueue(std::function<void()> wait_for_input, std::function<void()> work);
  void wait(uint64_t ticket);                     // until that task ran; rethrows a kept error
  void drain();                                   // until every task queued so far ran
  void drain_quiet() noexcept;                    // drain, dropping a kept error (destructors)
  double busy_s() const;                          // seconds spent running tasks (input waits excluded)
  double waited_s() const;                        // seconds callers spent blocked in wait()

 private:
  void run();
  const AfterError after_error_;
  mutable std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<std::function<void()>> queue_;
  uint64_t issued_ = 0, done_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  double busy_s_ = 0, waited_s_ = 0;
  double task_input_wait_s_ = 0;  // the running task's input wait (worker thread only)
  std::thread thread_;  // last: starts after every other member exists
};

}  // namespace strata
