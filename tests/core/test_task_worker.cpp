// The task worker behind the CPU device's streams and the engine's host queue.
#include <catch2/catch.hpp>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "src/core/error.h"
#include "src/core/task_worker.h"
#include "tests/core/watchdog.h"

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

TEST_CASE("task worker: a marker runs while tasks are skipped, and is told the error", "[core][task-worker]") {
  for (auto policy : {TaskWorker::AfterError::run_all, TaskWorker::AfterError::skip_until_wait}) {
    TaskWorker w(policy);
    std::vector<int> seen;  // 0: a marker told no error, 1: told one
    w.enqueue_marker([&](std::exception_ptr e) { seen.push_back(e ? 1 : 0); });
    w.enqueue([] { throw std::runtime_error("kernel failed"); });
    w.enqueue_marker([&](std::exception_ptr e) {
      seen.push_back(e ? 1 : 0);
      try {
        std::rethrow_exception(e);
      } catch (const std::runtime_error& x) {
        CHECK(std::string(x.what()) == "kernel failed");
      }
    });
    CHECK_THROWS_WITH(w.drain(), "kernel failed");
    w.enqueue_marker([&](std::exception_ptr e) { seen.push_back(e ? 1 : 0); });  // collected: no error now
    w.drain();
    CHECK(seen == std::vector<int>{0, 1, 0});
  }
}

TEST_CASE("task worker: a failed allocation in a task reaches the waiter as bad_alloc", "[core][task-worker]") {
  TaskWorker w(TaskWorker::AfterError::skip_until_wait);
  const uint64_t t = w.enqueue([] { throw std::bad_alloc(); });
  CHECK_THROWS_AS(w.wait(t), std::bad_alloc);
  const uint64_t input_fails = w.enqueue([] { throw std::bad_alloc(); }, [] { FAIL("the work ran after its input failed"); });
  CHECK_THROWS_AS(w.wait(input_fails), std::bad_alloc);
}

// A gate another worker's marker opens, as an event record opens the streams that wait on it.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  std::exception_ptr error;
  void pass() {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return open; });
    if (error) std::rethrow_exception(error);
  }
  void set(std::exception_ptr e) {
    std::lock_guard lock(mu);
    open = true;
    error = std::move(e);
    cv.notify_all();
  }
};

TEST_CASE("task worker: a worker waiting on a failed worker's marker gets its error, no hang", "[core][task-worker]") {
  // producer: [throws] [work] [marker opens the gate]; consumer: [passes the gate] [work]. Before
  // markers, the skipped gate-opener left the consumer (and a drain on it) blocked for ever.
  struct Seen {
    std::atomic<int> ran{0};
    std::string consumer_error, producer_error;
    ErrorKind consumer_kind = ErrorKind::input;
  };
  auto seen = std::make_shared<Seen>();
  const bool finished = testing::finishes_within(30, [seen] {
    auto gate = std::make_shared<Gate>();
    TaskWorker producer(TaskWorker::AfterError::skip_until_wait), consumer(TaskWorker::AfterError::skip_until_wait);
    consumer.enqueue([gate] { gate->pass(); });
    consumer.enqueue([seen] { ++seen->ran; });
    producer.enqueue([] { throw Error(ErrorKind::budget, "out of the device budget"); });
    producer.enqueue([seen] { ++seen->ran; });
    producer.enqueue_marker([gate](std::exception_ptr e) { gate->set(e); });
    try {
      consumer.drain();
    } catch (const Error& e) {
      seen->consumer_error = e.what();
      seen->consumer_kind = e.kind();
    }
    try {
      producer.drain();
    } catch (const Error& e) {
      seen->producer_error = e.what();
    }
  });
  REQUIRE(finished);  // else the consumer hangs on a gate nobody opens
  CHECK(seen->consumer_error == "out of the device budget");
  CHECK(seen->consumer_kind == ErrorKind::budget);
  CHECK(seen->producer_error == "out of the device budget");
  CHECK(seen->ran == 0);
}

}  // namespace strata
