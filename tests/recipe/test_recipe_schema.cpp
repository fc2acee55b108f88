// The recipe schema (src/recipe/recipe_schema.cpp) against everything that must agree with it:
// recipes/README.md's key table (name, type, default), Recipe's member initialisers, the member
// each row reads into, and the effective recipe to_toml writes, which checkpoints store and a
// resumed run compares: the golden texts below are what strata wrote before the rows drove it.
#include <catch2/catch.hpp>
#include <map>
#include <sstream>
#include <string>
#include <toml++/toml.h>
#include <type_traits>
#include <variant>

#include "io/files.h"
#include "src/core/error.h"
#include "src/recipe/recipe.h"

namespace strata {
namespace {

struct ReadmeRow {
  std::string type, fallback;
  int rows = 0;
};

std::string unquoted(const std::string& cell) {  // "`\"f32\"`" -> "\"f32\""
  return cell.size() >= 2 && cell.front() == '`' && cell.back() == '`' ? cell.substr(1, cell.size() - 2) : cell;
}

// recipes/README.md's key table: "| `name` | type | default | meaning |" rows, by name.
std::map<std::string, ReadmeRow> readme_rows() {
  std::istringstream in(file_read(std::string(STRATA_SOURCE_DIR) + "/recipes/README.md", "recipes/README.md"));
  std::map<std::string, ReadmeRow> rows;
  std::string line;
  bool in_table = false;
  while (std::getline(in, line)) {
    if (line.rfind("| key | type | default |", 0) == 0) in_table = true;
    if (!in_table || line.rfind("| key ", 0) == 0 || line.rfind("|---", 0) == 0) continue;
    if (line.rfind("| `", 0) != 0) break;  // the first line after the table
    std::vector<std::string> cells;
    for (size_t at = 2, bar; cells.size() < 3 && (bar = line.find(" | ", at)) != std::string::npos; at = bar + 3)
      cells.push_back(line.substr(at, bar - at));
    REQUIRE(cells.size() == 3);
    ReadmeRow& row = rows[unquoted(cells[0])];
    row.type = cells[1];
    row.fallback = unquoted(cells[2]);
    ++row.rows;
  }
  return rows;
}

const char* kMinimal = "[model]\nconfig = \"/m/config.json\"\n[data]\npath = \"/d.txt\"\n";

std::string error_of(const std::string& text, const std::vector<std::string>& overrides) {
  try {
    recipe_parse(text, "/r/x.toml", overrides);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

const char* kLora = R"([model]
path = "/abs/base"
[data]
path = "/abs/d.jsonl"
[train]
objective = "simpo"
[lora]
r = 8
alpha = 16
dropout = 0.05
target_modules = ["q_proj", "v_proj"]
merge = true
adapter = "/abs/adapter"
)";

// What strata wrote for every_key_recipe() and kLora before the schema's rows wrote it (floats as
// `ostream <<` writes them, [preference] under a preference objective, [lora] with LoRA on).
const char* kEveryKeyToml = R"([model]
config = "/abs/m/config.json"
init_seed = 7
init_std = 0.03
dtype = "bf16"

[data]
path = "/abs/d.jsonl"
format = "messages"
tokenizer = "bytes"
sequence_len = 96
packing = false
train_on = "last"
overlong = "drop"
skip_bad_lines = true
eval_split = 0.125
eval_path = "/abs/e.jsonl"
prepared_dir = "/abs/p"

[train]
max_steps = 11
num_train_epochs = 2.5
micro_batch_size = 3
gradient_accumulation_steps = 4
global_batch_size = 12
seed = 5
log_steps = 2
eval_steps = 6
objective = "dpo"
router_aux_loss = "auto"

[preference]
beta = 0.25
gamma = 0.75

[optim]
type = "adamw"
moments_dtype = "bf16"
learning_rate = 0.0003
weight_decay = 0.01
adam_beta1 = 0.8
adam_beta2 = 0.95
adam_epsilon = 1e-06
max_grad_norm = 0.5
lr_scheduler_type = "linear"
warmup_steps = 3
warmup_ratio = 0.1
min_lr_ratio = 0.05
zo_eps = 0.002
zo_perturbations = 2

[offload]
weights = "stream"
resident_layers = 2
checkpoints = "nvme"
recompute = "always"
accumulation = "layer_major"
speculative_update = "on"
norm_pass = "off"
working_weights = "derived"
host_memory = "12GiB"
optimizer = "nvme"
nvme_path = "/abs/nvme"
nvme_memory = "100GB"

[device]
backend = "cuda"
memory = "20GiB"
cpu_threads = 6
link_bandwidth = "16GB/s"

[checkpoint]
output_dir = "/abs/out"
save_steps = 10
save_dtype = "f32"
keep_last = 2

[distributed]
backend = "mpi"
shared_host_store = false
ranks_per_node = 2
timeout = 60.5
diagnostics_steps = 4
zo = "2d"
)";

// Every key set to a value other than its default (LoRA's keys and model.path in kLora), as a user
// writes it: kEveryKeyToml's keys with two floats in exponent form and no blank lines.
// A GRPO recipe (train.objective = "grpo", data.format = "prompt") with every [grpo] key set, as
// to_toml writes it: [grpo] is written under "grpo" only, so neither recipe above holds it.
const char* kGrpoToml = R"toml([model]
config = "/abs/m/config.json"
init_seed = 0
init_std = 0.02
dtype = "f32"

[data]
path = "/abs/p.jsonl"
format = "prompt"
tokenizer = "auto"
sequence_len = 48
packing = true
train_on = "assistant"
overlong = "truncate"
skip_bad_lines = false
eval_split = 0

[train]
max_steps = 7
num_train_epochs = 1
micro_batch_size = 4
gradient_accumulation_steps = 3
global_batch_size = 0
seed = 0
log_steps = 1
eval_steps = 0
objective = "grpo"
router_aux_loss = "auto"

[grpo]
num_generations = 6
max_completion_length = 20
temperature = 0.7
top_p = 0.9
top_k = 50
beta = 0
epsilon = 0.25
epsilon_high = 0.28
num_iterations = 2
loss_type = "bnpo"
scale_rewards = "batch"
mask_truncated_completions = true
reward_funcs = ["accuracy", "format", "json", "length"]
reward_weights = [1, 0.5, 0.25, 2, 0.75]
reward_command = "python3 \"my reward.py\" --x"
reward_timeout = 12.5
answer_field = "solution"
answer_regex = "\\\\boxed\\{(\\d+)\\}"
format_regex = "^<think>.*</think>"
json_keys = ["name", "age"]
length_buffer = 5
log_completions = 3

[optim]
type = "adamw"
moments_dtype = "f32"
learning_rate = 1e-05
weight_decay = 0
adam_beta1 = 0.9
adam_beta2 = 0.999
adam_epsilon = 1e-08
max_grad_norm = 1
lr_scheduler_type = "cosine"
warmup_steps = 0
warmup_ratio = 0
min_lr_ratio = 0
zo_eps = 0.001
zo_perturbations = 1

[offload]
weights = "auto"
resident_layers = -1
checkpoints = "auto"
recompute = "auto"
accumulation = "auto"
speculative_update = "auto"
norm_pass = "auto"
working_weights = "auto"
optimizer = "auto"

[device]
backend = "cpu"
memory = "2GiB"
cpu_threads = 0

[checkpoint]
output_dir = "/abs/out"
save_steps = 0
save_dtype = "bf16"
keep_last = 0

[distributed]
backend = "auto"
shared_host_store = "auto"
ranks_per_node = 0
timeout = 300
diagnostics_steps = 0
zo = "data"
)toml";

std::string every_key_recipe() {
  std::string s = kEveryKeyToml;
  auto replace = [&s](const std::string& from, const std::string& to) {
    const size_t at = s.find(from);
    REQUIRE(at != std::string::npos);
    s.replace(at, from.size(), to);
  };
  replace("learning_rate = 0.0003", "learning_rate = 3e-4");
  replace("adam_epsilon = 1e-06", "adam_epsilon = 1e-6");
  for (size_t at; (at = s.find("\n\n")) != std::string::npos;) s.erase(at, 1);
  return s;
}

const char* kLoraToml = R"([model]
path = "/abs/base"
dtype = "f32"

[data]
path = "/abs/d.jsonl"
format = "auto"
tokenizer = "auto"
sequence_len = 256
packing = true
train_on = "assistant"
overlong = "truncate"
skip_bad_lines = false
eval_split = 0

[train]
max_steps = 0
num_train_epochs = 1
micro_batch_size = 1
gradient_accumulation_steps = 1
global_batch_size = 0
seed = 0
log_steps = 1
eval_steps = 0
objective = "simpo"
router_aux_loss = "auto"

[preference]
beta = 2
gamma = 0.5

[optim]
type = "adamw"
moments_dtype = "f32"
learning_rate = 1e-05
weight_decay = 0
adam_beta1 = 0.9
adam_beta2 = 0.999
adam_epsilon = 1e-08
max_grad_norm = 1
lr_scheduler_type = "cosine"
warmup_steps = 0
warmup_ratio = 0
min_lr_ratio = 0
zo_eps = 0.001
zo_perturbations = 1

[offload]
weights = "auto"
resident_layers = -1
checkpoints = "auto"
recompute = "auto"
accumulation = "auto"
speculative_update = "auto"
norm_pass = "auto"
working_weights = "auto"
optimizer = "auto"

[device]
backend = "cpu"
memory = "2GiB"
cpu_threads = 0

[checkpoint]
output_dir = "/r/out"
save_steps = 0
save_dtype = "bf16"
keep_last = 0

[lora]
r = 8
alpha = 16
dropout = 0.05
target_modules = ["q_proj", "v_proj"]
target_parameters = []
merge = true
adapter = "/abs/adapter"
base_dtype = "auto"
double_quant = true

[distributed]
backend = "auto"
shared_host_store = "auto"
ranks_per_node = 0
timeout = 300
diagnostics_steps = 0
zo = "data"
)";

}  // namespace

TEST_CASE("recipes/README.md has one row per schema key, with its type and default, and no other row", "[recipe]") {
  const std::map<std::string, ReadmeRow> rows = readme_rows();
  REQUIRE(rows.size() >= 10);  // the table was found
  for (const RecipeKey& k : recipe_schema()) {
    INFO(k.name);
    auto it = rows.find(k.name);
    REQUIRE(it != rows.end());
    CHECK(it->second.rows == 1);
    CHECK(it->second.type == k.type);
    if (*k.fallback) {
      CHECK(it->second.fallback == k.fallback);
    } else {  // unset: the README says so, or that the key is required
      CHECK((it->second.fallback == "unset" || it->second.fallback == "—" || it->second.fallback == "required"));
    }
  }
  for (const auto& [name, row] : rows) {
    INFO(name << " is in recipes/README.md but not in the schema");
    bool in_schema = false;
    for (const RecipeKey& k : recipe_schema()) in_schema |= name == k.name;
    CHECK(in_schema);
  }
}

TEST_CASE("every schema default is one TOML value of its key's type and is what Recipe's members start at", "[recipe]") {
  const Recipe fresh;
  const Recipe read = recipe_parse(kMinimal, "/r/x.toml", {});
  for (const RecipeKey& k : recipe_schema()) {
    INFO(k.name << " = " << k.fallback);
    const std::string type = k.type;
    std::visit([&](auto member) {
      using T = std::remove_cvref_t<decltype(fresh.*member)>;
      CHECK(type == (std::is_same_v<T, int64_t> ? "int" : std::is_same_v<T, double> ? "float"
                     : std::is_same_v<T, bool> ? "bool" : std::is_same_v<T, std::string> ? type : "list"));
      if (std::is_same_v<T, std::string>) CHECK((type == "string" || type == "path" || type == "size"));
      if (std::string(k.name) == "preference.beta" || std::string(k.name) == "grpo.epsilon_high") return;  // decided by another key
      if (!*k.fallback) {  // unset: an empty string
        CHECK((std::is_same_v<T, std::string> && fresh.*member == T{}));
        return;
      }
      toml::table one;
      REQUIRE_NOTHROW(one = toml::parse(std::string("v = ") + k.fallback));
      const toml::node& v = *one["v"].node();
      CHECK((std::is_same_v<T, int64_t> ? v.is_integer() : std::is_same_v<T, double> ? v.is_number()
             : std::is_same_v<T, bool> ? v.is_boolean() : std::is_same_v<T, std::string> ? v.is_string() : v.is_array()));
      if (type != "path") CHECK(read.*member == fresh.*member);  // paths are made absolute
    }, k.field);
  }
  CHECK(read.output_dir == "/r/out");  // checkpoint.output_dir's default, made absolute
}

TEST_CASE("preference.beta's default follows train.objective unless the recipe sets it", "[recipe]") {
  for (const char* objective : {"sft", "dpo", "ipo", "orpo"})
    CHECK(recipe_parse(kMinimal, "/r/x.toml", {std::string("train.objective=") + objective}).preference_beta == 0.1);
  CHECK(recipe_parse(kMinimal, "/r/x.toml", {"train.objective=simpo"}).preference_beta == 2.0);
  CHECK(recipe_parse(kMinimal, "/r/x.toml", {"train.objective=simpo", "preference.beta=0.5"}).preference_beta == 0.5);
}

TEST_CASE("to_toml writes the effective recipe byte for byte as checkpoints stored it, and reads back", "[recipe]") {
  const std::string every = recipe_parse(every_key_recipe(), "/r/x.toml", {}).to_toml();
  const std::string lora = recipe_parse(kLora, "/r/x.toml", {}).to_toml();
  CHECK(every == kEveryKeyToml);
  CHECK(lora == kLoraToml);
  CHECK(recipe_parse(every, "/elsewhere/y.toml", {}).to_toml() == every);
  CHECK(recipe_parse(lora, "/elsewhere/y.toml", {}).to_toml() == lora);
  const std::string grpo = recipe_parse(kGrpoToml, "/r/x.toml", {}).to_toml();
  CHECK(grpo == kGrpoToml);
  CHECK(recipe_parse(grpo, "/elsewhere/y.toml", {}).to_toml() == grpo);
  for (const RecipeKey& k : recipe_schema()) {  // the two recipes cover every key: a new one joins them
    INFO(k.name << " is set by neither test recipe");
    const std::string name = k.name, section = "[" + name.substr(0, name.find('.')) + "]\n";
    const std::string line = "\n" + name.substr(name.find('.') + 1) + " = ";
    auto written = [&](const std::string& toml) {
      size_t at = toml.find(section), end = toml.find("\n[", at);
      return at != std::string::npos && toml.substr(at, end - at).find(line) != std::string::npos;
    };
    CHECK((written(every) || written(lora) || written(grpo)));
  }
  // sft leaves [preference] out; model.path without model.config leaves init_seed and init_std out
  const std::string plain = recipe_parse("[model]\npath = \"/m\"\n[data]\npath = \"/d.txt\"\n", "/r/x.toml", {}).to_toml();
  CHECK(plain.find("[preference]") == std::string::npos);
  CHECK(plain.find("init_seed") == std::string::npos);
  CHECK(plain.find("[lora]") == std::string::npos);
}

TEST_CASE("every key lands in its own Recipe member", "[recipe]") {
  const Recipe r = recipe_parse(every_key_recipe(), "/r/x.toml", {});
  CHECK(r.model_config == "/abs/m/config.json");
  CHECK(r.model_init_seed == 7);
  CHECK(r.model_init_std == 0.03);
  CHECK(r.model_dtype == "bf16");
  CHECK(r.data_path == "/abs/d.jsonl");
  CHECK(r.data_format == "messages");
  CHECK(r.data_tokenizer == "bytes");
  CHECK(r.sequence_len == 96);
  CHECK_FALSE(r.packing);
  CHECK(r.train_on == "last");
  CHECK(r.overlong == "drop");
  CHECK(r.skip_bad_lines);
  CHECK(r.eval_split == 0.125);
  CHECK(r.eval_path == "/abs/e.jsonl");
  CHECK(r.prepared_dir == "/abs/p");
  CHECK(r.max_steps == 11);
  CHECK(r.num_train_epochs == 2.5);
  CHECK(r.micro_batch_size == 3);
  CHECK(r.gradient_accumulation_steps == 4);
  CHECK(r.seed == 5);
  CHECK(r.log_steps == 2);
  CHECK(r.eval_steps == 6);
  CHECK(r.objective == "dpo");
  CHECK(r.preference_beta == 0.25);
  CHECK(r.preference_gamma == 0.75);
  CHECK(r.optim_type == "adamw");
  CHECK(r.moments_dtype == "bf16");
  CHECK(r.learning_rate == 3e-4);
  CHECK(r.weight_decay == 0.01);
  CHECK(r.adam_beta1 == 0.8);
  CHECK(r.adam_beta2 == 0.95);
  CHECK(r.adam_epsilon == 1e-6);
  CHECK(r.max_grad_norm == 0.5);
  CHECK(r.max_grad_norm_set);
  CHECK(r.lr_scheduler_type == "linear");
  CHECK(r.warmup_steps == 3);
  CHECK(r.warmup_ratio == 0.1);
  CHECK(r.min_lr_ratio == 0.05);
  CHECK(r.zo_eps == 0.002);
  CHECK(r.zo_perturbations == 2);
  CHECK(r.offload_weights == "stream");
  CHECK(r.offload_checkpoints == "nvme");
  CHECK(r.offload_recompute == "always");
  CHECK(r.offload_accumulation == "layer_major");
  CHECK(r.host_memory == "12GiB");
  CHECK(r.host_memory_bytes == (size_t(12) << 30));
  CHECK(r.offload_optimizer == "nvme");
  CHECK(r.nvme_path == "/abs/nvme");
  CHECK(r.nvme_memory == "100GB");
  CHECK(r.nvme_memory_bytes == size_t(100e9));
  CHECK(r.device_backend == "cuda");
  CHECK(r.device_memory == "20GiB");
  CHECK(r.device_memory_bytes == (size_t(20) << 30));
  CHECK(r.device_cpu_threads == 6);
  CHECK(r.device_link_bandwidth == "16GB/s");
  CHECK(r.device_link_bytes_per_s == 16e9);
  CHECK(r.output_dir == "/abs/out");
  CHECK(r.save_steps == 10);
  CHECK(r.save_dtype == "f32");
  CHECK(r.keep_last == 2);
  CHECK_FALSE(r.lora_enabled);
  CHECK(r.distributed_backend == "mpi");
  CHECK(r.distributed_shared_host_store == "false");
  CHECK(r.distributed_ranks_per_node == 2);
  CHECK(r.distributed_timeout_s == 60.5);
  CHECK(r.distributed_diagnostics_steps == 4);
  CHECK(r.distributed_zo == "2d");

  const Recipe l = recipe_parse(kLora, "/r/x.toml", {});
  CHECK(l.model_path == "/abs/base");
  CHECK(l.lora_enabled);
  CHECK(l.lora_r == 8);
  CHECK(l.lora_alpha == 16);
  CHECK(l.lora_dropout == 0.05);
  CHECK(l.lora_target_modules == std::vector<std::string>{"q_proj", "v_proj"});
  CHECK(l.lora_merge);
  CHECK(l.lora_adapter == "/abs/adapter");
  CHECK_FALSE(l.max_grad_norm_set);
  CHECK(l.nvme_memory_bytes == 0);  // unset sizes stay 0
  CHECK(l.device_link_bytes_per_s == 0);
}

TEST_CASE("every key of the grpo table lands in its own Recipe member", "[recipe][grpo]") {
  const Recipe r = recipe_parse(kGrpoToml, "/r/x.toml", {});
  CHECK(r.objective == "grpo");
  CHECK_FALSE(r.modes.preference.has_value());
  CHECK(r.data_format == "prompt");
  CHECK(r.grpo_num_generations == 6);
  CHECK(r.grpo_max_completion_length == 20);
  CHECK(r.grpo_temperature == 0.7);
  CHECK(r.grpo_top_p == 0.9);
  CHECK(r.grpo_top_k == 50);
  CHECK(r.grpo_beta == 0);
  CHECK(r.grpo_epsilon == 0.25);
  CHECK(r.grpo_epsilon_high == 0.28);
  CHECK(r.grpo_num_iterations == 2);
  CHECK(r.grpo_loss_type == "bnpo");
  CHECK(r.grpo_scale_rewards == "batch");
  CHECK(r.grpo_mask_truncated_completions);
  CHECK(r.grpo_reward_funcs == std::vector<std::string>{"accuracy", "format", "json", "length"});
  CHECK(r.grpo_reward_weights == std::vector<double>{1, 0.5, 0.25, 2, 0.75});
  CHECK(r.grpo_reward_command == "python3 \"my reward.py\" --x");
  CHECK(r.grpo_reward_timeout == 12.5);
  CHECK(r.grpo_answer_field == "solution");
  CHECK(r.grpo_answer_regex == "\\\\boxed\\{(\\d+)\\}");
  CHECK(r.grpo_format_regex == "^<think>.*</think>");
  CHECK(r.grpo_json_keys == std::vector<std::string>{"name", "age"});
  CHECK(r.grpo_length_buffer == 5);
  CHECK(r.grpo_log_completions == 3);
}

TEST_CASE("every key refuses a value of another type, naming the key and its row's type", "[recipe]") {
  for (const RecipeKey& k : recipe_schema()) {
    INFO(k.name);
    const std::string type = k.type, name = k.name;
    const bool text = type == "string" || type == "path" || type == "size";
    const std::string wrong = text || type == "list" ? "1" : "\"x\"";
    const std::string want = text ? " must be a string (in quotes)"
                             : type == "int"   ? " must be an integer"
                             : type == "float" ? " must be a number"
                             : type == "bool"  ? " must be true or false"
                             : std::holds_alternative<std::vector<double> Recipe::*>(k.field)
                                               ? " must be a list of numbers"
                                               : " must be a list of strings";
    CHECK_THAT(error_of(kMinimal, {name + "=" + wrong}), Catch::StartsWith("command line: " + name + want));
  }
}

TEST_CASE("a key written under another section suggests itself", "[recipe]") {
  std::map<std::string, int> bare_count;
  std::vector<std::string> sections;
  for (const RecipeKey& k : recipe_schema()) {
    const std::string name = k.name, section = name.substr(0, name.find('.'));
    ++bare_count[name.substr(name.find('.') + 1)];
    if (sections.empty() || sections.back() != section) sections.push_back(section);
  }
  for (const RecipeKey& k : recipe_schema()) {
    const std::string name = k.name, bare = name.substr(name.find('.') + 1);
    if (bare_count[bare] > 1) continue;  // model.path or data.path: either would do
    for (const std::string& section : sections) {
      const std::string written = section + "." + bare;
      bool near_another = false;  // one letter from a key of that section (model.type: model.dtype)
      for (const RecipeKey& other : recipe_schema()) near_another |= edit_distance(written, other.name) <= 1;
      if (written == name || near_another) continue;
      INFO(written);
      CHECK_THAT(error_of(kMinimal, {written + "=1"}), Catch::Contains("did you mean '" + name + "'"));
    }
  }
}

TEST_CASE("a mode key's bad value names its place, every valid spelling and what was written", "[recipe]") {
  // one table per mode (offload/modes.h, src/recipe/recipe_modes.h) writes the message; the file's
  // place for a key in the recipe, "command line" for an override
  CHECK(error_of(std::string(kMinimal) + "[offload]\nweights = \"resident\"\n", {}) ==
        "/r/x.toml: offload.weights must be \"auto\", \"stream\" or \"device\" (not \"resident\")");
  CHECK(error_of(kMinimal, {"offload.accumulation=by_layer"}) ==
        "command line: offload.accumulation must be \"auto\", \"layer_major\" or \"micro_batch\" (not \"by_layer\")");
  // TOML booleans are written unquoted
  CHECK(error_of(kMinimal, {"distributed.shared_host_store=maybe"}) ==
        "command line: distributed.shared_host_store must be \"auto\", true or false (not \"maybe\")");
  // "single" is the launcher's backend, not a recipe value
  CHECK(error_of(kMinimal, {"distributed.backend=single"}) ==
        "command line: distributed.backend must be \"auto\", \"nccl\" or \"mpi\"");
  // and a good value arrives typed
  const Recipe r = recipe_parse(kMinimal, "/r/x.toml", {"offload.accumulation=layer_major", "optim.type=zo-sgd"});
  CHECK(r.modes.accumulation == AccumulationMode::layer_major);
  CHECK(r.modes.optimizer == OptimizerKind::zo_sgd);
  CHECK(mode_name(r.modes.accumulation) == std::string("layer_major"));
}

}  // namespace strata
