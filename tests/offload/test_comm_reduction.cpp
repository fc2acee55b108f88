// The data-parallel gradient reduction (offload/reduce/comm_reduction.h) without mpirun: N ranks as
// threads over a rendezvous comm that sums in rank order as the MPI comm does (comm.h), fed the
// engine's call sequence (head chunks K-1..0, a dense layer, the embedding scatter) for A rounds
// of N micro-batches. Every rank's accumulation must equal, bit for bit, one process adding the
// A x N micro-batches one after another (NoGradReduction); tied and untied heads, N = 2 and 3,
// token ids repeated within and across micro-batches. The data is checked to be sensitive: the
// plain "all-reduce, then add" order gives other bits.
#include <catch2/catch.hpp>

#include <barrier>
#include <cstring>
#include <random>
#include <thread>

#include "offload/reduce/comm_reduction.h"
#include "src/core/error.h"

namespace strata {
namespace {

// N ranks as threads: each collective meets at a barrier, every rank reads every rank's buffer
// and sums in rank order ((x0 + x1) + x2), then a second barrier before anyone writes back.
struct Rendezvous {
  explicit Rendezvous(int n) : size(n), meet(n), posted(size_t(n)) {}
  int size;
  std::barrier<> meet;
  std::vector<const void*> posted;
};

class ThreadComm final : public Comm {
 public:
  ThreadComm(Rendezvous& rv, int rank) : rv_(rv), rank_(rank) {}
  std::string name() const override { return "threads"; }
  int rank() const override { return rank_; }
  int size() const override { return rv_.size; }
  int local_rank() const override { return rank_; }
  bool device_buffers() const override { return false; }
  CommTicket all_reduce_sum(float* data, size_t count, Stream) override { return reduce(data, count); }
  CommTicket all_reduce_sum(double* values, size_t count) override { return reduce(values, count); }
  CommTicket broadcast(void*, size_t, int, Stream) override { throw std::logic_error("not used"); }
  void barrier() override { rv_.meet.arrive_and_wait(); }

 private:
  template <class T>
  CommTicket reduce(T* data, size_t count) {
    rv_.posted[size_t(rank_)] = data;
    rv_.meet.arrive_and_wait();
    std::vector<T> sum(count);
    for (size_t i = 0; i < count; ++i) {
      T s = static_cast<const T*>(rv_.posted[0])[i];
      for (int r = 1; r < rv_.size; ++r) s += static_cast<const T*>(rv_.posted[size_t(r)])[i];
      sum[i] = s;
    }
    rv_.meet.arrive_and_wait();
    std::memcpy(data, sum.data(), count * sizeof(T));
    return {};
  }
  Rendezvous& rv_;
  int rank_;
};

// One micro-batch's gradients as the engine hands them over.
struct MicroGrads {
  std::vector<float> head;    // (V, C): the dense lm_head gradient
  std::vector<float> layer;   // (F): a decoder layer's gradient
  std::vector<float> dx0;     // (n, C)
  std::vector<int32_t> ids;   // (n)
};

constexpr int64_t V = 37, C = 5, F = 17, n_tokens = 6, chunk_rows = 16;

MicroGrads make_micro(std::mt19937& rng) {
  std::uniform_real_distribution<float> mag(-1.f, 1.f);
  std::uniform_int_distribution<int> expo(-12, 6), id(0, 7), far_id(0, int(V) - 1);
  auto value = [&] { return std::ldexp(mag(rng), expo(rng)); };  // mixed magnitudes: rounding shows
  MicroGrads g;
  for (int64_t i = 0; i < V * C; ++i) g.head.push_back(value());
  for (int64_t i = 0; i < F; ++i) g.layer.push_back(value());
  for (int64_t i = 0; i < n_tokens * C; ++i) g.dx0.push_back(value());
  for (int64_t t = 0; t < n_tokens; ++t) g.ids.push_back(t % 3 == 2 ? far_id(rng) : id(rng));  // repeats
  return g;
}

struct Accumulation {
  std::vector<float> table = std::vector<float>(size_t(V * C), 0.f);  // embedding (and tied head) gradient
  std::vector<float> head = std::vector<float>(size_t(V * C), 0.f);   // untied lm_head gradient
  std::vector<float> layer = std::vector<float>(size_t(F), 0.f);
};

// The engine's order for one micro-batch: head chunks K-1..0, the layer, the embedding.
void feed(GradReduction& red, Accumulation& acc, const MicroGrads& g, bool tied) {
  red.begin_micro_batch(g.ids.data(), n_tokens);
  float* head_grad = tied ? acc.table.data() : acc.head.data();
  const int64_t chunks = (V + chunk_rows - 1) / chunk_rows;
  for (int64_t k = chunks - 1; k >= 0; --k) {
    const int64_t v0 = k * chunk_rows, rows = std::min(chunk_rows, V - v0);
    std::vector<float> staging(g.head.begin() + v0 * C, g.head.begin() + (v0 + rows) * C);
    red.add_head_rows(head_grad, staging.data(), v0, rows, C);
  }
  std::vector<float> staging = g.layer;
  red.add_dense(acc.layer.data(), staging.data(), size_t(F));
  red.add_embedding(acc.table.data(), g.dx0.data(), g.ids.data(), n_tokens, C);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("comm reduction: N ranks equal one process accumulating A x N micro-batches, bit for bit",
          "[comm][offload]") {
  auto dev = device_create(DeviceOptions{});
  for (bool tied : {true, false})
    for (int N : {2, 3})
      for (int A : {1, 2}) {
        CAPTURE(tied, N, A);
        std::mt19937 rng(uint32_t(100 * N + 10 * A + tied));
        std::vector<MicroGrads> micro;
        for (int m = 0; m < A * N; ++m) micro.push_back(make_micro(rng));

        NoGradReduction one;
        Accumulation ref;
        for (auto& g : micro) feed(one, ref, g, tied);

        Rendezvous rv(N);
        std::vector<Accumulation> acc(static_cast<size_t>(N));
        std::vector<std::thread> ranks;
        for (int r = 0; r < N; ++r)
          ranks.emplace_back([&, r] {
            ThreadComm comm(rv, r);
            CommGradReduction red(comm, tied, *dev);
            for (int j = 0; j < A; ++j) feed(red, acc[size_t(r)], micro[size_t(j * N + r)], tied);
          });
        for (auto& t : ranks) t.join();
        for (int r = 0; r < N; ++r) {
          CAPTURE(r);
          CHECK(same_bits(acc[size_t(r)].layer, ref.layer));
          CHECK(same_bits(acc[size_t(r)].table, ref.table));
          CHECK(same_bits(acc[size_t(r)].head, ref.head));
        }

        // The data can tell orders apart: "sum the round across ranks, then add it" differs.
        if (A > 1 || tied) {
          Accumulation naive;
          for (int j = 0; j < A; ++j) {
            std::vector<float> layer(size_t(F), 0.f), head(size_t(V * C), 0.f);
            for (int r = 0; r < N; ++r) {
              const MicroGrads& g = micro[size_t(j * N + r)];
              for (int64_t i = 0; i < F; ++i) layer[size_t(i)] += g.layer[size_t(i)];
              for (int64_t i = 0; i < V * C; ++i) head[size_t(i)] += g.head[size_t(i)];
            }
            for (int64_t i = 0; i < F; ++i) naive.layer[size_t(i)] += layer[size_t(i)];
            auto& h = tied ? naive.table : naive.head;
            for (int64_t i = 0; i < V * C; ++i) h[size_t(i)] += head[size_t(i)];
            for (int r = 0; r < N; ++r) {
              const MicroGrads& g = micro[size_t(j * N + r)];
              for (int64_t t = 0; t < n_tokens; ++t)
                for (int64_t c = 0; c < C; ++c) naive.table[size_t(g.ids[size_t(t)] * C + c)] += g.dx0[size_t(t * C + c)];
            }
          }
          CHECK_FALSE((same_bits(naive.layer, ref.layer) && same_bits(naive.table, ref.table)));
        }
      }
}

TEST_CASE("comm reduction: ranks whose micro-batches differ in token count are refused", "[comm][offload]") {
  auto dev = device_create(DeviceOptions{});
  Rendezvous rv(2);
  std::string error[2];
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      ThreadComm comm(rv, r);
      CommGradReduction red(comm, true, *dev);
      std::vector<int32_t> ids(size_t(r == 0 ? 4 : 6), 1);
      std::vector<float> table(size_t(V * C), 0.f), staging(size_t(V * C), 1.f);
      red.begin_micro_batch(ids.data(), int64_t(ids.size()));
      try {
        red.add_head_rows(table.data(), staging.data(), 0, V, C);
      } catch (const Error& e) {
        error[r] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) CHECK_THAT(error[r], Catch::Matchers::Contains("different token counts"));
}

}  // namespace strata
