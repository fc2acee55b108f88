// Jinja syntax tree: expressions and statements as parsed from the token stream. Every node keeps
// the source offset it came from so runtime errors can name a line and column.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "io/jinja/value.h"

namespace strata::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class ExprKind {
  literal,    // value
  name,       // name
  list,       // items
  tuple,      // items (evaluates to a list)
  dict,       // items: key, value, key, value, ...
  attr,       // items[0] . name
  subscript,  // items[0] [ items[1] ]
  slice,      // items[0] [ items[1] : items[2] : items[3] ] (null parts absent)
  call,       // items[0] ( items[1..] , kwargs )
  filter,     // items[0] | name ( items[1..], kwargs ); items[0] null inside {% filter %}
  test,       // items[0] is [not] name ( items[1..] ); `negate`
  unary,      // op items[0]: "not", "-", "+"
  binary,     // items[0] op items[1]: + - * / // % ** ~ and or
  compare,    // items[0] ops[0] items[1] ops[1] items[2] ...: == != < > <= >= in notin
  cond,       // items[1] if items[0] else items[2] (items[2] may be null)
};

struct Expr {
  ExprKind kind;
  size_t pos = 0;
  std::string name;  // name, attribute, filter/test name, or operator
  Value value;       // literal
  std::vector<ExprPtr> items;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;  // compare operators
  bool negate = false;           // test: `is not`
};

enum class StmtKind {
  text,      // text
  output,    // {{ expr }}
  if_,       // conds[i] -> bodies[i]; bodies.size() == conds.size() + 1 when there is an else
  for_,      // targets in expr [if cond]: body [else: else_body]
  set,       // target(s) = expr, or ns.attr = expr, or block set (body)
  macro,     // name(params = defaults): body
  break_,
  continue_,
  filter_block,  // {% filter f %}body{% endfilter %}: expr is the filter with a null input
  generation,    // {% generation %}body{% endgeneration %} (transformers' assistant marker)
};

struct Stmt {
  StmtKind kind;
  size_t pos = 0;
  std::string text;
  ExprPtr expr;
  std::vector<ExprPtr> conds;
  std::vector<Body> bodies;
  Body body, else_body;
  ExprPtr cond;                      // for: `if` filter
  std::vector<std::string> targets;  // for / set names; set: ns attribute in `attr`
  std::string attr;
  std::vector<std::pair<std::string, ExprPtr>> params;  // macro parameters with defaults
};

}  // namespace strata::jinja
