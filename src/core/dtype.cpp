#include "src/core/dtype.h"

#include <cstring>

#include "src/core/error.h"

namespace strata {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::u8: return 1;
  }
  STRATA_ASSERT(false, "bad dtype");
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
  }
  STRATA_ASSERT(false, "bad dtype");
}

const char* dtype_safetensors_name(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    case DType::u8: return "U8";
  }
  STRATA_ASSERT(false, "bad dtype");
}

bool dtype_from_safetensors(std::string_view s, DType* out) {
  if (s == "F32") *out = DType::f32;
  else if (s == "BF16") *out = DType::bf16;
  else if (s == "F16") *out = DType::f16;
  else if (s == "I32") *out = DType::i32;
  else if (s == "I64") *out = DType::i64;
  else if (s == "U8") *out = DType::u8;
  else return false;
  return true;
}

DType dtype_parse(std::string_view s) {
  if (s == "f32" || s == "float32" || s == "fp32") return DType::f32;
  if (s == "bf16" || s == "bfloat16") return DType::bf16;
  STRATA_CHECK(false, "unknown compute dtype '", s, "': use f32 or bf16");
}

static float load_f32(const void* src, DType t, size_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(src)[i];
    case DType::bf16: return bf16_to_f32(static_cast<const bf16*>(src)[i]);
    case DType::f16: return f16_to_f32(static_cast<const uint16_t*>(src)[i]);
    default: STRATA_ASSERT(false, "dtype_convert: not a float type");
  }
}

void dtype_convert(void* dst, DType dst_type, const void* src, DType src_type, size_t n) {
  if (dst_type == src_type) {
    std::memcpy(dst, src, n * dtype_size(dst_type));
    return;
  }
  // bf16 <-> f32, what loading a checkpoint does for every tensor (and an NF4 base twice): plain
  // loops the compiler vectorises, split over the kernels' threads when large (elementwise, so the
  // bits do not depend on the thread count; nested in a parallel region, OpenMP runs it on one).
  constexpr size_t kParallelFrom = size_t(1) << 18;
  if (src_type == DType::bf16 && dst_type == DType::f32) {
    const auto* in = static_cast<const bf16*>(src);
    auto* out = static_cast<float*>(dst);
#pragma omp parallel for schedule(static) if (n >= kParallelFrom)
    for (size_t i = 0; i < n; ++i) out[i] = bf16_to_f32(in[i]);
    return;
  }
  if (src_type == DType::f32 && dst_type == DType::bf16) {
    const auto* in = static_cast<const float*>(src);
    auto* out = static_cast<bf16*>(dst);
#pragma omp parallel for schedule(static) if (n >= kParallelFrom)
    for (size_t i = 0; i < n; ++i) out[i] = f32_to_bf16(in[i]);
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    float x = load_f32(src, src_type, i);
    switch (dst_type) {
      case DType::f32: static_cast<float*>(dst)[i] = x; break;
      case DType::bf16: static_cast<bf16*>(dst)[i] = f32_to_bf16(x); break;
      case DType::f16: static_cast<uint16_t*>(dst)[i] = f32_to_f16(x); break;
      default: STRATA_ASSERT(false, "dtype_convert: not a float type");
    }
  }
}

}  // namespace strata
