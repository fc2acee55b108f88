// `strata train RECIPE.toml [section.key=value ...]`
#include <cstdio>

#include "src/core/cli_args.h"
#include "src/cli/commands.h"
#include "src/core/error.h"
#include "src/train/trainer.h"

namespace strata {

int cmd_train(const std::vector<std::string>& args) {
  CLI::App app{"Fine-tune or train a model from a recipe (recipes/README.md documents every key)",
               "strata train"};
  std::string recipe_path;
  std::vector<std::string> overrides;
  app.add_option("recipe", recipe_path, "the recipe TOML file")->required();
  app.add_option("overrides", overrides, "section.key=value overrides, e.g. train.max_steps=6");
  TrainOptions topt;
  app.add_option("--resume", topt.resume,
                 "\"auto\": continue from the newest complete checkpoint in output_dir (start fresh when there is "
                 "none); or the path of a checkpoint-<step> dir");
  app.add_flag("--overwrite", topt.overwrite,
               "start a fresh run in an output_dir that already holds one, deleting its checkpoints, metrics "
               "and final model");
  int rc = 0;
  if (!parse_args(app, args, &rc)) return rc;
  STRATA_CHECK(!(topt.overwrite && !topt.resume.empty()), "--overwrite starts over and --resume continues: "
               "give one of them");
  if (topt.resume == "auto") topt.resume_latest = true, topt.resume.clear();
  train_install_signal_handlers();  // before anything slow: a signal during set-up exits at once
  Recipe recipe = recipe_load(recipe_path, overrides);
  topt.overrides = overrides;
  TrainSummary s = train_run(recipe, topt);
  return s.interrupted ? kExitInterrupted : 0;
}

}  // namespace strata
