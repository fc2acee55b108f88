#include "src/core/fault.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "src/core/error.h"

namespace strata {
namespace {

struct FaultRule {
  FaultKind kind = FaultKind::none;
  std::string io_kind;  // kind io: "eio", "short", ...
  std::string point;
  uint64_t n = 1;
  std::atomic<uint64_t> hits{0};
};

struct FaultTable {
  std::vector<std::unique_ptr<FaultRule>> rules;
  std::string error;  // a malformed value: reported (exit 2) at the first fault point
  std::string source;
};

bool io_kind_name(const std::string& k) {
  return k == "eio" || k == "enospc" || k == "efbig" || k == "einval" || k == "short";
}

// "<kind>@<point>[:<N>]"; the older STRATA_IO_FAULT "<kind>@<N>" is "<kind>@io:<N>".
bool parse_rule(const std::string& item, bool io_only, FaultRule* r) {
  const size_t at = item.find('@');
  if (at == std::string::npos || at == 0 || at + 1 >= item.size()) return false;
  const std::string kind = item.substr(0, at);
  std::string rest = item.substr(at + 1);
  if (io_only) rest = "io:" + rest;
  const size_t colon = rest.rfind(':');
  r->point = rest.substr(0, colon);
  if (colon != std::string::npos) {
    char* end = nullptr;
    const unsigned long long n = std::strtoull(rest.c_str() + colon + 1, &end, 10);
    if (colon + 1 >= rest.size() || !end || *end != '\0' || n < 1) return false;
    r->n = n;
  }
  if (r->point.empty()) return false;
  if (io_kind_name(kind)) {  // at `io`: the file engine's N-th request; elsewhere: that write fails
    r->kind = FaultKind::io;
    r->io_kind = kind;
    return !io_only || r->point == "io";
  }
  if (io_only) return false;
  r->kind = kind == "kill" ? FaultKind::kill : kind == "throw" ? FaultKind::throw_error
            : kind == "alloc" ? FaultKind::alloc : kind == "thread" ? FaultKind::thread : FaultKind::none;
  return r->kind != FaultKind::none && r->point != "io";
}

FaultTable* parse_env() {
  auto* t = new FaultTable;  // lives for the process: fault points may run in static destructors
  auto add = [&](const char* var, bool io_only) {
    const char* v = std::getenv(var);
    if (!v || !*v) return;
    std::string s = v;
    size_t start = 0;
    while (start <= s.size()) {
      const size_t comma = s.find(',', start);
      const std::string item = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      auto r = std::make_unique<FaultRule>();
      if (!parse_rule(item, io_only, r.get()) && t->error.empty())
        t->error = str_cat(var, "='", s, "': '", item, "' is not ",
                           io_only ? "<short|eio|enospc|efbig|einval>@<N> with N >= 1"
                                   : "<kill|throw|alloc|thread>@<point>[:N] or <eio|enospc|efbig|einval|short>@io[:N] "
                                     "(tests/faults/README.md lists the points)");
      else
        t->rules.push_back(std::move(r));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    t->source = var;
  };
  add("STRATA_FAULT", false);
  add("STRATA_IO_FAULT", true);
  return t;
}

std::atomic<FaultTable*> g_table{parse_env()};

bool any_set() {
  const char* a = std::getenv("STRATA_FAULT");
  const char* b = std::getenv("STRATA_IO_FAULT");
  return (a && *a) || (b && *b);
}

}  // namespace

namespace fault_detail {

bool armed = any_set();

FaultKind hit(const char* point) {
  FaultTable* t = g_table.load();
  STRATA_CHECK(t->error.empty(), t->error);
  for (auto& r : t->rules) {
    if (r->point != point || (r->kind == FaultKind::io && r->point == "io")) continue;
    if (r->hits.fetch_add(1) + 1 != r->n) continue;
    switch (r->kind) {
      case FaultKind::kill: {
        static const char msg[] = "strata: STRATA_FAULT: SIGKILL at ";
        (void)!::write(2, msg, sizeof msg - 1);
        (void)!::write(2, point, std::strlen(point));
        (void)!::write(2, "\n", 1);
        ::kill(::getpid(), SIGKILL);
        for (;;) ::pause();
      }
      case FaultKind::throw_error:
        throw std::runtime_error(str_cat("STRATA_FAULT: a task threw at ", point));
      default:
        return r->kind;
    }
  }
  return FaultKind::none;
}

}  // namespace fault_detail

bool fault_io_armed(std::string* kind, uint64_t* n) {
  if (!fault_detail::armed) return false;
  FaultTable* t = g_table.load();
  STRATA_CHECK(t->error.empty(), t->error);
  for (auto& r : t->rules) {
    if (r->kind != FaultKind::io || r->point != "io") continue;
    *kind = r->io_kind;
    *n = r->n;
    return true;
  }
  return false;
}

void fault_reload_for_tests() {
  g_table.store(parse_env());  // the old table is leaked on purpose: another thread may hold it
  fault_detail::armed = any_set();
}

}  // namespace strata
