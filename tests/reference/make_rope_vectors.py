#!/usr/bin/env python3
"""Reference RoPE inverse frequencies with scaling, for tests/model/rope_scaling_test.cc.

Independent of the C++ code: implements, in numpy float64, the formulas of Hugging Face
transformers' modeling_rope_utils:
  _compute_default_rope_parameters: inv_freq = 1 / base ** (arange(0, dim, 2) / dim)
  _compute_linear_scaling_rope_parameters: inv_freq / factor
  _compute_llama3_parameters:
    wavelen = 2 * pi / inv_freq
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen > low_freq_wavelen:  inv_freq / factor
    wavelen < high_freq_wavelen: inv_freq
    otherwise: smooth = (old_context_len / wavelen - low_freq_factor)
                        / (high_freq_factor - low_freq_factor)
               (1 - smooth) * inv_freq / factor + smooth * inv_freq
Also llama.cpp's convert_hf_to_gguf.py rope_freqs ("frequency factors", divisors of inv_freq).

Usage: python3 tests/reference/make_rope_vectors.py  (writes tests/data/rope/*.json)
"""
import json
import math
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.normpath(os.path.join(HERE, "..", "data", "rope"))


def default_inv_freq(head_dim, base):
    return 1.0 / (float(base) ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))


def llama3_inv_freq(head_dim, base, factor, low_freq_factor, high_freq_factor, old_context_len):
    inv_freq = default_inv_freq(head_dim, base)
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    out = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return np.where(medium, smoothed, out)


def llamacpp_rope_freqs(head_dim, base, factor, low_freq_factor, high_freq_factor, old_context_len):
    """convert_hf_to_gguf.py LlamaModel.generate_extra_tensors (rope_freqs.weight)."""
    freqs = default_inv_freq(head_dim, base)
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            out.append(1.0)
        elif wavelen > low_freq_wavelen:
            out.append(factor)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out)


def main():
    os.makedirs(OUT, exist_ok=True)
    # Llama 3.1 8B: head_dim 128, rope_theta 500000, rope_scaling llama3 (8, 1, 4, 8192).
    l3 = dict(head_dim=128, rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
              high_freq_factor=4.0, original_max_position_embeddings=8192)
    args = (l3["head_dim"], l3["rope_theta"], l3["factor"], l3["low_freq_factor"],
            l3["high_freq_factor"], l3["original_max_position_embeddings"])
    inv = llama3_inv_freq(*args)
    ff = llamacpp_rope_freqs(*args)
    # Through llama.cpp's factors: base / ff must equal the HF values.
    assert np.allclose(default_inv_freq(l3["head_dim"], l3["rope_theta"]) / ff, inv, rtol=1e-12)
    linear = dict(head_dim=64, rope_theta=10000.0, factor=4.0)
    lin = default_inv_freq(linear["head_dim"], linear["rope_theta"]) / linear["factor"]
    doc = {
        "generator": "tests/reference/make_rope_vectors.py (numpy float64, HF formulas)",
        "llama3": dict(l3, inv_freq=[float(x) for x in inv], llamacpp_rope_freqs=[float(x) for x in ff]),
        "linear": dict(linear, inv_freq=[float(x) for x in lin]),
    }
    with open(os.path.join(OUT, "llama3_inv_freq.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    n_scaled = int(np.sum(np.abs(inv / default_inv_freq(128, 500000.0) - 1) > 1e-9))
    print(f"wrote {OUT}/llama3_inv_freq.json ({n_scaled} of 64 llama3 frequencies scaled)")


if __name__ == "__main__":
    main()
