// Jinja lexer (see lexer.h). Whitespace control follows Jinja2's lexer: `{%-` strips all
// whitespace before the tag; otherwise, for block and comment tags, lstrip_blocks removes the
// spaces and tabs between the line start and the tag; `-%}` strips all whitespace after the tag,
// otherwise trim_blocks removes one newline after a block or comment tag.
#include "io/jinja/lexer.h"

#include <cstring>

#include "io/jinja/value.h"
#include "src/core/error.h"

namespace strata::jinja {

std::string jinja_describe_position(const std::string& source, size_t pos) {
  size_t line = 1, col = 1;
  for (size_t i = 0; i < pos && i < source.size(); ++i) {
    if (source[i] == '\n') ++line, col = 1;
    else if ((static_cast<unsigned char>(source[i]) & 0xC0) != 0x80) ++col;
  }
  return str_cat("line ", line, " column ", col);
}

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

class Lexer {
 public:
  Lexer(std::string src, const LexerOptions& opt) : src_(std::move(src)), opt_(opt) {}

  LexResult run() {
    size_t n = src_.size();
    size_t pos = 0;
    bool line_starting = true;
    while (pos < n) {
      size_t start = find_tag(pos);
      if (start == std::string::npos) {
        emit_text(src_.substr(pos), pos);
        break;
      }
      std::string text = src_.substr(pos, start - pos);
      char kind = src_[start + 1];
      char sign = start + 2 < n ? src_[start + 2] : '\0';
      if (sign == '-') {
        size_t e = text.size();
        while (e > 0 && is_space(text[e - 1])) --e;
        text.resize(e);
      } else if (sign != '+' && kind != '{' && opt_.lstrip_blocks) {
        size_t l_pos = text.rfind('\n');
        l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
        if (l_pos > 0 || line_starting) {
          bool all_ws = l_pos < text.size();
          for (size_t i = l_pos; i < text.size(); ++i) all_ws = all_ws && is_space(text[i]);
          if (all_ws) text.resize(l_pos);
        }
      }
      emit_text(text, pos);
      size_t body = start + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
      if (kind == '#') {
        size_t end = src_.find("#}", body);
        if (end == std::string::npos) fail(start, "unterminated comment: add '#}'");
        char esign = end > body ? src_[end - 1] : '\0';
        pos = after_tag(end + 2, esign, true);
      } else {
        bool is_var = kind == '{';
        tokens_.push_back({is_var ? TokenKind::var_begin : TokenKind::block_begin, "", start});
        pos = lex_tag(body, is_var);
      }
      line_starting = pos > 0 && src_[pos - 1] == '\n';
    }
    tokens_.push_back({TokenKind::eof, "", n});
    return {src_, std::move(tokens_)};
  }

 private:
  [[noreturn]] void fail(size_t pos, const std::string& msg) {
    throw Error(ErrorKind::input, str_cat("template ", jinja_describe_position(src_, pos), ": ", msg));
  }

  size_t find_tag(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    }
    return std::string::npos;
  }

  void emit_text(const std::string& text, size_t pos) {
    if (!text.empty()) tokens_.push_back({TokenKind::text, text, pos});
  }

  // Position after a tag ending at `end` (just past its closing delimiter); `sign` is the
  // character before the delimiter ('-' strips following whitespace, '+' keeps the newline).
  size_t after_tag(size_t end, char sign, bool trims) {
    if (sign == '-') {
      while (end < src_.size() && is_space(src_[end])) ++end;
    } else if (sign != '+' && trims && opt_.trim_blocks && end < src_.size() && src_[end] == '\n') {
      ++end;
    }
    return end;
  }

  size_t lex_tag(size_t p, bool is_var) {
    const char* close = is_var ? "}}" : "%}";
    int depth = 0;
    size_t n = src_.size();
    while (true) {
      while (p < n && is_space(src_[p])) ++p;
      if (p >= n) fail(p, is_var ? "unterminated '{{': add '}}'" : "unterminated '{%': add '%}'");
      if (depth == 0) {
        if (src_.compare(p, 2, close) == 0) {
          tokens_.push_back({is_var ? TokenKind::var_end : TokenKind::block_end, "", p});
          return after_tag(p + 2, '\0', !is_var);
        }
        if ((src_[p] == '-' || (src_[p] == '+' && !is_var)) && src_.compare(p + 1, 2, close) == 0) {
          tokens_.push_back({is_var ? TokenKind::var_end : TokenKind::block_end, "", p});
          return after_tag(p + 3, src_[p], !is_var);
        }
      }
      char c = src_[p];
      size_t start = p;
      if (is_name_start(c)) {
        while (p < n && (is_name_start(src_[p]) || is_digit(src_[p]))) ++p;
        tokens_.push_back({TokenKind::name, src_.substr(start, p - start), start});
      } else if (is_digit(c)) {
        bool is_float = false;
        while (p < n && (is_digit(src_[p]) || src_[p] == '_')) ++p;
        if (p + 1 < n && src_[p] == '.' && is_digit(src_[p + 1])) {
          is_float = true;
          ++p;
          while (p < n && (is_digit(src_[p]) || src_[p] == '_')) ++p;
        }
        if (p < n && (src_[p] == 'e' || src_[p] == 'E')) {
          size_t q = p + 1;
          if (q < n && (src_[q] == '+' || src_[q] == '-')) ++q;
          if (q < n && is_digit(src_[q])) {
            is_float = true;
            p = q;
            while (p < n && is_digit(src_[p])) ++p;
          }
        }
        std::string num;
        for (size_t i = start; i < p; ++i)
          if (src_[i] != '_') num += src_[i];
        tokens_.push_back({is_float ? TokenKind::floating : TokenKind::integer, num, start});
      } else if (c == '\'' || c == '"') {
        tokens_.push_back({TokenKind::string, lex_string(p), start});
      } else {
        static const char* two[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op;
        for (const char* t : two)
          if (src_.compare(p, 2, t) == 0) op = t;
        if (op.empty()) {
          if (!std::strchr("+-*/%~<>=()[]{},.:|!", c)) fail(p, str_cat("unexpected character '", c, "'"));
          op = std::string(1, c);
          if (op == "!") fail(p, "unexpected '!': use 'not' or '!='");
        }
        if (op == "(" || op == "[" || op == "{") ++depth;
        if (op == ")" || op == "]" || op == "}") {
          if (depth == 0) fail(p, str_cat("unexpected '", op, "'"));
          --depth;
        }
        p += op.size();
        tokens_.push_back({TokenKind::op, op, start});
      }
    }
  }

  // A quoted literal at p (p moves past it), with Python's escapes decoded.
  std::string lex_string(size_t& p) {
    char q = src_[p];
    size_t start = p++;
    std::string out;
    size_t n = src_.size();
    while (true) {
      if (p >= n) fail(start, "unterminated string literal");
      char c = src_[p++];
      if (c == q) return out;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (p >= n) fail(start, "unterminated string literal");
      char e = src_[p++];
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case 'a': out += '\a'; break;
        case '0': out += '\0'; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case '\n': break;  // line continuation
        case 'x':
        case 'u':
        case 'U': {
          size_t len = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (p + len > n) fail(p - 2, str_cat("truncated \\", e, " escape"));
          char32_t cp = 0;
          for (size_t i = 0; i < len; ++i) {
            char h = src_[p + i];
            int d = is_digit(h) ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10 : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
            if (d < 0) fail(p - 2, str_cat("bad \\", e, " escape"));
            cp = cp * 16 + char32_t(d);
          }
          p += len;
          utf8_append(out, cp);
          break;
        }
        default: out += '\\'; out += e;  // Python keeps unknown escapes as written
      }
    }
  }

  std::string src_;
  LexerOptions opt_;
  std::vector<Token> tokens_;
};

}  // namespace

LexResult jinja_lex_template(const std::string& source, const LexerOptions& opt) {
  std::string src;
  src.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      src += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else src += source[i];
  }
  if (!opt.keep_trailing_newline && !src.empty() && src.back() == '\n') src.pop_back();
  return Lexer(std::move(src), opt).run();
}

}  // namespace strata::jinja
