// Python str/dict methods callable from templates (`s.strip()`, `d.items()`, ...) and the global
// functions of transformers' chat-template environment.
#include <chrono>
#include <map>

#include "io/jinja/builtins.h"
#include "src/core/error.h"

namespace strata::jinja {

namespace {

using Method = std::function<Value(const Value& self, const CallArgs& args)>;

const std::string& str_arg(const CallArgs& a, size_t pos, const char* name, const char* method) {
  const Value* v = a.get(pos, name);
  if (!v || !v->is_string())
    throw RuntimeError(str_cat(method, "() argument '", name, "' must be a string, not ", v ? value_type_name(*v) : "missing"));
  return v->as_string();
}

int64_t int_arg(const CallArgs& a, size_t pos, const char* name, int64_t dflt) {
  const Value* v = a.get(pos, name);
  if (!v || v->is_none()) return dflt;
  if (v->is_int()) return v->as_int();
  if (v->is_bool()) return v->as_bool();
  throw RuntimeError(str_cat("argument '", name, "' must be an integer, not ", value_type_name(*v)));
}

List split_whitespace(const std::u32string& u, int64_t maxsplit) {
  List out;
  size_t i = 0, n = u.size();
  while (true) {
    while (i < n && py_isspace(u[i])) ++i;
    if (i >= n) break;
    if (maxsplit >= 0 && int64_t(out.size()) >= maxsplit) {
      out.emplace_back(utf8_encode(u.substr(i)));
      break;
    }
    size_t j = i;
    while (j < n && !py_isspace(u[j])) ++j;
    out.emplace_back(utf8_encode(u.substr(i, j - i)));
    i = j;
  }
  return out;
}

Value str_split(const Value& self, const CallArgs& a, bool from_right) {
  const std::string& s = self.as_string();
  const Value* sepv = a.get(0, "sep");
  int64_t maxsplit = int_arg(a, 1, "maxsplit", -1);
  if (!sepv || sepv->is_none()) {
    if (from_right && maxsplit >= 0) throw RuntimeError("rsplit() on whitespace with maxsplit is not supported");
    return value_make_list(split_whitespace(utf8_decode(s), maxsplit));
  }
  if (!sepv->is_string()) throw RuntimeError("split() separator must be a string or None");
  const std::string& sep = sepv->as_string();
  if (sep.empty()) throw RuntimeError("split(): empty separator");
  List out;
  if (!from_right) {
    size_t pos = 0;
    while (maxsplit < 0 || int64_t(out.size()) < maxsplit) {
      size_t hit = s.find(sep, pos);
      if (hit == std::string::npos) break;
      out.emplace_back(s.substr(pos, hit - pos));
      pos = hit + sep.size();
    }
    out.emplace_back(s.substr(pos));
  } else {
    size_t end = s.size();
    List rev;
    while (maxsplit < 0 || int64_t(rev.size()) < maxsplit) {
      if (end < sep.size()) break;
      size_t hit = s.rfind(sep, end - sep.size());
      if (hit == std::string::npos) break;
      rev.emplace_back(s.substr(hit + sep.size(), end - hit - sep.size()));
      end = hit;
    }
    rev.emplace_back(s.substr(0, end));
    out.assign(rev.rbegin(), rev.rend());
  }
  return value_make_list(std::move(out));
}

bool affix_match(const Value& self, const CallArgs& a, bool prefix) {
  const std::string& s = self.as_string();
  const Value* p = a.get(0, prefix ? "prefix" : "suffix");
  if (!p) throw RuntimeError(str_cat(prefix ? "startswith" : "endswith", "() takes at least 1 argument"));
  std::vector<Value> options = p->is_list() ? *p->as_list() : std::vector<Value>{*p};
  for (const Value& o : options) {
    if (!o.is_string()) throw RuntimeError("startswith/endswith argument must be a string or a tuple of strings");
    const std::string& t = o.as_string();
    if (t.size() > s.size()) continue;
    if (prefix ? s.compare(0, t.size(), t) == 0 : s.compare(s.size() - t.size(), t.size(), t) == 0) return true;
  }
  return false;
}

bool is_cased(char32_t c) {
  std::string one = utf8_encode(std::u32string(1, c));
  return py_upper(one) != one || py_lower(one) != one;
}

std::string py_title(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  for (char32_t c : utf8_decode(s)) {
    std::string one = utf8_encode(std::u32string(1, c));
    if (is_cased(c)) {
      out += prev_cased ? py_lower(one) : py_upper(one);
      prev_cased = true;
    } else {
      out += one;
      prev_cased = false;
    }
  }
  return out;
}

// str.format with {} / {0} / {name} fields and {{ }} escapes (no format specs).
std::string py_format(const std::string& f, const CallArgs& a) {
  std::string out;
  size_t auto_idx = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    char c = f[i];
    if (c == '{' && i + 1 < f.size() && f[i + 1] == '{') {
      out += '{';
      ++i;
    } else if (c == '}' && i + 1 < f.size() && f[i + 1] == '}') {
      out += '}';
      ++i;
    } else if (c == '{') {
      size_t close = f.find('}', i);
      if (close == std::string::npos) throw RuntimeError("format(): single '{' encountered in format string");
      std::string field = f.substr(i + 1, close - i - 1);
      if (field.find(':') != std::string::npos || field.find('!') != std::string::npos)
        throw RuntimeError("format(): format specs and conversions are not supported");
      const Value* v = nullptr;
      if (field.empty()) {
        v = auto_idx < a.args.size() ? &a.args[auto_idx] : nullptr;
        ++auto_idx;
      } else if (std::isdigit(static_cast<unsigned char>(field[0]))) {
        size_t k = size_t(std::stoul(field));
        v = k < a.args.size() ? &a.args[k] : nullptr;
      } else {
        for (const auto& [name, val] : a.kwargs)
          if (name == field) v = &val;
      }
      if (!v) throw RuntimeError(str_cat("format(): no argument for field {", field, "}"));
      out += value_str(*v);
      i = close;
    } else {
      out += c;
    }
  }
  return out;
}

template <class Pred>
bool all_chars(const std::string& s, Pred p) {
  std::u32string u = utf8_decode(s);
  if (u.empty()) return false;
  for (char32_t c : u)
    if (!p(c)) return false;
  return true;
}

const std::map<std::string, Method>& str_methods() {
  static const std::map<std::string, Method> m = {
      {"capitalize", [](const Value& s, const CallArgs&) {
         std::u32string u = utf8_decode(s.as_string());
         if (u.empty()) return s;
         return Value(py_upper(utf8_encode(u.substr(0, 1))) + py_lower(utf8_encode(u.substr(1))));
       }},
      {"count", [](const Value& s, const CallArgs& a) {
         const std::string& sub = str_arg(a, 0, "sub", "count");
         if (sub.empty()) return Value(int64_t(utf8_length(s.as_string()) + 1));
         int64_t n = 0;
         for (size_t p = s.as_string().find(sub); p != std::string::npos; p = s.as_string().find(sub, p + sub.size())) ++n;
         return Value(n);
       }},
      {"endswith", [](const Value& s, const CallArgs& a) { return Value(affix_match(s, a, false)); }},
      {"find", [](const Value& s, const CallArgs& a) {
         size_t p = s.as_string().find(str_arg(a, 0, "sub", "find"));
         return Value(p == std::string::npos ? int64_t(-1) : int64_t(utf8_length(s.as_string().substr(0, p))));
       }},
      {"format", [](const Value& s, const CallArgs& a) { return Value(py_format(s.as_string(), a)); }},
      {"isalnum", [](const Value& s, const CallArgs&) { return Value(all_chars(s.as_string(), [](char32_t c) { return c < 0x80 && std::isalnum(int(c)); })); }},
      {"isalpha", [](const Value& s, const CallArgs&) { return Value(all_chars(s.as_string(), [](char32_t c) { return c < 0x80 && std::isalpha(int(c)); })); }},
      {"isdigit", [](const Value& s, const CallArgs&) { return Value(all_chars(s.as_string(), [](char32_t c) { return c >= '0' && c <= '9'; })); }},
      {"islower", [](const Value& s, const CallArgs&) { return Value(py_lower(s.as_string()) == s.as_string() && py_upper(s.as_string()) != s.as_string()); }},
      {"isspace", [](const Value& s, const CallArgs&) { return Value(all_chars(s.as_string(), py_isspace)); }},
      {"isupper", [](const Value& s, const CallArgs&) { return Value(py_upper(s.as_string()) == s.as_string() && py_lower(s.as_string()) != s.as_string()); }},
      {"join", [](const Value& s, const CallArgs& a) {
         const Value* it = a.get(0, "iterable");
         if (!it) throw RuntimeError("join() takes exactly one argument");
         std::string out;
         bool first = true;
         for (const Value& v : jinja_iterate(*it)) {
           if (!v.is_string()) throw RuntimeError(str_cat("join(): expected str instance, ", value_type_name(v), " found"));
           if (!first) out += s.as_string();
           first = false;
           out += v.as_string();
         }
         return Value(out);
       }},
      {"lower", [](const Value& s, const CallArgs&) { return Value(py_lower(s.as_string())); }},
      {"lstrip", [](const Value& s, const CallArgs& a) { return Value(py_strip(s.as_string(), a.get(0, "chars"), true, false)); }},
      {"replace", [](const Value& s, const CallArgs& a) {
         CallArgs fa = a;
         return jinja_apply_filter("replace", s, fa);
       }},
      {"rfind", [](const Value& s, const CallArgs& a) {
         size_t p = s.as_string().rfind(str_arg(a, 0, "sub", "rfind"));
         return Value(p == std::string::npos ? int64_t(-1) : int64_t(utf8_length(s.as_string().substr(0, p))));
       }},
      {"rsplit", [](const Value& s, const CallArgs& a) { return str_split(s, a, true); }},
      {"rstrip", [](const Value& s, const CallArgs& a) { return Value(py_strip(s.as_string(), a.get(0, "chars"), false, true)); }},
      {"split", [](const Value& s, const CallArgs& a) { return str_split(s, a, false); }},
      {"splitlines", [](const Value& s, const CallArgs&) {
         List out;
         const std::string& str = s.as_string();
         size_t start = 0;
         for (size_t i = 0; i < str.size(); ++i) {
           if (str[i] == '\n' || str[i] == '\r') {
             out.emplace_back(str.substr(start, i - start));
             if (str[i] == '\r' && i + 1 < str.size() && str[i + 1] == '\n') ++i;
             start = i + 1;
           }
         }
         if (start < str.size()) out.emplace_back(str.substr(start));
         return value_make_list(std::move(out));
       }},
      {"startswith", [](const Value& s, const CallArgs& a) { return Value(affix_match(s, a, true)); }},
      {"strip", [](const Value& s, const CallArgs& a) { return Value(py_strip(s.as_string(), a.get(0, "chars"), true, true)); }},
      {"title", [](const Value& s, const CallArgs&) { return Value(py_title(s.as_string())); }},
      {"upper", [](const Value& s, const CallArgs&) { return Value(py_upper(s.as_string())); }},
  };
  return m;
}

const std::map<std::string, Method>& dict_methods() {
  static const std::map<std::string, Method> m = {
      {"get", [](const Value& d, const CallArgs& a) {
         const Value* k = a.get(0, "key");
         if (!k) throw RuntimeError("get() takes at least 1 argument");
         const Value* dflt = a.get(1, "default");
         const Value* v = k->is_string() ? d.as_dict()->find(k->as_string()) : nullptr;
         return v ? *v : dflt ? *dflt : Value(None{});
       }},
      {"items", [](const Value& d, const CallArgs&) {
         List out;
         for (const auto& [k, v] : d.as_dict()->items) out.push_back(value_make_list({Value(k), v}));
         return value_make_list(std::move(out));
       }},
      {"keys", [](const Value& d, const CallArgs&) { return value_make_list(jinja_iterate(d)); }},
      {"values", [](const Value& d, const CallArgs&) {
         List out;
         for (const auto& kv : d.as_dict()->items) out.push_back(kv.second);
         return value_make_list(std::move(out));
       }},
  };
  return m;
}

std::optional<Value> bind(const std::map<std::string, Method>& methods, const Value& self, const std::string& name) {
  auto it = methods.find(name);
  if (it == methods.end()) return std::nullopt;
  Method fn = it->second;
  return value_make_function([fn, self](CallArgs& a) { return fn(self, a); });
}

}  // namespace

std::optional<Value> jinja_lookup_method(const Value& obj, const std::string& name) {
  if (obj.is_string()) return bind(str_methods(), obj, name);
  if (obj.is_dict() && !obj.as_dict()->is_namespace) return bind(dict_methods(), obj, name);
  if (obj.is_list()) {
    static const char* mutating[] = {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse"};
    for (const char* m : mutating)
      if (name == m)
        return value_make_function([name](CallArgs&) -> Value {
          throw RuntimeError(str_cat("list.", name, "() is not allowed: the template environment is immutable"));
        });
  }
  return std::nullopt;
}

void jinja_add_globals(Dict& g, std::optional<std::tm> now) {
  g.set("range", value_make_function([](CallArgs& a) {
          if (a.args.empty() || a.args.size() > 3) throw RuntimeError("range() takes 1 to 3 integer arguments");
          auto num = [&](size_t i) {
            if (!a.args[i].is_int()) throw RuntimeError("range() arguments must be integers");
            return a.args[i].as_int();
          };
          int64_t start = a.args.size() == 1 ? 0 : num(0), stop = a.args.size() == 1 ? num(0) : num(1);
          int64_t step = a.args.size() == 3 ? num(2) : 1;
          if (step == 0) throw RuntimeError("range() step must not be zero");
          List out;
          for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
            out.emplace_back(i);
            if (out.size() > 10'000'000) throw RuntimeError("range() is too long");
          }
          return value_make_list(std::move(out));
        }));
  auto make_dict = [](CallArgs& a, bool ns) {
    auto d = std::make_shared<Dict>();
    d->is_namespace = ns;
    for (const Value& p : a.args) {
      if (!p.is_dict()) throw RuntimeError("namespace()/dict() positional argument must be a mapping");
      for (const auto& [k, v] : p.as_dict()->items) d->set(k, v);
    }
    for (const auto& [k, v] : a.kwargs) d->set(k, v);
    return Value(d);
  };
  g.set("namespace", value_make_function([make_dict](CallArgs& a) { return make_dict(a, true); }));
  g.set("dict", value_make_function([make_dict](CallArgs& a) { return make_dict(a, false); }));
  g.set("raise_exception", value_make_function([](CallArgs& a) -> Value {
          throw RuntimeError(str_cat("raise_exception: ", a.args.empty() ? std::string() : value_str(a.args[0])));
        }));
  g.set("strftime_now", value_make_function([now](CallArgs& a) {
          if (a.args.empty() || !a.args[0].is_string()) throw RuntimeError("strftime_now() takes a format string");
          std::tm tm{};
          if (now) {
            tm = *now;
          } else {
            std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
            localtime_r(&t, &tm);
          }
          char buf[512];
          size_t n = std::strftime(buf, sizeof buf, a.args[0].as_string().c_str(), &tm);
          return Value(std::string(buf, n));
        }));
}

}  // namespace strata::jinja
