// `strata tokenize` and `strata detokenize`: JSON lines on stdin -> JSON lines on stdout, one output
// line per input line, in order, so the text pipeline can be checked against Hugging Face.
//   strata tokenize --tokenizer DIR [--add-special-tokens]   {"text": "..."} -> {"ids": [...]}
//   strata detokenize --tokenizer DIR [--skip-special-tokens] {"ids": [...]} -> {"text": "..."}
// Empty input lines are skipped. A malformed line is a strata::Error naming its line number.
#include <charconv>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "io/json.h"
#include "io/tokenizer/tokenizer.h"
#include "src/cli/commands.h"
#include "src/core/error.h"

namespace strata {
namespace {

struct TokenizeArgs {
  std::string tokenizer;
  bool add_special_tokens = false;
  bool skip_special_tokens = false;
  bool help = false;  // --help was printed: nothing to run
};

TokenizeArgs tokenize_parse_args(const std::vector<std::string>& args, const char* cmd, const char* flag) {
  TokenizeArgs a;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--help" || args[i] == "-h") {
      a.help = true;
      std::cout << "usage: strata " << cmd << " --tokenizer DIR [" << flag << "] < input.jsonl\n\n"
                << (std::string(cmd) == "tokenize"
                        ? "Reads {\"text\": \"...\"} JSON lines on stdin and writes {\"ids\": [...]} lines, one per input line.\n"
                        : "Reads {\"ids\": [...]} JSON lines on stdin and writes {\"text\": \"...\"} lines, one per input line.\n")
                << "  --tokenizer DIR   a directory holding tokenizer.json (or the file itself)\n"
                << "  " << flag
                << (std::string(flag) == "--add-special-tokens" ? "   add the tokenizer's BOS/EOS as its post-processor says\n"
                                                                 : "  leave special tokens out of the text\n");
      return a;
    } else if (args[i] == "--tokenizer") {
      STRATA_CHECK(i + 1 < args.size(), "--tokenizer needs a directory or tokenizer.json path");
      a.tokenizer = args[++i];
    } else if (args[i] == flag) {
      (std::string(flag) == "--add-special-tokens" ? a.add_special_tokens : a.skip_special_tokens) = true;
    } else {
      STRATA_CHECK(false, "unknown argument \"", args[i], "\"; usage: strata ", cmd,
                   " --tokenizer DIR [", flag, "] < input.jsonl");
    }
  }
  STRATA_CHECK(!a.tokenizer.empty(), "--tokenizer DIR is required; usage: strata ", cmd, " --tokenizer DIR [", flag,
               "] < input.jsonl");
  return a;
}

// Runs fn(json) for every non-blank stdin line; errors get the line number in front.
template <class Fn>
void tokenize_for_each_line(const char* cmd, Fn&& fn) {
  cli_for_each_stdin_line([&](const std::string& line, size_t lineno) {
    try {
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception& e) {
        STRATA_CHECK(false, "not valid JSON (", e.what(), ")");
      }
      fn(j);
    } catch (const Error& e) {
      throw Error(e.kind(), str_cat("stdin line ", lineno, ": ", e.what()));
    }
  });
}

}  // namespace

int cmd_tokenize(const std::vector<std::string>& args) {
  TokenizeArgs a = tokenize_parse_args(args, "tokenize", "--add-special-tokens");
  if (a.help) return 0;
  Tokenizer tok = Tokenizer::load(a.tokenizer);
  std::string out;
  tokenize_for_each_line("tokenize", [&](const nlohmann::json& j) {
    STRATA_CHECK(j.is_object() && j.contains("text") && j["text"].is_string(),
                 "expected an object with a string \"text\", like {\"text\": \"hello\"}");
    std::vector<int32_t> ids = tok.encode(j["text"].get_ref<const std::string&>(), a.add_special_tokens);
    out.assign("{\"ids\":[");
    char buf[16];
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i) out.push_back(',');
      out.append(buf, std::to_chars(buf, buf + sizeof(buf), ids[i]).ptr);
    }
    out.append("]}\n");
    std::cout << out;
  });
  std::cout.flush();
  STRATA_CHECK_IO(std::cout.good(), "writing to stdout failed");
  return 0;
}

int cmd_detokenize(const std::vector<std::string>& args) {
  TokenizeArgs a = tokenize_parse_args(args, "detokenize", "--skip-special-tokens");
  if (a.help) return 0;
  Tokenizer tok = Tokenizer::load(a.tokenizer);
  tokenize_for_each_line("detokenize", [&](const nlohmann::json& j) {
    STRATA_CHECK(j.is_object() && j.contains("ids") && j["ids"].is_array(),
                 "expected an object with an array \"ids\", like {\"ids\": [1, 2]}");
    std::vector<int32_t> ids;
    ids.reserve(j["ids"].size());
    for (const auto& v : j["ids"]) {
      STRATA_CHECK(v.is_number_integer(), "\"ids\" must hold integers, found ", v.dump());
      int64_t id = v.get<int64_t>();
      STRATA_CHECK(id >= 0 && id < tok.vocab_size(), "token id ", id, " is outside the vocabulary [0, ",
                   tok.vocab_size(), ")");
      ids.push_back(int32_t(id));
    }
    nlohmann::json o = {{"text", tok.decode(ids, a.skip_special_tokens)}};
    std::cout << o.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
  });
  std::cout.flush();
  STRATA_CHECK_IO(std::cout.good(), "writing to stdout failed");
  return 0;
}

}  // namespace strata
