"""Export of the trained model to a llama GGUF, with tools/hf-fixtures/gguf_writer.py's metadata
encoding and the Q/K permutation llama.cpp's converter applies to HF Llama weights (our
training model uses HF's rotate-half RoPE; llama GGUF files use adjacent-pair RoPE).

Matrices are written as F16 (the model must fit 16 MiB to come back from the GPU machine and
40 MB to be committed), norms as F32, as llama.cpp's converter does for f16 files.
"""
import os
import struct
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "hf-fixtures"))
import gguf_writer as gw  # noqa: E402

GGML_F32, GGML_F16 = 0, 1


class TypedGguf(gw.GgufModel):
    """gw.GgufModel (F32 only) plus tensors of any type given as raw little-endian bytes."""

    def __init__(self):
        super().__init__()
        self.raw = []  # (name, dims ne0-first, ggml type, bytes)

    def add_tensor(self, name, t):
        """t: a torch tensor [out, in] (or [n]); 2-D ones become F16, 1-D ones F32."""
        t = t.detach().to("cpu")
        dims = list(reversed(t.shape))  # GGUF's ne[0] is the contiguous (last torch) dim
        if t.dim() == 2:
            data = t.to(torch.float16).contiguous().numpy().astype("<f2").tobytes()
            self.raw.append((name, dims, GGML_F16, data))
        else:
            data = t.to(torch.float32).contiguous().numpy().astype("<f4").tobytes()
            self.raw.append((name, dims, GGML_F32, data))

    def to_bytes(self):
        if self.tensors:
            raise ValueError("use add_tensor only")
        out = bytearray()
        out += gw.GGUF_MAGIC + struct.pack("<IQQ", 3, len(self.raw), len(self.metadata))
        for key, vtype, value in self.metadata:
            out += gw._string(key) + struct.pack("<I", vtype)
            if vtype == gw.T_ARRAY:
                elem_type, items = value
                out += struct.pack("<IQ", elem_type, len(items))
                for item in items:
                    out += gw._value(elem_type, item)
            else:
                out += gw._value(vtype, value)
        offsets, offset = [], 0
        for name, dims, gtype, data in self.raw:
            offsets.append(offset)
            out += gw._string(name) + struct.pack("<I", len(dims))
            for d in dims:
                out += struct.pack("<Q", d)
            out += struct.pack("<IQ", gtype, offset)
            offset = (offset + len(data) + gw.ALIGNMENT - 1) // gw.ALIGNMENT * gw.ALIGNMENT
        out += b"\0" * ((-len(out)) % gw.ALIGNMENT)
        data_start = len(out)
        for (name, dims, gtype, data), off in zip(self.raw, offsets):
            out += b"\0" * (data_start + off - len(out))
            out += data
        return bytes(out)


def permute_qk(w, n_head, head_dim):
    """Tensor form of gw.permute_rows_for_llama: row h*hd + 2i + j <- row h*hd + j*hd/2 + i."""
    return w.reshape(n_head, 2, head_dim // 2, -1).transpose(1, 2).reshape(n_head * head_dim, -1)


def check_permutation():
    w = torch.randn(2 * 8, 3, dtype=torch.float64)
    ref = gw.permute_rows_for_llama([list(map(float, r)) for r in w.tolist()], 2, 8)
    assert torch.equal(permute_qk(w, 2, 8), torch.tensor(ref, dtype=torch.float64)), "Q/K permutation disagrees"


def export_gguf(model, vocab_json, path, name="spillway-niah-test"):
    check_permutation()
    cfg = model.cfg
    sd = {k: v.float() for k, v in model.state_dict().items()}
    g = TypedGguf()
    a = "llama"
    g.add("general.architecture", gw.T_STRING, a)
    g.add("general.name", gw.T_STRING, name)
    g.add("general.alignment", gw.T_UINT32, gw.ALIGNMENT)
    g.add(a + ".context_length", gw.T_UINT32, cfg.n_ctx)
    g.add(a + ".embedding_length", gw.T_UINT32, cfg.d_model)
    g.add(a + ".block_count", gw.T_UINT32, cfg.n_layer)
    g.add(a + ".feed_forward_length", gw.T_UINT32, cfg.d_ff)
    g.add(a + ".attention.head_count", gw.T_UINT32, cfg.n_head)
    g.add(a + ".attention.head_count_kv", gw.T_UINT32, cfg.n_head_kv)
    g.add(a + ".attention.key_length", gw.T_UINT32, cfg.head_dim)
    g.add(a + ".attention.value_length", gw.T_UINT32, cfg.head_dim)
    g.add(a + ".attention.layer_norm_rms_epsilon", gw.T_FLOAT32, cfg.norm_eps)
    g.add(a + ".rope.freq_base", gw.T_FLOAT32, cfg.rope_theta)
    g.add(a + ".rope.dimension_count", gw.T_UINT32, cfg.head_dim)
    g.add(a + ".vocab_size", gw.T_UINT32, cfg.n_vocab)
    v = vocab_json
    g.add("tokenizer.ggml.model", gw.T_STRING, "gpt2")
    g.add("tokenizer.ggml.pre", gw.T_STRING, v["pre"])
    g.add_array("tokenizer.ggml.tokens", gw.T_STRING, v["tokens"])
    g.add_array("tokenizer.ggml.token_type", gw.T_INT32, v["token_type"])
    g.add_array("tokenizer.ggml.merges", gw.T_STRING, v["merges"])
    g.add("tokenizer.ggml.bos_token_id", gw.T_UINT32, v["bos"])
    g.add("tokenizer.ggml.eos_token_id", gw.T_UINT32, v["eos"])
    g.add("tokenizer.ggml.add_bos_token", gw.T_BOOL, True)
    g.add("tokenizer.ggml.add_eos_token", gw.T_BOOL, False)

    g.add_tensor("token_embd.weight", sd["embed.weight"])
    g.add_tensor("output_norm.weight", sd["norm.weight"])
    for i in range(cfg.n_layer):
        p, h = "blk.%d." % i, "layers.%d." % i
        g.add_tensor(p + "attn_norm.weight", sd[h + "attn_norm.weight"])
        g.add_tensor(p + "attn_q.weight", permute_qk(sd[h + "wq.weight"], cfg.n_head, cfg.head_dim))
        g.add_tensor(p + "attn_k.weight", permute_qk(sd[h + "wk.weight"], cfg.n_head_kv, cfg.head_dim))
        g.add_tensor(p + "attn_v.weight", sd[h + "wv.weight"])
        g.add_tensor(p + "attn_output.weight", sd[h + "wo.weight"])
        g.add_tensor(p + "ffn_norm.weight", sd[h + "ffn_norm.weight"])
        g.add_tensor(p + "ffn_gate.weight", sd[h + "w_gate.weight"])
        g.add_tensor(p + "ffn_up.weight", sd[h + "w_up.weight"])
        g.add_tensor(p + "ffn_down.weight", sd[h + "w_down.weight"])
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(g.to_bytes())
    os.replace(tmp, path)
    return os.path.getsize(path)


def hf_check(model, device):
    """Loads our weights into HF transformers' LlamaForCausalLM and compares logits on random
    ids: proves the training model is the architecture the GGUF claims (llama), so the export
    path is the one tools/hf-fixtures already checks against our CPU engine."""
    import transformers

    cfg = model.cfg
    hc = transformers.LlamaConfig(vocab_size=cfg.n_vocab, hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layer,
                                  num_attention_heads=cfg.n_head, num_key_value_heads=cfg.n_head_kv,
                                  head_dim=cfg.head_dim, intermediate_size=cfg.d_ff, rms_norm_eps=cfg.norm_eps,
                                  tie_word_embeddings=True, max_position_embeddings=cfg.n_ctx, hidden_act="silu",
                                  rope_theta=cfg.rope_theta, attention_bias=False, mlp_bias=False)
    # transformers 5.x keeps rope_theta in config.rope_parameters (DESIGN.md's lessons).
    rp = getattr(hc, "rope_parameters", None)
    if isinstance(rp, dict):
        rp["rope_theta"] = cfg.rope_theta
        rp.setdefault("rope_type", "default")
    hc._attn_implementation = "eager"
    hf = transformers.LlamaForCausalLM(hc)
    sd = model.state_dict()
    m = {"model.embed_tokens.weight": "embed.weight", "model.norm.weight": "norm.weight"}
    for i in range(cfg.n_layer):
        h, o = "model.layers.%d." % i, "layers.%d." % i
        m.update({h + "input_layernorm.weight": o + "attn_norm.weight",
                  h + "self_attn.q_proj.weight": o + "wq.weight", h + "self_attn.k_proj.weight": o + "wk.weight",
                  h + "self_attn.v_proj.weight": o + "wv.weight", h + "self_attn.o_proj.weight": o + "wo.weight",
                  h + "post_attention_layernorm.weight": o + "ffn_norm.weight",
                  h + "mlp.gate_proj.weight": o + "w_gate.weight", h + "mlp.up_proj.weight": o + "w_up.weight",
                  h + "mlp.down_proj.weight": o + "w_down.weight"})
    with torch.no_grad():
        for hname, p in hf.named_parameters():
            p.copy_(sd[m[hname] if hname in m else "embed.weight"])
        hf = hf.to(device).float().eval()
        ids = torch.randint(0, cfg.n_vocab, (1, 300), generator=torch.Generator().manual_seed(5)).to(device)
        ref = hf(ids).logits.float()
        ours = model.float()(ids).float()
    return float((ref - ours).abs().max()), float(ref.abs().max())
