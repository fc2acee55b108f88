// Tree-walking evaluator for the Jinja syntax tree, and the Template facade (template.h).
// Scoping follows Jinja2: `for` bodies and macro calls get their own frame (a `set` inside a loop
// does not leak out, which is why templates use namespace()); `if` does not open a frame.
#include <cmath>
#include <unordered_map>

#include "io/jinja/ast.h"
#include "io/jinja/builtins.h"
#include "io/jinja/lexer.h"
#include "io/jinja/parser.h"
#include "io/jinja/template.h"
#include "src/core/error.h"

namespace strata::jinja {

struct Template::Impl {
  std::string source;  // normalized source: node offsets refer to it
  Body body;
};

namespace {

constexpr int kMaxMacroDepth = 200;

[[noreturn]] void fail_at(const std::string& src, size_t pos, const std::string& msg) {
  throw Error(ErrorKind::input, str_cat("template ", jinja_describe_position(src, pos), ": ", msg));
}

// Unknown filters and tests are reported when the template is compiled, as Jinja2 does.
void validate_expr(const std::string& src, const Expr* e) {
  if (!e) return;
  if (e->kind == ExprKind::filter && !jinja_has_filter(e->name)) fail_at(src, e->pos, str_cat("no filter named '", e->name, "'"));
  if (e->kind == ExprKind::test && !jinja_has_test(e->name)) fail_at(src, e->pos, str_cat("no test named '", e->name, "'"));
  for (const auto& c : e->items) validate_expr(src, c.get());
  for (const auto& kv : e->kwargs) validate_expr(src, kv.second.get());
}

void validate_body(const std::string& src, const Body& body) {
  for (const auto& s : body) {
    validate_expr(src, s->expr.get());
    validate_expr(src, s->cond.get());
    for (const auto& c : s->conds) validate_expr(src, c.get());
    for (const auto& b : s->bodies) validate_body(src, b);
    for (const auto& p : s->params) validate_expr(src, p.second.get());
    validate_body(src, s->body);
    validate_body(src, s->else_body);
  }
}

class Interpreter {
 public:
  Interpreter(const std::string& src, const Dict& ctx, const RenderOptions& opt) : src_(src) {
    auto top = std::make_shared<Frame>();
    for (const auto& [k, v] : ctx.items) (*top)[k] = v;
    scopes_.push_back(top);
    jinja_add_globals(globals_, opt.now);
  }

  std::string run(const Body& body) {
    std::string out;
    Flow f = exec_body(body, out);
    if (f != Flow::normal) fail_at(src_, 0, "'break' or 'continue' outside of a for loop");
    return out;
  }

 private:
  using Frame = std::unordered_map<std::string, Value>;
  enum class Flow { normal, brk, cont };

  // ---- statements -------------------------------------------------------------------------
  Flow exec_body(const Body& body, std::string& out) {
    for (const auto& s : body) {
      Flow f = exec(*s, out);
      if (f != Flow::normal) return f;
    }
    return Flow::normal;
  }

  Flow exec(const Stmt& s, std::string& out) {
    try {
      return exec_inner(s, out);
    } catch (const RuntimeError& e) {
      fail_at(src_, s.pos, e.what());
    }
  }

  Flow exec_inner(const Stmt& s, std::string& out) {
    switch (s.kind) {
      case StmtKind::text: out += s.text; return Flow::normal;
      case StmtKind::output: out += value_str(eval(*s.expr)); return Flow::normal;
      case StmtKind::if_:
        for (size_t i = 0; i < s.conds.size(); ++i)
          if (value_truthy(eval(*s.conds[i]))) return exec_body(s.bodies[i], out);
        if (s.bodies.size() > s.conds.size()) return exec_body(s.bodies.back(), out);
        return Flow::normal;
      case StmtKind::for_: return exec_for(s, out);
      case StmtKind::set: exec_set(s); return Flow::normal;
      case StmtKind::macro: define_macro(s); return Flow::normal;
      case StmtKind::break_: return Flow::brk;
      case StmtKind::continue_: return Flow::cont;
      case StmtKind::filter_block: {
        std::string inner;
        Flow f = exec_body(s.body, inner);
        out += value_str(apply_filter(*s.expr, Value(inner)));
        return f;
      }
      case StmtKind::generation: return exec_body(s.body, out);
    }
    return Flow::normal;
  }

  void bind_targets(Frame& frame, const std::vector<std::string>& targets, const Value& item) {
    if (targets.size() == 1) {
      frame[targets[0]] = item;
      return;
    }
    std::vector<Value> parts = jinja_iterate(item);
    if (parts.size() != targets.size())
      throw RuntimeError(str_cat("cannot unpack ", parts.size(), " values into ", targets.size(), " loop variables"));
    for (size_t i = 0; i < targets.size(); ++i) frame[targets[i]] = parts[i];
  }

  Flow exec_for(const Stmt& s, std::string& out) {
    Value iterable = eval(*s.expr);
    if (iterable.is_none()) throw RuntimeError("'NoneType' object is not iterable");
    std::vector<Value> items = jinja_iterate(iterable);
    auto frame = std::make_shared<Frame>();
    scopes_.push_back(frame);
    struct Pop {
      std::vector<std::shared_ptr<Frame>>& s;
      ~Pop() { s.pop_back(); }
    } pop{scopes_};
    if (s.cond) {
      std::vector<Value> kept;
      for (const Value& item : items) {
        bind_targets(*frame, s.targets, item);
        if (value_truthy(eval(*s.cond))) kept.push_back(item);
      }
      items = std::move(kept);
    }
    int64_t n = int64_t(items.size());
    for (int64_t i = 0; i < n; ++i) {
      bind_targets(*frame, s.targets, items[size_t(i)]);
      auto loop = std::make_shared<Dict>();
      loop->set("index", Value(i + 1));
      loop->set("index0", Value(i));
      loop->set("revindex", Value(n - i));
      loop->set("revindex0", Value(n - i - 1));
      loop->set("first", Value(i == 0));
      loop->set("last", Value(i == n - 1));
      loop->set("length", Value(n));
      loop->set("depth", Value(int64_t(1)));
      loop->set("depth0", Value(int64_t(0)));
      loop->set("previtem", i > 0 ? items[size_t(i - 1)] : Value(Undefined{"loop.previtem"}));
      loop->set("nextitem", i + 1 < n ? items[size_t(i + 1)] : Value(Undefined{"loop.nextitem"}));
      loop->set("cycle", value_make_function([i](CallArgs& a) {
                  if (a.args.empty()) throw RuntimeError("loop.cycle() needs at least one argument");
                  return a.args[size_t(i) % a.args.size()];
                }));
      (*frame)["loop"] = Value(loop);
      Flow f = exec_body(s.body, out);
      if (f == Flow::brk) break;
    }
    if (n == 0) return exec_body(s.else_body, out);
    return Flow::normal;
  }

  void exec_set(const Stmt& s) {
    Value v;
    if (s.expr) {
      v = eval(*s.expr);
    } else {
      std::string captured;
      exec_body(s.body, captured);
      v = Value(captured);
    }
    if (!s.attr.empty()) {
      Value target = lookup(s.targets[0]);
      if (!target.is_dict() || !target.as_dict()->is_namespace)
        throw RuntimeError(str_cat("cannot assign attribute '", s.attr, "' on '", s.targets[0],
                                   "': only namespace() objects take attribute assignment"));
      target.as_dict()->set(s.attr, std::move(v));
      return;
    }
    bind_targets(*scopes_.back(), s.targets, v);
  }

  void define_macro(const Stmt& s) {
    const Stmt* m = &s;
    (*scopes_.back())[s.targets[0]] = value_make_function([this, m](CallArgs& a) { return call_macro(*m, a); });
  }

  Value call_macro(const Stmt& m, CallArgs& a) {
    if (++macro_depth_ > kMaxMacroDepth) {
      --macro_depth_;
      throw RuntimeError(str_cat("macro '", m.targets[0], "' recursed more than ", kMaxMacroDepth, " levels"));
    }
    if (a.args.size() > m.params.size())
      throw RuntimeError(str_cat("macro '", m.targets[0], "' takes ", m.params.size(), " arguments, got ", a.args.size()));
    for (const auto& [k, v] : a.kwargs) {
      bool known = false;
      for (const auto& p : m.params) known = known || p.first == k;
      if (!known) throw RuntimeError(str_cat("macro '", m.targets[0], "' has no parameter '", k, "'"));
    }
    auto frame = std::make_shared<Frame>();
    std::vector<std::shared_ptr<Frame>> saved = scopes_;
    scopes_ = {scopes_.front(), frame};
    struct Restore {
      Interpreter& self;
      std::vector<std::shared_ptr<Frame>>& saved;
      ~Restore() {
        self.scopes_ = std::move(saved);
        --self.macro_depth_;
      }
    } restore{*this, saved};
    for (size_t i = 0; i < m.params.size(); ++i) {
      const Value* given = a.get(i, m.params[i].first);
      if (given) (*frame)[m.params[i].first] = *given;
      else if (m.params[i].second) (*frame)[m.params[i].first] = eval(*m.params[i].second);
      else (*frame)[m.params[i].first] = Value(Undefined{str_cat("'", m.params[i].first, "'")});
    }
    std::string out;
    exec_body(m.body, out);
    return Value(out);
  }

  // ---- expressions ------------------------------------------------------------------------
  Value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = (*it)->find(name);
      if (f != (*it)->end()) return f->second;
    }
    if (const Value* g = globals_.find(name)) return *g;
    return Undefined{str_cat("'", name, "'")};
  }

  Value eval(const Expr& e) {
    try {
      return eval_inner(e);
    } catch (const RuntimeError& err) {
      fail_at(src_, e.pos, err.what());
    }
  }

  CallArgs eval_args(const Expr& e, size_t first) {
    CallArgs a;
    for (size_t i = first; i < e.items.size(); ++i) a.args.push_back(eval(*e.items[i]));
    for (const auto& [k, v] : e.kwargs) a.kwargs.emplace_back(k, eval(*v));
    return a;
  }

  Value apply_filter(const Expr& e, const Value& input) {
    CallArgs a = eval_args(e, 1);
    try {
      return jinja_apply_filter(e.name, input, a);
    } catch (const RuntimeError& err) {
      throw RuntimeError(str_cat("filter '", e.name, "': ", err.what()));
    }
  }

  Value eval_inner(const Expr& e) {
    switch (e.kind) {
      case ExprKind::literal: return e.value;
      case ExprKind::name: return lookup(e.name);
      case ExprKind::list:
      case ExprKind::tuple: {
        List items;
        for (const auto& x : e.items) items.push_back(eval(*x));
        return value_make_list(std::move(items));
      }
      case ExprKind::dict: {
        auto d = std::make_shared<Dict>();
        for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
          Value k = eval(*e.items[i]);
          if (!k.is_string()) throw RuntimeError(str_cat("dict keys must be strings here, not ", value_type_name(k)));
          d->set(k.as_string(), eval(*e.items[i + 1]));
        }
        return Value(d);
      }
      case ExprKind::attr: return jinja_get_attribute(eval(*e.items[0]), e.name);
      case ExprKind::subscript: return jinja_get_item(eval(*e.items[0]), eval(*e.items[1]));
      case ExprKind::slice: {
        Value obj = eval(*e.items[0]);
        Value parts[3];
        for (int i = 0; i < 3; ++i)
          if (e.items[size_t(i) + 1]) parts[i] = eval(*e.items[size_t(i) + 1]);
        return jinja_slice(obj, e.items[1] ? &parts[0] : nullptr, e.items[2] ? &parts[1] : nullptr,
                           e.items[3] ? &parts[2] : nullptr);
      }
      case ExprKind::call: {
        Value callee = eval(*e.items[0]);
        if (callee.is_undefined()) {
          const std::string& hint = std::get<Undefined>(callee.v).hint;
          throw RuntimeError(str_cat(hint.empty() ? "value" : hint, " is undefined and cannot be called"));
        }
        if (!callee.is_callable()) throw RuntimeError(str_cat("'", value_type_name(callee), "' object is not callable"));
        CallArgs a = eval_args(e, 1);
        return (*callee.as_callable())(a);
      }
      case ExprKind::filter: return apply_filter(e, eval(*e.items[0]));
      case ExprKind::test: {
        Value x = eval(*e.items[0]);
        CallArgs a = eval_args(e, 1);
        return Value(jinja_apply_test(e.name, x, a) != e.negate);
      }
      case ExprKind::unary: {
        Value x = eval(*e.items[0]);
        if (e.name == "not") return Value(!value_truthy(x));
        require_defined(x);
        if (x.is_int()) return Value(e.name == "-" ? -x.as_int() : x.as_int());
        if (x.is_bool()) return Value(int64_t(e.name == "-" ? -int64_t(x.as_bool()) : int64_t(x.as_bool())));
        if (x.is_float()) return Value(e.name == "-" ? -x.as_float() : x.as_float());
        throw RuntimeError(str_cat("bad operand type for unary ", e.name, ": '", value_type_name(x), "'"));
      }
      case ExprKind::binary: {
        if (e.name == "and") {
          Value a = eval(*e.items[0]);
          return value_truthy(a) ? eval(*e.items[1]) : a;
        }
        if (e.name == "or") {
          Value a = eval(*e.items[0]);
          return value_truthy(a) ? a : eval(*e.items[1]);
        }
        Value a = eval(*e.items[0]);
        Value b = eval(*e.items[1]);
        return binary_op(e.name, a, b);
      }
      case ExprKind::compare: {
        Value left = eval(*e.items[0]);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.items[i + 1]);
          if (!compare_op(e.ops[i], left, right)) return Value(false);
          left = std::move(right);
        }
        return Value(true);
      }
      case ExprKind::cond:
        if (value_truthy(eval(*e.items[0]))) return eval(*e.items[1]);
        return e.items[2] ? eval(*e.items[2]) : Value(Undefined{"the else branch of an inline if"});
    }
    return Value();
  }

  static void require_defined(const Value& x) {
    if (x.is_undefined()) {
      const std::string& hint = std::get<Undefined>(x.v).hint;
      throw RuntimeError(str_cat(hint.empty() ? "value" : hint, " is undefined"));
    }
  }

  static bool compare_op(const std::string& op, const Value& a, const Value& b) {
    if (op == "==") return value_equal(a, b);
    if (op == "!=") return !value_equal(a, b);
    if (op == "in") return jinja_contains(b, a);
    if (op == "notin") return !jinja_contains(b, a);
    require_defined(a);
    require_defined(b);
    if (op == "<") return jinja_less(a, b);
    if (op == ">") return jinja_less(b, a);
    if (op == "<=") return !jinja_less(b, a);
    return !jinja_less(a, b);  // >=
  }

  static double num(const Value& x) { return x.is_float() ? x.as_float() : x.is_int() ? double(x.as_int()) : double(x.as_bool()); }
  static int64_t inum(const Value& x) { return x.is_int() ? x.as_int() : int64_t(x.as_bool()); }

  static Value binary_op(const std::string& op, const Value& a, const Value& b) {
    if (op == "~") return Value(value_str(a) + value_str(b));
    require_defined(a);
    require_defined(b);
    auto type_error = [&]() -> RuntimeError {
      return RuntimeError(str_cat("unsupported operand type(s) for ", op, ": '", value_type_name(a), "' and '",
                                  value_type_name(b), "'"));
    };
    bool nums = a.is_number() && b.is_number();
    bool ints = nums && !a.is_float() && !b.is_float();
    if (op == "+") {
      if (ints) return Value(inum(a) + inum(b));
      if (nums) return Value(num(a) + num(b));
      if (a.is_string() && b.is_string()) return Value(a.as_string() + b.as_string());
      if (a.is_list() && b.is_list()) {
        List out = *a.as_list();
        out.insert(out.end(), b.as_list()->begin(), b.as_list()->end());
        return value_make_list(std::move(out));
      }
      throw type_error();
    }
    if (op == "-") {
      if (ints) return Value(inum(a) - inum(b));
      if (nums) return Value(num(a) - num(b));
      throw type_error();
    }
    if (op == "*") {
      if (ints) return Value(inum(a) * inum(b));
      if (nums) return Value(num(a) * num(b));
      const Value* seq = a.is_string() || a.is_list() ? &a : b.is_string() || b.is_list() ? &b : nullptr;
      const Value* times = seq == &a ? &b : &a;
      if (seq && (times->is_int() || times->is_bool())) {
        int64_t n = std::max<int64_t>(0, inum(*times));
        if (seq->is_string()) {
          std::string out;
          for (int64_t i = 0; i < n; ++i) out += seq->as_string();
          return Value(out);
        }
        List out;
        for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq->as_list()->begin(), seq->as_list()->end());
        return value_make_list(std::move(out));
      }
      throw type_error();
    }
    if (op == "/") {
      if (!nums) throw type_error();
      if (num(b) == 0) throw RuntimeError("division by zero");
      return Value(num(a) / num(b));
    }
    if (op == "//" || op == "%") {
      if (op == "%" && a.is_string()) {
        CallArgs fa;
        fa.args = b.is_list() ? *b.as_list() : List{b};
        return jinja_apply_filter("format", a, fa);
      }
      if (!nums) throw type_error();
      if (num(b) == 0) throw RuntimeError(op == "%" ? "modulo by zero" : "division by zero");
      if (ints) {
        int64_t x = inum(a), y = inum(b);
        int64_t q = x / y, r = x % y;
        if (r != 0 && ((r < 0) != (y < 0))) --q, r += y;  // Python floors
        return Value(op == "//" ? q : r);
      }
      double x = num(a), y = num(b);
      double q = std::floor(x / y);
      return Value(op == "//" ? q : x - q * y);
    }
    if (op == "**") {
      if (ints && inum(b) >= 0) {
        int64_t r = 1, base = inum(a);
        for (int64_t i = 0; i < inum(b); ++i) r *= base;
        return Value(r);
      }
      if (nums) return Value(std::pow(num(a), num(b)));
      throw type_error();
    }
    throw RuntimeError(str_cat("unknown operator ", op));
  }

  const std::string& src_;
  std::vector<std::shared_ptr<Frame>> scopes_;
  Dict globals_;
  int macro_depth_ = 0;
};

}  // namespace

Template::Template(const std::string& source) {
  auto impl = std::make_shared<Impl>();
  LexResult lexed = jinja_lex_template(source);
  impl->body = jinja_parse_template(lexed);
  impl->source = std::move(lexed.source);
  validate_body(impl->source, impl->body);
  impl_ = std::move(impl);
}

std::string Template::render(const Dict& context, const RenderOptions& opt) const {
  Interpreter it(impl_->source, context, opt);
  return it.run(impl_->body);
}

}  // namespace strata::jinja
