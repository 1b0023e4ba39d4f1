#!/usr/bin/env python3
"""`specinfer serve --temperature/--top-p/--top-k/--max-tokens`: defaults for requests that leave
those fields out, as llama.cpp's --temp/--n-predict and vLLM's generation config give them.

Against the real daemon on stories260K: with `--temperature 0 --max-tokens 12`, a completion or
chat request without temperature and max_tokens is greedy and 12 tokens long (the same text as
one that asks for temperature 0 and 12 tokens); a request's own temperature still wins; values no
request could carry are refused at start with a message naming them. A cluster config's
manager.request_defaults does the same for `specinfer cluster`.

Usage: request_defaults_test.py PATH_TO_SPECINFER   (SPECINFER_SOURCE_DIR set by CTest)
Only the Python standard library is used (and tests/daemon_test_util.py).
"""
import json
import os
import subprocess
import sys
import tempfile
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from daemon_test_util import BIN, MODEL, TOKENIZER, check, failures, start_daemon  # noqa: E402

SERVE = ["serve", "--model", MODEL, "--tokenizer", TOKENIZER, "--port", "0", "--grpc-port", "0",
         "--threads", "2", "--chat-template", "chatml"]


def post(port, path, body):
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path),
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)


def text(reply):
    c = reply["choices"][0]
    return c["text"] if "text" in c else c["message"]["content"]


def stop(proc):
    proc.terminate()
    return proc.communicate(timeout=60)[1]


def check_cluster():
    """manager.request_defaults reaches the manager's server."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as cfg:
        cfg.write("models: {llm: {path: %s, tokenizer: %s}}\n"
                  "manager: {http_port: 0, grpc_port: 0, chat_template: chatml,\n"
                  "          request_defaults: {temperature: 0, max_tokens: 7}}\n"
                  "llm: {placement: in-process, threads: 2}\n" % (MODEL, TOKENIZER))
        cfg.flush()
        proc, port = start_daemon(["cluster", "--config", cfg.name])
        try:
            prompt = {"prompt": "Once upon a time", "ignore_eos": True}
            a = post(port, "/v1/completions", prompt)
            asked = post(port, "/v1/completions", dict(prompt, temperature=0, max_tokens=7))
            check(a["usage"]["completion_tokens"] == 7 and text(a) == text(asked),
                  "cluster: manager.request_defaults give greedy 7-token completions (%r, %r)"
                  % (text(a), text(asked)))
        finally:
            err = stop(proc)
        check("requests that leave them out get temperature 0, top_p 1, top_k off, max_tokens 7"
              in err, "cluster: the start-up log says what the defaults are")


def main():
    proc, port = start_daemon(SERVE + ["--temperature", "0", "--max-tokens", "12"])
    try:
        prompt = "Once upon a time"
        plain = {"prompt": prompt, "ignore_eos": True}
        a = post(port, "/v1/completions", plain)
        b = post(port, "/v1/completions", plain)
        asked = post(port, "/v1/completions", dict(plain, temperature=0, max_tokens=12))
        check(a["usage"]["completion_tokens"] == 12,
              "no max_tokens: the server's 12, not /v1/completions' 16 (got %d)"
              % a["usage"]["completion_tokens"])
        check(text(a) == text(b) == text(asked),
              "no temperature: greedy, the text of temperature 0 (%r, %r, %r)"
              % (text(a), text(b), text(asked)))

        chat = {"messages": [{"role": "user", "content": "Tell me a story."}], "ignore_eos": True}
        c = post(port, "/v1/chat/completions", chat)
        check(c["usage"]["completion_tokens"] == 12,
              "chat without max_tokens: 12 tokens, not the rest of the context (got %d)"
              % c["usage"]["completion_tokens"])
        c0 = post(port, "/v1/chat/completions", dict(chat, temperature=0, max_tokens=12))
        check(text(c) == text(c0), "chat without temperature: greedy")

        # The request's own values win: sampled at temperature 1 with two seeds, 60 tokens each.
        s1 = post(port, "/v1/completions", dict(plain, temperature=1, seed=1, max_tokens=60))
        s2 = post(port, "/v1/completions", dict(plain, temperature=1, seed=2, max_tokens=60))
        check(s1["usage"]["completion_tokens"] == 60, "a request's max_tokens wins")
        check(text(s1) != text(s2), "a request's temperature wins (two seeds, two texts)")
    finally:
        err = stop(proc)
    check("requests that leave them out get temperature 0, top_p 1, top_k off, max_tokens 12"
          in err, "the start-up log says what the defaults are")

    for flags, expect in [(["--top-p", "0"], "default top_p must be in (0, 1]"),
                          (["--temperature", "3"], "--temperature"),
                          (["--max-tokens", "0"], "--max-tokens")]:
        r = subprocess.run([BIN] + SERVE + flags, capture_output=True, text=True, timeout=60)
        check(r.returncode != 0 and expect in r.stderr,
              "serve %s is refused at start naming it (exit %d: %s)"
              % (" ".join(flags), r.returncode, r.stderr.strip().splitlines()[-1:]))

    check_cluster()

    if failures:
        print("%d check(s) failed" % len(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
