#!/usr/bin/env python3
"""Prefill speed of spillway against HF transformers, measured in the same run (issue 5).

Runs on the GPU machine (PyTorch + transformers installed, no network needed):
    python3 tools/hf-prefill-bench.py [--tokens 8192,65536] [--reps 3] [--reps-short 10] [--batch 4096]
        [--spillway build-device/bin/spillway] [--ctk f16] [--skip-hf] [--skip-spillway]

spillway: `spillway bench --synthetic qwen2.5-14b --wtype q8_0 -p N -n 0 -b B --json`, one
subprocess per prompt length (random Q8_0 weights built on the GPU; the prompt runs in chunks
of -b tokens; bench times one prefill after an untimed warm-up one; the head runs for the last
token only).
HF: a Qwen2-architecture model with Qwen2.5-14B's shape (48 layers, hidden 5120, 40 query
heads, 8 KV heads of 128, FFN 13824, vocab 152064, QKV bias, untied head), random bf16
weights created directly on the GPU, attn_implementation="sdpa". One forward over the whole
prompt with use_cache=False (no KV cache is kept: the cheapest HF prefill), the base model
over all tokens and the LM head on the last position only (what spillway computes); one
warm-up, then the median of --reps timed forwards (torch.cuda.synchronize around each; prompts
over 16k tokens take --reps-long, default 2, to save device time: ~8 s per 64k forward; prompts
of at most 2048 tokens take --reps-short, default 10, and spillway's bench -r the same).
A prompt length that does not fit HF's memory is reported as OOM with the bytes asked for.
Prints one table: tokens, both speeds, and spillway / HF (the issue's target is >= 1.2).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SHAPE = dict(vocab_size=152064, hidden_size=5120, intermediate_size=13824, num_hidden_layers=48,
             num_attention_heads=40, num_key_value_heads=8, rms_norm_eps=1e-6, rope_theta=1000000.0)


def spillway_prefill(binary, n_tokens, batch, ctk, timeout_s, reps):
    cmd = [binary, "bench", "--synthetic", "qwen2.5-14b", "--wtype", "q8_0", "-p", str(n_tokens), "-n", "0",
           "-b", str(batch), "-ctk", ctk, "-r", str(reps), "--json"]
    print("spillway: " + " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        print(r.stderr[-2000:], flush=True)
        return {"error": "rc %d" % r.returncode}
    rows = [row for row in json.loads(r.stdout)["rows"] if row["test"] == "pp%d" % n_tokens]
    tok_s = rows[0]["tok_s"]
    print("spillway: %d tokens: %.1f tok/s (%.2f s), process wall %.1f s" % (n_tokens, tok_s, n_tokens / tok_s, wall),
          flush=True)
    return {"tok_s": tok_s, "seconds": n_tokens / tok_s}


def build_hf_model(max_tokens):
    import torch
    import transformers

    config = transformers.Qwen2Config(
        vocab_size=SHAPE["vocab_size"], hidden_size=SHAPE["hidden_size"],
        intermediate_size=SHAPE["intermediate_size"], num_hidden_layers=SHAPE["num_hidden_layers"],
        num_attention_heads=SHAPE["num_attention_heads"], num_key_value_heads=SHAPE["num_key_value_heads"],
        max_position_embeddings=max(131072, max_tokens), rms_norm_eps=SHAPE["rms_norm_eps"],
        tie_word_embeddings=False, use_sliding_window=False, hidden_act="silu",
        rope_theta=SHAPE["rope_theta"], attn_implementation="sdpa")
    # transformers 5.x keeps RoPE settings in config.rope_parameters (speed does not depend on it).
    rp = getattr(config, "rope_parameters", None)
    if isinstance(rp, dict):
        rp["rope_theta"] = SHAPE["rope_theta"]
        rp.setdefault("rope_type", "default")
    config._attn_implementation = "sdpa"
    t0 = time.perf_counter()
    old_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # weights created in bf16, directly on the GPU
    try:
        with torch.device("cuda"):
            model = transformers.Qwen2ForCausalLM(config)
    finally:
        torch.set_default_dtype(old_dtype)
    model.eval()
    torch.cuda.synchronize()
    n_params = sum(p.numel() for p in model.parameters())
    print("HF: Qwen2 14B shape, %.2f B params, %s, attn %s, built in %.1f s (transformers %s, torch %s)" % (
        n_params / 1e9, next(model.parameters()).dtype, model.config._attn_implementation,
        time.perf_counter() - t0, transformers.__version__, torch.__version__), flush=True)
    print("HF: SDPA backends enabled: flash %s, mem-efficient %s, cudnn %s, math %s" % (
        torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.mem_efficient_sdp_enabled(),
        torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()), flush=True)
    return model


def hf_prefill(model, n_tokens, reps):
    import torch

    ids = torch.randint(0, SHAPE["vocab_size"], (1, n_tokens), device="cuda")

    def forward():
        with torch.inference_mode():
            hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state
            return model.lm_head(hidden[:, -1:, :])

    torch.cuda.reset_peak_memory_stats()
    try:
        forward()  # warm-up
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            forward()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
    except torch.OutOfMemoryError as e:
        torch.cuda.empty_cache()
        msg = str(e).split("\n")[0]
        print("HF: %d tokens: OOM (%s); peak allocated %.1f GiB of %.1f GiB" % (
            n_tokens, msg, torch.cuda.max_memory_allocated() / 2**30,
            torch.cuda.get_device_properties(0).total_memory / 2**30), flush=True)
        return {"error": "OOM: " + msg}
    s = statistics.median(times)
    peak = torch.cuda.max_memory_allocated() / 2**30
    print("HF: %d tokens: median %.3f s of %s -> %.1f tok/s, peak allocated %.1f GiB" % (
        n_tokens, s, ["%.3f" % t for t in times], n_tokens / s, peak), flush=True)
    return {"tok_s": n_tokens / s, "seconds": s, "peak_gib": peak}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", default="8192,65536", help="prompt lengths, comma separated")
    ap.add_argument("--reps", type=int, default=3, help="timed HF forwards after one warm-up (median)")
    ap.add_argument("--reps-long", type=int, default=2, help="--reps for prompts over 16k tokens")
    ap.add_argument("--reps-short", type=int, default=10,
                    help="--reps for prompts of at most 2048 tokens (a 512-token forward is ~0.04 s: three "
                         "of them varied by 15%% between calls), and spillway's -r there")
    ap.add_argument("--batch", default="4096", help="spillway's prefill chunk (-b); a list is run for each "
                    "prompt length up to 16k, the last entry beyond")
    ap.add_argument("--ctk", default="f16", help="spillway's KV cache type (-ctk, V the same)")
    ap.add_argument("--spillway", default="build-device/bin/spillway", help="spillway binary")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per spillway bench run")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--skip-spillway", action="store_true")
    args = ap.parse_args()
    tokens = [int(t) for t in args.tokens.split(",")]

    batches = [int(b) for b in args.batch.split(",")]

    ours, theirs = {}, {}  # ours[(n, batch)], theirs[n]
    # spillway first: each bench is its own process and gives its memory back when it ends.
    if not args.skip_spillway:
        if not os.access(args.spillway, os.X_OK):
            sys.exit("no spillway binary at %s (build it, or pass --spillway)" % args.spillway)
        for n in tokens:
            for b in (batches if n <= 16384 else batches[-1:]):
                try:
                    ours[(n, b)] = spillway_prefill(args.spillway, n, b, args.ctk, args.timeout,
                                                    args.reps_short if n <= 2048 else 1)
                except subprocess.TimeoutExpired:
                    ours[(n, b)] = {"error": "timeout after %d s" % args.timeout}
    if not args.skip_hf:
        model = build_hf_model(max(tokens))
        for n in tokens:
            reps = args.reps_short if n <= 2048 else args.reps if n <= 16384 else args.reps_long
            theirs[n] = hf_prefill(model, n, reps)

    print()
    print("| tokens | spillway -b | spillway q8_0 weights, %s KV | HF bf16 SDPA, use_cache=False | spillway / HF |" %
          args.ctk)
    print("|---:|---:|---:|---:|---:|")
    for n in tokens:
        b = theirs.get(n, {})
        fb = "%.0f tok/s (%.2f s)" % (b["tok_s"], b["seconds"]) if "tok_s" in b else b.get("error", "-")
        for (m, batch), a in ours.items():
            if m != n:
                continue
            fa = "%.0f tok/s (%.2f s)" % (a["tok_s"], a["seconds"]) if "tok_s" in a else a.get("error", "-")
            ratio = "%.2fx" % (a["tok_s"] / b["tok_s"]) if "tok_s" in a and "tok_s" in b else "-"
            print("| %d | %d | %s | %s | %s |" % (n, batch, fa, fb, ratio))
        if not any(m == n for m, _ in ours):
            print("| %d | - | - | %s | - |" % (n, fb))


if __name__ == "__main__":
    main()
