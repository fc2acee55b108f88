// NF4 quantization on the host, bitsandbytes' arithmetic (kernels/cpu/nf4.h); the dequantization
// entries take the active variant of kernels/cpu/nf4_dequantize.h.
// Compiled with -ffp-contract=off (CMakeLists.txt): every product and sum is rounded on its own,
// as bitsandbytes' kernels round them; a fused multiply-add would change bits.
#include "kernels/cpu/nf4.h"
#include "kernels/cpu/nf4_dequantize.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "src/core/error.h"


namespace strata::cpu {
namespace {

// bitsandbytes' NF4 table (functional.get_4bit_type("nf4")): the float32 values it holds.
constexpr float kNf4[16] = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
    -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
    0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,
    0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f};

// torch.linspace(start, end, k, float32) on the CPU: start + step·i for the first half, end -
// step·(k-1-i) for the rest, each a fused multiply-add (what torch's kernel computes).
std::vector<float> torch_linspace(float start, float end, int k) {
  const float step = (end - start) / float(k - 1);
  std::vector<float> out(static_cast<size_t>(k));
  for (int i = 0; i < k; ++i)
    out[size_t(i)] = i < k / 2 ? std::fmaf(step, float(i), start)
                               : std::fmaf(-step, float(k - 1 - i), end);
  return out;
}

// create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8): for exponent i = 0..6 the
// midpoints of linspace(0.1, 1, 2^i + 1) times ±10^(i-6), then 0 and 1, sorted.
std::array<float, 256> build_dynamic_map() {
  std::vector<float> data;
  for (int i = 0; i < 7; ++i) {
    const auto b = torch_linspace(0.1f, 1.0f, (1 << i) + 1);
    const float scale = float(std::pow(10.0, double(i - 6)));
    for (size_t j = 0; j + 1 < b.size(); ++j) data.push_back(scale * ((b[j] + b[j + 1]) / 2.0f));
    for (size_t j = 0; j + 1 < b.size(); ++j) data.push_back(-scale * ((b[j] + b[j + 1]) / 2.0f));
  }
  data.push_back(0.0f);
  data.push_back(1.0f);
  std::sort(data.begin(), data.end());
  std::array<float, 256> map{};
  std::copy(data.begin(), data.end(), map.begin());
  return map;
}

const std::array<float, 256>& dynamic_map() {
  static const std::array<float, 256> map = build_dynamic_map();
  return map;
}

// bitsandbytes' 8-bit quantization table: 65536 evenly spaced points of [-1, 1] mapped to the
// index of the first map value whose upper midpoint is not below them (the nearest value).
struct Lut8 {
  std::vector<uint8_t> index;
  Lut8() : index(65536) {
    const auto& code = dynamic_map();
    float mid[255];
    for (int i = 0; i < 255; ++i) mid[i] = 0.5f * (code[size_t(i)] + code[size_t(i) + 1]);
    int c = 0;
    for (int i = 0; i < 65536; ++i) {
      const float val = -1.0f + (2.0f * float(i)) / float(65535);
      while (c < 255 && mid[c] < val) ++c;
      index[size_t(i)] = uint8_t(c);
    }
  }
};

const Lut8& lut8() {
  static const Lut8 lut;
  return lut;
}

// The NF4 index of a normalised value: the count of midpoints strictly below it
// (torch.bucketize, right=False), so a value on a midpoint takes the lower code. A branch-free
// binary search over the 15 midpoints padded with +inf to 16.
struct Nf4Bounds {
  float mid[16];
  Nf4Bounds() {
    for (int i = 0; i < 15; ++i) mid[i] = (kNf4[i] + kNf4[i + 1]) / 2.0f;
    mid[15] = INFINITY;
  }
};

inline uint8_t nf4_index(const Nf4Bounds& b, float v) {
  int q = b.mid[7] < v ? 8 : 0;
  q += b.mid[q + 3] < v ? 4 : 0;
  q += b.mid[q + 1] < v ? 2 : 0;
  q += b.mid[q] < v ? 1 : 0;
  return uint8_t(q);
}

inline float clamp_unit(float v) { return std::min(1.0f, std::max(-1.0f, v)); }

template <class T>
float load(const T* x, int64_t i) {
  if constexpr (std::is_same_v<T, bf16>)
    return bf16_to_f32(x[i]);
  else
    return x[i];
}

// Block b of x (64 elements, or the last partial block) quantized, as bitsandbytes does (the
// header). Written for the vectoriser (-march=native): the absmax as the largest |x| bit pattern
// (finite floats order as their sign-cleared bits, so this is max |x| exactly, and a pattern at or
// above the infinity's says the block holds a NaN or an infinity), and each code as the count of
// NF4 midpoints strictly below the clamped value (what the binary search finds: the midpoints
// ascend). Every float operation is the one the scalar loop did, so the bits are bitsandbytes'.
// Returns false when the block is not finite.
template <class T>
bool quantize_block(uint8_t* codes, float* absmax, const T* x, int64_t n, int64_t b) {
  static const Nf4Bounds bounds;
  const int64_t begin = b * kNf4Block, len = std::min(n - begin, kNf4Block);
  float v[kNf4Block];
  uint32_t most = 0;
  for (int64_t i = 0; i < len; ++i) {
    v[i] = load(x, begin + i);
    most = std::max(most, std::bit_cast<uint32_t>(v[i]) & 0x7fffffffu);
  }
  if (most >= 0x7f800000u) return false;
  const float m = std::bit_cast<float>(most);
  const bool full = len == kNf4Block;
  // torch: full blocks scale by the reciprocal of max(absmax, 1e-38) and keep absmax as is;
  // the last partial block divides by max(absmax, 1e-38), which is also what it stores.
  const float clamped = std::max(m, 1e-38f);
  absmax[b] = full ? m : clamped;
  if (full) {
    const float r = 1.0f / clamped;
    for (int64_t i = 0; i < kNf4Block; ++i) v[i] = v[i] * r;
  } else {
    for (int64_t i = 0; i < len; ++i) v[i] = v[i] / clamped;
  }
  int32_t k[kNf4Block];
  for (int64_t i = 0; i < len; ++i) v[i] = clamp_unit(v[i]), k[i] = 0;
  for (int j = 0; j < 15; ++j) {
    const float mid = bounds.mid[j];
    for (int64_t i = 0; i < len; ++i) k[i] += mid < v[i] ? 1 : 0;
  }
  uint8_t q[kNf4Block];
  for (int64_t i = 0; i < len; ++i) q[i] = uint8_t(k[i]);
  // Blocks are 64 elements (even), so a byte never straddles two blocks.
  uint8_t* out = codes + begin / 2;
  for (int64_t i = 0; i + 1 < len; i += 2) out[i / 2] = uint8_t(q[i] << 4 | q[i + 1]);
  if (len % 2) out[(len - 1) / 2] = uint8_t(q[len - 1] << 4);
  return true;
}

template <class T>
void quantize_impl(uint8_t* codes, float* absmax, const T* x, int64_t n) {
  static const Nf4Bounds bounds;
  const int64_t blocks = nf4_blocks(n);
  int64_t first_bad = n;  // the first block holding a NaN or an infinity (times 64), if any
#pragma omp parallel for schedule(static) reduction(min : first_bad)
  for (int64_t b = 0; b < blocks; ++b)
    if (!quantize_block(codes, absmax, x, n, b)) first_bad = std::min(first_bad, b * kNf4Block);
  STRATA_CHECK(first_bad == n, "NF4 quantization: the tensor holds a NaN or an infinity in elements [",
               first_bad, ", ", std::min(n, first_bad + kNf4Block),
               "); only finite weights can be quantized (check the checkpoint)");
  // An odd count pads the last byte's low nibble with the code of 0.0 (bitsandbytes pads with 0).
  if (n % 2) codes[n / 2] = uint8_t(codes[n / 2] | nf4_index(bounds, 0.0f));
}

// SumKernel.cpp's multi_row_sum: `size` rows of 4 columns (each column a W-wide vector), summed
// with 4 accumulator levels that each take `1 << level_power` rows before carrying up.
constexpr int kW = 8;  // Vectorized<float>::size() in torch's sum kernel on x86
using Vec = std::array<float, kW>;

inline void vadd(Vec& a, const Vec& b) {
  for (int k = 0; k < kW; ++k) a[size_t(k)] = a[size_t(k)] + b[size_t(k)];
}

int64_t ceil_log2(int64_t x) {
  if (x <= 2) return 1;
  int64_t bits = 0;
  for (uint64_t v = uint64_t(x - 1); v; v >>= 1) ++bits;
  return bits;
}

// rows[i][k] = x[(i*4 + k)*W .. +W)
std::array<Vec, 4> multi_row_sum(const float* x, int64_t size, int width) {
  constexpr int kLevels = 4;
  const int64_t level_power = std::max<int64_t>(4, ceil_log2(size) / kLevels);
  const int64_t level_step = int64_t(1) << level_power;
  const int64_t level_mask = level_step - 1;
  std::array<std::array<Vec, 4>, kLevels> acc{};
  auto load_row = [&](int64_t i, int k) {
    Vec v{};
    for (int j = 0; j < width; ++j) v[size_t(j)] = x[(i * 4 + k) * width + j];
    return v;
  };
  int64_t i = 0;
  while (i + level_step <= size) {
    for (int64_t j = 0; j < level_step; ++j, ++i)
      for (int k = 0; k < 4; ++k) vadd(acc[0][size_t(k)], load_row(i, k));
    for (int j = 1; j < kLevels; ++j) {
      for (int k = 0; k < 4; ++k) {
        vadd(acc[size_t(j)][size_t(k)], acc[size_t(j - 1)][size_t(k)]);
        acc[size_t(j - 1)][size_t(k)] = Vec{};
      }
      if ((i & (level_mask << (j * level_power))) != 0) break;
    }
  }
  for (; i < size; ++i)
    for (int k = 0; k < 4; ++k) vadd(acc[0][size_t(k)], load_row(i, k));
  for (int j = 1; j < kLevels; ++j)
    for (int k = 0; k < 4; ++k) vadd(acc[0][size_t(k)], acc[size_t(j)][size_t(k)]);
  return acc[0];
}

// row_sum: `rows` vectors of `width` floats, as (rows/4, 4), the leftover rows into column 0.
Vec row_sum(const float* x, int64_t rows, int width) {
  const int64_t size_ilp = rows / 4;
  auto partial = multi_row_sum(x, size_ilp, width);
  for (int64_t i = size_ilp * 4; i < rows; ++i) {
    Vec v{};
    for (int j = 0; j < width; ++j) v[size_t(j)] = x[i * width + j];
    vadd(partial[0], v);
  }
  for (int k = 1; k < 4; ++k) vadd(partial[0], partial[size_t(k)]);
  return partial[0];
}

// One chunk of the reduction: the vectorised inner sum when it holds a full vector, else the
// scalar one.
float chunk_sum(const float* x, int64_t n) {
  if (n < kW) return row_sum(x, n, 1)[0];
  const int64_t vecs = n / kW;
  const Vec v = row_sum(x, vecs, kW);
  float acc = 0.0f;
  for (int64_t k = vecs * kW; k < n; ++k) acc = acc + x[k];
  for (int k = 0; k < kW; ++k) acc = acc + v[size_t(k)];
  return acc;
}

}  // namespace

const float* nf4_code() { return kNf4; }
const float* nf4_dynamic_map() { return dynamic_map().data(); }

void nf4_quantize(uint8_t* codes, float* absmax, const float* x, int64_t n) {
  quantize_impl(codes, absmax, x, n);
}
void nf4_quantize(uint8_t* codes, float* absmax, const bf16* x, int64_t n) {
  quantize_impl(codes, absmax, x, n);
}

float nf4_torch_sum(const float* x, int64_t n, int torch_threads) {
  constexpr int64_t kGrain = 32768;  // at::internal::GRAIN_SIZE
  if (n <= 0) return 0.0f;
  if (torch_threads <= 1 || n < kGrain) return 0.0f + chunk_sum(x, n);
  const int64_t tasks = std::min<int64_t>(torch_threads, (n + kGrain - 1) / kGrain);
  const int64_t chunk = (n + tasks - 1) / tasks;
  float acc = 0.0f;
  for (int64_t b = 0; b < n; b += chunk) acc = acc + (0.0f + chunk_sum(x + b, std::min(chunk, n - b)));
  return 0.0f + acc;
}

void nf4_blockwise8_quantize(uint8_t* q, float* absmax2, const float* v, int64_t n, int64_t block) {
  const auto& lut = lut8().index;
  const int64_t blocks = (n + block - 1) / block;
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * block, end = std::min(n, begin + block);
    float m = 0.0f;
    for (int64_t i = begin; i < end; ++i) m = std::max(m, std::fabs(v[i]));
    absmax2[b] = m;
    if (m == 0.0f) {
      std::fill(q + begin, q + end, uint8_t(0));
      continue;
    }
    const float inv = 1.0f / m;
    for (int64_t i = begin; i < end; ++i) {
      const float u = clamp_unit(v[i] * inv);
      const float t = (u + 1.0f) * 0.5f;
      const float scaled = t * float(65535);
      q[i] = lut[size_t(uint16_t(scaled + 0.5f))];
    }
  }
}

void nf4_double_quantize(uint8_t* qabsmax, float* absmax2, float* offset, const float* absmax,
                         int64_t blocks, int torch_threads) {
  const float mean = nf4_torch_sum(absmax, blocks, torch_threads) / float(blocks);
  std::vector<float> centred(static_cast<size_t>(blocks));
  for (int64_t b = 0; b < blocks; ++b) centred[size_t(b)] = absmax[b] - mean;
  nf4_blockwise8_quantize(qabsmax, absmax2, centred.data(), blocks, kNf4NestedBlock);
  *offset = mean;
}

void nf4_absmax_dequantize(float* absmax, const uint8_t* qabsmax, const float* absmax2,
                           float offset, int64_t blocks) {
  const float* map = nf4_dynamic_map();
  for (int64_t b = 0; b < blocks; ++b) {
    const float scaled = map[qabsmax[b]] * absmax2[b / kNf4NestedBlock];
    absmax[b] = scaled + offset;
  }
}

void nf4_dequantize_bf16(bf16* w, const uint8_t* codes, const uint8_t* qabsmax,
                         const float* absmax, float offset, int64_t n) {
  nf4_dequantize_isa(nf4_isa_active(), Nf4Out::bf16, w, codes, qabsmax, absmax, offset, n);
}

void nf4_dequantize_f32(float* w, const uint8_t* codes, const uint8_t* qabsmax,
                        const float* absmax, float offset, int64_t n) {
  nf4_dequantize_isa(nf4_isa_active(), Nf4Out::f32, w, codes, qabsmax, absmax, offset, n);
}

void nf4_dequantize_bf16_as_f32(float* w, const uint8_t* codes, const uint8_t* qabsmax, const float* absmax,
                                float offset, int64_t n) {
  nf4_dequantize_isa(nf4_isa_active(), Nf4Out::bf16_as_f32, w, codes, qabsmax, absmax, offset, n);
}

}  // namespace strata::cpu
