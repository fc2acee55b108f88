// PCRE2 wrapper for the tokenizer's patterns (see regex.h).
#include "io/tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstdio>
#include <string_view>

#include "io/tokenizer/text.h"
#include "src/core/error.h"

namespace strata::tok {

struct Regex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

namespace {

// Per-thread match data and JIT stack: a pattern like \s+(?!\S) over a long whitespace run needs
// more than PCRE2's default 32 KiB JIT stack.
struct MatchScratch {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 16 * 1024 * 1024, nullptr);
  pcre2_match_context* ctx = pcre2_match_context_create(nullptr);
  MatchScratch() { pcre2_jit_stack_assign(ctx, nullptr, stack); }
  ~MatchScratch() {
    pcre2_match_context_free(ctx);
    pcre2_jit_stack_free(stack);
    pcre2_match_data_free(data);
  }
};

MatchScratch& match_scratch() {
  thread_local MatchScratch s;
  return s;
}

}  // namespace

Regex::Regex(const std::string& pattern, const std::string& what) {
  int err = 0;
  PCRE2_SIZE err_off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &err_off, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    STRATA_CHECK(false, what, ": regex ", pattern, " does not compile at offset ", err_off, ": ",
                 reinterpret_cast<const char*>(msg));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter when JIT is unavailable
  code_ = std::make_shared<Code>();
  code_->code = code;
}

Regex Regex::literal(const std::string& literal, const std::string& what) {
  std::string quoted;
  for (char c : literal) {
    if (std::string_view("\\^$.|?*+()[]{}/-#&~ \t\n\r").find(c) != std::string_view::npos) {
      // Escape metacharacters (and whitespace, harmless either way) as \x{..}.
      char buf[16];
      std::snprintf(buf, sizeof(buf), "\\x{%02x}", (unsigned char)c);
      quoted += buf;
    } else {
      quoted.push_back(c);
    }
  }
  return Regex(quoted, what);
}

void Regex::find_all(const char* s, size_t n, std::vector<std::pair<size_t, size_t>>* out) const {
  out->clear();
  MatchScratch& m = match_scratch();
  size_t pos = 0;
  while (pos <= n) {
    int rc = pcre2_match(code_->code, reinterpret_cast<PCRE2_SPTR>(s), n, pos, PCRE2_NO_UTF_CHECK, m.data, m.ctx);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    STRATA_CHECK(rc >= 0, "tokenizer regex failed with PCRE2 error ", rc, " on a ", n,
                 "-byte piece; report this input");
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(m.data);
    size_t b = ov[0], e = ov[1];
    if (e > b) {
      out->emplace_back(b, e);
      pos = e;
    } else {
      // Empty match: move one character on.
      if (b >= n) break;
      pos = b + utf8_char_len((unsigned char)s[b]);
    }
  }
}

}  // namespace strata::tok
