"""
One-file GPT for nanoPE. Pre-LN blocks, tied embeddings, GPT-2 init, a KV cache,
and an attention that asks positional.py for everything position-related.

Attention paths (chosen per call, same logits on all of them):
  - no score bias            -> F.scaled_dot_product_attention(is_causal=True)
  - score bias, FlexAttention -> flex_attention(score_mod=..., block_mask=causal)
    (CUDA always; CPU only for no-grad forwards, compiled, since torch 2.13 has
    no FlexAttention backward on CPU). Never builds a TxT bias.
  - score bias, dense        -> the same score_mod evaluated on broadcast index
    tensors into a [B|1, H, Tq, Tk] additive mask for SDPA.
  - value term (Shaw)        -> the scheme adds a term to the output that needs each
    row's logsumexp: FlexAttention returns it (AuxRequest(lse=True), CUDA only: compiled
    flex on CPU does not support it in torch 2.13); the dense path then computes
    the softmax explicitly instead of calling SDPA.
"""

import inspect
import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from torch.nn import functional as F

import positional


@dataclass
class GPTConfig:
    block_size: int = 256          # training context length L
    vocab_size: int = 50304
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = False
    pos_encoding: str = 'rope'     # a key of positional.REGISTRY
    pos_options: dict = field(default_factory=dict)  # kwargs for that scheme
    rope_scaling: dict = None      # run-time RoPE context extension (overrides pos_options)
    attn_backend: str = 'auto'     # 'auto' | 'flex' | 'dense' (for schemes that bias scores)


# --- attention backends -------------------------------------------------------

# On CPU, use FlexAttention for a no-grad forward once the dense bias would exceed
# this many bytes; below it the dense mask is cheaper than compiling a kernel.
FLEX_CPU_MIN_BIAS_BYTES = 256 * 2**20
# Compiled FlexAttention on CPU cannot return the logsumexp (torch 2.13: "return_lse is
# not supported yet"), so a scheme with a value term (Shaw) runs dense on CPU.
FLEX_LSE_ON_CPU = False
_compiled = {}
_block_masks = {}


def _flex(fn='flex_attention'):
    """Compiled flex_attention / create_block_mask: eager FlexAttention materialises
    the full score matrix (13 GiB and 24 s at T=8192 on CPU; compiled 0.6 GiB, 1.3 s)."""
    if fn not in _compiled:
        import torch.nn.attention.flex_attention as fa
        _compiled[fn] = torch.compile(getattr(fa, fn), dynamic=False)
    return _compiled[fn]


def causal_block_mask(Tq, Tk, q0, k0, device):
    """Block mask for key position <= query position; built once per shape and reused."""
    key = (Tq, Tk, q0, k0, str(device))
    if key not in _block_masks:
        def causal(b, h, qi, ki):
            return ki + k0 <= qi + q0
        _block_masks[key] = _flex('create_block_mask')(causal, B=None, H=None, Q_LEN=Tq, KV_LEN=Tk,
                                                       device=device)
    return _block_masks[key]


def use_flex(q, k, backend):
    if backend == 'flex':
        return True
    if backend == 'dense':
        return False
    if q.size(2) == 1:  # a decoding step: its bias is one row per head, and a block mask
        return False    # per cache length would be rebuilt (and recompiled) every token
    if q.device.type == 'cuda':
        return True
    B, H, Tq, _ = q.shape
    return (not torch.is_grad_enabled()) and B * H * Tq * k.size(2) * 4 >= FLEX_CPU_MIN_BIAS_BYTES


def dense_bias(mod, ctx, B, H, device, dtype):
    """Evaluate a positional score_mod on broadcast indices -> additive causal mask."""
    b = torch.arange(B, device=device).view(B, 1, 1, 1)
    h = torch.arange(H, device=device).view(1, H, 1, 1)
    qp = ctx.q_pos.view(1, 1, -1, 1)
    kp = ctx.k_pos.view(1, 1, 1, -1)
    bias = mod(torch.zeros((), device=device, dtype=torch.float32), b, h, qp, kp)
    bias = bias.float().masked_fill(kp > qp, float('-inf'))
    return bias.to(dtype)


def attend(q, k, v, mod, ctx, backend='auto', dropout_p=0.0, vmod=None):
    """Causal attention with an optional score bias `mod` and an optional value term
    `vmod(lse) -> [B, H, Tq, Dv]` added to the output (lse = each row's logsumexp)."""
    Tq, Tk = q.size(2), k.size(2)
    if mod is None and vmod is None:
        if Tq == Tk:  # no cache: plain causal
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p)
        if Tq == 1:  # one new token after the cache sees every key: no mask to build
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
        mask = ctx.k_pos[None, :] <= ctx.q_pos[:, None]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
    if use_flex(q, k, backend) and (vmod is None or q.device.type != 'cpu' or FLEX_LSE_ON_CPU):
        q0, k0 = int(ctx.q_pos[0]), int(ctx.k_pos[0])  # positions are contiguous ranges

        def score_mod(score, b, h, qi, ki):
            return mod(score, b, h, qi + q0, ki + k0)
        bm = causal_block_mask(Tq, Tk, q0, k0, q.device)
        if vmod is None:
            return _flex()(q, k, v, score_mod=score_mod if mod is not None else None, block_mask=bm)
        from torch.nn.attention.flex_attention import AuxRequest
        y, aux = _flex()(q, k, v, score_mod=score_mod if mod is not None else None, block_mask=bm,
                         return_aux=AuxRequest(lse=True))  # natural-log lse, differentiable
        return y + vmod(aux.lse).to(y.dtype)
    if mod is not None:
        bias = dense_bias(mod, ctx, q.size(0), q.size(1), q.device, q.dtype)
    else:
        bias = torch.zeros((), device=q.device).masked_fill(ctx.k_pos[None, :] > ctx.q_pos[:, None], float('-inf'))
    if vmod is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p)
    # value term: SDPA does not return the logsumexp, so do the softmax by hand here
    att = (q @ k.transpose(-2, -1)).float() / math.sqrt(q.size(-1)) + bias.float()
    lse = att.logsumexp(-1)
    p = F.dropout((att - lse.unsqueeze(-1)).exp(), dropout_p)
    return (p.to(v.dtype) @ v) + vmod(lse).to(v.dtype)


# --- the model ------------------------------------------------------------------

class CausalSelfAttention(nn.Module):

    def __init__(self, config, pe):
        super().__init__()
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.dropout = config.dropout
        self.backend = config.attn_backend
        self.pe_layer = pe.new_layer()  # this layer's positional parameters, if any

    def forward(self, x, pe, ctx, cache=None):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if not pe.transform_after_cache:
            q, k = pe.transform_qk(q, k, ctx, self.pe_layer)  # new keys get their positions here
        if cache is not None:  # cached keys were transformed when they were new
            k, v = cache.append(k, v)
        if pe.transform_after_cache:  # the cache holds raw keys; all keys are transformed each forward
            q, k = pe.transform_qk(q, k, ctx, self.pe_layer)
        mod = pe.score_mod(q, ctx, self.pe_layer)
        vmod = pe.value_mod(q, k, ctx, self.pe_layer)
        y = attend(q, k, v, mod, ctx, self.backend, self.dropout if self.training else 0.0, vmod)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))


class Block(nn.Module):

    def __init__(self, config, pe):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config, pe)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x, pe, ctx, cache=None):
        x = x + self.attn(self.ln_1(x), pe, ctx, cache)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):

    def __init__(self, config):
        super().__init__()
        if config.n_embd % config.n_head:  # before the scheme, whose head_dim would be wrong
            ok = [h for h in range(1, min(config.n_embd, 64) + 1) if config.n_embd % h == 0]
            raise ValueError(f"n_embd={config.n_embd} is not divisible by n_head={config.n_head}: every head "
                             f"gets n_embd/n_head dims. Use an n_head that divides {config.n_embd} "
                             f"({', '.join(map(str, ok))}) or an n_embd that is a multiple of {config.n_head}")
        self.config = config
        self.pe = positional.build(config)  # shared by all layers
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config, self.pe) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        # GPT-2 init for the transformer; positional modules initialise themselves
        for name, m in self.named_modules():
            if not any(p in ('pe', 'pe_layer') for p in name.split('.')):
                self._init_weights(m)
        for pn, p in self.named_parameters():
            if pn.endswith('c_proj.weight'):  # scaled residual projections (GPT-2)
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def get_num_params(self):
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx, targets=None, cache=None, reduction='mean'):
        """idx [B, T]. With `cache` (from new_cache()), positions continue after the
        cached tokens. No cap at block_size: evaluating past L is the point."""
        B, T = idx.size()
        start = cache.length if cache is not None else 0
        q_pos = torch.arange(start, start + T, device=idx.device)
        k_pos = torch.arange(0, start + T, device=idx.device) if cache is not None else q_pos
        x = self.pe.embed(self.transformer.wte(idx), q_pos)
        x = self.transformer.drop(x)
        ctx = self.pe.context(q_pos, k_pos)  # once per forward, shared by every layer
        for i, block in enumerate(self.transformer.h):
            x = block(x, self.pe, ctx, cache.layers[i] if cache is not None else None)
        if cache is not None:
            cache.length += T
        x = self.transformer.ln_f(x)
        if targets is None:
            return self.lm_head(x), None
        logits = self.lm_head(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1),
                               ignore_index=-1, reduction=reduction)
        return logits, loss

    def new_cache(self):
        return KVCache(self.config.n_layer)

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        params = [p for p in self.parameters() if p.requires_grad]
        decay = [p for p in params if p.dim() >= 2]      # matmuls and embedding tables
        no_decay = [p for p in params if p.dim() < 2]    # biases, norms, per-head scalars
        groups = [{'params': decay, 'weight_decay': weight_decay},
                  {'params': no_decay, 'weight_decay': 0.0}]
        fused = 'fused' in inspect.signature(torch.optim.AdamW).parameters and device_type in ('cuda', 'cpu')
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=fused or None)

    def estimate_mfu(self, fwdbwd_per_iter, dt, peak_flops):
        """Model FLOPs utilisation (PaLM appendix B): 6N + 12*L*H*Q*T FLOPs per token."""
        N = self.get_num_params()
        cfg = self.config
        L, H, Q, T = cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head, cfg.block_size
        flops_per_iter = (6 * N + 12 * L * H * Q * T) * T * fwdbwd_per_iter
        return flops_per_iter / dt / peak_flops

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True):
        """Sample max_new_tokens after idx [B, T]. With a KV cache, each new token
        costs one position. A scheme with a finite position table (learned) falls
        back to a sliding window of its last max_len tokens, recomputed each step."""
        max_len = self.pe.max_len
        cache = self.new_cache() if use_cache else None
        for _ in range(max_new_tokens):
            fits = max_len is None or idx.size(1) <= max_len
            if cache is not None and fits:
                inp = idx if cache.length == 0 else idx[:, cache.length:]
                logits, _ = self(inp, cache=cache)
            else:  # sliding window (or no cache): recompute over the visible context
                cache = None
                ctx = idx if max_len is None else idx[:, -max_len:]
                logits, _ = self(ctx)
            logits = logits[:, -1, :] / max(temperature, 1e-8)
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float('inf')
            idx_next = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx


class KVCache:
    """Per-layer keys and values (keys already position-transformed) and the length so far."""

    def __init__(self, n_layer):
        self.layers = [LayerKV() for _ in range(n_layer)]
        self.length = 0


class LayerKV:
    """One layer's cache. layer[0], layer[1] are the keys and values so far, [B, H, n, hd].
    They live in buffers that grow by doubling, so appending a token copies that token
    only; torch.cat would copy the whole cache every token (O(n^2) over a generation).
    Under autograd every append gets a fresh buffer instead, since writing into one that
    an earlier step saved for backward would break that backward."""

    def __init__(self):
        self.k = self.v = None
        self.n = 0

    def __getitem__(self, i):
        return None if self.k is None else (self.k, self.v)[i][:, :, :self.n]

    def append(self, k, v):
        n, T = self.n, k.size(2)
        if self.k is None or n + T > self.k.size(2) or torch.is_grad_enabled():
            cap = n + T if torch.is_grad_enabled() else max(2 * (n + T), 64)
            kb, vb = (t.new_empty(t.shape[:2] + (cap,) + t.shape[3:]) for t in (k, v))
            if n:
                kb[:, :, :n], vb[:, :, :n] = self[0], self[1]
            self.k, self.v = kb, vb
        self.k[:, :, n:n + T], self.v[:, :, n:n + T] = k, v
        self.n = n + T
        return self[0], self[1]
