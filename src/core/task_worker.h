// One worker thread running tasks in the order they were queued, with tickets: the CPU
// device's streams (src/device/cpu_device.cpp) and the engine's host queue
// (offload/stream/host_queue.h) are each one of these. A task that throws does not stop the worker;
// the first error is kept and rethrown by the next wait(), which then clears it.
//
// Nothing queued may be lost on the way: a task that must run whatever happened before it (an
// event record, which other threads wait on) is a marker: it runs even while later tasks are
// skipped, and is handed the kept error so that it can pass the failure on instead of leaving
// a waiter blocked for ever (CpuDevice: the event completes marked failed).
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
  //                    what follows a failed kernel would read garbage); markers still run.
  enum class AfterError : uint8_t { run_all, skip_until_wait };

  explicit TaskWorker(AfterError after_error);  // throws std::system_error when no thread can be made
  ~TaskWorker();  // runs what is queued (markers and skips as above), then joins
  TaskWorker(const TaskWorker&) = delete;
  TaskWorker& operator=(const TaskWorker&) = delete;

  uint64_t enqueue(std::function<void()> task);  // returns the task's ticket (1, 2, ...)
  // A task that first waits for its input (a device copy to land) and then works on it: the
  // wait is not counted in busy_s(), so busy_s() is work only. A wait that throws skips the work.
  uint64_t enqueue(std::function<void()> wait_for_input, std::function<void()> work);
  // A marker: runs in order like any task, also while tasks are being skipped, and is given the
  // error kept at that moment (null when none). It should not throw (if it does, the error is
  // kept as any task's).
  uint64_t enqueue_marker(std::function<void(std::exception_ptr)> marker);
  void wait(uint64_t ticket);                     // until that task ran; rethrows a kept error
  void drain();                                   // until every task queued so far ran
  void drain_quiet() noexcept;                    // drain, dropping a kept error (destructors)
  double busy_s() const;                          // seconds spent running tasks (input waits excluded)
  double waited_s() const;                        // seconds callers spent blocked in wait()

 private:
  struct Task {
    std::function<void()> run;
    std::function<void(std::exception_ptr)> marker;  // set for a marker (run is empty)
  };
  uint64_t push(Task task);
  void run();
  const AfterError after_error_;
  mutable std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<Task> queue_;
  uint64_t issued_ = 0, done_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  double busy_s_ = 0, waited_s_ = 0;
  double task_input_wait_s_ = 0;  // the running task's input wait (worker thread only)
  std::thread thread_;  // last: starts after every other member exists
};

}  // namespace strata
