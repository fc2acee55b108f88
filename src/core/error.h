// Errors in three tiers (STYLE §8):
//   STRATA_CHECK(cond, ...)      bad input or environment: throws strata::Error with a message
//                                that tells the user what to do; the CLI maps its kind to an
//                                exit code (input 2, memory budget 3, I/O 4).
//   STRATA_ASSERT(cond, ...)     our own invariants, on in release builds: aborts with file:line.
//   STRATA_DASSERT(cond)         debug-only, for hot loops.
// Message arguments are streamed: STRATA_CHECK(n > 0, "file ", path, " has no rows").
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace strata {

enum class ErrorKind { input = 2, budget = 3, io = 4 };

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& what) : std::runtime_error(what), kind_(kind) {}
  ErrorKind kind() const { return kind_; }
  int exit_code() const { return int(kind_); }

 private:
  ErrorKind kind_;
};

template <class... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

[[noreturn]] void assert_fail(const char* file, int line, const char* cond, const std::string& msg);

}  // namespace strata

#define STRATA_CHECK_KIND(kind, cond, ...)                                        \
  do {                                                                            \
    if (!(cond)) [[unlikely]]                                                     \
      throw ::strata::Error((kind), ::strata::str_cat(__VA_ARGS__));              \
  } while (0)

#define STRATA_CHECK(cond, ...) STRATA_CHECK_KIND(::strata::ErrorKind::input, cond, __VA_ARGS__)
#define STRATA_CHECK_IO(cond, ...) STRATA_CHECK_KIND(::strata::ErrorKind::io, cond, __VA_ARGS__)
#define STRATA_CHECK_BUDGET(cond, ...) \
  STRATA_CHECK_KIND(::strata::ErrorKind::budget, cond, __VA_ARGS__)

#define STRATA_ASSERT(cond, ...)                                                       \
  do {                                                                                 \
    if (!(cond)) [[unlikely]]                                                          \
      ::strata::assert_fail(__FILE__, __LINE__, #cond, ::strata::str_cat("" __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)

#ifdef NDEBUG
#define STRATA_DASSERT(cond) ((void)0)
#else
#define STRATA_DASSERT(cond) STRATA_ASSERT(cond)
#endif
