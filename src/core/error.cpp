#include "src/core/error.h"

#include <cstdio>
#include <cstdlib>

namespace strata {

void assert_fail(const char* file, int line, const char* cond, const std::string& msg) {
  std::fprintf(stderr, "strata: internal error at %s:%d: %s %s\n(this is a bug in strata; please report it)\n",
               file, line, cond, msg.c_str());
  std::abort();
}

}  // namespace strata
