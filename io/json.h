// nlohmann::json for strata: include this rather than <nlohmann/json.hpp>. Its parser, lexer and
// serializer are compiled once, in io/json.cpp, rather than in every file that parses or dumps.
//
// Why: nlohmann/json is header-only, and each translation unit that called json::parse or dump
// compiled its own copy of the parser and serializer at -O3: about 2.5 s of CPU per file (of
// ~8 s for io/metrics_curves.cpp), in some 40 files of the library. The explicit instantiation
// declarations below ("extern template") say those classes are compiled elsewhere, so a file
// calls them instead of compiling them again. No code path changes: the same template code runs,
// from one object file. A file that includes <nlohmann/json.hpp> directly still builds; it only
// compiles its own copy.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

// What the library instantiates: json parsed from a std::string, a const char* buffer or a
// std::istream, and ordered_json (key order kept, for chat templates and safetensors headers)
// from a std::string; both dumped. A parse from another input type compiles its own parser.
#define STRATA_JSON_READER(EXTERN, JSON, ADAPTER)                       \
  EXTERN template class nlohmann::detail::lexer<JSON, ADAPTER>;          \
  EXTERN template class nlohmann::detail::parser<JSON, ADAPTER>;
#define STRATA_JSON_DOCUMENT(EXTERN, JSON)                                          \
  EXTERN template class nlohmann::detail::serializer<JSON>;                         \
  EXTERN template class nlohmann::detail::json_sax_dom_parser<JSON>;                \
  EXTERN template class nlohmann::detail::json_sax_dom_callback_parser<JSON>;       \
  STRATA_JSON_READER(EXTERN, JSON, nlohmann::detail::iterator_input_adapter<std::string::const_iterator>)
#define STRATA_JSON_INSTANCES(EXTERN)                                                          \
  STRATA_JSON_DOCUMENT(EXTERN, nlohmann::json)                                                 \
  STRATA_JSON_DOCUMENT(EXTERN, nlohmann::ordered_json)                                         \
  STRATA_JSON_READER(EXTERN, nlohmann::json, nlohmann::detail::iterator_input_adapter<const char*>) \
  STRATA_JSON_READER(EXTERN, nlohmann::json, nlohmann::detail::input_stream_adapter)

STRATA_JSON_INSTANCES(extern)
