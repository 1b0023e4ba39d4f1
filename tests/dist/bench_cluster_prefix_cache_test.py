#!/usr/bin/env python3
"""`bench_serving --cluster ... --workload chat-multiturn` reports the deployment's prefix-cache
figures (it used to print a hit rate of -1, "not known", for every cluster run: it read the
in-process daemon's gauges only, never the manager's /metrics).

Starts, through bench_serving, `specinfer cluster` from a config with a request manager and the
LLM on one worker process, all on stories260K (chatml template), and runs 2 conversations x 3
turns with the prefix cache on and off. Checks, from the --json output: the run with the cache on
has a hit rate in (0, 1] (later turns resend the history), the run with it off a hit rate of 0,
evictions and cached blocks are known (not -1), and the greedy answers are the same.

Usage: bench_cluster_prefix_cache_test.py PATH_TO_SPECINFER PATH_TO_BENCH_SERVING
       (SPECINFER_SOURCE_DIR set by CTest). Only the Python standard library is used (and
       tests/daemon_test_util.py).
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from daemon_test_util import BIN, MODEL, TOKENIZER, check, failures  # noqa: E402

BENCH = os.path.abspath(sys.argv[2])


def main(tmp):
    config = os.path.join(tmp, "cluster.yaml")
    with open(config, "w") as f:
        f.write("""
models:
  llm: {path: %s, tokenizer: %s}
limits: {max_batch: 4, context: 512}
manager: {http_port: 0, grpc_port: 0, threads: 1, chat_template: chatml}
llm:
  placement: workers
  tp: 1
  pp: 1
  threads: 1
  workers: [{port: 0}]
""" % (MODEL, TOKENIZER))
    cmd = [BENCH, "--cluster", config, "--specinfer", BIN, "--workload", "chat-multiturn",
           "--conversations", "2", "--turns", "3", "--max-tokens", "4", "--rounds", "1",
           "--json", "-"]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=240)
    if p.returncode != 0:
        print(p.stderr[-4000:])
        print("FAIL: bench_serving exited", p.returncode)
        return 1
    out = json.loads(p.stdout)
    runs = {r["prefix_cache"]: r for r in out["runs"]}
    check(set(runs) == {True, False}, "one run with the prefix cache on, one off")
    if set(runs) == {True, False}:
        on, off = runs[True], runs[False]
        check(0 < on["prefix_cache_hit_rate"] <= 1,
              "cache on: hit rate %.3f in (0, 1]" % on["prefix_cache_hit_rate"])
        check(off["prefix_cache_hit_rate"] == 0,
              "cache off: hit rate %.3f == 0" % off["prefix_cache_hit_rate"])
        check(on["prefix_cache_evictions"] >= 0 and on["kv_blocks_cached"] > 0,
              "cache on: evictions %d, cached blocks %d known" %
              (on["prefix_cache_evictions"], on["kv_blocks_cached"]))
    check(out["same_outputs"] and not out["failed"], "same greedy answers, no failed request")
    return 1 if failures else 0


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as d:
        sys.exit(main(d))
