#include "src/cli/commands.h"
#include "src/core/error.h"
namespace strata {
int cmd_train(const std::vector<std::string>&) { STRATA_CHECK(false, "train: not built yet"); }
}
