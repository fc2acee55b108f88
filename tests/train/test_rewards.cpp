// GRPO's rewards (src/train/rewards.h, src/train/reward_command.h): the built-in verifiable
// rewards on hand-made completions, weighted totals, and the external reward command with
// small shell / awk programs — a correct one (answers kept across batches, one process for the
// run), and every failure: a non-JSON line, a missing key, a non-finite reward (exit 2), a
// timeout and an exit (exit 4), each message naming the reply line; no hang, the child reaped.
// Also the group-normalised advantages (src/train/grpo_advantages.h).
#include <catch2/catch.hpp>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>

#include "src/core/error.h"
#include "src/train/grpo_advantages.h"
#include "src/train/reward_command.h"
#include "src/train/rewards.h"

namespace strata {
namespace {

RewardSample sample(const std::string& completion, const std::string& answer = "42", int64_t tokens = 5) {
  RewardSample s;
  s.prompt = "What is 6 * 7?";
  s.completion = completion;
  s.completion_tokens = tokens;
  s.fields = {{"answer", answer}, {"id", 3}};
  return s;
}

// The error of f(), which must throw strata::Error.
Error error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  FAIL("no error thrown");
  return Error(ErrorKind::input, "");
}

}  // namespace

TEST_CASE("built-in GRPO rewards score hand-made completions", "[grpo][rewards]") {
  RewardOptions o;
  o.funcs = {"accuracy", "format", "json", "length"};
  o.weights = {1.0, 0.5, 0.25, 2.0};
  o.answer_regex = "answer:\\s*(-?[0-9.]+)";
  o.format_regex = "^<think>.*</think>";
  o.json_keys = {"a"};
  o.max_completion_length = 20;
  o.length_buffer = 4;
  Rewards r(o);
  const std::vector<RewardSample> s = {
      sample("<think>x</think> answer: 42.0"),            // accuracy (numeric), format
      sample("answer: 41 then answer: 42"),               // the last match counts
      sample("answer: 42x", "42", 18),                    // "42" captured; within the length buffer
      sample("{\"a\": 1, \"b\": 2}", "7", 25),            // json; too long
      sample("{\"b\": 2}", "seven"),                      // json without key a
      sample("answer: seven", "seven"),                   // no number: no capture
  };
  std::vector<std::vector<double>> per;
  const std::vector<double> total = r.score(s, &per);
  REQUIRE(per.size() == 4);
  CHECK(per[0] == std::vector<double>{1, 1, 1, 0, 0, 0});
  CHECK(per[1] == std::vector<double>{1, 0, 0, 0, 0, 0});
  CHECK(per[2] == std::vector<double>{0, 0, 0, 1, 0, 0});
  CHECK(per[3][2] == Approx(-0.5));  // (20 - 4 - 18) / 4
  CHECK(per[3][3] == -1.0);
  CHECK(per[3][0] == 0.0);
  CHECK(total[0] == Approx(1.5));
  CHECK(total[3] == Approx(0.25 - 2.0));
  CHECK(reward_answers_equal(" 3.50", "3.5"));
  CHECK(!reward_answers_equal("3.5001", "3.5"));
  CHECK(reward_answers_equal("Paris", " Paris "));
  CHECK(error_of([] { RewardOptions b; b.funcs = {"accuracy"}; b.answer_regex = "(unclosed"; Rewards x(b); })
            .exit_code() == 2);
  CHECK(std::string(error_of([] { RewardOptions b; b.funcs = {"acuracy"}; Rewards x(b); }).what())
            .find("accuracy, format, json, length") != std::string::npos);
  CHECK(error_of([] { RewardOptions b; b.weights = {1, 2}; Rewards x(b); }).exit_code() == 2);
}

TEST_CASE("the reward command scores batches with one process for the run", "[grpo][rewards]") {
  RewardOptions o;
  o.funcs = {"accuracy"};
  o.weights = {1.0, 10.0};
  // reward = the completion's length in bytes, from a sh read loop (line by line: awk
  // implementations may read their input in blocks and answer only at its end)
  o.command = "while IFS= read -r line; do c=${line#*\\\"completion\\\":\\\"}; c=${c%%\\\"*}; "
              "printf '{\"reward\": %d}\\n' ${#c}; done";
  Rewards r(o);
  REQUIRE(r.names() == std::vector<std::string>{"accuracy", "command"});
  std::vector<std::vector<double>> per;
  for (int batch = 0; batch < 3; ++batch) {
    const std::vector<double> total = r.score({sample("answer 42"), sample("no"), sample(std::string(300, 'z'))}, &per);
    CHECK(per[1] == std::vector<double>{9, 2, 300});
    CHECK(total[0] == Approx(1 + 90.0));
  }
  // many completions at once: replies interleave with requests (no deadlock on full pipes)
  std::vector<RewardSample> many(3000, sample(std::string(200, 'q')));
  const std::vector<double> t = r.score(many, &per);
  CHECK(per[1].size() == 3000);
  CHECK(per[1][2999] == 200.0);
}

TEST_CASE("reward command failures end the run naming the reply line", "[grpo][rewards]") {
  struct Case {
    const char* script;
    int exit_code;
    const char* says;
  };
  // each program answers the first line well, then fails on the second
  const Case cases[] = {
      {"read a; echo '{\"reward\": 1}'; read b; echo 'not json'; sleep 5", 2, "reply line 2 is not JSON"},
      {"read a; echo '{\"reward\": 1}'; read b; echo '{\"score\": 1}'; sleep 5", 2, "reply line 2 has no numeric"},
      {"read a; echo '{\"reward\": 1}'; read b; echo '{\"reward\": 1e999}'; sleep 5", 2, "reply line 2 has a non-finite"},
      {"read a; echo '{\"reward\": 1}'; read b; exit 3", 4, "closed its output before reply line 2 (it exited with status 3)"},
      {"read a; echo '{\"reward\": 1}'; read b; sleep 30", 4, "gave no reply line 2 within"},
  };
  for (const Case& c : cases) {
    INFO(c.script);
    RewardCommand cmd(c.script, 1.0);
    const auto start = std::chrono::steady_clock::now();
    const Error e = error_of([&] { cmd.score({sample("a"), sample("b")}); });
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    CHECK(e.exit_code() == c.exit_code);
    CHECK(std::string(e.what()).find(c.says) != std::string::npos);
    CHECK(took < 10);                      // killed, not waited for
    CHECK(cmd.pid() == -1);                // reaped
    CHECK_THROWS_AS(cmd.score({sample("c")}), Error);  // and not reused
  }
  // a command that cannot read its input at all (exits at once): exit 4, never SIGPIPE
  RewardCommand gone("exit 0", 1.0);
  const Error e = error_of([&] { gone.score(std::vector<RewardSample>(2000, sample(std::string(500, 'x')))); });
  CHECK(e.exit_code() == 4);
}

}  // namespace strata

namespace strata {

// The group-normalised advantages against values worked by hand from TRL's formulas.
TEST_CASE("GRPO advantages normalise rewards per group as TRL does", "[grpo][rewards]") {
  const std::vector<double> r = {1, 0, 0, 1, 0.5, 0.5, 0.5, 0.5};  // two groups of G = 4
  const double sd0 = std::sqrt(1.0 / 3.0);                         // unbiased std of {1, 0, 0, 1}
  const GrpoAdvantages g = grpo_advantages(r, 4, GrpoScaleRewards::group);
  CHECK(g.advantages[0] == Approx(0.5 / (sd0 + 1e-4)).epsilon(1e-12));
  CHECK(g.advantages[1] == Approx(-0.5 / (sd0 + 1e-4)).epsilon(1e-12));
  CHECK(g.advantages[4] == 0.0);
  CHECK(g.reward_std == Approx(sd0 / 2));
  CHECK(g.frac_reward_zero_std == 0.5);
  double bm = 0, bq = 0;
  for (double x : r) bm += x / 8;
  for (double x : r) bq += (x - bm) * (x - bm) / 7;
  const GrpoAdvantages b = grpo_advantages(r, 4, GrpoScaleRewards::batch);
  CHECK(b.advantages[0] == Approx(0.5 / (std::sqrt(bq) + 1e-4)).epsilon(1e-12));
  const GrpoAdvantages n = grpo_advantages(r, 4, GrpoScaleRewards::none);
  CHECK(n.advantages[3] == 0.5);
  CHECK_THROWS_WITH(grpo_advantages(r, 3, GrpoScaleRewards::group), Catch::Contains("num_generations = 3"));
  CHECK_THROWS_WITH(grpo_scale_rewards_parse("groups"), Catch::Contains("group, batch, none"));
}
}  // namespace strata
