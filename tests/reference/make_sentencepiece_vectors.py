#!/usr/bin/env python3
"""Generates tests/data/tokenizer/llama2_sentencepiece_ids.json: token ids that the real
SentencePiece library assigns to a varied corpus with the Llama 2 tokenizer.model.

The C++ test (tests/tokenizer/llama2c_tokenizer_test.cc) encodes every "cases" text with
Llama2cTokenizer (loaded from llama2.c's tokenizer.bin export of the same vocabulary) and
requires exactly these ids.

Usage (needs `pip install sentencepiece protobuf`):
  python3 tests/reference/make_sentencepiece_vectors.py \
      [--model ../shared/models/llama2-tokenizer/tokenizer.model] \
      [--out tests/data/tokenizer/llama2_sentencepiece_ids.json] [--fuzz N]

Ids are produced with `SentencePieceProcessor.encode(text)`: no BOS/EOS, the model's own
normalizer. For the Llama 2 model that normalizer is "identity" with add_dummy_prefix=true and
remove_extra_whitespaces=false (checked below), i.e. the text is not rewritten except that one
U+2581 is prepended and spaces become U+2581 -- exactly what llama2.c's encoder does with its
' '-for-U+2581 pieces.

The script also runs llama2.c's algorithm itself (naively, in Python, on the same pieces and
scores) and compares. An input where the two disagree goes to "excluded", with both id lists; it
is not a conformance case, and the C++ test checks that Llama2cTokenizer gives the llama2.c ids
for it. With sentencepiece 0.2.x and this model the only disagreements are for invalid UTF-8
(bytes inputs below): SentencePiece's normalizer replaces an invalid sequence by U+FFFD (which is
a piece of this vocabulary), while llama2.c (and Llama2cTokenizer) byte-falls-back each raw byte,
so that Decode gives the original bytes back. Every valid-UTF-8 text agrees, including NUL,
whitespace runs, combining marks (no NFKC: the normalizer is "identity") and characters that need
byte fallback; `--fuzz 3000` (random strings drawn from the corpus, not stored) found no
disagreement either when this was written.
"""

import argparse
import hashlib
import json
import os
import random
import sys

import sentencepiece as spm

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

CORPUS = [
    # English prose and the well-known vector.
    "I believe the meaning of life is",
    "Hello world",
    "Once upon a time, there was a little girl named Lily. She loved to play outside.",
    "The quick brown fox jumps over the lazy dog.",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "It's a dog's life -- isn't it? \"Yes,\" she said.",
    "HELLO WORLD, SHOUTING IN CAPITALS",
    # Whitespace: leading, trailing, runs, tabs, newlines.
    " leading space",
    "   three leading spaces",
    "trailing spaces   ",
    "a  b   c    d     e      f       g        h",
    "                                ",
    "line one\nline two\n\nline four",
    "\ttab\tseparated\tvalues\n",
    "\r\nwindows line endings\r\n",
    "",
    " ",
    # Code.
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "int main(int argc, char** argv) { printf(\"%d\\n\", argc); return 0; }",
    "for (size_t i = 0; i < v.size(); ++i) {\n\tsum += v[i] * 2;\n}",
    "<html><body class=\"x\">&amp; &lt;tag&gt;</body></html>",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    # Digits and punctuation.
    "3.14159265358979323846",
    "Call 555-0123 or +1 (800) 123-4567 before 2024-12-31T23:59:59Z.",
    "1,000,000 + 2,500.75 = 1,002,500.75",
    "!!!???...;;;:::---___===+++***&&&%%%$$$###@@@",
    "~`^|\\/[]{}()<>",
    # Emoji (including ZWJ sequences, skin tones and flags).
    "I love pizza 🍕🍕🍕!",
    "👩‍👩‍👧‍👦 family, 👍🏽 thumbs, 🇫🇷 flag",
    "🤖🦀🧪🫠",
    # CJK, other scripts, mixed scripts.
    "你好，世界！今天天气很好。",
    "日本語のテキストとカタカナ、ひらがな。",
    "한국어 문장입니다.",
    "Привет, мир! Как дела?",
    "مرحبا بالعالم",
    "שלום עולם",
    "नमस्ते दुनिया",
    "Γειά σου Κόσμε",
    "English, 中文, русский, العربية and ελληνικά in one line",
    # Combining marks and precomposed vs decomposed forms (no normalisation must happen).
    "cafe\u0301 vs caf\u00e9",
    "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034dalgo",
    "a\u0308o\u0308u\u0308 \u00e4\u00f6\u00fc \u212b \u00c5 \ufb01",
    # Rare characters that need byte fallback.
    "\U0001F9EC \u2603 \u0f3a\u0f3b \U00010348 \U0001D11E",
    "\u00a0non-breaking\u00a0space and zero\u200bwidth",
    # Special-token look-alikes are ordinary text when specials are not parsed.
    "<s>[INST] hi [/INST]</s>",
    "<unk> <0x41> <pad>",
    # NUL is an ordinary (byte-fallback) character for both.
    "a\0b",
    # Invalid UTF-8 (bytes, not str). SentencePiece's normalizer replaces each invalid byte by
    # U+FFFD (a piece of this vocabulary); llama2.c byte-falls-back the raw byte, which keeps the
    # bytes intact through Decode. These land in "excluded" and document the difference.
    b"a\xffb",
    b"caf\xc3 au lait",
    b"\xe4\xb8 truncated CJK",
    b"overlong \xc0\xaf slash",
]


def split_code_points(data):
    """Splits bytes into complete valid UTF-8 sequences; every other byte stands alone."""
    out, i = [], 0
    while i < len(data):
        lead = data[i]
        n = 1 if lead < 0x80 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
        try:
            data[i:i + n].decode("utf-8")  # strict: rejects overlongs, surrogates, > U+10FFFF
        except UnicodeDecodeError:
            n = 1
        out.append(data[i:i + n])
        i += n
    return out


def llama2c_encode(text, vocab):
    """llama2.c's encoder, naively (O(n^2) per merge); pieces use ' ' for U+2581.

    `vocab` has: piece_to_id (normal pieces only), byte_id (byte value -> id of "<0xHH>"),
    text_of (id -> piece text), scores, space_id. Byte-fallback tokens never merge.
    """
    if not text:
        return []
    toks = [vocab["space_id"]]
    syms = [b" "]  # the text of each symbol; None for byte-fallback tokens
    for ch in split_code_points(text):
        i = vocab["piece_to_id"].get(ch)
        if i is not None:
            toks.append(i)
            syms.append(ch)
        else:
            for b in ch:
                toks.append(vocab["byte_id"][b])
                syms.append(None)
    scores = vocab["scores"]
    while True:
        best = None  # (position, merged id); strict '>' keeps the leftmost of equal scores
        for k in range(len(toks) - 1):
            if syms[k] is None or syms[k + 1] is None:
                continue
            j = vocab["piece_to_id"].get(syms[k] + syms[k + 1])
            if j is not None and (best is None or scores[j] > scores[best[1]]):
                best = (k, j)
        if best is None:
            return toks
        k, j = best
        toks[k:k + 2] = [j]
        syms[k:k + 2] = [syms[k] + syms[k + 1]]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model",
                    default=os.path.join(REPO, "..", "shared", "models", "llama2-tokenizer",
                                         "tokenizer.model"))
    ap.add_argument("--out",
                    default=os.path.join(REPO, "tests", "data", "tokenizer",
                                         "llama2_sentencepiece_ids.json"))
    ap.add_argument("--fuzz", type=int, default=0,
                    help="also compare the two algorithms on N random strings (not stored)")
    args = ap.parse_args()

    model_bytes = open(args.model, "rb").read()
    sp = spm.SentencePieceProcessor(model_proto=model_bytes)
    try:  # Check the premise stated above (needs protobuf; skipped if unavailable).
        from sentencepiece import sentencepiece_model_pb2 as pb
        proto = pb.ModelProto()
        proto.ParseFromString(model_bytes)
        ns = proto.normalizer_spec
        assert ns.name == "identity" and not ns.precompiled_charsmap, ns
        assert ns.add_dummy_prefix and not ns.remove_extra_whitespaces, ns
        assert proto.trainer_spec.byte_fallback
    except ImportError:
        print("note: protobuf not installed; normalizer spec not checked", file=sys.stderr)

    # The vocabulary as llama2.c's export writes it: U+2581 -> ' '. Only normal pieces take part
    # in merges (not <unk>, <s>, </s>, nor the <0xHH> byte pieces).
    n = sp.get_piece_size()
    vocab = {
        "scores": [sp.get_score(i) for i in range(n)],
        "piece_to_id": {},
        "byte_id": {},
    }
    for i in range(n):
        piece = sp.id_to_piece(i)
        if sp.is_byte(i):
            vocab["byte_id"][int(piece[3:5], 16)] = i
        elif not (sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i)):
            vocab["piece_to_id"].setdefault(piece.replace("\u2581", " ").encode("utf-8"), i)
    assert len(vocab["byte_id"]) == 256
    vocab["space_id"] = vocab["piece_to_id"][b" "]

    cases, excluded = [], []
    for text in CORPUS:
        data = text if isinstance(text, bytes) else text.encode("utf-8")
        ids = sp.encode(text)  # accepts str or bytes
        entry = {"text": data.decode("utf-8", errors="replace")}
        if isinstance(text, bytes):
            entry["text_hex"] = data.hex()  # the exact input; "text" is for reading only
        else:
            assert sp.decode(ids) == text, text
        ours = llama2c_encode(data, vocab)
        if ours == ids:
            cases.append(dict(entry, ids=ids))
        else:
            excluded.append(dict(entry, sentencepiece_ids=ids, llama2c_ids=ours))
            print("DIFFERS: %r\n  sentencepiece %s\n  llama2.c      %s" % (text, ids, ours),
                  file=sys.stderr)

    if args.fuzz:
        rng = random.Random(1)
        chars = "".join(t for t in CORPUS if isinstance(t, str)) + "      \n\n\t"
        differ = 0
        for k in range(args.fuzz):
            if k % 2:
                text = "".join(rng.choice(chars) for _ in range(rng.randint(0, 40)))
            else:  # splice substrings, which keeps whole words and whitespace runs
                strs = [t for t in CORPUS if isinstance(t, str) and t]
                text = "".join(rng.choice(strs)[rng.randint(0, 10):][:rng.randint(1, 15)]
                               for _ in range(3))
            if sp.encode(text) != llama2c_encode(text.encode("utf-8"), vocab):
                differ += 1
                print("fuzz DIFFERS: %r" % text, file=sys.stderr)
        print("fuzz: %d of %d random strings differ" % (differ, args.fuzz))

    out = {
        "generator": "tests/reference/make_sentencepiece_vectors.py",
        "sentencepiece_version": spm.__version__,
        "model": os.path.basename(args.model),
        "model_sha256": hashlib.sha256(model_bytes).hexdigest(),
        "add_bos": False,
        "note": "ids from SentencePieceProcessor.encode(text), no BOS. The input is text_hex "
                "(bytes) when present, else text. 'excluded' lists inputs where llama2.c's "
                "algorithm and SentencePiece disagree (invalid UTF-8: SentencePiece substitutes "
                "U+FFFD, llama2.c byte-falls-back); they are not conformance cases.",
        "cases": cases,
        "excluded": excluded,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    # One case per line keeps the file readable and its diffs small.
    with open(args.out, "w", encoding="utf-8") as f:
        head = {k: v for k, v in out.items() if k not in ("cases", "excluded")}
        f.write(json.dumps(head, ensure_ascii=False, indent=1)[:-2] + ",\n")
        for key in ("cases", "excluded"):
            f.write(' "%s": [\n' % key)
            lines = [json.dumps(c, ensure_ascii=False) for c in out[key]]
            f.write(",\n".join("  " + line for line in lines))
            f.write("\n ]%s\n" % ("," if key == "cases" else ""))
        f.write("}\n")
    print("wrote %s: %d cases, %d excluded" % (args.out, len(cases), len(excluded)))


if __name__ == "__main__":
    main()
