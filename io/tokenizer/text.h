// Text plumbing shared by the tokenizer stages: UTF-8 decoding, Unicode character classes (via
// utf8proc), and `NormText`, a normalized string that remembers for every byte which byte range of
// the original input it came from (the same alignment model as Hugging Face's NormalizedString).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace strata::tok {

// A [begin, end) byte range of the original text.
struct Span {
  uint32_t begin = 0, end = 0;
};

// A normalized string; align[i] is the original range of the character that byte i belongs to.
struct NormText {
  std::string text;
  std::vector<Span> align;  // (text.size())

  size_t size() const { return text.size(); }
  void clear() { text.clear(), align.clear(); }
  void append(std::string_view bytes, Span span) {
    text.append(bytes);
    align.insert(align.end(), bytes.size(), span);
  }
  // Copies text[b, e) of `src` with its alignment.
  void append_from(const NormText& src, size_t b, size_t e) {
    text.append(src.text, b, e - b);
    align.insert(align.end(), src.align.begin() + b, src.align.begin() + e);
  }
};

// Builds a NormText for original[b, e): every byte of a character aligned to that character.
void text_from_original(std::string_view original, size_t b, size_t e, NormText* out);

// Length in bytes of the UTF-8 character starting with lead byte `c` (1 for invalid leads).
inline size_t utf8_char_len(unsigned char c) {
  return c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
}
// Decodes the character at s[i] (valid UTF-8 assumed); returns its code point and sets *len.
uint32_t utf8_decode(const char* s, size_t i, size_t* len);
void utf8_append(std::string& out, uint32_t cp);
// Offset of the first byte that is not valid UTF-8, or npos when all of s is valid.
size_t utf8_find_invalid(std::string_view s);
size_t utf8_count_chars(std::string_view s);

// Unicode classes with the meaning Rust's `char` methods and the `regex` crate give them.
bool unicode_is_whitespace(uint32_t cp);  // White_Space
bool unicode_is_numeric(uint32_t cp);     // Nd, Nl, No
bool unicode_is_word(uint32_t cp);        // regex `\w`: letters, marks, Nd, Pc, joiners
bool unicode_is_mark(uint32_t cp);        // Mn, Mc, Me

}  // namespace strata::tok
