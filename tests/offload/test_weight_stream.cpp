// The weight slots every engine streams through (offload/stream/weight_stream.h): a block crosses the
// link only when its slot holds another one, what the compute stream reads is the block it asked
// for, an upload into a slot waits for the compute stream's release of what it held, and the
// views of a layer and of the lm_head chunks land on the store's tensors.
#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "models/dense_layer.h"
#include "offload/state/model_io.h"
#include "offload/stream/weight_stream.h"
#include "tests/testing.h"

namespace strata {
namespace {

// Three host blocks of awkward size with distinct bytes.
std::vector<std::vector<char>> host_blocks(size_t bytes) {
  std::vector<std::vector<char>> blocks(3, std::vector<char>(bytes));
  for (size_t b = 0; b < blocks.size(); ++b)
    for (size_t i = 0; i < bytes; ++i) blocks[b][i] = char((b * 31 + i * 7 + i / 251) & 0x7f);
  return blocks;
}

}  // namespace

TEST_CASE("a streamed block crosses the link only when its slot holds another", "[engine]") {
  auto dev = device_create(DeviceOptions{});
  const size_t bytes = 4096 * 3 + 17;
  const auto host = host_blocks(bytes);
  std::vector<char*> slots = {static_cast<char*>(dev->alloc(bytes, "slot 0")), static_cast<char*>(dev->alloc(bytes, "slot 1"))};
  WeightStream stream(*dev, slots);
  int uploads = 0;
  // Acquires block b, reads its slot back on the compute stream, releases it; returns the link bytes.
  auto use = [&](size_t b) {
    const size_t h2d0 = dev->counters().h2d_bytes;
    const char* slot = stream.acquire(b, {host[b].data(), bytes}, [&] { ++uploads; });
    CHECK(slot == slots[stream.slot_of(b)]);
    std::vector<char> back(bytes);
    dev->copy_d2h(back.data(), slot, bytes, Stream::compute);
    stream.release(b);
    dev->stream_synchronize(Stream::compute);
    CHECK(back == host[b]);
    return dev->counters().h2d_bytes - h2d0;
  };
  CHECK(use(0) == bytes);  // into slot 0
  CHECK(use(1) == bytes);  // into slot 1
  CHECK(use(0) == 0);      // still there
  CHECK(use(1) == 0);
  CHECK(use(2) == bytes);  // replaces block 0 in slot 0
  CHECK(use(1) == 0);
  CHECK(use(0) == bytes);  // back into slot 0
  CHECK(uploads == 4);
  stream.invalidate();     // an update changed the host copies
  CHECK(use(1) == bytes);
  CHECK(uploads == 5);
  dev->synchronize();
  for (char* s : slots) dev->free(s);
}

TEST_CASE("an upload into a slot waits for the compute stream's release of the block it held", "[engine]") {
  auto dev = device_create(DeviceOptions{});
  const size_t bytes = 1 << 16;
  const auto host = host_blocks(bytes);
  std::vector<char*> slots = {static_cast<char*>(dev->alloc(bytes, "slot 0")), static_cast<char*>(dev->alloc(bytes, "slot 1"))};
  const size_t busy_bytes = 64 << 20;
  void* busy = dev->alloc(busy_bytes, "busy work");
  WeightStream stream(*dev, slots);
  std::vector<char> first(bytes), second(bytes);
  const char* slot = stream.acquire(0, {host[0].data(), bytes});
  // The compute stream is kept busy before it reads block 0, so an upload of block 2 into the same
  // slot that did not wait for the release would overwrite block 0 before it is read.
  for (int k = 0; k < 8; ++k) dev->memset_zero(busy, busy_bytes, Stream::compute);
  dev->copy_d2h(first.data(), slot, bytes, Stream::compute);
  stream.release(0);
  REQUIRE(stream.slot_of(2) == stream.slot_of(0));
  const char* again = stream.acquire(2, {host[2].data(), bytes});
  CHECK(again == slot);
  dev->copy_d2h(second.data(), again, bytes, Stream::compute);
  stream.release(2);
  dev->synchronize();
  CHECK(first == host[0]);
  CHECK(second == host[2]);
  dev->free(busy);
  for (char* s : slots) dev->free(s);
}

TEST_CASE("a resident block is uploaded once until invalidated", "[engine]") {
  auto dev = device_create(DeviceOptions{});
  const size_t bytes = 999;
  const auto host = host_blocks(bytes);
  char* dst = static_cast<char*>(dev->alloc(bytes, "resident"));
  ResidentBlock block(*dev, dst);
  int uploads = 0;
  for (int k = 0; k < 3; ++k) CHECK(block.acquire({host[0].data(), bytes}, [&] { ++uploads; }) == dst);
  CHECK(uploads == 1);
  block.invalidate();
  block.acquire({host[1].data(), bytes}, [&] { ++uploads; });
  CHECK(uploads == 2);
  std::vector<char> back(bytes);
  dev->copy_d2h(back.data(), dst, bytes, Stream::compute);
  dev->stream_synchronize(Stream::compute);
  CHECK(back == host[1]);
  dev->free(dst);
}

TEST_CASE("layer views and lm_head chunks land on the store's tensors", "[engine]") {
  auto dev = device_create(DeviceOptions{});
  const bool tied = GENERATE(false, true);
  HostStore store(*dev, model_spec_build(testing::tiny_llama_config({64, 96, 3, 97, 256, tied}), DType::bf16));
  const ModelSpec& spec = store.spec();
  for (size_t l = 0; l < spec.layers.size(); ++l) {
    const ParamGroup& g = store.layer_group(l);
    const HostBlock block = layer_host_block(store, l);
    CHECK(block.src == store.working() + g.working_offset);
    CHECK(block.bytes == g.working_bytes);
    const LayerWeights w = dense_layer_weights(layer_weights_in(store, block.src, l));
    const LayerParamRows r = dense_layer_rows(spec.layers[l]);
    CHECK(w.q == store.working_of(size_t(r.q)));
    CHECK(w.down == store.working_of(size_t(r.down)));
    CHECK(w.input_norm == store.working_of(size_t(r.input_norm)));
    CHECK(w.q_bias == nullptr);  // llama has none
    LayerGrads gr = dense_layer_grads(layer_grads_in(store, reinterpret_cast<char*>(store.grad()) + g.f32_offset, l));
    CHECK(gr.k == store.grad_of(size_t(r.k)));
    CHECK(gr.post_norm == store.grad_of(size_t(r.post_norm)));
  }
  // chunks of 40 rows tile the (97, 64) lm_head: 40, 40, 17
  const HostBlock lm = tensor_host_block(store, spec.lm_head_row());
  const size_t row_bytes = 64 * 2;
  CHECK(lm.bytes == 97 * row_bytes);
  const char* next = lm.src;
  for (size_t k = 0; k < 3; ++k) {
    const HostBlock c = lm_head_chunk_block(store, k, 40);
    CHECK(c.src == next);
    CHECK(c.bytes == (k < 2 ? 40 : 17) * row_bytes);
    next += c.bytes;
  }
  CHECK(next == lm.src + lm.bytes);
}

}  // namespace strata
