// The NF4 base (nf4_layout.h): which rows are packed, their byte layout, packing at load, and
// the decoding of a layer's packed block on the device.
#include "offload/state/nf4_layout.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/nf4.h"
#include "offload/state/host_store.h"
#include "src/core/align.h"
#include "src/core/error.h"

namespace strata {
namespace {

size_t align4(size_t bytes) { return (bytes + 3) / 4 * 4; }

}  // namespace

void nf4_base_enable(ModelSpec& spec, bool double_quant) {
  STRATA_CHECK(spec.matrix_dtype == DType::bf16 || spec.matrix_dtype == DType::f32, "lora.base_dtype = \"nf4\" "
               "computes in bf16: set model.dtype = \"bf16\" (it is ", dtype_name(spec.matrix_dtype), ")");
  spec.base_quant.nf4 = true;
  spec.base_quant.double_quant = double_quant;
}

// The rows bitsandbytes quantizes are the modules transformers builds as plain nn.Linear in the
// decoder layers: each layer kind's LoRA-targetable linears (Phi-3's fused qkv_proj and
// gate_up_proj among them). A mixture-of-experts layer's experts are packed 3-D nn.Parameters in
// transformers 5 and its router a module of its own, neither an nn.Linear: bitsandbytes leaves
// them in bf16, and so does this (tools/golden/make_qlora_family_goldens.py records both lists).
std::vector<bool> nf4_packed_rows(const ModelSpec& spec) {
  std::vector<bool> packed(spec.params.size(), false);
  if (!spec.base_quant.nf4) return packed;
  for (const ModelLayer& layer : spec.layers)
    for (int t = 0; t < kLayerLinears; ++t)
      if (const int64_t row = layer.linear_row(t); row != kAbsent) packed[size_t(row)] = true;
  return packed;
}

size_t nf4_decode_bytes(const ModelSpec& spec, size_t layer) {
  if (!spec.base_quant.nf4) return 0;
  size_t bytes = 0;
  for (int t = 0; t < kLayerLinears; ++t)
    if (const int64_t row = spec.layers[layer].linear_row(t); row != kAbsent) {
      const int64_t n = spec.params[size_t(row)].numel();
      bytes += Nf4RowLayout::of(n, spec.base_quant.double_quant).bytes + size_t(n) * dtype_size(spec.matrix_dtype);
    }
  return bytes;
}

Nf4RowLayout Nf4RowLayout::of(int64_t n, bool double_quant) {
  Nf4RowLayout l;
  l.n = n;
  l.double_quant = double_quant;
  const size_t codes = align4(size_t(cpu::nf4_code_bytes(n))), blocks = size_t(cpu::nf4_blocks(n));
  if (double_quant) {
    l.qabsmax = codes;
    l.absmax = l.qabsmax + align4(blocks);
    l.offset = l.absmax + 4 * size_t(cpu::nf4_nested_blocks(n));
    l.bytes = l.offset + 4;
  } else {
    l.absmax = codes;
    l.bytes = l.absmax + 4 * blocks;
  }
  return l;
}

void nf4_pack_row(char* dst, const float* values, int64_t n, const BaseQuant& q) {
  const Nf4RowLayout l = Nf4RowLayout::of(n, q.double_quant);
  std::memset(dst, 0, l.bytes);
  auto* codes = reinterpret_cast<uint8_t*>(dst);
  const int64_t blocks = cpu::nf4_blocks(n);
  std::vector<float> own_absmax(q.double_quant ? size_t(blocks) : 0);
  float* absmax = q.double_quant ? own_absmax.data() : reinterpret_cast<float*>(dst + l.absmax);
  // Rounded to bf16 and quantized a piece at a time (whole blocks, so the codes and absmax are the
  // row's): a bf16 copy of the whole row would be a transient as large as the largest linear,
  // page-faulted in at every row (most of a load's time in strata-bench nf4 before).
  constexpr int64_t kPiece = int64_t(1) << 20;  // weights, a multiple of the block
  std::vector<bf16> w(static_cast<size_t>(std::min(n, kPiece)));
  for (int64_t at = 0; at < n; at += kPiece) {
    const int64_t len = std::min(kPiece, n - at);
    dtype_convert(w.data(), DType::bf16, values + at, DType::f32, size_t(len));  // threaded, as nf4_quantize
    cpu::nf4_quantize(codes + at / 2, absmax + at / cpu::kNf4Block, w.data(), len);
  }
  if (!q.double_quant) return;
  float offset = 0;
  cpu::nf4_double_quantize(reinterpret_cast<uint8_t*>(dst + l.qabsmax), reinterpret_cast<float*>(dst + l.absmax),
                           &offset, absmax, blocks, q.torch_threads);
  std::memcpy(dst + l.offset, &offset, 4);
}

void nf4_unpack_row(float* values, const char* src, int64_t n, bool double_quant) {
  const Nf4RowLayout l = Nf4RowLayout::of(n, double_quant);
  float offset = 0;
  if (double_quant) std::memcpy(&offset, src + l.offset, 4);
  std::vector<bf16> w(static_cast<size_t>(n));
  cpu::nf4_dequantize_bf16(w.data(), reinterpret_cast<const uint8_t*>(src),
                           double_quant ? reinterpret_cast<const uint8_t*>(src + l.qabsmax) : nullptr,
                           reinterpret_cast<const float*>(src + l.absmax), offset, n);
  dtype_convert(values, DType::f32, w.data(), DType::bf16, size_t(n));
}

LayerSlotBytes layer_slot_bytes_of(const HostStoreLayout& layout, size_t layer) {
  const ParamGroup& g = layout.groups[1 + layer];
  if (!layout.packed) return {g.working_bytes, 0};
  return {align_up(g.device_bytes), g.working_bytes};
}

LayerSlotBytes layer_slot_bytes(const HostStoreLayout& layout, size_t layers) {
  LayerSlotBytes most;
  for (size_t l = 0; l < layers; ++l) {
    const LayerSlotBytes b = layer_slot_bytes_of(layout, l);
    most.decoded = std::max(most.decoded, b.decoded);
    most.packed = std::max(most.packed, b.packed);
  }
  return most;
}

void nf4_decode_layer(Device& dev, char* decoded, const char* packed, const HostStore& store, size_t layer,
                      Stream s) {
  nf4_decode_rows(dev, decoded, packed, store, layer, store.layer_group(layer).end_row, s);
}

void nf4_decode_rows(Device& dev, char* decoded, const char* packed, const HostStore& store, size_t layer,
                     size_t end_row, Stream s) {
  const ParamGroup& g = store.layer_group(layer);
  const TensorTable &host = store.working_table(), &device = store.device_table();
  const char* host_block = store.working() + g.working_offset;
  const bool dq = store.spec().base_quant.double_quant;
  for (size_t r = g.first_row; r < end_row; ++r) {
    char* out = decoded + (device[r].offset - g.device_offset);
    const size_t in = host[r].offset - g.working_offset;
    if (host[r].dtype != DType::u8) {
      dev.copy_d2d(out, packed + in, host[r].bytes(), s);
      continue;
    }
    const int64_t n = device[r].numel();
    const Nf4RowLayout l = Nf4RowLayout::of(n, dq);
    float offset = 0;  // read from the host copy (a device read would wait for the upload)
    if (dq) std::memcpy(&offset, host_block + in + l.offset, 4);
    const auto* p = reinterpret_cast<const uint8_t*>(packed + in);
    dev.nf4_dequantize(out, device[r].dtype, p, dq ? p + l.qabsmax : nullptr, reinterpret_cast<const float*>(p + l.absmax),
                       offset, n, s);
  }
}

}  // namespace strata
