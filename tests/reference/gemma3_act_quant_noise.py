#!/usr/bin/env python3
"""How far llama.cpp-style activation quantisation alone moves gemma-3-270m Q4_K_M's logits from
transformers' (the bound of tests/model/gemma3_checkpoint_test.cc's quantised comparison).

A NumPy Gemma 3 forward over the GGUF's dequantised weights (llama.cpp's build_gemma3: norm gains
stored as 1 + w, embeddings times sqrt(dim), QK-norm, NeoX RoPE with base 10000 on local layers
and 1e6 on global ones, GeGLU-tanh, post-norms), in float32/float64, twice:
  - float activations: must reproduce tests/data/gemma3/reference.json (transformers) closely,
    which checks the forward itself;
  - every matrix product's input quantised as llama.cpp quantises it for that weight type (Q8_0
    blocks of 32, d = amax / 127 stored as fp16, for Q5_0/Q8_0 weights; Q8_K blocks of 256,
    d = -max / 127 in float32, for Q4_K/Q6_K), the product then exact: the error of the scheme
    itself, without any kernel's summation order.
Then the same quantised forward under `--trials` perturbations of one part in 10^6 of the
embedding row scale (changes no float activation visibly, but moves some activations across a
rounding boundary of their 8-bit quantisation): the spread of the top-8 error under noise of
this kind, which is what separates one kernel's summation order from another's.

  python3 tests/reference/gemma3_act_quant_noise.py GGUF [--trials 40] [--bound 0.04] [--bugs]
Needs numpy and gguf (pip install numpy gguf); about 1.5 s per forward on one core. Prints, per
reference prompt, max |ours - transformers| over the reference's top-8 ids and max |logit| (the
test's bound is 4% of it); exit status 1 if the float forward is off by more than 0.1% or a
quantised run exceeds --bound. --bugs adds simulated kernel bugs (a 1% activation scale error, Q8_0
quants truncated, K-quant activations in 32-blocks), to show what the bound can and cannot see.
"""
import argparse
import json
import pathlib
import sys

import numpy as np
import gguf

ROOT = pathlib.Path(__file__).resolve().parents[2]


def load(path):
  r = gguf.GGUFReader(path)
  w, types = {}, {}
  for t in r.tensors:
    a = gguf.quants.dequantize(t.data, t.tensor_type)
    w[t.name] = np.asarray(a, dtype=np.float32).reshape([int(x) for x in reversed(t.shape)])
    types[t.name] = t.tensor_type.name
  return w, types


def q8_0(x):
  """llama.cpp quantize_row_q8_0 (round to nearest even, as its AVX2 path), dequantised."""
  b = x.reshape(*x.shape[:-1], -1, 32).astype(np.float32)
  d = np.abs(b).max(-1, keepdims=True) / np.float32(127)
  inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
  q = np.rint(b * inv)
  return (q * d.astype(np.float16).astype(np.float32)).reshape(x.shape)


def q8_k(x):
  """llama.cpp quantize_row_q8_K_ref (nearest_int rounds half to even too), dequantised."""
  b = x.reshape(*x.shape[:-1], -1, 256).astype(np.float32)
  idx = np.abs(b).argmax(-1)[..., None]
  mx = np.take_along_axis(b, idx, -1)
  iscale = np.where(mx != 0, np.float32(-127) / np.where(mx != 0, mx, 1), 0).astype(np.float32)
  q = np.minimum(np.rint(iscale * b), 127)
  d = np.where(iscale != 0, np.float32(1) / np.where(iscale != 0, iscale, 1), 0)
  return (q * d.astype(np.float32)).reshape(x.shape)


def q8_0_truncated(x):
  """A simulated bug: Q8_0 quants rounded towards zero."""
  b = x.reshape(*x.shape[:-1], -1, 32).astype(np.float32)
  d = np.abs(b).max(-1, keepdims=True) / np.float32(127)
  inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
  return (np.trunc(b * inv) * d.astype(np.float16).astype(np.float32)).reshape(x.shape)


LLAMA_CPP = {"q8_0": q8_0, "q8_k": q8_k}
# Kernel bugs simulated in the same forward: how much of one the checkpoint test's bound sees.
BUGS = {
    "Q8_0 quants truncated, not rounded": {"q8_0": q8_0_truncated, "q8_k": q8_k},
    "K-quant activations in Q8_0 blocks of 32": {"q8_0": q8_0, "q8_k": q8_0},
    "Q8_0 activation scale 1% small": {"q8_0": lambda x: q8_0(x) * (127 / 128.3), "q8_k": q8_k},
}


def act_quant(wtype, quant):
  if wtype in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"):
    return quant["q8_0"]
  if wtype in ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"):
    return quant["q8_k"]
  return lambda x: x


def forward(w, types, ids, quant, embed_scale=1.0):
  dim, n_layers, heads, hd, eps = 640, 18, 4, 256, 1e-6

  def mm(x, name):
    xin = act_quant(types[name], quant)(x) if quant else x
    # float32 products (float32 rounding is far below the 8-bit quantisation's).
    return (xin.astype(np.float32) @ w[name].T).astype(np.float64)

  def rms(x, g):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g

  def rope(x, base):
    n = len(ids)
    inv = base ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = np.arange(n)[:, None] * inv[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], -1)

  n = len(ids)
  x = w["token_embd.weight"][ids].astype(np.float64) * np.sqrt(dim) * embed_scale
  mask = np.triu(np.full((n, n), -np.inf), 1)
  for il in range(n_layers):
    p = f"blk.{il}."
    cur = rms(x, w[p + "attn_norm.weight"])
    q = mm(cur, p + "attn_q.weight").reshape(n, heads, hd)
    k = mm(cur, p + "attn_k.weight").reshape(n, 1, hd)
    v = mm(cur, p + "attn_v.weight").reshape(n, 1, hd)
    q = rms(q, w[p + "attn_q_norm.weight"])
    k = rms(k, w[p + "attn_k_norm.weight"])
    base = 10000.0 if il % 6 < 5 else 1e6
    q, k = rope(q, base), rope(k, base)
    s = np.einsum("qhd,kd->hqk", q, k[:, 0]) / np.sqrt(hd) + mask
    s = np.exp(s - s.max(-1, keepdims=True))
    s /= s.sum(-1, keepdims=True)
    a = np.einsum("hqk,kd->qhd", s, v[:, 0]).reshape(n, heads * hd)
    x = x + rms(mm(a, p + "attn_output.weight"), w[p + "post_attention_norm.weight"])
    cur = rms(x, w[p + "ffn_norm.weight"])
    g, u = mm(cur, p + "ffn_gate.weight"), mm(cur, p + "ffn_up.weight")
    g = 0.5 * g * (1 + np.tanh(0.7978845608028654 * (g + 0.044715 * g ** 3)))
    x = x + rms(mm(g * u, p + "ffn_down.weight"), w[p + "post_ffw_norm.weight"])
  last = rms(x[-1:], w["output_norm.weight"])
  return mm(last, "token_embd.weight")[0]


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("gguf")
  ap.add_argument("--trials", type=int, default=8)
  ap.add_argument("--bound", type=float, default=0.04,
                  help="the test's bound as a fraction of max |logit|: exit 1 if a llama.cpp-style"
                       " run (perturbed or not) exceeds it, or the float run is off by 1e-3")
  ap.add_argument("--bugs", action="store_true", help="also run the simulated kernel bugs")
  args = ap.parse_args()
  ref = json.load(open(ROOT / "tests/data/gemma3/reference.json"))
  w, types = load(args.gguf)
  rng = np.random.default_rng(0)
  ok = True

  def err(lg, top, want):
    return np.abs(lg[top] - want).max(), np.abs(lg).max()

  for cs in ref["cases"]:
    ids, top, want = cs["tokens"], cs["top_ids"], np.array(cs["top_logits"])
    print(repr(cs["prompt"]))
    runs = [("float activations", None), ("llama.cpp Q8_0/Q8_K activations", LLAMA_CPP)]
    if args.bugs:
      runs += [("bug: " + k, v) for k, v in BUGS.items()]
    for label, quant in runs:
      e, m = err(forward(w, types, ids, quant), top, want)
      print(f"  {label}: max |ours - transformers| top-8 = {e:.4f} (max |logit| {m:.2f}, "
            f"{100 * e / m:.1f}%)")
      if quant is None:
        ok = ok and e <= 1e-3 * m
      elif quant is LLAMA_CPP:
        ok = ok and e <= args.bound * m
    if args.trials <= 0:
      continue
    errs = []
    for _ in range(args.trials):
      e, m = err(forward(w, types, ids, LLAMA_CPP, 1.0 + 1e-6 * rng.standard_normal()), top, want)
      errs.append(e)
      ok = ok and e <= args.bound * m
    print(f"  perturbed x{args.trials}: top-8 error " + " ".join(f"{e:.3f}" for e in errs) +
          f"  (median {np.median(errs):.3f}, max {max(errs):.3f})")
  print("within the bound" if ok else f"OVER the bound {args.bound}")
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
