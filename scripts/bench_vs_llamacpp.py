#!/usr/bin/env python3
"""Prefill and decode speed of specinfer against llama.cpp on the same GGUF file.

llama.cpp is driven through llama-cpp-python (which compiles llama.cpp from source); it is not
part of specinfer's build. Run this script with a Python that has it, e.g.

    python3 -m venv /tmp/venv-llama
    CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF" CMAKE_BUILD_PARALLEL_LEVEL=2 \\
        /tmp/venv-llama/bin/pip install numpy llama-cpp-python==0.3.36
    /tmp/venv-llama/bin/python scripts/bench_vs_llamacpp.py \\
        --specinfer-bin build/bench_generate --model models/SmolLM2-135M-Instruct.Q4_1.gguf

What is measured, both sides with the same thread count, prompt length and decode length,
median of --runs after one warm-up run:
  * llama.cpp prefill: one llama_decode of --prompt-tokens (seeded random) tokens, logits for the
    last position only; tok/s = prompt tokens / time.
  * llama.cpp decode: then --gen-tokens single-token llama_decode calls, each feeding back the
    argmax of the previous logits (greedy); tok/s = gen tokens / time.
  * specinfer: `bench_generate --model M --threads N --prompt P --decode G --runs R`, whose table
    row for N threads gives "prefill tok/s" and "decode tok/s".
The KV cache of llama.cpp is its default (f16) unless --kv-type f32.

With --pass-sizes 1,8,16,32 it measures instead llama.cpp's side of `bench_speculative
--passes-only`: after --context (seeded random) tokens, one llama_decode of a batch of k tokens
(a chain at the next k positions, logits for every token, as a tree verification needs) against
one of a single token; median of --runs timed batches per size, the KV cache cut back to the
context before each. Prints ms per batch and the ratio to k = 1.

On a small shared machine the numbers are noisy: the script prints the CPU model, core count
and the load average before and after each side; compare runs only at similar load.
"""

import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu_info():
    model, cores = "unknown", os.cpu_count()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        model = platform.processor() or "unknown"
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = cores
    return model, cores, affinity


def load_str():
    a, b, c = os.getloadavg()
    return f"{a:.2f} {b:.2f} {c:.2f} (1/5/15 min)"


def run_specinfer(binary, model, threads, prompt, gen, runs):
    cmd = [binary, "--model", model, "--threads", str(threads), "--prompt", str(prompt),
           "--decode", str(gen), "--runs", str(runs)]
    print("specinfer:", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        sys.exit(f"error: {binary} exited with status {proc.returncode}")
    row_re = re.compile(r"^\s*(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$")
    for line in proc.stdout.splitlines():
        m = row_re.match(line)
        if m and int(m.group(1)) == threads:
            return float(m.group(2)), float(m.group(3)), proc.stdout, wall
    sys.stderr.write(proc.stdout + proc.stderr)
    sys.exit(f"error: no table row for {threads} threads in the output of {binary}")


def run_llamacpp(model, threads, prompt, gen, runs, kv_type):
    import numpy as np
    import llama_cpp

    # llama.cpp's worker threads spin at barriers: with another busy process on the same cores
    # its speed collapses (several times slower), far more than a blocking thread pool's would.
    kw = {}
    if kv_type == "f32":
        kw = dict(type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32)
    n_ctx = max(512, prompt + gen + 16)
    t_load = time.perf_counter()
    llm = llama_cpp.Llama(model_path=model, n_ctx=n_ctx, n_batch=max(prompt, 32),
                          n_ubatch=max(prompt, 32), n_threads=threads, n_threads_batch=threads,
                          logits_all=False, flash_attn=False, seed=0, verbose=False, **kw)
    n_vocab = llm.n_vocab()
    rng = np.random.default_rng(5)
    tokens = [int(t) for t in rng.integers(0, n_vocab, size=prompt)]

    def one_run():
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(tokens)
        t1 = time.perf_counter()
        for _ in range(gen):
            logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))
            llm.eval([int(np.argmax(logits))])
        t2 = time.perf_counter()
        return prompt / (t1 - t0), gen / (t2 - t1)

    t_load = time.perf_counter() - t_load
    t_warm = time.perf_counter()
    one_run()  # warm-up
    t_warm = time.perf_counter() - t_warm
    print(f"llama.cpp: model load {t_load:.2f} s, warm-up run {t_warm:.2f} s", flush=True)
    pre, dec = zip(*[one_run() for _ in range(runs)])
    version = getattr(llama_cpp, "__version__", "?")
    sysinfo = llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip()
    del llm
    return statistics.median(pre), statistics.median(dec), list(pre), list(dec), version, sysinfo


def run_llamacpp_passes(model, threads, sizes, context, runs, kv_type):
    import numpy as np
    import llama_cpp

    kw = {}
    if kv_type == "f32":
        kw = dict(type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32)
    n_batch = max(max(sizes), 32)
    llm = llama_cpp.Llama(model_path=model, n_ctx=max(512, context + n_batch + 16),
                          n_batch=max(n_batch, context), n_ubatch=max(n_batch, context),
                          n_threads=threads, n_threads_batch=threads, logits_all=True,
                          flash_attn=False, seed=0, verbose=False, **kw)
    rng = np.random.default_rng(5)
    ctx_tokens = [int(t) for t in rng.integers(0, llm.n_vocab(), size=context)]
    llm.reset()
    llm.eval(ctx_tokens)
    result = {}
    for k in sizes:
        batch = [int(t) for t in rng.integers(0, llm.n_vocab(), size=k)]
        times = []
        for r in range(runs + 1):  # the first is a warm-up
            llm.n_tokens = context  # Llama.eval removes the KV cells past n_tokens first
            t0 = time.perf_counter()
            llm.eval(batch)  # one llama_decode: k <= n_batch
            if r > 0:
                times.append(time.perf_counter() - t0)
        result[k] = statistics.median(times) * 1e3
    del llm
    return result


def main():
    ap = argparse.ArgumentParser(description="specinfer vs llama.cpp prefill/decode speed")
    ap.add_argument("--specinfer-bin", default=os.path.join(REPO, "build", "bench_generate"))
    ap.add_argument("--model",
                    default=os.path.join(REPO, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--kv-type", choices=["f16", "f32"], default="f16",
                    help="llama.cpp KV cache type (llama.cpp's default is f16)")
    ap.add_argument("--skip-specinfer", action="store_true", help="measure llama.cpp only")
    ap.add_argument("--pass-sizes", default="",
                    help="comma-separated batch sizes: llama.cpp's tree-pass ratios instead")
    ap.add_argument("--context", type=int, default=256, help="context before the passes")
    args = ap.parse_args()

    if not os.path.isfile(args.model):
        sys.exit(f"error: model not found: {args.model}")
    if not args.skip_specinfer and not args.pass_sizes and not os.access(args.specinfer_bin,
                                                                           os.X_OK):
        sys.exit(f"error: specinfer benchmark program not found or not executable: "
                 f"{args.specinfer_bin}\n  build it first (cmake --build build --target "
                 f"bench_generate) or pass --specinfer-bin PATH")
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        sys.exit("error: llama_cpp is not importable by this Python; run the script with the "
                 "virtual environment that has llama-cpp-python (e.g. /tmp/venv-llama/bin/python)")

    if args.pass_sizes:
        sizes = [int(x) for x in args.pass_sizes.split(",")]
        if 1 not in sizes:
            sizes.insert(0, 1)
        print(f"machine: {cpu_info()[0]}; model: {args.model}; threads {args.threads}; "
              f"context {args.context}; median of {args.runs}; load average {load_str()}",
              flush=True)
        ms = run_llamacpp_passes(args.model, args.threads, sizes, args.context, args.runs,
                                 args.kv_type)
        print(f"{'k':>4} {'ms/batch':>10} {'x one token':>12}")
        for k in sizes:
            print(f"{k:>4} {ms[k]:10.2f} {ms[k] / ms[1]:12.2f}")
        print(f"load average after: {load_str()}")
        return 0

    model_name, cores, affinity = cpu_info()
    print(f"machine: {model_name}, {cores} logical cores ({affinity} usable)")
    print(f"model: {args.model}")
    print(f"threads {args.threads}, prompt {args.prompt_tokens} tokens, decode "
          f"{args.gen_tokens} tokens, median of {args.runs} runs after 1 warm-up")
    load_before = os.getloadavg()
    print(f"load average before: {load_str()}", flush=True)

    spec = None
    if not args.skip_specinfer:
        sp, sd, out, wall = run_specinfer(args.specinfer_bin, args.model, args.threads,
                                          args.prompt_tokens, args.gen_tokens, args.runs)
        spec = (sp, sd)
        print(out.rstrip())
        print(f"(specinfer wall {wall:.1f} s; load average after: {load_str()})", flush=True)

    t0 = time.perf_counter()
    lp, ld, pres, decs, version, sysinfo = run_llamacpp(
        args.model, args.threads, args.prompt_tokens, args.gen_tokens, args.runs, args.kv_type)
    print(f"llama.cpp via llama-cpp-python {version} (KV cache {args.kv_type}): "
          f"wall {time.perf_counter() - t0:.1f} s")
    print(f"  system_info: {sysinfo}")
    print("  prefill runs tok/s: " + " ".join(f"{x:.1f}" for x in pres))
    print("  decode runs tok/s:  " + " ".join(f"{x:.1f}" for x in decs))
    print(f"load average after: {load_str()}")

    print()
    print(f"{'':12} {'prefill tok/s':>14} {'decode tok/s':>14}")
    print(f"{'llama.cpp':12} {lp:14.1f} {ld:14.1f}")
    if spec:
        print(f"{'specinfer':12} {spec[0]:14.1f} {spec[1]:14.1f}")
        print(f"{'ratio s/l':12} {spec[0] / lp:14.2f} {spec[1] / ld:14.2f}")
    # The load after a run includes the benchmark's own threads; judge by the load before.
    if load_before[0] > 0.5 * affinity:
        print(f"warning: 1-minute load average {load_before[0]:.2f} on {affinity} usable cores "
              f"before the run - the machine was busy, the figures are noisy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
