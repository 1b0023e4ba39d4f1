#!/usr/bin/env python3
"""Restarted workers stop cleanly: `specinfer cluster` with restart_workers on loopback.

Starts a cluster (one SSM worker, the LLM on one worker; stories260K), SIGKILLs both workers,
waits until the launcher has restarted them and a request succeeds again, then sends SIGTERM to
the launcher. Every worker, the restarted ones included, must stop with exit status 0 (drained
and shut down, not killed mid-shutdown) and the launcher must exit 0.

The stop comes while the restarted SSM worker is held (SIGSTOP) for a second, so the manager's
drain takes longer than the launcher monitor's poll period; no worker may be signalled before the
drain is over.

Regression: the launcher's monitor thread, which forks the restarted workers, was joined before
the workers were stopped; PR_SET_PDEATHSIG (which fires when the forking *thread* exits) then sent
each restarted worker a SIGTERM of its own, and the launcher's second SIGTERM reached it while it
was shutting down, through a thread that does not block it (OpenBLAS's, started before main):
"llm[0] ... stopped: killed by signal 15". Then the monitor thread was no longer joined early but
still *ended* (its loop stopped with the restarts) 0..100 ms after the stop, with the same effect
whenever the shutdown took longer than that (seen in the 600-request cluster soak).

Usage: cluster_restart_stop_test.py PATH_TO_SPECINFER   (SPECINFER_SOURCE_DIR set by CTest)
Only the Python standard library is used.
"""
import json
import os
import re
import signal
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
        time.sleep(0.1)
    return False


def completion(port):
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0,
                       "speculation": {"enabled": True}}).encode()
    req = urllib.request.Request("http://127.0.0.1:%d/v1/completions" % port, data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def main(tmp):
    config = os.path.join(tmp, "cluster.yaml")
    with open(config, "w") as f:
        f.write("""
models:
  llm: {path: %s, tokenizer: %s}
manager: {http_port: 0, grpc_port: 0, threads: 1, probe_interval_ms: 200, rpc_timeout_ms: 3000,
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
    try:
        pids, port = {}, None
        deadline = time.time() + 120
        while port is None and time.time() < deadline:
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError("the cluster exited before listening")
            if line.startswith("worker "):
                pids[line.split()[1]] = int(re.search(r"pid=(\d+)", line).group(1))
            if line.startswith("listening http="):
                port = int(line.split()[1].split(":")[-1])
        threading.Thread(target=proc.stdout.read, daemon=True).start()
        check(sorted(pids) == ["llm[0]", "ssm[0]"], "cluster started: %s" % sorted(pids))
        check(completion(port) == 200, "a request succeeds")

        for name in ("ssm[0]", "llm[0]"):
            os.kill(pids[name], signal.SIGKILL)

        def restarted():
            with open(log_path) as f:
                text = f.read()
            return all(re.search(re.escape(n) + r" \S+ restarted \(pid \d+\)", text)
                       for n in ("ssm[0]", "llm[0]"))

        check(wait_for(restarted, 60), "the launcher restarted both killed workers")
        check(wait_for(lambda: completion(port) == 200, 60),
              "requests succeed again after the restarts")

        # The manager takes the restarted SSM worker back (its health check registers it again;
        # until then it has nothing to drain there).
        def ssm_registered_again():
            with open(log_path) as f:
                return len(re.findall(r"ssm\[0\] \S+: registered", f.read())) >= 2

        check(wait_for(ssm_registered_again, 60),
              "the manager registered the restarted SSM worker again")

        # A slow drain: the restarted SSM worker is held stopped for a second when the stop
        # comes, so the manager's Drain call to it waits. Far longer than the launcher monitor's
        # poll period, the window in which the regression struck (it ended the forking thread,
        # and with it sent every restarted worker a SIGTERM, before the drain was over).
        with open(log_path) as f:
            ssm_pid = int(re.findall(r"ssm\[0\] \S+ restarted \(pid (\d+)\)", f.read())[-1])
        os.kill(ssm_pid, signal.SIGSTOP)
        try:
            proc.send_signal(signal.SIGTERM)
            time.sleep(1.0)
        finally:
            os.kill(ssm_pid, signal.SIGCONT)
        try:
            rc = proc.wait(60)
        except subprocess.TimeoutExpired:
            rc = None
        check(rc == 0, "the launcher exits 0 on SIGTERM (%s)" % rc)
        with open(log_path) as f:
            stopped = [l.strip() for l in f if " stopped: " in l]
        check(len(stopped) == 2 and all(l.endswith("exited with status 0") for l in stopped),
              "every worker, restarted ones included, stopped with exit status 0:\n  " +
              "\n  ".join(stopped))
        with open(log_path) as f:
            lines = f.readlines()
        drained = [i for i, l in enumerate(lines) if "drained (" in l or "Drain failed" in l]
        signalled = [i for i, l in enumerate(lines) if re.search(r"\] (ssm|llm)\[0\] .*: signal 15", l)]
        check(len(drained) == 1 and len(signalled) == 2 and min(signalled) > drained[0],
              "no worker got a stop signal before the manager's drain was over")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if failures:
            with open(log_path) as f:
                print("---- tail of the cluster's log\n" + "".join(f.readlines()[-30:]))


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        try:
            main(tmp)
        except Exception as e:  # noqa: BLE001 - reported as a failure
            check(False, "exception %r" % e)
    print("%d failure(s)" % len(failures))
    sys.exit(1 if failures else 0)
