// Jinja parser: tokens to a syntax tree, following Jinja2's grammar and operator precedence.
// Syntax outside the supported subset (extends, include, import, call blocks, recursive loops,
// raw blocks, ...) is an error naming the line and column.
#pragma once
#include <string>

#include "io/jinja/ast.h"
#include "io/jinja/lexer.h"

namespace strata::jinja {

// Parses a lexed template into its top-level statement list. Throws strata::Error with
// "template line L column C: ..." on any syntax error.
Body jinja_parse_template(const LexResult& lexed);

}  // namespace strata::jinja
