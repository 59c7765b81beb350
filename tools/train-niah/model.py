"""The test model: a plain Llama (RMSNorm, GQA attention with RoPE, SwiGLU MLP, tied embeddings),
written out here rather than taken from HF so that training has no dependency beyond PyTorch.
The layout and RoPE convention are HF's (rotate-half), so export.py applies the same Q/K
permutation llama.cpp's converter applies to HF Llama checkpoints.
"""
import math
from dataclasses import dataclass, asdict

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Config:
    n_vocab: int = 2621
    d_model: int = 256
    n_layer: int = 6
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 64
    d_ff: int = 704
    # Base 500k (Llama 3's): the slowest rotary pair barely turns over 8k positions, so no two
    # positions of an 8k context look alike to attention.
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5
    n_ctx: int = 8192

    def to_dict(self):
        return asdict(self)


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).type_as(x)


def rope_cos_sin(cfg, T, device):
    inv_freq = cfg.rope_theta ** (-torch.arange(0, cfg.head_dim, 2, device=device, dtype=torch.float64) / cfg.head_dim)
    pos = torch.arange(T, device=device, dtype=torch.float64)
    freqs = torch.outer(pos, inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)  # HF layout: pair i is (i, i + head_dim/2)
    return emb.cos().float(), emb.sin().float()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def attention(q, k, v):
    """Causal attention; q [B,H,T,D], k/v [B,Hkv,T,D]. Query head h reads KV head h // n_rep,
    as HF's repeat_kv and llama.cpp do."""
    n_rep = q.shape[1] // k.shape[1]
    if n_rep > 1:
        k = k.repeat_interleave(n_rep, dim=1)
        v = v.repeat_interleave(n_rep, dim=1)
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    # torch < 2.0 (a CPU dry run on Debian's python3-torch): the plain formula.
    T = q.shape[2]
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    s = s.masked_fill(mask, float("-inf"))
    return s.softmax(-1).type_as(v) @ v


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        d, hd = cfg.d_model, cfg.head_dim
        self.attn_norm = RMSNorm(d, cfg.norm_eps)
        self.wq = nn.Linear(d, cfg.n_head * hd, bias=False)
        self.wk = nn.Linear(d, cfg.n_head_kv * hd, bias=False)
        self.wv = nn.Linear(d, cfg.n_head_kv * hd, bias=False)
        self.wo = nn.Linear(cfg.n_head * hd, d, bias=False)
        self.ffn_norm = RMSNorm(d, cfg.norm_eps)
        self.w_gate = nn.Linear(d, cfg.d_ff, bias=False)
        self.w_up = nn.Linear(d, cfg.d_ff, bias=False)
        self.w_down = nn.Linear(cfg.d_ff, d, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        c = self.cfg
        h = self.attn_norm(x)
        q = self.wq(h).view(B, T, c.n_head, c.head_dim).transpose(1, 2)
        k = self.wk(h).view(B, T, c.n_head_kv, c.head_dim).transpose(1, 2)
        v = self.wv(h).view(B, T, c.n_head_kv, c.head_dim).transpose(1, 2)
        cos_, sin_ = cos.to(q.dtype), sin.to(q.dtype)
        q = q * cos_ + rotate_half(q) * sin_
        k = k * cos_ + rotate_half(k) * sin_
        a = attention(q, k, v).transpose(1, 2).reshape(B, T, c.n_head * c.head_dim)
        x = x + self.wo(a)
        h = self.ffn_norm(x)
        return x + self.w_down(F.silu(self.w_gate(h)) * self.w_up(h))


class Llama(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.n_vocab, cfg.d_model)
        self.layers = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self._rope = {}
        std = 0.02
        for name, p in self.named_parameters():
            if p.dim() == 2:
                # Residual-branch outputs scaled down with depth (GPT-2's rule): keeps the
                # residual stream's variance flat at init.
                scale = 1 / math.sqrt(2 * cfg.n_layer) if name.endswith(("wo.weight", "w_down.weight")) else 1
                nn.init.normal_(p, 0, std * scale)

    def rope(self, T, device):
        key = (T, str(device))
        if key not in self._rope:
            self._rope = {key: rope_cos_sin(self.cfg, T, device)}
        return self._rope[key]

    def forward(self, idx):
        x = self.embed(idx)
        cos, sin = self.rope(idx.shape[1], idx.device)
        for layer in self.layers:
            x = layer(x, cos, sin)
        # Tied output head: the GGUF has no output.weight and the engine reuses token_embd.
        return self.norm(x) @ self.embed.weight.t().to(x.dtype)

    def n_params(self):
        return sum(p.numel() for p in self.parameters())
