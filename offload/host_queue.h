// The engine's host queue: one worker thread running tasks in order, with tickets
// (src/core/task_worker.h). The engine hands it gradient accumulation and optimizer updates so
// they overlap device work, and waits on a ticket only where a result is needed (a staging
// buffer about to be reused, a layer about to be uploaded). After a task throws, later tasks
// still run; the error comes back from the next wait().
#pragma once
#include "src/core/task_worker.h"

namespace strata {

class HostQueue : public TaskWorker {
 public:
  HostQueue() : TaskWorker(AfterError::run_all) {}
};

}  // namespace strata
