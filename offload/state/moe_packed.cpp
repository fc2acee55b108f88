// The packed-experts checkpoint layout (offload/state/moe_packed.h).
#include "offload/state/moe_packed.h"

#include <algorithm>
#include <set>

#include "src/core/error.h"

namespace strata {
namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// "model.layers.3.mlp.experts.7.up_proj.weight" -> prefix "model.layers.3.", expert 7, which 1.
struct ExpertName {
  std::string prefix;
  int64_t expert = -1;
  int which = -1;  // 0 gate, 1 up, 2 down
};
std::optional<ExpertName> parse_expert(const std::string& name) {
  for (const char* block : {"mlp.experts.", "block_sparse_moe.experts."}) {
    const size_t at = name.find(block);
    if (at == std::string::npos) continue;
    const size_t num = at + std::string(block).size();
    const size_t dot = name.find('.', num);
    if (dot == std::string::npos || dot == num) return std::nullopt;
    if (!std::all_of(name.begin() + std::ptrdiff_t(num), name.begin() + std::ptrdiff_t(dot), ::isdigit)) return std::nullopt;
    const std::string leaf = name.substr(dot + 1);
    const int which = leaf == "gate_proj.weight" || leaf == "w1.weight" ? 0
                      : leaf == "up_proj.weight" || leaf == "w3.weight" ? 1
                      : leaf == "down_proj.weight" || leaf == "w2.weight" ? 2 : -1;
    if (which < 0) return std::nullopt;
    return ExpertName{name.substr(0, at), std::stoll(name.substr(num, dot - num)), which};
  }
  return std::nullopt;
}

}  // namespace

std::optional<MoePackedSlice> moe_packed_slice(const SafetensorsDir& dir, const std::string& name) {
  if (dir.find(name)) return std::nullopt;
  if (ends_with(name, "block_sparse_moe.gate.weight")) {
    const std::string alias = name.substr(0, name.size() - std::string("block_sparse_moe.gate.weight").size()) +
                              "mlp.gate.weight";
    if (dir.find(alias)) return MoePackedSlice{alias, -1, 0, 0};
    return std::nullopt;
  }
  const std::optional<ExpertName> e = parse_expert(name);
  if (!e) return std::nullopt;
  const std::string tensor = e->prefix + (e->which == 2 ? "mlp.experts.down_proj" : "mlp.experts.gate_up_proj");
  const SafetensorsEntry* t = dir.find(tensor);
  if (!t || t->shape.size() != 3) return std::nullopt;
  STRATA_CHECK(e->expert < t->shape[0], dir.dir(), ": ", tensor, " packs ", t->shape[0], " experts; the config asks for expert ",
               e->expert, ": check num_experts in config.json");
  if (e->which == 2) return MoePackedSlice{tensor, e->expert, 0, t->shape[1]};
  STRATA_CHECK(t->shape[1] % 2 == 0, dir.dir(), ": ", tensor, " has an odd row count ", t->shape[1],
               " (gate and up rows stacked): the file is not transformers' packed layout");
  const int64_t inter = t->shape[1] / 2;
  return MoePackedSlice{tensor, e->expert, e->which == 0 ? 0 : inter, inter};
}

std::vector<ExpectedTensor> moe_packed_expected(const SafetensorsDir& dir, const std::vector<ExpectedTensor>& expected) {
  std::vector<ExpectedTensor> out;
  std::set<std::string> packed;
  for (const ExpectedTensor& t : expected) {
    const std::optional<MoePackedSlice> s = moe_packed_slice(dir, t.name);
    if (!s) {
      out.push_back(t);
      continue;
    }
    if (!packed.insert(s->tensor).second) continue;
    const SafetensorsEntry* e = dir.find(s->tensor);
    out.push_back({s->tensor, s->expert < 0 ? t.shape : e->shape});
  }
  return out;
}

void moe_packed_read(const SafetensorsDir& dir, const MoePackedSlice& s, std::vector<float>& packed,
                     std::string& packed_name, float* dst) {
  const SafetensorsEntry* e = dir.find(s.tensor);
  STRATA_ASSERT(e != nullptr, "packed tensor ", s.tensor, " vanished");
  int64_t numel = 1;
  for (int64_t d : e->shape) numel *= d;
  if (s.expert < 0) {
    dir.read(s.tensor, DType::f32, dst);
    return;
  }
  if (packed_name != s.tensor) {
    packed.resize(size_t(numel));
    dir.read(s.tensor, DType::f32, packed.data());
    dir.release(s.tensor);
    packed_name = s.tensor;
  }
  const int64_t rows_per_expert = e->shape[1], row_len = e->shape[2];
  const float* src = packed.data() + (s.expert * rows_per_expert + s.row0) * row_len;
  std::copy(src, src + s.rows * row_len, dst);
}

}  // namespace strata
