#!/usr/bin/env python3
"""Generates tests/data/quant/: reference vectors for the C++ block-format routines
(src/backend/cpu/quants*.cc), computed with the Python `gguf` package, which shares no code with
them.

Usage (needs `pip install gguf numpy`):
  python3 tests/reference/make_quant_vectors.py [--model models/SmolLM2-135M-Instruct.Q4_1.gguf]
                                                [--out tests/data/quant]

Output: `index.json` (the list of cases) and `vectors.bin` (every case's arrays, concatenated;
offsets and sizes in bytes are in the index). Case kinds:
  to_float     raw GGML blocks (`raw`) and the float32 values gguf.quants.dequantize gives for them
               (`expected`), for F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0:
                 - "random": random bytes with random finite fp16 scales (incl. zero, negative and
                   subnormal ones), and blocks gguf.quants.quantize made from Gaussian data;
                 - "model": rows of real tensors of the SmolLM2 GGUF file (`tensor`, `first_row`,
                   `rows`, `row_bytes`), so the C++ test can also check that its GGUF reader finds
                   the same bytes.
  quantize     float32 input (`input`) and the bytes of the activation format (`expected`):
               Q8_0 from gguf.quants.quantize (bit-exact with ggml's reference quantiser: d =
               amax/127, q = roundf(x / d)), and Q8_1 computed here in numpy the same way plus
               s = fp16(d * sum(q)) (the gguf package has no Q8_1).
  f32_to_f16   float32 input and the IEEE fp16 bits numpy's astype(float16) gives (round to
               nearest even, overflow to inf, subnormals).
  f32_to_bf16  float32 input and the bf16 bits of gguf.quants (ggml's rounding; NaN made quiet).
Everything is seeded, so a rerun reproduces the same files; the total stays well under 1 MB.
"""

import argparse
import importlib.metadata
import json
import os
import sys

import numpy as np

import gguf
from gguf import GGMLQuantizationType as Q
from gguf import quants

SEED = 20240607
QK = 32


class Writer:
    def __init__(self):
        self.blob = bytearray()
        self.cases = []

    def put(self, arr):
        data = np.ascontiguousarray(arr).tobytes()
        off = len(self.blob)
        self.blob += data
        # keep every array 4-byte aligned so the C++ side may read floats in place
        self.blob += b"\0" * (-len(self.blob) % 4)
        return {"offset": off, "bytes": len(data)}

    def add(self, case, **arrays):
        for k, v in arrays.items():
            case[k] = self.put(v)
        self.cases.append(case)


def random_fp16(rng, n, lo=1e-4, hi=0.5):
    """Random finite fp16 scales: mostly normal magnitudes, some zero/negative/subnormal."""
    v = (rng.uniform(lo, hi, n) * rng.choice([1, -1], n, p=[0.85, 0.15])).astype(np.float16)
    v[rng.random(n) < 0.05] = 0
    sub = rng.random(n) < 0.05
    v[sub] = (rng.integers(1, 1024, sub.sum()) * 2.0**-24).astype(np.float16)  # subnormals
    return v


def random_blocks(rng, qtype, n_blocks):
    """Random block bytes with sane fp16 fields (random bits there could be inf/NaN)."""
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (n_blocks, type_size), dtype=np.uint8)
    # fp16 fields at the start of the block: d (all types), m (the _1 types)
    n_half = 2 if qtype in (Q.Q4_1, Q.Q5_1) else 1
    for h in range(n_half):
        raw[:, 2 * h:2 * h + 2] = random_fp16(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    return raw


def quantized_gaussian(rng, qtype, n_blocks):
    x = (rng.standard_normal((n_blocks, QK)) * rng.uniform(0.01, 3, (n_blocks, 1))).astype(np.float32)
    x[0] = 0  # an all-zero block (d = 0)
    return quants.quantize(x.reshape(-1), qtype).reshape(n_blocks, -1)


def add_to_float_random(w, rng):
    for qtype in (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0):
        raw = np.concatenate([random_blocks(rng, qtype, 96), quantized_gaussian(rng, qtype, 32)])
        n = raw.shape[0] * QK
        exp = quants.dequantize(raw.reshape(-1), qtype).astype(np.float32).reshape(-1)
        assert exp.size == n
        w.add({"kind": "to_float", "source": "random", "name": f"random_{qtype.name}",
               "ggml_type": int(qtype), "n": n}, raw=raw, expected=exp)
    # F16 / BF16: every special class (random bit patterns cover NaN, inf, subnormals, -0).
    bits = rng.integers(0, 65536, 4096, dtype=np.uint16)
    bits[:8] = [0x0000, 0x8000, 0x0001, 0x83FF, 0x7BFF, 0x7C00, 0xFC00, 0x7E01]
    for qtype in (Q.F16, Q.BF16):
        n = bits.size
        exp = quants.dequantize(bits.view(np.uint8), qtype).astype(np.float32).reshape(-1)
        assert exp.size == n
        w.add({"kind": "to_float", "source": "random", "name": f"random_{qtype.name}",
               "ggml_type": int(qtype), "n": n}, raw=bits, expected=exp)
    f = rng.standard_normal(333).astype(np.float32)
    w.add({"kind": "to_float", "source": "random", "name": "random_F32",
           "ggml_type": int(Q.F32), "n": f.size}, raw=f, expected=f)


def add_to_float_model(w, path):
    reader = gguf.GGUFReader(path)
    tensors = {t.name: t for t in reader.tensors}
    picks = [("token_embd.weight", 0, 2), ("token_embd.weight", 12345, 1),
             ("token_embd.weight", 49151, 1), ("blk.0.attn_q.weight", 0, 4),
             ("blk.29.ffn_down.weight", 100, 2), ("output_norm.weight", 0, 1)]
    for name, first, rows in picks:
        t = tensors[name]
        data = np.asarray(t.data)
        qtype = Q(t.tensor_type)
        if data.ndim == 1:
            data = data.reshape(1, -1)
        raw = np.ascontiguousarray(data[first:first + rows])
        if qtype == Q.F32:
            raw_bytes = raw.view(np.uint8)
        else:
            raw_bytes = raw
        cols = int(t.shape[0])
        exp = quants.dequantize(raw_bytes.reshape(-1) if qtype != Q.F32 else raw.reshape(-1),
                                qtype).astype(np.float32).reshape(-1)
        assert exp.size == cols * rows, (name, exp.size)
        w.add({"kind": "to_float", "source": "model", "name": f"model_{name}_{first}",
               "ggml_type": int(qtype), "n": cols * rows, "tensor": name, "first_row": first,
               "rows": rows, "cols": cols, "row_bytes": raw_bytes.size // rows},
              raw=raw_bytes, expected=exp)


def activation_inputs(rng, n_blocks):
    x = (rng.standard_normal((n_blocks, QK)) * rng.uniform(1e-3, 10, (n_blocks, 1))).astype(np.float32)
    x[0] = 0                                     # d = 0
    x[1] = np.arange(QK) - 15.5                  # amax 15.5
    x[2] = np.arange(QK) - 16; x[2, 0] = -127    # amax 127 -> d = 1: x.5 values are exact ties
    x[2, 1:10] = [2.5, -2.5, 3.5, -3.5, 0.5, -0.5, 126.5, -1.5, 1.5]
    x[3] = 1e-30                                 # tiny
    x[4] = rng.standard_normal(QK).astype(np.float32) * 6e4  # near fp16 max
    x[5, :] = 0; x[5, 7] = -3.0                  # single nonzero
    return x


def add_quantize(w, rng):
    x = activation_inputs(rng, 48)
    q8_0 = quants.quantize(x.reshape(-1), Q.Q8_0).reshape(48, 34)
    w.add({"kind": "quantize", "name": "quantize_Q8_0", "ggml_type": int(Q.Q8_0),
           "n": x.size}, input=x, expected=q8_0)

    # Q8_1: same d and quants as Q8_0 (check that), plus s = fp16(d * sum(q)).
    d = (np.abs(x).max(axis=1, keepdims=True) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    q = quants.np_roundf((x * inv).astype(np.float32)).astype(np.int8)
    assert np.array_equal(q.view(np.uint8), q8_0[:, 2:]), "Q8_1 quants differ from Q8_0's"
    assert np.array_equal(d.astype(np.float16).view(np.uint8), q8_0[:, :2])
    s = (d[:, 0] * q.astype(np.int32).sum(axis=1).astype(np.float32)).astype(np.float32)
    q8_1 = np.concatenate([d.astype(np.float16).view(np.uint8),
                           s.astype(np.float16).view(np.uint8).reshape(-1, 2),
                           q.view(np.uint8)], axis=1)
    assert q8_1.shape == (48, 36)
    w.add({"kind": "quantize", "name": "quantize_Q8_1", "ggml_type": int(Q.Q8_1),
           "n": x.size}, input=x, expected=q8_1)


def add_half(w, rng):
    special = np.array([
        0.0, -0.0, 1.0, -1.0, 65504.0, 65519.996, 65520.0, -65520.0, 1e10, np.inf, -np.inf,
        2.0**-14, 2.0**-14 * (1 - 2.0**-12), 2.0**-24, 2.0**-25, 2.0**-25 * 1.0000001,
        2.0**-26, 3 * 2.0**-25, 5 * 2.0**-25, 1 + 2.0**-11, 1 + 3 * 2.0**-11, 1e-45, 0.1, 1 / 3,
    ], dtype=np.float32)
    bits = rng.integers(0, 2**32, 4000, dtype=np.uint64).astype(np.uint32)
    # mostly values in the fp16 range, and raw patterns (NaNs included)
    near = (rng.standard_normal(4000) * np.exp(rng.uniform(-20, 12, 4000))).astype(np.float32)
    x = np.concatenate([special, near, bits.view(np.float32)])
    x = x[~np.isnan(x)]  # NaN payload handling differs between converters; tested separately
    with np.errstate(over="ignore"):
        h = x.astype(np.float16).view(np.uint16)
    w.add({"kind": "f32_to_f16", "name": "f32_to_f16", "n": x.size}, input=x, expected=h)
    xb = np.concatenate([special, near, bits.view(np.float32)])
    b = quants.quantize(xb, Q.BF16).view(np.uint16)
    w.add({"kind": "f32_to_bf16", "name": "f32_to_bf16", "n": xb.size}, input=xb, expected=b)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--model", default=os.path.join(root, "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--out", default=os.path.join(root, "tests/data/quant"))
    args = ap.parse_args()
    if not os.path.exists(args.model):
        sys.exit(f"model not found: {args.model}")

    rng = np.random.default_rng(SEED)
    w = Writer()
    add_to_float_random(w, rng)
    add_to_float_model(w, args.model)
    add_quantize(w, rng)
    add_half(w, rng)

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "vectors.bin"), "wb") as f:
        f.write(bytes(w.blob))
    index = {
        "generator": "tests/reference/make_quant_vectors.py",
        "gguf_version": importlib.metadata.version("gguf"),
        "numpy_version": np.__version__,
        "model": os.path.basename(args.model),
        "cases": w.cases,
    }
    with open(os.path.join(args.out, "index.json"), "w") as f:
        json.dump(index, f, indent=1)
        f.write("\n")
    print(f"{len(w.cases)} cases, {len(w.blob)} bytes -> {args.out}")


if __name__ == "__main__":
    main()
