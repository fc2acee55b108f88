// `strata generate --model DIR`: text from a model, streamed like training (offload/engine/generator.h).
// Standard input holds JSON lines, one request each:
//   {"prompt": "..."}        the text, encoded with the tokenizer's special tokens (e.g. BOS)
//   {"messages": [...]}      a conversation, rendered with the model's chat template and
//                            add_generation_prompt (transformers' apply_chat_template)
//   {"input_ids": [...]}     token ids as they are
// and standard output gets one line per request, in order:
//   {"text": "...", "tokens": N, "finish_reason": "stop"|"length", "ids": [...]}
// (tokens and ids: the generated tokens, without the EOS that stopped them). Every line is read
// and checked before any generation starts; requests run in batches of --batch-size. EOS ids come
// from generation_config.json when it names them, else config.json (or --eos-id). Prefill and
// decode speeds go to standard error. With --interactive, a chat instead: plain-text user turns
// in, replies printed as they come (generate_chat below).
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <unistd.h>
#include <string>

#include <nlohmann/json.hpp>

#include "io/chat_template.h"
#include "io/files.h"
#include "io/generation_text.h"
#include "io/text_encoder.h"
#include "io/tokenizer/tokenizer.h"
#include "offload/plan/run_engines.h"
#include "offload/state/model_io.h"
#include "src/core/cli_args.h"
#include "src/cli/commands.h"
#include "src/core/error.h"
#include "src/recipe/recipe.h"

namespace strata {
namespace {

// One request line as prompt token ids.
std::vector<int32_t> request_ids(const std::string& line, size_t line_no, const TextEncoder& enc) {
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(line);
  } catch (const nlohmann::json::parse_error& e) {
    STRATA_CHECK(false, "stdin line ", line_no, ": not valid JSON: ", e.what());
  }
  const int keys = int(j.is_object() && j.contains("prompt")) + int(j.is_object() && j.contains("messages")) +
                   int(j.is_object() && j.contains("input_ids"));
  STRATA_CHECK(keys == 1, "stdin line ", line_no,
               ": expected an object with one of {\"prompt\": \"...\"}, {\"messages\": [...]} or {\"input_ids\": [...]}");
  if (j.contains("prompt")) {
    STRATA_CHECK(j["prompt"].is_string(), "stdin line ", line_no, ": \"prompt\" must be a string");
    return enc.encode_text(j["prompt"].get<std::string>());
  }
  if (j.contains("messages")) {
    STRATA_CHECK(j["messages"].is_array(), "stdin line ", line_no, ": \"messages\" must be a list of {role, content}");
    std::string text;
    try {
      text = enc.chat_template().render_ordered(j["messages"], /*add_generation_prompt=*/true);
    } catch (const Error& e) {
      throw Error(e.kind(), str_cat("stdin line ", line_no, ": ", e.what()));
    }
    std::vector<std::pair<size_t, size_t>> offsets;  // unused here, filled by the encoder
    return enc.encode_chat(text, &offsets);
  }
  STRATA_CHECK(j["input_ids"].is_array(), "stdin line ", line_no, ": \"input_ids\" must be a list of token ids");
  std::vector<int32_t> ids;
  for (const auto& v : j["input_ids"]) {
    STRATA_CHECK(v.is_number_integer(), "stdin line ", line_no, ": \"input_ids\" must hold integers, found ", v.dump());
    ids.push_back(v.get<int32_t>());
  }
  return ids;
}

struct LoadedModel {
  std::unique_ptr<Device> dev;
  RunPlan plan;  // the generation run's (offload/plan/placement_plan.h: placement_generation_plan)
  std::unique_ptr<HostStore> store;
  std::unique_ptr<Generator> gen;
};

struct ModelSource {
  std::string model_dir, adapter_dir;  // adapter_dir: a PEFT LoRA adapter merged at load ("" = none)
  std::string backend = "cpu", memory = "4GiB", dtype_name = "bf16";
};

// The device, the plan of the generation run for `shape` (rows per pass lowered to fit the
// device budget), the weights-only host store it counts (no master, moments or gradients:
// nothing trains) with the adapter, when given, merged into the weights as they are read, and
// the generator the plan placed.
LoadedModel load_model(const ModelSource& src, const ModelConfig& cfg, const GeneratorShape& shape) {
  const ModelSpec spec = model_spec_build(cfg, dtype_parse(src.dtype_name));
  std::unique_ptr<LoraAdapter> adapter;
  if (!src.adapter_dir.empty()) adapter = std::make_unique<LoraAdapter>(lora_adapter_read(src.adapter_dir, spec));
  DeviceOptions dopt;
  dopt.backend = device_backend_parse(src.backend);
  dopt.memory_bytes = parse_bytes(src.memory, "--device-memory");
  LoadedModel m;
  m.dev = device_create(dopt);
  GenerationInputs in;
  in.shape = shape;
  in.device_reserved_bytes = m.dev->used_bytes() + m.dev->pending_workspace_bytes(Stream::compute);  // + cuBLAS's, on CUDA
  in.device_in_host_ram = dopt.backend == DeviceBackend::cpu;
  PlanBudgets budgets;
  budgets.device_bytes = m.dev->budget_bytes();
  budgets.device_origin = "--device-memory";
  m.plan = placement_generation_plan(spec, in, budgets);
  placement_plan_check(m.plan);
  m.store = run_plan_host_store(*m.dev, spec, m.plan);
  model_load_weights(*m.store, src.model_dir, adapter.get());
  if (adapter)
    std::fprintf(stderr, "strata generate: merged LoRA adapter %s (%zu modules, r %lld, lora_alpha %g)\n",
                 src.adapter_dir.c_str(), adapter->pairs.size(), (long long)adapter->r, adapter->lora_alpha);
  m.gen = run_plan_generator(*m.dev, *m.store, m.plan);
  return m;
}

// --interactive: a conversation. Each standard-input line is a user turn (an empty line, or
// "/reset", starts over); the whole conversation is rendered with the chat template and the
// reply is printed token by token as it comes, then kept as the assistant's turn. On a terminal
// a "> " prompt goes to stderr. A conversation longer than --max-context starts over (said).
int generate_chat(const ModelSource& src, const ModelConfig& cfg, const TextEncoder& enc, SamplingOptions so,
                  int64_t max_context) {
  STRATA_CHECK(max_context > so.max_new_tokens, "--max-context (", max_context, ") must exceed --max-new-tokens (",
               so.max_new_tokens, ")");
  LoadedModel m = load_model(src, cfg, GeneratorShape{1, max_context - so.max_new_tokens, max_context});
  Generator& gen = *m.gen;
  const bool tty = isatty(STDIN_FILENO);
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  std::string line;
  uint64_t turn = 0;
  for (;;) {
    if (tty) std::fprintf(stderr, "> "), std::fflush(stderr);
    if (!std::getline(std::cin, line)) break;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line == "/reset") {
      messages = nlohmann::ordered_json::array();
      if (tty) std::fprintf(stderr, "(a new conversation)\n");
      continue;
    }
    messages.push_back({{"role", "user"}, {"content", line}});
    std::vector<std::pair<size_t, size_t>> offsets;
    std::vector<int32_t> ids = enc.encode_chat(enc.chat_template().render_ordered(messages, true), &offsets);
    if (int64_t(ids.size()) > max_context - so.max_new_tokens) {
      std::fprintf(stderr, "strata generate: the conversation is longer than --max-context; starting over\n");
      messages = nlohmann::ordered_json::array({{{"role", "user"}, {"content", line}}});
      ids = enc.encode_chat(enc.chat_template().render_ordered(messages, true), &offsets);
      STRATA_CHECK(int64_t(ids.size()) <= max_context - so.max_new_tokens, "a turn of ", ids.size(),
                   " tokens does not fit --max-context ", max_context, " with --max-new-tokens ", so.max_new_tokens);
    }
    for (int32_t id : ids)
      STRATA_CHECK(id >= 0 && id < cfg.vocab_size, "token id ", id, " is outside the model's vocabulary [0, ",
                   cfg.vocab_size, ")", enc.is_bytes() ? " (UTF-8 bytes as ids: pass --tokenizer DIR)" : "");
    std::vector<int32_t> reply;
    std::string shown;  // the reply's text printed so far
    auto show = [&](size_t, int32_t id) {
      reply.push_back(id);
      const std::string text = decode_text(enc, reply);
      if (text.size() > shown.size() && text.compare(0, shown.size(), shown) == 0) {
        std::cout << text.substr(shown.size()) << std::flush;
        shown = text;
      }
    };
    gen.generate({ids}, so, turn++, show);
    const std::string text = decode_text(enc, reply);
    if (text.size() > shown.size() && text.compare(0, shown.size(), shown) == 0) std::cout << text.substr(shown.size());
    std::cout << std::endl;
    STRATA_CHECK_IO(std::cout.good(), "writing to standard output failed");
    messages.push_back({{"role", "assistant"}, {"content", text}});
  }
  return 0;
}

// The command line of `strata generate`.
struct GenerateArgs {
  ModelSource src;
  std::string tokenizer = "auto";
  SamplingOptions so;
  int64_t batch_size = 8;
  std::vector<int32_t> eos_override;
  bool interactive = false;
  int64_t max_context = 4096;
};

void generate_add_sampling_options(CLI::App& app, GenerateArgs& a) {
  SamplingOptions& so = a.so;
  app.add_option("--max-new-tokens", so.max_new_tokens, "most tokens generated per request (default 256)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 30));
  app.add_option("--temperature", so.temperature, "0: greedy (default); > 0: sampling")->check(CLI::Range(0.0, 1e6));
  app.add_option("--top-p", so.top_p, "sample from the smallest set of tokens whose probability reaches P (default 1)")
      ->check(CLI::Range(1e-9, 1.0));
  app.add_option("--top-k", so.top_k, "sample from the K most likely tokens (default 0: all)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 40));
  app.add_option("--seed", so.seed, "sampling seed (default 0); request i of the input draws from (seed, i)");
  app.add_option("--batch-size", a.batch_size, "requests per pass (default 8; lowered to fit the device budget)")
      ->check(CLI::Range(int64_t(1), int64_t(4096)));
  app.add_option("--eos-id", a.eos_override, "stop at this token id (repeatable; replaces the model's EOS ids)");
}

// false when the command is not to run (*exit_code: 0 after --help, 2 on bad usage)
bool generate_args_parse(const std::vector<std::string>& args, GenerateArgs& a, int* exit_code) {
  CLI::App app{"Generate text: JSON lines {\"prompt\"} / {\"messages\"} / {\"input_ids\"} on stdin -> "
               "{\"text\", \"tokens\", \"finish_reason\", \"ids\"} lines on stdout",
               "strata generate"};
  app.add_option("--model", a.src.model_dir, "Hugging Face model directory (config.json + safetensors)")->required();
  app.add_option("--adapter", a.src.adapter_dir,
                 "a PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors), merged into the "
                 "weights at load: W + lora_alpha/r * B A");
  app.add_option("--tokenizer", a.tokenizer,
                 "tokenizer directory (default: the model's tokenizer.json when it has one, else UTF-8 bytes as ids)");
  generate_add_sampling_options(app, a);
  app.add_option("--backend", a.src.backend, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--device-memory", a.src.memory, "device arena budget (default 4GiB)");
  app.add_option("--dtype", a.src.dtype_name, "dtype of the weights on the device: bf16 (default) or f32")
      ->check(CLI::IsMember({"f32", "bf16"}));
  app.add_flag("--interactive", a.interactive,
               "a chat: each stdin line is a user turn, the reply is printed as it comes (plain text, not JSON)");
  app.add_option("--max-context", a.max_context, "--interactive: tokens of conversation kept (default 4096)")
      ->check(CLI::Range(int64_t(2), int64_t(1) << 24));
  return parse_args(app, args, exit_code);
}

// Every request line of standard input as prompt ids, read and checked before anything is
// loaded; *max_prompt: the longest prompt (at least 1).
std::vector<std::vector<int32_t>> read_requests(const TextEncoder& enc, const ModelConfig& cfg, int64_t* max_prompt) {
  std::vector<std::vector<int32_t>> prompts;
  cli_for_each_stdin_line([&](const std::string& line, size_t line_no) {
    std::vector<int32_t> ids = request_ids(line, line_no, enc);
    STRATA_CHECK(!ids.empty(), "stdin line ", line_no, ": the prompt encodes to no tokens");
    for (int32_t id : ids)
      STRATA_CHECK(id >= 0 && id < cfg.vocab_size, "stdin line ", line_no, ": token id ", id,
                   " is outside the model's vocabulary [0, ", cfg.vocab_size, ")",
                   enc.is_bytes() ? " (the text was encoded as UTF-8 bytes: pass --tokenizer DIR)" : "");
    *max_prompt = std::max<int64_t>(*max_prompt, int64_t(ids.size()));
    prompts.push_back(std::move(ids));
  });
  return prompts;
}

// Prefill and decode speeds, where the weights and the KV cache were, to standard error.
void print_generate_stats(const Generator& gen, const HostStore& store, size_t requests, int64_t batch) {
  const GenerateStats& st = gen.stats();
  const size_t L = store.spec().layers.size(), kv_dev = std::min(L, gen.placement().kv_device_layers);
  const std::string kv = kv_dev == L ? std::string("on the device")
                                     : str_cat(kv_dev, " of ", L, " layers on the device, the rest in ",
                                               format_bytes(gen.kv_host_bytes()), " of host memory (",
                                               format_bytes(st.kv_h2d_bytes), " uploaded, ",
                                               format_bytes(st.kv_d2h_bytes), " written back)");
  const std::string weights =
      gen.weights_resident() ? std::string("resident")
      : gen.routed_decode()  ? str_cat("streamed (decode: ", format_bytes(st.decode_weight_bytes),
                                       " of layer weights, the MoE layers' routed experts only)")
                             : str_cat("streamed (decode: ", format_bytes(st.decode_weight_bytes), " of layer weights)");
  std::fprintf(stderr,
               "strata generate: %zu requests, batch %lld, weights %s, KV cache %s; host store %s; prefill %lld "
               "tokens in %.3f s (%.1f tokens/s), decode %lld tokens in %.3f s (%.1f tokens/s)\n",
               requests, (long long)batch, weights.c_str(), kv.c_str(),
               format_bytes(store.pinned_bytes() + store.host_bytes()).c_str(),
               (long long)st.prefill_tokens, st.prefill_s, st.prefill_s > 0 ? double(st.prefill_tokens) / st.prefill_s : 0.0,
               (long long)st.decode_tokens, st.decode_s, st.decode_s > 0 ? double(st.decode_tokens) / st.decode_s : 0.0);
}

// The requests in passes of up to batch_size rows (fewer when the device budget asks), one JSON
// line each on standard output, in order.
void generate_requests(const ModelSource& src, const ModelConfig& cfg, const TextEncoder& enc, const SamplingOptions& so,
                       const std::vector<std::vector<int32_t>>& prompts, int64_t max_prompt, int64_t batch_size) {
  GeneratorShape asked;
  asked.max_batch = std::min<int64_t>(batch_size, int64_t(prompts.size()));
  asked.max_prompt = max_prompt;
  asked.max_context = max_prompt + so.max_new_tokens;
  LoadedModel m = load_model(src, cfg, asked);  // the plan lowers the rows per pass to fit the device budget
  HostStore& store = *m.store;
  Generator& gen = *m.gen;
  const GeneratorShape& shape = m.plan.generation.shape;

  for (size_t first = 0; first < prompts.size(); first += size_t(shape.max_batch)) {
    const size_t end = std::min(prompts.size(), first + size_t(shape.max_batch));
    const std::vector<std::vector<int32_t>> batch(prompts.begin() + std::ptrdiff_t(first),
                                                  prompts.begin() + std::ptrdiff_t(end));
    const std::vector<GenerateResult> results = gen.generate(batch, so, first);
    for (const GenerateResult& r : results) {
      nlohmann::ordered_json out = {{"text", decode_text(enc, r.tokens)},
                                    {"tokens", r.tokens.size()},
                                    {"finish_reason", r.stopped ? "stop" : "length"},
                                    {"ids", r.tokens}};
      std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
    }
    std::cout.flush();
    STRATA_CHECK_IO(std::cout.good(), "writing to standard output failed");
  }
  print_generate_stats(gen, store, prompts.size(), shape.max_batch);
}

}  // namespace

int cmd_generate(const std::vector<std::string>& args) {
  GenerateArgs a;
  int rc = 0;
  if (!generate_args_parse(args, a, &rc)) return rc;
  const std::string& model_dir = a.src.model_dir;
  STRATA_CHECK(std::filesystem::is_regular_file(std::filesystem::path(model_dir) / "config.json"), "--model ", model_dir,
               " holds no config.json: pass a Hugging Face model directory (config.json + safetensors)");
  const ModelConfig cfg = hf_config_load(model_dir);
  const TextEncoder enc =
      a.tokenizer == "auto" ? TextEncoder::resolve("auto", model_dir) : TextEncoder::from_dir(a.tokenizer);
  SamplingOptions& so = a.so;
  so.eos_ids = a.eos_override.empty() ? model_eos_ids(model_dir, cfg) : a.eos_override;
  if (so.eos_ids.empty())
    std::fprintf(stderr, "strata generate: %s names no eos_token_id; every request runs to --max-new-tokens\n",
                 model_dir.c_str());
  if (a.interactive) return generate_chat(a.src, cfg, enc, so, a.max_context);

  int64_t max_prompt = 1;
  const std::vector<std::vector<int32_t>> prompts = read_requests(enc, cfg, &max_prompt);
  if (prompts.empty()) return 0;
  if (cfg.max_position_embeddings > 0 && max_prompt + so.max_new_tokens > cfg.max_position_embeddings)
    std::fprintf(stderr,
                 "strata generate: the longest prompt (%lld tokens) plus --max-new-tokens %lld passes the model's "
                 "max_position_embeddings (%lld); positions beyond it were not trained\n",
                 (long long)max_prompt, (long long)so.max_new_tokens, (long long)cfg.max_position_embeddings);
  generate_requests(a.src, cfg, enc, so, prompts, max_prompt, a.batch_size);
  return 0;
}

}  // namespace strata
