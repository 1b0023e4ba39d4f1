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
Only the Python standard library is used (and restart_test_util.py beside it).
"""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

from restart_test_util import Cluster, check, completion, failures, wait_for


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
    cluster = Cluster(tmp, rpc_timeout_ms=1000)
    blocker = None
    try:
        cluster.start()
        port = cluster.port
        check(completion(port, speculation=False) == 200, "a request succeeds")

        def llm_restart_failures(after=-1):
            return [l for l in cluster.log_lines()[after + 1:] if "llm[0]: restart failed" in l]

        os.kill(cluster.pids["llm[0]"], signal.SIGKILL)
        blocker = take_port(cluster.ports["llm[0]"], 5)
        if blocker is None:
            raise RuntimeError("could not take the killed LLM worker's port %d" %
                               cluster.ports["llm[0]"])
        check(wait_for(lambda: bool(llm_restart_failures()), 30, period=0.05),
              "the LLM worker's restart fails while its port is taken")

        os.kill(cluster.pids["ssm[0]"], signal.SIGKILL)
        check(wait_for(lambda: cluster.restarted("ssm[0]"), 30, period=0.05),
              "the SSM worker is restarted")
        lines = cluster.log_lines()
        at = next((i for i, l in enumerate(lines) if "ssm[0]" in l and " restarted (pid" in l),
                  None)
        # The LLM worker's tries (20, 300 ms apart) go on for seconds after the SSM worker is back.
        check(wait_for(lambda: at is not None and bool(llm_restart_failures(at)), 5, period=0.05),
              "the SSM worker came back while the LLM worker's restarts were still failing")

        blocker.close()
        blocker = None
        check(wait_for(lambda: cluster.restarted("llm[0]"), 30, period=0.05),
              "the LLM worker is restarted once its port is free")
        check(wait_for(lambda: completion(port, speculation=False) == 200, 60),
              "requests succeed again after the restarts")

        cluster.proc.send_signal(signal.SIGTERM)
        try:
            rc = cluster.proc.wait(60)
        except subprocess.TimeoutExpired:
            rc = None
        check(rc == 0, "the launcher exits 0 on SIGTERM (%s)" % rc)
    finally:
        if blocker is not None:
            blocker.close()
        cluster.stop()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        try:
            main(tmp)
        except Exception as e:  # noqa: BLE001 - reported as a failure
            check(False, "exception %r" % e)
    print("%d failure(s)" % len(failures))
    sys.exit(1 if failures else 0)
