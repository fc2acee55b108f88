// Jinja attribute/item access, slicing, iteration, ordering and membership, plus the
// Python-compatible string helpers (whitespace, strip, case mapping) the filters and methods use.
#include <algorithm>

#include "io/jinja/builtins.h"
#include "src/core/error.h"

#ifdef STRATA_HAVE_UTF8PROC
#include <utf8proc.h>
#endif

namespace strata::jinja {

static std::string undefined_message(const Undefined& u) {
  return u.hint.empty() ? std::string("value is undefined") : u.hint + " is undefined";
}

Value jinja_get_attribute(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) throw RuntimeError(undefined_message(std::get<Undefined>(obj.v)));
  if (auto m = jinja_lookup_method(obj, name)) return *m;
  if (obj.is_dict()) {
    if (const Value* v = obj.as_dict()->find(name)) return *v;
    return Undefined{str_cat("'", value_type_name(obj), " object' has no attribute '", name, "', so it")};
  }
  return Undefined{str_cat("'", value_type_name(obj), " object' has no attribute '", name, "', so it")};
}

static bool normalize_index(int64_t& i, size_t n) {
  if (i < 0) i += int64_t(n);
  return i >= 0 && i < int64_t(n);
}

Value jinja_get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) throw RuntimeError(undefined_message(std::get<Undefined>(obj.v)));
  if (obj.is_dict()) {
    if (key.is_string()) {
      if (const Value* v = obj.as_dict()->find(key.as_string())) return *v;
      if (auto m = jinja_lookup_method(obj, key.as_string())) return *m;
      return Undefined{str_cat("'dict object' has no attribute '", key.as_string(), "', so it")};
    }
    return Undefined{str_cat("'dict object' has no key ", value_repr(key), ", so it")};
  }
  if (key.is_int() || key.is_bool()) {
    int64_t i = key.is_bool() ? int64_t(key.as_bool()) : key.as_int();
    if (obj.is_list()) {
      const List& l = *obj.as_list();
      if (normalize_index(i, l.size())) return l[size_t(i)];
      return Undefined{str_cat("list index ", i, " (out of range) ")};
    }
    if (obj.is_string()) {
      std::u32string u = utf8_decode(obj.as_string());
      if (normalize_index(i, u.size())) return Value(utf8_encode(std::u32string(1, u[size_t(i)])));
      return Undefined{str_cat("string index ", i, " (out of range) ")};
    }
  }
  if (key.is_string()) return jinja_get_attribute(obj, key.as_string());
  return Undefined{str_cat("'", value_type_name(obj), " object' has no item ", value_repr(key), ", so it")};
}

static int64_t slice_bound(const Value* v, const char* what) {
  if (v->is_int()) return v->as_int();
  if (v->is_bool()) return v->as_bool();
  throw RuntimeError(str_cat("slice ", what, " must be an integer or none, not ", value_type_name(*v)));
}

// Python's PySlice_AdjustIndices: the selected positions of a sequence of length n.
static std::vector<size_t> slice_positions(size_t n, const Value* start, const Value* stop, const Value* step) {
  int64_t st = 1;
  if (step && !step->is_none()) st = slice_bound(step, "step");
  if (st == 0) throw RuntimeError("slice step cannot be zero");
  int64_t len = int64_t(n);
  int64_t lo, hi;
  if (st > 0) {
    lo = 0;
    hi = len;
  } else {
    lo = len - 1;
    hi = -1;
  }
  auto adjust = [&](const Value* v, int64_t dflt) {
    if (!v || v->is_none()) return dflt;
    int64_t x = slice_bound(v, "bound");
    if (x < 0) {
      x += len;
      if (x < 0) x = st < 0 ? -1 : 0;
    } else if (x >= len) {
      x = st < 0 ? len - 1 : len;
    }
    return x;
  };
  int64_t a = adjust(start, lo), b = adjust(stop, hi);
  std::vector<size_t> pos;
  if (st > 0)
    for (int64_t i = a; i < b; i += st) pos.push_back(size_t(i));
  else
    for (int64_t i = a; i > b; i += st) pos.push_back(size_t(i));
  return pos;
}

Value jinja_slice(const Value& obj, const Value* start, const Value* stop, const Value* step) {
  if (obj.is_list()) {
    const List& l = *obj.as_list();
    List out;
    for (size_t p : slice_positions(l.size(), start, stop, step)) out.push_back(l[p]);
    return value_make_list(std::move(out));
  }
  if (obj.is_string()) {
    std::u32string u = utf8_decode(obj.as_string());
    std::u32string out;
    for (size_t p : slice_positions(u.size(), start, stop, step)) out += u[p];
    return Value(utf8_encode(out));
  }
  if (obj.is_undefined()) throw RuntimeError(undefined_message(std::get<Undefined>(obj.v)));
  throw RuntimeError(str_cat("cannot slice a value of type ", value_type_name(obj)));
}

std::vector<Value> jinja_iterate(const Value& x) {
  if (x.is_list()) return *x.as_list();
  if (x.is_dict()) {
    std::vector<Value> keys;
    for (const auto& kv : x.as_dict()->items) keys.emplace_back(kv.first);
    return keys;
  }
  if (x.is_string()) {
    std::vector<Value> chars;
    for (char32_t c : utf8_decode(x.as_string())) chars.emplace_back(utf8_encode(std::u32string(1, c)));
    return chars;
  }
  if (x.is_undefined()) return {};
  throw RuntimeError(str_cat("'", value_type_name(x), "' object is not iterable"));
}

bool jinja_less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    auto d = [](const Value& x) { return x.is_bool() ? double(x.as_bool()) : x.is_int() ? double(x.as_int()) : x.as_float(); };
    if (a.is_float() || b.is_float()) return d(a) < d(b);
    int64_t x = a.is_bool() ? a.as_bool() : a.as_int(), y = b.is_bool() ? b.as_bool() : b.as_int();
    return x < y;
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();  // UTF-8 order = code point order
  if (a.is_list() && b.is_list()) {
    const List &x = *a.as_list(), &y = *b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (jinja_less(x[i], y[i])) return true;
      if (jinja_less(y[i], x[i])) return false;
    }
    return x.size() < y.size();
  }
  throw RuntimeError(
      str_cat("'<' not supported between instances of '", value_type_name(a), "' and '", value_type_name(b), "'"));
}

bool jinja_contains(const Value& container, const Value& item) {
  if (container.is_string()) {
    if (!item.is_string())
      throw RuntimeError(str_cat("'in <string>' requires string as left operand, not ", value_type_name(item)));
    return container.as_string().find(item.as_string()) != std::string::npos;
  }
  if (container.is_list()) {
    for (const Value& v : *container.as_list())
      if (value_equal(v, item)) return true;
    return false;
  }
  if (container.is_dict()) return item.is_string() && container.as_dict()->find(item.as_string()) != nullptr;
  if (container.is_undefined()) return false;
  throw RuntimeError(str_cat("argument of type '", value_type_name(container), "' is not iterable"));
}

bool py_isspace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

std::string py_strip(const std::string& s, const Value* chars, bool left, bool right) {
  std::u32string u = utf8_decode(s);
  std::u32string set;
  bool ws = !chars || chars->is_none() || chars->is_undefined();
  if (!ws) {
    if (!chars->is_string()) throw RuntimeError("strip arg must be None or str");
    set = utf8_decode(chars->as_string());
  }
  auto strip_it = [&](char32_t c) { return ws ? py_isspace(c) : set.find(c) != std::u32string::npos; };
  size_t a = 0, b = u.size();
  if (left)
    while (a < b && strip_it(u[a])) ++a;
  if (right)
    while (b > a && strip_it(u[b - 1])) --b;
  return utf8_encode(u.substr(a, b - a));
}

static std::string map_case(const std::string& s, bool upper) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : utf8_decode(s)) {
#ifdef STRATA_HAVE_UTF8PROC
    c = char32_t(upper ? utf8proc_toupper(utf8proc_int32_t(c)) : utf8proc_tolower(utf8proc_int32_t(c)));
#else
    if (upper && c >= 'a' && c <= 'z') c -= 32;
    if (!upper && c >= 'A' && c <= 'Z') c += 32;
#endif
    utf8_append(out, c);
  }
  return out;
}

std::string py_upper(const std::string& s) { return map_case(s, true); }
std::string py_lower(const std::string& s) { return map_case(s, false); }

}  // namespace strata::jinja
