"""The official `openai` Python package against a running specinfer daemon.

Run by openai_client_test.sh, which starts the daemon and sets SPECINFER_BASE_URL (http://host:port),
SPECINFER_API_KEY and SPECINFER_MODEL_NAME. Checks completions and chat, streamed and not, with
logprobs; that the streamed text equals the non-streamed text for the same seed; and that bad
requests raise the openai exception class their status code maps to, while the daemon keeps
serving.
"""
import json
import os
import sys
import unittest

import httpx
import openai

BASE_URL = os.environ["SPECINFER_BASE_URL"]
API_KEY = os.environ["SPECINFER_API_KEY"]
MODEL = os.environ["SPECINFER_MODEL_NAME"]

# No retries: a retried request would hide a failure (and 5xx/429 would be retried by default).
client = openai.OpenAI(base_url=BASE_URL + "/v1", api_key=API_KEY, max_retries=0, timeout=300)


def streamed_completion(**kw):
    text, finish, usage, logprobs = {}, {}, None, {}
    for chunk in client.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            text[c.index] = text.get(c.index, "") + c.text
            if c.finish_reason is not None:
                finish[c.index] = c.finish_reason
            if c.logprobs is not None:
                lp = logprobs.setdefault(c.index, {"tokens": [], "token_logprobs": [], "top_logprobs": []})
                lp["tokens"] += c.logprobs.tokens
                lp["token_logprobs"] += c.logprobs.token_logprobs
                lp["top_logprobs"] += c.logprobs.top_logprobs
    return text, finish, usage, logprobs


def streamed_chat(**kw):
    text, finish, usage, logprobs, roles = {}, {}, None, {}, {}
    for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.role:
                roles[c.index] = c.delta.role
            text[c.index] = text.get(c.index, "") + (c.delta.content or "")
            if c.finish_reason is not None:
                finish[c.index] = c.finish_reason
            if c.logprobs is not None and c.logprobs.content:
                logprobs.setdefault(c.index, []).extend(c.logprobs.content)
    return text, finish, usage, logprobs, roles


class Models(unittest.TestCase):
    def test_list(self):
        ids = [m.id for m in client.models.list()]
        self.assertEqual(ids, [MODEL])
        self.assertEqual(client.models.retrieve(MODEL).id, MODEL)


class Completions(unittest.TestCase):
    def test_stream_equals_non_stream(self):
        kw = dict(model=MODEL, prompt="Once upon a time", max_tokens=32, temperature=0.8, seed=11)
        full = client.completions.create(**kw)
        self.assertEqual(full.object, "text_completion")
        self.assertEqual(full.model, MODEL)
        text = full.choices[0].text
        self.assertTrue(text)
        self.assertIn(full.choices[0].finish_reason, ("stop", "length"))
        self.assertEqual(full.usage.total_tokens, full.usage.prompt_tokens + full.usage.completion_tokens)
        s_text, s_finish, s_usage, _ = streamed_completion(**kw)
        self.assertEqual(s_text[0], text)
        self.assertEqual(s_finish[0], full.choices[0].finish_reason)
        self.assertEqual(s_usage.completion_tokens, full.usage.completion_tokens)
        self.assertEqual(s_usage.prompt_tokens, full.usage.prompt_tokens)

    def test_speculation_keeps_the_greedy_text(self):
        text = "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs."
        kw = dict(model=MODEL, max_tokens=40, temperature=0,
                  messages=[{"role": "user", "content": "Repeat exactly: " + text}])
        plain = client.chat.completions.create(**kw).choices[0].message.content
        spec = {"speculation": {"enabled": True, "draft": ["ngram:3"], "tree": [1, 1, 1, 1]}}
        fast = client.chat.completions.create(extra_body=spec, **kw).choices[0].message.content
        self.assertEqual(fast, plain)
        s_text, _, _, _, _ = streamed_chat(extra_body=spec, **kw)
        self.assertEqual(s_text[0], plain)

    def test_logprobs_streamed_and_not(self):
        kw = dict(model=MODEL, prompt="The capital of France is", max_tokens=12, temperature=0, logprobs=3)
        full = client.completions.create(**kw)
        lp = full.choices[0].logprobs
        n = full.usage.completion_tokens
        self.assertEqual(len(lp.tokens), n)
        self.assertEqual(len(lp.token_logprobs), n)
        self.assertEqual(len(lp.top_logprobs), n)
        self.assertEqual(len(lp.text_offset), n)
        for tok, val, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
            self.assertLessEqual(val, 0.0)
            self.assertLessEqual(len(top), 3)
            # Greedy: the chosen token is the most likely one.
            self.assertAlmostEqual(val, max(top.values()), places=4)
        s_text, _, _, s_lp = streamed_completion(**kw)
        self.assertEqual(s_text[0], full.choices[0].text)
        self.assertEqual(s_lp[0]["tokens"], lp.tokens)
        self.assertEqual(s_lp[0]["token_logprobs"], lp.token_logprobs)

    def test_n_seeds_and_stop(self):
        kw = dict(model=MODEL, prompt="Once upon a time", max_tokens=24, temperature=1.0, seed=3, n=2, stop=["."])
        full = client.completions.create(**kw)
        self.assertEqual(len(full.choices), 2)
        for c in full.choices:
            self.assertNotIn(".", c.text)
        s_text, s_finish, _, _ = streamed_completion(**kw)
        for c in full.choices:
            self.assertEqual(s_text[c.index], c.text)
            self.assertEqual(s_finish[c.index], c.finish_reason)
        # Choice i is the request with seed + i.
        single = client.completions.create(**{**kw, "n": 1, "seed": 4})
        self.assertEqual(single.choices[0].text, full.choices[1].text)


class Chat(unittest.TestCase):
    MESSAGES = [{"role": "user", "content": "Name the capital of France."}]

    def test_stream_equals_non_stream(self):
        kw = dict(model=MODEL, messages=self.MESSAGES, max_tokens=32, temperature=0.7, seed=5)
        full = client.chat.completions.create(**kw)
        self.assertEqual(full.object, "chat.completion")
        msg = full.choices[0].message
        self.assertEqual(msg.role, "assistant")
        self.assertTrue(msg.content)
        self.assertNotIn("<|im_end|>", msg.content)
        s_text, s_finish, s_usage, _, roles = streamed_chat(**kw)
        self.assertEqual(s_text[0], msg.content)
        self.assertEqual(s_finish[0], full.choices[0].finish_reason)
        self.assertEqual(roles[0], "assistant")
        self.assertEqual(s_usage.completion_tokens, full.usage.completion_tokens)

    def test_logprobs_streamed_and_not(self):
        kw = dict(model=MODEL, messages=self.MESSAGES, max_completion_tokens=12, temperature=0,
                  logprobs=True, top_logprobs=2)
        full = client.chat.completions.create(**kw)
        content = full.choices[0].logprobs.content
        self.assertEqual(len(content), full.usage.completion_tokens)
        for entry in content:
            self.assertLessEqual(entry.logprob, 0.0)
            self.assertEqual(len(entry.top_logprobs), 2)
            self.assertEqual(entry.top_logprobs[0].logprob, entry.logprob)  # greedy: the top one
            self.assertIsInstance(entry.bytes, list)
        # The tokens' text spells the answer (special tokens show as their piece, e.g. <|im_end|>).
        spelled = "".join(e.token for e in content)
        self.assertTrue(spelled.startswith(full.choices[0].message.content), spelled)
        s_text, _, _, s_lp, _ = streamed_chat(**kw)
        self.assertEqual(s_text[0], full.choices[0].message.content)
        self.assertEqual([e.token for e in s_lp[0]], [e.token for e in content])
        self.assertEqual([e.logprob for e in s_lp[0]], [e.logprob for e in content])


class Errors(unittest.TestCase):
    def assert_error(self, exc_type, status, **kw):
        with self.assertRaises(exc_type) as cm:
            client.completions.create(**{"model": MODEL, "prompt": "hi", "max_tokens": 2, **kw})
        self.assertEqual(cm.exception.status_code, status)
        body = cm.exception.body
        self.assertIsInstance(body, dict)  # the "error" object, as OpenAI sends it
        for key in ("message", "type", "param", "code"):
            self.assertIn(key, body)
        return cm.exception

    def test_bad_requests_raise_the_right_exceptions(self):
        self.assert_error(openai.NotFoundError, 404, model="no-such-model")
        self.assert_error(openai.BadRequestError, 400, temperature=3)
        self.assert_error(openai.BadRequestError, 400, top_p=0)
        self.assert_error(openai.BadRequestError, 400, max_tokens=-1)
        self.assert_error(openai.BadRequestError, 400, max_tokens=10**12)
        self.assert_error(openai.BadRequestError, 400, max_tokens="5")  # wrong type
        self.assert_error(openai.BadRequestError, 400, n=0)
        e = self.assert_error(openai.BadRequestError, 400,
                              extra_body={"speculation": {"enabled": True, "draft": ["model:/x.gguf"]}})
        self.assertIn("not loaded at start", str(e))
        self.assert_error(openai.BadRequestError, 400, extra_body={"speculation": {"tree": [1, 99]}})
        with self.assertRaises(openai.BadRequestError):
            client.chat.completions.create(model=MODEL, messages=[{"role": "wizard", "content": "x"}])
        with self.assertRaises(openai.APIStatusError) as cm:
            client.completions.create(model=MODEL, prompt="a" * (5 << 20), max_tokens=1)
        self.assertEqual(cm.exception.status_code, 413)

    def test_authentication(self):
        wrong = openai.OpenAI(base_url=BASE_URL + "/v1", api_key="wrong-key", max_retries=0)
        with self.assertRaises(openai.AuthenticationError) as cm:
            wrong.completions.create(model=MODEL, prompt="hi", max_tokens=2)
        self.assertEqual(cm.exception.status_code, 401)

    def test_malformed_bodies(self):
        headers = {"Authorization": "Bearer " + API_KEY, "Content-Type": "application/json"}
        for body in (b'{"prompt": "hi", ', b'{"prompt": "\xff\xfe"}', b"[" * 100000, b"null"):
            r = httpx.post(BASE_URL + "/v1/completions", content=body, headers=headers, timeout=60)
            self.assertEqual(r.status_code, 400, body[:40])
            err = r.json()["error"]
            self.assertTrue(err["message"])
            self.assertEqual(err["type"], "invalid_request_error")

    def test_still_serving_after_errors(self):
        for _ in range(3):
            with self.assertRaises(openai.BadRequestError):
                client.completions.create(model=MODEL, prompt="hi", temperature=-1)
            r = client.completions.create(model=MODEL, prompt="hi", max_tokens=2)
            self.assertEqual(len(r.choices), 1)


if __name__ == "__main__":
    print(f"openai {openai.__version__} against {BASE_URL} ({MODEL})", flush=True)
    result = unittest.main(verbosity=2, exit=False).result
    sys.exit(0 if result.wasSuccessful() else 1)
