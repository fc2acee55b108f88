// A compiled Unicode regular expression (PCRE2, UTF + UCP, JIT when available) used for the
// Split pre-tokenizer, the ByteLevel regex and Replace patterns. Hugging Face compiles these
// patterns with Oniguruma; PCRE2 understands the same syntax for the constructs tokenizers use
// (\p{L}, \p{N}, (?i:...), lookahead, \s), with Unicode semantics for \s, \w and \d.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace strata::tok {

class Regex {
 public:
  Regex() = default;
  // Throws strata::Error naming `what` (where the pattern came from) when it does not compile.
  Regex(const std::string& pattern, const std::string& what);
  // A regex matching `literal` exactly (for {"String": ...} patterns).
  static Regex literal(const std::string& literal, const std::string& what);

  // Non-overlapping matches in s[0, n) as [begin, end) byte ranges, left to right. Empty matches
  // are skipped. `s` must be valid UTF-8.
  void find_all(const char* s, size_t n, std::vector<std::pair<size_t, size_t>>* out) const;
  bool valid() const { return code_ != nullptr; }

 private:
  struct Code;
  std::shared_ptr<Code> code_;
};

}  // namespace strata::tok
