// Element types. f32 and bf16 are compute types; f16 exists only to read checkpoints; u8 holds
// bytes that are not numbers of one type (NF4 codes and scales, bitsandbytes' packed weights).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "src/core/bf16.h"

namespace strata {

enum class DType : uint8_t { f32, bf16, f16, i32, i64, u8 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);                  // "f32", "bf16", ...
const char* dtype_safetensors_name(DType t);      // "F32", "BF16", "F16", "I32", "I64", "U8"
bool dtype_from_safetensors(std::string_view s, DType* out);  // false when unknown
DType dtype_parse(std::string_view s);            // "f32" | "bf16" (user input; throws)

// Typed byte sizes: bytes_of<float>(n) is the bytes of n floats, count_of<float>(bytes) the
// floats in `bytes` (instead of bare * 4 and / 4).
template <class T>
constexpr size_t bytes_of(int64_t n) {
  return size_t(n) * sizeof(T);
}
template <class T>
constexpr size_t count_of(size_t bytes) {
  return bytes / sizeof(T);
}

// Converting copies between element types (f32, bf16, f16), n elements.
void dtype_convert(void* dst, DType dst_type, const void* src, DType src_type, size_t n);

}  // namespace strata
