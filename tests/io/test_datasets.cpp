// Datasets: packing with masks on hand-worked samples, chat loss masks (byte tokenizer with the
// built-in ChatML, and the real Qwen3 tokenizer and template, whose earlier turns change once
// later turns follow), format detection, the bad-input corpus, the length policy, the eval split,
// and the trainer's entry point.
#include <omp.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "io/chat_template.h"
#include "io/datasets.h"
#include "src/train/training_data.h"
#include "io/tokenizer/tokenizer.h"
#include "src/core/error.h"
#include "src/recipe/recipe.h"
#include "tests/testing.h"

using namespace strata;
namespace fs = std::filesystem;

namespace {

const std::string kFixtures = STRATA_SOURCE_DIR "/tests/fixtures/datasets/";
const std::string kQwen3 = strata::testing::tokenizer_fixture("bpe-qwen3");
const std::string kTinyModel = STRATA_SOURCE_DIR "/recipes/sft-tiny/models/tiny";

using testing::TempDir;

// chat.jsonl (`jsonl`) in a temp dir beside the tiny model's tokenizer with a tokenizer_config.json
// of its own: `eos` and a chat template.
struct TemplatedChat {
  TempDir dir;
  TextEncoder enc;
  std::string path;
  TemplatedChat(const std::string& name, const std::string& eos, const std::string& chat_template,
                const std::string& jsonl)
      : dir(name), enc(encoder_in(dir, eos, chat_template)), path(dir.file("chat.jsonl", jsonl)) {}

  static TextEncoder encoder_in(const TempDir& dir, const std::string& eos, const std::string& chat_template) {
    fs::copy_file(kTinyModel + "/tokenizer.json", dir.path / "tokenizer.json");
    const nlohmann::json cfg = {{"eos_token", eos}, {"chat_template", chat_template}};
    std::ofstream(dir.path / "tokenizer_config.json") << cfg.dump();
    return TextEncoder::from_dir(dir.path.string());
  }
};

DatasetOptions options(const std::string& format = "auto", TrainOn on = TrainOn::assistant, int64_t T = 256) {
  DatasetOptions o;
  o.format = format;
  o.train_on = on;
  o.sequence_len = T;
  return o;
}

using testing::contains;
using testing::error_of;

// The labelled tokens decoded run by run (a run: consecutive labelled tokens), concatenated.
std::string labelled_text(const Tokenizer& tok, const Sample& s) {
  std::string out;
  std::vector<int32_t> run;
  for (size_t i = 0; i <= s.ids.size(); ++i) {
    if (i < s.ids.size() && s.labels[i]) {
      run.push_back(s.ids[i]);
    } else if (!run.empty()) {
      out += tok.decode(run);
      run.clear();
    }
  }
  return out;
}

std::string labelled_bytes(const Sample& s) {
  std::string out;
  for (size_t i = 0; i < s.ids.size(); ++i)
    if (s.labels[i]) out += char(s.ids[i]);
  return out;
}

Sample make_sample(std::vector<int32_t> ids, std::vector<uint8_t> labels, bool may_split = false) {
  Sample s;
  s.ids = std::move(ids);
  s.labels = std::move(labels);
  s.may_split = may_split;
  return s;
}

const std::string kChatML_hi_yo = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n";

}  // namespace

TEST_CASE("pack_samples: chat samples first-fit with padding, targets only on labelled next tokens", "[datasets]") {
  // A: 1 2 3 (2, 3 trained); B: 4 5 6 7 (6, 7 trained); C: 8 9 (9 trained). T = 5.
  std::vector<Sample> s = {make_sample({1, 2, 3}, {0, 1, 1}), make_sample({4, 5, 6, 7}, {0, 0, 1, 1}),
                           make_sample({8, 9}, {0, 1})};
  TokenRows r = pack_samples(s, 5, true);
  REQUIRE(r.rows() == 3);  // B does not fit after A (2 left): padding, then B; C likewise
  CHECK(r.ids == std::vector<int32_t>{1, 2, 3, 0, 0, 4, 5, 6, 7, 0, 8, 9, 0, 0, 0});
  CHECK(r.targets == std::vector<int32_t>{2, 3, -100, -100, -100, -100, 6, 7, -100, -100, 9, -100, -100, -100, -100});
  CHECK(r.pos == std::vector<int32_t>{0, 1, 2, 0, 1, 0, 1, 2, 3, 0, 0, 1, 0, 1, 2});
  CHECK(r.doc_start == std::vector<int32_t>{0, 0, 0, 3, 3, 0, 0, 0, 0, 4, 0, 0, 2, 2, 2});

  // two that fit share a row: A (3) + C (2) = 5
  TokenRows two = pack_samples({s[0], s[2]}, 5, true);
  REQUIRE(two.rows() == 1);
  CHECK(two.ids == std::vector<int32_t>{1, 2, 3, 8, 9});
  CHECK(two.targets == std::vector<int32_t>{2, 3, -100, 9, -100});
  CHECK(two.pos == std::vector<int32_t>{0, 1, 2, 0, 1});
  CHECK(two.doc_start == std::vector<int32_t>{0, 0, 0, 3, 3});

  // without packing: one sample per row, padded
  TokenRows u = pack_samples(s, 5, false);
  REQUIRE(u.rows() == 3);
  CHECK(u.ids == std::vector<int32_t>{1, 2, 3, 0, 0, 4, 5, 6, 7, 0, 8, 9, 0, 0, 0});
  CHECK(u.targets == r.targets);
  CHECK(u.pos == r.pos);
  CHECK(u.doc_start == r.doc_start);

  // a chat sample longer than T is cut, never split
  TokenRows cut = pack_samples({make_sample({1, 2, 3, 4, 5, 6, 7}, {0, 1, 1, 1, 1, 1, 1})}, 4, true);
  REQUIRE(cut.rows() == 1);
  CHECK(cut.ids == std::vector<int32_t>{1, 2, 3, 4});
  CHECK(cut.targets == std::vector<int32_t>{2, 3, 4, -100});
}

TEST_CASE("pack_samples: pretraining text continues across rows, pad_last_row keeps the tail", "[datasets]") {
  std::vector<Sample> docs = {sample_from_document({1, 2, 3}), sample_from_document({4, 5}),
                              sample_from_document({6, 7, 8, 9, 10})};
  TokenRows r = pack_samples(docs, 4, true);
  REQUIRE(r.rows() == 2);
  CHECK(r.ids == std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8});
  CHECK(r.targets == std::vector<int32_t>{2, 3, -100, -100, -100, 7, 8, -100});
  CHECK(r.pos == std::vector<int32_t>{0, 1, 2, 0, 0, 0, 1, 2});
  CHECK(r.doc_start == std::vector<int32_t>{0, 0, 0, 3, 0, 1, 1, 1});
  TokenRows p = pack_samples(docs, 4, true, true);
  REQUIRE(p.rows() == 3);
  CHECK(std::vector<int32_t>(p.ids.begin() + 8, p.ids.end()) == std::vector<int32_t>{9, 10, 0, 0});
  CHECK(std::vector<int32_t>(p.targets.begin() + 8, p.targets.end()) == std::vector<int32_t>{10, -100, -100, -100});
  CHECK(std::vector<int32_t>(p.pos.begin() + 8, p.pos.end()) == std::vector<int32_t>{0, 1, 0, 1});
  CHECK(std::vector<int32_t>(p.doc_start.begin() + 8, p.doc_start.end()) == std::vector<int32_t>{0, 0, 2, 2});
  // the old entry point is the same packer
  std::vector<Document> plain = {{1, 2, 3}, {4, 5}, {6, 7, 8, 9, 10}};
  TokenRows d = pack_documents(plain, 4, true);
  CHECK(d.ids == r.ids);
  CHECK(d.targets == r.targets);
}

TEST_CASE("chat masks with the byte tokenizer and built-in ChatML: exactly the assistant turns", "[datasets]") {
  TempDir dir("datasets_bytes");
  const std::string path = dir.file(
      "chat.jsonl",
      R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})"
      "\n"
      R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]})"
      "\n");
  TextEncoder enc = TextEncoder::bytes();
  Dataset d = dataset_read(path, options(), enc);
  REQUIRE(d.format == "messages");
  REQUIRE(d.samples.size() == 2);
  const Sample& s = d.samples[0];
  REQUIRE(s.ids.size() == kChatML_hi_yo.size());
  const size_t start = kChatML_hi_yo.find("yo");
  for (size_t i = 0; i < s.ids.size(); ++i) {
    CHECK(s.ids[i] == int32_t(static_cast<unsigned char>(kChatML_hi_yo[i])));
    CHECK(int(s.labels[i]) == int(i >= start));
  }
  CHECK(!s.may_split);
  CHECK(labelled_bytes(d.samples[1]) == "b<|im_end|>\nd<|im_end|>\n");
  CHECK(d.stats.samples == 2);
  CHECK(d.stats.labelled == int64_t(std::string("yo<|im_end|>\n").size() + labelled_bytes(d.samples[1]).size()));

  Dataset last = dataset_read(path, options("auto", TrainOn::last), enc);
  CHECK(labelled_bytes(last.samples[1]) == "d<|im_end|>\n");
  Dataset all = dataset_read(path, options("auto", TrainOn::all), enc);
  CHECK(labelled_bytes(all.samples[0]) == kChatML_hi_yo.substr(1));  // all but the first token

  // hand-worked rows: T = 70 holds one sample (55 bytes) and padding
  TokenRows rows = pack_samples({s}, 70, true);
  REQUIRE(rows.rows() == 1);
  for (size_t n = 0; n < 70; ++n) {
    INFO("column " << n);
    const bool in_sample = n < s.ids.size();
    CHECK(rows.ids[n] == (in_sample ? s.ids[n] : 0));
    const int32_t want = n + 1 < s.ids.size() && s.labels[n + 1] ? s.ids[n + 1] : -100;
    CHECK(rows.targets[n] == want);
    CHECK(rows.pos[n] == int32_t(in_sample ? n : n - s.ids.size()));
    CHECK(rows.doc_start[n] == int32_t(in_sample ? 0 : s.ids.size()));
  }
}

TEST_CASE("chat masks with the real Qwen3 tokenizer and template, multi-turn, train_on all / last / assistant",
          "[datasets]") {
  REQUIRE(fs::exists(kQwen3 + "/tokenizer.json"));
  TextEncoder enc = TextEncoder::from_dir(kQwen3);
  REQUIRE(!enc.chat_template_is_builtin());
  // The first answer carries reasoning: as the last turn Qwen3 renders it inside <think>, once a
  // later turn follows the template drops it, so prefix renders do not line up with the full one.
  nlohmann::json conv = {{"messages",
                          {{{"role", "system"}, {"content", "You are terse."}},
                           {{"role", "user"}, {"content", "Hi there"}},
                           {{"role", "assistant"}, {"content", "<think>\ngreet back\n</think>\n\nHello! How can I help?"}},
                           {{"role", "user"}, {"content", "What is 2+2?"}},
                           {{"role", "assistant"}, {"content", "It is 4."}}}}};
  nlohmann::json plain = {{"messages",
                           {{{"role", "user"}, {"content", "One"}},
                            {{"role", "assistant"}, {"content", "First answer."}},
                            {{"role", "user"}, {"content", "Two"}},
                            {{"role", "assistant"}, {"content", "Second answer."}},
                            {{"role", "user"}, {"content", "Three"}},
                            {{"role", "assistant"}, {"content", "Third answer."}}}}};
  TempDir dir("datasets_qwen3");
  const std::string path = dir.file("chat.jsonl", conv.dump() + "\n" + plain.dump() + "\n");
  const Tokenizer& tok = *enc.tokenizer();

  Dataset d = dataset_read(path, options(), enc);
  REQUIRE(d.samples.size() == 2);
  const std::string full =
      "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
      "Hello! How can I help?<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
      "<think>\n\n</think>\n\nIt is 4.<|im_end|>\n";
  CHECK(d.samples[0].ids == tok.encode(full, false));  // the render, tokenized without added special tokens
  CHECK(labelled_text(tok, d.samples[0]) ==
        "Hello! How can I help?<|im_end|>\n<think>\n\n</think>\n\nIt is 4.<|im_end|>\n");
  CHECK(labelled_text(tok, d.samples[1]) ==
        "First answer.<|im_end|>\nSecond answer.<|im_end|>\n<think>\n\n</think>\n\nThird answer.<|im_end|>\n");

  Dataset last = dataset_read(path, options("auto", TrainOn::last), enc);
  CHECK(labelled_text(tok, last.samples[0]) == "<think>\n\n</think>\n\nIt is 4.<|im_end|>\n");
  CHECK(labelled_text(tok, last.samples[1]) == "<think>\n\n</think>\n\nThird answer.<|im_end|>\n");

  Dataset all = dataset_read(path, options("auto", TrainOn::all), enc);
  std::vector<int32_t> ids = tok.encode(full, false);
  CHECK(labelled_text(tok, all.samples[0]) == tok.decode(std::vector<int32_t>(ids.begin() + 1, ids.end())));
}

TEST_CASE("chat masks: every bundled real template yields one span per assistant turn, holding its answer",
          "[datasets]") {
  const fs::path dir = fs::path(STRATA_SOURCE_DIR) / "tests/fixtures/chat/templates";
  nlohmann::ordered_json msgs = nlohmann::ordered_json::parse(
      R"([{"role":"user","content":"What is 2+2?"},{"role":"assistant","content":"It is 4."},)"
      R"({"role":"user","content":"And 3+3?"},{"role":"assistant","content":"Six, of course."}])");
  int checked = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".jinja") continue;
    INFO(entry.path().filename().string());
    ChatTemplate t = ChatTemplate::from_string(testing::read_file(entry.path()), "<s>", "</s>");
    if (entry.path().filename() == "syntax-coverage.jinja") {
      // not a chat template: its header counts the messages, so no prefix of it lines up; an error, not a guess
      CHECK(contains(error_of([&] { chat_render_spans(t, msgs, nullptr, TrainOn::assistant, 0); }),
                     "cannot locate assistant message 1"));
      continue;
    }
    ChatRender r = chat_render_spans(t, msgs, nullptr, TrainOn::assistant, 0);
    REQUIRE(r.assistant_spans.size() == 2);
    const TurnSpan& s0 = r.assistant_spans[0];
    const TurnSpan& s1 = r.assistant_spans[1];
    const std::string a = r.text.substr(s0.begin, s0.end - s0.begin), b = r.text.substr(s1.begin, s1.end - s1.begin);
    INFO("spans: [" << a << "] [" << b << "]");
    CHECK(contains(a, "It is 4."));
    CHECK(!contains(a, "3+3"));
    CHECK(contains(b, "Six, of course."));
    CHECK(s1.end == r.text.size());  // the last turn runs to the end of the render
    ++checked;
  }
  CHECK(checked >= 8);
}

TEST_CASE("chat masks: a template that ends only the whole conversation with an EOS (Phi-3 style)", "[datasets]") {
  // Rendered as the last turn, an answer is followed by <|endoftext|>; mid-conversation by the
  // next <|im_start|>, which shares its first two characters: that token must not be trained.
  const TemplatedChat chat(
      "datasets_eos_at_end", "<|endoftext|>",
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
      "{% if add_generation_prompt %}<|im_start|>assistant\n{% else %}{{ eos_token }}{% endif %}",
      R"({"messages": [{"role": "user", "content": "Say cat 2 times."}, {"role": "assistant", "content": "cat cat"}, {"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "2 + 2 = 4."}]})"
      "\n");
  Dataset d = dataset_read(chat.path, options(), chat.enc);
  REQUIRE(d.samples.size() == 1);
  CHECK(labelled_text(*chat.enc.tokenizer(), d.samples[0]) == "cat cat<|im_end|>\n2 + 2 = 4.<|im_end|>\n<|endoftext|>");
}

TEST_CASE("chat masks: the span algorithm on its own", "[datasets]") {
  // tokens straddling a span edge are labelled; zero-width tokens only inside
  std::vector<ByteSpan> offsets = {{0, 2}, {2, 5}, {5, 6}, {6, 9}, {9, 9}, {9, 12}};
  CHECK(chat_labels_from_spans(offsets, {{4, 6}}) == std::vector<uint8_t>{0, 1, 1, 0, 0, 0});
  CHECK(chat_labels_from_spans(offsets, {{0, 2}, {9, 12}}) == std::vector<uint8_t>{0, 0, 0, 0, 1, 1});
  CHECK(chat_labels_from_spans(offsets, {}) == std::vector<uint8_t>(6, 0));
  // a template that rewrites an earlier turn beyond recognition cannot be masked: an error, not a guess
  ChatTemplate t = ChatTemplate::from_string(
      "{% for m in messages %}{% if m.role == 'assistant' and not loop.last %}[gone]{% else %}"
      "<{{ m.role }}>{{ m.content }}</>{% endif %}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}",
      "", "");
  nlohmann::ordered_json msgs = nlohmann::ordered_json::parse(
      R"([{"role":"user","content":"q"},{"role":"assistant","content":"a"},{"role":"user","content":"r"},{"role":"assistant","content":"b"}])");
  CHECK(contains(error_of([&] { chat_render_spans(t, msgs, nullptr, TrainOn::assistant, 0); }),
                 "cannot locate assistant message 1"));
  ChatRender last = chat_render_spans(t, msgs, nullptr, TrainOn::last, 0);
  CHECK(last.text == "<user>q</>[gone]<user>r</><assistant>b</>");
  REQUIRE(last.assistant_spans.size() == 1);
  CHECK(last.text.substr(last.assistant_spans[0].begin) == "b</>");
}

TEST_CASE("dataset formats: auto-detection, and the same chats in every format tokenize the same", "[datasets]") {
  TextEncoder enc = TextEncoder::from_dir(kTinyModel);
  CHECK(dataset_detect_format(kFixtures + "formats/alpaca.jsonl", false) == "alpaca");
  CHECK(dataset_detect_format(kFixtures + "formats/sharegpt.jsonl", false) == "sharegpt");
  CHECK(dataset_detect_format(kFixtures + "formats/messages.jsonl", false) == "messages");
  CHECK(dataset_detect_format(kFixtures + "formats/preference.jsonl", false) == "preference");
  CHECK(dataset_detect_format(kFixtures + "formats/text.jsonl", false) == "jsonl");
  CHECK(dataset_detect_format("x.txt", false) == "text");
  CHECK(dataset_detect_format("x.json", false) == "tokens");

  Dataset m = dataset_read(kFixtures + "formats/messages.jsonl", options(), enc);
  REQUIRE(m.samples.size() == 2);
  for (const char* f : {"alpaca", "sharegpt", "preference"}) {
    INFO(f);
    Dataset d = dataset_read(kFixtures + "formats/" + f + ".jsonl", options(), enc);
    CHECK(d.format == f);
    REQUIRE(d.samples.size() == 2);
    for (size_t i = 0; i < 2; ++i) {
      CHECK(d.samples[i].ids == m.samples[i].ids);
      CHECK(d.samples[i].labels == m.samples[i].labels);
    }
  }
  // the rejected side: same prompt, the other answer
  Dataset p = dataset_read(kFixtures + "formats/preference.jsonl", options(), enc);
  REQUIRE(p.rejected.size() == 2);
  CHECK(labelled_text(*enc.tokenizer(), p.samples[0]) == "5<|im_end|>\n");
  CHECK(labelled_text(*enc.tokenizer(), p.rejected[0]) == "6<|im_end|>\n");
  CHECK(labelled_text(*enc.tokenizer(), p.rejected[1]) == "dog<|im_end|>\n");

  // pretraining text: the tokenizer's own special tokens (none here), every token but the first trained
  Dataset t = dataset_read(kFixtures + "formats/text.jsonl", options(), enc);
  REQUIRE(t.samples.size() == 2);
  CHECK(t.samples[0].ids == enc.tokenizer()->encode("Add 2 and 3.", true));
  CHECK(t.samples[0].may_split);
  CHECK(t.stats.labelled == t.stats.tokens - 2);

  // an override reads the file as the named format: a record that does not fit names file:line and field
  std::string e = error_of([&] { dataset_read(kFixtures + "formats/messages.jsonl", options("alpaca"), enc); });
  CHECK(contains(e, "messages.jsonl:1:"));
  CHECK(contains(e, "missing field \"instruction\""));
}

TEST_CASE("preference data: only the chosen side's assistant turns are trained", "[datasets]") {
  TempDir dir("datasets_pref");
  const std::string path = dir.file(
      "pref.jsonl",
      R"({"prompt": [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}], "chosen": "good", "rejected": [{"role": "assistant", "content": "bad"}]})"
      "\n");
  Dataset d = dataset_read(path, options(), TextEncoder::bytes());
  REQUIRE(d.format == "preference");
  CHECK(labelled_bytes(d.samples[0]) == "good<|im_end|>\n");
  CHECK(labelled_bytes(d.rejected[0]) == "bad<|im_end|>\n");
}

TEST_CASE("bad input: every problem names file:line and what is wrong, skip_bad_lines counts", "[datasets]") {
  TextEncoder enc = TextEncoder::bytes();
  const std::string bad = kFixtures + "bad/";
  // file, where the error points, what it says
  const char* const cases[][3] = {
      {"malformed.jsonl", "malformed.jsonl:2:", "not valid JSON"},
      {"missing_field.jsonl", "missing_field.jsonl:2:", "missing field \"messages[1].content\""},
      {"unknown_role.jsonl", "unknown_role.jsonl:3:", "unknown role \"bot\""},
      {"ill_typed.jsonl", "ill_typed.jsonl:1:", "field \"output\" must be a string"},
      {"unknown_fields.jsonl", "unknown_fields.jsonl:1:", "\"question\", \"answer\""}};
  for (const auto& c : cases) {
    INFO(c[0]);
    const std::string e = error_of([&] { dataset_read(bad + c[0], options(), enc); });
    CHECK(contains(e, c[1]));
    CHECK(contains(e, c[2]));
  }
  DatasetOptions skip = options();
  skip.skip_bad_lines = true;
  Dataset d = dataset_read(bad + "malformed.jsonl", skip, enc);
  CHECK(d.samples.size() == 3);
  CHECK(d.stats.skipped_lines == 2);
  CHECK(contains(dataset_stats_line(d), "skipped 2 bad lines"));
  Dataset skipped = dataset_read(bad + "unknown_role.jsonl", skip, enc);
  CHECK(skipped.samples.size() == 2);
  CHECK(skipped.stats.skipped_lines == 1);

  CHECK(contains(error_of([&] { dataset_read(bad + "empty.jsonl", options(), enc); }), "empty"));
  CHECK(contains(error_of([&] { dataset_read(bad + "blank.jsonl", options(), enc); }), "empty"));
  CHECK(contains(error_of([&] { dataset_read(bad + "empty.jsonl", options("messages"), enc); }), "empty"));
  CHECK(contains(error_of([&] { dataset_read(bad + "absent.jsonl", options(), enc); }), "cannot open dataset"));
  // every line bad: skipping leaves nothing, which is an error that says so
  TempDir dir("datasets_bad");
  const std::string e = error_of([&] { dataset_read(dir.file("junk.jsonl", "{\"messages\": 1}\n[\n"), skip, enc); });
  CHECK(contains(e, "no usable samples"));
  CHECK(contains(e, "2 bad lines skipped"));

  // a conversation without an assistant turn trains nothing: dropped and counted
  Dataset na = dataset_read(bad + "no_assistant.jsonl", options(), enc);
  CHECK(na.samples.size() == 1);
  CHECK(na.stats.dropped_unlabelled == 1);
  CHECK(contains(dataset_stats_line(na), "1 without a trained token"));
}

TEST_CASE("bad input: a file of only bad JSON lines, skipped, says how many and which was first",
          "[datasets][data-faults]") {
  TempDir dir("datasets_all_bad");
  const std::string path = dir.file("junk.jsonl", "not json\n\n{\"messages\": [\n[1, 2]\nstill not json\n");
  TextEncoder enc = TextEncoder::bytes();
  DatasetOptions skip = options();
  skip.skip_bad_lines = true;
  // auto-detection skips every line: not "empty", but the count, the first one and the way to see them all
  std::string e = error_of([&] { dataset_read(path, skip, enc); });
  CHECK(contains(e, "holds no records: all 4 of its non-blank lines are bad JSON"));
  CHECK(contains(e, "skipped because data.skip_bad_lines = true"));
  CHECK(contains(e, "junk.jsonl:1: not valid JSON"));
  CHECK(contains(e, "data.skip_bad_lines = false"));
  CHECK_FALSE(contains(e, "is empty"));
  // a format given: the records are skipped one by one, and the error says so too
  DatasetOptions skip_messages = skip;
  skip_messages.format = "messages";
  e = error_of([&] { dataset_read(path, skip_messages, enc); });
  CHECK(contains(e, "4 bad lines skipped"));
  CHECK(contains(e, "data.skip_bad_lines = true skipped the bad lines"));
  // without skipping, the first bad line stops it, as always
  CHECK(contains(error_of([&] { dataset_read(path, options(), enc); }), "junk.jsonl:1: not valid JSON"));
  // a file of only blank lines is still just empty
  CHECK(contains(error_of([&] { dataset_read(dir.file("blank.jsonl", "\n  \n"), skip, enc); }), "is empty"));
}

TEST_CASE("data that is not text is refused at its first offending byte, byte tokenizer or not",
          "[datasets][data-faults]") {
  TempDir dir("datasets_binary");
  TextEncoder bytes = TextEncoder::bytes(), tiny = TextEncoder::from_dir(kTinyModel);
  DatasetOptions text = options("text");
  // an ELF executable's first bytes (NUL at offset 7), named like a corpus, and with data.format set
  const char elf_bytes[] = "\x7f" "ELF\x02\x01\x01\0\0\0\0\0\0\0\0\0\x03\0>\0\x01\0\0\0 some text after\n\nmore\n";
  const std::string elf(elf_bytes, sizeof elf_bytes - 1);
  for (const std::string& name : {std::string("prog.txt"), std::string("prog")}) {
    const std::string path = dir.file(name, elf);
    for (const TextEncoder* enc : {&bytes, &tiny}) {
      INFO(name << (enc->is_bytes() ? " bytes" : " tokenizer"));
      const std::string e = error_of([&] { dataset_read(path, text, *enc); });
      CHECK(contains(e, "dataset " + path + " is not text (it starts like an ELF executable or library)"));
      CHECK(contains(e, "the byte at offset 7 (line 1) is 0x00, a NUL byte"));
      CHECK(contains(e, "training data must be UTF-8 text"));
      CHECK(contains(e, "data.format = \"tokens\""));
    }
  }
  // text in another encoding (Latin-1), on a later line: the offset counts from the file's start
  const std::string latin1 = dir.file("latin1.txt", "good line\nna\xefve caf\xe9\n");
  std::string e = error_of([&] { dataset_read(latin1, options(), bytes); });
  CHECK(contains(e, "the byte at offset 12 (line 2) is 0xef, not part of well-formed UTF-8"));
  CHECK(contains(e, "iconv"));
  CHECK_FALSE(contains(e, "ELF"));
  // what well-formed UTF-8 forbids, each at offset 3: overlong forms, surrogates, above U+10FFFF,
  // a stray continuation byte, a sequence cut short, bytes no UTF-8 uses
  const char* const ill[] = {"\xc0\xaf", "\xe0\x80\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\x80",
                             "\xe2\x82", "\xe2\x82 x", "\xf5\x80\x80\x80", "\xff"};
  for (const char* b : ill) {
    INFO("first byte " << int(uint8_t(b[0])));
    const std::string path = dir.file("ill.txt", std::string("ok ") + b + "\n");
    CHECK(contains(error_of([&] { dataset_read(path, options(), bytes); }), "offset 3 (line 1)"));
  }
  // well-formed UTF-8 of every length reads, the bytes as they are
  const std::string fine = "caf\xc3\xa9 \xe4\xb8\xad \xf0\x9f\x98\x80 \xef\xbf\xbd \xf4\x8f\xbf\xbf";
  Dataset d = dataset_read(dir.file("fine.txt", fine + "\n"), options(), bytes);
  REQUIRE(d.samples.size() == 1);
  CHECK(std::string(d.samples[0].ids.begin(), d.samples[0].ids.end()) == fine + "\n");

  // JSON Lines with NUL bytes is a binary file too, even where bad lines are skipped
  DatasetOptions skip = options();
  skip.skip_bad_lines = true;
  const char nul_bytes[] = "{\"text\": \"a\"}\n\0\0\x01\x02\n";  // line 2 starts at offset 14
  const std::string nul = dir.file("nul.jsonl", std::string(nul_bytes, sizeof nul_bytes - 1));
  CHECK(contains(error_of([&] { dataset_read(nul, skip, bytes); }), "offset 14 (line 2) is 0x00, a NUL byte"));
  const std::string nul_first = dir.file("nul_first.jsonl", elf);
  CHECK(contains(error_of([&] { dataset_read(nul_first, skip, bytes); }), "ELF executable"));
  // ... while a JSON line that is not UTF-8 stays a bad line (the JSON parser's), which may be skipped
  const std::string latin1_json = dir.file("latin1.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"caf\xe9\"}\n");
  CHECK(contains(error_of([&] { dataset_read(latin1_json, options(), bytes); }), "latin1.jsonl:2: not valid JSON"));
  CHECK(dataset_read(latin1_json, skip, bytes).stats.skipped_lines == 1);
}

TEST_CASE("bad input: a template's raise_exception names the sample's file:line", "[datasets]") {
  const TemplatedChat chat(
      "datasets_raise", "<|im_end|>",
      "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('tool turns are not "
      "supported') }}{% endif %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}",
      R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})"
      "\n\n"
      R"({"messages": [{"role": "user", "content": "q"}, {"role": "tool", "content": "t"}, {"role": "assistant", "content": "a"}]})"
      "\n");
  std::string e = error_of([&] { dataset_read(chat.path, options(), chat.enc); });
  CHECK(contains(e, "chat.jsonl:3:"));
  CHECK(contains(e, "tool turns are not supported"));
  DatasetOptions skip = options();
  skip.skip_bad_lines = true;
  Dataset d = dataset_read(chat.path, skip, chat.enc);
  CHECK(d.samples.size() == 1);
  CHECK(d.stats.skipped_lines == 1);
}

TEST_CASE("overlong samples are truncated or dropped, and counted", "[datasets]") {
  TempDir dir("datasets_overlong");
  // ChatML of (user "q", assistant X): 51 bytes of prompt, X, 11 bytes of end marker
  auto chat = [](const std::string& answer) {
    return R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": ")" + answer + "\"}]}\n";
  };
  const std::string path = dir.file("chat.jsonl", chat("a") + chat(std::string(30, 'b')) + chat("c"));
  TextEncoder enc = TextEncoder::bytes();
  Dataset t = dataset_read(path, options("auto", TrainOn::assistant, 70), enc);
  CHECK(t.samples.size() == 3);
  CHECK(t.stats.truncated == 1);
  CHECK(t.samples[1].ids.size() == 70);
  CHECK(labelled_bytes(t.samples[1]) == std::string(19, 'b'));  // the first 70 tokens kept
  DatasetOptions drop = options("auto", TrainOn::assistant, 70);
  drop.drop_overlong = true;
  Dataset d = dataset_read(path, drop, enc);
  CHECK(d.samples.size() == 2);
  CHECK(d.stats.dropped_overlong == 1);
  CHECK(contains(dataset_stats_line(d), "dropped 1 (1 over sequence_len"));
  // truncation that cuts away every trained token drops the sample; none left is an error
  std::string e = error_of([&] { dataset_read(path, options("auto", TrainOn::assistant, 40), enc); });
  CHECK(contains(e, "3 without a trained token dropped"));

  // pretraining text: continues across rows with packing; the length policy without
  const std::string text = dir.file("t.jsonl", "{\"text\": \"" + std::string(100, 'x') + "\"}\n{\"text\": \"yy\"}\n");
  DatasetOptions packed = options("auto", TrainOn::assistant, 50);
  CHECK(dataset_read(text, packed, enc).samples[0].ids.size() == 100);
  DatasetOptions unpacked = packed;
  unpacked.packing = false;
  Dataset u = dataset_read(text, unpacked, enc);
  CHECK(u.samples[0].ids.size() == 50);
  CHECK(u.stats.truncated == 1);
  unpacked.drop_overlong = true;
  CHECK(dataset_read(text, unpacked, enc).samples.size() == 1);
}

TEST_CASE("eval split holds out evenly spaced samples, the same every time", "[datasets]") {
  TempDir dir("datasets_split");
  std::string lines;
  for (int i = 0; i < 10; ++i) lines += "{\"text\": \"" + std::string(1, char('a' + i)) + "xyz\"}\n";
  const std::string path = dir.file("t.jsonl", lines);
  Dataset d = dataset_read(path, options(), TextEncoder::bytes());
  Dataset eval = dataset_split_eval(&d, 0.3);
  REQUIRE(eval.samples.size() == 3);
  REQUIRE(d.samples.size() == 7);
  CHECK(eval.samples[0].ids[0] == 'd');  // samples 3, 6, 9
  CHECK(eval.samples[1].ids[0] == 'g');
  CHECK(eval.samples[2].ids[0] == 'j');
  CHECK(d.samples[3].ids[0] == 'e');
  CHECK(eval.stats.tokens == 12);
  CHECK(d.stats.tokens == 28);
  Dataset again = dataset_read(path, options(), TextEncoder::bytes());
  CHECK(contains(error_of([&] { dataset_split_eval(&again, 0.05); }), "holds none out"));
}

TEST_CASE("reading is deterministic whatever the thread count", "[datasets]") {
  TextEncoder enc = TextEncoder::from_dir(kTinyModel);
  const std::string path = STRATA_SOURCE_DIR "/recipes/sft-tiny/data/chat.jsonl";
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  Dataset one = dataset_read(path, options(), enc);
  omp_set_num_threads(4);
  Dataset four = dataset_read(path, options(), enc);
  omp_set_num_threads(threads);
  REQUIRE(one.samples.size() == 300);
  REQUIRE(four.samples.size() == 300);
  for (size_t i = 0; i < 300; ++i) {
    CHECK(one.samples[i].ids == four.samples[i].ids);
    CHECK(one.samples[i].labels == four.samples[i].labels);
  }
  CHECK(one.stats.labelled == four.stats.labelled);
}

TEST_CASE("training_data_load: the trainer's entry point, with an eval file", "[datasets]") {
  TempDir dir("datasets_load");
  const std::string eval = dir.file("eval.jsonl", R"({"messages": [{"role": "user", "content": "What is 1 + 1?"}, {"role": "assistant", "content": "1 + 1 = 2."}]})"
                                                  "\n");
  const std::string toml = "[model]\npath = \"" + kTinyModel + "\"\n[data]\npath = \"" STRATA_SOURCE_DIR
                           "/recipes/sft-tiny/data/chat.jsonl\"\neval_path = \"" + eval +
                           "\"\nsequence_len = 128\n[train]\nmax_steps = 1\n";
  Recipe rc = recipe_parse(toml, (dir.path / "r.toml").string(), {});
  TrainingData td = training_data_load(rc, 640);
  CHECK(td.tokenizer_dir == kTinyModel);
  CHECK(td.train.T == 128);
  CHECK(td.train.rows() > 10);
  CHECK(td.eval.rows() == 1);
  CHECK(contains(td.report, "300 samples"));
  CHECK(contains(td.report, "eval.jsonl (messages): 1 samples"));
  int64_t trained = 0;
  for (int32_t t : td.train.targets) trained += t != -100;
  CHECK(trained > 0);
  // the tokenizer's vocabulary must fit the model's
  CHECK(contains(error_of([&] { training_data_load(rc, 500); }), "vocab_size is 500"));
  // bytes: every id must fit the model (an emoji's bytes are >= 0xF0)
  dir.file("eval.jsonl", R"({"messages": [{"role": "user", "content": "smile"}, {"role": "assistant", "content": "\ud83d\ude00"}]})"
                         "\n");
  Recipe bytes = recipe_parse(toml, (dir.path / "r.toml").string(), {"data.tokenizer=\"bytes\""});
  CHECK(contains(error_of([&] { training_data_load(bytes, 200); }), "vocab_size >= 256"));
}
