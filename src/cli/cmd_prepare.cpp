// `strata prepare RECIPE.toml [section.key=value ...]`: tokenizes a recipe's data once (chat
// rendering, loss masks, length policy, eval split) into binary shards in data.prepared_dir
// (io/token_shards.h), which `strata train` then reads instead of tokenizing again. Progress on
// stderr: a redrawn line on a terminal, a few plain lines otherwise.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "io/datasets.h"
#include "src/train/training_data.h"
#include "io/hf_config.h"
#include "io/token_shards.h"
#include "src/core/cli_args.h"
#include "src/cli/commands.h"
#include "src/core/error.h"
#include "src/recipe/recipe.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// The progress display: bytes read of the file, samples so far, tokens/s.
struct PrepareProgress {
  bool tty = ::isatty(2) == 1;
  Clock::time_point t0 = Clock::now(), last_draw{};
  std::string path;
  int next_quarter = 1;  // plain output: a line at 25, 50 and 75 % of each file
  bool drawn = false;

  void operator()(const DatasetProgress& p) {
    if (p.path != path) {  // a new file
      finish_line();
      path = p.path;
      next_quarter = 1;
    }
    const auto now = Clock::now();
    const double mib = 1.0 / (1 << 20), s = std::max(seconds_between(t0, now), 1e-9);
    const double frac = p.bytes_total > 0 ? double(p.bytes_read) / double(p.bytes_total) : 1.0;
    if (tty) {
      if (drawn && seconds_between(last_draw, now) < 0.1 && frac < 1.0) return;
      std::fprintf(stderr, "\rstrata prepare: %s: %.1f / %.1f MiB, %ld samples, %.0f tokens/s   ", path.c_str(),
                   double(p.bytes_read) * mib, double(p.bytes_total) * mib, long(p.samples), double(p.tokens) / s);
      drawn = true;
      last_draw = now;
    } else if (frac >= 0.25 * next_quarter && next_quarter <= 3) {
      while (next_quarter <= 3 && frac >= 0.25 * next_quarter) ++next_quarter;
      std::fprintf(stderr, "strata prepare: %s: %.0f%% (%ld samples, %.0f tokens/s)\n", path.c_str(), frac * 100,
                   long(p.samples), double(p.tokens) / s);
    }
  }
  void finish_line() {
    if (tty && drawn) std::fputc('\n', stderr);
    drawn = false;
  }
};

}  // namespace

int cmd_prepare(const std::vector<std::string>& args) {
  CLI::App app{"Tokenize a recipe's data once into binary shards in data.prepared_dir; `strata train` with the same "
               "recipe then reads them (and says when they are stale)",
               "strata prepare"};
  std::string recipe_path;
  std::vector<std::string> overrides;
  app.add_option("recipe", recipe_path, "the recipe TOML file")->required();
  app.add_option("overrides", overrides, "section.key=value overrides, e.g. data.sequence_len=512");
  int rc_code = 0;
  if (!parse_args(app, args, &rc_code)) return rc_code;
  const Recipe rc = recipe_load(recipe_path, overrides);
  STRATA_CHECK(rc.objective != "grpo", rc.source_path, ": train.objective = \"grpo\" reads its prompts from data.path "
               "when the run starts (they are not packed into rows): there is nothing to prepare; run strata train");
  STRATA_CHECK(!rc.prepared_dir.empty(), rc.source_path, ": data.prepared_dir is not set: add prepared_dir = \"DIR\" "
               "under [data], or pass data.prepared_dir=DIR");
  const ModelConfig cfg = hf_config_load(rc.model_path.empty() ? rc.model_config : rc.model_path);
  const TextEncoder enc = training_encoder(rc, cfg.vocab_size);
  const nlohmann::json fingerprint = prepared_fingerprint(rc, enc);  // before reading: a file changed meanwhile reads as stale

  const auto t0 = Clock::now();
  PrepareProgress progress;
  TrainingSamples s = training_samples_read(rc, enc, std::ref(progress));
  progress.finish_line();
  training_samples_check_vocab(s, cfg.vocab_size);
  int64_t vocab = enc.vocab_size(), samples = 0, tokens = 0;
  for (const Dataset* d : {&s.train, &s.eval})
    for (const auto* list : {&d->samples, &d->rejected})
      for (const Sample& x : *list) {
        for (int32_t id : x.ids) vocab = std::max<int64_t>(vocab, int64_t(id) + 1);
        tokens += int64_t(x.ids.size());
        ++samples;
      }
  prepared_write(rc.prepared_dir, s, fingerprint, vocab);
  const double secs = std::max(seconds_between(t0, Clock::now()), 1e-9);
  std::string lines;
  size_t b = 0;
  while (b <= s.report.size()) {
    size_t e = std::min(s.report.find('\n', b), s.report.size());
    lines += "strata prepare: " + s.report.substr(b, e - b) + "\n";
    b = e + 1;
  }
  std::fputs(lines.c_str(), stderr);
  std::fprintf(stderr, "strata prepare: wrote %ld samples, %ld tokens (token ids as uint%d) to %s in %.1f s "
                       "(%.0f samples/s, %.0f tokens/s)\n",
               long(samples), long(tokens), vocab <= 65536 ? 16 : 32, rc.prepared_dir.c_str(), secs,
               double(samples) / secs, double(tokens) / secs);
  return 0;
}

}  // namespace strata
