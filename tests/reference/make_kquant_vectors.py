#!/usr/bin/env python3
"""Generates tests/data/kquant/: reference vectors for the C++ K-quant routines
(src/backend/cpu/quants_k*.cc), from the Python `gguf` package's dequantisation, which shares
no code with them.

Usage (needs `pip install gguf numpy`):
  python3 tests/reference/make_kquant_vectors.py [--out tests/data/kquant]

Output: `index.json` (the list of cases) and `vectors.bin` (the arrays, concatenated, each on a
4-byte boundary; offsets and sizes in bytes in the index). Case kinds:
  to_float  random Q2_K/Q3_K/Q4_K/Q5_K/Q6_K blocks (`raw`: random bytes with random finite fp16
            d/dmin, incl. zero, negative and subnormal ones) and gguf.quants.dequantize's float32
            values for them (`expected`).
  quantize  float32 rows (`input`) and their Q8_K blocks (`expected`), by a numpy transcription of
            llama.cpp's quantize_row_q8_K_ref (gguf-py has no Q8_K quantiser): max = the element
            of largest |x| (first on ties), iscale = -127/max, q = min(127, rint(iscale * x)),
            d = 1/iscale, bsums = sums of 16 consecutive q; all-zero block: d = 0, q = 0.
  vec_dot   one weight row (`w`, n elements of ggml type `ggml_type`), `rows` Q8_K activation
            rows (`x`), and `expected` (float32 per activation row): the dot product with the
            float steps of src/backend/cpu/quants_k.h, done here in numpy float32. The integer
            parts come from gguf-py itself: dequantising the block with d = 1, dmin = 0 gives
            sc * q per element, and with d = 0, dmin = 1 gives -m, so this program does not
            decode the bit layouts a second time. `expected_f64` is the float64 dot of gguf-py's
            dequantised weights with the activations, for a tolerance check of the definition.
Everything is seeded, so a rerun reproduces the same files (a few hundred KB).
"""

import argparse
import importlib.metadata
import json
import os

import numpy as np

import gguf
from gguf import GGMLQuantizationType as Q
from gguf import quants

SEED = 20261126
QK_K = 256
KTYPES = (Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K)
# byte offsets of the fp16 fields (d, then dmin where there is one) in each block
HALF_FIELDS = {Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}
Q8K_BYTES = 4 + QK_K + 2 * (QK_K // 16)


class Writer:
    def __init__(self):
        self.blob = bytearray()
        self.cases = []

    def put(self, arr):
        data = np.ascontiguousarray(arr).tobytes()
        off = len(self.blob)
        self.blob += data
        self.blob += b"\0" * (-len(self.blob) % 4)
        return {"offset": off, "bytes": len(data)}

    def add(self, case, **arrays):
        for k, v in arrays.items():
            case[k] = self.put(v)
        self.cases.append(case)


def random_fp16(rng, n, lo=1e-4, hi=0.05):
    v = (rng.uniform(lo, hi, n) * rng.choice([1, -1], n, p=[0.85, 0.15])).astype(np.float16)
    v[rng.random(n) < 0.05] = 0
    sub = rng.random(n) < 0.05
    v[sub] = (rng.integers(1, 1024, sub.sum()) * 2.0**-24).astype(np.float16)
    return v


def set_half(raw, off, values):
    raw[:, off:off + 2] = np.asarray(values, dtype=np.float16).view(np.uint8).reshape(-1, 2)


def random_blocks(rng, qtype, n_blocks):
    type_size = gguf.GGML_QUANT_SIZES[qtype][1]
    raw = rng.integers(0, 256, (n_blocks, type_size), dtype=np.uint8)
    for off in HALF_FIELDS[qtype]:
        set_half(raw, off, random_fp16(rng, n_blocks))
    return raw


def dequantize(raw, qtype):
    return quants.dequantize(raw.reshape(-1), qtype).astype(np.float32).reshape(raw.shape[0], -1)


def quantize_q8_k(x):
    """llama.cpp quantize_row_q8_K_ref; x: [blocks, 256] float32 -> [blocks, 292] bytes, d, q."""
    out = np.zeros((x.shape[0], Q8K_BYTES), dtype=np.uint8)
    ds = np.zeros(x.shape[0], dtype=np.float32)
    qs = np.zeros(x.shape, dtype=np.int8)
    for i, row in enumerate(x):
        j = int(np.argmax(np.abs(row)))
        amax = np.abs(row[j])
        if amax == 0:
            continue
        iscale = np.float32(-127.0) / row[j]
        v = (iscale * row).astype(np.float32)
        q = np.minimum(np.rint(v), 127).astype(np.int8)
        d = np.float32(1.0) / iscale
        bsums = q.astype(np.int16).reshape(16, 16).sum(axis=1).astype(np.int16)
        out[i] = np.frombuffer(np.float32(d).tobytes() + q.tobytes() + bsums.tobytes(), np.uint8)
        ds[i], qs[i] = d, q
    return out, ds, qs


def activation_inputs(rng, n_blocks):
    x = (rng.standard_normal((n_blocks, QK_K)) *
         rng.uniform(1e-3, 10, (n_blocks, 1))).astype(np.float32)
    x[0] = 0                                         # d = 0
    x[1] = np.arange(QK_K) - 127.5                   # max negative at the start
    x[2] = np.linspace(-1, 1, QK_K); x[2, 7] = 3.0  # max positive: iscale < 0
    x[3, :] = 0; x[3, 9] = -2.5                      # a single nonzero
    x[4] = 1e-30                                     # tiny
    x[5, :8] = [4, -4, 4, -4, 1, 2, 3, 0]            # ties on |max|: the first wins
    x[6] = np.round(rng.standard_normal(QK_K) * 20) / 2  # x.5 values: ties in rint
    return x


def dot_reference(qtype, w_raw, d_x, q_x):
    """The float32 steps of quants_k.h; w_raw [blocks, bytes], d_x [blocks], q_x [blocks, 256]."""
    has_min = len(HALF_FIELDS[qtype]) == 2
    d_off = HALF_FIELDS[qtype][0]
    dw = w_raw[:, d_off:d_off + 2].copy().view(np.float16).astype(np.float32).reshape(-1)
    unit = w_raw.copy()
    set_half(unit, d_off, np.ones(len(w_raw)))
    if has_min:
        set_half(unit, HALF_FIELDS[qtype][1], np.zeros(len(w_raw)))
    scq = dequantize(unit, qtype).astype(np.int64)   # sc * q, exact
    if has_min:
        mins = w_raw.copy()
        set_half(mins, d_off, np.zeros(len(w_raw)))
        set_half(mins, HALF_FIELDS[qtype][1], np.ones(len(w_raw)))
        m = (-dequantize(mins, qtype)).astype(np.int64)  # m per element, exact
        dmw = w_raw[:, HALF_FIELDS[qtype][1]:][:, :2].copy().view(np.float16).astype(np.float32)
        dmw = dmw.reshape(-1)
    acc = np.float32(0)
    for i in range(len(w_raw)):
        p = q_x[i].astype(np.int64)
        isum = int((scq[i] * p).sum())
        dd = np.float32(dw[i] * d_x[i])
        if has_min:
            msum = int((m[i] * p).sum())
            dm = np.float32(dmw[i] * d_x[i])
            tmp = np.float32(np.float32(dd * np.float32(isum)) - np.float32(dm * np.float32(msum)))
        else:
            tmp = np.float32(dd * np.float32(isum))
        acc = np.float32(acc + tmp)
    return acc


def add_to_float(w, rng):
    for qtype in KTYPES:
        raw = random_blocks(rng, qtype, 12)
        exp = dequantize(raw, qtype).reshape(-1)
        w.add({"kind": "to_float", "name": f"random_{qtype.name}", "ggml_type": int(qtype),
               "n": int(exp.size)}, raw=raw, expected=exp)


def add_quantize(w, rng):
    x = activation_inputs(rng, 12)
    q8k, _, _ = quantize_q8_k(x)
    w.add({"kind": "quantize", "name": "quantize_Q8_K", "ggml_type": int(Q.Q8_K),
           "n": int(x.size)}, input=x, expected=q8k)


def add_vec_dot(w, rng):
    blocks, rows = 8, 5
    for qtype in KTYPES:
        w_raw = random_blocks(rng, qtype, blocks)
        x = (rng.standard_normal((rows * blocks, QK_K)) *
             rng.uniform(0.01, 5, (rows * blocks, 1))).astype(np.float32)
        x[0] = 0  # one all-zero activation block
        q8k, d_x, q_x = quantize_q8_k(x)
        exp = np.array([dot_reference(qtype, w_raw, d_x[r * blocks:(r + 1) * blocks],
                                      q_x[r * blocks:(r + 1) * blocks]) for r in range(rows)],
                       dtype=np.float32)
        wf = dequantize(w_raw, qtype).reshape(-1).astype(np.float64)
        xf = (d_x[:, None].astype(np.float64) * q_x.astype(np.float64)).reshape(rows, -1)
        exp64 = xf @ wf
        w.add({"kind": "vec_dot", "name": f"vec_dot_{qtype.name}", "ggml_type": int(qtype),
               "n": blocks * QK_K, "rows": rows}, w=w_raw, x=q8k, expected=exp,
              expected_f64=exp64)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--out", default=os.path.join(root, "tests/data/kquant"))
    args = ap.parse_args()
    rng = np.random.default_rng(SEED)
    w = Writer()
    add_to_float(w, rng)
    add_quantize(w, rng)
    add_vec_dot(w, rng)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "vectors.bin"), "wb") as f:
        f.write(bytes(w.blob))
    index = {
        "generator": "tests/reference/make_kquant_vectors.py",
        "gguf_version": importlib.metadata.version("gguf"),
        "numpy_version": np.__version__,
        "cases": w.cases,
    }
    with open(os.path.join(args.out, "index.json"), "w") as f:
        json.dump(index, f, indent=1)
        f.write("\n")
    print(f"{len(w.cases)} cases, {len(w.blob)} bytes -> {args.out}")


if __name__ == "__main__":
    main()
