#!/usr/bin/env python3
"""A stop signal stops `specinfer serve` cleanly whichever of its threads the kernel picks.

The kernel hands a process-directed SIGTERM to any thread that does not block it. Threads a
library starts before main (OpenBLAS's pool) never blocked it, so with sigwait alone such a
delivery killed the daemon on the spot ("killed by signal 15", no drain, exit status -15). This
test delivers SIGTERM (tgkill) straight to each such thread other than the main one, the case the
kernel may pick at random, and then a plain SIGINT; every time the daemon must log its shutdown,
answer requests up to the signal and exit with status 0.

Usage: stop_signal_test.py PATH_TO_SPECINFER   (SPECINFER_SOURCE_DIR set by CTest)
Only the Python standard library is used (and tests/daemon_test_util.py).
"""
import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from daemon_test_util import MODEL, TOKENIZER, check, failures, start_daemon  # noqa: E402

SYS_TGKILL = {"x86_64": 234, "aarch64": 131}.get(os.uname().machine)


def start(log):
    return start_daemon(["--log-level", "info", "serve", "--model", MODEL, "--tokenizer",
                         TOKENIZER, "--port", "0", "--threads", "2"], stderr=log)


def completion_ok(port):
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}).encode()
    req = urllib.request.Request("http://127.0.0.1:%d/v1/completions" % port, data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status == 200 and json.load(r)["choices"][0]["text"] != ""


def unblocked_threads(pid):
    """Threads of `pid` other than the main one that do not block SIGTERM."""
    out = []
    for tid in sorted(int(t) for t in os.listdir("/proc/%d/task" % pid)):
        if tid == pid:
            continue
        try:
            with open("/proc/%d/task/%d/status" % (pid, tid)) as f:
                blocked = int(next(l for l in f if l.startswith("SigBlk:")).split()[1], 16)
        except (OSError, StopIteration):
            continue
        if not blocked & (1 << (signal.SIGTERM - 1)):
            out.append(tid)
    return out


def stop_and_check(proc, port, log_path, how, send):
    check(completion_ok(port), "%s: a request is answered before the signal" % how)
    send()
    try:
        rc = proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = "timeout"
    with open(log_path) as f:
        text = f.read()
    check(rc == 0, "%s: the daemon exits with status 0 (got %s)" % (how, rc))
    check("shutting down" in text, "%s: the daemon logged its shutdown" % how)


def main(tmp):
    libc = ctypes.CDLL(None, use_errno=True)
    targeted = 0
    for attempt in range(3):
        log_path = os.path.join(tmp, "serve%d.log" % attempt)
        with open(log_path, "w") as log:
            proc, port = start(log)
            try:
                threads = unblocked_threads(proc.pid)
                if not threads or SYS_TGKILL is None:
                    print("note: no thread other than main leaves SIGTERM unblocked here "
                          "(%s); the targeted case does not arise on this machine" % threads)
                    proc.terminate()
                    proc.wait(30)
                    break
                tid = threads[attempt % len(threads)]
                targeted += 1
                stop_and_check(proc, port, log_path, "SIGTERM to thread %d" % tid,
                               lambda: libc.syscall(SYS_TGKILL, proc.pid, tid, signal.SIGTERM))
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    print("targeted deliveries: %d" % targeted)
    log_path = os.path.join(tmp, "serve_int.log")
    with open(log_path, "w") as log:
        proc, port = start(log)
        try:
            stop_and_check(proc, port, log_path, "SIGINT to the process",
                           lambda: proc.send_signal(signal.SIGINT))
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        try:
            main(tmp)
        except Exception as e:  # noqa: BLE001 - reported as a failure
            check(False, "exception %r" % e)
    print("%d failure(s)" % len(failures))
    sys.exit(1 if failures else 0)
