// The engine's host queue: one worker thread running tasks in order, with tickets
// (src/core/task_worker.h). The engine hands it gradient accumulation and optimizer updates so
// they overlap device work, and waits on a ticket only where a result is needed (a staging
// buffer about to be reused, a layer about to be uploaded). After a task throws, later tasks
// still run; the error comes back from the next wait(). A task whose input wait throws (a
// device event that completed failed: the device's error) skips its work and hands that error
// to the next wait(), so a device failure reaches the engine's thread here too.
//
// Its OpenMP team (AdamW and the gradient sums run parallel regions here) is made as it starts,
// so that a thread the OS refuses is exit 3 naming device.cpu_threads (src/core/threads.h), not
// libgomp ending the process in the middle of a step.
#pragma once
#include "src/core/task_worker.h"
#include "src/core/threads.h"

namespace strata {

class HostQueue : public TaskWorker {
 public:
  HostQueue() : TaskWorker(AfterError::run_all) { wait(enqueue([] { cpu_threads_start_team(); })); }
};

}  // namespace strata
