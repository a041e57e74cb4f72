"""The DeepSeek V4 MTP block in PyTorch, written from the model's math
(shared/docs/dsv4-model.md §3.2-3.8 and DeepSeek's reference MTPBlock),
independently of the engine's C code: the reference of the MTP logits and
the module train_mtp.py trains.

  e      = e_proj . RMSNorm(embed(t), enorm)
  Hin[s] = e + h_proj . RMSNorm(H[s], hnorm)
  Hout   = one decoder block (sliding-window attention, top-k MoE)
  logits = output . RMSNorm(hc_head(Hout), norm)
"""
import math

import torch
import torch.nn.functional as F

# GGUF suffix -> parameter name (shapes in torch order)
NAMES = ["hc_attn_fn", "hc_attn_scale", "hc_attn_base", "attn_norm", "attn_q_a", "attn_q_a_norm", "attn_q_b",
         "attn_kv", "attn_kv_a_norm", "attn_sinks", "attn_output_a", "attn_output_b", "hc_ffn_fn", "hc_ffn_scale",
         "hc_ffn_base", "ffn_norm", "ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps",
         "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"]
OWN = ["e_proj", "h_proj", "enorm", "hnorm", "norm", "hc_head_fn", "hc_head_base", "hc_head_scale"]


def gguf_name(p):
    if p == "exp_probs_b":
        return "mtp.0.exp_probs_b.bias"
    return f"mtp.0.{p}.weight"


class Cfg:
    def __init__(self, meta):
        a = "deepseek4."
        self.E = meta[a + "embedding_length"]
        self.H = meta[a + "attention.head_count"]
        self.D = meta[a + "attention.key_length"]
        self.R = meta[a + "rope.dimension_count"]
        self.QL = meta[a + "attention.q_lora_rank"]
        self.OL = meta[a + "attention.output_lora_rank"]
        self.G = meta[a + "attention.output_group_count"]
        self.NE = meta[a + "expert_count"]
        self.K = meta[a + "expert_used_count"]
        self.FF = meta[a + "expert_feed_forward_length"]
        self.W = meta[a + "attention.sliding_window"]
        self.HC = meta[a + "hyper_connection.count"]
        self.iters = meta[a + "hyper_connection.sinkhorn_iterations"]
        self.eps = meta[a + "attention.layer_norm_rms_epsilon"]
        self.hc_eps = meta[a + "hyper_connection.epsilon"]
        self.base = meta[a + "rope.freq_base"]
        self.scale = meta[a + "expert_weights_scale"]
        self.clamp = meta[a + "swiglu_clamp_exp"][-1]


def rms(x, w, eps):
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if w is None else y * w


def rope(x, pos, R, base, inverse=False):
    """Interleaved pairs of the trailing R dims; x [..., T, D] with pos [T]."""
    om = torch.tensor([base ** (-2.0 * i / R) for i in range(R // 2)], dtype=torch.float64).float().to(x.device)
    th = pos.float()[:, None] * om[None, :]  # [T, R/2]
    c, s = torch.cos(th), torch.sin(th)
    if inverse:
        s = -s
    D = x.shape[-1]
    nope, r = x[..., :D - R], x[..., D - R:]
    x0, x1 = r[..., 0::2], r[..., 1::2]
    shape = [1] * (x.dim() - 2) + list(c.shape)
    c, s = c.reshape(shape), s.reshape(shape)
    y0, y1 = x0 * c - x1 * s, x0 * s + x1 * c
    return torch.cat([nope, torch.stack([y0, y1], dim=-1).flatten(-2)], dim=-1)


class MTP(torch.nn.Module):
    def __init__(self, cfg, init):
        """init: dict name -> tensor (every NAMES/OWN entry and exp_probs_b)."""
        super().__init__()
        self.c = cfg
        for n in NAMES + OWN + ["exp_probs_b"]:
            self.register_parameter(n, torch.nn.Parameter(init[n].clone().float()))

    def hc_pre(self, X, fn, scale, base):
        c = self.c
        f = X.flatten(-2)
        m = (f @ fn.t()) * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + c.eps)
        HC = c.HC
        pre = torch.sigmoid(m[..., :HC] * scale[0] + base[:HC]) + c.hc_eps
        post = 2 * torch.sigmoid(m[..., HC:2 * HC] * scale[1] + base[HC:2 * HC])
        A = (m[..., 2 * HC:] * scale[2] + base[2 * HC:]).reshape(*m.shape[:-1], HC, HC)
        A = torch.softmax(A, dim=-1) + c.hc_eps
        A = A / (A.sum(-2, keepdim=True) + c.hc_eps)
        for _ in range(c.iters - 1):
            A = A / (A.sum(-1, keepdim=True) + c.hc_eps)
            A = A / (A.sum(-2, keepdim=True) + c.hc_eps)
        y = (pre[..., None] * X).sum(-2)
        return y, post, A

    @staticmethod
    def hc_post(X, Fo, post, A):
        # X'[j] = post[j] F + sum_i A[i][j] X[i]
        return post[..., None] * Fo[..., None, :] + torch.einsum("...ij,...id->...jd", A, X)

    def attention(self, a, pos):
        c = self.c
        B, T, _ = a.shape
        qr = rms(a @ self.attn_q_a.t(), self.attn_q_a_norm, c.eps)
        q = (qr @ self.attn_q_b.t()).reshape(B, T, c.H, c.D)
        q = rms(q, None, c.eps)
        kv = rms(a @ self.attn_kv.t(), self.attn_kv_a_norm, c.eps)  # [B, T, D]
        q = rope(q.transpose(1, 2), pos, c.R, c.base)  # [B, H, T, D]
        kv = rope(kv, pos, c.R, c.base)  # [B, T, D]
        s = torch.einsum("bhtd,bsd->bhts", q, kv) / math.sqrt(c.D)
        i = torch.arange(T, device=a.device)
        ok = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - c.W)  # W rows including itself
        s = s.masked_fill(~ok, float("-inf"))
        sink = self.attn_sinks.reshape(1, c.H, 1, 1).expand(B, c.H, T, 1)
        p = torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :T]
        o = torch.einsum("bhts,bsd->bhtd", p, kv)
        o = rope(o, pos, c.R, c.base, inverse=True).transpose(1, 2)  # [B, T, H, D]
        per = c.H // c.G
        o = o.reshape(B, T, c.G, per * c.D)
        wa = self.attn_output_a.reshape(c.G, c.OL, per * c.D)
        u = torch.einsum("btgd,grd->btgr", o, wa).reshape(B, T, c.G * c.OL)
        return u @ self.attn_output_b.t()

    def swiglu(self, x, wg, wu, wd):
        c = self.c
        g = torch.clamp(x @ wg.t(), max=c.clamp)
        u = torch.clamp(x @ wu.t(), -c.clamp, c.clamp)
        return (F.silu(g) * u) @ wd.t()

    def moe(self, b):
        c = self.c
        sc = torch.sqrt(F.softplus(b @ self.ffn_gate_inp.t()))
        sel = torch.topk(sc + self.exp_probs_b, c.K, dim=-1).indices
        w = torch.gather(sc, -1, sel)
        w = w / w.sum(-1, keepdim=True) * c.scale
        out = self.swiglu(b, self.ffn_gate_shexp, self.ffn_up_shexp, self.ffn_down_shexp)
        for e in range(c.NE):
            we = (w * (sel == e)).sum(-1, keepdim=True)
            out = out + we * self.swiglu(b, self.ffn_gate_exps[e], self.ffn_up_exps[e], self.ffn_down_exps[e])
        return out

    def forward(self, h, emb, pos):
        """h [B, T, HC, E] main states, emb [B, T, E] embeddings of the paired tokens -> head input [B, T, E]."""
        c = self.c
        e = rms(emb, self.enorm, c.eps) @ self.e_proj.t()
        X = e[..., None, :] + rms(h, self.hnorm, c.eps) @ self.h_proj.t()
        y, post, A = self.hc_pre(X, self.hc_attn_fn, self.hc_attn_scale, self.hc_attn_base)
        X = self.hc_post(X, self.attention(rms(y, self.attn_norm, c.eps), pos), post, A)
        y, post, A = self.hc_pre(X, self.hc_ffn_fn, self.hc_ffn_scale, self.hc_ffn_base)
        X = self.hc_post(X, self.moe(rms(y, self.ffn_norm, c.eps)), post, A)
        f = X.flatten(-2)
        m = (f @ self.hc_head_fn.t()) * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + c.eps)
        pre = torch.sigmoid(m * self.hc_head_scale[0] + self.hc_head_base) + c.hc_eps
        return rms((pre[..., None] * X).sum(-2), self.norm, c.eps)
