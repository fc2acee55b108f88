// UTF-8 helpers and Unicode character classes for the tokenizer (see text.h).
#include "io/tokenizer/text.h"

#include <utf8proc.h>

namespace strata::tok {

void text_from_original(std::string_view original, size_t b, size_t e, NormText* out) {
  out->text.assign(original.data() + b, e - b);
  out->align.resize(e - b);
  for (size_t i = b; i < e;) {
    size_t n = utf8_char_len((unsigned char)original[i]);
    if (i + n > e) n = e - i;
    for (size_t k = 0; k < n; ++k) out->align[i - b + k] = Span{uint32_t(i), uint32_t(i + n)};
    i += n;
  }
}

uint32_t utf8_decode(const char* s, size_t i, size_t* len) {
  const auto* p = reinterpret_cast<const unsigned char*>(s + i);
  unsigned char c = p[0];
  if (c < 0x80) return *len = 1, c;
  if ((c >> 5) == 0x6) return *len = 2, uint32_t(c & 0x1F) << 6 | (p[1] & 0x3F);
  if ((c >> 4) == 0xE) return *len = 3, uint32_t(c & 0x0F) << 12 | uint32_t(p[1] & 0x3F) << 6 | (p[2] & 0x3F);
  if ((c >> 3) == 0x1E)
    return *len = 4,
           uint32_t(c & 0x07) << 18 | uint32_t(p[1] & 0x3F) << 12 | uint32_t(p[2] & 0x3F) << 6 | (p[3] & 0x3F);
  return *len = 1, 0xFFFD;
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

size_t utf8_find_invalid(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size(), i = 0;
  while (i < n) {
    // Fast path: 8 ASCII bytes at a time.
    if (i + 8 <= n) {
      uint64_t w;
      __builtin_memcpy(&w, p + i, 8);
      if ((w & 0x8080808080808080ull) == 0) {
        i += 8;
        continue;
      }
    }
    unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp, min;
    if ((c >> 5) == 0x6) len = 2, cp = c & 0x1F, min = 0x80;
    else if ((c >> 4) == 0xE) len = 3, cp = c & 0x0F, min = 0x800;
    else if ((c >> 3) == 0x1E) len = 4, cp = c & 0x07, min = 0x10000;
    else return i;
    if (i + len > n) return i;
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return i;
      cp = cp << 6 | (p[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return std::string_view::npos;
}

size_t utf8_count_chars(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

bool unicode_is_whitespace(uint32_t cp) {
  switch (cp) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0x85: case 0xA0:
    case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

bool unicode_is_numeric(uint32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  auto cat = utf8proc_category(utf8proc_int32_t(cp));
  return cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
}

bool unicode_is_mark(uint32_t cp) {
  auto cat = utf8proc_category(utf8proc_int32_t(cp));
  return cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_MC || cat == UTF8PROC_CATEGORY_ME;
}

bool unicode_is_word(uint32_t cp) {
  if (cp < 0x80) return (cp | 0x20) - 'a' < 26 || cp - '0' < 10 || cp == '_';
  if (cp == 0x200C || cp == 0x200D) return true;
  switch (utf8proc_category(utf8proc_int32_t(cp))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

}  // namespace strata::tok
