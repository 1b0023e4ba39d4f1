"""What the `restart_workers` tests (cluster_restart_*_test.py) share: a cluster of one SSM
worker and the LLM on one worker (stories260K) started by `specinfer cluster` on loopback; the
checks' bookkeeping comes from tests/daemon_test_util.py. Only the Python standard library is
used."""
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from daemon_test_util import (BIN, MODEL, TOKENIZER, check, failures,  # noqa: E402,F401
                              listening_port, read_until_listening)


def wait_for(pred, timeout, period=0.1):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(period)
    return False


def completion(port, speculation=True):
    """The HTTP status of a short greedy completion (None when the server cannot be reached)."""
    body = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}
    if speculation:
        body["speculation"] = {"enabled": True}
    req = urllib.request.Request("http://127.0.0.1:%d/v1/completions" % port,
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


class Cluster:
    """`specinfer cluster` with restart_workers, its log in `log_path`; after start(): `pids` and
    `ports` of the workers by label, `port` the manager's HTTP port."""

    def __init__(self, tmp, rpc_timeout_ms):
        self.config = os.path.join(tmp, "cluster.yaml")
        with open(self.config, "w") as f:
            f.write("""
models:
  llm: {path: %s, tokenizer: %s}
manager: {http_port: 0, grpc_port: 0, threads: 1, probe_interval_ms: 200, rpc_timeout_ms: %d,
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
""" % (MODEL, TOKENIZER, rpc_timeout_ms))
        self.log_path = os.path.join(tmp, "cluster.log")
        self.proc = None
        self.pids, self.ports, self.port = {}, {}, None

    def start(self):
        log = open(self.log_path, "w")
        self.proc = subprocess.Popen([BIN, "--log-level", "info", "cluster", "--config",
                                      self.config, "--any-ports"],
                                     stdout=subprocess.PIPE, stderr=log, text=True)
        lines = read_until_listening(self.proc)
        for line in lines:
            if line.startswith("worker "):  # worker LABEL pid=PID address=HOST:PORT
                name = line.split()[1]
                self.pids[name] = int(re.search(r"pid=(\d+)", line).group(1))
                self.ports[name] = int(re.search(r"address=\S*:(\d+)", line).group(1))
        self.port = listening_port(lines[-1])
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()
        check(sorted(self.pids) == ["llm[0]", "ssm[0]"], "cluster started: %s" % sorted(self.pids))

    def log_lines(self):
        with open(self.log_path) as f:
            return f.readlines()

    def restarted(self, name):
        """Whether the launcher has logged `name`'s restart."""
        pattern = re.compile(re.escape(name) + r" \S+ restarted \(pid \d+\)")
        return any(pattern.search(l) for l in self.log_lines())

    def stop(self):
        """Kills the launcher if it still runs; prints the log's tail after a failure."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if failures:
            print("---- tail of the cluster's log\n" + "".join(self.log_lines()[-40:]))
