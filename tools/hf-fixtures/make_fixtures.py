#!/usr/bin/env python3
"""Independent check of spillway's CPU forward pass: build tiny random-weight Qwen2 and
Llama models with HF transformers, export them to GGUF with our own writer (gguf_writer.py),
and record HF's logits for fixed token-id prompts and 32 greedy tokens.

Runs where torch + transformers are installed (the GPU machine; no network needed):
    python3 tools/hf-fixtures/make_fixtures.py --out DIR
Writes, per model NAME: NAME.gguf (f32 weights), NAME.json (config, prompts, HF's greedy
tokens, top-1 margins, where each prompt's logits start) and NAME.logits.bin (f32 LE rows
of n_vocab, one per evaluated position). tests/engine_cpu/hf_fixture_test.cpp reads them.

Reference numerics: HF runs on the CPU in float64 (eager attention), so the fixture is the
exact answer for these weights and our f32 engine's error is its own.
"""
import argparse
import array
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_writer as gw  # noqa: E402

N_GREEDY = 32
# Fixed prompts (token ids < 256): a short one and a longer one with repeats.
PROMPTS = [
    [1, 17, 200, 45, 3, 99, 128, 7],
    [5, 250, 31, 31, 64, 2, 190, 77, 12, 12, 12, 140, 9, 33, 201, 88, 4, 160, 60, 61, 62, 63, 17, 200],
]

MODELS = [
    # qwen2: GQA 2:1, QKV bias, tied embeddings, NeoX RoPE, rope_theta 1e6 (HF default 1e4).
    dict(name="qwen2_tiny", arch="qwen2", vocab_size=256, hidden_size=64, num_hidden_layers=2,
         num_attention_heads=2, num_key_value_heads=1, head_dim=32, intermediate_size=128,
         rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, seed=1234),
    # llama: GQA 2:1, head_dim 32 != hidden/heads (16), separate head, permuted Q/K, rope_theta 5e5.
    dict(name="llama_tiny", arch="llama", vocab_size=256, hidden_size=64, num_hidden_layers=2,
         num_attention_heads=4, num_key_value_heads=2, head_dim=32, intermediate_size=128,
         rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, seed=4321),
]


def build_hf_model(spec):
    import torch
    import transformers

    common = dict(vocab_size=spec["vocab_size"], hidden_size=spec["hidden_size"],
                  num_hidden_layers=spec["num_hidden_layers"], num_attention_heads=spec["num_attention_heads"],
                  num_key_value_heads=spec["num_key_value_heads"], head_dim=spec["head_dim"],
                  intermediate_size=spec["intermediate_size"], rms_norm_eps=spec["rms_norm_eps"],
                  tie_word_embeddings=spec["tie_word_embeddings"], max_position_embeddings=512,
                  hidden_act="silu", rope_theta=spec["rope_theta"])
    if spec["arch"] == "qwen2":
        config = transformers.Qwen2Config(**common)
        cls = transformers.Qwen2ForCausalLM
    else:
        config = transformers.LlamaConfig(attention_bias=False, mlp_bias=False, **common)
        cls = transformers.LlamaForCausalLM
    # transformers 5.x keeps RoPE settings in config.rope_parameters; 4.x in config.rope_theta.
    rp = getattr(config, "rope_parameters", None)
    if isinstance(rp, dict):
        rp["rope_theta"] = spec["rope_theta"]
        rp.setdefault("rope_type", "default")
    config._attn_implementation = "eager"
    torch.manual_seed(spec["seed"])
    model = cls(config)
    model.eval()
    # Random everything, including norms and biases (HF initialises those to 1 and 0, which
    # would leave them untested), at scales that give well-separated logits.
    gen = torch.Generator().manual_seed(spec["seed"])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(0.5 + torch.rand(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=gen))
    model = model.double()
    theta = rp["rope_theta"] if isinstance(rp, dict) else getattr(config, "rope_theta")
    assert float(theta) == spec["rope_theta"], "rope_theta not applied: %r" % theta
    return model, config


def rows_of(t):
    return [[float(x) for x in row] for row in t.detach().to("cpu").double().tolist()]


def flat(rows):
    return [x for row in rows for x in row]


def export_gguf(model, spec, path):
    sd = {k: v for k, v in model.state_dict().items()}
    arch = spec["arch"]
    hd, nh, nkv = spec["head_dim"], spec["num_attention_heads"], spec["num_key_value_heads"]
    g = gw.GgufModel()
    g.add("general.architecture", gw.T_STRING, arch)
    g.add("general.name", gw.T_STRING, spec["name"])
    g.add("general.alignment", gw.T_UINT32, gw.ALIGNMENT)
    g.add(arch + ".context_length", gw.T_UINT32, 512)
    g.add(arch + ".embedding_length", gw.T_UINT32, spec["hidden_size"])
    g.add(arch + ".block_count", gw.T_UINT32, spec["num_hidden_layers"])
    g.add(arch + ".feed_forward_length", gw.T_UINT32, spec["intermediate_size"])
    g.add(arch + ".attention.head_count", gw.T_UINT32, nh)
    g.add(arch + ".attention.head_count_kv", gw.T_UINT32, nkv)
    g.add(arch + ".attention.key_length", gw.T_UINT32, hd)
    g.add(arch + ".attention.value_length", gw.T_UINT32, hd)
    g.add(arch + ".attention.layer_norm_rms_epsilon", gw.T_FLOAT32, spec["rms_norm_eps"])
    g.add(arch + ".rope.freq_base", gw.T_FLOAT32, spec["rope_theta"])
    g.add(arch + ".rope.dimension_count", gw.T_UINT32, hd)
    g.add(arch + ".vocab_size", gw.T_UINT32, spec["vocab_size"])
    # A byte-level vocabulary of exactly the 256 byte tokens (no merges).
    g.add("tokenizer.ggml.model", gw.T_STRING, "gpt2")
    g.add("tokenizer.ggml.pre", gw.T_STRING, "qwen2" if arch == "qwen2" else "llama-bpe")
    g.add_array("tokenizer.ggml.tokens", gw.T_STRING, gw.byte_level_tokens())
    g.add_array("tokenizer.ggml.token_type", gw.T_INT32, [1] * 256)
    g.add_array("tokenizer.ggml.merges", gw.T_STRING, [])
    g.add("tokenizer.ggml.bos_token_id", gw.T_UINT32, 1)
    g.add("tokenizer.ggml.eos_token_id", gw.T_UINT32, 2)

    def matrix(gguf_name, hf_name, permute_heads=None):
        rows = rows_of(sd[hf_name])  # torch Linear: [out, in] row-major = GGUF ne [in, out]
        if permute_heads is not None:
            rows = gw.permute_rows_for_llama(rows, permute_heads, hd)
        g.add_tensor_f32(gguf_name, [len(rows[0]), len(rows)], flat(rows))

    def vector(gguf_name, hf_name, permute_heads=None):
        values = [float(x) for x in sd[hf_name].detach().double().tolist()]
        if permute_heads is not None:
            values = [r[0] for r in gw.permute_rows_for_llama([[v] for v in values], permute_heads, hd)]
        g.add_tensor_f32(gguf_name, [len(values)], values)

    matrix("token_embd.weight", "model.embed_tokens.weight")
    vector("output_norm.weight", "model.norm.weight")
    if not spec["tie_word_embeddings"]:
        matrix("output.weight", "lm_head.weight")
    # llama.cpp's converter permutes llama Q/K (K with the KV head count); qwen2 is left as is.
    pq = nh if arch == "llama" else None
    pk = nkv if arch == "llama" else None
    for i in range(spec["num_hidden_layers"]):
        p, h = "blk.%d." % i, "model.layers.%d." % i
        vector(p + "attn_norm.weight", h + "input_layernorm.weight")
        matrix(p + "attn_q.weight", h + "self_attn.q_proj.weight", pq)
        matrix(p + "attn_k.weight", h + "self_attn.k_proj.weight", pk)
        matrix(p + "attn_v.weight", h + "self_attn.v_proj.weight")
        matrix(p + "attn_output.weight", h + "self_attn.o_proj.weight")
        if arch == "qwen2":
            vector(p + "attn_q.bias", h + "self_attn.q_proj.bias")
            vector(p + "attn_k.bias", h + "self_attn.k_proj.bias")
            vector(p + "attn_v.bias", h + "self_attn.v_proj.bias")
        vector(p + "ffn_norm.weight", h + "post_attention_layernorm.weight")
        matrix(p + "ffn_gate.weight", h + "mlp.gate_proj.weight")
        matrix(p + "ffn_up.weight", h + "mlp.up_proj.weight")
        matrix(p + "ffn_down.weight", h + "mlp.down_proj.weight")
    with open(path, "wb") as f:
        f.write(g.to_bytes())


def record(model, spec, out_dir):
    import torch

    logits_blob = array.array("f")
    prompts = []
    with torch.no_grad():
        for prompt in PROMPTS:
            # Greedy decoding step by step from full forwards (no cache: the simplest reference).
            tokens = list(prompt)
            margins = []
            for _ in range(N_GREEDY):
                logits = model(torch.tensor([tokens])).logits[0, -1]
                top2 = torch.topk(logits, 2).values
                margins.append(float(top2[0] - top2[1]))
                tokens.append(int(torch.argmax(logits)))
            generated = tokens[len(prompt):]
            # Logits of every evaluated position: the prompt, then each generated token but
            # the last (whose successor was not asked for).
            evaluated = tokens[:-1]
            all_logits = model(torch.tensor([evaluated])).logits[0]
            assert all_logits.shape[0] == len(evaluated)
            offset = len(logits_blob) // spec["vocab_size"]
            for row in all_logits.tolist():
                logits_blob.extend(row)
            prompts.append(dict(prompt=prompt, generated=generated, logits_row_offset=offset,
                                n_rows=len(evaluated), min_top1_margin=min(margins)))
    if sys.byteorder != "little":
        logits_blob.byteswap()
    with open(os.path.join(out_dir, spec["name"] + ".logits.bin"), "wb") as f:
        f.write(logits_blob.tobytes())
    return prompts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    import torch
    import transformers

    torch.set_num_threads(4)
    print("torch %s, transformers %s" % (torch.__version__, transformers.__version__))
    failures = 0
    for spec in MODELS:
        try:
            write_model(spec, args.out)
        except Exception:  # one model's failure must not cost the other's fixture
            import traceback
            traceback.print_exc()
            failures += 1
    sys.exit(1 if failures else 0)


def write_model(spec, out_dir):
    import torch
    import transformers

    model, config = build_hf_model(spec)
    export_gguf(model, spec, os.path.join(out_dir, spec["name"] + ".gguf"))
    prompts = record(model, spec, out_dir)
    meta = dict(spec=spec, prompts=prompts, vocab_size=spec["vocab_size"], n_greedy=N_GREEDY,
                reference="HF transformers %s, torch %s, CPU float64, eager attention"
                          % (transformers.__version__, torch.__version__),
                logits_file=spec["name"] + ".logits.bin", gguf_file=spec["name"] + ".gguf")
    with open(os.path.join(out_dir, spec["name"] + ".json"), "w") as f:
        json.dump(meta, f, indent=1)
    print("%s: margins %s" % (spec["name"], [round(p["min_top1_margin"], 4) for p in prompts]))


if __name__ == "__main__":
    main()
