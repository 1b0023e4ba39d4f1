#!/usr/bin/env python3
"""Our CUDA backend beside PyTorch on the same GPU.

1. Tree attention: PyTorch's scaled_dot_product_attention with an explicit boolean mask (the
   committed context fully visible, the token tree's ancestor mask after it) against our fused
   kernel (build/bench_cuda_attention --csv) on the same shapes: trees of 8..128 tokens,
   contexts of 512..8192, batches of 1..32, fp16, Llama-2-7B's 32 heads of 128. PyTorch gets
   contiguous K/V (SDPA cannot read a paged cache); ours reads 16-position pages. Ours is timed
   three times: as LaunchTreeAttention runs it (tensor cores for fp16 x 128), with every tree
   window planned as 64-row items (--no-spread: the layout before spread window items), and with
   the CUDA-core kernel fp16 ran before (--kernel cuda-cores), the baseline of the last column.
2. Decode: Hugging Face transformers' greedy generate() on a random-weight Llama-2-7B-shaped
   model (fp16, on the GPU) against build/bench_cuda_step --decode, tokens per second after the
   same prompt length.

    scripts/bench_cuda_vs_torch.py [--build build] [--batch 1,8,32] [--tree 8,32,64,128]
                                   [--context 512,2048,8192] [--decode 128] [--prompt 512]
                                   [--skip-attention] [--skip-decode]

Needs a CUDA GPU, torch and (for part 2) transformers; prints a table per part.
"""
import argparse
import os
import re
import subprocess
import sys
import time


def parse_list(text):
    return [int(x) for x in text.split(",") if x]


def random_tree_mask(torch, tree, context, gen):
    """[tree, context + tree] boolean mask: the context, then each node's ancestors and itself."""
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, tree)]
    m = torch.zeros(tree, context + tree, dtype=torch.bool)
    m[:, :context] = True
    for i in range(tree):
        if parents[i] >= 0:
            m[i, context:] = m[parents[i], context:]
        m[i, context + i] = True
    return m


def time_cuda(torch, fn, iters):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1000.0)  # us
    times.sort()
    return times[len(times) // 2]


def bench_attention(args, torch):
    import torch.nn.functional as F

    def run_ours(kernel, extra=()):
        exe = os.path.join(args.build, "bench_cuda_attention")
        cmd = [exe, "--csv", "--batch", args.batch, "--tree", args.tree, "--context", args.context,
               "--heads", str(args.heads), "--kv-heads", str(args.kv_heads),
               "--head-dim", str(args.head_dim), "--iters", str(args.iters), "--kernel", kernel,
               *extra]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        result = {}
        for line in out.splitlines():
            b, t, c, us, gbps = line.split(",")
            result[(int(b), int(t), int(c))] = (float(us), float(gbps))
        return result

    ours = run_ours("auto")  # the tensor-core kernel for these shapes
    unspread = run_ours("auto", ["--no-spread"])  # its windows in 64-row items
    cores = run_ours("cuda-cores")  # the kernel fp16 ran before it: the baseline

    gen = torch.Generator().manual_seed(0)
    dev = "cuda"
    print(f"\nTree attention, fp16, heads {args.heads}/{args.kv_heads} x {args.head_dim} "
          f"(median us per call; ours reads a paged cache)")
    print(f"{'batch':>5} {'tree':>5} {'context':>7} {'SDPA+mask us':>13} {'ours us':>9} "
          f"{'speed-up':>8} {'ours GB/s':>9} {'unspread us':>11} {'CUDA-core us':>12} "
          f"{'vs CUDA-core':>12}")
    gqa = args.heads != args.kv_heads
    for b in parse_list(args.batch):
        for t in parse_list(args.tree):
            for c in parse_list(args.context):
                q = torch.randn(b, args.heads, t, args.head_dim, device=dev, dtype=torch.float16)
                k = torch.randn(b, args.kv_heads, c + t, args.head_dim, device=dev,
                                dtype=torch.float16)
                v = torch.randn_like(k)
                mask = torch.stack([random_tree_mask(torch, t, c, gen) for _ in range(b)])
                mask = mask[:, None].to(dev)  # [b, 1, t, c + t]
                if gqa:
                    try:
                        fn = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                                    enable_gqa=True)
                        fn()
                    except TypeError:  # torch < 2.5: expand the KV heads
                        rep = args.heads // args.kv_heads
                        k2, v2 = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
                        fn = lambda: F.scaled_dot_product_attention(q, k2, v2, attn_mask=mask)
                else:
                    fn = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                torch_us = time_cuda(torch, fn, args.iters)
                o_us, o_gbps = ours.get((b, t, c), (float("nan"), float("nan")))
                c_us = cores.get((b, t, c), (float("nan"), float("nan")))[0]
                u_us = unspread.get((b, t, c), (float("nan"), float("nan")))[0]
                print(f"{b:>5} {t:>5} {c:>7} {torch_us:>13.1f} {o_us:>9.1f} "
                      f"{torch_us / o_us:>8.2f} {o_gbps:>9.1f} {u_us:>11.1f} {c_us:>12.1f} "
                      f"{c_us / o_us:>12.2f}", flush=True)
                del q, k, v, mask
                torch.cuda.empty_cache()


def bench_decode(args, torch):
    try:
        import transformers
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        print("\ndecode: transformers is not installed (pip install transformers); skipped")
        return
    exe = os.path.join(args.build, "bench_cuda_step")
    out = subprocess.run([exe, "--context", str(args.prompt), "--decode", str(args.decode)],
                         check=True, capture_output=True, text=True).stdout
    m = re.search(r"decode_tokens_per_second=([0-9.]+)", out)
    ours = float(m.group(1)) if m else float("nan")

    config = LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
                         max_position_embeddings=4096)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM._from_config(config, torch_dtype=torch.float16)
    model.eval()
    prompt = torch.randint(1, 32000, (1, args.prompt), device="cuda")

    def run(new_tokens):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            model.generate(prompt, attention_mask=torch.ones_like(prompt),
                           max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                           do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    run(4)  # warm-up
    prefill_and_one = run(1)
    total = run(args.decode + 1)
    hf = args.decode / max(total - prefill_and_one, 1e-9)
    print(f"\nDecode, random fp16 Llama-2-7B shape, prompt {args.prompt}, {args.decode} tokens "
          f"(transformers {transformers.__version__}, torch {torch.__version__})")
    print(f"{'HF transformers tok/s':>22} {'ours tok/s':>11} {'speed-up':>9}")
    print(f"{hf:>22.2f} {ours:>11.2f} {ours / hf:>9.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--batch", default="1,8,32")
    ap.add_argument("--tree", default="8,32,64,128")
    ap.add_argument("--context", default="512,2048,8192")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=32)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--skip-attention", action="store_true")
    ap.add_argument("--skip-decode", action="store_true")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        sys.exit("error: PyTorch is not installed")
    if not torch.cuda.is_available():
        sys.exit("error: no CUDA device: this benchmark needs a GPU")
    print(f"GPU: {torch.cuda.get_device_name(0)}")
    if not args.skip_attention:
        bench_attention(args, torch)
    if not args.skip_decode:
        bench_decode(args, torch)


if __name__ == "__main__":
    main()
