// Jinja filters and tests, with Jinja2's semantics (and transformers' tojson: json.dumps with
// ensure_ascii=False, key order kept, indent/separators/sort_keys honoured).
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "io/jinja/builtins.h"
#include "src/core/error.h"

namespace strata::jinja {

namespace {

using FilterFn = std::function<Value(const Value&, const CallArgs&)>;
using TestFn = std::function<bool(const Value&, const CallArgs&)>;

// The argument at pos or named name, else dflt: a reference to one or the other, so a caller that
// passes a temporary default keeps a copy (const Value x = arg_or(...)), never a reference.
const Value& arg_or(const CallArgs& a, size_t pos, const char* name, const Value& dflt) {
  const Value* v = a.get(pos, name);
  return v ? *v : dflt;
}

int64_t to_int(const Value& v, const char* what) {
  if (v.is_int()) return v.as_int();
  if (v.is_bool()) return v.as_bool();
  if (v.is_float()) return int64_t(v.as_float());
  throw RuntimeError(str_cat(what, " must be an integer, not ", value_type_name(v)));
}

double to_double(const Value& v) {
  if (v.is_float()) return v.as_float();
  if (v.is_int()) return double(v.as_int());
  if (v.is_bool()) return v.as_bool();
  throw RuntimeError(str_cat("expected a number, not ", value_type_name(v)));
}

List as_items(const Value& x) { return jinja_iterate(x); }

// Attribute path "a.b" or an integer index, as map/selectattr/sort/join take it.
Value attr_path(const Value& x, const Value& attribute) {
  if (attribute.is_int()) return jinja_get_item(x, attribute);
  std::string path = value_str(attribute);
  Value cur = x;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    cur = cur.is_undefined() ? cur : (digits ? jinja_get_item(cur, Value(int64_t(std::stoll(part)))) : jinja_get_item(cur, Value(part)));
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

// Arguments after position `from`, for the test named by select/selectattr or filter named by map.
CallArgs rest_args(const CallArgs& a, size_t from) {
  CallArgs out;
  for (size_t i = from; i < a.args.size(); ++i) out.args.push_back(a.args[i]);
  out.kwargs = a.kwargs;
  return out;
}

Value select_impl(const Value& x, const CallArgs& a, bool by_attr, bool keep) {
  List out;
  size_t test_pos = by_attr ? 1 : 0;
  const Value* attribute = by_attr ? a.get(0, "attribute") : nullptr;
  if (by_attr && !attribute) throw RuntimeError("selectattr/rejectattr need an attribute name");
  const Value* test = a.args.size() > test_pos ? &a.args[test_pos] : nullptr;
  CallArgs targs = rest_args(a, test_pos + 1);
  targs.kwargs.clear();
  for (const Value& item : as_items(x)) {
    Value probe = by_attr ? attr_path(item, *attribute) : item;
    bool ok = test ? jinja_apply_test(value_str(*test), probe, targs) : value_truthy(probe);
    if (ok == keep) out.push_back(item);
  }
  return value_make_list(std::move(out));
}

Value sort_key(const Value& v, bool case_sensitive) {
  if (v.is_string() && !case_sensitive) return Value(py_lower(v.as_string()));
  return v;
}

std::string title_case(const std::string& s) {
  // Jinja's do_title: split on runs of [-\s(\{\[<], capitalize each piece.
  std::u32string u = utf8_decode(s), out;
  bool at_start = true;
  for (char32_t c : u) {
    bool sep = py_isspace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    std::string one = utf8_encode(std::u32string(1, c));
    std::string mapped = sep ? one : (at_start ? py_upper(one) : py_lower(one));
    out += utf8_decode(mapped);
    at_start = sep;
  }
  return utf8_encode(out);
}

std::string py_capitalize(const std::string& s) {
  std::u32string u = utf8_decode(s);
  if (u.empty()) return s;
  return py_upper(utf8_encode(u.substr(0, 1))) + py_lower(utf8_encode(u.substr(1)));
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  if (count == 0) return s;
  std::string out;
  if (from.empty()) {  // Python inserts `to` between every character (and at both ends)
    std::u32string u = utf8_decode(s);
    int64_t done = 0;
    for (size_t i = 0; i <= u.size(); ++i) {
      if (count < 0 || done < count) out += to, ++done;
      if (i < u.size()) utf8_append(out, u[i]);
    }
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (true) {
    size_t hit = s.find(from, pos);
    if (hit == std::string::npos || (count >= 0 && done >= count)) break;
    out.append(s, pos, hit - pos);
    out += to;
    pos = hit + from.size();
    ++done;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

std::string ascii_escape_json(const std::string& s) {
  std::string out;
  for (char32_t c : utf8_decode(s)) {
    if (c < 0x80) {
      out += char(c);
      continue;
    }
    auto hex = [&](unsigned v) {
      char b[16];
      std::snprintf(b, sizeof b, "\\u%04x", v);
      out += b;
    };
    if (c >= 0x10000) {
      unsigned v = unsigned(c) - 0x10000;
      hex(0xD800 + (v >> 10));
      hex(0xDC00 + (v & 0x3FF));
    } else hex(unsigned(c));
  }
  return out;
}

Value filter_tojson(const Value& x, const CallArgs& a) {
  JsonOptions opt;
  const Value* indent = a.get(0, "indent");
  if (indent && !indent->is_none()) opt.indent = int(to_int(*indent, "tojson indent"));
  if (const Value* seps = a.get(99, "separators"); seps && !seps->is_none()) {
    List s = as_items(*seps);
    if (s.size() != 2) throw RuntimeError("tojson separators must be a pair (item_sep, key_sep)");
    opt.item_sep = value_str(s[0]);
    opt.key_sep = value_str(s[1]);
  }
  if (const Value* sk = a.get(99, "sort_keys")) opt.sort_keys = value_truthy(*sk);
  std::string out = value_to_json(x, opt);
  if (const Value* ea = a.get(99, "ensure_ascii"); ea && value_truthy(*ea)) out = ascii_escape_json(out);
  return Value(out);
}

Value filter_indent(const Value& x, const CallArgs& a) {
  const Value w = arg_or(a, 0, "width", Value(int64_t(4)));
  std::string ind = w.is_string() ? w.as_string() : std::string(size_t(to_int(w, "indent width")), ' ');
  bool first = value_truthy(arg_or(a, 1, "first", Value(false)));
  bool blank = value_truthy(arg_or(a, 2, "blank", Value(false)));
  std::string s = value_str(x) + "\n";
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t nl; (nl = s.find('\n', start)) != std::string::npos; start = nl + 1) lines.push_back(s.substr(start, nl - start));
  std::string rv;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i == 0) {
      rv = lines[0];
      continue;
    }
    rv += "\n";
    if (blank || !lines[i].empty()) rv += ind;
    rv += lines[i];
  }
  if (first) rv = ind + rv;
  return Value(rv);
}

Value filter_format(const Value& x, const CallArgs& a) {
  std::string f = value_str(x), out;
  size_t next_arg = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] != '%') {
      out += f[i];
      continue;
    }
    if (++i >= f.size()) throw RuntimeError("format: incomplete format");
    char c = f[i];
    if (c == '%') {
      out += '%';
      continue;
    }
    if (next_arg >= a.args.size()) throw RuntimeError("format: not enough arguments for format string");
    const Value& v = a.args[next_arg++];
    if (c == 's') out += value_str(v);
    else if (c == 'r') out += value_repr(v);
    else if (c == 'd' || c == 'i') out += std::to_string(to_int(v, "%d argument"));
    else throw RuntimeError(str_cat("format: unsupported conversion '%", c, "' (supported: %s %r %d %%)"));
  }
  return Value(out);
}

Value filter_round(const Value& x, const CallArgs& a) {
  int64_t precision = to_int(arg_or(a, 0, "precision", Value(int64_t(0))), "round precision");
  std::string method = value_str(arg_or(a, 1, "method", Value("common")));
  if (x.is_int() && precision >= 0 && method == "common") return x;  // Python: round(int, n) is the int
  double v = to_double(x), scale = std::pow(10.0, double(precision));
  double r;
  if (method == "common") r = std::nearbyint(v * scale) / scale;  // Python's round: half to even
  else if (method == "floor") r = std::floor(v * scale) / scale;
  else if (method == "ceil") r = std::ceil(v * scale) / scale;
  else throw RuntimeError("round method must be 'common', 'ceil' or 'floor'");
  return Value(r);
}

Value filter_sort(const Value& x, const CallArgs& a) {
  bool reverse = value_truthy(arg_or(a, 0, "reverse", Value(false)));
  bool cs = value_truthy(arg_or(a, 1, "case_sensitive", Value(false)));
  const Value* attribute = a.get(2, "attribute");
  List items = as_items(x);
  auto key = [&](const Value& v) { return sort_key(attribute && !attribute->is_none() ? attr_path(v, *attribute) : v, cs); };
  std::stable_sort(items.begin(), items.end(), [&](const Value& p, const Value& q) {
    return reverse ? jinja_less(key(q), key(p)) : jinja_less(key(p), key(q));
  });
  return value_make_list(std::move(items));
}

Value filter_unique(const Value& x, const CallArgs& a) {
  bool cs = value_truthy(arg_or(a, 0, "case_sensitive", Value(false)));
  const Value* attribute = a.get(1, "attribute");
  List out, seen;
  for (const Value& v : as_items(x)) {
    Value k = sort_key(attribute && !attribute->is_none() ? attr_path(v, *attribute) : v, cs);
    bool dup = false;
    for (const Value& s : seen) dup = dup || value_equal(s, k);
    if (!dup) {
      seen.push_back(k);
      out.push_back(v);
    }
  }
  return value_make_list(std::move(out));
}

Value min_max(const Value& x, const CallArgs& a, bool want_max) {
  bool cs = value_truthy(arg_or(a, 0, "case_sensitive", Value(false)));
  const Value* attribute = a.get(1, "attribute");
  List items = as_items(x);
  if (items.empty()) return Undefined{"min/max of an empty sequence"};
  auto key = [&](const Value& v) { return sort_key(attribute && !attribute->is_none() ? attr_path(v, *attribute) : v, cs); };
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i) {
    bool better = want_max ? jinja_less(key(items[best]), key(items[i])) : jinja_less(key(items[i]), key(items[best]));
    if (better) best = i;
  }
  return items[best];
}

const std::map<std::string, FilterFn>& filters() {
  static const std::map<std::string, FilterFn> f = {
      {"abs", [](const Value& x, const CallArgs&) { return x.is_int() ? Value(int64_t(std::llabs(x.as_int()))) : Value(std::fabs(to_double(x))); }},
      {"attr", [](const Value& x, const CallArgs& a) { return jinja_get_attribute(x, value_str(arg_or(a, 0, "name", Value("")))); }},
      {"capitalize", [](const Value& x, const CallArgs&) { return Value(py_capitalize(value_str(x))); }},
      {"count", [](const Value& x, const CallArgs& a) { return jinja_apply_filter("length", x, a); }},
      {"default", [](const Value& x, const CallArgs& a) {
         const Value dflt = arg_or(a, 0, "default_value", Value(""));
         bool boolean = value_truthy(arg_or(a, 1, "boolean", Value(false)));
         if (x.is_undefined() || (boolean && !value_truthy(x))) return dflt;
         return x;
       }},
      {"dictsort", [](const Value& x, const CallArgs& a) {
         if (!x.is_dict()) throw RuntimeError("dictsort expects a mapping");
         bool cs = value_truthy(arg_or(a, 0, "case_sensitive", Value(false)));
         bool by_value = value_str(arg_or(a, 1, "by", Value("key"))) == "value";
         bool reverse = value_truthy(arg_or(a, 2, "reverse", Value(false)));
         List items;
         for (const auto& [k, v] : x.as_dict()->items) items.push_back(value_make_list({Value(k), v}));
         std::stable_sort(items.begin(), items.end(), [&](const Value& p, const Value& q) {
           Value kp = sort_key((*p.as_list())[by_value], cs), kq = sort_key((*q.as_list())[by_value], cs);
           return reverse ? jinja_less(kq, kp) : jinja_less(kp, kq);
         });
         return value_make_list(std::move(items));
       }},
      {"escape", [](const Value& x, const CallArgs&) {
         std::string out;
         for (char c : value_str(x)) {
           if (c == '&') out += "&amp;";
           else if (c == '<') out += "&lt;";
           else if (c == '>') out += "&gt;";
           else if (c == '"') out += "&#34;";
           else if (c == '\'') out += "&#39;";
           else out += c;
         }
         return Value(out);
       }},
      {"first", [](const Value& x, const CallArgs&) {
         List items = as_items(x);
         return items.empty() ? Value(Undefined{"first item of an empty sequence"}) : items.front();
       }},
      {"float", [](const Value& x, const CallArgs& a) {
         const Value dflt = arg_or(a, 0, "default", Value(0.0));
         if (x.is_number()) return Value(to_double(x));
         if (x.is_string()) {
           try {
             size_t used = 0;
             std::string s = py_strip(x.as_string(), nullptr, true, true);
             double d = std::stod(s, &used);
             if (used == s.size()) return Value(d);
           } catch (const std::exception&) {
           }
         }
         return dflt;
       }},
      {"format", filter_format},
      {"indent", filter_indent},
      {"int", [](const Value& x, const CallArgs& a) {
         const Value dflt = arg_or(a, 0, "default", Value(int64_t(0)));
         int base = int(to_int(arg_or(a, 1, "base", Value(int64_t(10))), "int base"));
         if (x.is_int()) return x;
         if (x.is_bool() || x.is_float()) return Value(to_int(x, "int"));
         if (x.is_string()) {
           std::string s = py_strip(x.as_string(), nullptr, true, true);
           try {
             size_t used = 0;
             long long v = std::stoll(s, &used, base);
             if (used == s.size()) return Value(int64_t(v));
             double d = std::stod(s, &used);
             if (used == s.size()) return Value(int64_t(d));
           } catch (const std::exception&) {
           }
         }
         return dflt;
       }},
      {"items", [](const Value& x, const CallArgs&) {
         if (x.is_undefined()) return value_make_list();
         if (!x.is_dict()) throw RuntimeError(str_cat("items filter expects a mapping, got ", value_type_name(x)));
         List out;
         for (const auto& [k, v] : x.as_dict()->items) out.push_back(value_make_list({Value(k), v}));
         return value_make_list(std::move(out));
       }},
      {"join", [](const Value& x, const CallArgs& a) {
         std::string sep = value_str(arg_or(a, 0, "d", Value("")));
         const Value* attribute = a.get(1, "attribute");
         std::string out;
         bool first = true;
         for (const Value& v : as_items(x)) {
           if (!first) out += sep;
           first = false;
           out += value_str(attribute && !attribute->is_none() ? attr_path(v, *attribute) : v);
         }
         return Value(out);
       }},
      {"last", [](const Value& x, const CallArgs&) {
         List items = as_items(x);
         return items.empty() ? Value(Undefined{"last item of an empty sequence"}) : items.back();
       }},
      {"length", [](const Value& x, const CallArgs&) {
         if (x.is_string()) return Value(int64_t(utf8_length(x.as_string())));
         if (x.is_list()) return Value(int64_t(x.as_list()->size()));
         if (x.is_dict()) return Value(int64_t(x.as_dict()->size()));
         if (x.is_undefined()) return Value(int64_t(0));
         throw RuntimeError(str_cat("object of type '", value_type_name(x), "' has no len()"));
       }},
      {"list", [](const Value& x, const CallArgs&) { return value_make_list(as_items(x)); }},
      {"lower", [](const Value& x, const CallArgs&) { return Value(py_lower(value_str(x))); }},
      {"map", [](const Value& x, const CallArgs& a) {
         List out;
         const Value* attribute = a.get(99, "attribute");
         if (attribute) {
           const Value* dflt = a.get(99, "default");
           for (const Value& v : as_items(x)) {
             Value r = attr_path(v, *attribute);
             out.push_back(r.is_undefined() && dflt ? *dflt : r);
           }
         } else {
           if (a.args.empty()) throw RuntimeError("map needs a filter name or attribute=");
           std::string name = value_str(a.args[0]);
           CallArgs fargs = rest_args(a, 1);
           for (const Value& v : as_items(x)) out.push_back(jinja_apply_filter(name, v, fargs));
         }
         return value_make_list(std::move(out));
       }},
      {"max", [](const Value& x, const CallArgs& a) { return min_max(x, a, true); }},
      {"min", [](const Value& x, const CallArgs& a) { return min_max(x, a, false); }},
      {"reject", [](const Value& x, const CallArgs& a) { return select_impl(x, a, false, false); }},
      {"rejectattr", [](const Value& x, const CallArgs& a) { return select_impl(x, a, true, false); }},
      {"replace", [](const Value& x, const CallArgs& a) {
         const Value* old = a.get(0, "old");
         const Value* nw = a.get(1, "new");
         if (!old || !nw) throw RuntimeError("replace needs (old, new)");
         const Value* count = a.get(2, "count");
         int64_t n = count && !count->is_none() ? to_int(*count, "replace count") : -1;
         return Value(replace_all(value_str(x), value_str(*old), value_str(*nw), n));
       }},
      {"reverse", [](const Value& x, const CallArgs&) {
         if (x.is_string()) {
           std::u32string u = utf8_decode(x.as_string());
           std::reverse(u.begin(), u.end());
           return Value(utf8_encode(u));
         }
         List items = as_items(x);
         std::reverse(items.begin(), items.end());
         return value_make_list(std::move(items));
       }},
      {"round", filter_round},
      {"safe", [](const Value& x, const CallArgs&) { return x; }},
      {"select", [](const Value& x, const CallArgs& a) { return select_impl(x, a, false, true); }},
      {"selectattr", [](const Value& x, const CallArgs& a) { return select_impl(x, a, true, true); }},
      {"sort", filter_sort},
      {"string", [](const Value& x, const CallArgs&) { return Value(value_str(x)); }},
      {"sum", [](const Value& x, const CallArgs& a) {
         const Value* attribute = a.get(0, "attribute");
         Value total = arg_or(a, 1, "start", Value(int64_t(0)));
         for (const Value& v : as_items(x)) {
           Value t = attribute && !attribute->is_none() ? attr_path(v, *attribute) : v;
           if (total.is_int() && t.is_int()) total = Value(total.as_int() + t.as_int());
           else total = Value(to_double(total) + to_double(t));
         }
         return total;
       }},
      {"title", [](const Value& x, const CallArgs&) { return Value(title_case(value_str(x))); }},
      {"tojson", filter_tojson},
      {"trim", [](const Value& x, const CallArgs& a) { return Value(py_strip(value_str(x), a.get(0, "chars"), true, true)); }},
      {"unique", filter_unique},
      {"upper", [](const Value& x, const CallArgs&) { return Value(py_upper(value_str(x))); }},
      {"wordcount", [](const Value& x, const CallArgs&) {
         int64_t n = 0;
         bool in_word = false;
         for (char32_t c : utf8_decode(value_str(x))) {
           bool w = !py_isspace(c);
           if (w && !in_word) ++n;
           in_word = w;
         }
         return Value(n);
       }},
  };
  return f;
}

const std::map<std::string, std::string>& filter_aliases() {
  static const std::map<std::string, std::string> a = {{"d", "default"}, {"e", "escape"}};
  return a;
}

bool cmp_args(const CallArgs& a, Value& other) {
  const Value* v = a.get(0, "other");
  if (!v) throw RuntimeError("comparison test needs an argument");
  other = *v;
  return true;
}

const std::map<std::string, TestFn>& tests() {
  static const std::map<std::string, TestFn> t = {
      {"boolean", [](const Value& x, const CallArgs&) { return x.is_bool(); }},
      {"callable", [](const Value& x, const CallArgs&) { return x.is_callable(); }},
      {"defined", [](const Value& x, const CallArgs&) { return !x.is_undefined(); }},
      {"divisibleby", [](const Value& x, const CallArgs& a) {
         Value o;
         cmp_args(a, o);
         int64_t d = to_int(o, "divisibleby");
         return d != 0 && to_int(x, "divisibleby") % d == 0;
       }},
      {"eq", [](const Value& x, const CallArgs& a) { Value o; cmp_args(a, o); return value_equal(x, o); }},
      {"even", [](const Value& x, const CallArgs&) { return to_int(x, "even") % 2 == 0; }},
      {"false", [](const Value& x, const CallArgs&) { return x.is_bool() && !x.as_bool(); }},
      {"float", [](const Value& x, const CallArgs&) { return x.is_float(); }},
      {"ge", [](const Value& x, const CallArgs& a) { Value o; cmp_args(a, o); return !jinja_less(x, o); }},
      {"gt", [](const Value& x, const CallArgs& a) { Value o; cmp_args(a, o); return jinja_less(o, x); }},
      {"in", [](const Value& x, const CallArgs& a) { Value o; cmp_args(a, o); return jinja_contains(o, x); }},
      {"integer", [](const Value& x, const CallArgs&) { return x.is_int(); }},
      {"iterable", [](const Value& x, const CallArgs&) { return x.is_list() || x.is_dict() || x.is_string() || x.is_undefined(); }},
      {"le", [](const Value& x, const CallArgs& a) { Value o; cmp_args(a, o); return !jinja_less(o, x); }},
      {"lower", [](const Value& x, const CallArgs&) { return x.is_string() && py_lower(x.as_string()) == x.as_string(); }},
      {"lt", [](const Value& x, const CallArgs& a) { Value o; cmp_args(a, o); return jinja_less(x, o); }},
      {"mapping", [](const Value& x, const CallArgs&) { return x.is_dict() && !x.as_dict()->is_namespace; }},
      {"ne", [](const Value& x, const CallArgs& a) { Value o; cmp_args(a, o); return !value_equal(x, o); }},
      {"none", [](const Value& x, const CallArgs&) { return x.is_none(); }},
      {"number", [](const Value& x, const CallArgs&) { return x.is_number(); }},
      {"odd", [](const Value& x, const CallArgs&) { return to_int(x, "odd") % 2 != 0; }},
      {"sameas", [](const Value& x, const CallArgs& a) {
         Value o;
         cmp_args(a, o);
         if (x.v.index() != o.v.index()) return false;
         if (x.is_list()) return x.as_list() == o.as_list();
         if (x.is_dict()) return x.as_dict() == o.as_dict();
         return value_equal(x, o);
       }},
      {"sequence", [](const Value& x, const CallArgs&) { return x.is_list() || x.is_dict() || x.is_string() || x.is_undefined(); }},
      {"string", [](const Value& x, const CallArgs&) { return x.is_string(); }},
      {"true", [](const Value& x, const CallArgs&) { return x.is_bool() && x.as_bool(); }},
      {"undefined", [](const Value& x, const CallArgs&) { return x.is_undefined(); }},
      {"upper", [](const Value& x, const CallArgs&) { return x.is_string() && py_upper(x.as_string()) == x.as_string(); }},
  };
  return t;
}

const std::map<std::string, std::string>& test_aliases() {
  static const std::map<std::string, std::string> a = {
      {"equalto", "eq"}, {"==", "eq"}, {"!=", "ne"}, {"<", "lt"}, {"<=", "le"}, {">", "gt"}, {">=", "ge"},
      {"greaterthan", "gt"}, {"lessthan", "lt"}};
  return a;
}

template <class M, class A>
auto find_builtin(const M& m, const A& aliases, const std::string& name) {
  auto al = aliases.find(name);
  return m.find(al == aliases.end() ? name : al->second);
}

}  // namespace

bool jinja_has_filter(const std::string& name) { return find_builtin(filters(), filter_aliases(), name) != filters().end(); }
bool jinja_has_test(const std::string& name) { return find_builtin(tests(), test_aliases(), name) != tests().end(); }

Value jinja_apply_filter(const std::string& name, const Value& x, const CallArgs& args) {
  auto it = find_builtin(filters(), filter_aliases(), name);
  if (it == filters().end()) throw RuntimeError(str_cat("unknown filter '", name, "'"));
  return it->second(x, args);
}

bool jinja_apply_test(const std::string& name, const Value& x, const CallArgs& args) {
  auto it = find_builtin(tests(), test_aliases(), name);
  if (it == tests().end()) throw RuntimeError(str_cat("unknown test '", name, "'"));
  return it->second(x, args);
}

}  // namespace strata::jinja
