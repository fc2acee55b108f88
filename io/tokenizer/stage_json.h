// What the four tokenizer.json stage readers (normalizer, pre_tokenizer, post_processor, decoder)
// share: a stage's "type", the Sequence stage that holds other stages of its kind, and the error
// for a type strata does not read.
#pragma once
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "io/json.h"
#include "src/core/error.h"

namespace strata::tok {

// The "type" of a stage object (j not null: a null stage is no stage of this kind).
inline std::string stage_type_from_json(const nlohmann::json& j, const char* stage) {
  STRATA_CHECK(j.is_object() && j.contains("type"), "tokenizer.json: a ", stage, " has no \"type\"");
  return j["type"].get<std::string>();
}

// A Sequence stage: its parts, applied in order by the derived class's stage method.
template <class Stage>
class StageSequence : public Stage {
 public:
  explicit StageSequence(std::vector<std::unique_ptr<Stage>> parts) : parts_(std::move(parts)) {}

 protected:
  const std::vector<std::unique_ptr<Stage>>& parts() const { return parts_; }

 private:
  std::vector<std::unique_ptr<Stage>> parts_;
};

// A Seq (a StageSequence<Stage>) of the stages listed in `list`, each read by from_json; stages
// that read as none (null) are left out.
template <class Seq, class Stage>
std::unique_ptr<Stage> stage_sequence_from_json(const nlohmann::json& list,
                                                std::unique_ptr<Stage> (*from_json)(const nlohmann::json&)) {
  std::vector<std::unique_ptr<Stage>> parts;
  for (const auto& p : list)
    if (auto s = from_json(p)) parts.push_back(std::move(s));
  return std::make_unique<Seq>(std::move(parts));
}

// The error for a stage type strata does not read, naming those it does.
[[noreturn]] inline void stage_type_unsupported(const char* stage, const std::string& type, const char* supported) {
  STRATA_CHECK(false, "tokenizer.json: ", stage, " type \"", type, "\" is not supported (supported: ", supported,
               ")");
  std::abort();  // not reached: the check throws
}

}  // namespace strata::tok
