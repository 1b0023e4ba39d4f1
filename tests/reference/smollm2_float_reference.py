#!/usr/bin/env python3
"""Float64 reference forward pass for SmolLM2-135M-Instruct on its dequantised GGUF weights.

specinfer's Q4_1 engine re-quantises activations to Q8_1 blocks, so it matches llama.cpp only to
quantisation noise (tests/data/smollm2/reference_llamacpp.json). This script gives a float-exact
yardstick instead: every weight of models/SmolLM2-135M-Instruct.Q4_1.gguf is dequantised with
gguf-py (gguf.quants.dequantize, numpy, independent of specinfer's C++ dequantiser) and an
independent numpy implementation of the llama forward pass runs on them in float64, i.e. it
computes the "true" output of the dequantised model. tests/engine/smollm2_float_conformance_test.cc
runs specinfer's CPU backend on the same model dequantised to F32 (DequantizeToF32) and compares.

The forward pass, written from the architecture (GGUF llama; Q/K rows already permuted by the
converter so RoPE rotates interleaved pairs):
  x = token_embd[id]
  per layer: h = rmsnorm(x) * attn_norm; q, k, v = Wq h, Wk h, Wv h;
             RoPE on pairs (2i, 2i+1) of each head, angle pos * theta^(-2i/head_dim);
             GQA: query head h reads kv head h // (n_heads / n_kv_heads);
             causal softmax(q.k / sqrt(head_dim)) v; x += Wo attn;
             h = rmsnorm(x) * ffn_norm; x += W_down (silu(W_gate h) * (W_up h))
  logits = token_embd (tied output) @ (rmsnorm(x) * output_norm)
  rmsnorm(x) = x / sqrt(mean(x^2) + eps)

Per case of reference_llamacpp.json (its prompt_tokens, so the ids come from llama.cpp's
tokenizer) the output records the full logits at the last prompt position (n_vocab float32,
base64; computed in float64 and rounded once), and 64 greedy tokens (argmax of the float64
logits, fed back one at a time through a KV cache, no stop at EOS) with each step's top-1 minus
top-2 margin (step 0 is the last prompt position).

    python3 tests/reference/smollm2_float_reference.py --write   # regenerate the JSON
    python3 tests/reference/smollm2_float_reference.py --check   # recompute and compare
"""

import argparse
import base64
import hashlib
import json
import os
import platform
import sys
import time
from importlib import metadata

import numpy as np
import gguf
from gguf.quants import dequantize

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_MODEL = os.path.join(REPO, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
LLAMACPP_JSON = os.path.join(REPO, "tests", "data", "smollm2", "reference_llamacpp.json")
DEFAULT_OUT = os.path.join(REPO, "tests", "data", "smollm2", "reference_float.json")
EXPECTED_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
N_GEN = 64


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def field(reader, key):
    f = reader.fields[key]
    v = f.parts[f.data[0]]
    if f.types and f.types[0] == gguf.GGUFValueType.STRING:
        return bytes(v).decode()
    return v.tolist()[0]


class Model:
    def __init__(self, path):
        r = gguf.GGUFReader(path)
        arch = field(r, "general.architecture")
        assert arch == "llama", arch
        self.n_layers = field(r, "llama.block_count")
        self.dim = field(r, "llama.embedding_length")
        self.n_heads = field(r, "llama.attention.head_count")
        self.n_kv_heads = field(r, "llama.attention.head_count_kv")
        self.eps = field(r, "llama.attention.layer_norm_rms_epsilon")
        self.theta = field(r, "llama.rope.freq_base")
        self.head_dim = self.dim // self.n_heads
        t = {}
        for tensor in r.tensors:
            w = dequantize(tensor.data, tensor.tensor_type)  # [rows, cols] float32
            t[tensor.name] = np.ascontiguousarray(w, dtype=np.float64)
        self.embd = t["token_embd.weight"]                    # [vocab, dim]
        self.output = t.get("output.weight", self.embd)      # tied when absent
        self.out_norm = t["output_norm.weight"]
        self.layers = []
        for i in range(self.n_layers):
            p = f"blk.{i}."
            self.layers.append({k: t[p + k + ".weight"] for k in (
                "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")})
        self.vocab = self.embd.shape[0]
        assert self.embd.shape[1] == self.dim

    def rmsnorm(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x, pos):
        # x: [n, heads, head_dim]; pos: [n]. Rotates pairs (2i, 2i+1).
        i = np.arange(self.head_dim // 2, dtype=np.float64)
        freq = self.theta ** (-2.0 * i / self.head_dim)
        ang = pos[:, None].astype(np.float64) * freq[None, :]        # [n, head_dim/2]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * c - x1 * s
        out[..., 1::2] = x0 * s + x1 * c
        return out

    def new_cache(self):
        return [{"k": np.zeros((0, self.n_kv_heads, self.head_dim)),
                 "v": np.zeros((0, self.n_kv_heads, self.head_dim))} for _ in range(self.n_layers)]

    def forward(self, tokens, cache):
        """Appends `tokens` to the sequence held in `cache`; returns the last position's logits."""
        n = len(tokens)
        start = cache[0]["k"].shape[0]
        pos = np.arange(start, start + n)
        x = self.embd[np.asarray(tokens)]                             # [n, dim]
        group = self.n_heads // self.n_kv_heads
        scale = 1.0 / np.sqrt(self.head_dim)
        for l, c in zip(self.layers, cache):
            h = self.rmsnorm(x, l["attn_norm"])
            q = (h @ l["attn_q"].T).reshape(n, self.n_heads, self.head_dim)
            k = (h @ l["attn_k"].T).reshape(n, self.n_kv_heads, self.head_dim)
            v = (h @ l["attn_v"].T).reshape(n, self.n_kv_heads, self.head_dim)
            q, k = self.rope(q, pos), self.rope(k, pos)
            c["k"] = np.concatenate([c["k"], k])
            c["v"] = np.concatenate([c["v"], v])
            total = c["k"].shape[0]
            att = np.empty((n, self.n_heads, self.head_dim))
            # causal mask: query at position pos[t] sees keys 0..pos[t]
            mask = np.arange(total)[None, :] > pos[:, None]           # [n, total]
            for hh in range(self.n_heads):
                kv = hh // group
                s = (q[:, hh, :] @ c["k"][:, kv, :].T) * scale        # [n, total]
                s = np.where(mask, -np.inf, s)
                s = np.exp(s - s.max(axis=1, keepdims=True))
                s /= s.sum(axis=1, keepdims=True)
                att[:, hh, :] = s @ c["v"][:, kv, :]
            x = x + att.reshape(n, -1) @ l["attn_output"].T
            h = self.rmsnorm(x, l["ffn_norm"])
            g = h @ l["ffn_gate"].T
            u = h @ l["ffn_up"].T
            x = x + ((g / (1.0 + np.exp(-g))) * u) @ l["ffn_down"].T
        return self.output @ self.rmsnorm(x[-1], self.out_norm)


def top2(logits):
    i1 = int(np.argmax(logits))
    rest = logits.copy()
    rest[i1] = -np.inf
    i2 = int(np.argmax(rest))
    return i1, i2, float(logits[i1] - logits[i2])


def run_case(model, case):
    cache = model.new_cache()
    logits = model.forward(case["prompt_tokens"], cache)
    last = logits.astype("<f4")
    tokens, steps = [], []
    for step in range(N_GEN):
        t1, t2, margin = top2(logits)
        tokens.append(t1)
        steps.append({"top1": t1, "top2": t2, "top1_logit": round(float(logits[t1]), 6),
                      "margin": round(margin, 7)})
        if step + 1 < N_GEN:
            logits = model.forward([t1], cache)
    margins = [s["margin"] for s in steps]
    below = {th: next((i for i, m in enumerate(margins) if m < float(th)), N_GEN)
             for th in ("1e-3", "1e-2", "0.1")}
    return {
        "name": case["name"],
        "prompt_tokens": case["prompt_tokens"],
        "last_logits_b64": base64.b64encode(last.tobytes()).decode(),
        "greedy_tokens": tokens,
        "greedy_steps": steps,
        "min_margin": min(margins),
        "min_margin_step": int(np.argmin(margins)),
        "steps_before_margin_below": below,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--out", default=DEFAULT_OUT)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", action="store_true")
    g.add_argument("--check", action="store_true", help="recompute and compare with --out")
    args = ap.parse_args()

    digest = sha256(args.model)
    if digest != EXPECTED_SHA256:
        print(f"warning: model sha256 {digest} != expected {EXPECTED_SHA256}", file=sys.stderr)
    with open(LLAMACPP_JSON) as f:
        cases = json.load(f)["cases"]

    t0 = time.time()
    model = Model(args.model)
    print(f"loaded and dequantised in {time.time() - t0:.1f}s", file=sys.stderr)
    results = []
    for case in cases:
        t = time.time()
        r = run_case(model, case)
        r["seconds"] = round(time.time() - t, 2)
        results.append(r)
        print(f"{r['name']:8s} {len(r['prompt_tokens']):3d} prompt tokens, min margin "
              f"{r['min_margin']:.5f} at step {r['min_margin_step']}, "
              f"{r['seconds']:.1f}s", file=sys.stderr)

    doc = {
        "description": "float64 reference for SmolLM2-135M-Instruct on its dequantised Q4_1 GGUF "
                       "weights (tests/reference/smollm2_float_reference.py)",
        "generator": {
            "gguf_version": metadata.version("gguf"),
            "numpy_version": np.__version__,
            "python": platform.python_version(),
            "machine": platform.machine(),
            "dequantiser": "gguf.quants.dequantize (numpy), then float64",
            "precision": "float64 throughout; logits rounded once to float32 for storage",
        },
        "model": {
            "file": os.path.relpath(args.model, REPO),
            "sha256": digest,
            "n_vocab": model.vocab,
            "n_layers": model.n_layers,
            "dim": model.dim,
            "n_heads": model.n_heads,
            "n_kv_heads": model.n_kv_heads,
            "rope_theta": model.theta,
            "rms_eps": model.eps,
        },
        "settings": {
            "n_gen": N_GEN,
            "prompts": "prompt_tokens of tests/data/smollm2/reference_llamacpp.json",
            "greedy": "argmax of float64 logits, fed back one token at a time through a KV "
                      "cache; no stop at EOS; step 0 is the last prompt position",
        },
        "notes": [
            "last_logits_b64: n_vocab little-endian float32, base64, at the last prompt position "
            "of one batched pass over the prompt.",
            "greedy_steps[k].margin: top-1 minus top-2 logit at step k; where it is below the "
            "float32 engine's error (~1e-3) a float32 implementation may legitimately pick the "
            "other token. steps_before_margin_below[th]: leading steps whose margins are >= th.",
        ],
        "cases": results,
    }

    if args.write:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
        print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes)", file=sys.stderr)
        return 0

    with open(args.out) as f:
        old = json.load(f)
    ok = True
    for a, b in zip(old["cases"], results):
        la = np.frombuffer(base64.b64decode(a["last_logits_b64"]), dtype="<f4")
        lb = np.frombuffer(base64.b64decode(b["last_logits_b64"]), dtype="<f4")
        d = float(np.max(np.abs(la - lb)))
        same = a["greedy_tokens"] == b["greedy_tokens"]
        print(f"{a['name']:8s} max |logit diff| {d:.2e}, greedy {'same' if same else 'DIFFERS'}")
        ok &= d < 1e-4 and same
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
