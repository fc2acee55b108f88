// Data-parallel GRPO's split of a step's prompts over the ranks (src/train/grpo_step.h,
// grpo_rank_prompts): whole groups on each rank, in the micro-batch order that makes N ranks the
// one-process run with N times the accumulation; a block of prompts per rank when a micro-batch
// is smaller than a group; exit 2 when groups cannot stay whole. (The collective part runs under
// mpirun: tests/train/run_train_mpi.sh grpo.)
#include <catch2/catch.hpp>
#include <set>

#include "src/core/error.h"
#include "src/train/grpo_step.h"

namespace strata {

TEST_CASE("GRPO deals whole groups to each rank in the one-process micro-batch order", "[grpo]") {
  using V = std::vector<size_t>;
  // one rank: every prompt in order
  CHECK(grpo_rank_prompts(3, 4, 2, 0, 1) == V{0, 1, 2});
  // micro-batches of 4 = 1 prompt x 4 generations, 2 ranks x 2 micro-batches: rank r takes
  // global micro-batches r, r + 2 (prompts r, r + 2)
  CHECK(grpo_rank_prompts(4, 4, 4, 0, 2) == V{0, 2});
  CHECK(grpo_rank_prompts(4, 4, 4, 1, 2) == V{1, 3});
  // micro-batches of 2 prompts, 3 ranks x 1
  CHECK(grpo_rank_prompts(6, 2, 4, 2, 3) == V{4, 5});
  // micro-batches of 2 < G = 4: each rank a block of whole prompts
  CHECK(grpo_rank_prompts(4, 4, 2, 0, 2) == V{0, 1});
  CHECK(grpo_rank_prompts(4, 4, 2, 1, 2) == V{2, 3});
  // every prompt exactly once over the ranks
  for (const int64_t rows : {2, 4, 8}) {
    std::multiset<size_t> seen;
    for (int r = 0; r < 4; ++r)
      for (size_t p : grpo_rank_prompts(8, 4, rows, r, 4)) seen.insert(p);
    CHECK(seen == std::multiset<size_t>{0, 1, 2, 3, 4, 5, 6, 7});
  }
  // a group over two ranks (1 prompt, 4 generations, 2 ranks of 2): refused, naming the key
  try {
    grpo_rank_prompts(1, 4, 2, 0, 2);
    FAIL("a group split over ranks was accepted");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::input);
    CHECK(std::string(e.what()).find("grpo.num_generations") != std::string::npos);
  }
}

}  // namespace strata
