// Jinja built-ins shared by the interpreter: attribute and item access, iteration, filters, tests,
// Python str/dict methods and the global functions transformers' environment provides
// (range, namespace, dict, raise_exception, strftime_now).
#pragma once
#include <ctime>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "io/jinja/value.h"

namespace strata::jinja {

// A runtime error without a position; the interpreter adds "template line L column C: " from
// the node it was evaluating and turns it into strata::Error.
struct RuntimeError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// `obj.name` with Jinja's rules: Python attributes (str and dict methods) first, then dict keys;
// a missing key is Undefined; any access on Undefined is an error naming it.
Value jinja_get_attribute(const Value& obj, const std::string& name);
// `obj[key]`: dict key, list/str index (negative from the end), else attribute; misses are Undefined.
Value jinja_get_item(const Value& obj, const Value& key);
// obj[start:stop:step] on lists and strings (code points), Python semantics; absent parts are null.
Value jinja_slice(const Value& obj, const Value* start, const Value* stop, const Value* step);
// The items a for loop visits: list items, dict keys, string characters; Undefined is empty.
std::vector<Value> jinja_iterate(const Value& x);
// Python ordering for sort/min/max and < > <= >=: numbers, strings, lists. Throws on mixed types.
bool jinja_less(const Value& a, const Value& b);
// `a in b`.
bool jinja_contains(const Value& container, const Value& item);

bool jinja_apply_test(const std::string& name, const Value& x, const CallArgs& args);
bool jinja_has_test(const std::string& name);
Value jinja_apply_filter(const std::string& name, const Value& x, const CallArgs& args);
bool jinja_has_filter(const std::string& name);

// A bound str/dict method `obj.name`, or nullopt when obj has no such method.
std::optional<Value> jinja_lookup_method(const Value& obj, const std::string& name);

// The global functions. `now` fixes strftime_now's clock (tests); nullopt reads local time.
void jinja_add_globals(Dict& globals, std::optional<std::tm> now);

// Python-compatible string helpers used by filters and methods.
bool py_isspace(char32_t c);
std::string py_strip(const std::string& s, const Value* chars, bool left, bool right);
std::string py_upper(const std::string& s);
std::string py_lower(const std::string& s);

}  // namespace strata::jinja
