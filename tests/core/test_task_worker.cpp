// The task worker behind the CPU device's streams and the engine's host queue.
#include <catch2/catch.hpp>

#include <atomic>
#include <stdexcept>
#include <vector>

#include "src/core/error.h"
#include "src/core/task_worker.h"

namespace strata {

TEST_CASE("task worker: tasks run in order, tickets count from 1, wait returns after the task", "[core]") {
  TaskWorker w(TaskWorker::AfterError::run_all);
  std::vector<int> order;
  uint64_t t1 = w.enqueue([&] { order.push_back(1); });
  uint64_t t2 = w.enqueue([&] { order.push_back(2); });
  uint64_t t3 = w.enqueue([&] { order.push_back(3); });
  CHECK(t1 == 1);
  CHECK(t2 == 2);
  CHECK(t3 == 3);
  w.wait(t2);
  CHECK(order.size() >= 2);
  w.drain();
  CHECK(order == std::vector<int>{1, 2, 3});
}

TEST_CASE("task worker: after a failure, run_all keeps running, skip_until_wait skips until collected", "[core]") {
  for (auto policy : {TaskWorker::AfterError::run_all, TaskWorker::AfterError::skip_until_wait}) {
    TaskWorker w(policy);
    std::atomic<int> ran{0};
    w.enqueue([] { throw std::runtime_error("bad input"); });
    w.enqueue([&] { ++ran; });
    CHECK_THROWS_WITH(w.drain(), Catch::Contains("bad input"));
    CHECK(ran == (policy == TaskWorker::AfterError::run_all ? 1 : 0));
    w.drain();  // the error was collected once
    w.enqueue([&] { ++ran; });
    w.drain();
    CHECK(ran == (policy == TaskWorker::AfterError::run_all ? 2 : 1));
  }
}

}  // namespace strata
