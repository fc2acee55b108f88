// Loss masks for chat samples. The assistant turns are located in the rendered chat template by
// rendering prefixes of the conversation, as Hugging Face's assistant masks do, never by looking
// for marker strings: for assistant message k, P = render(messages[:k], add_generation_prompt)
// and Q = render(messages[:k+1]); when Q starts with P and the full render starts with Q, the
// turn is bytes [len(P), len(Q)) of the full render (its content and end-of-turn marker).
//
// Templates that change a turn once later turns follow break that prefix property: Qwen3 drops
// the <think> block of earlier assistant turns, Phi-3 appends an EOS only at the end of a
// conversation. Then, when the full render still starts with P, the turn rendered last is
// aligned at len(P): its longest part T that the full render continues with, after a dropped
// head (reasoning) and before a dropped tail that the full render also ends with (the EOS); T
// must hold the last character of the message's content. Failing that, Q[len(P):] is searched
// for after the previous turn. A turn found none of these ways is an error, never a guess.
// Tokens are labelled when their byte range overlaps a turn (when a dropped tail made the end
// uncertain by a shared character, such as "</s>" against "<|user|>", a token running past the
// end is not).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "io/json.h"

namespace strata {

struct ChatTemplate;

enum class TrainOn { assistant, last, all };
TrainOn train_on_parse(const std::string& s);  // "assistant" | "last" | "all"

using ByteSpan = std::pair<size_t, size_t>;  // [begin, end)

// An assistant turn's bytes [begin, end) in the rendered text.
struct TurnSpan {
  size_t begin = 0, end = 0;
  bool exact_end = true;  // false: a token running past `end` is not part of the turn
};

struct ChatRender {
  std::string text;                       // the whole conversation, add_generation_prompt false
  std::vector<TurnSpan> assistant_spans;  // ascending, disjoint
};

// Renders `messages` and finds the assistant turns at message index >= first_turn (all of them
// for TrainOn::assistant, the last one for TrainOn::last, none for TrainOn::all). Renders use
// a fixed clock (strftime_now reads 2024-07-26) so samples are reproducible. Throws
// strata::Error for template errors and for a turn that cannot be located.
ChatRender chat_render_spans(const ChatTemplate& tmpl, const nlohmann::ordered_json& messages,
                             const nlohmann::ordered_json& tools, TrainOn train_on, size_t first_turn);

// labels[i] = 1 when token i's byte range overlaps a span (a zero-width token: when it lies
// inside one; past a span's inexact end: not); labels[0] = 0. Offsets ascending, as tokenizers
// return them.
std::vector<uint8_t> chat_labels_from_spans(const std::vector<ByteSpan>& token_offsets,
                                            const std::vector<TurnSpan>& spans);

}  // namespace strata
