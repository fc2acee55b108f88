// Command-line parsing shared by the strata subcommands (src/cli) and the tools (strata-bench):
// CLI11, with the exit codes of src/core/error.h. parse_args returns true when the command should
// run; otherwise *exit_code says how to leave (0 after --help, 2 on bad usage).
#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace strata {

inline bool parse_args(CLI::App& app, const std::vector<std::string>& args, int* exit_code) {
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes them reversed
  try {
    app.parse(reversed);
    return true;
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    *exit_code = rc == 0 ? 0 : 2;
    return false;
  }
}

}  // namespace strata
