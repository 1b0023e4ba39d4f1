#!/usr/bin/env python3
"""Reference vectors for the byte-level BPE tokenizer (src/tokenizer/bpe_tokenizer.*).

The independent reference is Hugging Face `tokenizers` (the Rust library behind every
tokenizer.json). The vocabulary and merges are read from the SmolLM2-135M-Instruct GGUF with the
`gguf` package, and a `tokenizers.Tokenizer` is built from them exactly as SmolLM2's published
tokenizer.json declares its pipeline:

  model:         BPE, unk_token null, byte_fallback false, fuse_unk false, ignore_merges false
  normalizer:    null
  pre_tokenizer: Sequence[Digits(individual_digits=true),
                          ByteLevel(add_prefix_space=false, trim_offsets=true, use_regex=true)]
  decoder:       ByteLevel
  added_tokens:  ids 0..16 (<|endoftext|>, <|im_start|>, <|im_end|>, <repo_name>, ...), all
                 special, normalized/lstrip/rstrip/single_word false

(That declaration is the one pinned, key for key, by a SmolLM2 exporter for
HuggingFaceTB/SmolLM2-135M at revision 93efa2f097d58c2a74874c7e644dbc9b0cee75a2; llama.cpp maps
the GGUF key tokenizer.ggml.pre = "smollm" to the same two regex stages, "\\p{N}" then the GPT-2
regex, in src/llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_SMOLLM.) transformers' own GGUF conversion is
not used: it would need torch, and it does not reproduce the Digits stage.

For extra coverage the same vocabulary is also run through other pre-tokenizers, swapped in the
way their own tokenizer.json files declare them:
  gpt2:   ByteLevel(use_regex=true) alone (GPT-2's tokenizer.json)
  llama3: Sequence[Split(Llama-3 regex, Isolated), ByteLevel(use_regex=false)], and the BPE model
          with ignore_merges=true, as Meta-Llama-3's tokenizer.json has it
  qwen2:  Sequence[Split(Qwen2 regex, Isolated), ByteLevel(use_regex=false)]

Writes (paths relative to the repository root):
  tests/data/tokenizer/corpus.json             the test strings (this script is their source)
  tests/data/tokenizer/smollm2_ids.json        per variant: reference ids per string and
                                               parse_special, and the pre-tokenizer's pieces
  tests/data/tokenizer/smollm2/tokenizer.json  the SmolLM2 tokenizer as tokenizers saves it
  tests/data/tokenizer/smollm2/tokenizer_config.json  bos/eos/add_bos from the GGUF metadata

parse_special=true means special tokens in the text are matched as tokens (tokenizers'
default); parse_special=false sets `encode_special_tokens = True`, so their text is ordinary text.
add_special_tokens=False throughout: BOS handling is tested separately in C++.

Usage:
  python3 -m venv /tmp/venv-tok && /tmp/venv-tok/bin/pip install tokenizers gguf numpy
  /tmp/venv-tok/bin/python tests/reference/make_bpe_vectors.py \
      [--gguf models/SmolLM2-135M-Instruct.Q4_1.gguf]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path

import tokenizers
from gguf import GGUFReader
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

ROOT = Path(__file__).resolve().parents[2]

GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# (name, text). Every string is encoded with parse_special false and true.
CORPUS: list[tuple[str, str]] = [
    ("empty", ""),
    ("one_space", " "),
    ("two_spaces", "  "),
    ("newline", "\n"),
    ("tab", "\t"),
    ("hello", "Hello world"),
    ("hello_spaces", "  Hello   world  "),
    ("prose",
     "The quick brown fox jumps over the lazy dog. It was the best of times, it was the worst "
     "of times; it was the age of wisdom, it was the age of foolishness... \"Really?\" she asked."),
    ("prose_paragraphs",
     "Speculative decoding drafts several tokens cheaply and verifies them in one pass.\n\n"
     "When the draft is right, we accept many tokens at once!\nOtherwise we fall back.\n"),
    ("contractions", "I'm sure we've seen it; don't you think they'll say it's fine? We'd go."),
    ("contractions_upper", "I'M SURE WE'VE SEEN IT; DON'T YOU THINK THEY'LL SAY IT'S FINE? WE'D"),
    ("contractions_mixed", "we'Ve i'M They'LL it'S you'Re she'D can'T"),
    ("apostrophes", "'s 's' 'S ''s '''' rock'n'roll ’s ‘quoted’ 'ſ 'K"),
    ("python",
     "def fib(n: int) -> int:\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
     "    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n\n"
     "if __name__ == '__main__':\n    print(fib(10))  # 55\n"),
    ("cpp",
     "#include <vector>\n\ntemplate <typename T>\nT Sum(const std::vector<T>& v) {\n"
     "  T total{};\n  for (const auto& x : v) total += x;\n  return total;\n}\n"),
    ("go_tabs",
     "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfor i := 0; i < 3; i++ {\n"
     "\t\tfmt.Println(i)\n\t}\n}\n"),
    ("rust",
     "fn main() {\n    let v: Vec<u32> = (1..=10).filter(|x| x % 2 == 0).collect();\n"
     "    println!(\"{:?}\", v);\n}\n"),
    ("javascript",
     "const f = async (x) => {\n  await fetch(`/api/${x}`);\n  return x?.y ?? null;\n};\n"),
    ("json", "{\"name\": \"specinfer\", \"version\": [0, 1, 0], \"ok\": true, \"x\": null}"),
    ("html", "<div class=\"a\"><p>Hi &amp; bye</p><br/></div>"),
    ("sql", "SELECT id, name FROM users WHERE age >= 21 ORDER BY name DESC LIMIT 10;"),
    ("markdown", "# Title\n\n- item one\n- item **two**\n\n```bash\n$ make -j2\n```\n"),
    ("emoji", "I love it 😀👍 so much 🎉🎉🎉!"),
    ("emoji_zwj", "Family: 👨‍👩‍👧‍👦, rainbow flag: 🏳️‍🌈, heart: ❤️, flag: 🇯🇵🇺🇸"),
    ("emoji_skin_tones", "👋🏻👋🏼👋🏽👋🏾👋🏿 🧑🏽‍💻"),
    ("chinese", "你好，世界！这是一个测试。机器学习很有趣。"),
    ("japanese", "日本語のテキストとカタカナ、ひらがな。東京は大きい。"),
    ("korean", "안녕하세요 세계! 한국어 텍스트입니다."),
    ("arabic", "مرحبا بالعالم، هذا اختبار للنص العربي."),
    ("hebrew", "שלום עולם, זה מבחן."),
    ("devanagari", "नमस्ते दुनिया। यह एक परीक्षण है।"),
    ("thai", "สวัสดีชาวโลก นี่คือการทดสอบ"),
    ("greek_cyrillic", "Ωμέγα αλφάβητο; Привет, мир! Українська мова."),
    ("latin_accents", "Straße naïve café résumé façade Ångström coöperate"),
    ("combining", "e\u0301 a\u0308 n\u0303o Z\u0324\u0354\u0367\u0311a\u0316\u036e l\u036e\u0312g"),
    ("spaces_run", "a" + " " * 20 + "b"),
    ("spaces_only", " " * 7),
    ("tabs_run", "\t\t\tx\t\ty"),
    ("newlines_run", "\n\n\n\nend"),
    ("mixed_ws", "a \n\n b \t \n \r\n c  \t\t  d\n"),
    ("crlf", "line one\r\nline two\r\n\r\nline four"),
    ("trailing_ws", "end with spaces   "),
    ("indent_newline_spaces", "x\n    y\n        z\n\n    w"),
    ("digits", "0123456789"),
    ("numbers", "In 2024, 42 people paid $1,234.56 (about 3.14159%) for 1e-9 units."),
    ("long_number", "12345678901234567890123456789012345678901234567890"),
    ("alnum", "a1b2c3 x86_64 v1.2.3 0x7fff 1st 2nd"),
    ("other_numerics", "٣٤٥ ١٢ १२३ Ⅻ ² ³ ½ ①②"),
    ("url", "See https://example.com/path/to/page?q=1&lang=en#section-2 or http://a.b/c."),
    ("email", "Contact: first.last+tag@example.co.uk"),
    ("math", "∑_{i=1}^{n} x² ≤ ∞ ± √2 ≠ π ≈ 3.14"),
    ("quotes", "“smart quotes” ‘single’ — em–dash… «guillemets»"),
    ("unicode_spaces", "a\u00a0b\u2003c\u3000d\u2028e\u0085f\u200bg"),
    ("control_chars", "\x00\x01\x04\x1b[31mred\x1b[0m\x7f\x06\x13"),
    ("plane4", "x\U00040000y\U000F0000z"),
    ("long_word", "pneumonoultramicroscopicsilicovolcanoconiosis antidisestablishmentarianism"),
    ("repeats", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa !!!!!!!!!! ................ ----------"),
    ("chatml",
     "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
     "<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"),
    ("special_simple", "<|im_start|>user\nhi<|im_end|>"),
    ("special_alone", "<|endoftext|>"),
    ("special_adjacent", "<|im_start|><|im_end|><|endoftext|>"),
    ("special_inline", "text<|im_end|>more text <|endoftext|> end"),
    ("special_partial", "<|im_start <|im_end| <|IM_START|> im_start|>"),
    ("special_prefixes", "<repo_name>x<reponame>y<file_sep><filename>z"),
    ("special_spaces", " <|im_start|> \n <|im_end|>  "),
]

# Characters for the seeded random strings: the places where pre-tokenizers disagree (spaces of
# every kind, apostrophes before letters, digits of several scripts, marks, symbols, emoji).
RANDOM_POOL = (
    list("aAbBsStTdDmMlLrReEvVxyz") + list("0123456789") + [" "] * 8 + ["\t", "\n", "\r"] * 2 +
    ["'"] * 4 + list(".,;:!?-_()[]{}<>/\\\"#$%&*+=@^`|~") +
    ["\u00a0", "\u3000", "\u2003", "\u2028", "\u0085", "\x0b", "\x0c"] +
    list("éüßñçøåœΩπЖжяあアカ漢字한글مرحنमस्") + ["\u0301", "\u0308", "\u093f"] +
    list("٣١२²½Ⅻ①") + ["😀", "👍🏽", "🏳️‍🌈", "❤️", "€", "£", "∑", "—", "…", "’"] +
    ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<repo_name>"] +
    ["\x04", "\x1b", "\x7f"]
)
NUM_RANDOM = 150


NUM_RANDOM_WORDS = 100
# Letters weighted roughly like English, so that long words go through many merges.
WORD_LETTERS = "eeeeettttaaaoooiiinnnsssrrhhlldcumfpgwybvkxjqz"


def random_corpus() -> list[tuple[str, str]]:
    rng = random.Random(20240611)
    out = []
    for i in range(NUM_RANDOM):
        n = rng.randint(1, 40)
        out.append((f"random_{i:03d}", "".join(rng.choice(RANDOM_POOL) for _ in range(n))))
    for i in range(NUM_RANDOM_WORDS):
        words = []
        for _ in range(rng.randint(1, 8)):
            w = "".join(rng.choice(WORD_LETTERS) for _ in range(rng.randint(1, 25)))
            words.append(w.capitalize() if rng.random() < 0.2 else w)
        out.append((f"random_words_{i:03d}", " ".join(words)))
    return out


def read_gguf(path: Path) -> dict:
    r = GGUFReader(str(path))

    def get(key, default=None):
        f = r.fields.get(key)
        return default if f is None else f.contents()

    meta = {
        "model": get("tokenizer.ggml.model"),
        "pre": get("tokenizer.ggml.pre"),
        "tokens": get("tokenizer.ggml.tokens"),
        "merges": get("tokenizer.ggml.merges"),
        "token_type": get("tokenizer.ggml.token_type"),
        "bos": get("tokenizer.ggml.bos_token_id"),
        "eos": get("tokenizer.ggml.eos_token_id"),
        "add_bos": get("tokenizer.ggml.add_bos_token", False),
    }
    if meta["model"] != "gpt2" or meta["pre"] != "smollm":
        sys.exit(f"expected a gpt2/smollm vocabulary, got {meta['model']}/{meta['pre']}")
    return meta


def build_tokenizer(meta: dict, variant: str) -> Tokenizer:
    vocab = {t: i for i, t in enumerate(meta["tokens"])}
    merges = [tuple(m.split(" ", 1)) for m in meta["merges"]]
    model = models.BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False,
                       byte_fallback=False, ignore_merges=(variant == "llama3"))
    tok = Tokenizer(model)
    tok.normalizer = None
    if variant == "smollm":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ])
    elif variant == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True,
                                                     use_regex=True)
    else:
        regex = LLAMA3_REGEX if variant == "llama3" else QWEN2_REGEX
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ])
    tok.decoder = decoders.ByteLevel()
    specials = [AddedToken(t, special=True, normalized=False, lstrip=False, rstrip=False,
                           single_word=False)
                for t, ty in zip(meta["tokens"], meta["token_type"]) if ty == 3]
    tok.add_special_tokens(specials)
    return tok


def encode(tok: Tokenizer, text: str, parse_special: bool) -> list[int]:
    tok.encode_special_tokens = not parse_special
    return tok.encode(text, add_special_tokens=False).ids


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", type=Path, default=ROOT / "models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--out", type=Path, default=ROOT / "tests/data/tokenizer")
    args = ap.parse_args()

    meta = read_gguf(args.gguf)
    out = args.out
    (out / "smollm2").mkdir(parents=True, exist_ok=True)

    corpus = CORPUS + random_corpus()
    names = [n for n, _ in corpus]
    assert len(set(names)) == len(names)
    with open(out / "corpus.json", "w", encoding="utf-8") as f:
        json.dump({"comment": "Generated by tests/reference/make_bpe_vectors.py; edit it there.",
                   "strings": [{"name": n, "text": t} for n, t in corpus]},
                  f, ensure_ascii=False, indent=1)
        f.write("\n")

    variants = {}
    for variant in ("smollm", "gpt2", "llama3", "qwen2"):
        tok = build_tokenizer(meta, variant)
        if variant == "smollm":
            tok.save(str(out / "smollm2/tokenizer.json"), pretty=False)
            # Sanity: the saved file reloads to the same tokenizer.
            tok2 = Tokenizer.from_file(str(out / "smollm2/tokenizer.json"))
        rows = []
        pieces = {}
        for name, text in corpus:
            for ps in (False, True):
                ids = encode(tok, text, ps)
                if variant == "smollm":
                    assert ids == encode(tok2, text, ps), name
                rows.append({"name": name, "parse_special": ps, "ids": ids})
            # The pre-tokenizer alone (no special-token split), as byte-level strings.
            pieces[name] = [p for p, _ in tok.pre_tokenizer.pre_tokenize_str(text)]
        variants[variant] = {"encodings": rows, "pieces": pieces}

    tokens = meta["tokens"]
    with open(out / "smollm2/tokenizer_config.json", "w", encoding="utf-8") as f:
        json.dump({"comment": "bos/eos/add_bos from the GGUF metadata of "
                              "SmolLM2-135M-Instruct.Q4_1.gguf (make_bpe_vectors.py)",
                   "bos_token": tokens[meta["bos"]], "eos_token": tokens[meta["eos"]],
                   "add_bos_token": bool(meta["add_bos"])}, f, indent=1)
        f.write("\n")

    with open(out / "smollm2_ids.json", "w", encoding="utf-8") as f:
        json.dump({"comment": "Reference ids from Hugging Face tokenizers; generated by "
                              "tests/reference/make_bpe_vectors.py. Texts are in corpus.json.",
                   "tokenizers_version": tokenizers.__version__,
                   "source": os.path.basename(args.gguf),
                   "vocab_size": len(tokens), "num_merges": len(meta["merges"]),
                   "variants": variants}, f, separators=(",", ":"))
        f.write("\n")
    size = (out / "smollm2/tokenizer.json").stat().st_size
    print(f"wrote {len(corpus)} strings x 2 x {len(variants)} variants; "
          f"tokenizer.json {size} bytes")


if __name__ == "__main__":
    main()
