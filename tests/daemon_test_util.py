"""What the Python tests of the real `specinfer` binary share (tests/server, tests/dist): where
the binary and stories260K are, the checks' bookkeeping, and starting a daemon that announces
itself with a `listening http=HOST:PORT ...` line on stdout.

Each test runs as `python3 TEST.py PATH_TO_SPECINFER [...]` with SPECINFER_SOURCE_DIR set by
CTest, and imports this module after putting tests/ on sys.path. Only the Python standard
library is used.
"""
import os
import subprocess
import sys
import time

BIN = os.path.abspath(sys.argv[1])
SRC = os.environ.get("SPECINFER_SOURCE_DIR", os.path.join(os.path.dirname(__file__), ".."))
MODEL = os.path.join(SRC, "tests/data/stories260K/stories260K.bin")
TOKENIZER = os.path.join(SRC, "tests/data/stories260K/tok512.bin")

failures = []


def check(cond, what):
    """Prints `ok: what` or `FAIL: what`, and keeps the failures for the exit status."""
    print("%s: %s" % ("ok" if cond else "FAIL", what), flush=True)
    if not cond:
        failures.append(what)


def listening_port(line):
    """The HTTP port of a `listening http=HOST:PORT ...` line; None for any other line."""
    if not line.startswith("listening http="):
        return None
    return int(line.split()[1].split(":")[-1])


def read_until_listening(proc, timeout=120):
    """Reads `proc`'s stdout up to its `listening` line; returns the lines read, that one last.
    Raises RuntimeError (with the lines) when the process exits or is silent for too long."""
    lines = []
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError("exited before listening: %r" % lines)
        lines.append(line.strip())
        if listening_port(line) is not None:
            return lines
    raise RuntimeError("not listening within %d s: %r" % (timeout, lines))


def start_daemon(args, stderr=subprocess.PIPE, timeout=120):
    """Starts `specinfer ARGS...` and waits for its listening line: (process, HTTP port). The
    process is killed (its stderr shown, when piped) if it does not get there."""
    proc = subprocess.Popen([BIN] + args, stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        lines = read_until_listening(proc, timeout)
    except RuntimeError as e:
        proc.kill()
        err = proc.communicate()[1] if stderr == subprocess.PIPE else ""
        raise RuntimeError("specinfer %s: %s %s" % (" ".join(args), e, err or "")) from None
    return proc, listening_port(lines[-1])
