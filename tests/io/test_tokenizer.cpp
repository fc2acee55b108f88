// Tokenizer tests: ids, offsets and decodes compared line by line with goldens written by the Hugging
// Face Rust tokenizers (tools/fixtures/make_tokenizer_fixtures.mjs), for the two real tokenizer files
// and nine synthetic ones covering the other components; plus round trips, errors, the CLI and a
// hidden throughput benchmark ([.bench]).
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>
#include <utf8proc.h>

#include "io/tokenizer/tokenizer.h"
#include "src/cli/commands.h"
#include "src/core/error.h"
#include "tests/testing.h"

using strata::Tokenizer;
using strata::testing::source_path;

namespace {

std::string tokenizer_real_dir(const std::string& name) {
  return strata::testing::tokenizer_fixture(name);
}

std::string tokenizer_path(const std::string& name) {
  if (name == "bpe-qwen3" || name == "sp-bpe-32k") return tokenizer_real_dir(name);
  return source_path("tests/fixtures/tokenizer/synthetic/" + name + "/tokenizer.json");
}

// Loaded once per test binary run (the Qwen3 file is 11 MB of JSON).
const Tokenizer& tokenizer_cached(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto& slot = cache[name];
  if (!slot) {
    INFO("tokenizer " << tokenizer_path(name) << " (the real ones are unpacked from tests/fixtures/tokenizers/tokenizers.tar.xz by CMake)");
    REQUIRE(std::filesystem::exists(tokenizer_path(name)));
    slot = std::make_unique<Tokenizer>(Tokenizer::load(tokenizer_path(name)));
  }
  return *slot;
}

std::vector<nlohmann::json> golden_lines(const std::string& name) {
  std::ifstream in(source_path("tests/fixtures/tokenizer/" + name + ".jsonl"));
  REQUIRE(in.good());
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

// Byte offsets -> code-point offsets, the way Hugging Face converts them.
std::pair<size_t, size_t> to_char_offsets(const std::string& text, std::pair<size_t, size_t> o) {
  auto chars_before = [&](size_t b) {
    size_t n = 0;
    for (size_t i = 0; i < b && i < text.size(); ++i) n += (static_cast<unsigned char>(text[i]) & 0xC0) != 0x80;
    return n;
  };
  return {chars_before(o.first), chars_before(o.second)};
}

enum class Form { none, nfc, nfkc };

// True when the tokenizer's Unicode normalizer (if any) leaves s unchanged.
bool unicode_stable(const std::string& s, Form form) {
  if (form == Form::none) return true;
  int opts = UTF8PROC_STABLE | UTF8PROC_COMPOSE | (form == Form::nfkc ? UTF8PROC_COMPAT : 0);
  utf8proc_uint8_t* out = nullptr;
  auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), utf8proc_ssize_t(s.size()), &out,
                        utf8proc_option_t(opts));
  std::string r(reinterpret_cast<char*>(out), size_t(n));
  std::free(out);
  return r == s;
}

struct GoldenStats {
  size_t lines = 0, offsets_checked = 0, round_trips = 0;
};

// Every line of the golden file must match exactly: ids with and without special tokens, the three
// decodes, and offsets (skipped only where Unicode normalization rewrote the text, since Hugging
// Face's alignment of recomposed characters is not reproduced byte for byte). For a lossless
// tokenizer, decode(encode(x)) == x wherever x holds no special token and normalization keeps it.
GoldenStats check_goldens(const std::string& name, Form form, bool lossless) {
  const Tokenizer& tok = tokenizer_cached(name);
  GoldenStats st;
  for (const auto& g : golden_lines(name)) {
    const std::string text = g["text"].get<std::string>();
    INFO(name << " text: " << g["text"].dump());
    std::vector<std::pair<size_t, size_t>> offs;
    std::vector<int32_t> ids = tok.encode_with_offsets(text, false, &offs);
    REQUIRE(ids == g["ids"].get<std::vector<int32_t>>());
    REQUIRE(tok.encode(text, false) == ids);
    std::vector<int32_t> ids_s = tok.encode(text, true);
    REQUIRE(ids_s == g["ids_special"].get<std::vector<int32_t>>());
    CHECK(tok.decode(ids) == g["decoded"].get<std::string>());
    CHECK(tok.decode(ids_s) == g["decoded_special"].get<std::string>());
    CHECK(tok.decode(ids_s, true) == g["decoded_skip"].get<std::string>());
    const bool stable = unicode_stable(text, form);
    if (stable) {
      std::string want, got;
      for (const auto& o : g["offsets"]) want += o.dump() + " ";
      for (auto o : offs) {
        auto c = to_char_offsets(text, o);
        got += "[" + std::to_string(c.first) + "," + std::to_string(c.second) + "] ";
      }
      CHECK(got == want);
      ++st.offsets_checked;
    }
    bool has_special = false;
    for (int32_t id : ids) has_special |= tok.is_special(id);
    if (lossless && stable && !has_special) {
      CHECK(tok.decode(ids) == text);
      ++st.round_trips;
    }
    ++st.lines;
  }
  return st;
}

}  // namespace

TEST_CASE("tokenizer: Qwen3 byte-level BPE matches Hugging Face goldens", "[tokenizer]") {
  auto st = check_goldens("bpe-qwen3", Form::nfc, true);
  CHECK(st.lines >= 290);
  CHECK(st.round_trips >= 240);
}

TEST_CASE("tokenizer: SentencePiece-style BPE (byte fallback) matches Hugging Face goldens", "[tokenizer]") {
  auto st = check_goldens("sp-bpe-32k", Form::none, true);
  CHECK(st.lines >= 290);
  CHECK(st.offsets_checked == st.lines);
}

TEST_CASE("tokenizer: synthetic tokenizers match Hugging Face goldens", "[tokenizer]") {
  struct Case {
    const char* name;
    Form form;
    bool lossless;
  };
  for (Case c : {Case{"gpt2-bytelevel", Form::none, false}, Case{"llama3-style", Form::none, true},
                 Case{"metaspace-first", Form::nfkc, false}, Case{"metaspace-always", Form::none, false},
                 Case{"metaspace-never", Form::none, false},
                 Case{"normalizers-mix", Form::nfkc, false}, Case{"split-behaviors-a", Form::none, false},
                 Case{"split-behaviors-b", Form::nfc, false}, Case{"subword-affixes", Form::none, false}}) {
    SECTION(c.name) {
      auto st = check_goldens(c.name, c.form, c.lossless);
      CHECK(st.lines >= 290);
    }
  }
}

TEST_CASE("tokenizer: vocabulary lookups", "[tokenizer]") {
  const Tokenizer& q = tokenizer_cached("bpe-qwen3");
  CHECK(q.vocab_size() == 151669);
  CHECK(q.token_to_id("<|im_start|>") == 151644);
  CHECK(q.token_to_id("Hello") == 9707);
  CHECK(q.token_to_id("no such token at all") == -1);
  CHECK(q.id_to_token(9707) == "Hello");
  CHECK(q.id_to_token(151645) == "<|im_end|>");
  CHECK(q.is_special(151645));
  CHECK_FALSE(q.is_special(151667));  // <think> is added but not special
  CHECK(q.decode({151644, 9707, 151645}, true) == "Hello");
  const Tokenizer& s = tokenizer_cached("sp-bpe-32k");
  CHECK(s.vocab_size() == 32000);
  CHECK(s.token_to_id("<0x0A>") == 13);
  CHECK(s.encode("a\nb", true).front() == 1);  // BOS from the template
}

TEST_CASE("tokenizer: offsets cover the text they came from", "[tokenizer]") {
  const Tokenizer& q = tokenizer_cached("bpe-qwen3");
  const std::string text = "Hello, wörld!<|im_end|>\n  日本 ok";
  std::vector<std::pair<size_t, size_t>> offs;
  auto ids = q.encode_with_offsets(text, false, &offs);
  REQUIRE(offs.size() == ids.size());
  std::string joined;
  size_t prev_end = 0;
  for (auto [b, e] : offs) {
    REQUIRE(b <= e);
    REQUIRE(e <= text.size());
    if (b >= prev_end) joined += text.substr(b, e - b);  // byte tokens of one character share its span
    prev_end = e;
  }
  CHECK(joined == text);
}

TEST_CASE("tokenizer: bad input and unsupported components are clear errors", "[tokenizer]") {
  const Tokenizer& q = tokenizer_cached("bpe-qwen3");
  CHECK_THROWS_WITH(q.encode(std::string("ok \xff bad")), Catch::Contains("not valid UTF-8"));
  CHECK_THROWS_WITH(q.encode(std::string("\xe6\x97")), Catch::Contains("byte offset 0"));
  CHECK_THROWS_WITH(q.decode({1, 999999}), Catch::Contains("999999"));
  CHECK_THROWS_WITH(q.decode({-1}), Catch::Contains("outside the vocabulary"));

  auto json_with = [](const std::string& key, const std::string& value) {
    std::string model = R"({"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]})";
    std::string j = R"({"model":)" + model;
    if (!key.empty()) j += ",\"" + key + "\":" + value;
    return j + "}";
  };
  CHECK(Tokenizer::from_json_text(json_with("", ""), "mini").encode("abab") == std::vector<int32_t>{2, 2});
  CHECK_THROWS_WITH(Tokenizer::from_json_text(json_with("normalizer", R"({"type":"BertNormalizer"})"), "t"),
                    Catch::Contains("BertNormalizer"));
  CHECK_THROWS_WITH(Tokenizer::from_json_text(json_with("pre_tokenizer", R"({"type":"UnicodeScripts"})"), "t"),
                    Catch::Contains("UnicodeScripts"));
  CHECK_THROWS_WITH(Tokenizer::from_json_text(json_with("post_processor", R"({"type":"RobertaProcessing"})"), "t"),
                    Catch::Contains("RobertaProcessing"));
  CHECK_THROWS_WITH(Tokenizer::from_json_text(json_with("decoder", R"({"type":"WordPiece"})"), "t"),
                    Catch::Contains("WordPiece"));
  CHECK_THROWS_WITH(Tokenizer::from_json_text(R"({"model":{"type":"Unigram","vocab":[]}})", "t"),
                    Catch::Contains("Unigram"));
  CHECK_THROWS_WITH(Tokenizer::from_json_text(R"({"model":{"type":"BPE","vocab":{"a":0},"merges":["a c"]}})", "t"),
                    Catch::Contains("\"c\""));
  CHECK_THROWS_WITH(Tokenizer::from_json_text("{not json", "broken.json"), Catch::Contains("broken.json"));
  CHECK_THROWS_WITH(Tokenizer::load("/nonexistent/dir"), Catch::Contains("/nonexistent/dir"));
}

TEST_CASE("tokenizer: merges as pairs and as strings give the same ids, long words", "[tokenizer]") {
  std::string vocab = R"({"a":0,"b":1,"c":2,"ab":3,"abc":4,"bc":5,"aa":6,"aaaa":7})";
  auto make = [&](const std::string& merges) {
    return Tokenizer::from_json_text(R"({"model":{"type":"BPE","vocab":)" + vocab + R"(,"merges":)" + merges + "}}",
                                     "mini");
  };
  Tokenizer strings = make(R"(["a b","ab c","b c","a a","aa aa"])");
  Tokenizer pairs = make(R"([["a","b"],["ab","c"],["b","c"],["a","a"],["aa","aa"]])");
  for (std::string w : {"abc", "bcab", "aaaaaaa", "cbacba", "a"}) CHECK(strings.encode(w) == pairs.encode(w));
  CHECK(strings.encode("abc") == std::vector<int32_t>{4});
  CHECK(strings.encode("bcab") == std::vector<int32_t>{5, 3});  // b c (rank 2) never outranks a b (rank 0)
  CHECK(strings.encode("aaaaaaa") == std::vector<int32_t>{7, 6, 0});
  // A 5000-character word is past the cache limit and still merges like a short one.
  std::vector<int32_t> long_ids = strings.encode(std::string(5001, 'a'));
  CHECK(long_ids.size() == 1250 + 1);
  CHECK(long_ids.back() == 0);
}

TEST_CASE("tokenizer: pathological inputs round-trip (a quadratic path would run into ctest's timeout)", "[tokenizer]") {
  const Tokenizer& q = tokenizer_cached("bpe-qwen3");
  const Tokenizer& s = tokenizer_cached("sp-bpe-32k");
  // A 200k-space run (the whitespace-lookahead branch backtracks), a 100k-letter word, and 300 KB of
  // SentencePiece text that is one BPE "word" unless cut at safe boundaries.
  std::string spaces(200001, ' '), letters(100003, 'a'), prose;
  for (int i = 0; i < 20000; ++i) prose += "word" + std::to_string(i % 97) + " ";
  for (const std::string* t : {&spaces, &letters, &prose}) {
    CHECK(q.decode(q.encode(*t)) == *t);
    CHECK(s.decode(s.encode(*t)) == *t);
  }
}

TEST_CASE("tokenizer: concurrent encodes agree with a serial one", "[tokenizer]") {
  const Tokenizer& q = tokenizer_cached("bpe-qwen3");
  std::vector<std::string> texts;
  for (int i = 0; i < 200; ++i) texts.push_back("sample " + std::to_string(i * 7919) + " wordy_" + std::to_string(i));
  std::vector<std::vector<int32_t>> serial;
  for (const auto& t : texts) serial.push_back(q.encode(t));
  std::vector<std::vector<int32_t>> a(texts.size()), b(texts.size());
  std::thread t1([&] { for (size_t i = 0; i < texts.size(); ++i) a[i] = q.encode(texts[i]); });
  std::thread t2([&] { for (size_t i = texts.size(); i-- > 0;) b[i] = q.encode(texts[i]); });
  t1.join();
  t2.join();
  CHECK(a == serial);
  CHECK(b == serial);
}

TEST_CASE("tokenizer: strata tokenize / detokenize JSON lines", "[tokenizer]") {
  const std::string dir = tokenizer_real_dir("sp-bpe-32k");
  int rc = -1;
  std::string out = strata::testing::run_cli(strata::cmd_tokenize, {"--tokenizer", dir, "--add-special-tokens"},
                            "{\"text\": \"Hello world\"}\n\n{\"text\": \"a\\nb\"}\n", &rc);
  CHECK(rc == 0);
  const Tokenizer& s = tokenizer_cached("sp-bpe-32k");
  auto ids1 = s.encode("Hello world", true), ids2 = s.encode("a\nb", true);
  CHECK(out == nlohmann::json({{"ids", ids1}}).dump() + "\n" + nlohmann::json({{"ids", ids2}}).dump() + "\n");

  std::string back = strata::testing::run_cli(strata::cmd_detokenize, {"--tokenizer", dir, "--skip-special-tokens"}, out, &rc);
  CHECK(rc == 0);
  CHECK(back == "{\"text\":\"Hello world\"}\n{\"text\":\"a\\nb\"}\n");

  try {
    strata::testing::run_cli(strata::cmd_tokenize, {"--tokenizer", dir}, "{\"text\": \"ok\"}\n{\"txt\": 1}\n", &rc);
    FAIL("a line without \"text\" must be an error");
  } catch (const strata::Error& e) {
    CHECK(e.exit_code() == 2);
    CHECK_THAT(e.what(), Catch::Contains("line 2"));
  }
  CHECK_THROWS_WITH(strata::testing::run_cli(strata::cmd_tokenize, {"--tokenizer", dir}, "{\"text\": \"ok\"\n", &rc),
                    Catch::Contains("line 1") && Catch::Contains("not valid JSON"));
  CHECK_THROWS_WITH(strata::testing::run_cli(strata::cmd_detokenize, {"--tokenizer", dir}, "{\"ids\": [1, 32000]}\n", &rc),
                    Catch::Contains("line 1") && Catch::Contains("32000"));
  CHECK_THROWS_WITH(strata::testing::run_cli(strata::cmd_tokenize, {"--tokenizr", dir}, "", &rc), Catch::Contains("--tokenizr"));
}

// Throughput on English prose (not a pass/fail test): run with `strata_tests "[.bench]"`.
// Two texts: (a) English sentences repeated (every word is a word-cache hit after the first pass),
// (b) sentences over 20k generated words drawn Zipf-like, encoded by a freshly loaded tokenizer,
// so rare words keep missing the cache.
TEST_CASE("tokenizer: throughput on English prose", "[.bench]") {
  const char* sentences[] = {
      "The committee met on Tuesday to review the budget, and after a long discussion it agreed to postpone the vote.",
      "Rivers carry sediment from the mountains to the sea, building deltas that shift with every flood season.",
      "She opened the window, listened to the rain for a while, and then went back to her unfinished letter.",
      "Engineers measured the bridge's vibrations at dawn, when traffic was light and the air was still.",
      "Most of the village's older houses were built from local stone in the eighteenth and nineteenth centuries.",
      "He wasn't sure whether the train would arrive on time, so he bought a coffee and waited by the platform.",
      "Historians still debate why the empire declined so quickly after a century of relative stability.",
      "If you can't find the file, check the folder where you saved the previous version of the report.",
  };
  std::string prose;
  for (int rep = 0; prose.size() < (4u << 20); ++rep)
    for (const char* s : sentences) (prose += s) += rep % 5 == 4 ? "\n\n" : " ";

  std::mt19937_64 rng(7);
  const char* syllables[] = {"an", "ber", "con", "de", "ex", "for", "gra", "hol", "in", "ject", "ka", "lo", "men",
                             "nor", "op", "pre", "qui", "ros", "sta", "tion", "un", "ver", "wal", "yes", "zen"};
  std::vector<std::string> words(20000);
  for (auto& w : words)
    for (int k = 0, n = 1 + int(rng() % 4); k < n; ++k) w += syllables[rng() % 25];
  std::string varied;
  while (varied.size() < (4u << 20)) {
    double u = std::uniform_real_distribution<double>(0, 1)(rng);
    varied += words[size_t(std::pow(20000.0, u)) - 1];  // log-uniform rank: a Zipf-like tail
    varied += rng() % 12 == 0 ? ", " : rng() % 15 == 0 ? ".\n" : " ";
  }

  for (const char* name : {"bpe-qwen3", "sp-bpe-32k"}) {
    const Tokenizer& tok = tokenizer_cached(name);
    tok.encode(prose.substr(0, 1 << 16));  // warm the word cache
    auto t0 = std::chrono::steady_clock::now();
    size_t n = tok.encode(prose).size();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("tokenizer %-10s (a) repeated prose : %zu tokens in %.3f s = %.2f M tokens/s (one thread)\n", name,
                n, s, n / s / 1e6);
    CHECK(n > prose.size() / 8);

    Tokenizer fresh = Tokenizer::load(tokenizer_path(name));
    t0 = std::chrono::steady_clock::now();
    n = fresh.encode(varied).size();
    s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("tokenizer %-10s (b) 20k-word prose : %zu tokens in %.3f s = %.2f M tokens/s (one thread, cold cache)\n",
                name, n, s, n / s / 1e6);
    CHECK(n > varied.size() / 8);
  }
}
