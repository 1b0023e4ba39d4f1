#!/usr/bin/env python3
"""Generates tests/data/arch/: one tiny random model per supported decoder family, written by
its reference implementation (Hugging Face transformers), with the reference logits, for
tests/model/arch_reference_test.cc.

Usage (needs torch, transformers, safetensors):
  python3 tests/reference/make_arch_models.py [--out tests/data/arch]

For each family NAME the output is tests/data/arch/NAME/: config.json and model.safetensors as
save_pretrained writes them (float32), and reference.json: {"tokens": [...], "logits":
[[vocab floats] per token]}, the logits transformers computes for the whole token sequence in
one causal pass (eager attention, float32). The families and what each exercises:
  llama3   Llama with rope_scaling llama3 (one frequency kept, one smoothed, two scaled)
  qwen2    q/k/v biases
  qwen3    per-head q/k RMSNorm (QK-norm), head_dim given apart from hidden_size / heads
  mistral  sliding-window attention on every layer (window 5 < the 12 tokens)
  gemma2   (1 + w) norms, post-norms, GeGLU (gelu tanh), embedding * sqrt(dim), attention and
           final logit soft-capping, query_pre_attn_scalar, alternating sliding layers
  gemma3   Gemma 2's norms and GeGLU plus QK-norm, sliding layers with their own RoPE base
           (rope_local_base_freq) interleaved with global ones, no soft-capping
llama3, qwen3 and gemma3 are also written as GGUF (NAME/model.gguf, float32, as llama.cpp's
convert_hf_to_gguf.py names and lays out the tensors: Llama's Q/K rows permuted and its RoPE
scaling as the rope_freqs tensor; Gemma's norm gains stored as 1 + w;
gemma3.rope.freq_base_swa and gemma3.attention.sliding_window_pattern = 3 carry the local RoPE
base and the layer pattern), so the GGUF loader is checked against the same reference logits.
All parameters are drawn N(0, 0.15^2) (norm gains too, so a (1 + w) slip shows), seeded.
Sizes: dim 32, 3 layers, vocab 96: about 150 KB per model.
"""

import argparse
import json
import math
import os

import gguf
import numpy as np
import torch
import transformers

SEED = 1126
VOCAB = 96
TOKENS = [1, 17, 42, 5, 88, 9, 63, 17, 42, 30, 2, 71]


def configs():
    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  rms_norm_eps=1e-6, tie_word_embeddings=False)
    t = transformers
    return {
        "llama3": (t.LlamaConfig(**common, rope_theta=10000.0,
                                 rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                               "original_max_position_embeddings": 128}),
                   t.LlamaForCausalLM),
        "qwen2": (t.Qwen2Config(**common, rope_theta=1000000.0), t.Qwen2ForCausalLM),
        "qwen3": (t.Qwen3Config(**{**common, "tie_word_embeddings": True}, head_dim=16,
                                rope_theta=1000000.0),
                  t.Qwen3ForCausalLM),
        "mistral": (t.MistralConfig(**common, sliding_window=5, rope_theta=10000.0),
                    t.MistralForCausalLM),
        "gemma2": (t.Gemma2Config(**{**common, "tie_word_embeddings": True}, head_dim=16,
                                  query_pre_attn_scalar=12, sliding_window=5,
                                  attn_logit_softcapping=3.0, final_logit_softcapping=5.0,
                                  hidden_activation="gelu_pytorch_tanh",
                                  attn_implementation="eager"),
                   t.Gemma2ForCausalLM),
        "gemma3": (t.Gemma3TextConfig(**{**common, "tie_word_embeddings": True,
                                         "num_hidden_layers": 4}, head_dim=16,
                                      query_pre_attn_scalar=16, sliding_window=5,
                                      layer_types=["sliding_attention", "sliding_attention",
                                                   "full_attention", "sliding_attention"],
                                      rope_theta=1000000.0, rope_local_base_freq=100.0,
                                      hidden_activation="gelu_pytorch_tanh",
                                      attn_implementation="eager"),
                   t.Gemma3ForCausalLM),
    }


def write_gguf(name, config, model, path):
    """The model as llama.cpp's converter would write it (float32 tensors, no tokenizer)."""
    arch = {"qwen3": "qwen3", "gemma3": "gemma3", "llama3": "llama"}[name]
    gemma = arch == "gemma3"
    w = gguf.GGUFWriter(path, arch)
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(config.hidden_size)
    w.add_block_count(config.num_hidden_layers)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(config.num_attention_heads)
    w.add_head_count_kv(config.num_key_value_heads)
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    w.add_key_length(config.head_dim)
    w.add_value_length(config.head_dim)
    rp = config.rope_parameters
    if gemma:
        w.add_rope_freq_base(rp["full_attention"]["rope_theta"])
        w.add_float32(f"{arch}.rope.freq_base_swa", rp["sliding_attention"]["rope_theta"])
        w.add_sliding_window(config.sliding_window)
        w.add_uint32(f"{arch}.attention.sliding_window_pattern", 3)
    else:
        w.add_rope_freq_base(rp["rope_theta"])
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    if arch == "llama":
        # convert_hf_to_gguf.py's LlamaModel: Q/K rows permuted to the interleaved RoPE order,
        # and Llama 3's scaling as the rope_freqs tensor of per-frequency divisors.
        def permute(x, n_head):
            return (x.reshape(n_head, 2, x.shape[0] // n_head // 2, *x.shape[1:])
                    .swapaxes(1, 2).reshape(x.shape))
        for i in range(config.num_hidden_layers):
            p = f"model.layers.{i}.self_attn."
            sd[p + "q_proj.weight"] = permute(sd[p + "q_proj.weight"], config.num_attention_heads)
            sd[p + "k_proj.weight"] = permute(sd[p + "k_proj.weight"], config.num_key_value_heads)
        base, dim = rp["rope_theta"], config.head_dim
        freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        factor, low, high = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"]
        old = rp["original_max_position_embeddings"]
        factors = []
        for freq in freqs.tolist():
            wavelen = 2 * math.pi / freq
            if wavelen < old / high:
                factors.append(1.0)
            elif wavelen > old / low:
                factors.append(factor)
            else:
                smooth = (old / wavelen - low) / (high - low)
                factors.append(1 / ((1 - smooth) / factor + smooth))
        w.add_tensor("rope_freqs.weight", np.array(factors, dtype=np.float32))

    def norm(k):
        return (sd[k] + 1.0).astype(np.float32) if gemma else sd[k]

    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", norm("model.norm.weight"))
    if not config.tie_word_embeddings:
        w.add_tensor("output.weight", sd["lm_head.weight"])
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", norm(p + "input_layernorm.weight"))
        for src, dst in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"),
                         ("o_proj", "attn_output")):
            w.add_tensor(b + dst + ".weight", sd[p + "self_attn." + src + ".weight"])
        if arch != "llama":
            w.add_tensor(b + "attn_q_norm.weight", norm(p + "self_attn.q_norm.weight"))
            w.add_tensor(b + "attn_k_norm.weight", norm(p + "self_attn.k_norm.weight"))
        for src, dst in (("gate_proj", "ffn_gate"), ("up_proj", "ffn_up"),
                         ("down_proj", "ffn_down")):
            w.add_tensor(b + dst + ".weight", sd[p + "mlp." + src + ".weight"])
        if gemma:
            w.add_tensor(b + "ffn_norm.weight", norm(p + "pre_feedforward_layernorm.weight"))
            w.add_tensor(b + "post_attention_norm.weight",
                         norm(p + "post_attention_layernorm.weight"))
            w.add_tensor(b + "post_ffw_norm.weight", norm(p + "post_feedforward_layernorm.weight"))
        else:
            w.add_tensor(b + "ffn_norm.weight", norm(p + "post_attention_layernorm.weight"))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--out", default=os.path.join(root, "tests/data/arch"))
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    for i, (name, (config, cls)) in enumerate(configs().items()):
        if args.only and name != args.only:
            continue
        torch.manual_seed(SEED + i)
        config._attn_implementation = "eager"
        model = cls(config).float().eval()
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0.0, 0.15)
        out = os.path.join(args.out, name)
        os.makedirs(out, exist_ok=True)
        model.save_pretrained(out, safe_serialization=True)
        with torch.no_grad():
            logits = model(torch.tensor([TOKENS])).logits[0].float()
        with open(os.path.join(out, "reference.json"), "w") as f:
            json.dump({"generator": "tests/reference/make_arch_models.py",
                       "transformers_version": transformers.__version__,
                       "torch_version": torch.__version__, "tokens": TOKENS,
                       "logits": [[float(v) for v in row] for row in logits]}, f)
            f.write("\n")
        if name in ("qwen3", "gemma3", "llama3"):
            write_gguf(name, config, model, os.path.join(out, "model.gguf"))
        for extra in ("generation_config.json",):
            p = os.path.join(out, extra)
            if os.path.exists(p):
                os.remove(p)
        size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
        print(f"{name}: {size} bytes -> {out}")


if __name__ == "__main__":
    main()
