// Jinja lexer: splits a template into text and tag tokens, applying whitespace control the way
// transformers' environment does (trim_blocks=True, lstrip_blocks=True, keep_trailing_newline
// False, `{%-`/`-%}` and `{%+`/`+%}` markers, newlines normalized to "\n").
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace strata::jinja {

enum class TokenKind { text, var_begin, var_end, block_begin, block_end, name, string, integer, floating, op, eof };

struct Token {
  TokenKind kind;
  std::string text;  // text content, name, decoded string literal, number spelling, or operator
  size_t pos;        // byte offset in the normalized source
};

struct LexerOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
};

// The normalized source (the offsets in tokens refer to it) and its tokens.
struct LexResult {
  std::string source;
  std::vector<Token> tokens;
};

// Throws strata::Error "template line L column C: ..." for malformed input.
LexResult jinja_lex_template(const std::string& source, const LexerOptions& opt = {});

// "line L column C" for a byte offset of `source` (1-based).
std::string jinja_describe_position(const std::string& source, size_t pos);

}  // namespace strata::jinja
