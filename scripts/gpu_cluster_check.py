#!/usr/bin/env python3
"""Serves a model through configs/single-gpu.yaml (the request manager on the CPU, the LLM in one
worker process on GPU 0) and checks it end to end over the OpenAI HTTP API: greedy completions
with and without speculation (prompt lookup, tree 1,1,1,1) must be equal, token for token.

    scripts/gpu_cluster_check.py [--specinfer build/specinfer] [--model PATH --tokenizer PATH]
                                 [--config configs/single-gpu.yaml] [--port 18000]
                                 [--tp N] [--pp M] [--eager]

With --tp/--pp above 1 the LLM runs as tp x pp worker processes on GPUs 0, 1, ... (NCCL between
them; the config is written here, in JSON, which YAML reads), and --eager turns the workers'
CUDA graphs off (llm.cuda_graphs: false), so that one machine can time both. The model defaults
to the default model when it has been fetched (models/), else stories260K from tests/data.
Prints each completion's timing and the median per mode; exits 1 when an answer differs, is
empty or fails, 2 when the cluster does not come up within --ready-timeout seconds. Needs a GPU
(the workers' backend is cuda); standard library only.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def request(url, body=None, timeout=120):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read().decode())


def write_config(src, model, tokenizer, port):
    """The config with the model path and the ports replaced (text edits: no YAML library)."""
    lines = []
    for line in open(src):
        key = line.split("#")[0].strip()
        if key.startswith("llm: ") and "/" in key:
            entry = {"path": model}
            if tokenizer:
                entry["tokenizer"] = tokenizer
            line = "  llm: " + json.dumps(entry) + "\n"
        elif key.startswith("http_port:"):
            line = "  http_port: %d\n" % port
        elif key.startswith("grpc_port:"):
            line = "  grpc_port: %d\n" % (port + 1)
        elif key.startswith("- {host: local, port: 5201"):
            line = line.replace("5201", str(port + 2))
        lines.append(line)
    return save("".join(lines))


def group_config(model, tokenizer, port, tp, pp, eager):
    """A deployment of tp x pp LLM worker processes, worker i on GPU i, as JSON (valid YAML)."""
    entry = {"path": model}
    if tokenizer:
        entry["tokenizer"] = tokenizer
    config = {
        "models": {"llm": entry},
        "limits": {"max_batch": 16, "max_batch_tokens": 512, "max_queue": 64, "context": 2048},
        "manager": {"host": "local", "http_port": port, "grpc_port": port + 1,
                    "tree": "1,1,1,1"},
        "llm": {"placement": "workers", "backend": "cuda", "tp": tp, "pp": pp,
                "cuda_graphs": not eager,
                "workers": [{"host": "local", "port": port + 2 + i, "gpu": i}
                            for i in range(tp * pp)]},
    }
    return save(json.dumps(config, indent=1))


def save(text):
    f = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    f.write(text)
    f.close()
    return f.name


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--specinfer", default=os.path.join(ROOT, "build", "specinfer"))
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "single-gpu.yaml"))
    ap.add_argument("--model")
    ap.add_argument("--tokenizer")
    ap.add_argument("--port", type=int, default=18000)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--ready-timeout", type=float, default=120)
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel LLM workers per stage")
    ap.add_argument("--pp", type=int, default=1, help="pipeline stages")
    ap.add_argument("--eager", action="store_true", help="the workers without CUDA graphs")
    args = ap.parse_args()

    model, tokenizer = args.model, args.tokenizer
    if not model:
        default = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
        if os.path.exists(default):
            model = default
        else:
            model = os.path.join(ROOT, "tests", "data", "stories260K", "stories260K.bin")
            tokenizer = os.path.join(ROOT, "tests", "data", "stories260K", "tok512.bin")
    if args.tp * args.pp > 1 or args.eager:
        config = group_config(model, tokenizer, args.port, args.tp, args.pp, args.eager)
        what = "tp %d x pp %d LLM workers on GPUs 0-%d, CUDA graphs %s" % (
            args.tp, args.pp, args.tp * args.pp - 1, "off" if args.eager else "on")
    else:
        config = write_config(args.config, model, tokenizer, args.port)
        what = args.config
    log = open(os.path.join(tempfile.gettempdir(), "gpu_cluster_check.log"), "w")
    print("serving %s with %s (log %s)" % (model, what, log.name), flush=True)
    proc = subprocess.Popen([args.specinfer, "cluster", "--config", config], cwd=ROOT,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = "http://127.0.0.1:%d" % args.port
    failures = 0
    ms = {"plain": [], "speculative": []}
    try:
        deadline = time.time() + args.ready_timeout
        while True:
            if proc.poll() is not None:
                print("error: the cluster exited with %d before it was ready" % proc.returncode)
                return 2
            try:
                request(base + "/health", timeout=2)
                break
            except (urllib.error.URLError, OSError, ValueError):
                if time.time() > deadline:
                    print("error: not ready after %.0f s" % args.ready_timeout)
                    return 2
                time.sleep(0.5)
        print("ready after %.1f s" % (time.time() + args.ready_timeout - deadline), flush=True)
        name = request(base + "/v1/models")["data"][0]["id"]
        prompts = ["Once upon a time", "The little dog ran to the park and", "Lily and Tom were",
                   "One day, a big red ball"]
        for prompt in prompts:
            texts = []
            for spec in (None, {"enabled": True, "draft": ["ngram:3"], "tree": [1, 1, 1, 1]}):
                body = {"model": name, "prompt": prompt, "max_tokens": args.max_tokens,
                        "temperature": 0}
                if spec:
                    body["speculation"] = spec
                t0 = time.time()
                try:
                    out = request(base + "/v1/completions", body)
                except (urllib.error.URLError, OSError, ValueError) as e:
                    print("error: %r: %s" % (prompt, e))
                    failures += 1
                    continue
                text = out["choices"][0]["text"]
                texts.append(text)
                mode = "speculative" if spec else "plain"
                ms[mode].append(1000 * (time.time() - t0))
                print("%-12s %6.1f ms %3d tokens  %r" % (
                    mode, ms[mode][-1], out.get("usage", {}).get("completion_tokens", -1),
                    text[:60]), flush=True)
            if len(texts) != 2 or not texts[0] or texts[0] != texts[1]:
                print("error: greedy output with and without speculation differs for %r" % prompt)
                failures += 1
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        os.unlink(config)
    for mode, values in ms.items():
        if values:
            print("median %-12s %6.1f ms per completion (%d)" % (
                mode, sorted(values)[len(values) // 2], len(values)))
    print("cluster check (%s): %s" % (what, "passed" if failures == 0 else
                                      "%d failures" % failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
