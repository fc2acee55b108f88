// strata's Jinja interpreter against Python Jinja2 (tests/fixtures/chat/snippets.jsonl, written by
// tools/fixtures/jinja/check_with_jinja2.py with transformers' environment), plus hand-worked
// whitespace control, error positions and the features Jinja2 alone cannot pin.
#include <catch2/catch.hpp>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "io/jinja/template.h"
#include "src/core/error.h"

using namespace strata;
using namespace strata::jinja;

namespace {

std::string render(const std::string& src, const nlohmann::ordered_json& ctx = nlohmann::ordered_json::object()) {
  Dict d;
  for (auto it = ctx.begin(); it != ctx.end(); ++it) d.set(it.key(), value_from_json(it.value()));
  RenderOptions opt;
  std::tm tm{};
  tm.tm_year = 124, tm.tm_mon = 6, tm.tm_mday = 26, tm.tm_hour = 9, tm.tm_min = 5;
  std::time_t t = timegm(&tm);
  gmtime_r(&t, &tm);
  opt.now = tm;
  return Template(src).render(d, opt);
}

std::string error_of(const std::string& src, const nlohmann::ordered_json& ctx = nlohmann::ordered_json::object()) {
  try {
    render(src, ctx);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("jinja: snippets render as Python Jinja2 renders them", "[jinja]") {
  std::ifstream in(STRATA_SOURCE_DIR "/tests/fixtures/chat/snippets.jsonl");
  REQUIRE(in);
  std::string line;
  int rendered = 0, errors = 0;
  while (std::getline(in, line)) {
    auto rec = nlohmann::ordered_json::parse(line);
    std::string name = rec["name"];
    INFO("snippet " << name << ": " << rec["template"].get<std::string>());
    if (rec.contains("expected")) {
      CHECK(render(rec["template"], rec["context"]) == rec["expected"].get<std::string>());
      ++rendered;
    } else {
      CHECK_THROWS_AS(render(rec["template"], rec["context"]), Error);
      ++errors;
    }
  }
  CHECK(rendered == 36);
  CHECK(errors == 8);
}

TEST_CASE("jinja: whitespace control follows trim_blocks and lstrip_blocks", "[jinja]") {
  // lstrip_blocks removes the indentation before a block tag, trim_blocks the newline after it.
  CHECK(render("<\n    {% if true %}\n    x\n    {% endif %}\n>") == "<\n    x\n>");
  // `-` strips all whitespace on its side, newlines included; `+` keeps the indentation.
  CHECK(render("a \n {%- if true -%} \n b \n {%- endif %}") == "ab");
  CHECK(render("a\n  {%+ if true %}b{% endif %}") == "a\n  b");
  CHECK(render("{{ 'x' }}\n{{ 'y' }}") == "x\ny");  // variables keep their newline
  CHECK(render("a {# note #}\nb") == "a b");         // comments trim like blocks
  CHECK(render("line\n") == "line");                  // keep_trailing_newline=False
  CHECK(render("line\r\nnext\r\n\r\n") == "line\nnext\n");
}

TEST_CASE("jinja: syntax errors name the line and column", "[jinja]") {
  CHECK_THAT(error_of("ok\n{% if x %}\nno end"), Catch::Contains("line 3") && Catch::Contains("missing {% endif %}"));
  CHECK_THAT(error_of("a\n  {% include 'x.jinja' %}"), Catch::Contains("line 2 column 6") && Catch::Contains("unsupported tag 'include'"));
  CHECK_THAT(error_of("{{ x | nosuchfilter }}"), Catch::Contains("line 1 column 8") && Catch::Contains("no filter named 'nosuchfilter'"));
  CHECK_THAT(error_of("{{ x is nosuchtest }}"), Catch::Contains("no test named 'nosuchtest'"));
  CHECK_THAT(error_of("{{ 'abc }}"), Catch::Contains("line 1 column 4") && Catch::Contains("unterminated string"));
  CHECK_THAT(error_of("{{ 1 + }}"), Catch::Contains("line 1 column 8") && Catch::Contains("expected an expression"));
  CHECK_THAT(error_of("\n\n{{ a ! b }}"), Catch::Contains("line 3 column 6"));
  CHECK_THAT(error_of("{% for x in xs recursive %}{% endfor %}"), Catch::Contains("recursive"));
  CHECK_THAT(error_of("{% endfor %}"), Catch::Contains("no open block"));
  CHECK_THAT(error_of("{# open comment"), Catch::Contains("unterminated comment"));
  CHECK_THAT(error_of("{{ f(*args) }}"), Catch::Contains("*args"));
}

TEST_CASE("jinja: runtime errors name the line and column of the failing expression", "[jinja]") {
  CHECK_THAT(error_of("a\nb {{ missing.attr }}"), Catch::Contains("line 2 column 13") && Catch::Contains("'missing' is undefined"));
  CHECK_THAT(error_of("{{ raise_exception('Roles must alternate') }}"),
             Catch::Contains("line 1 column 4") && Catch::Contains("Roles must alternate"));
  CHECK_THAT(error_of("{% for m in messages %}\n{{ m.content + 1 }}{% endfor %}", {{"messages", {{{"content", "x"}}}}}),
             Catch::Contains("line 2") && Catch::Contains("unsupported operand"));
  CHECK_THAT(error_of("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"), Catch::Contains("recursed"));
}

TEST_CASE("jinja: transformers extensions and Python details", "[jinja]") {
  // {% generation %} is transformers' AssistantTracker marker: it renders its body unchanged.
  CHECK(render("A{% generation %}gen{{ 1 }}{% endgeneration %}B") == "Agen1B");
  // Undefined: falsy, prints empty, `is defined` false, iterates as empty, default() replaces it.
  CHECK(render("[{{ u }}]{{ u is defined }}{{ 'f' if not u }}{% for x in u %}x{% endfor %}{{ u | default('d') }}") == "[]Falsefd");
  // Dict key order is the input's (json.loads keeps it) and tojson keeps it.
  nlohmann::ordered_json ctx = nlohmann::ordered_json::parse(R"({"d": {"zeta": 1, "alpha": {"b": 2, "a": 3}}})");
  CHECK(render("{{ d | tojson }}", ctx) == R"({"zeta": 1, "alpha": {"b": 2, "a": 3}})");
  CHECK(render("{{ d | tojson(sort_keys=true) }}", ctx) == R"({"alpha": {"a": 3, "b": 2}, "zeta": 1})");
  // Strings index and slice by code point; messages[::-1] reverses.
  CHECK(render("{{ s[1] }}{{ s[-1] }}{{ s[::-1] }}{{ s | length }}", {{"s", "añ😀"}}) == "ñ😀😀ña3");
  CHECK(render("{% for m in ms[::-1] %}{{ m }}{% endfor %}", {{"ms", {1, 2, 3}}}) == "321");
  // Floats print as Python's repr; 64-bit integers stay exact.
  CHECK(render("{{ 0.1 }} {{ 1e16 }} {{ 123456789.0 }} {{ 9007199254740993 }} {{ 1e-5 }}") ==
        "0.1 1e+16 123456789.0 9007199254740993 1e-05");
  // A namespace set inside a loop is visible after it; a plain set is not.
  CHECK(render("{% set ns = namespace(c=0) %}{% set n = 0 %}{% for i in range(4) %}{% set ns.c = ns.c + i %}"
               "{% set n = n + i %}{% endfor %}{{ ns.c }}/{{ n }}") == "6/0");
  // Tuples are lists here (Python would print (1, 2)).
  CHECK(render("{{ (1, 2) }}") == "[1, 2]");
  // Filters' own defaults when the argument is left out (each was once a reference to a freed temporary).
  CHECK(render("[{{ u | default }}]{{ 'x' | int }}{{ 'x' | float }}|{{ 'a\nb' | indent }}|") == "[]00.0|a\n    b|");
}
