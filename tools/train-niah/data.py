"""Reading the files tools/niah-train-data writes (format in its train_data.h), running that tool
for the next shard in the background, and the vocabulary's id -> text decoding."""
import json
import os
import struct
import subprocess

import numpy as np

INDEX_DTYPE = np.dtype([("first", "<u8"), ("n", "<u4"), ("answer_start", "<u4"), ("batch", "<u4"),
                        ("task", "<u2"), ("n_expected", "<u2"), ("depth", "<f4"), ("target", "<u4")])
HEADER = struct.Struct("<8sIIIIQ")

TASKS = ["niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
         "niah_multikey_3", "niah_multivalue", "niah_multiquery"]


class SampleFile:
    def __init__(self, path):
        with open(path, "rb") as f:
            magic, version, n_samples, n_batches, n_vocab, n_tokens = HEADER.unpack(f.read(HEADER.size))
            if magic != b"NIAHTRN1" or version != 1:
                raise ValueError("%s: not a NIAHTRN1 v1 file" % path)
            self.index = np.frombuffer(f.read(INDEX_DTYPE.itemsize * n_samples), dtype=INDEX_DTYPE)
            self.tokens = np.frombuffer(f.read(2 * n_tokens), dtype="<u2")
        self.n_batches, self.n_vocab = n_batches, n_vocab
        # Samples of one batch are contiguous (the tool writes them in batch order).
        b = self.index["batch"]
        self.batch_start = np.searchsorted(b, np.arange(n_batches), side="left")
        self.batch_end = np.searchsorted(b, np.arange(n_batches), side="right")

    def sample(self, i):
        r = self.index[i]
        return self.tokens[r["first"]: r["first"] + r["n"]], int(r["answer_start"])

    def batch_rows(self, b):
        return range(int(self.batch_start[b]), int(self.batch_end[b]))


def make_batch(sf, rows, pad_id, multiple=64):
    """Right-padded inputs and targets, a mask of real positions and a mask of answer
    positions (the answer and its EOS). Padding on the right never changes what causal
    attention computes for real positions."""
    seqs = [sf.sample(i) for i in rows]
    T = max(len(t) for t, _ in seqs) - 1
    T = (T + multiple - 1) // multiple * multiple
    x = np.full((len(seqs), T), pad_id, dtype=np.int64)
    y = np.full((len(seqs), T), pad_id, dtype=np.int64)
    real = np.zeros((len(seqs), T), dtype=np.float32)
    ans = np.zeros((len(seqs), T), dtype=np.float32)
    for r, (t, a) in enumerate(seqs):
        n = len(t) - 1
        x[r, :n] = t[:-1]
        y[r, :n] = t[1:]
        real[r, :n] = 1.0
        # Target position p predicts token p + 1: answer tokens are targets a-1 .. n-1.
        ans[r, a - 1: n] = 1.0
    return x, y, real, ans


def make_copy_batch(step, seed, n_text_tokens, bos, min_len, max_len, tokens_per_batch, multiple=64):
    """A warm-up batch that only copying can solve: BOS, L random tokens, the same L tokens
    again; the loss mask covers the repeat. It grows the induction heads (attend to the token
    after the earlier copy of the current token) that niah answers need, without the needle's
    1-in-T dilution of the attention signal. A pure function of (seed, step), so resuming a
    checkpoint replays the same batches; returns make_batch's four arrays."""
    rng = np.random.default_rng([seed, step])
    L = int(rng.integers(min_len, max_len + 1))
    B = max(1, tokens_per_batch // (2 * L + 1))
    T = (2 * L + multiple - 1) // multiple * multiple
    body = rng.integers(0, n_text_tokens, size=(B, L))
    seq = np.concatenate([np.full((B, 1), bos), body, body], axis=1)  # 2L + 1 tokens
    x = np.full((B, T), bos, dtype=np.int64)
    y = np.full((B, T), bos, dtype=np.int64)
    x[:, : 2 * L] = seq[:, :-1]
    y[:, : 2 * L] = seq[:, 1:]
    real = np.zeros((B, T), dtype=np.float32)
    real[:, : 2 * L] = 1.0
    ans = np.zeros((B, T), dtype=np.float32)
    ans[:, L + 1: 2 * L] = 1.0  # targets after the first repeated token (that one is a guess)
    return x, y, real, ans


class ShardMaker:
    """Runs `niah-train-data gen` for shard files in the background, one at a time."""

    def __init__(self, tool, vocab, work_dir, threads, tokens_per_batch, batches_per_shard, base_seed):
        self.tool, self.vocab, self.work_dir = tool, vocab, work_dir
        self.threads, self.tpb, self.bps, self.base_seed = threads, tokens_per_batch, batches_per_shard, base_seed
        self.pending = {}  # path -> Popen
        os.makedirs(work_dir, exist_ok=True)

    def path(self, stage_index, shard):
        return os.path.join(self.work_dir, "s%d_%05d.bin" % (stage_index, shard))

    def start(self, stage_index, stage, shard):
        path = self.path(stage_index, shard)
        if os.path.exists(path) or path in self.pending:
            return path
        # Seeds: disjoint per (stage, shard) and far from the gate's eval seeds (42 + s).
        seed = self.base_seed + 1000003 * (stage_index + 1) + shard
        cmd = [self.tool, "gen", "--vocab", self.vocab, "--out", path, "--tasks", stage["tasks"],
               "--min-len", str(stage["min_len"]), "--max-len", str(stage["max_len"]),
               "--tokens-per-batch", str(stage.get("tokens_per_batch", self.tpb)), "--batches", str(self.bps), "--seed", str(seed),
               "--threads", str(self.threads)]
        self.pending[path] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        return path

    def ready(self, path):
        p = self.pending.get(path)
        return p.poll() is not None if p is not None else os.path.exists(path)

    def wait(self, path):
        p = self.pending.pop(path, None)
        if p is not None:
            out, _ = p.communicate()
            if p.returncode != 0:
                raise RuntimeError("niah-train-data gen failed: %s" % out)
            return out.strip()
        return ""

    def drop(self, path):
        if path not in self.pending and os.path.exists(path):
            os.remove(path)


def byte_decoder():
    """GPT-2's byte-level map, inverted: token character -> byte."""
    printable = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    m, extra = {}, 0
    for b in range(256):
        if b in printable:
            m[chr(b)] = b
        else:
            m[chr(256 + extra)] = b
            extra += 1
    return m


class Vocab:
    def __init__(self, path):
        with open(path) as f:
            j = json.load(f)
        self.json = j
        self.tokens, self.types = j["tokens"], j["token_type"]
        self.bos, self.eos = j["bos"], j["eos"]
        dec = byte_decoder()
        self.bytes = [b"" if t == 3 else bytes(dec[c] for c in s) for s, t in zip(self.tokens, self.types)]

    def decode(self, ids):
        return b"".join(self.bytes[i] for i in ids).decode("utf-8", errors="replace")


def answer_end(text):
    """As quality/niah_runner.cpp: a newline ends the answer once non-space text has begun."""
    begun = False
    for i, c in enumerate(text):
        if c == "\n" and begun:
            return i
        if c not in " \n\t\r":
            begun = True
    return len(text)


def niah_score(answer, expected):
    """RULER string-match-all, as quality/niah.cpp's niah_score."""
    a = answer.lower()
    return 100.0 * sum(1 for e in expected if e.lower() in a) / len(expected) if expected else 0.0
