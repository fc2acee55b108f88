#include "src/train/training_data.h"

#include <cstdio>

#include "io/token_shards.h"
#include "src/core/error.h"
#include "src/recipe/recipe.h"

namespace strata {

SamplesOptions samples_options(const Recipe& rc) {
  SamplesOptions o;
  o.path = rc.data_path;
  o.eval_path = rc.eval_path;
  o.eval_split = rc.eval_split;
  o.dataset.format = rc.data_format;
  o.dataset.train_on = train_on_parse(rc.train_on);
  o.dataset.sequence_len = rc.sequence_len;
  o.dataset.packing = rc.packing;
  o.dataset.drop_overlong = rc.modes.drop_overlong;
  o.dataset.skip_bad_lines = rc.skip_bad_lines;
  return o;
}

TrainingSamples training_samples_read(const Recipe& rc, const TextEncoder& encoder,
                                      const std::function<void(const DatasetProgress&)>& progress) {
  return samples_read(samples_options(rc), encoder, progress);
}

nlohmann::json prepared_fingerprint(const Recipe& rc, const TextEncoder& encoder) {
  return prepared_fingerprint(samples_options(rc), encoder);
}

TextEncoder training_encoder(const Recipe& rc, int64_t vocab_size) {
  TextEncoder enc = TextEncoder::resolve(rc.data_tokenizer, rc.model_path);
  STRATA_CHECK(enc.is_bytes() || enc.vocab_size() <= vocab_size, "the tokenizer in ", enc.dir(), " has ",
               enc.vocab_size(), " ids but the model's vocab_size is ", vocab_size,
               ": use the model's own tokenizer (data.tokenizer)");
  return enc;
}

TrainingData training_data_load(const Recipe& rc, int64_t vocab_size) {
  const TextEncoder enc = training_encoder(rc, vocab_size);
  TrainingSamples s;
  std::string source;
  if (!rc.prepared_dir.empty() && prepared_exists(rc.prepared_dir)) {
    s = prepared_read(rc.prepared_dir, samples_options(rc), enc, vocab_size);
    source = "prepared shards in " + rc.prepared_dir;
  } else {
    if (!rc.prepared_dir.empty())
      std::fprintf(stderr, "strata data: %s holds no prepared shards: tokenizing %s now (`strata prepare RECIPE.toml` "
                           "would save this work)\n", rc.prepared_dir.c_str(), rc.data_path.c_str());
    else
      std::fprintf(stderr, "strata data: tokenizing %s (set data.prepared_dir and run `strata prepare RECIPE.toml` "
                           "to do it once)\n", rc.data_path.c_str());
    s = samples_read(samples_options(rc), enc);
    training_samples_check_vocab(s, vocab_size);
    source = enc.is_bytes() ? "UTF-8 bytes" : "tokenizer " + enc.dir();
  }
  TrainingData out;
  out.tokenizer_dir = enc.dir();
  if (rc.modes.preference) {  // preference pairs, one sequence per row: nothing is packed
    STRATA_CHECK(!s.train.rejected.empty() && s.train.rejected.size() == s.train.samples.size(), "train.objective = \"",
                 rc.objective, "\" needs preference data ({prompt, chosen, rejected} records, data.format = "
                 "\"preference\"), but ", rc.data_path, " was read as ", s.train.format, "; use preference data or "
                 "train.objective = \"sft\"");
    STRATA_CHECK(s.eval.samples.empty() || s.eval.rejected.size() == s.eval.samples.size(), "the eval data (",
                 rc.eval_path.empty() ? rc.data_path : rc.eval_path, ") must be preference data too");
    out.train_chosen = std::move(s.train.samples);
    out.train_rejected = std::move(s.train.rejected);
    out.eval_chosen = std::move(s.eval.samples);
    out.eval_rejected = std::move(s.eval.rejected);
    out.report = s.report + str_cat("\nfrom ", source, ": ", out.train_chosen.size(), " train pairs",
                                    out.eval_chosen.empty() ? std::string() : str_cat(", ", out.eval_chosen.size(), " eval pairs"),
                                    " (", rc.objective, "; each sequence at most ", rc.sequence_len, " tokens)");
  } else {
    out.train = pack_samples(s.train.samples, rc.sequence_len, rc.packing);
    if (!s.eval.samples.empty()) out.eval = pack_samples(s.eval.samples, rc.sequence_len, rc.packing, true);
    out.report = s.report + str_cat("\nfrom ", source, ": ", out.train.rows(), " train rows",
                                    out.eval.rows() ? str_cat(", ", out.eval.rows(), " eval rows") : std::string(),
                                    " of ", rc.sequence_len, " tokens (packing ", rc.packing ? "on" : "off", ")");
  }
  std::string printed;
  size_t b = 0;
  while (b <= out.report.size()) {
    size_t e = out.report.find('\n', b);
    if (e == std::string::npos) e = out.report.size();
    printed += "strata data: " + out.report.substr(b, e - b) + "\n";
    b = e + 1;
  }
  std::fputs(printed.c_str(), stderr);
  return out;
}

}  // namespace strata
