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
Only the Python standard library is used (and restart_test_util.py beside it).
"""

import os
import re
import signal
import subprocess
import sys
import tempfile
import time

from restart_test_util import Cluster, check, completion, failures, wait_for


def main(tmp):
    cluster = Cluster(tmp, rpc_timeout_ms=3000)
    try:
        cluster.start()
        proc, port = cluster.proc, cluster.port
        check(completion(port) == 200, "a request succeeds")

        for name in ("ssm[0]", "llm[0]"):
            os.kill(cluster.pids[name], signal.SIGKILL)

        check(wait_for(lambda: cluster.restarted("ssm[0]") and cluster.restarted("llm[0]"), 60),
              "the launcher restarted both killed workers")
        check(wait_for(lambda: completion(port) == 200, 60),
              "requests succeed again after the restarts")

        # The manager takes the restarted SSM worker back (its health check registers it again;
        # until then it has nothing to drain there).
        def ssm_registered_again():
            return len([l for l in cluster.log_lines()
                        if re.search(r"ssm\[0\] \S+: registered", l)]) >= 2

        check(wait_for(ssm_registered_again, 60),
              "the manager registered the restarted SSM worker again")

        # A slow drain: the restarted SSM worker is held stopped for a second when the stop
        # comes, so the manager's Drain call to it waits. Far longer than the launcher monitor's
        # poll period, the window in which the regression struck (it ended the forking thread,
        # and with it sent every restarted worker a SIGTERM, before the drain was over).
        ssm_pid = int(re.findall(r"ssm\[0\] \S+ restarted \(pid (\d+)\)",
                                 "".join(cluster.log_lines()))[-1])
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
        lines = cluster.log_lines()
        stopped = [l.strip() for l in lines if " stopped: " in l]
        check(len(stopped) == 2 and all(l.endswith("exited with status 0") for l in stopped),
              "every worker, restarted ones included, stopped with exit status 0:\n  " +
              "\n  ".join(stopped))
        drained = [i for i, l in enumerate(lines) if "drained (" in l or "Drain failed" in l]
        signalled = [i for i, l in enumerate(lines) if re.search(r"\] (ssm|llm)\[0\] .*: signal 15", l)]
        check(len(drained) == 1 and len(signalled) == 2 and min(signalled) > drained[0],
              "no worker got a stop signal before the manager's drain was over")
    finally:
        cluster.stop()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        try:
            main(tmp)
        except Exception as e:  # noqa: BLE001 - reported as a failure
            check(False, "exception %r" % e)
    print("%d failure(s)" % len(failures))
    sys.exit(1 if failures else 0)
