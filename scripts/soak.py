#!/usr/bin/env python3
"""Soak test of the real daemon on loopback: many mixed requests, faults, then no state leaked.

Starts `specinfer serve` (or, with --cluster, `specinfer cluster`: a request manager, SSM workers
and the LLM split over TP x PP workers, every process on a free loopback port) on stories260K,
then:

  1. reference: each of a fixed table of requests (prompt x max_tokens x endpoint x greedy or
     seeded sampling) served alone, speculation off;
  2. warm-up: a short mixed phase (drafts are created on first use, pools fill), then the
     daemon's RSS (VmRSS of /proc/PID/status; the manager's in cluster mode) and /metrics;
  3. the mixed phase: --requests requests from --concurrency threads, each drawn (seeded) from:
     completions or chat, streamed or not, speculation off or on (the daemon's default drafts,
     ngram, a layers:K self-draft, several merged; in cluster mode the config's SSM workers),
     greedy or seeded sampling, one choice or n=2, with or without logprobs, a stream cancelled
     mid-way (the client closes its socket), a non-streaming request abandoned before its
     answer, a client that dies halfway through sending its body, and malformed requests (bad
     JSON, an
     unknown field, out-of-range values, invalid UTF-8, a prompt beyond the context, a bad
     speculation setting, an unknown model, a body over the size limit, a missing or wrong API
     key, an unknown path), each of which must get its documented 4xx;
     in cluster mode it SIGKILLs an SSM worker and later an LLM worker (the launcher restarts
     them: restart_workers) while requests run;
  4. checks, once the daemon is idle: every request got a complete answer or an expected error
     (none lost: a timeout, a reset, a stream without [DONE] or an unexpected status is lost);
     every completed greedy output, and every seeded sampled one without speculation, equals its
     reference; /health answers; /metrics shows queue length 0, running 0, KV blocks used and
     draft sessions back at their idle values; the RSS grew by at most --rss-growth-pct percent
     plus --rss-slack-mib MiB over the warm-up value.

The RSS bound (default +10% + 8 MiB): after the warm-up `serve` holds ~215 MiB (--max-queue 64),
nearly all of it fixed: the CUDA libraries linked into every build (~60 MiB of code), OpenBLAS's
per-thread buffers, the model and KV pool, the 80 HTTP handler threads' stacks. Over the mixed
phase it grows by 5-9 MiB, most of it early, as handler threads and malloc arenas reach their
high-water marks, and the growth flattens out (the printed trace: RSS at every tenth of the run).
The bound is ~3x that, and a leak of 2 KiB per request fails a 20000-request run.

What counts as an expected error follows the documented fault behaviour (README, "Faults"): an
SSM worker's death fails nothing (its sessions move on, or decode plainly); an LLM worker's death
fails the requests in flight with a clear error (a 5xx OpenAI error object, an {"error": ...}
stream event, or an error body after a 200 on a long non-streaming answer) and requests get 5xx
until the group re-forms. Such errors count as expected only for requests that overlap the
outage (from the kill until a probe request succeeds again, plus a few seconds).

Prints a summary (requests by kind, faults, lost, leaks, RSS, throughput) and exits 1 on any
failure, 0 otherwise. Only the Python standard library. Loopback only; every wait is bounded
(--request-timeout per request, --max-seconds for the mixed phase: no request starts after it).

Usage: scripts/soak.py [--bin build/specinfer] [--cluster] [--requests 3000] [--concurrency 12]
                       [--max-seconds 600] [--seed 1]
"""
import argparse
import collections
import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
MODEL = os.path.join(SRC, "tests/data/stories260K/stories260K.bin")
TOKENIZER = os.path.join(SRC, "tests/data/stories260K/tok512.bin")
API_KEY = "sk-soak-%d" % os.getpid()
MAX_BODY = 65536  # --max-body-bytes: a 413 case needs a body over it

PROMPTS = [
    "Once upon a time",
    "Lily wanted to play with her ball in the park, but",
    "The cat",
    "One day, a little boy named Tim went to the store with his mom. He saw a big red",
    "Sam and Sue were friends. They liked to",
    "The sun was hot and the dog",
    "There was a big tree near the house. Every morning the birds",
    "Ben had a toy car. Ben had a toy car. Ben had a",
]
MAX_TOKENS = [8, 24, 64]
# The cluster serves a request alone at ~75 tokens/s on 2 cores (RPC round trips per token), so
# its reference table is smaller: 4 prompts (one repetitive, for prompt lookup) x 2 lengths.
CLUSTER_PROMPTS = [0, 1, 3, 7]
CLUSTER_MAX_TOKENS = [8, 32]
ENDPOINTS = ["/v1/completions", "/v1/chat/completions"]
# Seeded sampling: a sampled request without speculation must equal its reference too.
SAMPLINGS = [("greedy", {"temperature": 0}),
             ("sampled", {"temperature": 0.8, "top_p": 0.95, "seed": 7})]


def log(*a):
    print(*a, flush=True)


# ---------------------------------------------------------------------------------------------
# The daemon


class Daemon:
    """The process under test: `serve`, or `cluster` with its workers as children."""

    def __init__(self, args, tmp):
        self.args, self.tmp = args, tmp
        self.proc = None
        self.port = None
        self.workers = {}  # "ssm[0]" -> (pid, address), as printed at start
        self.stderr_path = args.log or os.path.join(tmp, "daemon.log")

    def start(self):
        env = dict(os.environ, SPECINFER_API_KEY=API_KEY)
        if self.args.cluster:
            config = os.path.join(self.tmp, "cluster.yaml")
            with open(config, "w") as f:
                f.write(cluster_config(self.args))
            cmd = [self.args.bin, "--log-level", "info", "cluster", "--config", config,
                   "--any-ports", "--chat-template", "chatml"]
        else:
            cmd = [self.args.bin, "--log-level", "warn", "serve", "--model", MODEL,
                   "--tokenizer", TOKENIZER, "--port", "0", "--grpc-port", "0", "--threads",
                   str(self.args.threads), "--chat-template", "chatml", "--max-batch", "8",
                   "--max-queue", str(self.args.max_queue), "--max-body-bytes", str(MAX_BODY),
                   "--draft", "ngram", "--draft", "layers:2", "--tree", "1,1,2,1"]
        with open(self.stderr_path, "w") as err:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True,
                                         env=env)
        deadline = time.time() + 120
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("the daemon exited before listening; log:\n" + self.log_tail())
            if line.startswith("worker "):
                parts = dict(kv.split("=", 1) for kv in line.split()[2:])
                self.workers[line.split()[1]] = (int(parts["pid"]), parts["address"])
            if line.startswith("listening http="):
                self.port = int(line.split()[1].split(":")[-1])
                # Drain stdout from now on, so that the daemon never blocks on a full pipe.
                threading.Thread(target=self.proc.stdout.read, daemon=True).start()
                return
        raise RuntimeError("the daemon did not listen within 120 s")

    def stop(self):
        """SIGTERM, then SIGKILL after 30 s; the exit status (None if it had to be killed)."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None

    def log_tail(self, n=40):
        try:
            with open(self.stderr_path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def rss_kib(self, pid=None):
        try:
            with open("/proc/%d/status" % (pid or self.proc.pid)) as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1])
        except OSError:
            pass
        return None

    def worker_pids_now(self):
        """Child pids of the launcher by name, read from the log's restarts and the start list."""
        pids = {name: pid for name, (pid, _) in self.workers.items()}
        for line in self.log_tail(100000).splitlines():
            # "... [warning] llm[2] 127.0.0.1:5203 restarted (pid 22169)"
            m = re.search(r"(\w+\[\d+\]) \S+ restarted \(pid (\d+)\)", line)
            if m:
                pids[m.group(1)] = int(m.group(2))
        return pids


def cluster_config(args):
    llm_workers = ", ".join(["{port: 0}"] * (args.tp * args.pp))
    return """
models:
  llm: {path: %s, tokenizer: %s}
limits: {max_batch: 8, max_queue: %d, max_body_bytes: %d}
manager: {http_port: 0, grpc_port: 0, threads: 1, tree: "1,1,2,1", probe_interval_ms: 200,
          rpc_timeout_ms: 3000, drain_timeout_s: 5}
ssm:
  - spec: layers:2
    max_sessions: 16
    replicas: [{port: 0, threads: 1}, {port: 0, threads: 1}]
llm:
  placement: workers
  tp: %d
  pp: %d
  threads: 1
  workers: [%s]
restart_workers: true
""" % (MODEL, TOKENIZER, args.max_queue, MAX_BODY, args.tp, args.pp, llm_workers)


# ---------------------------------------------------------------------------------------------
# HTTP


class Lost(Exception):
    """The request got no complete answer: timeout, reset, truncated stream."""


def headers(key=API_KEY):
    h = {"Content-Type": "application/json"}
    if key is not None:
        h["Authorization"] = "Bearer " + key
    return h


def get(port, path, timeout=10):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read().decode(errors="replace")
    finally:
        conn.close()


def metrics(port):
    status, text = get(port, "/metrics")
    if status != 200:
        raise RuntimeError("/metrics answered %d" % status)
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def choice_text(endpoint, choice, streamed):
    if endpoint == "/v1/completions":
        return choice.get("text") or ""
    part = choice.get("delta" if streamed else "message") or {}
    return part.get("content") or ""


def post(port, path, body, hdrs, timeout, stream=False, cut_after=None, abandon_after=None):
    """One POST. Returns (status, texts, finish reasons, error message or None, events), texts
    and finish reasons by choice index.

    body: bytes. stream: read server-sent events. cut_after: close the socket after that many
    data events (a client that leaves mid-stream). abandon_after: seconds after sending a
    non-streaming request at which the socket is closed unread. Raises Lost when the answer is
    incomplete (timeout, reset, a stream without [DONE], a body that is not JSON).
    """
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        try:
            conn.request("POST", path, body=body, headers=hdrs)
            if abandon_after is not None:
                time.sleep(abandon_after)
                conn.sock.shutdown(socket.SHUT_RDWR)
                return None, {}, {}, None, 0
            r = conn.getresponse()
            if not stream or r.status != 200:
                raw = r.read().decode(errors="replace")
                try:
                    j = json.loads(raw)
                except ValueError:
                    raise Lost("status %d, body not JSON: %r" % (r.status, raw[:200]))
                if "error" in j:
                    return r.status, {}, {}, j["error"].get("message") or "(no message)", 0
                return (r.status, {c["index"]: choice_text(path, c, False) for c in j["choices"]},
                        {c["index"]: c.get("finish_reason") for c in j["choices"]}, None, 0)
            text, finish, error, events = {}, {}, None, 0
            for _ in range(100000):  # bounded: one line per iteration
                raw = r.readline()
                if not raw:
                    raise Lost("stream ended without [DONE] after %d events" % events)
                line = raw.decode(errors="replace").strip()
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    return r.status, text, finish, error, events
                msg = json.loads(line[6:])
                events += 1
                if "error" in msg:
                    error = msg["error"].get("message") or "(no message)"
                    continue
                for c in msg.get("choices", []):
                    i = c["index"]
                    text[i] = text.get(i, "") + choice_text(path, c, True)
                    finish[i] = c.get("finish_reason") or finish.get(i)
                if cut_after is not None and events >= cut_after:
                    conn.sock.shutdown(socket.SHUT_RDWR)
                    return r.status, text, {}, None, events
            raise Lost("stream longer than 100000 lines")
        except (OSError, http.client.HTTPException, ValueError) as e:
            raise Lost(repr(e))
    finally:
        conn.close()


def send_partial(port, path, body, hdrs, timeout):
    """Sends the headers and half of `body`, then closes: a client that dies mid-upload."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            head = "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n" % (
                path, len(body))
            head += "".join("%s: %s\r\n" % kv for kv in hdrs.items()) + "\r\n"
            sock.sendall(head.encode() + body[:len(body) // 2])
            sock.shutdown(socket.SHUT_RDWR)
    except OSError as e:
        raise Lost(repr(e))


# ---------------------------------------------------------------------------------------------
# Requests


def valid_body(endpoint, prompt, max_tokens, sampling, spec=None, stream=False, n=1,
               logprobs=False):
    b = dict(sampling)
    if n != 1:
        b["n"] = n
    if logprobs:  # the text must not change
        b.update({"logprobs": 2} if endpoint == "/v1/completions" else
                 {"logprobs": True, "top_logprobs": 2})
    if endpoint == "/v1/completions":
        b.update(prompt=prompt, max_tokens=max_tokens)
    else:
        b.update(messages=[{"role": "user", "content": prompt}], max_completion_tokens=max_tokens)
    if spec is not None:
        b["speculation"] = spec
    if stream:
        b["stream"] = True
    return b


def malformed_cases():
    """(name, path, body bytes, headers, expected status)."""
    long_prompt = "Once upon a time there was a little cat. " * 200  # far beyond 512 tokens
    ok = json.dumps({"prompt": "The cat", "max_tokens": 4}).encode()
    cases = [
        ("bad JSON", "/v1/completions", b'{"prompt": "The cat", "max_tokens": ', headers(), 400),
        ("unknown field", "/v1/completions",
         json.dumps({"prompt": "x", "max_tokens": 4, "temprature": 0}).encode(), headers(), 400),
        ("temperature out of range", "/v1/completions",
         json.dumps({"prompt": "x", "temperature": 5}).encode(), headers(), 400),
        ("negative max_tokens", "/v1/chat/completions",
         json.dumps({"messages": [{"role": "user", "content": "x"}],
                     "max_completion_tokens": -3}).encode(), headers(), 400),
        ("top_p 0", "/v1/completions", json.dumps({"prompt": "x", "top_p": 0}).encode(),
         headers(), 400),
        ("wrong type", "/v1/completions", json.dumps({"prompt": 42}).encode(), headers(), 400),
        ("invalid UTF-8", "/v1/completions", b'{"prompt": "caf\xc3\x28 \xff", "max_tokens": 4}',
         headers(), 400),
        ("prompt beyond the context", "/v1/completions",
         json.dumps({"prompt": long_prompt, "max_tokens": 8}).encode(), headers(), 400),
        ("bad speculation tree", "/v1/completions",
         json.dumps({"prompt": "x", "speculation": {"enabled": True, "tree": [0, -1]}}).encode(),
         headers(), 400),
        ("unknown draft", "/v1/completions",
         json.dumps({"prompt": "x", "speculation": {"enabled": True,
                                                     "draft": ["bogus:1"]}}).encode(),
         headers(), 400),
        ("unknown model", "/v1/completions",
         json.dumps({"prompt": "x", "model": "no-such-model"}).encode(), headers(), 404),
        ("body over the limit", "/v1/completions",
         json.dumps({"prompt": "x" * (MAX_BODY + 100)}).encode(), headers(), 413),
        ("missing API key", "/v1/completions", ok, headers(None), 401),
        ("wrong API key", "/v1/chat/completions", ok, headers("sk-wrong"), 401),
        ("unknown path", "/v1/complete", ok, headers(), 404),
    ]
    return cases


class Plan:
    """The seeded choice of every request of a phase."""

    def __init__(self, seed, cluster):
        self.rng = random.Random(seed)
        self.cluster = cluster
        self.malformed = malformed_cases()
        if cluster:  # the config's SSM workers (layers:2) by default, or prompt lookup
            self.specs = [("spec:default", {"enabled": True}),
                          ("spec:ngram", {"enabled": True, "draft": ["ngram:3"]}),
                          ("spec:ssm+ngram", {"enabled": True, "draft": ["layers:2", "ngram:2"],
                                              "tree": [2, 1, 1]})]
        else:
            self.specs = [("spec:default", {"enabled": True}),
                          ("spec:ngram", {"enabled": True, "draft": ["ngram:3"],
                                          "tree": [1, 1, 1, 1]}),
                          ("spec:layers", {"enabled": True, "draft": ["layers:2"]}),
                          ("spec:merged", {"enabled": True, "draft": ["ngram:2", "layers:3"],
                                           "tree": [2, 1, 1]})]

    def next(self):
        """A dict describing one request."""
        rng = self.rng
        x = rng.random()
        if x < 0.10:
            name, path, body, hdrs, want = rng.choice(self.malformed)
            return {"kind": "malformed", "label": "malformed: " + name, "path": path,
                    "body": body, "headers": hdrs, "want": want}
        endpoint = rng.choice(ENDPOINTS)
        p = rng.randrange(len(PROMPTS))
        if x < 0.16:  # a stream cut after a few events
            b = valid_body(endpoint, PROMPTS[p], 200, {"temperature": 0, "ignore_eos": True},
                           spec=rng.choice([None, rng.choice(self.specs)[1]]), stream=True,
                           n=rng.choice([1, 1, 2]))
            return {"kind": "cancel-stream", "label": "cancelled mid-stream", "path": endpoint,
                    "body": json.dumps(b).encode(), "headers": headers(), "stream": True,
                    "cut_after": rng.randint(1, 4)}
        if x < 0.18:  # a non-streaming request abandoned unanswered
            b = valid_body(endpoint, PROMPTS[p], rng.choice(MAX_TOKENS), {"temperature": 0},
                           spec=rng.choice([None, rng.choice(self.specs)[1]]))
            return {"kind": "cancel-plain", "label": "abandoned non-streaming", "path": endpoint,
                    "body": json.dumps(b).encode(), "headers": headers(),
                    "abandon_after": rng.choice([0.0, 0.01, 0.05])}
        if x < 0.20:  # a client that dies while sending its body
            b = valid_body(endpoint, PROMPTS[p], rng.choice(MAX_TOKENS), {"temperature": 0})
            return {"kind": "cancel-upload", "label": "body cut short", "path": endpoint,
                    "body": json.dumps(b).encode(), "headers": headers()}
        m = rng.randrange(len(MAX_TOKENS))
        s = 0 if rng.random() < 0.6 else 1
        stream = rng.random() < 0.5
        spec_name, spec = ("spec:off", None) if rng.random() < 0.5 else rng.choice(self.specs)
        n = 2 if rng.random() < 0.15 else 1
        logprobs = rng.random() < 0.15
        b = valid_body(endpoint, PROMPTS[p], MAX_TOKENS[m], SAMPLINGS[s][1], spec, stream, n,
                       logprobs)
        label = "%s %s %s %s%s%s" % ("chat" if "chat" in endpoint else "completion",
                                      "stream" if stream else "plain", SAMPLINGS[s][0], spec_name,
                                      " n=2" if n == 2 else "", " logprobs" if logprobs else "")
        # Greedy output never depends on speculation; seeded sampling only without it. Choice i
        # samples with seed + i: the reference (seed) is choice 0's; greedy choices are all equal.
        ref = (endpoint, p, m, s) if (s == 0 or spec is None) else None
        return {"kind": "valid", "label": label, "path": endpoint, "body": json.dumps(b).encode(),
                "headers": headers(), "stream": stream, "ref": ref, "n": n}


# ---------------------------------------------------------------------------------------------
# The run


class Outage:
    """Windows in which a fault makes 5xx / error events expected (LLM worker down)."""

    def __init__(self):
        self.mu = threading.Lock()
        self.windows = []  # [start, end or None]

    def begin(self):
        with self.mu:
            self.windows.append([time.time(), None])
            return len(self.windows) - 1

    def end(self, i):
        with self.mu:
            self.windows[i][1] = time.time()

    def covers(self, t0, t1, slack=3.0):
        """Whether [t0, t1] ends after a kill and starts before `slack` s past its recovery."""
        with self.mu:
            for start, end in self.windows:
                if t1 >= start and (end is None or t0 <= end + slack):
                    return True
        return False


class Tally:
    def __init__(self):
        self.mu = threading.Lock()
        self.by_label = collections.Counter()
        self.by_kind = collections.Counter()
        self.outcomes = collections.Counter()
        self.failures = []
        self.lost = []
        self.completed_greedy_checked = 0
        self.completed_sampled_checked = 0
        self.latencies = []
        self.fault_errors = collections.Counter()  # message (digits masked) -> count
        self.fault_error_spans = []  # (start, end) of each request that got one

    def fail(self, what):
        with self.mu:
            self.failures.append(what)
        if len(self.failures) <= 30:
            log("FAIL:", what)


def run_one(port, req, refs, tally, outage, timeout):
    t0 = time.time()
    try:
        if req["kind"] == "cancel-upload":
            send_partial(port, req["path"], req["body"], req["headers"], timeout)
            status, text, finish, error, events = None, {}, {}, None, 0
        else:
            status, text, finish, error, events = post(
                port, req["path"], req["body"], req["headers"], timeout,
                stream=req.get("stream"), cut_after=req.get("cut_after"),
                abandon_after=req.get("abandon_after"))
    except Lost as e:
        with tally.mu:
            tally.lost.append("%s: %s" % (req["label"], e))
            tally.outcomes["lost"] += 1
        if len(tally.lost) <= 30:
            log("LOST:", req["label"], e)
        return
    t1 = time.time()
    with tally.mu:
        tally.by_label[req["label"]] += 1
        tally.by_kind[req["kind"]] += 1
        tally.latencies.append(t1 - t0)
    kind = req["kind"]
    if kind == "malformed":
        if status == req["want"] and error:
            outcome = "expected 4xx"
        else:
            outcome = "unexpected"
            tally.fail("%s: status %s (want %d), error %r" % (req["label"], status, req["want"],
                                                            error))
    elif kind in ("cancel-plain", "cancel-upload"):
        outcome = "abandoned"
    elif error is not None or status != 200:
        if status is not None and (status >= 500 or status == 200) and error and \
                outage.covers(t0, t1):
            outcome = "expected fault error"
            with tally.mu:
                tally.fault_errors["%s %s" % (status, re.sub(r"\d+", "N", error)[:160])] += 1
                tally.fault_error_spans.append((t0, t1))
        else:
            outcome = "unexpected"
            tally.fail("%s: status %s, error %r" % (req["label"], status, error))
    elif kind == "cancel-stream":
        outcome = "cancelled" if events >= req["cut_after"] else "completed before the cut"
    else:
        outcome = "completed"
        n = req["n"]
        if sorted(finish) != list(range(n)) or \
                any(f not in ("stop", "length") for f in finish.values()):
            tally.fail("%s: finish reasons %r" % (req["label"], finish))
        ref = req.get("ref")
        if ref is not None:
            want = refs[ref]
            for i in range(n if ref[3] == 0 else 1):
                if text.get(i) != want:
                    tally.fail("%s: choice %d differs from its reference %s: %r vs %r" %
                               (req["label"], i, ref, (text.get(i) or "")[:80], want[:80]))
            with tally.mu:
                if ref[3] == 0:
                    tally.completed_greedy_checked += 1
                else:
                    tally.completed_sampled_checked += 1
    with tally.mu:
        tally.outcomes[outcome] += 1
    return outcome


def record_references(port, timeout):
    refs = {}
    for ei, endpoint in enumerate(ENDPOINTS):
        for p, prompt in enumerate(PROMPTS):
            for m, n in enumerate(MAX_TOKENS):
                for s, (_, sampling) in enumerate(SAMPLINGS):
                    body = json.dumps(valid_body(endpoint, prompt, n, sampling)).encode()
                    status, text, finish, error, _ = post(port, endpoint, body, headers(), timeout)
                    if status != 200 or error:
                        raise RuntimeError("reference %s %d %d %d: %s %s" %
                                           (endpoint, p, m, s, status, error))
                    refs[(endpoint, p, m, s)] = text[0]
    return refs


def mixed_phase(port, plan, n, concurrency, deadline, refs, tally, outage, timeout,
                on_progress=None):
    """Sends n requests from `concurrency` threads; none starts after `deadline`."""
    lock = threading.Lock()
    state = {"next": 0, "done": 0}

    def worker():
        while True:
            with lock:
                if state["next"] >= n or time.time() > deadline:
                    return
                state["next"] += 1
                req = plan.next()
            if run_one(port, req, refs, tally, outage, timeout) == "expected fault error":
                time.sleep(0.2)  # as a client would back off, not spin on a down cluster
            with lock:
                state["done"] += 1
                done = state["done"]
            if on_progress:
                on_progress(done)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    # Bounded join: a request is bounded by its timeout, so the phase by deadline + timeout.
    for t in threads:
        t.join(max(0.0, deadline + timeout + 30 - time.time()))
    hung = sum(1 for t in threads if t.is_alive())
    return state["next"], hung


def wait_idle(port, idle, timeout=60):
    """Polls /metrics until nothing runs or waits; the last sample."""
    deadline = time.time() + timeout
    m = metrics(port)
    while time.time() < deadline:
        if m.get("specinfer_queue_length") == 0 and m.get("specinfer_running_sequences") == 0 \
                and m.get("specinfer_kv_blocks_used") == idle["kv"] \
                and m.get("specinfer_draft_sessions", 0) == idle["sessions"]:
            return m
        time.sleep(0.2)
        m = metrics(port)
    return m


def probe_until_serving(port, timeout):
    """A tiny request until one succeeds; the seconds it took, or None."""
    t0 = time.time()
    body = json.dumps({"prompt": "The cat", "max_tokens": 2, "temperature": 0}).encode()
    while time.time() - t0 < timeout:
        try:
            status, _, _, error, _ = post(port, "/v1/completions", body, headers(), 30)
            if status == 200 and not error:
                return time.time() - t0
        except Lost:
            pass
        time.sleep(0.2)
    return None


class Faults:
    """Cluster mode: SIGKILL an SSM worker at 30% of the run and an LLM worker at 60%."""

    def __init__(self, daemon, n, outage, tally):
        self.daemon, self.outage, self.tally = daemon, outage, tally
        self.n, self.t0, self.span = n, time.time(), daemon.args.max_seconds
        # At a fraction of the run: of the requests, or of --max-seconds if that comes first.
        self.points = [(0.3, "ssm[0]"), (0.6, "llm[%d]" % (daemon.args.tp * daemon.args.pp - 1))]
        self.injected = []
        self.threads = []
        self.mu = threading.Lock()

    def on_progress(self, done):
        frac = max(done / self.n, (time.time() - self.t0) / self.span)
        with self.mu:
            while self.points and frac >= self.points[0][0]:
                _, victim = self.points.pop(0)
                t = threading.Thread(target=self.kill, args=(victim,), daemon=True)
                self.threads.append(t)
                t.start()

    def kill(self, victim):
        pid = self.daemon.worker_pids_now()[victim]
        llm = victim.startswith("llm")
        window = self.outage.begin() if llm else None
        t_kill = time.time()
        os.kill(pid, signal.SIGKILL)
        log("fault: SIGKILL %s (pid %d)" % (victim, pid))
        # The launcher restarts it (restart_workers); requests succeed again once it is back.
        took = probe_until_serving(self.daemon.port, 120)
        if window is not None:
            self.outage.end(window)
        with self.mu:
            self.injected.append((victim, pid, took, t_kill))
        if took is None:
            self.tally.fail("after SIGKILL of %s the cluster did not serve again within 120 s"
                            % victim)
        else:
            log("fault: %s killed; serving again after %.1f s" % (victim, took))

    def join(self, timeout):
        for t in self.threads:
            t.join(timeout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(SRC, "build/specinfer"))
    ap.add_argument("--cluster", action="store_true", help="`specinfer cluster` with worker kills")
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--warmup", type=int, default=0, help="warm-up requests (0: requests / 10, "
                    "at most 300)")
    ap.add_argument("--concurrency", type=int, default=12)
    ap.add_argument("--max-seconds", type=float, default=600, help="no request starts later")
    ap.add_argument("--request-timeout", type=float, default=60)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--log", help="write the daemon's log (standard error) here, not to a "
                    "temporary file")
    ap.add_argument("--threads", type=int, default=2, help="serve: engine threads")
    ap.add_argument("--max-queue", type=int, default=64,
                    help="the daemon's queue limit (its HTTP threads: this + 16)")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--rss-growth-pct", type=float, default=10)
    ap.add_argument("--rss-slack-mib", type=float, default=8)
    args = ap.parse_args()
    if not args.warmup:
        args.warmup = min(300, max(20, args.requests // 10))

    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        daemon = Daemon(args, tmp)
        try:
            ok = run(args, daemon)
        except Exception as e:  # noqa: BLE001 - any error is a failed soak, reported below
            log("FAIL: exception %r" % e)
            ok = False
        rc = daemon.stop()
        if rc != 0:
            log("FAIL: the daemon exited with status %s on SIGTERM" % rc)
            ok = False
        if args.cluster and daemon.proc is not None:
            # Every worker, restarted ones included, drained and exited 0 on the launcher's
            # SIGTERM (none killed mid-shutdown, none left to SIGKILL).
            stopped = [line.split(" stopped: ", 1) for line in daemon.log_tail(1000000).splitlines()
                       if " stopped: " in line]
            bad = [line for line, how in stopped if how.strip() != "exited with status 0"]
            if not stopped or bad:
                log("FAIL: workers that did not stop cleanly: %d of %d: %s" %
                    (len(bad), len(stopped), bad[:3]))
                ok = False
            else:
                log("ok: every worker (%d) exited 0 on SIGTERM" % len(stopped))
        # A sanitizer build (scripts/test.sh --sanitize) reports into the log.
        reports = [line for line in daemon.log_tail(1000000).splitlines()
                   if "Sanitizer" in line and "ERROR" in line or ": runtime error:" in line]
        if reports:
            log("FAIL: sanitizer reports in the daemon's log: %d, first: %s" % (len(reports),
                                                                              reports[0]))
            ok = False
        if not ok:
            log("---- tail of the daemon's log")
            log(daemon.log_tail())
    log("soak: %s" % ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


def run(args, daemon):
    global PROMPTS, MAX_TOKENS
    if args.cluster:
        PROMPTS = [PROMPTS[i] for i in CLUSTER_PROMPTS]
        MAX_TOKENS = CLUSTER_MAX_TOKENS
    t_start = time.time()
    daemon.start()
    port = daemon.port
    mode = "cluster (%d SSM workers, LLM TP=%d x PP=%d)" % (2, args.tp, args.pp) \
        if args.cluster else "serve"
    log("daemon: %s, pid %d, http 127.0.0.1:%d, started in %.1f s" %
        (mode, daemon.proc.pid, port, time.time() - t_start))

    t0 = time.time()
    refs = record_references(port, args.request_timeout)
    log("reference: %d requests served alone in %.1f s" % (len(refs), time.time() - t0))

    outage = Outage()
    warm = Tally()
    plan = Plan(args.seed, args.cluster)
    mixed_phase(port, plan, args.warmup, args.concurrency, time.time() + args.max_seconds, refs,
                warm, outage, args.request_timeout)
    if warm.failures or warm.lost:
        log("FAIL: %d failure(s), %d lost during the warm-up" % (len(warm.failures),
                                                                 len(warm.lost)))
        return False
    idle = {"kv": 0, "sessions": 0}
    before = wait_idle(port, idle)
    idle = {"kv": before.get("specinfer_kv_blocks_used"),
            "sessions": before.get("specinfer_draft_sessions", 0)}
    rss_before = daemon.rss_kib()
    log("warm-up: %d requests; idle: kv_blocks_used %g, draft_sessions %g, RSS %.1f MiB" %
        (args.warmup, idle["kv"], idle["sessions"], rss_before / 1024))

    tally = Tally()
    faults = Faults(daemon, args.requests, outage, tally) if args.cluster else None
    rss_trace = []  # (requests done, RSS KiB) at every tenth of the run: flat, or a leak's slope
    step = max(1, args.requests // 10)

    def on_progress(done):
        if faults:
            faults.on_progress(done)
        if done % step == 0:
            rss_trace.append((done, daemon.rss_kib()))

    t0 = time.time()
    sent, hung = mixed_phase(port, plan, args.requests, args.concurrency,
                             t0 + args.max_seconds, refs, tally, outage, args.request_timeout,
                             on_progress=on_progress)
    elapsed = time.time() - t0
    if faults:
        faults.join(150)
    after = wait_idle(port, idle)
    rss_after = daemon.rss_kib()
    health, _ = get(port, "/health")

    # ---- checks
    ok = True

    def check(cond, what):
        nonlocal ok
        log("%s: %s" % ("ok" if cond else "FAIL", what))
        ok = ok and cond

    log("")
    log("==== soak summary (%s, seed %d, concurrency %d)" % (mode, args.seed, args.concurrency))
    log("requests sent: %d of %d in %.1f s (%.1f req/s)%s" %
        (sent, args.requests, elapsed, sent / elapsed if elapsed else 0,
         "; stopped at --max-seconds" if sent < args.requests else ""))
    gen = after.get("specinfer_generated_tokens_total", 0) - \
        before.get("specinfer_generated_tokens_total", 0)
    log("generated tokens: %d (%.0f tok/s)" % (gen, gen / elapsed if elapsed else 0))
    lat = sorted(tally.latencies)
    if lat:
        log("latency p50 %.3f s, p99 %.3f s, max %.3f s" %
            (lat[len(lat) // 2], lat[int(len(lat) * 0.99)], lat[-1]))
    log("by kind: %s" % dict(tally.by_kind))
    features = collections.Counter()  # valid requests by each of their features
    for label, n in tally.by_label.items():
        if label.startswith(("chat ", "completion ")):
            for word in label.split():
                features[word] += n
        else:
            features[label] += n
    log("by feature: %s" % ", ".join("%s %d" % kv for kv in sorted(features.items())))
    log("outcomes: %s" % dict(tally.outcomes))
    if faults:
        log("faults injected: %s" % ", ".join(
            "SIGKILL %s (pid %d), serving again after %s" %
            (v, pid, "%.1f s" % t if t is not None else "never") for v, pid, t, _ in
            faults.injected))
        for msg, k in tally.fault_errors.most_common():
            log("  %5d  expected fault error: %s" % (k, msg))
        llm_kills = [t for v, _, _, t in faults.injected if v.startswith("llm")]
        if tally.fault_error_spans and llm_kills:
            k = llm_kills[0]
            log("  requests with a fault error started %.1f .. %.1f s after the LLM worker's "
                "kill, ended %.1f .. %.1f s after it" %
                (min(a for a, _ in tally.fault_error_spans) - k,
                 max(a for a, _ in tally.fault_error_spans) - k,
                 min(b for _, b in tally.fault_error_spans) - k,
                 max(b for _, b in tally.fault_error_spans) - k))
    else:
        log("faults injected: client-side only (cancellations, malformed requests)")
    finished = {k.split('"')[1]: after.get(k, 0) - before.get(k, 0) for k in after
                if k.startswith("specinfer_sequences_finished_total{")}
    log("sequences finished by reason (daemon): %s" % finished)
    check(sent > 0 and sent == sum(tally.outcomes.values()) and hung == 0,
          "every request sent got an outcome (%d sent, %d outcomes, %d client threads hung)"
          % (sent, sum(tally.outcomes.values()), hung))
    check(not tally.lost, "requests lost: %d" % len(tally.lost))
    check(not tally.failures, "unexpected answers or wrong outputs: %d" % len(tally.failures))
    check(tally.completed_greedy_checked > 0,
          "completed greedy outputs equal to their output alone: %d (and %d seeded sampled)" %
          (tally.completed_greedy_checked, tally.completed_sampled_checked))
    if faults:
        check(len(faults.injected) == 2 and all(t is not None for _, _, t, _ in faults.injected),
              "both faults injected and the cluster served again after each")
    check(health == 200, "/health answers %d" % health)
    check(after.get("specinfer_queue_length") == 0, "queue entries leaked: %g" %
          after.get("specinfer_queue_length", -1))
    check(after.get("specinfer_running_sequences") == 0, "running sequences left: %g" %
          after.get("specinfer_running_sequences", -1))
    check(after.get("specinfer_kv_blocks_used") == idle["kv"],
          "KV blocks leaked: %g (used %g of %g, idle value %g)" %
          (after.get("specinfer_kv_blocks_used", -1) - idle["kv"],
           after.get("specinfer_kv_blocks_used", -1), after.get("specinfer_kv_blocks_total", -1),
           idle["kv"]))
    check("specinfer_draft_sessions" in after and
          after["specinfer_draft_sessions"] == idle["sessions"],
          "draft sessions leaked: %g (idle value %g)" %
          (after.get("specinfer_draft_sessions", -1) - idle["sessions"], idle["sessions"]))
    bound = rss_before * (1 + args.rss_growth_pct / 100) + args.rss_slack_mib * 1024
    check(rss_after is not None and rss_after <= bound,
          "RSS before %.1f MiB, after %.1f MiB (%+.1f%%; bound %.1f MiB = +%g%% + %g MiB)" %
          (rss_before / 1024, (rss_after or 0) / 1024,
           100.0 * ((rss_after or 0) - rss_before) / rss_before, bound / 1024,
           args.rss_growth_pct, args.rss_slack_mib))
    log("RSS during the run (requests done: MiB): %s" % ", ".join(
        "%d: %.1f" % (d, r / 1024) for d, r in rss_trace if r))
    if args.cluster:
        pids = daemon.worker_pids_now()
        log("workers' RSS now: %s" % ", ".join(
            "%s %.1f MiB" % (name, (daemon.rss_kib(pid) or 0) / 1024)
            for name, pid in sorted(pids.items())))
    log("total time %.1f s" % (time.time() - t_start))
    return ok


if __name__ == "__main__":
    sys.exit(main())
