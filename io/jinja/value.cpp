// Python semantics for Jinja values: truthiness, equality, str/repr, json.dumps, UTF-8 helpers.
#include "io/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "io/json.h"
#include "src/core/error.h"

namespace strata::jinja {

const Value* Dict::find(const std::string& key) const {
  auto it = index.find(key);
  return it == index.end() ? nullptr : &items[it->second].second;
}

void Dict::set(const std::string& key, Value value) {
  auto it = index.find(key);
  if (it != index.end()) {
    items[it->second].second = std::move(value);
    return;
  }
  index.emplace(key, items.size());
  items.emplace_back(key, std::move(value));
}

const Value* CallArgs::get(size_t pos, const std::string& name) const {
  if (pos < args.size()) return &args[pos];
  for (const auto& [k, v] : kwargs)
    if (k == name) return &v;
  return nullptr;
}

Value value_make_list(List items) { return Value(std::make_shared<List>(std::move(items))); }
Value value_make_dict() { return Value(std::make_shared<Dict>()); }
Value value_make_function(Function fn) { return Value(std::make_shared<Function>(std::move(fn))); }

template <class J>
static Value from_json_impl(const J& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return Value(None{});
    case nlohmann::json::value_t::boolean: return Value(j.template get<bool>());
    case nlohmann::json::value_t::number_integer: return Value(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      uint64_t u = j.template get<uint64_t>();
      STRATA_CHECK(u <= uint64_t(INT64_MAX), "integer ", u, " in chat template input exceeds int64");
      return Value(int64_t(u));
    }
    case nlohmann::json::value_t::number_float: return Value(j.template get<double>());
    case nlohmann::json::value_t::string: return Value(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      List items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json_impl(e));
      return value_make_list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      auto d = std::make_shared<Dict>();
      for (auto it = j.begin(); it != j.end(); ++it) d->set(it.key(), from_json_impl(it.value()));
      return Value(d);
    }
    default: STRATA_CHECK(false, "chat template input holds a JSON value of unsupported type (binary?)");
  }
  return Value();
}

Value value_from_json(const nlohmann::ordered_json& j) { return from_json_impl(j); }
Value value_from_json(const nlohmann::json& j) { return from_json_impl(j); }

bool value_truthy(const Value& x) {
  return std::visit(
      [](const auto& a) -> bool {
        using T = std::decay_t<decltype(a)>;
        if constexpr (std::is_same_v<T, Undefined> || std::is_same_v<T, None>) return false;
        else if constexpr (std::is_same_v<T, bool>) return a;
        else if constexpr (std::is_same_v<T, int64_t>) return a != 0;
        else if constexpr (std::is_same_v<T, double>) return a != 0.0;
        else if constexpr (std::is_same_v<T, std::string>) return !a.empty();
        else if constexpr (std::is_same_v<T, ListPtr>) return !a->empty();
        else if constexpr (std::is_same_v<T, DictPtr>) return a->size() > 0;
        else return true;
      },
      x.v);
}

static double as_double(const Value& x) {
  if (x.is_bool()) return x.as_bool() ? 1.0 : 0.0;
  if (x.is_int()) return double(x.as_int());
  return x.as_float();
}

bool value_equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return as_double(a) == as_double(b);
    int64_t x = a.is_bool() ? int64_t(a.as_bool()) : a.as_int();
    int64_t y = b.is_bool() ? int64_t(b.as_bool()) : b.as_int();
    return x == y;
  }
  if (a.v.index() != b.v.index()) return false;
  if (a.is_undefined() || a.is_none()) return true;
  if (a.is_string()) return a.as_string() == b.as_string();
  if (a.is_list()) {
    const List &x = *a.as_list(), &y = *b.as_list();
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i)
      if (!value_equal(x[i], y[i])) return false;
    return true;
  }
  if (a.is_dict()) {
    const Dict &x = *a.as_dict(), &y = *b.as_dict();
    if (x.size() != y.size()) return false;
    for (const auto& [k, v] : x.items) {
      const Value* w = y.find(k);
      if (!w || !value_equal(v, *w)) return false;
    }
    return true;
  }
  return a.as_callable() == b.as_callable();
}

std::string value_type_name(const Value& x) {
  static const char* names[] = {"undefined", "NoneType", "bool", "int", "float", "str", "list", "dict", "function"};
  if (x.is_dict() && x.as_dict()->is_namespace) return "Namespace";
  return names[x.v.index()];
}

std::string value_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // [-]d[.ddd]e(+|-)XX
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  size_t epos = sci.find('e');
  int exp = std::stoi(sci.substr(epos + 1));
  std::string digits;
  for (size_t i = 0; i < epos; ++i)
    if (sci[i] != '.') digits += sci[i];
  int decpt = exp + 1;  // value = 0.DIGITS * 10^decpt
  std::string out = neg ? "-" : "";
  if (decpt <= -4 || decpt > 16) {
    out += digits[0];
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += eb;
  } else if (decpt <= 0) {
    out += "0." + std::string(size_t(-decpt), '0') + digits;
  } else if (size_t(decpt) >= digits.size()) {
    out += digits + std::string(size_t(decpt) - digits.size(), '0') + ".0";
  } else {
    out += digits.substr(0, size_t(decpt)) + "." + digits.substr(size_t(decpt));
  }
  return out;
}

static std::string python_string_repr(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  char q = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c == (unsigned char)q) out += std::string("\\") + q;
    else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else out += char(c);
  }
  out += q;
  return out;
}

std::string value_repr(const Value& x) {
  if (x.is_string()) return python_string_repr(x.as_string());
  if (x.is_list()) {
    std::string out = "[";
    const List& l = *x.as_list();
    for (size_t i = 0; i < l.size(); ++i) out += (i ? ", " : "") + value_repr(l[i]);
    return out + "]";
  }
  if (x.is_dict()) {
    const Dict& d = *x.as_dict();
    std::string out = d.is_namespace ? "<Namespace {" : "{";
    for (size_t i = 0; i < d.items.size(); ++i)
      out += (i ? ", " : "") + python_string_repr(d.items[i].first) + ": " + value_repr(d.items[i].second);
    return out + (d.is_namespace ? "}>" : "}");
  }
  if (x.is_undefined()) return "Undefined";
  return value_str(x);
}

std::string value_str(const Value& x) {
  if (x.is_undefined()) return "";
  if (x.is_none()) return "None";
  if (x.is_bool()) return x.as_bool() ? "True" : "False";
  if (x.is_int()) return std::to_string(x.as_int());
  if (x.is_float()) return value_float_repr(x.as_float());
  if (x.is_string()) return x.as_string();
  if (x.is_callable()) return "<function>";
  return value_repr(x);
}

static void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          out += b;
        } else out += char(c);
    }
  }
  out += '"';
}

static void json_dump(std::string& out, const Value& x, const JsonOptions& opt, int depth) {
  const std::string& item_sep = opt.item_sep;
  const std::string& key_sep = opt.key_sep;
  auto newline = [&](int d) {
    out += '\n';
    out.append(size_t(opt.indent) * size_t(d), ' ');
  };
  if (x.is_none()) out += "null";
  else if (x.is_bool()) out += x.as_bool() ? "true" : "false";
  else if (x.is_int()) out += std::to_string(x.as_int());
  else if (x.is_float()) {
    double d = x.as_float();
    if (std::isnan(d)) out += "NaN";
    else if (std::isinf(d)) out += d > 0 ? "Infinity" : "-Infinity";
    else out += value_float_repr(d);
  } else if (x.is_string()) json_string(out, x.as_string());
  else if (x.is_list()) {
    const List& l = *x.as_list();
    if (l.empty()) {
      out += "[]";
      return;
    }
    out += '[';
    for (size_t i = 0; i < l.size(); ++i) {
      if (i) out += item_sep;
      if (opt.indent >= 0) newline(depth + 1);
      json_dump(out, l[i], opt, depth + 1);
    }
    if (opt.indent >= 0) newline(depth);
    out += ']';
  } else if (x.is_dict()) {
    const Dict& d = *x.as_dict();
    if (d.size() == 0) {
      out += "{}";
      return;
    }
    std::vector<const std::pair<std::string, Value>*> items;
    for (const auto& kv : d.items) items.push_back(&kv);
    if (opt.sort_keys)
      std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
    out += '{';
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += item_sep;
      if (opt.indent >= 0) newline(depth + 1);
      json_string(out, items[i]->first);
      out += key_sep;
      json_dump(out, items[i]->second, opt, depth + 1);
    }
    if (opt.indent >= 0) newline(depth);
    out += '}';
  } else {
    STRATA_CHECK(false, "tojson: object of type ", value_type_name(x), " is not JSON serializable");
  }
}

std::string value_to_json(const Value& x, const JsonOptions& opt_in) {
  JsonOptions opt = opt_in;
  if (opt.item_sep.empty()) opt.item_sep = opt.indent >= 0 ? "," : ", ";
  if (opt.key_sep.empty()) opt.key_sep = ": ";
  std::string out;
  json_dump(out, x, opt, 0);
  return out;
}

size_t utf8_length(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

std::u32string utf8_decode(const std::string& s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    unsigned char c = s[i];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    char32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    if (i + size_t(len) > s.size()) len = 1, cp = c;  // truncated sequence: keep the byte
    for (int k = 1; k < len; ++k) cp = (cp << 6) | (char32_t(s[i + size_t(k)]) & 0x3F);
    out += cp;
    i += size_t(len);
  }
  return out;
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) out += char(cp);
  else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

std::string utf8_encode(const std::u32string& s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t cp : s) utf8_append(out, cp);
  return out;
}

}  // namespace strata::jinja
