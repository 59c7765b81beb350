#!/usr/bin/env python3
"""Trains spillway's test model: a small Llama that genuinely retrieves needles (issue 7), on
niah prompts made by our own generator and tokenizer (tools/niah-train-data), with a
curriculum, resumable across device calls, and exports it to a llama GGUF.

    python3 tools/train-niah/train.py --tool build-train/bin/niah-train-data --out-dir OUT \
        [--resume DIR_WITH_CKPT] --time-budget 540

Everything about where training is in the curriculum follows from the global step, and every
data shard is a deterministic function of (stage, shard), so a checkpoint holds only the
weights, the optimizer and the step. docs/test-model.md has the commands per device call.
"""
import argparse
import glob
import io
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import data as D  # noqa: E402
import export as E  # noqa: E402
from model import Config, Llama  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ALL = ("single_1:3,single_2:3,single_3:3,multikey_1:1,multikey_2:1,multikey_3:1,multivalue:1,multiquery:1")
SINGLE = "single_1:1,single_2:1,single_3:1"
# The curriculum. A stage ends at "steps", at "seconds" (wall time in this call) or once the
# answer loss drops below "until" (stage_done); "lr_scale" scales the peak lr. The smoke test sat at chance for 800 steps on
# single-needle prompts: a needle is 1 of T tokens, so the attention signal that would grow a
# copying circuit is diluted T-fold. Hence a copy warm-up first (random tokens repeated: only
# induction heads solve it), then single needles at short lengths, then longer contexts up to
# 8k with all tasks, singles weighted up (the goal is single-needle retrieval at 4k/8k). Every
# stage keeps short prompts in its range so early skills are not lost. Times are for one
# ~560 s call on the H200 (docs/test-model.md).
STAGES = [
    dict(name="copy", kind="copy", steps=3000, seconds=45, until=0.5, min_len=16, max_len=96, tokens_per_batch=16384),
    dict(name="single-short", steps=4000, seconds=40, until=0.1, min_steps=200, tasks=SINGLE, min_len=128, max_len=512,
         tokens_per_batch=16384),
    dict(name="all-1k", steps=20000, seconds=40, tasks=ALL, min_len=192, max_len=1024, tokens_per_batch=32768),
    dict(name="all-2k", steps=20000, seconds=45, tasks=ALL, min_len=256, max_len=2048),
    dict(name="all-4k", steps=20000, seconds=70, tasks=ALL, min_len=512, max_len=4096),
    dict(name="all-8k", steps=40000, seconds=400, tasks=ALL, min_len=1024, max_len=8192),
]
CKPT_PART = 15 * 1024 * 1024  # files come back from the GPU machine only up to 16 MiB each


def log(out_dir, msg):
    line = time.strftime("%H:%M:%S ") + msg
    print(line, flush=True)
    with open(os.path.join(out_dir, "train.log"), "a") as f:
        f.write(line + "\n")


def stage_done(stage, steps_in, seconds_in, answer_loss):
    """A stage ends at its step cap, at its time cap ("seconds": wall time of this stage in
    this call, so that one call of fixed length always reaches the long stages), or early
    once the answer loss of the last log window is below "until" (a skill has formed)."""
    if steps_in >= stage["steps"]:
        return "steps"
    if "seconds" in stage and seconds_in >= stage["seconds"]:
        return "seconds"
    if "until" in stage and steps_in >= stage.get("min_steps", 50) and answer_loss is not None and answer_loss < stage["until"]:
        return "answer loss %.3f < %.3f" % (answer_loss, stage["until"])
    return ""


def lr_at(step, peak, warmup, time_left, cooldown_s, floor=0.1):
    """Linear warmup, then constant; the last cooldown_s seconds of a call's training (when
    it is the last call) decay linearly to floor x peak. Time-based, because stages end by
    time or by loss and the number of steps is not known in advance."""
    if step < warmup:
        return peak * (step + 1) / warmup
    if cooldown_s > 0 and time_left < cooldown_s:
        return peak * max(floor, time_left / cooldown_s)
    return peak


def save_checkpoint(out_dir, model, opt, step, args, history, stage_starts):
    # Adam's moments as bf16 halve the checkpoint (it must come back in <= 16 MiB parts and
    # travel again as carried files); the weights stay f32.
    osd = opt.state_dict()
    for st in osd["state"].values():
        for k in ("exp_avg", "exp_avg_sq"):
            st[k] = st[k].to(torch.bfloat16)
    state = dict(step=step, config=model.cfg.to_dict(), model={k: v.float().cpu() for k, v in model.state_dict().items()},
                 opt=osd, args=vars(args), history=history, stage_starts=stage_starts)
    buf = io.BytesIO()
    torch.save(state, buf)
    blob = buf.getvalue()
    d = os.path.join(out_dir, "ckpt")
    os.makedirs(d, exist_ok=True)
    for old in glob.glob(os.path.join(d, "ckpt.part*")):
        os.remove(old)
    n = 0
    for n, off in enumerate(range(0, len(blob), CKPT_PART)):
        with open(os.path.join(d, "ckpt.part%02d" % n), "wb") as f:
            f.write(blob[off: off + CKPT_PART])
    return len(blob), n + 1


def load_checkpoint(d):
    parts = sorted(glob.glob(os.path.join(d, "ckpt.part*")))
    if not parts:
        raise FileNotFoundError("no ckpt.part* in %s" % d)
    blob = b"".join(open(p, "rb").read() for p in parts)
    state = torch.load(io.BytesIO(blob), map_location="cpu")
    for st in state["opt"]["state"].values():
        for k in ("exp_avg", "exp_avg_sq"):
            st[k] = st[k].float()
    return state


@torch.no_grad()
def evaluate(model, ev, meta, vocab, device, max_length=None, groups_out=None):
    """Greedy answers after the answer prefix, as `spillway gate --niah` does, scored with
    RULER's string-match-all. Prompts of one (task, length) run as one right-padded batch:
    each row reads its logits at its own last position, so padding changes nothing."""
    model.eval()
    scores = {}
    cases = []
    for b in range(ev.n_batches):
        rows = list(ev.batch_rows(b))
        if max_length and meta[rows[0]]["length"] > max_length:
            continue
        seqs = [list(map(int, ev.sample(i)[0][: ev.sample(i)[1]])) for i in rows]
        n_exp = max(len(meta[i]["expected"]) for i in rows)
        # A UUID is ~26 tokens of our vocab (a 7-digit number 4); 14 tokens cut UUIDs short
        # and scored single_3 / multikey_3 as 0 in the first full run.
        max_new = 8 + 32 * n_exp
        gen = [[] for _ in rows]
        done = [False] * len(rows)
        for _ in range(max_new):
            T = max(len(s) + len(g) for s, g in zip(seqs, gen))
            x = torch.full((len(rows), T), vocab.eos, dtype=torch.long)
            for r, (s, g) in enumerate(zip(seqs, gen)):
                x[r, : len(s) + len(g)] = torch.tensor(s + g)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                logits = model(x.to(device))
            for r, (s, g) in enumerate(zip(seqs, gen)):
                if done[r]:
                    continue
                tok = int(logits[r, len(s) + len(g) - 1].argmax())
                if tok == vocab.eos:
                    done[r] = True
                    continue
                g.append(tok)
                text = vocab.decode(g)
                if D.answer_end(text) < len(text):
                    done[r] = True
            if all(done):
                break
        for r, i in enumerate(rows):
            text = vocab.decode(gen[r])
            text = text[: D.answer_end(text)]
            sc = D.niah_score(text, meta[i]["expected"])
            key = (meta[i]["task"], meta[i]["length"])
            scores.setdefault(key, []).append(sc)
            cases.append(dict(task=meta[i]["task"], length=meta[i]["length"], depth=meta[i]["depth"],
                              expected=meta[i]["expected"], answer=text, score=sc))
    model.train()
    table = {"%s@%d" % k: sum(v) / len(v) for k, v in scores.items()}
    if groups_out is not None:
        groups_out.extend(cases)
    return table


def format_table(table):
    tasks = sorted({k.split("@")[0] for k in table}, key=lambda t: D.TASKS.index(t) if t in D.TASKS else 99)
    lengths = sorted({int(k.split("@")[1]) for k in table})
    lines = ["%-16s" % "task" + "".join("%7d" % L for L in lengths)]
    for t in tasks:
        lines.append("%-16s" % t + "".join("%7s" % ("%.0f" % table["%s@%d" % (t, L)] if "%s@%d" % (t, L) in table else "-")
                                         for L in lengths))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description="train spillway's niah test model")
    ap.add_argument("--tool", required=True, help="the niah-train-data binary")
    ap.add_argument("--vocab", default=os.path.join(HERE, "vocab.json"))
    ap.add_argument("--out-dir", required=True, help="train.log, ckpt/, model.gguf, eval.json land here")
    ap.add_argument("--work-dir", default="/tmp/niah-shards", help="generated data shards (big; not kept)")
    ap.add_argument("--resume", default="", help="a folder holding ckpt.part* from an earlier call")
    ap.add_argument("--time-budget", type=float, default=540, help="seconds for this call, all included")
    ap.add_argument("--reserve", type=float, default=45, help="seconds kept for final eval, export, save")
    ap.add_argument("--max-steps", type=int, default=0, help="stop this call at this global step (0: none)")
    ap.add_argument("--stages", default="", help="a JSON file replacing the default curriculum")
    ap.add_argument("--first-stage", default="", help="a fresh start begins at this stage (skips the ones before)")
    ap.add_argument("--tokens-per-batch", type=int, default=65536)
    ap.add_argument("--batches-per-shard", type=int, default=100)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--cooldown-s", type=float, default=0,
                    help="decay lr over the last this many seconds of training in this call (the last call)")
    ap.add_argument("--lm-weight", type=float, default=0.1,
                    help="loss = mean answer CE + this x mean CE of all other tokens")
    ap.add_argument("--eval-every", type=int, default=1000)
    ap.add_argument("--first-eval", type=int, default=200, help="an early held-out check (DESIGN.md)")
    ap.add_argument("--eval-lengths", default="512,1024,2048,4096,8192")
    ap.add_argument("--eval-depths", type=int, default=3)
    ap.add_argument("--final-depths", type=int, default=5)
    ap.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    ap.add_argument("--seed", type=int, default=20261130)
    ap.add_argument("--hf-check", action="store_true", help="compare logits with HF LlamaForCausalLM")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--n-head-kv", type=int, default=2)
    ap.add_argument("--d-ff", type=int, default=704)
    ap.add_argument("--eval-tasks", default="", help="comma-separated short task names (default: all 8)")
    ap.add_argument("--torch-threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    args = ap.parse_args()
    t_start = time.time()
    os.makedirs(args.out_dir, exist_ok=True)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = True
    stages = json.load(open(args.stages)) if args.stages else STAGES
    total_steps = sum(s["steps"] for s in stages)  # an upper bound: stages may end early
    vocab = D.Vocab(args.vocab)

    state = load_checkpoint(args.resume) if args.resume else None
    if state:
        cfg = Config(**state["config"])
    else:
        cfg = Config(n_vocab=len(vocab.tokens), d_model=args.d_model, n_layer=args.n_layer, n_head=args.n_head,
                     n_head_kv=args.n_head_kv, d_ff=args.d_ff)
    torch.manual_seed(args.seed)
    model = Llama(cfg).to(device)
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([dict(params=decay, weight_decay=0.1), dict(params=no_decay, weight_decay=0.0)],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    step, history = 0, []
    # Global step at which each stage began; the last entry is the current stage. Shard k of
    # stage s is a fixed function of (s, k), so the checkpoint needs only this list.
    stage_starts = [0]
    if args.first_stage and not state:
        stage_starts = [0] * (1 + [s["name"] for s in stages].index(args.first_stage))
    if state:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step, history = state["step"], state.get("history", [])
        stage_starts = state.get("stage_starts", [0])
    log(args.out_dir, "model: %d params (%s), vocab %d, step %d/%d, device %s%s" % (
        model.n_params(), json.dumps(cfg.to_dict()), cfg.n_vocab, step, total_steps, device,
        " (resumed from %s)" % args.resume if state else ""))

    if args.hf_check:
        try:
            err, scale = E.hf_check(model, device)
            log(args.out_dir, "hf check: max |logit diff| %.3g (max |logit| %.3g) vs HF LlamaForCausalLM" % (err, scale))
        except Exception as e:  # the check must not cost the call
            log(args.out_dir, "hf check failed: %r" % (e,))

    # Held-out eval prompts: exactly the gate's (seed 42), never trained on.
    ev_path = os.path.join(args.work_dir, "eval.bin")
    os.makedirs(args.work_dir, exist_ok=True)
    tasks8 = args.eval_tasks or ",".join(t[5:] for t in D.TASKS)

    def make_eval(path, depths):
        import subprocess
        r = subprocess.run([args.tool, "eval", "--vocab", args.vocab, "--out", path, "--tasks", tasks8,
                            "--lengths", args.eval_lengths, "--depths", str(depths), "--seed", "42"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(r.stdout + r.stderr)
        return D.SampleFile(path), json.load(open(path + ".json"))

    ev, ev_meta = make_eval(ev_path, args.eval_depths)

    maker = D.ShardMaker(args.tool, args.vocab, args.work_dir, args.threads, args.tokens_per_batch,
                         args.batches_per_shard, args.seed)

    def shard_of(s):
        i = len(stage_starts) - 1
        return i, (s - stage_starts[i]) // args.batches_per_shard, (s - stage_starts[i]) % args.batches_per_shard

    def prefetch(s):
        # This stage's next shards and the next stage's first one (it may start any time).
        i, sh, _ = shard_of(s)
        want = [(i, sh + k) for k in range(3)] + ([(i + 1, 0)] if i + 1 < len(stages) else [])
        for j, k in want:
            if stages[j].get("kind") != "copy":  # copy batches are made here, per step
                maker.start(j, stages[j], k)

    stop_at = total_steps if not args.max_steps else min(total_steps, args.max_steps)
    sf, sf_path = None, None
    train_end = t_start + args.time_budget - args.reserve
    stage_t0, last_answer_loss, finished = time.time(), None, False
    model.train()
    t_log, tok_log, wait_total = time.time(), 0, 0.0
    zero = lambda: torch.zeros((), device=device)  # noqa: E731
    acc = dict(ans=zero(), ans_n=zero(), all=zero(), all_n=zero())  # on the GPU: no sync per step
    while step < stop_at and time.time() < train_end and not finished:
        i = len(stage_starts) - 1
        why = stage_done(stages[i], step - stage_starts[i], time.time() - stage_t0, last_answer_loss)
        if why:
            if i + 1 == len(stages):
                log(args.out_dir, "curriculum finished at step %d (%s)" % (step, why))
                finished = True
                continue
            stage_starts.append(step)
            stage_t0, last_answer_loss = time.time(), None
            log(args.out_dir, "stage %s -> %s at step %d (%s)" % (stages[i]["name"], stages[i + 1]["name"], step, why))
            history.append(dict(step=step, stage_start=stages[i + 1]["name"]))
        i, sh, b = shard_of(step)
        path = maker.path(i, sh)
        if stages[i].get("kind") == "copy":
            batch = D.make_copy_batch(step, args.seed, vocab.bos, vocab.bos, stages[i]["min_len"], stages[i]["max_len"],
                                      stages[i].get("tokens_per_batch", args.tokens_per_batch))
            if b == 0:
                prefetch(step)  # the niah shards after the warm-up are generated meanwhile
        elif path != sf_path:
            prefetch(step)
            t0 = time.time()
            out = maker.wait(path)
            wait_total += time.time() - t0
            if out:
                log(args.out_dir, "data: %s (waited %.1f s)" % (out, time.time() - t0))
            if sf_path:
                maker.drop(sf_path)
            sf, sf_path = D.SampleFile(path), path
            prefetch(step)
        if stages[i].get("kind") != "copy":
            batch = D.make_batch(sf, sf.batch_rows(b), vocab.eos)
        x, y, real, a = batch
        n_real = int(real.sum())
        x, y, real, a = (torch.from_numpy(v).to(device, non_blocking=True) for v in (x, y, real, a))
        lr = lr_at(step, args.lr * stages[i].get("lr_scale", 1.0), args.warmup, train_end - time.time(), args.cooldown_s)
        for g in opt.param_groups:
            g["lr"] = lr
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(x)
        ce = F.cross_entropy(logits.float().view(-1, cfg.n_vocab), y.view(-1), reduction="none").view_as(real)
        # Each term is a mean over its own tokens, so the answer's share of the gradient does
        # not shrink as prompts grow. (The smoke test weighted tokens 1 on the answer and
        # lm_weight elsewhere: at 300-400-token prompts its ~6 answer tokens got ~15% of the
        # gradient, and answer loss sat at chance for 1100 steps; cause not proven.)
        other = real - a
        loss = (ce * a).sum() / a.sum().clamp(min=1) + args.lm_weight * (ce * other).sum() / other.sum().clamp(min=1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        with torch.no_grad():
            acc["ans"] += (ce * a).sum()
            acc["ans_n"] += a.sum()
            acc["all"] += (ce * real).sum()
            acc["all_n"] += real.sum()
        tok_log += n_real
        if step % 25 == 0 or step == stop_at:
            dt = time.time() - t_log
            rec = dict(step=step, stage=stages[i]["name"], lr=lr, answer_loss=float(acc["ans"] / acc["ans_n"].clamp(min=1)),
                       token_loss=float(acc["all"] / acc["all_n"].clamp(min=1)), tok_s=tok_log / dt, T=x.shape[1],
                       batch=x.shape[0], data_wait_s=wait_total, elapsed_s=time.time() - t_start)
            history.append(rec)
            last_answer_loss = rec["answer_loss"]
            log(args.out_dir, "step %5d %-12s lr %.2e answer_loss %.4f token_loss %.4f %6.0f tok/s T %4d x %3d wait %.1fs" % (
                step, rec["stage"], lr, rec["answer_loss"], rec["token_loss"], rec["tok_s"], rec["T"], rec["batch"], wait_total))
            t_log, tok_log = time.time(), 0
            acc = dict(ans=zero(), ans_n=zero(), all=zero(), all_n=zero())
        if step == args.first_eval or step % args.eval_every == 0:
            # Up to twice the current stage's length: shows whether retrieval generalizes a
            # little past what was trained without paying for 8k prompts early on.
            t0 = time.time()
            table = evaluate(model, ev, ev_meta, vocab, device, max_length=2 * stages[i]["max_len"])
            history.append(dict(step=step, eval=table))
            log(args.out_dir, "eval at step %d (%.1f s):\n%s" % (step, time.time() - t0, format_table(table)))

    # Save first (the one thing a later call cannot redo), then export, then the full eval.
    nbytes, nparts = save_checkpoint(args.out_dir, model, opt, step, args, history, stage_starts)
    log(args.out_dir, "checkpoint: step %d, %.1f MB in %d parts -> %s/ckpt" % (step, nbytes / 1e6, nparts, args.out_dir))
    gguf = os.path.join(args.out_dir, "model.gguf")
    size = E.export_gguf(model, vocab.json, gguf)
    log(args.out_dir, "export: %s (%.1f MB, f16 matrices)" % (gguf, size / 1e6))
    remaining = args.time_budget - (time.time() - t_start)
    cases = []
    if remaining > 10:
        t0 = time.time()
        fev, fmeta = make_eval(os.path.join(args.work_dir, "final_eval.bin"), args.final_depths)
        # Longest lengths last; skip those the remaining time cannot afford (logged).
        max_len = max(int(L) for L in args.eval_lengths.split(",")) if remaining > 30 else 1024
        table = evaluate(model, fev, fmeta, vocab, device, max_length=max_len, groups_out=cases)
        log(args.out_dir, "final eval at step %d, %d depths, lengths <= %d (%.1f s):\n%s" % (
            step, args.final_depths, max_len, time.time() - t0, format_table(table)))
        with open(os.path.join(args.out_dir, "eval.json"), "w") as f:
            json.dump(dict(step=step, table=table, cases=cases), f, indent=1)
    with open(os.path.join(args.out_dir, "history.json"), "w") as f:
        json.dump(history, f)
    log(args.out_dir, "done: step %d of %d in %.0f s" % (step, total_steps, time.time() - t_start))


if __name__ == "__main__":
    main()
