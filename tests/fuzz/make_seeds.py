#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets into tests/fuzz/corpus/NAME/.

Run once from anywhere (python3 tests/fuzz/make_seeds.py); the files it writes are committed.
Needs only Python 3 and `protoc` (protobuf-compiler, for the worker protos' wire encoding).
Deterministic: running it again rewrites the same bytes. A few seeds are copies of project data
(tests/data/stories260K/tok512.bin, chat templates of tests/data/chat/templates.json,
configs/*.yaml); the rest are tiny files built here, valid ones and deliberately broken ones.
Seeds added by hand (or minimised crash reproducers) live beside these; this script never
deletes a file.
"""
import json
import os
import struct
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")


def write(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def floats(n, scale=0.01, start=0):
    return [scale * (((i + start) * 37) % 17 - 8) for i in range(n)]


# ---- GGUF -----------------------------------------------------------------------------------
def gguf_str(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf_value(t, v):
    """GGUF type id and a Python value -> bytes (arrays: (elem_type, [values]))."""
    fmt = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
           11: "<q", 12: "<d"}
    if t == 8:
        return gguf_str(v)
    if t == 9:
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(gguf_value(et, x) for x in items)
    return struct.pack(fmt[t], v)


def gguf(kvs, tensors, version=3, alignment=32):
    """kvs: [(key, type, value)]; tensors: [(name, dims, ggml_type, raw bytes)]."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    for k, t, v in kvs:
        out += gguf_str(k) + struct.pack("<I", t) + gguf_value(t, v)
    offset = 0
    for name, dims, gt, raw in tensors:
        out += gguf_str(name) + struct.pack("<I", len(dims))
        out += b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", gt, offset)
        offset += (len(raw) + alignment - 1) // alignment * alignment
    out += b"\0" * (-len(out) % alignment)
    for _, _, _, raw in tensors:
        out += raw + b"\0" * (-len(raw) % alignment)
    return out


def f32(vals):
    return struct.pack("<%df" % len(vals), *vals)


def tiny_llama_gguf(tokenizer="llama"):
    dim, hidden, heads, kv_heads, layers, seq = 8, 16, 2, 1, 1, 32
    kv_dim = dim // heads * kv_heads
    if tokenizer == "llama":
        pieces = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)] + [
            " ", "a", "b", " a", "ab", "Once", " upon"]
        types = [2, 3, 3] + [6] * 256 + [1] * 7
        tok_kvs = [("tokenizer.ggml.model", 8, "llama"),
                   ("tokenizer.ggml.tokens", 9, (8, pieces)),
                   ("tokenizer.ggml.scores", 9, (6, [float(-i) for i in range(len(pieces))])),
                   ("tokenizer.ggml.token_type", 9, (5, types)),
                   ("tokenizer.ggml.bos_token_id", 4, 1),
                   ("tokenizer.ggml.eos_token_id", 4, 2)]
    else:  # byte-level BPE ("gpt2")
        byte_chars = [chr(c) for c in range(33, 127)] + ["\u0120"]  # Ġ is the space
        pieces = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + byte_chars + ["\u0120a", "ab"]
        types = [3, 3, 3] + [1] * (len(pieces) - 3)
        tok_kvs = [("tokenizer.ggml.model", 8, "gpt2"),
                   ("tokenizer.ggml.pre", 8, "smollm"),
                   ("tokenizer.ggml.tokens", 9, (8, pieces)),
                   ("tokenizer.ggml.token_type", 9, (5, types)),
                   ("tokenizer.ggml.merges", 9, (8, ["\u0120 a", "a b"])),
                   ("tokenizer.ggml.bos_token_id", 4, 0),
                   ("tokenizer.ggml.eos_token_id", 4, 2),
                   ("tokenizer.chat_template", 8, "{% for m in messages %}<|im_start|>"
                    "{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}")]
    vocab = len(pieces)
    kvs = [("general.architecture", 8, "llama"), ("general.name", 8, "fuzz-seed"),
           ("general.alignment", 4, 32),
           ("llama.vocab_size", 4, vocab), ("llama.block_count", 4, layers),
           ("llama.context_length", 4, seq), ("llama.embedding_length", 4, dim),
           ("llama.feed_forward_length", 4, hidden), ("llama.attention.head_count", 4, heads),
           ("llama.attention.head_count_kv", 4, kv_heads), ("llama.rope.freq_base", 6, 10000.0),
           ("llama.attention.layer_norm_rms_epsilon", 6, 1e-5)] + tok_kvs
    t = [("token_embd.weight", [dim, vocab], 0, f32(floats(dim * vocab))),
         ("output_norm.weight", [dim], 0, f32([1.0] * dim))]
    for l in range(layers):
        p = "blk.%d." % l
        t += [(p + "attn_norm.weight", [dim], 0, f32([1.0] * dim)),
              (p + "attn_q.weight", [dim, dim], 0, f32(floats(dim * dim, start=1))),
              (p + "attn_k.weight", [dim, kv_dim], 0, f32(floats(dim * kv_dim, start=2))),
              (p + "attn_v.weight", [dim, kv_dim], 0, f32(floats(dim * kv_dim, start=3))),
              (p + "attn_output.weight", [dim, dim], 0, f32(floats(dim * dim, start=4))),
              (p + "ffn_norm.weight", [dim], 0, f32([1.0] * dim)),
              (p + "ffn_gate.weight", [dim, hidden], 0, f32(floats(dim * hidden, start=5))),
              (p + "ffn_down.weight", [hidden, dim], 0, f32(floats(dim * hidden, start=6))),
              (p + "ffn_up.weight", [dim, hidden], 0, f32(floats(dim * hidden, start=7)))]
    return gguf(kvs, t)


def gguf_seeds():
    write("gguf", "tiny_llama_spm.gguf", tiny_llama_gguf("llama"))
    write("gguf", "tiny_llama_bpe.gguf", tiny_llama_gguf("gpt2"))
    # Every metadata type, nested arrays, quantised and 3-D tensors; version 2.
    q8_0 = (struct.pack("<e", 0.5) + bytes(range(32))) * 2  # 2 blocks of 32: [64] Q8_0
    q4_1 = (struct.pack("<ee", 0.25, -1.0) + bytes(range(16))) * 2  # [64] Q4_1
    kvs = [("u8", 0, 7), ("i8", 1, -7), ("u16", 2, 700), ("i16", 3, -700), ("u32", 4, 70000),
           ("i32", 5, -70000), ("f32", 6, 1.5), ("bool", 7, True), ("str", 8, "text"),
           ("u64", 10, 2 ** 40), ("i64", 11, -2 ** 40), ("f64", 12, 2.5),
           ("arr.i32", 9, (5, [1, -2, 3])), ("arr.str", 9, (8, ["a", "", "c"])),
           ("arr.arr", 9, (9, [(4, [1, 2]), (4, []), (8, ["x"])])),
           ("general.alignment", 4, 64)]
    t = [("q8", [64], 8, q8_0), ("q4_1", [32, 2], 3, q4_1),
         ("cube", [2, 2, 2], 0, f32(floats(8))), ("f16", [4], 1, struct.pack("<4e", 1, 2, 3, 4)),
         ("bf16", [4], 30, b"\x80\x3f" * 4), ("iq4_nl", [32], 20, b"\0" * 18)]
    all_types = gguf(kvs, t, version=2, alignment=64)
    write("gguf", "all_types_v2.gguf", all_types)
    # Broken ones: truncated in the tensor infos, bad magic, unknown version, lying counts.
    write("gguf", "truncated.gguf", all_types[: len(all_types) // 3])
    write("gguf", "bad_magic.gguf", b"GGUX" + all_types[4:200])
    write("gguf", "version9.gguf", b"GGUF" + struct.pack("<IQQ", 9, 0, 0))
    write("gguf", "huge_counts.gguf", b"GGUF" + struct.pack("<IQQ", 3, 2 ** 62, 2 ** 62))
    write("gguf", "offset_past_end.gguf",
          gguf([], [("t", [4], 0, f32([1, 2, 3, 4]))])[:-32] + b"\0" * 8)


# ---- safetensors ------------------------------------------------------------------------------
def safetensors(entries, metadata=None, pad_header=8):
    """entries: [(name, dtype, shape, raw)] laid out in order."""
    header, data = {}, b""
    for name, dtype, shape, raw in entries:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if metadata is not None:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % pad_header)
    return struct.pack("<Q", len(h)) + h + data


def safetensors_seeds():
    good = safetensors([("model.norm.weight", "F32", [4], f32([1, 2, 3, 4])),
                        ("lm_head.weight", "F16", [2, 3], struct.pack("<6e", *range(6))),
                        ("model.embed_tokens.weight", "BF16", [3, 2], b"\x80\x3f" * 6),
                        ("ids", "I64", [2], struct.pack("<2q", 1, -1)),
                        ("scalar", "F32", [], f32([7])), ("empty", "F32", [0, 5], b"")],
                       metadata={"format": "pt"})
    write("safetensors", "valid.safetensors", good)
    write("safetensors", "truncated.safetensors", good[: len(good) - 5])
    write("safetensors", "header_too_long.safetensors", struct.pack("<Q", 2 ** 40) + b"{}")
    h = b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},' \
        b'"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}'
    write("safetensors", "overlap.safetensors", struct.pack("<Q", len(h)) + h + b"\0" * 12)
    h = b'{"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,16]}}'
    write("safetensors", "shape_overflow.safetensors", struct.pack("<Q", len(h)) + h + b"\0" * 16)
    h = b'{"a":{"dtype":"X9","shape":[1],"data_offsets":[0,1]},"__metadata__":{"k":1}}'
    write("safetensors", "bad_dtype.safetensors", struct.pack("<Q", len(h)) + h + b"\0")


# ---- llama2.c -----------------------------------------------------------------------------------
def llama2c(dim=8, hidden=16, layers=1, heads=2, kv_heads=1, vocab=16, seq=8, shared=True):
    head = dim // heads
    kv_dim = head * kv_heads
    n = (vocab * dim + layers * dim * 2 + layers * dim * dim * 2 + layers * kv_dim * dim * 2 +
         layers * hidden * dim * 3 + dim + seq * head)
    if not shared:
        n += vocab * dim
    hdr = struct.pack("<7i", dim, hidden, layers, heads, kv_heads, vocab if shared else -vocab,
                      seq)
    return hdr + f32(floats(n))


def llama2c_seeds():
    write("llama2c", "tiny_shared.bin", llama2c())
    write("llama2c", "tiny_unshared.bin", llama2c(layers=2, kv_heads=2, shared=False))
    write("llama2c", "truncated.bin", llama2c()[:200])
    write("llama2c", "header_only.bin", struct.pack("<7i", 288, 768, 6, 6, 6, 32000, 256))
    write("llama2c", "huge_dims.bin", struct.pack("<7i", 2 ** 30, 2 ** 30, 2 ** 20, 2 ** 15,
                                                  2 ** 15, -(2 ** 31 - 1), 2 ** 30) + b"\0" * 64)

    # Tokenizer files: an int16 expected vocabulary size, then the file (tokenizer.bin format).
    def tok_file(pieces, max_len=None):
        out = struct.pack("<i", max_len if max_len is not None else max(len(p) for p in pieces))
        for i, p in enumerate(pieces):
            b = p.encode() if isinstance(p, str) else p
            out += struct.pack("<fi", -float(i), len(b)) + b
        return out

    pieces = ["<unk>", "\n<s>\n", "\n</s>\n", "<0x41>", "<0xFF>", " ", "a", "b", "ab", " a",
              " Once", "\u00e9"]
    write("llama2c_tokenizer", "tiny.bin", struct.pack("<h", len(pieces)) + tok_file(pieces))
    write("llama2c_tokenizer", "wrong_count.bin", struct.pack("<h", 40) + tok_file(pieces))
    write("llama2c_tokenizer", "negative_length.bin",
          struct.pack("<h", 3) + struct.pack("<i", 5) + struct.pack("<fi", 0.0, -4) + b"abcd")
    write("llama2c_tokenizer", "nan_score.bin",
          struct.pack("<h", 3) + tok_file(["<unk>", "<s>"]) + struct.pack("<fi", float("nan"), 1) +
          b"x")
    with open(os.path.join(ROOT, "tests/data/stories260K/tok512.bin"), "rb") as f:
        write("llama2c_tokenizer", "tok512.bin", struct.pack("<h", 512) + f.read())


# ---- tokenizer.json -----------------------------------------------------------------------------
def byte_level_alphabet():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def tokenizer_json(pre, merges_as_arrays=False, added=True, extra=None):
    vocab = {}
    for ch in byte_level_alphabet():
        vocab[ch] = len(vocab)
    merges = [("\u0120", "w"), ("o", "r"), ("\u0120w", "or"), ("l", "d"), ("H", "e"),
              ("He", "l"), ("Hel", "l"), ("Hell", "o"), ("1", "2")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    doc = {"version": "1.0", "truncation": None, "padding": None,
           "added_tokens": [], "normalizer": None, "pre_tokenizer": pre,
           "post_processor": None, "decoder": {"type": "ByteLevel"},
           "model": {"type": "BPE", "dropout": None, "unk_token": None,
                     "continuing_subword_prefix": None, "end_of_word_suffix": None,
                     "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
                     "merges": [list(m) if merges_as_arrays else " ".join(m) for m in merges]}}
    if added:
        for text, special in (("<|endoftext|>", True), ("<|im_start|>", True),
                              ("<|im_end|>", True), ("[USER]", False)):
            doc["added_tokens"].append({"id": len(vocab) + len(doc["added_tokens"]),
                                        "content": text, "single_word": False, "lstrip": False,
                                        "rstrip": False, "normalized": False,
                                        "special": special})
    if extra:
        doc.update(extra)
    return json.dumps(doc, ensure_ascii=False, indent=1)


LLAMA3_REGEX = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?"
                "[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")


def tokenizer_json_seeds():
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
          "use_regex": True}
    write("tokenizer_json", "gpt2.json", tokenizer_json(bl))
    write("tokenizer_json", "smollm.json", tokenizer_json(
        {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True},
                                               bl]}, merges_as_arrays=True))
    write("tokenizer_json", "llama3.json", tokenizer_json(
        {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_REGEX}, "behavior": "Isolated",
             "invert": False},
            dict(bl, use_regex=False)]},
        extra={"post_processor": {"type": "TemplateProcessing", "single": [
            {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}}]}}))
    write("tokenizer_json", "unigram.json", '{"model": {"type": "Unigram", "vocab": []}}')
    write("tokenizer_json", "bad_merge.json",
          '{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a c"]},'
          ' "pre_tokenizer": {"type": "ByteLevel"}}')
    write("tokenizer_json", "sparse_ids.json",
          '{"model": {"type": "BPE", "vocab": {"a": 0, "b": 7}, "merges": []},'
          ' "pre_tokenizer": {"type": "ByteLevel"}, "added_tokens": [{"id": 3, "content": "x"}]}')


# ---- chat templates -----------------------------------------------------------------------------
def chat_template_seeds():
    with open(os.path.join(ROOT, "tests/data/chat/templates.json")) as f:
        doc = json.load(f)
    for t in doc["templates"]:
        write("chat_template", t["name"] + ".jinja", t["source"])
    for i, t in enumerate(doc["unrecognised"][:2]):
        src = t["source"] if isinstance(t, dict) else t
        write("chat_template", "unrecognised_%d.jinja" % i, src)
    write("chat_template", "chatml_default_system.jinja",
          "{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are \\'x\\'."
          "<|im_end|>\\n' }}{% endif %}{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
          "{{ m['content'] }}<|im_end|>\n{% endfor %}")
    write("chat_template", "chatml_unterminated.jinja", "<|im_start|>system\n" * 8)
    # Regression: many system headers and one quote before the only <|im_end|> (was quadratic).
    write("chat_template", "regression_many_heads.jinja",
          "<|im_start|>system\n" * 200 + "'<|im_end|>")
    write("chat_template", "llama2_markers.jinja", "[INST] <<SYS>> bos_token .strip()")
    # Gemma's system separator literal, unterminated and with a trailing backslash.
    write("chat_template", "gemma_separator_unterminated.jinja",
          "<start_of_turn><end_of_turn>first_user_prefix = messages[0]['content'] + '\\n\\")
    write("chat_template", "empty.jinja", "")


# ---- OpenAI requests ----------------------------------------------------------------------------
def openai_request_seeds():
    seeds = {
        "completion.json": {"model": "m", "prompt": "Once upon a time", "max_tokens": 16,
                            "temperature": 0.7, "top_p": 0.9, "top_k": 40, "seed": 3,
                            "stop": ["\n", "."], "logprobs": 2, "n": 2},
        "completion_ids.json": {"prompt": [[1, 2, 3], [4]], "stream": True,
                                "stream_options": {"include_usage": True}, "ignore_eos": True},
        "completion_spec.json": {"prompt": ["a", "b"], "speculation": {
            "enabled": True, "draft": ["ngram:3", "layers:2"], "tree": [1, 1, 3, 1]}},
        "chat.json": {"model": "m", "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
            {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "More"}],
            "max_completion_tokens": 8, "logprobs": True, "top_logprobs": 3,
            "response_format": {"type": "text"}},
        "chat_unsupported.json": {"messages": [{"role": "user", "content": "x"}],
                                  "tools": [], "logit_bias": {"5": 1}, "best_of": 2},
        "unknown_field.json": {"prompt": "x", "nonsense": 1, "max_tokens": -4},
    }
    for name, body in seeds.items():
        write("openai_request", name, json.dumps(body))
    write("openai_request", "deep.json", "[" * 70 + "]" * 70)
    write("openai_request", "bad_utf8.json", b'{"prompt": "\xff\xfe"}')
    write("openai_request", "truncated.json", '{"messages": [{"role": "us')


# ---- speculation grammar ------------------------------------------------------------------------
def spec_grammar_seeds():
    write("spec_grammar", "valid.txt", "ngram\nngram:3\nlayers:4\nmodel:/tmp/draft model.gguf\n"
                                       "1,1,3,1\n1, 2, 2\n16\n")
    write("spec_grammar", "invalid.txt", "ngram:0\nngram:+3\nlayers:\nmodel:\nmodel:a\tb\n"
                                         "bogus:1\n0,1\n1,,1\n99999999999\n-1\n1,1 ,1\n")
    write("spec_grammar", "duplicates.txt", "ngram:2\nngram:2\nlayers:12\n")
    write("spec_grammar", "big_tree.txt", ",".join(["16"] * 40) + "\n")


# ---- cluster YAML -------------------------------------------------------------------------------
def cluster_yaml_seeds():
    cfg_dir = os.path.join(ROOT, "configs")
    for name in sorted(os.listdir(cfg_dir)):
        if name.endswith(".yaml"):
            with open(os.path.join(cfg_dir, name), "rb") as f:
                write("cluster_yaml", name, f.read())
    write("cluster_yaml", "anchors.yaml", "a: &x [1, 2]\nb: *x\nmodels: {llm: m.gguf}\n")
    write("cluster_yaml", "wrong_types.yaml",
          "models: [1]\nlimits: {max_batch: -1, context: x}\nmanager: {http_port: 70000}\n")
    write("cluster_yaml", "not_yaml.yaml", "{[}: ]\n\t- :")


# ---- worker protos ------------------------------------------------------------------------------
def protoc_encode(proto, message, text):
    r = subprocess.run(["protoc", "--proto_path=" + ROOT, "--encode=" + message, proto],
                       input=text.encode(), capture_output=True, check=True)
    return r.stdout


def worker_proto_seeds():
    llm, ssm = "proto/llm_worker.proto", "proto/ssm_worker.proto"
    fwd = """kv_block_size: 16 tokens: [1, 2, 3, 4] positions: [0, 1, 2, 3] logit_rows: [3]
             seqs { seq: 1 token_begin: 0 token_count: 4 kv_prefix: 0 masked_kv: 0
                    block_table: [0] }"""
    write("worker_proto", "forward.bin",
          b"\x00" + protoc_encode(llm, "specinfer.worker.LlmForwardRequest", fwd))
    fwd_mask = """kv_block_size: 16 tokens: [5, 6, 7] positions: [8, 9, 9] logit_rows: [0, 1, 2]
                  seqs { seq: 2 token_begin: 0 token_count: 3 kv_prefix: 8 masked_kv: 0
                         block_table: [3] mask_cols: 3 mask_bits: [1, 3, 5] }"""
    write("worker_proto", "forward_mask.bin",
          b"\x00" + protoc_encode(llm, "specinfer.worker.LlmForwardRequest", fwd_mask))
    fwd_argmax = """kv_block_size: 16 tokens: [5, 6, 7] positions: [8, 9, 9] logit_rows: [0]
                    argmax_rows: [2, 0, 1]
                    seqs { seq: 2 token_begin: 0 token_count: 3 kv_prefix: 8 masked_kv: 0
                           block_table: [3] mask_cols: 3 mask_bits: [1, 3, 5] }"""
    write("worker_proto", "forward_argmax.bin",
          b"\x00" + protoc_encode(llm, "specinfer.worker.LlmForwardRequest", fwd_argmax))
    move = "kv_block_size: 16 length: 20 block_table: [4, 5] src: [17, 18] dst: [10, 11]"
    write("worker_proto", "move_kv.bin",
          b"\x01" + protoc_encode(llm, "specinfer.worker.LlmMoveKvRequest", move))
    spec = """items { session: "s1" base: 0 tokens: [1, 2, 3] widths: [1, 2, 1] max_depth: 4
                      sampling { temperature: 0.8 top_k: 5 top_p: 0.9 } seed: 9 }
              items { session: "s2" base: 3 tokens: [4] widths: [1] max_depth: 0 }"""
    write("worker_proto", "speculate.bin",
          b"\x02" + protoc_encode(ssm, "specinfer.worker.SpeculateRequest", spec))
    tree = """results { outcome: OK tree {
                nodes { token: 7 parent: -1 trials { child: 1 speculator: 0 dist: 0 }
                        trials { child: 2 speculator: 0 dist: -1 } }
                nodes { token: 3 parent: 0 proposers: 1 trials { child: 3 speculator: 0 dist: -1 } }
                nodes { token: 4 parent: 0 proposers: 1 }
                nodes { token: 9 parent: 1 proposers: 1 }
                dists { ids: [3, 5] probs: [0.75, 0.25] } } }
              results { outcome: RESYNC }"""
    write("worker_proto", "speculate_response.bin",
          b"\x03" + protoc_encode(ssm, "specinfer.worker.SpeculateResponse", tree))
    write("worker_proto", "garbage.bin", b"\x00\xff\xff\xff\xff\x0f")


def main():
    gguf_seeds()
    safetensors_seeds()
    llama2c_seeds()
    tokenizer_json_seeds()
    chat_template_seeds()
    openai_request_seeds()
    spec_grammar_seeds()
    cluster_yaml_seeds()
    worker_proto_seeds()
    total = sum(os.path.getsize(os.path.join(d, f))
                for d, _, fs in os.walk(CORPUS) for f in fs)
    print("make_seeds: corpora in %s, %d bytes in all" % (CORPUS, total))


if __name__ == "__main__":
    sys.exit(main())
