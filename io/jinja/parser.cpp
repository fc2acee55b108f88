// Jinja parser (see parser.h). Precedence, lowest first, as in Jinja2's parser:
//   x if c else y  <  or  <  and  <  not  <  compare (== != < > <= >= in, not in)
//   <  + -  <  ~  <  * / // %  <  **  <  unary - +  <  postfix (. [] ()), filters |, tests is
#include "io/jinja/parser.h"

#include <set>

#include "src/core/error.h"

namespace strata::jinja {

namespace {

class Parser {
 public:
  explicit Parser(const LexResult& lexed) : src_(lexed.source), toks_(lexed.tokens) {}

  Body parse_all() {
    std::string end;
    Body body = parse_body({}, &end);
    return body;
  }

 private:
  // ---- token helpers ----------------------------------------------------------------------
  const Token& peek(size_t k = 0) const { return toks_[std::min(i_ + k, toks_.size() - 1)]; }
  const Token& next() { return toks_[std::min(i_++, toks_.size() - 1)]; }
  bool is_op(const std::string& op, size_t k = 0) const { return peek(k).kind == TokenKind::op && peek(k).text == op; }
  bool is_name(const std::string& n, size_t k = 0) const { return peek(k).kind == TokenKind::name && peek(k).text == n; }

  [[noreturn]] void fail(size_t pos, const std::string& msg) const {
    throw Error(ErrorKind::input, str_cat("template ", jinja_describe_position(src_, pos), ": ", msg));
  }
  static std::string describe(const Token& t) {
    switch (t.kind) {
      case TokenKind::text: return "text";
      case TokenKind::var_begin: return "'{{'";
      case TokenKind::var_end: return "'}}'";
      case TokenKind::block_begin: return "'{%'";
      case TokenKind::block_end: return "'%}'";
      case TokenKind::eof: return "end of template";
      case TokenKind::string: return "a string";
      default: return "'" + t.text + "'";
    }
  }
  void expect_op(const std::string& op) {
    if (!is_op(op)) fail(peek().pos, str_cat("expected '", op, "', found ", describe(peek())));
    ++i_;
  }
  void expect_kind(TokenKind k, const char* what) {
    if (peek().kind != k) fail(peek().pos, str_cat("expected ", what, ", found ", describe(peek())));
    ++i_;
  }
  void expect_block_end() { expect_kind(TokenKind::block_end, "'%}'"); }
  std::string expect_name() {
    if (peek().kind != TokenKind::name) fail(peek().pos, str_cat("expected a name, found ", describe(peek())));
    return next().text;
  }

  ExprPtr make(ExprKind k, size_t pos) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->pos = pos;
    return e;
  }
  StmtPtr make_stmt(StmtKind k, size_t pos) {
    auto s = std::make_unique<Stmt>();
    s->kind = k;
    s->pos = pos;
    return s;
  }

  // ---- statements -------------------------------------------------------------------------
  // Parses until a block tag whose keyword is in `ends` (consumed with its keyword; the caller
  // parses the rest of that tag). At the top level `ends` is empty and the end is eof.
  Body parse_body(const std::set<std::string>& ends, std::string* end_found) {
    Body body;
    size_t open_pos = peek().pos;
    while (true) {
      const Token& t = peek();
      if (t.kind == TokenKind::eof) {
        if (!ends.empty())
          fail(t.pos, str_cat("unexpected end of template: missing {% ", *ends.rbegin(), " %} for the block opened at ",
                              jinja_describe_position(src_, open_pos)));
        return body;
      }
      if (t.kind == TokenKind::text) {
        auto s = make_stmt(StmtKind::text, t.pos);
        s->text = t.text;
        body.push_back(std::move(s));
        ++i_;
      } else if (t.kind == TokenKind::var_begin) {
        ++i_;
        auto s = make_stmt(StmtKind::output, t.pos);
        s->expr = parse_tuple();
        expect_kind(TokenKind::var_end, "'}}'");
        body.push_back(std::move(s));
      } else if (t.kind == TokenKind::block_begin) {
        const Token& kw = peek(1);
        if (kw.kind == TokenKind::name && ends.count(kw.text)) {
          i_ += 2;
          *end_found = kw.text;
          return body;
        }
        ++i_;
        body.push_back(parse_statement());
      } else {
        fail(t.pos, str_cat("unexpected ", describe(t)));
      }
    }
  }

  StmtPtr parse_statement() {
    const Token& kw = peek();
    if (kw.kind != TokenKind::name) fail(kw.pos, str_cat("expected a statement keyword, found ", describe(kw)));
    const std::string& k = kw.text;
    size_t pos = kw.pos;
    ++i_;
    if (k == "if") return parse_if(pos);
    if (k == "for") return parse_for(pos);
    if (k == "set") return parse_set(pos);
    if (k == "macro") return parse_macro(pos);
    if (k == "break" || k == "continue") {
      expect_block_end();
      return make_stmt(k == "break" ? StmtKind::break_ : StmtKind::continue_, pos);
    }
    if (k == "filter") {
      auto s = make_stmt(StmtKind::filter_block, pos);
      s->expr = parse_filter(nullptr);
      expect_block_end();
      std::string end;
      s->body = parse_body({"endfilter"}, &end);
      expect_block_end();
      return s;
    }
    if (k == "generation") {
      expect_block_end();
      auto s = make_stmt(StmtKind::generation, pos);
      std::string end;
      s->body = parse_body({"endgeneration"}, &end);
      expect_block_end();
      return s;
    }
    static const std::set<std::string> ends = {"endif", "endfor", "endset", "endmacro", "endfilter", "endgeneration",
                                               "elif", "else"};
    if (ends.count(k)) fail(pos, str_cat("unexpected '", k, "' with no open block it could close"));
    fail(pos, str_cat("unsupported tag '", k,
                      "' (supported: if, for, set, macro, filter, generation, break, continue)"));
  }

  StmtPtr parse_if(size_t pos) {
    auto s = make_stmt(StmtKind::if_, pos);
    s->conds.push_back(parse_expression());
    expect_block_end();
    while (true) {
      std::string end;
      s->bodies.push_back(parse_body({"elif", "else", "endif"}, &end));
      if (end == "elif") {
        s->conds.push_back(parse_expression());
        expect_block_end();
      } else if (end == "else") {
        expect_block_end();
        std::string end2;
        s->bodies.push_back(parse_body({"endif"}, &end2));
        expect_block_end();
        return s;
      } else {
        expect_block_end();
        return s;
      }
    }
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> names;
    bool paren = is_op("(");
    if (paren) ++i_;
    names.push_back(expect_name());
    while (is_op(",")) {
      ++i_;
      if (peek().kind != TokenKind::name || is_name("in")) break;
      names.push_back(expect_name());
    }
    if (paren) expect_op(")");
    return names;
  }

  StmtPtr parse_for(size_t pos) {
    auto s = make_stmt(StmtKind::for_, pos);
    s->targets = parse_targets();
    if (!is_name("in")) fail(peek().pos, str_cat("expected 'in' in for loop, found ", describe(peek())));
    ++i_;
    s->expr = parse_tuple(/*with_condexpr=*/false);
    if (is_name("if")) {
      ++i_;
      s->cond = parse_expression();
    }
    if (is_name("recursive")) fail(peek().pos, "recursive for loops are not supported");
    expect_block_end();
    std::string end;
    s->body = parse_body({"else", "endfor"}, &end);
    if (end == "else") {
      expect_block_end();
      s->else_body = parse_body({"endfor"}, &end);
    }
    expect_block_end();
    return s;
  }

  StmtPtr parse_set(size_t pos) {
    auto s = make_stmt(StmtKind::set, pos);
    std::string first = expect_name();
    if (is_op(".")) {
      ++i_;
      s->targets = {first};
      s->attr = expect_name();
    } else {
      s->targets = {first};
      while (is_op(",")) {
        ++i_;
        s->targets.push_back(expect_name());
      }
    }
    if (is_op("=")) {
      ++i_;
      s->expr = parse_tuple();
      expect_block_end();
      return s;
    }
    if (s->targets.size() != 1 || !s->attr.empty()) fail(peek().pos, "expected '=' in set");
    expect_block_end();
    std::string end;
    s->body = parse_body({"endset"}, &end);
    expect_block_end();
    return s;
  }

  StmtPtr parse_macro(size_t pos) {
    auto s = make_stmt(StmtKind::macro, pos);
    s->targets = {expect_name()};
    expect_op("(");
    while (!is_op(")")) {
      std::string p = expect_name();
      ExprPtr def;
      if (is_op("=")) {
        ++i_;
        def = parse_expression();
      }
      s->params.emplace_back(p, std::move(def));
      if (!is_op(")")) expect_op(",");
    }
    ++i_;
    expect_block_end();
    std::string end;
    s->body = parse_body({"endmacro"}, &end);
    if (peek().kind == TokenKind::name) ++i_;  // `{% endmacro name %}`
    expect_block_end();
    return s;
  }

  // ---- expressions ------------------------------------------------------------------------
  // An expression, or a bare tuple `a, b` (as `{{ }}` and `set` allow).
  ExprPtr parse_tuple(bool with_condexpr = true) {
    size_t pos = peek().pos;
    ExprPtr first = with_condexpr ? parse_expression() : parse_or();
    if (!is_op(",")) return first;
    auto t = make(ExprKind::tuple, pos);
    t->items.push_back(std::move(first));
    while (is_op(",")) {
      ++i_;
      if (peek().kind == TokenKind::var_end || peek().kind == TokenKind::block_end || is_name("if")) break;
      t->items.push_back(with_condexpr ? parse_expression() : parse_or());
    }
    return t;
  }

  ExprPtr parse_expression() {
    ExprPtr e = parse_or();
    while (is_name("if")) {
      size_t pos = peek().pos;
      ++i_;
      auto c = make(ExprKind::cond, pos);
      c->items.push_back(parse_or());  // condition
      c->items.push_back(std::move(e));
      if (is_name("else")) {
        ++i_;
        c->items.push_back(parse_expression());
      } else {
        c->items.push_back(nullptr);
      }
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(const std::string& op, ExprPtr a, ExprPtr b, size_t pos) {
    auto e = make(ExprKind::binary, pos);
    e->name = op;
    e->items.push_back(std::move(a));
    e->items.push_back(std::move(b));
    return e;
  }

  // One left-associative precedence level, `operand (op operand)*`: at_op() says whether the next
  // token is one of the level's operators; each becomes a binary node named by its text.
  template <class Operand, class AtOp>
  ExprPtr parse_left_assoc(Operand operand, AtOp at_op) {
    ExprPtr e = operand();
    while (at_op()) {
      const Token& t = next();
      const std::string op = t.text;
      const size_t pos = t.pos;
      e = binary(op, std::move(e), operand(), pos);
    }
    return e;
  }

  // Comma-separated items up to and past `close` (a trailing comma allowed), each read by item().
  template <class Item>
  void parse_items(const char* close, Item item) {
    while (!is_op(close)) {
      item();
      if (!is_op(close)) expect_op(",");
    }
    ++i_;
  }

  ExprPtr parse_or() {
    return parse_left_assoc([&] { return parse_and(); }, [&] { return is_name("or"); });
  }
  ExprPtr parse_and() {
    return parse_left_assoc([&] { return parse_not(); }, [&] { return is_name("and"); });
  }
  ExprPtr parse_not() {
    if (is_name("not")) {
      size_t pos = next().pos;
      auto e = make(ExprKind::unary, pos);
      e->name = "not";
      e->items.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    size_t pos = peek().pos;
    ExprPtr first = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (peek().kind == TokenKind::op &&
          (peek().text == "==" || peek().text == "!=" || peek().text == "<" || peek().text == ">" ||
           peek().text == "<=" || peek().text == ">=")) {
        op = next().text;
      } else if (is_name("in")) {
        ++i_;
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        i_ += 2;
        op = "notin";
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(ExprKind::compare, pos);
        cmp->items.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->items.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }
  ExprPtr parse_math1() {
    return parse_left_assoc([&] { return parse_concat(); }, [&] { return is_op("+") || is_op("-"); });
  }
  ExprPtr parse_concat() {
    return parse_left_assoc([&] { return parse_math2(); }, [&] { return is_op("~"); });
  }
  ExprPtr parse_math2() {
    return parse_left_assoc([&] { return parse_pow(); },
                            [&] { return is_op("*") || is_op("/") || is_op("//") || is_op("%"); });
  }
  ExprPtr parse_pow() {
    return parse_left_assoc([&] { return parse_unary(true); }, [&] { return is_op("**"); });
  }
  ExprPtr parse_unary(bool with_filter) {
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const Token& t = next();
      e = make(ExprKind::unary, t.pos);
      e->name = t.text;
      e->items.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = peek();
    size_t pos = t.pos;
    switch (t.kind) {
      case TokenKind::name: {
        ++i_;
        auto e = make(ExprKind::literal, pos);
        if (t.text == "true" || t.text == "True") e->value = Value(true);
        else if (t.text == "false" || t.text == "False") e->value = Value(false);
        else if (t.text == "none" || t.text == "None") e->value = Value(None{});
        else {
          e->kind = ExprKind::name;
          e->name = t.text;
        }
        return e;
      }
      case TokenKind::string: {
        std::string s;
        while (peek().kind == TokenKind::string) s += next().text;  // adjacent literals concatenate
        auto e = make(ExprKind::literal, pos);
        e->value = Value(std::move(s));
        return e;
      }
      case TokenKind::integer: {
        ++i_;
        auto e = make(ExprKind::literal, pos);
        try {
          e->value = Value(int64_t(std::stoll(t.text)));
        } catch (const std::exception&) {
          fail(pos, str_cat("integer literal ", t.text, " does not fit in 64 bits"));
        }
        return e;
      }
      case TokenKind::floating: {
        ++i_;
        auto e = make(ExprKind::literal, pos);
        e->value = Value(std::stod(t.text));
        return e;
      }
      case TokenKind::op: {
        if (t.text == "(") {
          ++i_;
          if (is_op(")")) {
            ++i_;
            return make(ExprKind::tuple, pos);
          }
          ExprPtr first = parse_expression();
          if (is_op(")")) {
            ++i_;
            return first;
          }
          auto tup = make(ExprKind::tuple, pos);
          tup->items.push_back(std::move(first));
          while (is_op(",")) {
            ++i_;
            if (is_op(")")) break;
            tup->items.push_back(parse_expression());
          }
          expect_op(")");
          return tup;
        }
        if (t.text == "[") {
          ++i_;
          auto l = make(ExprKind::list, pos);
          parse_items("]", [&] { l->items.push_back(parse_expression()); });
          return l;
        }
        if (t.text == "{") {
          ++i_;
          auto d = make(ExprKind::dict, pos);
          parse_items("}", [&] {
            d->items.push_back(parse_expression());
            expect_op(":");
            d->items.push_back(parse_expression());
          });
          return d;
        }
        break;
      }
      default: break;
    }
    fail(pos, str_cat("expected an expression, found ", describe(t)));
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (is_op(".")) {
        size_t pos = next().pos;
        if (peek().kind == TokenKind::integer) {
          auto s = make(ExprKind::subscript, pos);
          s->items.push_back(std::move(e));
          auto idx = make(ExprKind::literal, peek().pos);
          idx->value = Value(int64_t(std::stoll(next().text)));
          s->items.push_back(std::move(idx));
          e = std::move(s);
        } else {
          auto a = make(ExprKind::attr, pos);
          a->name = expect_name();
          a->items.push_back(std::move(e));
          e = std::move(a);
        }
      } else if (is_op("[")) {
        e = parse_subscript(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr obj) {
    size_t pos = next().pos;  // '['
    ExprPtr parts[3];
    bool is_slice = false;
    if (!is_op(":")) parts[0] = parse_expression();
    if (is_op(":")) {
      is_slice = true;
      ++i_;
      if (!is_op(":") && !is_op("]")) parts[1] = parse_expression();
      if (is_op(":")) {
        ++i_;
        if (!is_op("]")) parts[2] = parse_expression();
      }
    }
    expect_op("]");
    auto e = make(is_slice ? ExprKind::slice : ExprKind::subscript, pos);
    e->items.push_back(std::move(obj));
    if (is_slice) {
      for (auto& p : parts) e->items.push_back(std::move(p));
    } else {
      e->items.push_back(std::move(parts[0]));
    }
    return e;
  }

  // Call arguments after '(' up to and including ')': positional into e->items, keyword into e->kwargs.
  void parse_args(Expr* e) {
    expect_op("(");
    while (!is_op(")")) {
      if (is_op("*") || is_op("**")) fail(peek().pos, "*args and **kwargs in calls are not supported");
      if (peek().kind == TokenKind::name && is_op("=", 1)) {
        std::string k = next().text;
        ++i_;
        e->kwargs.emplace_back(k, parse_expression());
      } else {
        if (!e->kwargs.empty()) fail(peek().pos, "positional argument follows keyword argument");
        e->items.push_back(parse_expression());
      }
      if (!is_op(")")) expect_op(",");
    }
    ++i_;
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto c = make(ExprKind::call, callee->pos);
    c->items.push_back(std::move(callee));
    parse_args(c.get());
    return c;
  }

  // `| name(args)` applied to `input` (null inside {% filter %}); the '|' is already consumed.
  ExprPtr parse_filter(ExprPtr input) {
    auto f = make(ExprKind::filter, peek().pos);
    f->name = expect_name();
    f->items.push_back(std::move(input));
    if (is_op("(")) parse_args(f.get());
    return f;
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        ++i_;
        e = parse_filter(std::move(e));
      } else if (is_name("is")) {
        size_t pos = next().pos;
        auto t = make(ExprKind::test, pos);
        if (is_name("not")) {
          ++i_;
          t->negate = true;
        }
        t->name = expect_name();
        t->items.push_back(std::move(e));
        if (is_op("(")) {
          parse_args(t.get());
        } else {
          const Token& a = peek();
          bool arg = (a.kind == TokenKind::name && a.text != "else" && a.text != "or" && a.text != "and" &&
                      a.text != "is") ||
                     a.kind == TokenKind::string || a.kind == TokenKind::integer || a.kind == TokenKind::floating ||
                     (a.kind == TokenKind::op && (a.text == "[" || a.text == "{"));
          if (arg) t->items.push_back(parse_postfix(parse_primary()));
        }
        e = std::move(t);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  const std::string& src_;
  const std::vector<Token>& toks_;
  size_t i_ = 0;
};

}  // namespace

Body jinja_parse_template(const LexResult& lexed) { return Parser(lexed).parse_all(); }

}  // namespace strata::jinja
