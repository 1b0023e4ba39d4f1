#!/usr/bin/env python3
"""Boost-tuned small speculative models (SSMs) for the LLM that specinfer serves.

    python3 scripts/boost_tune.py data  --model LLM.gguf --out WORK
    python3 scripts/boost_tune.py train --model LLM.gguf --data WORK --out WORK/ssm [--ssms 3]
    python3 scripts/boost_tune.py eval  --model LLM.gguf --data WORK --ssm WORK/ssm/ssm-0.gguf ...

(`all` runs the three in turn.) Needs PyTorch, numpy, gguf and grpcio-tools
(scripts/requirements-boost.txt); the daemon itself never depends on Python.

What it does, after SpecInfer (Miao et al., ASPLOS 2024, "collective boost-tuning"):

1. data: a prompt set made here from templates (chat questions, instructions, code, rewriting;
   PROMPT_TEMPLATES x TOPICS, seeded), split by topic: every topic whose index is a multiple of 5
   is held out for evaluation and never trained on. The LLM answers every prompt through a
   `specinfer serve` it starts (gRPC, batched by continuous batching, 16 requests in flight):
   greedy, and once more sampled at temperature 0.8, each output token with the LLM's top-20
   log-probabilities. Written to WORK/data.jsonl (token ids: prompt rendered with the model's
   ChatML template, output, and the top-20 alternatives per output token).
2. train: SSM 0 is a small Llama-architecture model (default 4 layers, width 256, the LLM's
   vocabulary; its embedding, tied to the output layer, starts as the LLM's token embedding
   projected onto its top principal directions) trained by distillation: at every output
   position, cross-entropy against the LLM's top-20 distribution (renormalised). Boosting: SSM k
   is trained on the same data with each position weighted by how badly SSMs 0..k-1 did there,
       w = 1                 where no earlier SSM has the LLM's token as its top-1,
       w = BOOST_HIT_WEIGHT  (0.2) where one does,
   so the later SSMs spend their capacity where the earlier ones disagree with the LLM and the
   merged token tree covers more of the LLM's choices. (The paper filters the prompts on which
   the earlier SSMs agreed; weighting positions keeps the data for the shared context the later
   SSMs still have to model.) `--boost-from A.gguf ...` takes SSMs trained before as the loop's
   first members (loaded, not retrained; their hits are computed on this data, each with its own
   draft vocabulary, position by position), so a boosted SSM can be added to a shipped one. Each
   SSM is exported as GGUF (architecture llama, the LLM's vocabulary fingerprint, so
   `--draft model:PATH` and SSM workers load it unchanged and the vocabulary check passes;
   matrices Q8_0, or Q4_1 / Q4_0 with `--quant`, norms F32).
3. eval: on the held-out prompts, greedy, `specinfer generate --draft model:SSM ... --tree T`:
   tokens per LLM pass and accepted tokens per depth for each SSM alone and for the merged set,
   and decode tok/s against no draft.

Seeds, data sizes and steps are pinned by the defaults; `--steps`, `--prompts` etc. shrink a run
(the CI test trains stories260K for a few steps: tests/scripts/boost_tune_test.sh).
"""
import argparse
import json
import math
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BOOST_HIT_WEIGHT = 0.2
TOP_K = 20

# ---------------------------------------------------------------------------------------------
# Prompts.

TOPICS = [
    "photosynthesis", "the water cycle", "black holes", "compound interest", "the French Revolution",
    "machine learning", "volcanoes", "the immune system", "climate change", "the stock market",
    "gravity", "honey bees", "the Roman Empire", "electric cars", "sleep", "coffee",
    "the internet", "recycling", "the moon", "earthquakes", "vaccines", "chess", "rainbows",
    "democracy", "the human heart", "solar panels", "inflation", "dinosaurs", "the ocean tides",
    "meditation", "bread baking", "the printing press", "cryptography", "public libraries",
    "bicycles", "friendship", "time management", "the Amazon rainforest", "music theory",
    "plate tectonics", "nutrition", "the Renaissance", "space exploration", "batteries",
    "language learning", "penguins", "the Olympic Games", "ancient Egypt", "wind energy",
    "video games", "the periodic table", "mountains", "the human brain", "coral reefs",
    "elections", "gardening", "airplanes", "DNA", "the seasons", "writing a resume",
    "public speaking", "urban planning", "deserts", "tea", "smartphones", "the Great Wall of China",
    "antibiotics", "saving money", "the solar system", "birds migrating", "glaciers", "robots",
]

# More topics, after the first list so that its prompts keep their places (and seeds) in
# make_prompts: a data set made before these were added is still a prefix of the one made now.
MORE_TOPICS = [
    "the Industrial Revolution", "photography", "jazz", "the Moon landing", "rainforests",
    "yoga", "the metric system", "pollination", "nuclear power", "ancient Greece", "chocolate",
    "lightning", "submarines", "the Silk Road", "tornadoes", "composting", "the Eiffel Tower",
    "origami", "sharks", "blood types", "the Milky Way", "cloud computing", "mushrooms",
    "hurricanes", "the Beatles", "knitting", "wolves", "the Pyramids of Giza", "vitamins",
    "magnets", "camping", "the Cold War", "bees making honey", "telescopes", "marathon running",
    "the human skeleton", "podcasts", "the Sahara", "3D printing", "octopuses", "the Vikings",
    "microplastics", "opera", "trains", "the Arctic", "fermentation", "password security",
    "elephants", "the Mona Lisa", "hydroelectric dams", "sign language", "comets", "pizza",
    "the United Nations", "quantum computing", "butterflies", "the Great Barrier Reef",
    "first aid", "cheese making", "satellites", "the Aztecs", "allergies", "skateboarding",
    "social media", "hot air balloons", "the Nile", "volunteering", "earthworms", "fossils",
    "the Statue of Liberty", "electric guitars", "clouds", "the stock exchange", "kindness",
    "self-driving cars", "the Hubble telescope", "desert animals", "minimalism", "rice farming",
    "the scientific method", "bridges", "whales", "the Internet of Things", "board games",
    "the French language", "pandas", "solar eclipses", "ancient China", "bamboo", "sunscreen",
    "open source software", "the Titanic", "caves", "coffee shops", "wildfires", "owls",
    "chairs", "Shakespeare", "recycling plastic", "the speed of light",
]

PROMPT_TEMPLATES = {
    "chat": [
        "What is {t}?",
        "Can you explain {t} in simple terms?",
        "Why is {t} important?",
        "How does {t} work?",
        "What are three interesting facts about {t}?",
        "Explain {t} to a ten-year-old.",
        "What are the pros and cons of {t}?",
        "What should a beginner know about {t}?",
    ],
    "instruction": [
        "Write a short poem about {t}.",
        "Write a short story that involves {t}.",
        "Give me five tips related to {t}.",
        "Write a paragraph for a school report on {t}.",
        "Write a friendly email inviting a colleague to a talk about {t}.",
        "Make a list of questions a student might ask about {t}.",
        "Write a short blog post introduction about {t}.",
    ],
    "code": [
        "Write a Python function that counts how often each word appears in a text about {t}.",
        "Write a Python class that stores notes about {t} and can search them.",
        "Write a JavaScript function that returns a random fact about {t} from a list.",
        "Write a SQL table definition for a database of articles about {t}.",
        "Write a Python script that reads a CSV file of measurements about {t} and prints the average.",
    ],
    "rewrite": [
        "Rewrite this sentence in a formal tone: {t} is really cool and everybody should learn about it.",
        "Summarize in one sentence why people study {t}.",
        "Fix the grammar: me and my friend was reading a book about {t} yesterday.",
        "Rewrite for a child: {t} is a subject with many fascinating and complex aspects.",
        "Turn this into a question: {t} has changed the way we live.",
    ],
}

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def make_prompts(seed, limit=None):
    """Every template x topic, shuffled with `seed` (TOPICS' prompts, then MORE_TOPICS'); split
    by topic (index % 5 == 0 in its list: held out)."""
    out = []
    for topics in (TOPICS, MORE_TOPICS):
        part = []
        for ti, topic in enumerate(topics):
            split = "heldout" if ti % 5 == 0 else "train"
            for cat, templates in PROMPT_TEMPLATES.items():
                for tmpl in templates:
                    part.append({"prompt": tmpl.format(t=topic), "category": cat, "split": split})
        random.Random(seed).shuffle(part)
        out += part
    if limit is not None:
        train = [p for p in out if p["split"] == "train"][:limit]
        held = [p for p in out if p["split"] == "heldout"][: max(limit // 4, 1)]
        out = train + held
    return out


def render_chatml(user):
    return (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
            "<|im_start|>assistant\n")


# ---------------------------------------------------------------------------------------------
# The LLM through specinfer's gRPC API.

def specinfer_binary():
    b = Path(os.environ.get("SPECINFER_BIN", REPO / "build" / "specinfer"))
    if not b.exists():
        sys.exit(f"boost_tune: {b} not found; build the project first (scripts/setup.sh)")
    return b


def grpc_modules(tmp):
    from grpc_tools import protoc
    proto_dir = REPO / "proto"
    rc = protoc.main(["protoc", f"-I{proto_dir}", f"--python_out={tmp}", f"--grpc_python_out={tmp}",
                      str(proto_dir / "specinfer.proto")])
    if rc != 0:
        sys.exit("boost_tune: protoc failed on proto/specinfer.proto")
    sys.path.insert(0, str(tmp))
    import specinfer_pb2
    import specinfer_pb2_grpc
    return specinfer_pb2, specinfer_pb2_grpc


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A `specinfer serve` of `model` with gRPC on a free port, stopped on exit."""

    def __init__(self, model, threads, tmp, chat_template=None, tokenizer=None):
        import grpc
        self.pb, pbg = grpc_modules(tmp)
        port = free_port()
        cmd = [str(specinfer_binary()), "serve", "--model", str(model), "--port", "0",
               "--grpc-port", str(port), "--threads", str(threads)]
        if tokenizer:
            cmd += ["--tokenizer", str(tokenizer)]
        if chat_template:
            cmd += ["--chat-template", chat_template]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = pbg.SpecInferStub(self.channel)
        deadline = time.time() + 120
        while True:
            if self.proc.poll() is not None:
                sys.exit("boost_tune: specinfer serve exited: " + self.proc.stderr.read().decode())
            try:
                self.stub.Health(self.pb.HealthRequest(), timeout=2)
                break
            except grpc.RpcError:
                if time.time() > deadline:
                    sys.exit("boost_tune: specinfer serve did not become ready")
                time.sleep(0.2)

    def tokenize(self, text):
        r = self.stub.Tokenize(self.pb.TokenizeRequest(text=text, add_bos=True, parse_special=True))
        return list(r.token_ids)

    def generate(self, prompt_ids, max_tokens, temperature, seed):
        pb = self.pb
        req = pb.GenerateRequest(tokens=pb.TokenIds(ids=prompt_ids), max_tokens=max_tokens,
                                 logprobs=TOP_K,
                                 sampling=pb.SamplingParams(temperature=temperature, seed=seed))
        ids, top = [], []
        for msg in self.stub.Generate(req, timeout=600):
            ids.extend(msg.token_ids)
            for lp in msg.logprobs:
                top.append([[a.token_id, round(a.logprob, 4)] for a in lp.top])
        return ids, top

    def close(self):
        self.channel.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def cmd_data(args):
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    prompts = make_prompts(args.seed, args.prompts)
    tmp = tempfile.mkdtemp(prefix="boost-")
    chat = args.chat_template != "none"
    server = Server(args.model, args.threads, tmp, args.chat_template if chat else None,
                    args.tokenizer)
    try:
        if chat:
            # The prompt rendering must be what the daemon renders for a chat request.
            probe = subprocess.run(
                [str(specinfer_binary()), "generate", "--model", str(args.model), "--chat",
                 "--prompt", "Hello", "--max-tokens", "1", "--json"]
                + (["--tokenizer", str(args.tokenizer)] if args.tokenizer else [])
                + (["--chat-template", args.chat_template] if args.chat_template else []),
                capture_output=True, text=True, check=True)
            want = json.loads(probe.stdout)["prompt_tokens"]
            got = server.tokenize(render_chatml("Hello"))
            if want != got:
                sys.exit("boost_tune: this script's ChatML rendering differs from the model's chat "
                         f"template ({got[:12]}... vs {want[:12]}...); pass --chat-template none")
        # An earlier run's answers (each a function of prompt, temperature and seed alone) are
        # kept: an interrupted run, or one with more prompts, only makes what is missing.
        have, kept, cut = set(), [], False
        if (out / "data.jsonl").exists():
            with open(out / "data.jsonl") as f:
                for line in f:
                    try:
                        r = json.loads(line)
                    except json.JSONDecodeError:
                        cut = True  # a line cut short by an interrupted run: dropped
                        break
                    have.add((r["prompt"], r["temperature"]))
                    kept.append(line)
            if cut:
                with open(out / "data.jsonl", "w") as f:
                    f.writelines(kept)
            if have:
                print(f"data: keeping the {len(have)} answers already in {out / 'data.jsonl'}")
        jobs = []
        for i, p in enumerate(prompts):
            temps = [(0.0, args.seed + i)]
            if p["split"] == "train" and args.sampled:
                temps.append((0.8, args.seed + 100000 + i))
            temps = [(t, sd) for t, sd in temps if (p["prompt"], t) not in have]
            if not temps:
                continue
            text = render_chatml(p["prompt"]) if chat else p["prompt"]
            ids = server.tokenize(text)
            jobs += [(p, ids, t, sd) for t, sd in temps]
        lock = threading.Lock()
        done = [0, 0]
        t0 = time.time()
        with open(out / "data.jsonl", "a") as f:
            def run(job):
                p, ids, temp, seed = job
                gen, top = server.generate(ids, args.max_tokens, temp, seed)
                rec = dict(p, temperature=temp, prompt_ids=ids, output_ids=gen, top=top)
                with lock:
                    f.write(json.dumps(rec) + "\n")
                    done[0] += 1
                    done[1] += len(gen)
                    if done[0] % 50 == 0:
                        print(f"  {done[0]}/{len(jobs)} answers, {done[1]} tokens, "
                              f"{done[1] / (time.time() - t0):.0f} tok/s", flush=True)
            with ThreadPoolExecutor(args.concurrency) as pool:
                list(pool.map(run, jobs))
        print(f"data: {done[0]} answers, {done[1]} output tokens in {time.time() - t0:.0f} s -> "
              f"{out / 'data.jsonl'}")
    finally:
        server.close()
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# The SSM: a small Llama in PyTorch, written to GGUF as llama.cpp's convert script would.

def build_model(torch, cfg):
    nn = torch.nn
    F = torch.nn.functional

    class RMSNorm(nn.Module):
        def __init__(self, dim, eps):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(dim))
            self.eps = eps

        def forward(self, x):
            x32 = x.float()
            return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) \
                * self.weight

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            d, h, kv = cfg["dim"], cfg["heads"], cfg["kv_heads"]
            hd = d // h
            self.h, self.kv, self.hd = h, kv, hd
            self.attn_norm = RMSNorm(d, cfg["eps"])
            self.q = nn.Linear(d, h * hd, bias=False)
            self.k = nn.Linear(d, kv * hd, bias=False)
            self.v = nn.Linear(d, kv * hd, bias=False)
            self.o = nn.Linear(h * hd, d, bias=False)
            self.ffn_norm = RMSNorm(d, cfg["eps"])
            self.gate = nn.Linear(d, cfg["ffn"], bias=False)
            self.up = nn.Linear(d, cfg["ffn"], bias=False)
            self.down = nn.Linear(cfg["ffn"], d, bias=False)

        def forward(self, x, cos, sin):
            b, t, _ = x.shape
            y = self.attn_norm(x)
            q = self.q(y).view(b, t, self.h, self.hd).transpose(1, 2)
            k = self.k(y).view(b, t, self.kv, self.hd).transpose(1, 2)
            v = self.v(y).view(b, t, self.kv, self.hd).transpose(1, 2)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            x = x + self.o(a.transpose(1, 2).reshape(b, t, -1))
            y = self.ffn_norm(x)
            return x + self.down(F.silu(self.gate(y)) * self.up(y))

    def rope(x, cos, sin):
        # GGUF llama: rotation of adjacent pairs (2i, 2i + 1), frequency theta^(-2i / head_dim).
        xe, xo = x[..., 0::2], x[..., 1::2]
        return torch.stack((xe * cos - xo * sin, xe * sin + xo * cos), dim=-1).flatten(-2)

    class SSM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(cfg["vocab"], cfg["dim"])
            self.blocks = nn.ModuleList(Block() for _ in range(cfg["layers"]))
            self.norm = RMSNorm(cfg["dim"], cfg["eps"])
            hd = cfg["dim"] // cfg["heads"]
            inv = cfg["theta"] ** (-torch.arange(0, hd, 2, dtype=torch.float32) / hd)
            self.register_buffer("inv_freq", inv, persistent=False)

        def hidden(self, ids):
            t = ids.shape[1]
            ang = torch.arange(t, dtype=torch.float32)[:, None] * self.inv_freq[None, :]
            cos, sin = ang.cos(), ang.sin()
            x = self.embed(ids)
            for blk in self.blocks:
                x = blk(x, cos.to(x.dtype), sin.to(x.dtype))
            return self.norm(x)

        def logits(self, h):
            return h @ self.embed.weight.t()

    return SSM()


def is_gguf(path):
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


def llama2c_header(path):
    import numpy as np
    h = np.fromfile(path, dtype=np.int32, count=7)
    return {"dim": int(h[0]), "vocab": abs(int(h[5])), "context": int(h[6])}


def llm_embedding(model_path):
    """The LLM's token embedding, [vocab, dim] float32 (GGUF or llama2.c checkpoint)."""
    import numpy as np
    if not is_gguf(model_path):
        h = llama2c_header(model_path)
        return np.fromfile(model_path, dtype=np.float32, count=h["vocab"] * h["dim"],
                           offset=28).reshape(h["vocab"], h["dim"])
    import gguf
    e = gguf_tensors(gguf.GGUFReader(str(model_path)), {"token_embd.weight"})
    if not e:
        sys.exit(f"boost_tune: {model_path} has no token_embd.weight")
    return e["token_embd.weight"]


def gguf_tensors(reader, names=None):
    """A GGUF's tensors (those in `names`, or all) as float32 arrays of their logical shape."""
    import gguf
    import numpy as np
    from gguf.quants import dequantize
    out = {}
    for t in reader.tensors:
        if names is None or t.name in names:
            a = dequantize(t.data, gguf.GGMLQuantizationType(t.tensor_type))
            shape = tuple(int(x) for x in reversed(t.shape.tolist()))
            out[t.name] = np.asarray(a, dtype=np.float32).reshape(shape)
    return out


def llm_hparams(model_path):
    if not is_gguf(model_path):  # llama2.c: RoPE base 10000, eps 1e-5
        return {"theta": 10000.0, "eps": 1e-5, "context": llama2c_header(model_path)["context"]}
    import gguf
    r = gguf.GGUFReader(str(model_path))
    arch = r.fields["general.architecture"].contents()

    def get(key, default=None):
        f = r.fields.get(f"{arch}.{key}")
        return f.contents() if f is not None else default
    return {"theta": float(get("rope.freq_base", 10000.0)),
            "eps": float(get("attention.layer_norm_rms_epsilon", 1e-5)),
            "context": int(get("context_length", 2048))}


def llm_layers(model_path, n):
    """The LLM's first `n` layers (and final norm) as float32 arrays, for --init-layers."""
    import gguf
    r = gguf.GGUFReader(str(model_path))
    arch = r.fields["general.architecture"].contents()
    out = {"heads": int(r.fields[f"{arch}.attention.head_count"].contents()),
           "kv_heads": int(r.fields[f"{arch}.attention.head_count_kv"].contents()),
           "ffn": int(r.fields[f"{arch}.feed_forward_length"].contents())}
    wanted = {"output_norm.weight"} | {f"blk.{i}.{k}" for i in range(n) for k in (
        "attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
        "attn_output.weight", "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight",
        "ffn_down.weight")}
    out.update(gguf_tensors(r, wanted))
    missing = wanted - set(out)
    if missing:
        sys.exit(f"boost_tune: {model_path} lacks {sorted(missing)[:3]}")
    return out


def load_data(path, split, seed):
    """The answers of `split`, in make_prompts(seed) order (greedy before sampled), whatever
    order the data run finished them in: training and evaluation do not depend on it."""
    index = {p["prompt"]: i for i, p in enumerate(make_prompts(seed))}
    recs = []
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if r["split"] == split and r["output_ids"]:
                recs.append(r)
    recs.sort(key=lambda r: (index.get(r["prompt"], len(index)), r["prompt"], r["temperature"]))
    return recs


def draft_vocabulary(recs, size):
    """The draft's tokens: the `size` most frequent of the LLM's outputs and prompts (outputs
    first: they are what the draft must guess), then one row for every other token (-1)."""
    from collections import Counter
    out, prompt = Counter(), Counter()
    for r in recs:
        out.update(r["output_ids"])
        prompt.update(r["prompt_ids"])
    ranked = [t for t, _ in out.most_common()]
    seen = set(ranked)
    ranked += [t for t, _ in prompt.most_common() if t not in seen]
    table = sorted(ranked[:size])
    covered = sum(c for t, c in out.items() if t in set(table)) / max(sum(out.values()), 1)
    return table + [-1], covered


def make_examples(recs, max_len, to_row, other):
    """Per answer: its tokens as draft rows (prompt + output, truncated) and, per output
    position, the LLM's top-k candidates that the draft vocabulary holds (rows, log-probs),
    whether the LLM's own choice is among them, and its key (record index, output index: the
    same position whatever the draft vocabulary, for the boosting weights)."""
    ex = []
    for ri, r in enumerate(recs):
        ids = (r["prompt_ids"] + r["output_ids"])[:max_len]
        n = len(r["prompt_ids"])
        pos, tgt, reachable, keys = [], [], [], []
        for j, top in enumerate(r["top"]):
            p = n + j - 1  # the hidden state that predicts output token j
            if p + 1 >= len(ids) or p < 0:
                break
            top = top or [[r["output_ids"][j], 0.0]]
            cand = [[int(to_row[t]), lp] for t, lp in top if to_row[t] != other]
            if not cand:
                continue
            pos.append(p)
            tgt.append(cand)
            reachable.append(to_row[r["output_ids"][j]] == cand[0][0])
            keys.append((ri, j))
        if pos:
            ex.append({"ids": [int(to_row[t]) for t in ids], "pos": pos, "top": tgt,
                       "reachable": reachable, "keys": keys})
    return ex


def batch_tensors(torch, batch, weights):
    t = max(len(e["ids"]) for e in batch)
    ids = torch.zeros(len(batch), t, dtype=torch.long)
    rows, cand, prob, w = [], [], [], []
    for b, e in enumerate(batch):
        ids[b, : len(e["ids"])] = torch.tensor(e["ids"])
        for k, (p, top) in enumerate(zip(e["pos"], e["top"])):
            rows.append(b * t + p)
            c = [a[0] for a in top][:TOP_K]
            lp = torch.tensor([a[1] for a in top][:TOP_K])
            pr = torch.softmax(lp, 0)  # renormalised top-k
            c += [c[0]] * (TOP_K - len(c))
            pr = torch.cat([pr, torch.zeros(TOP_K - len(pr))])
            cand.append(c)
            prob.append(pr)
            w.append(weights(e["keys"][k]) if weights is not None else 1.0)
    return (ids, torch.tensor(rows), torch.tensor(cand), torch.stack(prob),
            torch.tensor(w, dtype=torch.float32))


def batches(examples, tokens_per_batch, rng):
    order = sorted(examples, key=lambda e: len(e["ids"]))
    out, cur, longest = [], [], 0
    for e in order:
        longest2 = max(longest, len(e["ids"]))
        if cur and longest2 * (len(cur) + 1) > tokens_per_batch:
            out.append(cur)
            cur, longest2 = [], len(e["ids"])
        cur.append(e)
        longest = longest2
    if cur:
        out.append(cur)
    rng.shuffle(out)
    return out


BLOCK_WEIGHTS = (("attn_norm", "attn_norm"), ("q", "attn_q"), ("k", "attn_k"), ("v", "attn_v"),
                 ("o", "attn_output"), ("ffn_norm", "ffn_norm"), ("gate", "ffn_gate"),
                 ("up", "ffn_up"), ("down", "ffn_down"))


def copy_weights(torch, model, tensors):
    """The final norm and every block's weights from `tensors` (GGUF names -> float32 arrays)."""
    t = lambda name: torch.from_numpy(tensors[name].copy())  # noqa: E731
    with torch.no_grad():
        model.norm.weight.copy_(t("output_norm.weight"))
        for i, b in enumerate(model.blocks):
            for attr, name in BLOCK_WEIGHTS:
                getattr(b, attr).weight.copy_(t(f"blk.{i}.{name}.weight"))


def row_map(table, llm_vocab):
    """LLM token id -> row of a draft vocabulary `table` (its last row: every other token)."""
    import numpy as np
    to_row = np.full(llm_vocab, len(table) - 1, dtype=np.int64)
    to_row[table[:-1]] = np.arange(len(table) - 1)
    return to_row


def train_one(torch, cfg, examples, weights, args, init_embed, index, layers=None, heldout=None):
    torch.manual_seed(args.seed + index)
    model = build_model(torch, cfg)
    with torch.no_grad():
        model.embed.weight.copy_(torch.from_numpy(init_embed))
    if layers is not None:
        copy_weights(torch, model, layers)
    else:
        with torch.no_grad():
            for blk in model.blocks:  # small residual branches at the start
                blk.o.weight.mul_(0.5)
                blk.down.weight.mul_(0.5)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.95))
    rng = random.Random(args.seed + index)
    steps, step, t0 = args.steps, 0, time.time()
    while step < steps:
        for batch in batches(examples, args.batch_tokens, rng):
            if step >= steps:
                break
            lr = args.lr * min(1.0, (step + 1) / 30) * 0.5 * (1 + math.cos(math.pi * step / steps))
            for g in opt.param_groups:
                g["lr"] = lr
            ids, rows, cand, prob, w = batch_tensors(torch, batch, weights)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
                h = model.hidden(ids).reshape(-1, cfg["dim"])[rows]
                logits = model.logits(h).float()
            logq = torch.log_softmax(logits, -1)
            loss_pos = -(prob * logq.gather(1, cand)).sum(-1)
            loss = (loss_pos * w).sum() / w.sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
            if step % args.log_every == 0 or step == steps:
                top1 = (logits.argmax(-1) == cand[:, 0]).float().mean().item()
                print(f"  ssm {index} step {step}/{steps} loss {loss.item():.3f} "
                      f"top-1 {top1:.3f} lr {lr:.2e} ({time.time() - t0:.0f} s)", flush=True)
            if heldout and (step % args.heldout_every == 0 or step == steps):
                print(f"  ssm {index} step {step}/{steps} held-out top-1 "
                      f"{top1_rate(torch, model, cfg, heldout, args):.3f}", flush=True)
    return model


def agreement(torch, model, cfg, examples, args):
    """The keys of the target positions where the SSM's top-1 is the LLM's top-1."""
    hits = set()
    model.eval()
    with torch.no_grad():
        for batch in batches(examples, args.batch_tokens, random.Random(0)):
            ids, rows, cand, _, _ = batch_tensors(torch, batch, None)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
                h = model.hidden(ids).reshape(-1, cfg["dim"])[rows]
                am = model.logits(h).float().argmax(-1)
            ok = (am == cand[:, 0]).tolist()
            k = 0
            for e in batch:
                for a, b, key in zip(ok[k: k + len(e["pos"])], e["reachable"], e["keys"]):
                    if a and b:
                        hits.add(key)
                k += len(e["pos"])
    model.train()
    return hits


def top1_rate(torch, model, cfg, examples, args):
    """The share of the LLM's output positions where the SSM's top-1 is the LLM's token."""
    hits = agreement(torch, model, cfg, examples, args)
    return len(hits) / max(sum(len(e["pos"]) for e in examples), 1)


def vocab_fingerprint(fields):
    """VocabFingerprint (src/tokenizer/tokenizer.h) of the tokenizer in a GGUF's `fields`: FNV-1a
    64 over the size, BOS and EOS ids and every piece (length-prefixed) as the daemon holds it
    (SentencePiece's U+2581 read as a space)."""
    import struct
    h = 1469598103934665603

    def mix(data):
        nonlocal h
        for b in data:
            h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF

    def mix_int(v):
        mix(struct.pack("<q", v))

    def get(key, default):
        return int(fields[key].contents()) if key in fields else default

    tokens = fields["tokenizer.ggml.tokens"].contents()
    sentencepiece = fields["tokenizer.ggml.model"].contents() == "llama"
    mix_int(len(tokens))
    mix_int(get("tokenizer.ggml.bos_token_id", -1))
    mix_int(get("tokenizer.ggml.eos_token_id", -1))
    for t in tokens:
        piece = (t.replace("\u2581", " ") if sentencepiece else t).encode("utf-8")
        mix_int(len(piece))
        mix(piece)
    return h


def load_ssm(torch, path, llm_vocab):
    """An SSM this script exported (train --boost-from): the model (weights dequantised), its
    config and its draft vocabulary table."""
    import gguf
    try:
        r = gguf.GGUFReader(str(path))
    except (OSError, ValueError) as e:
        sys.exit(f"boost_tune: cannot read {path}: {e}")
    f = r.fields
    arch = f["general.architecture"].contents()
    if arch != "llama" or "specinfer.draft_token_ids" not in f:
        sys.exit(f"boost_tune: {path} is not an SSM made by this script (no draft vocabulary)")
    table = [int(t) for t in f["specinfer.draft_token_ids"].contents()]
    if table[-1] != -1 or max(table[:-1]) >= llm_vocab:
        sys.exit(f"boost_tune: {path}'s draft vocabulary does not fit the LLM's {llm_vocab} tokens")

    def get(key):
        return f[f"{arch}.{key}"].contents()
    cfg = {"layers": int(get("block_count")), "heads": int(get("attention.head_count")),
           "kv_heads": int(get("attention.head_count_kv")), "ffn": int(get("feed_forward_length")),
           "vocab": len(table), "dim": int(get("embedding_length")),
           "theta": float(get("rope.freq_base")), "eps": float(get("attention.layer_norm_rms_epsilon")),
           "context": int(get("context_length"))}
    tensors = gguf_tensors(r)
    model = build_model(torch, cfg)
    with torch.no_grad():
        model.embed.weight.copy_(torch.from_numpy(tensors["token_embd.weight"].copy()))
    copy_weights(torch, model, tensors)
    model.eval()
    return model, cfg, table


def export_gguf(model, cfg, llm_path, out_path, name, table, embed_tokenizer=False,
                quant="Q8_0"):
    import gguf
    import numpy as np
    from gguf.quants import quantize
    w = gguf.GGUFWriter(str(out_path), "llama")
    w.add_name(name)
    w.add_context_length(cfg["context"])
    w.add_embedding_length(cfg["dim"])
    w.add_block_count(cfg["layers"])
    w.add_feed_forward_length(cfg["ffn"])
    w.add_head_count(cfg["heads"])
    w.add_head_count_kv(cfg["kv_heads"])
    w.add_rope_freq_base(cfg["theta"])
    w.add_layer_norm_rms_eps(cfg["eps"])
    w.add_vocab_size(cfg["vocab"])
    w.add_rope_dimension_count(cfg["dim"] // cfg["heads"])
    # Row r of the embedding / output is the LLM's token table[r] (-1: every other token).
    w.add_array("specinfer.draft_token_ids", [int(t) for t in table])
    # The fingerprint of the LLM's vocabulary (the daemon refuses the draft for an LLM whose
    # tokenizer has another), or with --embed-tokenizer the tokenizer itself, piece for piece
    # (1.7 MiB for SmolLM2). A llama2.c LLM has none inside: the daemon checks the size alone.
    if is_gguf(llm_path):
        fields = gguf.GGUFReader(str(llm_path)).fields
        if embed_tokenizer:
            for field in fields.values():
                if not field.name.startswith("tokenizer."):
                    continue
                vtype = field.types[0]
                sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
                w.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
        elif "tokenizer.ggml.tokens" in fields:
            w.add_uint64("specinfer.vocab_fingerprint", vocab_fingerprint(fields))

    qtype = gguf.GGMLQuantizationType[quant]

    def mat(name, t):
        a = t.detach().float().numpy()
        if a.shape[-1] % 32 == 0:
            w.add_tensor(name, quantize(a, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, a.astype(np.float32))

    def vec(name, t):
        w.add_tensor(name, t.detach().float().numpy().astype(np.float32))

    mat("token_embd.weight", model.embed.weight)
    vec("output_norm.weight", model.norm.weight)
    for i, b in enumerate(model.blocks):
        p = f"blk.{i}."
        vec(p + "attn_norm.weight", b.attn_norm.weight)
        mat(p + "attn_q.weight", b.q.weight)
        mat(p + "attn_k.weight", b.k.weight)
        mat(p + "attn_v.weight", b.v.weight)
        mat(p + "attn_output.weight", b.o.weight)
        vec(p + "ffn_norm.weight", b.ffn_norm.weight)
        mat(p + "ffn_gate.weight", b.gate.weight)
        mat(p + "ffn_up.weight", b.up.weight)
        mat(p + "ffn_down.weight", b.down.weight)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def cmd_train(args):
    import numpy as np
    import torch
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    hp = llm_hparams(args.model)
    emb = llm_embedding(args.model)
    llm_vocab, llm_dim = emb.shape
    recs = load_data(Path(args.data) / "data.jsonl", "train", args.seed)
    table, covered = draft_vocabulary(recs, min(args.draft_vocab, llm_vocab))
    other = len(table) - 1
    to_row = row_map(table, llm_vocab)
    print(f"draft vocabulary: {other} of the LLM's {llm_vocab} tokens and one for the rest; "
          f"they cover {covered:.1%} of the LLM's output tokens")
    rest = np.ones(llm_vocab, dtype=bool)
    rest[table[:-1]] = False
    layers = None
    if args.init_layers > 0:
        # The LLM's own first layers, final norm and embedding rows, then distilled.
        layers = llm_layers(args.model, args.init_layers)
        dim = llm_dim
        proj = emb
        cfg = {"layers": args.init_layers, "heads": layers["heads"],
               "kv_heads": layers["kv_heads"], "ffn": layers["ffn"]}
    else:
        dim = min(args.dim, llm_dim)
        # The LLM's embedding on its top `dim` principal directions (similar tokens stay
        # similar).
        _, _, vt = np.linalg.svd(emb - emb.mean(0), full_matrices=False)
        proj = (emb @ vt[:dim].T).astype(np.float32)
        heads = max(dim // 64, 1)
        cfg = {"layers": args.layers, "heads": heads, "kv_heads": max(heads // 2, 1),
               "ffn": args.ffn or 3 * dim}
    # The table's tokens' rows; the "other" row is the mean of the rest.
    init = np.concatenate([proj[table[:-1]], proj[rest].mean(0, keepdims=True)
                           if rest.any() else np.zeros((1, dim), np.float32)]).astype(np.float32)
    if layers is None:
        init *= 0.02 * math.sqrt(dim) / max(np.sqrt((init ** 2).sum(1)).mean(), 1e-6)
    cfg.update({"vocab": len(table), "dim": dim, "theta": hp["theta"], "eps": hp["eps"],
                "context": hp["context"]})
    examples = make_examples(recs, args.max_len, to_row, other)
    n_pos = sum(len(e["pos"]) for e in examples)
    print(f"train: {len(examples)} answers, {n_pos} target positions; SSM config {cfg}")
    heldout = None
    if args.heldout_every > 0:
        # Greedy answers to the held-out topics: how often the SSM's first guess is right there
        # (a proxy for acceptance, without running the daemon). Positions whose token the draft
        # vocabulary lacks count as misses.
        held = [r for r in load_data(Path(args.data) / "data.jsonl", "heldout", args.seed)
                if r["temperature"] == 0.0]
        heldout = make_examples(held, args.max_len, to_row, other)
    # The positions (record, output index) that earlier SSMs of the loop get right.
    hit_any = set()
    first = 0
    for path in args.boost_from:
        # An SSM trained before (its own draft vocabulary and shape): its hits on this data
        # down-weight the new SSMs' positions, as if the loop had just trained it.
        model, own_cfg, own_table = load_ssm(torch, path, llm_vocab)
        own = make_examples(recs, args.max_len, row_map(own_table, llm_vocab),
                            len(own_table) - 1)
        hit_any |= agreement(torch, model, own_cfg, own, args)
        print(f"boost: SSM {first} is {path} ({own_cfg['layers']} layers x {own_cfg['dim']}, "
              f"{len(own_table) - 1} draft tokens)", flush=True)
        first += 1
    paths = []
    for k in range(first, first + args.ssms):
        weights = None
        if k > 0:
            weights = lambda key: BOOST_HIT_WEIGHT if key in hit_any else 1.0  # noqa: E731
            print(f"boost: SSM {k} down-weights the {len(hit_any) / max(n_pos, 1):.1%} of "
                  "positions an earlier SSM gets", flush=True)
        model = train_one(torch, cfg, examples, weights, args, init, k, layers, heldout)
        hit_any |= agreement(torch, model, cfg, examples, args)
        path = out / f"ssm-{k}.gguf"
        export_gguf(model, cfg, args.model, path, f"specinfer boost-tuned SSM {k}", table,
                    args.embed_tokenizer, args.quant)
        paths.append(path)
        print(f"exported {path} ({path.stat().st_size / 2**20:.2f} MiB)")
    with open(out / "config.json", "w") as f:
        json.dump({"ssm": cfg, "args": {k: v for k, v in vars(args).items() if k != "func"}}, f,
                  indent=1, default=str)
    return paths


# ---------------------------------------------------------------------------------------------
# Evaluation on held-out prompts, through the daemon itself.

def run_generate(model, prompt, drafts, tree, max_tokens, threads, extra, budget, temperature,
                 seed):
    cmd = [str(specinfer_binary()), "generate", "--model", str(model), "--prompt", prompt,
           "--max-tokens", str(max_tokens), "--json", "--threads", str(threads),
           "--temperature", str(temperature), "--seed", str(seed), "--spec-budget", budget] + extra
    for d in drafts:
        cmd += ["--draft", f"model:{d}"]
    if drafts:
        cmd += ["--tree", tree]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"boost_tune: specinfer generate failed: {r.stderr.strip()[-500:]}")
    return json.loads(r.stdout)


def cmd_eval(args):
    recs = load_data(Path(args.data) / "data.jsonl", "heldout", args.seed)
    recs = [r for r in recs if r["temperature"] == 0.0][: args.eval_prompts]
    ssms = [Path(s) for s in args.ssm]
    configs = [("no draft", [])] + [(s.name, [s]) for s in ssms]
    if len(ssms) > 1:
        configs.append(("merged", ssms))
    extra = ["--tokenizer", str(args.tokenizer)] if args.tokenizer else []
    if args.chat_template != "none":
        extra.append("--chat")
    how = f"temperature {args.temperature}" if args.temperature > 0 else "greedy"
    print(f"eval: {len(recs)} held-out prompts, {how}, {args.max_tokens} tokens, tree {args.tree},"
          f" --spec-budget {args.spec_budget}, {args.repeat} round(s)")
    # Prompt by prompt, every configuration in turn (the order rotating), so that a slow spell of
    # the machine falls on all of them alike; tok/s is the median over the rounds.
    # runs[name][round]: (prompt, generate's JSON) per prompt.
    runs = {name: [[] for _ in range(args.repeat)] for name, _ in configs}
    for rnd in range(args.repeat):
        for i, r in enumerate(recs):
            k = (i + rnd) % len(configs)
            for name, drafts in configs[k:] + configs[:k]:
                runs[name][rnd].append((r["prompt"], run_generate(
                    args.model, r["prompt"], drafts, args.tree, args.max_tokens, args.threads,
                    extra, args.spec_budget, args.temperature, args.seed)))
    base_text = {p: j["tokens"] for p, j in runs["no draft"][0]}
    base_rate = None
    for name, drafts in configs:
        gen = passes = decode_s = draft_s = 0
        acc_depth = None
        # Greedy: every round's output must be plain decoding's. (Sampled: the text is a draw;
        # its distribution is the LLM's, tests/spec.)
        same = args.temperature > 0 or not drafts or all(
            base_text[p] == j["tokens"] for rnd in runs[name] for p, j in rnd)
        rates = [sum(len(j["tokens"]) for _, j in rnd) /
                 max(sum(j["timing"]["decode_seconds"] for _, j in rnd), 1e-9)
                 for rnd in runs[name]]
        for _, j in runs[name][0]:  # counts from the first round (the others repeat it)
            sp = j["speculation"]
            gen += len(j["tokens"])
            passes += sp["llm_passes"] if drafts else len(j["tokens"])
            decode_s += j["timing"]["decode_seconds"]
            draft_s += sp.get("draft_seconds", 0.0)
            a = sp.get("accepted_at_depth") or []
            acc_depth = a if acc_depth is None else [x + y for x, y in
                                                     zip(acc_depth + [0] * len(a), a + [0] * len(acc_depth))]
        rate = sorted(rates)[len(rates) // 2]
        base_rate = rate if base_rate is None else base_rate
        tpp = gen / max(passes, 1)
        per_pass = [round(x / max(passes, 1), 3) for x in (acc_depth or [])]
        while per_pass and per_pass[-1] == 0:
            per_pass.pop()
        ms = 1e3 / max(passes, 1)
        print(f"  {name:12s} tokens/pass {tpp:.2f}  decode {rate:.1f} tok/s"
              + (f" ({rate / base_rate:.2f}x)" if drafts else "")
              + f"  per pass: {decode_s * ms:.2f} ms, of it drafting {draft_s * ms:.2f} ms"
              + (f"  accepted per pass by depth {per_pass}" if drafts else "")
              + ("" if same else "  OUTPUT DIFFERS FROM PLAIN DECODING"), flush=True)
        if not same:
            sys.exit("boost_tune: speculative output differs from plain decoding")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    def common(p):
        p.add_argument("--model", required=True, help="the LLM (GGUF)")
        p.add_argument("--tokenizer", help="tokenizer file, for models without one inside")
        p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
        p.add_argument("--seed", type=int, default=1234)

    def data_args(p):
        p.add_argument("--prompts", type=int, default=None, help="train prompts (default: all)")
        p.add_argument("--max-tokens", type=int, default=160)
        p.add_argument("--concurrency", type=int, default=16)
        p.add_argument("--no-sampled", dest="sampled", action="store_false",
                       help="greedy answers only (default: greedy and one sampled at T=0.8)")
        p.add_argument("--chat-template", default=None,
                       help="'none': prompts as plain text (models without a chat template)")

    def train_args(p):
        p.add_argument("--ssms", type=int, default=3)
        p.add_argument("--layers", type=int, default=4)
        p.add_argument("--dim", type=int, default=256)
        p.add_argument("--init-layers", type=int, default=0,
                       help="K > 0: each SSM starts as the LLM's first K layers (its width), "
                            "embedding rows and final norm (GGUF LLMs)")
        p.add_argument("--draft-vocab", type=int, default=8192,
                       help="tokens the SSMs can propose (the most frequent of the LLM's outputs)")
        p.add_argument("--ffn", type=int, default=0, help="0: 3 x dim")
        p.add_argument("--steps", type=int, default=360)
        p.add_argument("--lr", type=float, default=3e-3)
        p.add_argument("--batch-tokens", type=int, default=8192)
        p.add_argument("--max-len", type=int, default=320)
        p.add_argument("--log-every", type=int, default=50)
        p.add_argument("--embed-tokenizer", action="store_true",
                       help="copy the LLM's tokenizer into each SSM (default: its fingerprint)")
        p.add_argument("--heldout-every", type=int, default=0,
                       help="N > 0: every N steps, the SSM's top-1 agreement on the held-out "
                            "greedy answers")
        p.add_argument("--no-bf16", dest="bf16", action="store_false")
        p.add_argument("--quant", default="Q8_0", choices=["Q8_0", "Q4_1", "Q4_0"],
                       help="block type of the exported matrices (norms stay F32)")
        p.add_argument("--boost-from", nargs="+", default=[], metavar="GGUF",
                       help="SSMs trained before, taken as the loop's first SSMs (not retrained):"
                            " the new ones are boosted against them and numbered after them")

    def eval_args(p):
        p.add_argument("--chat-template", default=None, help="'none': prompts as plain text")
        p.add_argument("--tree", default="1,1,3,1,1")
        p.add_argument("--temperature", type=float, default=0.0,
                       help="0: greedy (outputs checked equal to plain decoding); else sampled")
        p.add_argument("--spec-budget", default="static", choices=["static", "auto", "dynamic"],
                       help="static (default): the full tree every step, as the paper counts "
                            "tokens per pass; auto/dynamic: what the server does by default")
        p.add_argument("--eval-prompts", type=int, default=24)
        p.add_argument("--max-tokens", type=int, default=128)
        p.add_argument("--repeat", type=int, default=1,
                       help="rounds over the prompts (tok/s: the median round)")

    p = sub.add_parser("data", help="the LLM's answers to the prompt set")
    common(p)
    data_args(p)
    p.add_argument("--out", required=True)
    p = sub.add_parser("train", help="train and export the SSMs")
    common(p)
    train_args(p)
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p = sub.add_parser("eval", help="tokens per pass on held-out prompts")
    common(p)
    eval_args(p)
    p.add_argument("--data", required=True)
    p.add_argument("--ssm", nargs="+", required=True)
    args = ap.parse_args()
    {"data": cmd_data, "train": cmd_train, "eval": cmd_eval}[args.cmd](args)


if __name__ == "__main__":
    main()
