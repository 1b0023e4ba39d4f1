#!/usr/bin/env python3
"""Process-level test of distributed serving: the real `specinfer` binary on loopback.

Starts `specinfer cluster` from a config with a request manager, two data-parallel SSM workers
(layers:2 self-speculation) and the LLM split over four workers (TP=2 x PP=2), every worker on a
free port, all on stories260K. Static trees (`spec_budget: static`): the test is about the remote
speculator's path, which the adaptive controller may rightly skip on a loaded machine. Reference
outputs come from the single-process engine (`specinfer serve`, no speculation), each request
served alone. Checks:

  1. greedy output through the cluster equals the single-process engine's, with and without
     speculation;
  2. 32 concurrent requests of mixed prompt and output lengths (half speculative) all complete,
     each identical to its output alone;
  3. kill -9 of an SSM worker mid-stream: every request still completes, identical; then of the
     other one too: plain decoding, still identical;
  4. kill -9 of an LLM worker mid-stream: the in-flight request gets a clear error event, the
     manager keeps answering (a new request gets an HTTP 5xx with an OpenAI-style error body);
     after the worker is started again (`specinfer worker --role llm --index 3 --port P`, as on
     another host), requests succeed again with the same output.

Usage: cluster_process_test.py PATH_TO_SPECINFER   (SPECINFER_SOURCE_DIR set by CTest)
Only the Python standard library is used (and tests/daemon_test_util.py).
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from daemon_test_util import (BIN, MODEL, TOKENIZER, check, failures,  # noqa: E402
                              listening_port, read_until_listening)

PROMPTS = [
    "Once upon a time",
    "Lily wanted to play with her ball in the park, but",
    "The cat",
    "One day, a little boy named Tim went to the store with his mom. He saw a big red",
    "",
    "Sam and Sue were friends. They liked to",
    "The sun was hot and the dog",
    "There was a big tree near the house. Every morning the birds",
]

procs = []


def start(args, log_name):
    """Starts a specinfer process; returns (proc, stdout lines reader)."""
    log = open(os.path.join(TMP, log_name), "w")
    p = subprocess.Popen([BIN, "--log-level", "info"] + args, stdout=subprocess.PIPE,
                         stderr=log, text=True)
    procs.append(p)
    return p


def workers(lines):
    out = {}
    for l in lines:
        if l.startswith("worker "):
            parts = dict(kv.split("=", 1) for kv in l.split()[2:])
            out[l.split()[1]] = (int(parts["pid"]), parts["address"])
    return out


def request(port, body, timeout=120):
    """Non-streaming completion: (status, parsed body)."""
    req = urllib.request.Request("http://127.0.0.1:%d/v1/completions" % port,
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read().decode())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read().decode() or "{}")


def stream(port, body, on_first=None, timeout=120):
    """Streaming completion: (text, error message or None)."""
    body = dict(body, stream=True)
    req = urllib.request.Request("http://127.0.0.1:%d/v1/completions" % port,
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    text, error, first = "", None, True
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            msg = json.loads(line[6:])
            if "error" in msg:
                error = msg["error"]["message"]
                continue
            text += msg["choices"][0]["text"]
            if first and on_first:
                first = False
                on_first()
    return text, error


def body(i, spec):
    b = {"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 8 + (i * 37) % 150,
         "temperature": 0}
    if spec:
        b["speculation"] = {"enabled": True, "tree": [1, 1, 2, 1]}
    return b


def run_concurrently(port, bodies, streaming=False, on_first=None):
    results = [None] * len(bodies)

    def one(k):
        try:
            if streaming:
                results[k] = stream(port, bodies[k], on_first=on_first)
            else:
                status, r = request(port, bodies[k])
                results[k] = (r["choices"][0]["text"], None) if status == 200 else (None, r)
        except Exception as e:  # noqa: BLE001 - reported as a failure below
            results[k] = (None, repr(e))

    threads = [threading.Thread(target=one, args=(k,)) for k in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def main():
    # --- reference: the single-process engine, each request alone ---
    ref_proc = start(["serve", "--model", MODEL, "--tokenizer", TOKENIZER, "--port", "0",
                      "--grpc-port", "0", "--threads", "1"], "reference.log")
    ref_port = listening_port(read_until_listening(ref_proc)[-1])
    reference = {}
    for i in range(32):
        b = body(i, False)
        status, r = request(ref_port, b)
        assert status == 200, r
        reference[i] = r["choices"][0]["text"]
    ref_proc.send_signal(signal.SIGTERM)
    ref_proc.wait(30)

    # --- the deployment ---
    config = os.path.join(TMP, "cluster.yaml")
    with open(config, "w") as f:
        f.write("""
models:
  llm: {path: %s, tokenizer: %s}
limits: {max_batch: 8, max_queue: 64}
manager: {http_port: 0, grpc_port: 0, threads: 1, tree: "1,1,2,1", probe_interval_ms: 200,
          rpc_timeout_ms: 3000, drain_timeout_s: 5, spec_budget: static}
ssm:
  - spec: layers:2
    max_sessions: 16
    replicas: [{port: 0, threads: 1}, {port: 0, threads: 1}]
llm:
  placement: workers
  tp: 2
  pp: 2
  threads: 1
  workers: [{port: 0}, {port: 0}, {port: 0}, {port: 0}]
restart_workers: false
""" % (MODEL, TOKENIZER))
    mgr = start(["cluster", "--config", config], "cluster.log")
    lines = read_until_listening(mgr)
    port = listening_port(lines[-1])
    w = workers(lines)
    check(sorted(w) == ["llm[0]", "llm[1]", "llm[2]", "llm[3]", "ssm[0]", "ssm[1]"],
          "cluster started 2 SSM and 4 LLM workers: %s" % sorted(w))

    # 1. greedy output equals the single-process engine's, speculation off and on
    for i in range(4):
        for spec in (False, True):
            status, r = request(port, body(i, spec))
            check(status == 200 and r["choices"][0]["text"] == reference[i],
                  "request %d (speculation %s) equals the single-process engine" % (i, spec))

    # 2. 32 concurrent requests of mixed lengths, half speculative
    t0 = time.time()
    results = run_concurrently(port, [body(i, i % 2 == 1) for i in range(32)])
    same = sum(1 for i in range(32) if results[i][0] == reference[i])
    check(same == 32, "32 concurrent mixed requests all complete, each identical to its output "
          "alone (%d/32, %.1f s)" % (same, time.time() - t0))

    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as r:
        metrics = r.read().decode()
    proposed = [l for l in metrics.splitlines()
                if l.startswith('specinfer_spec_accepted_tokens_by_speculator_total{speculator="layers:2"}')]
    check(proposed and float(proposed[0].split()[-1]) > 0,
          "the remote layers:2 speculator's proposals were accepted (%s)" % proposed)

    # 3. kill -9 an SSM worker mid-stream, then the other
    for victim in ("ssm[0]", "ssm[1]"):
        killed = threading.Event()

        def kill_once(victim=victim):
            if not killed.is_set():
                killed.set()
                os.kill(w[victim][0], signal.SIGKILL)

        bodies = [dict(body(i, True), max_tokens=150) for i in range(8)]
        results = run_concurrently(port, bodies, streaming=True, on_first=kill_once)
        same = sum(1 for i in range(8) if results[i][0] == reference_for(bodies[i], ref_cache))
        errors = [r[1] for r in results if r[1]]
        check(killed.is_set() and same == 8 and not errors,
              "%s killed mid-stream: 8 speculative streams complete, identical (%d/8, errors %s)"
              % (victim, same, errors))

    # 4. kill -9 an LLM worker mid-stream
    llm_pid, llm_address = w["llm[3]"]
    killed = threading.Event()

    def kill_llm():
        if not killed.is_set():
            killed.set()
            os.kill(llm_pid, signal.SIGKILL)

    text, error = stream(port, dict(body(0, False), max_tokens=400), on_first=kill_llm)
    check(error is not None and "LLM worker" in error,
          "LLM worker killed mid-stream: the stream ends with a clear error (%r)" % error)
    status, r = request(port, body(1, False))
    check(status >= 500 and "error" in r and r["error"].get("message"),
          "while the LLM worker is down the manager answers %d with an error body (%s)"
          % (status, r.get("error", {}).get("message")))
    # Start it again, as one would on its host.
    llm_port = llm_address.split(":")[-1]
    start(["worker", "--config", config, "--role", "llm", "--index", "3", "--port", llm_port],
          "llm3-restarted.log")
    ok = False
    deadline = time.time() + 60
    while time.time() < deadline and not ok:
        status, r = request(port, body(2, True))
        ok = status == 200 and r["choices"][0]["text"] == reference[2]
        if not ok:
            time.sleep(0.5)
    check(ok, "after the LLM worker restarts, requests succeed again with identical output")
    results = run_concurrently(port, [body(i, i % 2 == 0) for i in range(8)])
    same = sum(1 for i in range(8) if results[i][0] == reference[i])
    check(same == 8, "8 concurrent requests after the restart identical (%d/8)" % same)

    # graceful stop
    mgr.send_signal(signal.SIGTERM)
    try:
        rc = mgr.wait(30)
    except subprocess.TimeoutExpired:
        rc = None
    check(rc == 0, "the cluster stops cleanly on SIGTERM (exit %s)" % rc)
    with open(os.path.join(TMP, "cluster.log")) as f:
        log = f.read()
    check("ssm[0] 127.0.0.1:" in log and "killed by signal 9" in log and
          "marked down" in log and "no live replica" in log,
          "the manager's log names the dead workers, their replicas marked down, then plain "
          "decoding")


ref_cache = {}


def reference_for(b, cache):
    """The single-process output of `b` (max_tokens may differ from the table): computed once."""
    key = json.dumps({k: v for k, v in b.items() if k != "speculation"}, sort_keys=True)
    if key not in cache:
        cache[key] = REF_LOOKUP(b)
    return cache[key]


def reference_lookup_factory():
    proc = start(["serve", "--model", MODEL, "--tokenizer", TOKENIZER, "--port", "0",
                  "--grpc-port", "0", "--threads", "1"], "reference2.log")
    port = listening_port(read_until_listening(proc)[-1])

    def lookup(b):
        plain = {k: v for k, v in b.items() if k != "speculation"}
        status, r = request(port, plain)
        assert status == 200, r
        return r["choices"][0]["text"]

    return lookup


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as TMP:
        try:
            REF_LOOKUP = reference_lookup_factory()
            main()
        except Exception as e:  # noqa: BLE001
            failures.append("exception: %r" % e)
            print("FAIL: exception", repr(e))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            if failures:
                for name in ("cluster.log",):
                    path = os.path.join(TMP, name)
                    if os.path.exists(path):
                        print("---- tail of", name)
                        print("".join(open(path).readlines()[-40:]))
    print("%d failure(s)" % len(failures))
    sys.exit(1 if failures else 0)
