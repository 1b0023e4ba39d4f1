#!/usr/bin/env python3
"""Independent Python + numpy reference of llama2.c's behaviour for legacy
(version 0) llama2.c checkpoints.

Written from the format description only (it shares no code with the C++
engine, nor with llama2.c): checkpoint reader, Llama forward pass in float32,
SentencePiece-style BPE encoder, decoder and llama2.c's greedy loop.

Usage:
  python3 tests/reference/llama2c_reference.py --check   # verify, exit 1 on mismatch
  python3 tests/reference/llama2c_reference.py --write   # validate, then regenerate
                                                         # tests/data/stories260K/reference_greedy.json
  python3 tests/reference/llama2c_reference.py --prompt "Once upon a time" --steps 64
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
from dataclasses import dataclass

import numpy as np

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DATA_DIR = os.path.join(REPO_ROOT, "tests", "data", "stories260K")
MODEL_PATH = os.path.join(DATA_DIR, "stories260K.bin")
TOKENIZER_PATH = os.path.join(DATA_DIR, "tok512.bin")
EXPECTED_GREEDY_PATH = os.path.join(DATA_DIR, "expected_greedy_200.txt")
VECTORS_PATH = os.path.join(DATA_DIR, "reference_greedy.json")
LLAMA2_TOKENIZER_PATH = os.path.normpath(
    os.path.join(REPO_ROOT, "..", "shared", "models", "llama2-tokenizer", "tokenizer.bin"))
LLAMA2_TOKENIZER_FALLBACK = "/work/shared/models/llama2-tokenizer/tokenizer.bin"

BOS = 1
EOS = 2
RMS_EPS = np.float32(1e-5)
ROPE_THETA = 10000.0

# Llama 2 tokenizer known vector (from the models README).
LLAMA2_CHECK_TEXT = "I believe the meaning of life is"
LLAMA2_CHECK_IDS = [1, 306, 4658, 278, 6593, 310, 2834, 338]

# Test-vector prompts: (prompt, max_new_tokens).
CASES = [
    ("", 200),
    ("Once upon a time", 128),
    ("Lily and Tom went to the park", 128),
    ("Dragon", 96),
    ("Tom had 3 red balls, 2 blue cars and 10 toys! Was he happy? Yes.", 96),
    ("The caf\u00e9 had a cat \U0001F431 named \u5c0f\u732b.", 96),
    ("One day, a little girl named Sue found a shiny key in the garden. "
     "She picked it up and ran to her mom. \"Look, Mom!\" she said.", 128),
    ("The sun was warm.\nThe dog", 96),
    ("Ben liked to eat", 64),
]


# --------------------------------------------------------------------------- model

@dataclass
class Config:
    dim: int
    hidden_dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    seq_len: int
    shared_classifier: bool

    @property
    def head_size(self) -> int:
        return self.dim // self.n_heads

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_size


class Weights:
    """Weights of a legacy (version 0) llama2.c checkpoint, as float32 numpy arrays."""

    def __init__(self, path: str):
        with open(path, "rb") as f:
            blob = f.read()
        dim, hidden, n_layers, n_heads, n_kv_heads, vocab, seq_len = struct.unpack_from("<7i", blob, 0)
        self.config = Config(dim, hidden, n_layers, n_heads, n_kv_heads, abs(vocab), seq_len,
                             shared_classifier=vocab > 0)
        c = self.config
        floats = np.frombuffer(blob, dtype="<f4", offset=7 * 4)
        self._floats = floats
        self._off = 0

        def take(*shape: int) -> np.ndarray:
            n = int(np.prod(shape))
            if self._off + n > floats.size:
                raise ValueError(f"checkpoint {path} is truncated")
            arr = floats[self._off:self._off + n].reshape(shape).astype(np.float32)
            self._off += n
            return arr

        L, D, H, KV, V = c.n_layers, c.dim, c.hidden_dim, c.kv_dim, c.vocab_size
        self.token_embedding = take(V, D)
        self.rms_att = take(L, D)
        self.wq = take(L, D, D)
        self.wk = take(L, KV, D)
        self.wv = take(L, KV, D)
        self.wo = take(L, D, D)
        self.rms_ffn = take(L, D)
        self.w1 = take(L, H, D)
        self.w2 = take(L, D, H)
        self.w3 = take(L, H, D)
        self.rms_final = take(D)
        take(c.seq_len * c.head_size // 2)  # legacy freq_cis_real (unused)
        take(c.seq_len * c.head_size // 2)  # legacy freq_cis_imag (unused)
        self.wcls = self.token_embedding if c.shared_classifier else take(V, D)
        if self._off != floats.size:
            raise ValueError(f"checkpoint {path}: {floats.size - self._off} trailing floats")


def rmsnorm(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    ss = np.float32(np.dot(x, x)) / np.float32(x.size) + RMS_EPS
    inv = np.float32(1.0) / np.sqrt(ss, dtype=np.float32)
    return (weight * (x * inv)).astype(np.float32)


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - np.max(x)).astype(np.float32)
    return (e / np.float32(e.sum())).astype(np.float32)


def silu(x: np.ndarray) -> np.ndarray:
    return (x * (np.float32(1.0) / (np.float32(1.0) + np.exp(-x)))).astype(np.float32)


class Transformer:
    """Single-sequence Llama forward pass with a KV cache (one token per call)."""

    def __init__(self, weights: Weights):
        self.w = weights
        c = weights.config
        self.c = c
        self.key_cache = np.zeros((c.n_layers, c.seq_len, c.kv_dim), dtype=np.float32)
        self.value_cache = np.zeros((c.n_layers, c.seq_len, c.kv_dim), dtype=np.float32)
        # RoPE frequencies for pair index i within a head: 1 / theta^(2i / head_size).
        hs = c.head_size
        exps = np.arange(0, hs, 2, dtype=np.float32) / np.float32(hs)
        self.rope_freq = (np.float32(1.0) / np.power(np.float32(ROPE_THETA), exps)).astype(np.float32)

    def rope(self, v: np.ndarray, n_heads: int, pos: int) -> np.ndarray:
        hs = self.c.head_size
        angle = (np.float32(pos) * self.rope_freq).astype(np.float32)
        cos, sin = np.cos(angle), np.sin(angle)
        pairs = v.reshape(n_heads, hs // 2, 2)
        a, b = pairs[..., 0], pairs[..., 1]
        out = np.empty_like(pairs)
        out[..., 0] = a * cos - b * sin
        out[..., 1] = a * sin + b * cos
        return out.reshape(-1)

    def forward(self, token: int, pos: int) -> np.ndarray:
        c, w = self.c, self.w
        hs = c.head_size
        group = c.n_heads // c.n_kv_heads
        scale = np.float32(1.0 / np.sqrt(hs))
        x = w.token_embedding[token].copy()
        for l in range(c.n_layers):
            xb = rmsnorm(x, w.rms_att[l])
            q = w.wq[l] @ xb
            k = w.wk[l] @ xb
            v = w.wv[l] @ xb
            q = self.rope(q, c.n_heads, pos)
            k = self.rope(k, c.n_kv_heads, pos)
            self.key_cache[l, pos] = k
            self.value_cache[l, pos] = v
            keys = self.key_cache[l, :pos + 1].reshape(pos + 1, c.n_kv_heads, hs)
            values = self.value_cache[l, :pos + 1].reshape(pos + 1, c.n_kv_heads, hs)
            att_out = np.empty(c.dim, dtype=np.float32)
            for h in range(c.n_heads):
                kvh = h // group
                qh = q[h * hs:(h + 1) * hs]
                scores = (keys[:, kvh, :] @ qh) * scale
                probs = softmax(scores.astype(np.float32))
                att_out[h * hs:(h + 1) * hs] = probs @ values[:, kvh, :]
            x = (x + w.wo[l] @ att_out).astype(np.float32)
            xb = rmsnorm(x, w.rms_ffn[l])
            hb = silu(w.w1[l] @ xb) * (w.w3[l] @ xb)
            x = (x + w.w2[l] @ hb.astype(np.float32)).astype(np.float32)
        x = rmsnorm(x, w.rms_final)
        return (w.wcls @ x).astype(np.float32)


# --------------------------------------------------------------------------- tokenizer

class Tokenizer:
    """llama2.c tokenizer.bin: SentencePiece-style BPE with byte fallback."""

    def __init__(self, path: str, vocab_size: int | None = None):
        with open(path, "rb") as f:
            blob = f.read()
        (self.max_token_length,) = struct.unpack_from("<i", blob, 0)
        off = 4
        self.pieces: list[bytes] = []
        self.scores: list[float] = []
        while off < len(blob) and (vocab_size is None or len(self.pieces) < vocab_size):
            score, length = struct.unpack_from("<fi", blob, off)
            off += 8
            self.pieces.append(blob[off:off + length])
            self.scores.append(score)
            off += length
        if vocab_size is not None and len(self.pieces) != vocab_size:
            raise ValueError(f"tokenizer {path}: {len(self.pieces)} tokens, expected {vocab_size}")
        self.lookup: dict[bytes, int] = {}
        for i, p in enumerate(self.pieces):
            self.lookup.setdefault(p, i)

    @property
    def vocab_size(self) -> int:
        return len(self.pieces)

    @staticmethod
    def _code_points(data: bytes) -> list[bytes]:
        """Split UTF-8 bytes into code points: a lead byte plus up to 3 continuation bytes."""
        out: list[bytes] = []
        cur = b""
        for b in data:
            if (b & 0xC0) != 0x80 or len(cur) >= 4:
                if cur:
                    out.append(cur)
                cur = bytes([b])
            else:
                cur += bytes([b])  # continuation byte (a stray one at the start stands alone)
        if cur:
            out.append(cur)
        return out

    def encode(self, text: str | bytes, bos: bool = True, eos: bool = False) -> list[int]:
        data = text.encode("utf-8") if isinstance(text, str) else text
        tokens: list[int] = []
        if bos:
            tokens.append(BOS)
        # Dummy prefix: a single space token first (it takes part in merges).
        ids: list[int] = [self.lookup[b" "]] if data else []
        for cp in self._code_points(data):
            tid = self.lookup.get(cp)
            if tid is not None:
                ids.append(tid)
            else:
                ids.extend(byte + 3 for byte in cp)
        # Greedy BPE: merge the adjacent pair with the highest score (first on ties).
        while True:
            best_score, best_idx, best_id = None, -1, -1
            for i in range(len(ids) - 1):
                tid = self.lookup.get(self.pieces[ids[i]] + self.pieces[ids[i + 1]])
                if tid is not None and (best_score is None or self.scores[tid] > best_score):
                    best_score, best_idx, best_id = self.scores[tid], i, tid
            if best_idx < 0:
                break
            ids[best_idx:best_idx + 2] = [best_id]
        tokens.extend(ids)
        if eos:
            tokens.append(EOS)
        return tokens

    def decode(self, prev_token: int, token: int) -> bytes:
        piece = self.pieces[token]
        if prev_token == BOS and piece.startswith(b" "):
            piece = piece[1:]
        if len(piece) == 6 and piece.startswith(b"<0x") and piece.endswith(b">"):
            try:
                return bytes([int(piece[3:5], 16)])
            except ValueError:
                pass
        return piece

    def decode_sequence(self, prev_token: int, tokens: list[int]) -> bytes:
        out = []
        for t in tokens:
            out.append(self.decode(prev_token, t))
            prev_token = t
        return b"".join(out)


# --------------------------------------------------------------------------- generation

@dataclass
class GreedyResult:
    prompt_tokens: list[int]
    generated_tokens: list[int]
    stopped_on_bos: bool
    first_logits: np.ndarray
    margins: list[float]  # top-1 minus top-2 logit for every generated token


def top2_margin(logits: np.ndarray) -> float:
    top = np.partition(logits, -2)[-2:]
    return float(top[1] - top[0])


def greedy_generate(weights: Weights, prompt_tokens: list[int], max_new_tokens: int) -> GreedyResult:
    """llama2.c's loop at temperature 0: feed the prompt, then argmax; stop on BOS.

    max_new_tokens counts generated tokens.  The last one is produced from the logits of the
    previous position and is not fed back, so llama2.c's `steps` (forward passes) equals
    len(prompt_tokens) - 1 + max_new_tokens.
    """
    if not prompt_tokens:
        raise ValueError("prompt_tokens must contain at least BOS")
    model = Transformer(weights)
    seq_len = weights.config.seq_len
    generated: list[int] = []
    margins: list[float] = []
    first_logits = None
    stopped_on_bos = False
    token = prompt_tokens[0]
    pos = 0
    while len(generated) < max_new_tokens and pos < seq_len:
        logits = model.forward(token, pos)
        if pos < len(prompt_tokens) - 1:
            nxt = prompt_tokens[pos + 1]
        else:
            nxt = int(np.argmax(logits))  # first maximum on ties, like llama2.c
            if first_logits is None:
                first_logits = logits.copy()
            margins.append(top2_margin(logits))
            if nxt == BOS:
                stopped_on_bos = True
                break
            generated.append(nxt)
        token = nxt
        pos += 1
    return GreedyResult(list(prompt_tokens), generated, stopped_on_bos, first_logits, margins)


# --------------------------------------------------------------------------- checks and vectors

def load_stories() -> tuple[Weights, Tokenizer]:
    weights = Weights(MODEL_PATH)
    tok = Tokenizer(TOKENIZER_PATH, weights.config.vocab_size)
    return weights, tok


def check_llama2_encode() -> bool:
    path = LLAMA2_TOKENIZER_PATH if os.path.exists(LLAMA2_TOKENIZER_PATH) else LLAMA2_TOKENIZER_FALLBACK
    if not os.path.exists(path):
        print(f"SKIP  llama2 encode check: {path} not found")
        return True
    tok = Tokenizer(path, 32000)
    got = tok.encode(LLAMA2_CHECK_TEXT, bos=True)
    ok = got == LLAMA2_CHECK_IDS
    print(f"{'OK  ' if ok else 'FAIL'}  llama2 encode {LLAMA2_CHECK_TEXT!r} -> {got}")
    return ok


def check_expected_greedy(weights: Weights, tok: Tokenizer) -> bool:
    with open(EXPECTED_GREEDY_PATH, "rb") as f:
        expected = f.read()
    # llama2.c `-n 200` runs 200 forward passes (positions 0..199) and samples a token after each:
    # with BOS as the only prompt token that is 200 generated tokens (the last one is printed but
    # never fed back).  199 tokens stop one word short of the published text.
    res = greedy_generate(weights, [BOS], 200)
    text = tok.decode_sequence(BOS, res.generated_tokens)
    ok = text == expected
    print(f"{'OK  ' if ok else 'FAIL'}  greedy BOS + 200 tokens vs expected_greedy_200.txt "
          f"({len(text)} vs {len(expected)} bytes, min margin {min(res.margins):.4f})")
    if not ok:
        n = next((i for i, (a, b) in enumerate(zip(text, expected)) if a != b), min(len(text), len(expected)))
        print(f"      first difference at byte {n}: got {text[n:n + 40]!r} expected {expected[n:n + 40]!r}")
    return ok


def build_case(weights: Weights, tok: Tokenizer, prompt: str, max_new_tokens: int) -> tuple[dict, float]:
    prompt_tokens = tok.encode(prompt, bos=True)
    res = greedy_generate(weights, prompt_tokens, max_new_tokens)
    text = tok.decode_sequence(prompt_tokens[-1], res.generated_tokens).decode("utf-8")
    logits = res.first_logits
    top5 = np.argsort(-logits, kind="stable")[:5]
    case = {
        "prompt": prompt,
        "prompt_tokens": prompt_tokens,
        "max_new_tokens": max_new_tokens,
        # The equivalent llama2.c `-n` value: forward passes = prompt tokens - 1 + new tokens.
        "llama2c_steps": len(prompt_tokens) - 1 + max_new_tokens,
        "generated_tokens": res.generated_tokens,
        "text": text,
        "stopped_on_bos": res.stopped_on_bos,
        "last_logits_top5": [[int(i), round(float(logits[i]), 6)] for i in top5],
        "first_logits": [round(float(v), 6) for v in logits],
    }
    return case, min(res.margins)


def compare_case(expected: dict, got: dict, tol: float = 1e-3) -> list[str]:
    errs = []
    for key in ("prompt_tokens", "generated_tokens", "text", "stopped_on_bos"):
        if expected.get(key) != got[key]:
            errs.append(f"{key} differs")
    if [e[0] for e in expected.get("last_logits_top5", [])] != [g[0] for g in got["last_logits_top5"]]:
        errs.append("last_logits_top5 ids differ")
    exp_logits = np.asarray(expected.get("first_logits", []), dtype=np.float64)
    got_logits = np.asarray(got["first_logits"], dtype=np.float64)
    if exp_logits.shape != got_logits.shape:
        errs.append("first_logits length differs")
    elif exp_logits.size and np.max(np.abs(exp_logits - got_logits)) > tol:
        errs.append(f"first_logits max abs diff {np.max(np.abs(exp_logits - got_logits)):.3g} > {tol}")
    return errs


def check_vectors(weights: Weights, tok: Tokenizer) -> bool:
    if not os.path.exists(VECTORS_PATH):
        print(f"FAIL  {VECTORS_PATH} missing (run with --write)")
        return False
    with open(VECTORS_PATH, encoding="utf-8") as f:
        data = json.load(f)
    ok = True
    for exp in data["cases"]:
        got, _ = build_case(weights, tok, exp["prompt"], exp["max_new_tokens"])
        errs = compare_case(exp, got)
        ok &= not errs
        print(f"{'OK  ' if not errs else 'FAIL'}  vector {exp['prompt'][:40]!r}" + (": " + "; ".join(errs) if errs else ""))
    return ok


def write_vectors(weights: Weights, tok: Tokenizer) -> list[tuple[str, int, int, float, bool]]:
    cases, table = [], []
    for prompt, n in CASES:
        case, margin = build_case(weights, tok, prompt, n)
        cases.append(case)
        table.append((prompt, len(case["prompt_tokens"]), len(case["generated_tokens"]), margin,
                      case["stopped_on_bos"]))
    data = {
        "model": "stories260K.bin",
        "tokenizer": "tok512.bin",
        "generator": "tests/reference/llama2c_reference.py",
        "cases": cases,
    }
    with open(VECTORS_PATH, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {os.path.relpath(VECTORS_PATH, REPO_ROOT)} ({len(cases)} cases)")
    return table


def print_margins(table) -> None:
    print(f"{'prompt':<44} {'prompt_toks':>11} {'generated':>9} {'min_margin':>10} bos_stop")
    for prompt, npt, ngen, margin, bos in table:
        print(f"{prompt[:42]!r:<44} {npt:>11} {ngen:>9} {margin:>10.5f} {bos}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true",
                      help="verify the Llama 2 encode vector, expected_greedy_200.txt and reference_greedy.json")
    mode.add_argument("--write", action="store_true",
                      help="validate, then regenerate reference_greedy.json and print the margins table")
    mode.add_argument("--margins", action="store_true", help="print the margins table without writing")
    ap.add_argument("--prompt", help="generate greedily from this prompt and print the text")
    ap.add_argument("--steps", type=int, default=128, help="new tokens for --prompt")
    args = ap.parse_args(argv)

    if args.prompt is not None:
        weights, tok = load_stories()
        toks = tok.encode(args.prompt, bos=True)
        res = greedy_generate(weights, toks, args.steps)
        print("prompt tokens:", toks)
        print("generated:", res.generated_tokens)
        sys.stdout.buffer.write(tok.decode_sequence(toks[-1], res.generated_tokens) + b"\n")
        return 0

    weights, tok = load_stories()
    ok = check_llama2_encode()
    ok &= check_expected_greedy(weights, tok)
    if args.check:
        ok &= check_vectors(weights, tok)
        return 0 if ok else 1
    if args.write or args.margins:
        if not ok:
            print("validation failed; not writing vectors")
            return 1
        if args.margins:
            table = []
            for prompt, n in CASES:
                case, margin = build_case(weights, tok, prompt, n)
                table.append((prompt, len(case["prompt_tokens"]), len(case["generated_tokens"]),
                              margin, case["stopped_on_bos"]))
        else:
            table = write_vectors(weights, tok)
        print_margins(table)
        return 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
