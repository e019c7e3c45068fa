"""
Causal attention for nanoPE: one entry point,

    y = attend(q, k, v, mod=None, vmod=None, backend='auto', dropout_p=0.0)

q [B, H, Tq, D], k [B, H, Tk, D], v [B, H, Tk, Dv] -> y [B, H, Tq, Dv]. The queries are the
last Tq of the Tk keys (a KV cache holds the first Tk - Tq), so key j is visible to query i
when j <= i + Tk - Tq (`visible`, the one rule every path below uses).
  mod(score, b, h, i, j)  an additive logit bias in FlexAttention's score_mod form
  vmod(lse)               a term [B, H, Tq, Dv] added to the output, given each row's logsumexp
Paths (same logits on all of them):
  - no bias, no value term    -> F.scaled_dot_product_attention (is_causal, or a boolean mask)
  - bias, FlexAttention       -> compiled flex_attention(score_mod, causal block mask); CUDA by
    default, CPU only without gradients (torch 2.13 has no FlexAttention backward on CPU)
  - bias, dense               -> the score_mod evaluated once on broadcast index tensors into a
    float32 [B|1, H, Tq, Tk] additive mask, attention in float32 (a bf16 bias would not equal
    the kernel's float32 one: -500.3 becomes -500); without gradients in query chunks
  - value term (Shaw)         -> needs each row's logsumexp: FlexAttention returns it on CUDA;
    compiled flex on CPU cannot in torch 2.13, so it runs dense on CPU
When v's head dim is smaller than q's, v is padded with zero columns so that SDPA's fused
kernels run (they need equal head dims) and the output is cut back to Dv.
Attention dropout with a bias: the dropped keys come from a hash of (seed, b, h, i, j), so
FlexAttention and the dense path drop the same ones; FlexAttention then rescales by
exp(lse_kept - lse_all), which turns its softmax over the kept keys into dropout's softmax
over all of them.
"""

import math

import torch
import torch.nn.functional as F

# Compiled FlexAttention on CPU cannot return the logsumexp (torch 2.13: "return_lse is
# not supported yet"), so a scheme with a value term (Shaw) runs dense on CPU.
FLEX_LSE_ON_CPU = False
# Without gradients, attention that builds [B, H, Tq, Tk] float32 tensors outside a kernel (the
# dense path, CoPE, stick-breaking, RoPE's Self-Extend/ReRoPE) goes through in query chunks
# whose tensor stays below this. Small on purpose: glibc maps every allocation over 32 MiB
# afresh (page faults on each op); at T = 2048-8192 on CPU 16 MiB chunks ran 1.0-5.9x faster
# than 256 MiB ones (docs/speed.md).
DENSE_CHUNK_BYTES = 16 * 2**20
FLEX_BLOCK = 128  # FlexAttention's default sparse block size
FLEX_SHAPES = 256  # compiled FlexAttention kernels kept per process (one per input shape)
_compiled = {}


def visible(i, j, Tq, Tk):
    """Key j is visible to query i (ints or broadcastable tensors): the queries are the last Tq of Tk keys."""
    return j <= i + (Tk - Tq)


def visibility(Tq, Tk, device, strict=False):
    """[Tq, Tk] bool of `visible`; strict=True also hides each query's own key."""
    i = torch.arange(Tq, device=device)[:, None] - int(strict)
    return visible(i, torch.arange(Tk, device=device)[None, :], Tq, Tk)


def chunk_queries(fn, q, k, v):
    """fn(q, k, v, s) -> a tensor, or a tuple of tensors or None, with the queries on dim 2.
    Without gradients, when one float32 [B, H, Tq, Tk] tensor would exceed DENSE_CHUNK_BYTES, fn
    runs on query rows s..e-1 and the keys and values they can see, [:e + Tk - Tq] (each chunk is
    the same problem, smaller), and the results are concatenated; otherwise once, with s = 0."""
    B, H, Tq, _ = q.shape
    Tk = k.size(2)
    if torch.is_grad_enabled() or B * H * Tq * Tk * 4 <= DENSE_CHUNK_BYTES:
        return fn(q, k, v, 0)
    off, rows = Tk - Tq, max(1, DENSE_CHUNK_BYTES // (4 * B * H * Tk))
    outs = [fn(q[:, :, s:s + rows], k[:, :, :s + rows + off], v[:, :, :s + rows + off], s)
            for s in range(0, Tq, rows)]
    if isinstance(outs[0], tuple):
        return tuple(None if parts[0] is None else torch.cat(parts, 2) for parts in zip(*outs))
    return torch.cat(outs, 2)


def _flex():
    """Compiled flex_attention, built once: eager FlexAttention materialises the full score
    matrix (13 GiB and 24 s at T=8192 on CPU; compiled 0.6 GiB, 1.3 s)."""
    if 'flex' not in _compiled:
        from torch.nn.attention.flex_attention import flex_attention
        # one kernel per shape, and an evaluation suite visits dozens of shapes (lengths x batch
        # sizes); past dynamo's default limit of 8 it would fall back to eager FlexAttention
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, FLEX_SHAPES)
        _compiled['flex'] = torch.compile(flex_attention, dynamic=False)
    return _compiled['flex']


def causal_block_mask(Tq, Tk, device):
    """FlexAttention BlockMask of `visible`, from block counts: a few tensor ops on (T/128)^2
    integers, so a compiled model traces it with no graph break and no Python-side cache
    (equals create_block_mask; tested)."""
    from torch.nn.attention.flex_attention import BlockMask
    off, BS = Tk - Tq, FLEX_BLOCK
    m = torch.arange(-(-Tq // BS), device=device)[:, None]  # query blocks
    n = torch.arange(-(-Tk // BS), device=device)[None, :]  # key blocks
    q_lo, q_hi = m * BS, torch.clamp((m + 1) * BS, max=Tq) - 1
    full = ((n + 1) * BS - 1 <= q_lo + off) & ((m + 1) * BS <= Tq) & ((n + 1) * BS <= Tk)  # no mask needed
    part = (n * BS <= q_hi + off) & ~full  # some keys visible: mask_mod decides

    def blocks(sel):  # counts, and the selected block indices first (ascending)
        idx = torch.argsort((~sel).to(torch.int8), dim=-1, stable=True)
        return sel.sum(-1).to(torch.int32)[None, None], idx.to(torch.int32)[None, None]
    return BlockMask.from_kv_blocks(*blocks(part), *blocks(full), BLOCK_SIZE=BS,
                                    mask_mod=lambda b, h, i, j: visible(i, j, Tq, Tk), seq_lengths=(Tq, Tk))


def use_flex(q, backend, vmod):
    """'auto': FlexAttention on CUDA; on CPU the dense path, which is as fast there (query
    chunks without gradients, SDPA's fused kernel) while compiled flex costs 9-500 s per
    new shape (docs/speed.md). A decoding step's bias is one row per head: dense too."""
    if backend == 'dense' or (vmod is not None and q.device.type == 'cpu' and not FLEX_LSE_ON_CPU):
        return False
    return backend == 'flex' or (q.device.type == 'cuda' and q.size(2) > 1)


def _mix(x):
    """One round of a 31-bit integer hash (xorshift-multiply); exact int64 arithmetic,
    so every device and both attention paths get the same bits."""
    x = ((x ^ (x >> 15)) * 0x2C1B3C6D) & 0x7FFFFFFF
    x = ((x ^ (x >> 12)) * 0x297A2D39) & 0x7FFFFFFF
    return x ^ (x >> 15)


def dropout_keep(seed, p, b, h, i, j):
    """Attention dropout's keep mask as a pure function of (seed, batch, head, query, key)."""
    return _mix(_mix(_mix(_mix(seed + b) + h) + i) + j) >= int(p * 2**31)


def dense_bias(mod, B, H, Tq, Tk, device):
    """Evaluate a score_mod on broadcast indices -> float32 additive causal mask [B|1, H|1, Tq, Tk]."""
    b = torch.arange(B, device=device).view(B, 1, 1, 1)
    h = torch.arange(H, device=device).view(1, H, 1, 1)
    i = torch.arange(Tq, device=device).view(1, 1, Tq, 1)
    j = torch.arange(Tk, device=device).view(1, 1, 1, Tk)
    bias = mod(torch.zeros((), device=device), b, h, i, j) if mod is not None else torch.zeros((), device=device)
    return bias.float().masked_fill(~visible(i, j, Tq, Tk), float('-inf'))


def _dense(q, k, v, mod, dropout_p, seed, need_lse, s=0):
    """float32 attention with a dense bias for query rows s.. -> (y in float32, lse or None).
    Autocast is off inside: it would cast the float32 inputs (and so the bias's effect) back to bf16."""
    if s:
        mod = None if mod is None else (lambda score, b, h, i, j, mod=mod: mod(score, b, h, i + s, j))
    with torch.autocast(q.device.type, enabled=False):
        return _dense_fp32(q, k, v, mod, dropout_p, seed, need_lse, s)


def _dense_fp32(q, k, v, mod, dropout_p, seed, need_lse, s):
    B, H, Tq, d = q.shape
    bias = dense_bias(mod, B, H, Tq, k.size(2), q.device)
    if not (dropout_p or need_lse):  # SDPA's fused softmax; float32 inputs so the bias stays float32
        return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=bias), None
    if not dropout_p and q.device.type == 'cpu' and not torch.is_grad_enabled():
        # SDPA's fused CPU kernel also returns each row's logsumexp (15x faster than the three
        # passes below at T = 2048); without gradients only, as its lse has no backward
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q.float(), k.float(), v.float(),
                                                                         attn_mask=bias)
    att = (q.float() @ k.float().transpose(-2, -1)) / math.sqrt(d) + bias
    lse = att.logsumexp(-1)
    p = (att - lse.unsqueeze(-1)).exp()
    if dropout_p:
        ix = [torch.arange(n, device=q.device).view(*[-1 if a == ax else 1 for a in range(4)])
              for ax, n in enumerate((B, H, Tq, k.size(2)))]
        ix[2] = ix[2] + s
        p = p * dropout_keep(seed, dropout_p, *ix) / (1 - dropout_p)
    return p @ v.float(), lse


def _flex_attend(q, k, v, mod, dropout_p, seed, need_lse):
    """FlexAttention -> (y, lse or None); with dropout, the kept keys' softmax rescaled to all keys'."""
    from torch.nn.attention import flex_attention as fa
    bm = causal_block_mask(q.size(2), k.size(2), q.device)

    def run(score_mod, lse):
        if not lse:
            return _flex()(q, k, v, score_mod=score_mod, block_mask=bm), None
        if hasattr(fa, 'AuxRequest'):  # torch >= 2.9
            y, aux = _flex()(q, k, v, score_mod=score_mod, block_mask=bm, return_aux=fa.AuxRequest(lse=True))
            return y, aux.lse  # natural-log lse, differentiable
        return _flex()(q, k, v, score_mod=score_mod, block_mask=bm, return_lse=True)
    if not dropout_p:
        return run(mod, need_lse)

    def dropped(score, b, h, i, j):
        s = mod(score, b, h, i, j) if mod is not None else score
        return torch.where(dropout_keep(seed, dropout_p, b, h, i, j), s, float('-inf'))
    y, lse_kept = run(dropped, True)
    _, lse = run(mod, True)
    scale = (lse_kept - lse).exp().unsqueeze(-1) / (1 - dropout_p)  # 0 for a row with every key dropped
    return y * scale.to(y.dtype), lse


def attend(q, k, v, mod=None, vmod=None, backend='auto', dropout_p=0.0):
    """Causal attention with an optional score bias `mod(score, b, h, i, j)` and an optional
    value term `vmod(lse) -> [B, H, Tq, Dv]` added to the output (lse = each row's logsumexp)."""
    Dv = v.size(-1)
    if Dv < q.size(-1):  # zero columns change nothing, and let SDPA's fused kernels run
        v = F.pad(v, (0, q.size(-1) - Dv))
    Tq, Tk = q.size(2), k.size(2)
    if mod is None and vmod is None:
        if Tq == Tk:  # no cache: plain causal
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p)
        elif Tq == 1:  # one new token after the cache sees every key: no mask to build
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=visibility(Tq, Tk, q.device), dropout_p=dropout_p)
        return y[..., :Dv]
    # a fresh dropout seed per call from torch's RNG: on the device, no host sync, restored on resume
    seed = torch.randint(0, 2**31 - 1, (), device=q.device) if dropout_p else None
    need_lse = vmod is not None
    if use_flex(q, backend, vmod):
        y, lse = _flex_attend(q, k, v, mod, dropout_p, seed, need_lse)
    else:
        y, lse = chunk_queries(lambda q, k, v, s: _dense(q, k, v, mod, dropout_p, seed, need_lse, s), q, k, v)
    y = y[..., :Dv]
    if vmod is not None:
        y = y + vmod(lse).to(y.dtype)
    return y.to(q.dtype)
