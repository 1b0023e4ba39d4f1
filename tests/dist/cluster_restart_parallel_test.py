#!/usr/bin/env python3
"""A worker whose restart keeps failing does not hold up another worker's restart.

Starts `specinfer cluster` with restart_workers (one SSM worker, the LLM on one worker;
stories260K), SIGKILLs the LLM worker and takes its port (a plain listening socket), so every
restart of it fails ("address in use") and the launcher keeps retrying. Then it SIGKILLs the SSM
worker: the launcher must restart that one while the LLM worker's retries go on (an "llm[0]:
restart failed" line after "ssm[0] ... restarted"). Then the port is freed, the LLM worker comes
back on a later try, requests succeed again and SIGTERM stops everything with exit status 0.

Regression: the launcher restarted dead workers one at a time, each restart waiting for its
worker (up to 20 tries, or 300 s for one that never listened), so a second death went unnoticed
and unrestarted until the first restart was over.

Usage: cluster_restart_parallel_test.py PATH_TO_SPECINFER   (SPECINFER_SOURCE_DIR set by CTest)
Only the Python standard library is used.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

BIN = os.path.abspath(sys.argv[1])
SRC = os.environ.get("SPECINFER_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
MODEL = os.path.join(SRC, "tests/data/stories260K/stories260K.bin")
TOKENIZER = os.path.join(SRC, "tests/data/stories260K/tok512.bin")

failures = []


def check(cond, what):
    print("%s: %s" % ("ok" if cond else "FAIL", what), flush=True)
    if not cond:
        failures.append(what)


def wait_for(pred, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def completion(port):
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}).encode()
    req = urllib.request.Request("http://127.0.0.1:%d/v1/completions" % port, data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def take_port(port, timeout):
    """Binds and listens on 127.0.0.1:port (without SO_REUSEPORT, so a server that sets it
    cannot share it) as soon as the killed worker has let it go; None if it cannot."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # SO_REUSEADDR: the killed worker's connections linger in TIME_WAIT; still no second
        # listener can bind beside this one.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            s.listen(1)
            return s
        except OSError:
            s.close()
            time.sleep(0.005)
    return None


def main(tmp):
    config = os.path.join(tmp, "cluster.yaml")
    with open(config, "w") as f:
        f.write("""
models:
  llm: {path: %s, tokenizer: %s}
manager: {http_port: 0, grpc_port: 0, threads: 1, probe_interval_ms: 200, rpc_timeout_ms: 1000,
          drain_timeout_s: 10}
ssm:
  - spec: layers:2
    replicas: [{port: 0, threads: 1}]
llm:
  placement: workers
  tp: 1
  pp: 1
  threads: 1
  workers: [{port: 0}]
restart_workers: true
""" % (MODEL, TOKENIZER))
    log_path = os.path.join(tmp, "cluster.log")
    log = open(log_path, "w")
    proc = subprocess.Popen([BIN, "--log-level", "info", "cluster", "--config", config,
                             "--any-ports"], stdout=subprocess.PIPE, stderr=log, text=True)
    blocker = None
    try:
        pids, ports, port = {}, {}, None
        deadline = time.time() + 120
        while port is None and time.time() < deadline:
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError("the cluster exited before listening")
            if line.startswith("worker "):
                name = line.split()[1]
                pids[name] = int(re.search(r"pid=(\d+)", line).group(1))
                ports[name] = int(re.search(r"address=\S*:(\d+)", line).group(1))
            if line.startswith("listening http="):
                port = int(line.split()[1].split(":")[-1])
        threading.Thread(target=proc.stdout.read, daemon=True).start()
        check(sorted(pids) == ["llm[0]", "ssm[0]"], "cluster started: %s" % sorted(pids))
        check(completion(port) == 200, "a request succeeds")

        def log_lines():
            with open(log_path) as f:
                return f.readlines()

        os.kill(pids["llm[0]"], signal.SIGKILL)
        blocker = take_port(ports["llm[0]"], 5)
        if blocker is None:
            raise RuntimeError("could not take the killed LLM worker's port %d" % ports["llm[0]"])
        check(wait_for(lambda: any("llm[0]: restart failed" in l for l in log_lines()), 30),
              "the LLM worker's restart fails while its port is taken")

        os.kill(pids["ssm[0]"], signal.SIGKILL)
        ssm_back = re.compile(r"ssm\[0\] \S+ restarted \(pid \d+\)")
        check(wait_for(lambda: any(ssm_back.search(l) for l in log_lines()), 30),
              "the SSM worker is restarted")
        lines = log_lines()
        at = next((i for i, l in enumerate(lines) if ssm_back.search(l)), None)

        def llm_failed_after_ssm_came_back():
            return at is not None and any("llm[0]: restart failed" in l
                                           for l in log_lines()[at + 1:])

        # The LLM worker's tries (20, 300 ms apart) go on for seconds after the SSM worker is back.
        check(wait_for(llm_failed_after_ssm_came_back, 5),
              "the SSM worker came back while the LLM worker's restarts were still failing")

        blocker.close()
        blocker = None
        llm_back = re.compile(r"llm\[0\] \S+ restarted \(pid \d+\)")
        check(wait_for(lambda: any(llm_back.search(l) for l in log_lines()), 30),
              "the LLM worker is restarted once its port is free")
        check(wait_for(lambda: completion(port) == 200, 60),
              "requests succeed again after the restarts")

        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(60)
        except subprocess.TimeoutExpired:
            rc = None
        check(rc == 0, "the launcher exits 0 on SIGTERM (%s)" % rc)
    finally:
        if blocker is not None:
            blocker.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if failures:
            with open(log_path) as f:
                print("---- tail of the cluster's log\n" + "".join(f.readlines()[-40:]))


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        try:
            main(tmp)
        except Exception as e:  # noqa: BLE001 - reported as a failure
            check(False, "exception %r" % e)
    print("%d failure(s)" % len(failures))
    sys.exit(1 if failures else 0)
