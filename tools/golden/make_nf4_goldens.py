"""NF4 goldens from bitsandbytes (issue 40): quantize_4bit(blocksize=64, quant_type="nf4") with and
without double quantization (compress_statistics: the absmax minus its mean, 8-bit dynamic map,
blocks of 256) and dequantize_4bit, on the CPU, for tensors of awkward shapes. Writes
tests/golden/nf4/nf4_cases.json; strata's tests (tests/kernels/test_nf4.cpp) compare bit for bit.

Every float is stored as its bits (hex: f32 as 8 digits, bf16 as 4), byte arrays as hex strings;
the large case (over 32768 blocks, where torch's mean is summed in per-thread chunks) stores its
input as a formula and its long outputs as FNV-1a 64 hashes, for torch with 1 and 2 threads.

Rerun from the repository root (about 5 s):
    python tools/golden/make_nf4_goldens.py   # in a venv with bitsandbytes, torch, numpy
(bitsandbytes 0.50, torch 2.x, on a CPU; the script prints the versions it used.)"""
import json
import os

import numpy as np
import torch
import bitsandbytes
import bitsandbytes.functional as F

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "golden", "nf4", "nf4_cases.json")


def f32_hex(a):
    return [format(int(b), "08x") for b in np.asarray(a, dtype=np.float32).reshape(-1).view(np.uint32)]


def bf16_hex(t):
    return "".join(format(int(b) & 0xFFFF, "04x") for b in t.reshape(-1).view(torch.int16).tolist())


def bytes_hex(t):
    return t.reshape(-1).to(torch.uint8).numpy().tobytes().hex()


def fnv1a64(data: bytes):
    h = 0xCBF29CE484222325
    arr = np.frombuffer(data, dtype=np.uint8)
    # Plain loop in chunks (a few MB at most).
    for b in arr.tolist():
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return format(h, "016x")


def hash_input(n):
    """bf16 bits from an integer hash of the index (the C++ test makes the same):
    h = i * 2654435761 mod 2^32; sign bit 20, exponent 110 + ((h >> 28) & 7) + (i / 64) % 13 (so the
    blocks' absmax vary), mantissa (h >> 21) & 127."""
    i = np.arange(n, dtype=np.uint64)
    h = (i * np.uint64(2654435761)) & np.uint64(0xFFFFFFFF)
    sign = (h >> np.uint64(20)) & np.uint64(1)
    exp = np.uint64(110) + ((h >> np.uint64(28)) & np.uint64(7)) + (i // np.uint64(64)) % np.uint64(13)
    mant = (h >> np.uint64(21)) & np.uint64(127)
    bits = ((sign << np.uint64(15)) | (exp << np.uint64(7)) | mant).astype(np.uint16)
    return torch.from_numpy(bits.view(np.int16).copy()).view(torch.bfloat16)


def quantize_case(x, double_quant):
    q, st = F.quantize_4bit(x, blocksize=64, compress_statistics=double_quant, quant_type="nf4")
    out = {"codes": q}
    if double_quant:
        out["qabsmax"] = st.absmax
        out["absmax2"] = st.state2.absmax.numpy()
        out["offset"] = np.float32(st.offset.item())
        absmax = F.dequantize_blockwise(st.absmax, st.state2) + st.offset
        out["absmax"] = absmax.float().numpy()
    else:
        out["absmax"] = st.absmax.numpy()
    st.dtype = torch.bfloat16
    out["dequant_bf16"] = F.dequantize_4bit(q, st)
    st.dtype = torch.float32
    out["dequant_f32"] = F.dequantize_4bit(q, st).numpy()
    return out


def small_case(name, x, note):
    case = {"name": name, "note": note, "shape": list(x.shape), "input_dtype": "bf16" if x.dtype == torch.bfloat16 else "f32"}
    case["input"] = bf16_hex(x) if x.dtype == torch.bfloat16 else f32_hex(x.numpy())
    plain = quantize_case(x, False)
    nested = quantize_case(x, True)
    assert torch.equal(plain["codes"], nested["codes"])
    case["codes"] = bytes_hex(plain["codes"])
    case["absmax"] = f32_hex(plain["absmax"])
    case["dequant_bf16"] = bf16_hex(plain["dequant_bf16"])
    case["dequant_f32"] = f32_hex(plain["dequant_f32"])
    case["nested"] = {
        "qabsmax": bytes_hex(nested["qabsmax"]),
        "absmax2": f32_hex(nested["absmax2"]),
        "offset": f32_hex([nested["offset"]])[0],
        "absmax": f32_hex(nested["absmax"]),
        "dequant_bf16": bf16_hex(nested["dequant_bf16"]),
    }
    return case


def main():
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(40)
    cases = []
    cases.append(small_case("odd_300", torch.randn(300, generator=g).to(torch.bfloat16),
                            "300 elements: a last block of 44, five nested absmax"))
    cases.append(small_case("single", torch.tensor([-0.75]).to(torch.bfloat16),
                            "one element: the pad nibble, a nested block of one (absmax - mean = 0)"))
    cases.append(small_case("matrix_33x65", (0.02 * torch.randn(33, 65, generator=g)).to(torch.bfloat16),
                            "odd last dimension, 2145 elements"))
    cases.append(small_case("matrix_64x128", (0.05 * torch.randn(64, 128, generator=g)).to(torch.bfloat16),
                            "whole blocks, rows a multiple of 16: bitsandbytes' vectorised dequantization"))
    z = torch.randn(200, generator=g)
    z[0:64] = 0
    z[192:200] = 0
    cases.append(small_case("zero_blocks", z.to(torch.bfloat16),
                            "a zero full block and a zero last partial block (absmax stored as 1e-38)"))
    o = 0.02 * torch.randn(4096 + 31, generator=g)
    o[5] = 1000.0
    o[700] = -30000.0
    o[701] = 3.0e38
    o[4100] = -7.5
    cases.append(small_case("outliers", o.to(torch.bfloat16), "large outliers, one near bf16's max"))
    cases.append(small_case("all_zero", torch.zeros(128).to(torch.bfloat16), "every absmax 0, mean 0"))
    cases.append(small_case("f32_input", torch.randn(1000, generator=g) * 0.1, "f32 input, not bf16"))
    cases.append(small_case("ties", torch.tensor([1.0, 0.5 * (0.0 + 0.07958029955625534), -0.5, 0.0, 0.5, -1.0] * 11).to(torch.bfloat16),
                            "values near the NF4 midpoints"))

    n = 64 * 40000 + 17
    x = hash_input(n)
    big = {"name": "hash_2560017", "n": n, "note": "40001 blocks: torch sums the mean in per-thread chunks"}
    plain = quantize_case(x, False)
    big["codes_fnv64"] = fnv1a64(plain["codes"].numpy().tobytes())
    big["absmax_fnv64"] = fnv1a64(plain["absmax"].astype(np.float32).tobytes())
    big["dequant_bf16_fnv64"] = fnv1a64(plain["dequant_bf16"].view(torch.int16).numpy().tobytes())
    big["nested"] = {}
    for threads in (1, 2):
        torch.set_num_threads(threads)
        nested = quantize_case(x, True)
        big["nested"][str(threads)] = {
            "offset": f32_hex([nested["offset"]])[0],
            "qabsmax_fnv64": fnv1a64(nested["qabsmax"].numpy().tobytes()),
            "absmax2": f32_hex(nested["absmax2"]),
            "absmax_fnv64": fnv1a64(nested["absmax"].astype(np.float32).tobytes()),
        }
    torch.set_num_threads(1)

    doc = {
        "generator": "tools/golden/make_nf4_goldens.py",
        "bitsandbytes": bitsandbytes.__version__,
        "torch": torch.__version__,
        "nf4_code": f32_hex(F.get_4bit_type("nf4", device="cpu").numpy()),
        "dynamic_map": f32_hex(F.create_dynamic_map().numpy()),
        "cases": cases,
        "large": big,
    }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    # One line per case (a case is a few kB of hex), the rest indented.
    text = "{\n" + ",\n".join(" %s: %s" % (json.dumps(k), json.dumps(v)) for k, v in doc.items()
                              if k not in ("cases", "large"))
    text += ',\n "cases": [\n' + ",\n".join(json.dumps(c) for c in doc["cases"]) + "\n ],\n"
    text += ' "large": ' + json.dumps(doc["large"]) + "\n}\n"
    with open(OUT, "w") as f:
        f.write(text)
    print("wrote", os.path.normpath(OUT), "bitsandbytes", bitsandbytes.__version__, "torch", torch.__version__)


if __name__ == "__main__":
    main()
