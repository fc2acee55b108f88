// The value type of strata's Jinja interpreter: Python-like values (Undefined, None, bool, int,
// float, str, list, dict, callable) with the semantics Python's Jinja2 gives them, because chat
// templates are written against transformers' Jinja2 environment. Strings are UTF-8; their
// length, indexing and slicing count code points as Python does. Dicts keep insertion order
// (json.loads does), which is what `tojson` prints.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

namespace strata::jinja {

struct Value;
struct Dict;
struct CallArgs;

using List = std::vector<Value>;
using ListPtr = std::shared_ptr<List>;
using DictPtr = std::shared_ptr<Dict>;
using Function = std::function<Value(CallArgs&)>;
using FunctionPtr = std::shared_ptr<Function>;

// Jinja's Undefined: falsy, prints as "", iterates as empty; most other uses are errors that
// name the missing variable (`hint`).
struct Undefined {
  std::string hint;
};
struct None {};

struct Value {
  std::variant<Undefined, None, bool, int64_t, double, std::string, ListPtr, DictPtr, FunctionPtr> v;

  Value() : v(Undefined{}) {}
  Value(Undefined u) : v(std::move(u)) {}
  Value(None n) : v(n) {}
  Value(bool b) : v(b) {}
  Value(int i) : v(int64_t(i)) {}
  Value(int64_t i) : v(i) {}
  Value(double d) : v(d) {}
  Value(std::string s) : v(std::move(s)) {}
  Value(const char* s) : v(std::string(s)) {}
  Value(ListPtr l) : v(std::move(l)) {}
  Value(DictPtr d) : v(std::move(d)) {}
  Value(FunctionPtr f) : v(std::move(f)) {}

  bool is_undefined() const { return std::holds_alternative<Undefined>(v); }
  bool is_none() const { return std::holds_alternative<None>(v); }
  bool is_bool() const { return std::holds_alternative<bool>(v); }
  bool is_int() const { return std::holds_alternative<int64_t>(v); }
  bool is_float() const { return std::holds_alternative<double>(v); }
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return std::holds_alternative<std::string>(v); }
  bool is_list() const { return std::holds_alternative<ListPtr>(v); }
  bool is_dict() const { return std::holds_alternative<DictPtr>(v); }
  bool is_callable() const { return std::holds_alternative<FunctionPtr>(v); }

  bool as_bool() const { return std::get<bool>(v); }
  int64_t as_int() const { return std::get<int64_t>(v); }
  double as_float() const { return std::get<double>(v); }
  const std::string& as_string() const { return std::get<std::string>(v); }
  const ListPtr& as_list() const { return std::get<ListPtr>(v); }
  const DictPtr& as_dict() const { return std::get<DictPtr>(v); }
  const FunctionPtr& as_callable() const { return std::get<FunctionPtr>(v); }
};

// An insertion-ordered string-keyed map. `is_namespace` marks the objects made by namespace(),
// the only ones a template may assign attributes on (`set ns.x = ...`).
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  std::unordered_map<std::string, size_t> index;
  bool is_namespace = false;

  const Value* find(const std::string& key) const;
  void set(const std::string& key, Value value);
  size_t size() const { return items.size(); }
};

// Arguments of a call: positional, then keyword (in call order).
struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;

  // The argument at `pos` or named `name`; Undefined when absent.
  const Value* get(size_t pos, const std::string& name) const;
};

Value value_make_list(List items = {});
Value value_make_dict();
Value value_make_function(Function fn);

// Conversion from JSON (nlohmann::ordered_json keeps key order; nlohmann::json sorts keys).
Value value_from_json(const nlohmann::ordered_json& j);
Value value_from_json(const nlohmann::json& j);

// Python semantics.
bool value_truthy(const Value& x);
bool value_equal(const Value& a, const Value& b);
std::string value_type_name(const Value& x);  // "str", "int", "NoneType", "undefined", ...
std::string value_str(const Value& x);        // str(x); Undefined prints ""
std::string value_repr(const Value& x);       // repr(x), used inside list/dict printing
std::string value_float_repr(double d);       // repr(float): shortest round trip, Python layout

// json.dumps(x, ensure_ascii=False, indent, separators, sort_keys) as transformers binds tojson.
// indent < 0 means None. Throws strata::Error for values JSON cannot hold (Undefined, callables).
struct JsonOptions {
  int indent = -1;
  std::string item_sep;  // empty: Python's default for the indent
  std::string key_sep;
  bool sort_keys = false;
};
std::string value_to_json(const Value& x, const JsonOptions& opt = {});

// UTF-8 helpers: code point count, decode to / encode from code points.
size_t utf8_length(const std::string& s);
std::u32string utf8_decode(const std::string& s);
std::string utf8_encode(const std::u32string& s);
void utf8_append(std::string& out, char32_t cp);

}  // namespace strata::jinja
