"""
Attention for nanoPE: one layer's attention as the layer plan says (CausalSelfAttention, at the end of the file:
project, QK-norm, the scheme's hooks, the KV cache, attend), what a query may see (Mask: causal, a window, a chunk),
what a scheme adds to the logits (Bias: the bias contract, in the forms it can hand over), and one entry point that
runs it by the fastest route those forms allow:

    y = attend(q, k, v, bias=None, vmod=None, backend='auto', dropout_p=0.0, mask=CAUSAL, sink_logits=None)

q [B, H, Tq, D], k [B, H, Tk, D], v [B, H, Tk, Dv] -> y [B, H, Tq, Dv]. The queries are the last Tq of the Tk keys
(a KV cache holds the first Tk - Tq), and `mask` says which keys each query sees. k and v may have fewer heads than
q, H / g each (grouped keys, RoPE++): query head h then reads key/value head h // g (HF's repeat_kv).
  bias           a Bias (or a bare score_mod function or bias tensor, a Bias of that one form)
  vmod(lse)      a term [B, H, Tq, Dv] added to the output, given each row's logsumexp
  sink_logits    [H], one logit per head in every row's softmax denominator, with no value (gpt-oss):
                 p_ij = exp(z_ij) / (exp(s_h) + sum_j' exp(z_ij')), the softmax output times sigmoid(lse - s_h)
Each route is one entry of ROUTES, its rule beside its call: route() takes the first whose rule accepts the call
(a Call: device, attn_backend, the bias's forms, grad mode, sizes, dtype), and attend runs it. Every route gives the
same logits. Without gradients, the dense path and every windowed or chunked layer go through in query chunks
(chunk_queries) that slice in only the keys a chunk's queries can see: a windowed layer costs time and memory linear
in the length. When v's head dim is smaller than q's, v is padded with zero columns for SDPA's fused kernels (they
need equal head dims) and the output is cut back to Dv. Attention dropout with a bias drops the keys a hash of
(seed, b, h, i, j) names, so FlexAttention and the dense path drop the same ones. Length-dependent logit scaling
(attn_scaling: log-n, SSMax, Llama 4's temperature) is computed here (logit_scale) and applied to q and the bias
before attend (scale_logits), every form of the bias scaled alike.
"""

import math
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import flex_attention as fa
from torch.nn.attention.flex_attention import BlockMask, flex_attention

import kernels

# Compiled FlexAttention on CPU cannot return the logsumexp (torch 2.13: "return_lse is
# not supported yet"), so a value term (Shaw) or sink logits run dense on CPU.
FLEX_LSE_ON_CPU = False
# Without gradients, attention that builds [B, H, Tq, Tk] float32 tensors outside a kernel (the
# dense path, CoPE, stick-breaking, RoPE's Self-Extend/ReRoPE) goes through in query chunks
# whose tensor stays below this. Small on purpose: glibc maps every allocation over 32 MiB
# afresh (page faults on each op); at T = 2048-8192 on CPU 16 MiB chunks ran 1.0-5.9x faster
# than 256 MiB ones (docs/speed.md).
DENSE_CHUNK_BYTES = 16 * 2**20
# On CUDA the caching allocator reuses memory without page faults, and every chunk costs its kernel launches (FIRE's
# MLP bias: dozens a chunk), so chunks are larger there: at 16 MiB, FIRE's no-grad forward at 8L (390 chunks a layer)
# did not finish within 40 s on an H200 (results/gpu/2026-11-28-72e3812).
DENSE_CHUNK_BYTES_CUDA = 512 * 2**20


# Devices where the dense path takes a score_mod's `tabulate(i, j)`, its bias for rows i and keys j as one [H, Tq, Tk]
# table (FIRE's MLP by one product, 6x faster than its units one at a time on a chunk of 256 x 4096 logits on a
# CPU), rather than the mod evaluated on broadcast indices. Not the CPU, whose numbers stay the unit loop's.
TABULATE_ON = ('cuda',)


def dense_chunk_bytes(device_type):
    """The most bytes one float32 [B, H, rows, Tk] tensor of a query chunk may take on this device."""
    return DENSE_CHUNK_BYTES_CUDA if device_type == 'cuda' else DENSE_CHUNK_BYTES


FLEX_BLOCK = 128  # FlexAttention's default sparse block size
# The widest head of q and k SDPA's flash kernel takes (cuDNN's is no wider); a wider one (XL's 64 + 768 columns)
# falls to the memory-efficient kernel at that width, with v padded to it: 0.097x rope's step on an H200
# (results/gpu/2026-11-28-72e3812). In training its columns past v's go as a bias table instead (wide_split).
FUSED_MAX_WIDTH = 256
FLEX_SHAPES = 256  # compiled FlexAttention kernels kept per process (one per input shape)
# FlexAttention's tiles for a score_mod that reads a float32 table at each logit's (i, j) (a bias tensor, or a
# mod marked `reads_table`): Triton stages a tile's table block in shared memory, and at the default 128 x 128
# tiles the forward kernel needs 240 KiB, more than an H100 or H200 block may use (227 KiB; an H200 with
# torch 2.11, docs/gpu.md). 64 x 64 forward tiles fit; DeBERTa's backward at its default Hopper tiles (M1, N1,
# M2, N2 = 64, 128, 128, 64) needed 257 KiB, so the backward's two loops get 64 x 64 tiles too.
TABLE_TILES = {'BLOCK_M': 64, 'BLOCK_N': 64, 'BLOCK_M1': 64, 'BLOCK_N1': 64, 'BLOCK_M2': 64, 'BLOCK_N2': 64}
_compiled = {}
# Under torch.compile on CUDA, FlexAttention starts a graph of its own, its score_mod's tensors arriving as inputs.
# Traced into the model's one graph (torch 2.11, an H200, gpt2 preset), alibi's compile ran past 45 s (12 s in a
# graph of its own) and t5's failed: Inductor chose FlexAttention tiles that need 240 KiB of shared memory (227 KiB
# is the most). In graphs of their own they compiled and trained (results/gpu/2026-11-28-9bb9952).
FLEX_OWN_GRAPH = True


@dataclass(frozen=True)
class Mask:
    """Which keys a query sees, by token index (not by position: randomized positions move nothing).
    Key token u is visible to query token t when lowest(t) <= u <= t:
      causal      u <= t
      window W    t - u < W: the W most recent keys, the query's own included (HF, gpt-oss and
                  flash-linear-attention; FlashAttention's window_size=(W, 0), nanochat and
                  x-transformers' max_attend_past mean W + 1 keys)
      chunk C     t // C == u // C: the earlier keys of the query's own chunk of C tokens (Llama 4)
    In a forward the queries are the last Tq of Tk keys and key 0 is token k0 (a cache that dropped the
    keys no query can see any more starts later): query i is token k0 + Tk - Tq + i, key j token k0 + j."""
    window: int = None
    chunk: int = None
    k0: int = 0

    @property
    def bounded(self):
        """True when a query sees at most `span` keys, so a long sequence costs linear time and memory."""
        return self.window is not None or self.chunk is not None

    @property
    def span(self):
        return min(n for n in (self.window, self.chunk) if n is not None)

    def at(self, k0):
        return replace(self, k0=k0)

    def lowest(self, t):
        """The first key token visible to query token t (an int or a tensor; 0 when causal only)."""
        bounds = ([t - self.window + 1] if self.window is not None else []) + \
                 ([t // self.chunk * self.chunk] if self.chunk is not None else [])
        if len(bounds) < 2:
            return bounds[0] if bounds else 0
        a, b = bounds
        return torch.maximum(a, b) if torch.is_tensor(a) else max(a, b)

    def visible(self, i, j, Tq, Tk):
        """Key j is visible to query i (indices in this forward: ints or broadcastable tensors)."""
        off = Tk - Tq
        if not self.bounded:
            return j <= i + off
        t, u = i + (self.k0 + off), j + self.k0
        ok = u <= t
        if self.window is not None:
            ok = ok & (t - u < self.window)
        if self.chunk is not None:
            ok = ok & (t // self.chunk == u // self.chunk)
        return ok

    def visibility(self, Tq, Tk, device, strict=False):
        """[Tq, Tk] bool of `visible`; strict=True also hides each query's own key."""
        i = torch.arange(Tq, device=device)[:, None]
        j = torch.arange(Tk, device=device)[None, :]
        vis = self.visible(i, j, Tq, Tk)
        return vis & (j < i + (Tk - Tq)) if strict else vis

    def first_key(self, i, Tq, Tk):
        """Index of the first key query i can see (0 when every earlier key is visible)."""
        return max(0, self.lowest(self.k0 + Tk - Tq + i) - self.k0)

    def block_mask(self, Tq, Tk, device):
        """FlexAttention BlockMask of `visible`, from block counts: a few tensor ops on (T/128)^2
        integers, so a compiled model traces it with no graph break and no Python-side cache
        (equals create_block_mask; tested). The visible keys of a query token t form the interval
        [lowest(t), t], and both ends grow with t, so a block pair (queries qa..qb, keys ka..kb) has a
        visible key iff ka <= qb and lowest(max(qa, ka)) <= kb, and is all visible iff kb <= qa and
        lowest(qb) <= ka: blocks outside the window or chunk are skipped, not masked."""
        off, BS = self.k0 + Tk - Tq, FLEX_BLOCK  # query row r is token off + r; key j is token k0 + j
        m = torch.arange(-(-Tq // BS), device=device)[:, None]  # query blocks
        n = torch.arange(-(-Tk // BS), device=device)[None, :]  # key blocks
        qa, qb = m * BS + off, torch.clamp((m + 1) * BS, max=Tq) - 1 + off
        ka, kb = n * BS + self.k0, torch.clamp((n + 1) * BS, max=Tk) - 1 + self.k0
        complete = ((m + 1) * BS <= Tq) & ((n + 1) * BS <= Tk)  # a block cut by the end is always masked
        full = (kb <= qa) & (self.lowest(qb) <= ka) & complete  # every key visible: no mask_mod needed
        part = (ka <= qb) & (self.lowest(torch.maximum(qa, ka)) <= kb) & ~full  # some keys: mask_mod decides

        def blocks(sel):  # counts, and the selected block indices first (ascending)
            idx = torch.argsort((~sel).to(torch.int8), dim=-1, stable=True)
            return sel.sum(-1).to(torch.int32)[None, None], idx.to(torch.int32)[None, None]
        return BlockMask.from_kv_blocks(*blocks(part), *blocks(full), BLOCK_SIZE=BS,
                                        mask_mod=lambda b, h, i, j: self.visible(i, j, Tq, Tk),
                                        seq_lengths=(Tq, Tk))


CAUSAL = Mask()


class Bias:
    """What a scheme adds to a layer's logits, in the forms it can hand over: the bias contract, stated here once.
    A scheme's score_mod hook returns one (or None: no bias), and a scheme with its own attention hands one to
    attend. The first form every bias has; each other form it may add lets a faster route run, which route() picks
    by the forms present (never by the scheme). i and j index the call's queries and keys (the queries are the last
    Tq of Tk keys), b and h its batch rows and heads; T queries over as many keys at consecutive positions is a
    training forward without a KV cache.

      mod(score, b, h, i, j) -> score + bias   the bias at each logit (FlexAttention's score_mod): float32 (a
                     bfloat16 bias would not equal the kernel's float32 one), no host syncs (.item(), int() of a
                     tensor: a sync and a graph break), each tensor that needs gradients indexed once and never bare
                     (FlexAttention's backward scatters each logit's gradient into it); the dense path evaluates it
                     on broadcast index tensors                                                'flex', 'dense'
      distance       [H, >= T]: the bias at each distance i - j, T queries over T keys (T5, KERPLE, Sandwich)
                                                                                         'sdpa_bias' in training
      table()        -> [B|1, H, T, T]: the bias whole, T queries over T keys (GRAPE-A, FIRE, DeBERTa, Shaw)
                                                                                         'sdpa_bias' in training
      tensor         [B|1, H|1, Tq, Tk]: the bias as a tensor (CoPE's)        'sdpa_bias' in training where Tq = Tk
      logits         True: `tensor` is the whole logits, scaled (PaTH's, Wall's), kept float32: 'flex', 'dense'
      factors()      -> (fq [B|1, H|1, Tq|1, r], fk [B|1, H|1, Tk|1, r]), float32: the bias is fq_i . fk_j plus a
                     term of query i alone, which softmax cancels (ALiBi, GRAPE-A, FoX)       'qk_lift' on CUDA
      grad           whether the factors need gradients (default: whether autograd is on). In bfloat16 training a
                     factor's gradient through qk_lift is a small difference of bfloat16 sums as large as the
                     positions, so factors with gradients take another route there
      grid(i, j)     -> [H, Tq, Tk]: the bias of query rows i [Tq] and keys j [Tk] as one table, for a bias too
                     costly to unroll into every logit of a kernel (FIRE's MLP): without gradients the dense path
                     takes it a chunk of queries at a time (by grid on TABULATE_ON's devices, by mod elsewhere)
      reads_table    True where mod reads a float32 table at each logit's (i, j): FlexAttention's smaller tiles
    A bias keeps its forms through every wrapper: attention scaling (scaled), query chunks (dense_bias evaluates
    any form at a chunk's rows and keys), windows and sink logits (the routes apply the mask and the sinks)."""

    def __init__(self, mod=None, distance=None, table=None, tensor=None, logits=False, factors=None, grad=None,
                 grid=None, reads_table=False):
        if mod is None and tensor is not None:
            mod = _table_mod(tensor)
        self.mod, self.distance, self.table, self.tensor, self.logits = mod, distance, table, tensor, logits
        self.factors, self.grid, self.reads_table = factors, grid, reads_table or tensor is not None
        self.grad = torch.is_grad_enabled() if grad is None else grad

    def whole(self, Tq, Tk):
        """Whether the bias comes as one table for the call's logits (distance, table, or a bias tensor as wide
        as it is tall), whole logits excepted: what sdpa_bias takes."""
        if self.tensor is not None:
            return Tq == Tk and not self.logits
        return self.distance is not None or self.table is not None

    def scaled(self, s):
        """This bias with the logits of query i in head h multiplied by s[h, i] (s [H, Tq], float32), every form
        alike, so that attention scaling keeps the routes; a -inf bias is a mask and stays -inf."""
        def by(t, f):  # t scaled by the factors f, broadcast to it
            return torch.where(t == float('-inf'), t, t * f)
        mod, table, tensor, factors, grid = self.mod, None, None, None, None

        def scaled_mod(score, b, h, i, j):
            return score + by(mod(torch.zeros_like(score), b, h, i, j), s[h, i])
        if self.whole(s.size(1), s.size(1)) and self.tensor is None:
            table = lambda: by(bias_table(self, s.size(1)), s[None, :, :, None])  # noqa: E731
        if self.tensor is not None:
            tensor = by(wide(self.tensor), s[None, :, :, None])
        if self.factors is not None:
            factors = lambda: (lambda fq, fk: (fq * s[None, :, :, None], fk))(*self.factors())  # noqa: E731
        if self.grid is not None:
            grid = lambda i, j: by(self.grid(i, j), s[:, i, None])  # noqa: E731
        return Bias(scaled_mod if tensor is None else None, None, table, tensor, self.logits, factors,
                    self.grad or s.requires_grad, grid, self.reads_table)


def as_bias(bias):
    """A Bias as it is; a bare score_mod function or bias tensor as a Bias of that one form; None as it is."""
    if bias is None or isinstance(bias, Bias):
        return bias
    return Bias(tensor=bias) if torch.is_tensor(bias) else Bias(bias)


class Attender:
    """A layer's attention for one forward, what a scheme's `attention` hook receives as `att`: call it as
    att(q, k, v, bias=None, vmod=None), with this layer's mask, sink logits, attn_backend and dropout bound; ask it
    which keys each query sees (visibility); hand it whole logits (logits); or run a function over chunks of query
    rows without gradients (rows), each chunk with the keys it can see. A chunk's Attender has `row0` and `key0`: its
    first query row and first key in the whole problem. `fla`: the flash-linear-attention kernel the layer may run
    (kernels.fla_plan; uses_fla says whether a forward does), or None."""

    def __init__(self, mask=None, backend='auto', dropout_p=0.0, sink_logits=None, row0=0, key0=0, fla=None):
        # (mask=None for CAUSAL: torch 2.11's dynamo cannot build an object whose __init__ defaults to a dataclass
        # instance, and breaks the compiled graph at every layer's Attender)
        self.mask, self.backend, self.dropout_p, self.sink_logits = mask or CAUSAL, backend, dropout_p, sink_logits
        self.row0, self.key0, self.fla = row0, key0, fla

    def __call__(self, q, k, v, bias=None, vmod=None):
        return attend(q, k, v, bias, vmod, self.backend, self.dropout_p, self.mask, self.sink_logits)

    def run_fla(self, q, k, v, **inputs):
        """This layer's fla kernel on q, k, v and the scheme's inputs by name (kernels.fla_attention), where
        uses_fla says the forward runs it."""
        return kernels.fla_attention(self.fla, q, k, v, self, **inputs)

    def uses_fla(self, q, cache):
        """Whether a scheme's `attention` hook runs its fla kernel in this forward (route: 'fla:<kernel>')."""
        if not route(Call(q.device.type, self.backend, fla=self.fla, cache=cache is not None)).startswith('fla:'):
            return False
        if not q.is_cuda and not kernels.interpreting():
            raise ValueError("attn_backend='fla' on CPU tensors needs Triton's interpreter (TRITON_INTERPRET=1 in the "
                             "environment); or use attn_backend='auto'")
        return True

    def logits(self, A, v):
        """This layer's softmax over logits a scheme computed itself, A [B, H, Tq, Tk] (float32, scaled): the
        weights times v, with the mask, sink logits, dropout and backend of every other layer."""
        return attend_logits(A, v, self.backend, self.dropout_p, self.mask, self.sink_logits)

    def visibility(self, Tq, Tk, device, strict=False):
        return self.mask.visibility(Tq, Tk, device, strict)

    def rows(self, fn, q, k, v):
        return chunk_queries(fn, q, k, v, self)

    def part(self, s, lo):
        """The Attender of query rows s.. and keys lo.. of this one's problem."""
        return Attender(self.mask.at(self.mask.k0 + lo), self.backend, self.dropout_p, self.sink_logits,
                        self.row0 + s, self.key0 + lo, self.fla)


def chunk_queries(fn, q, k, v, att=None):
    """fn(q, k, v, att) -> a tensor, or a tuple of tensors or None, with the queries on dim 2. Without
    gradients, fn runs on chunks of query rows s..e-1 with the keys and values they can see,
    [lo:e + Tk - Tq] (lo = the chunk's first visible key), and att.part(s, lo) (each chunk is the same
    problem, smaller), and the results are concatenated: when one float32 [B, H, Tq, Tk] tensor would
    exceed dense_chunk_bytes, or always for a bounded mask (window or chunk), whose chunks then cost time
    and memory linear in the length. Otherwise once, with att."""
    att = att or Attender()
    B, H, Tq, _ = q.shape
    Tk, mask, most = k.size(2), att.mask, dense_chunk_bytes(q.device.type)
    if torch.is_grad_enabled() or (not mask.bounded and B * H * Tq * Tk * 4 <= most):
        return fn(q, k, v, att)
    off, cap = Tk - Tq, most // (4 * B * H)
    if mask.bounded:  # rows r with r * (r + span) <= cap: a chunk sees at most r + span - 1 keys
        rows = max(1, (math.isqrt(mask.span ** 2 + 4 * cap) - mask.span) // 2)
        if rows >= Tq and mask.first_key(0, Tq, Tk) == 0:
            return fn(q, k, v, att)
    else:
        rows = max(1, cap // Tk)
    outs = []
    for s in range(0, Tq, rows):
        e = min(s + rows, Tq)
        lo = mask.first_key(s, Tq, Tk) if mask.bounded else 0
        outs.append(fn(q[:, :, s:e], k[:, :, lo:e + off], v[:, :, lo:e + off], att.part(s, lo)))
    if isinstance(outs[0], tuple):
        return tuple(None if parts[0] is None else torch.cat(parts, 2) for parts in zip(*outs))
    return torch.cat(outs, 2)


def _flex():
    """Compiled flex_attention, built once: eager FlexAttention materialises the full score
    matrix (13 GiB and 24 s at T=8192 on CPU; compiled 0.6 GiB, 1.3 s)."""
    if 'flex' not in _compiled:
        # one kernel per shape, and an evaluation suite visits dozens of shapes (lengths x batch
        # sizes); past dynamo's default limit of 8 it would fall back to eager FlexAttention
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, FLEX_SHAPES)
        _compiled['flex'] = torch.compile(flex_attention, dynamic=False)
    return _compiled['flex']


def causal_block_mask(Tq, Tk, device):
    """The causal FlexAttention BlockMask (CAUSAL.block_mask)."""
    return CAUSAL.block_mask(Tq, Tk, device)


# --- the routes: each a rule that says which calls it takes, beside the call that runs them


# The most bytes sdpa_bias's [B, H, Tq, Tk] bias table may take in the dtype attention computes in: its backward
# writes a gradient of that size too, and a layer's table waits for the backward. Past it a call takes FlexAttention,
# whose bias memory is O(H T) (B = 8, H = 12 at T = 8192 would need 12 GiB in bfloat16, twice).
SDPA_BIAS_BYTES = 2**31


class Call(NamedTuple):
    """One attention call, as route() decides on it."""
    device: str                # the device type: 'cuda', 'cpu', ...
    backend: str = 'auto'      # attn_backend: 'auto', 'flex', 'dense' or 'fla' (BACKENDS)
    bias: Bias = None          # the logit bias, None for none
    lse: bool = False          # each row's logsumexp is needed (a value term, sink logits)
    grad: bool = True          # autograd records the call (training)
    B: int = 1
    H: int = 1
    Tq: int = 2
    Tk: int = 2
    width: int = 64            # q's and k's head width
    Dv: int = 64               # v's head width
    dtype: torch.dtype = None  # what attention computes in (compute_dtype; None: float32)
    dropout: bool = False      # attention dropout
    fla: str = None            # the fla kernel the layer may run (kernels.fla_plan), or None
    cache: bool = False        # a KV cache is in use


def _ours(c):
    """attn_backend leaves the route to nanoPE ('auto', or 'fla' for what no fla kernel runs) on CUDA, for more than
    one query (a decoding step's one query runs dense)."""
    return c.backend in ('auto', 'fla') and c.device == 'cuda' and c.Tq > 1


def table_fits(c):
    """Whether sdpa_bias's bias table for the call, [B, H, Tq, Tk] in the compute dtype, is within SDPA_BIAS_BYTES."""
    return c.B * c.H * c.Tq * c.Tk * (c.dtype or torch.float32).itemsize <= SDPA_BIAS_BYTES


def _wide(c):
    """A head wider than SDPA's fused kernels take (XL's 64 + 768 columns), as many queries as keys, in training on
    CUDA: its columns past v's width go as a bias table (wide_split)."""
    return c.width > FUSED_MAX_WIDTH and c.Tq == c.Tk and _ours(c) and c.grad and table_fits(c)


def _takes_fla(c):
    return c.fla is not None and not c.cache and kernels.runs_fla(c.fla, c.backend, c.device)


def _takes_sdpa(c):
    return c.bias is None and not c.lse and not _wide(c)


def _run_sdpa(q, k, v, bias, att, c, scale=None):
    if att.mask.bounded:
        return chunk_queries(lambda q, k, v, a: _sdpa(q, k, v, att.dropout_p, a.mask, scale), q, k, v, att), None
    return _sdpa(q, k, v, att.dropout_p, att.mask, scale), None


def _takes_qk_lift(c):
    """Factors, without the logsumexp (the dropped term of the query would change a sink's share or a value term),
    not in float16 (whose range a position overflows), in bfloat16 training only where they need no gradient."""
    return _ours(c) and c.bias is not None and c.bias.factors is not None and not c.lse and \
        c.dtype != torch.float16 and not (c.grad and c.dtype == torch.bfloat16 and c.bias.grad)


def _run_qk_lift(q, k, v, bias, att, c):  # SDPA's scale stays that of q's own head dim
    return _run_sdpa(*lift_qk(q, k, v, *bias.factors()), None, att, c, q.size(-1) ** -0.5)


def _takes_sdpa_bias(c):
    """A whole bias (or a wide head) in training, the logsumexp only without dropout, the table within its bytes."""
    if c.bias is None:
        return _wide(c) and not c.lse
    return _ours(c) and c.grad and c.bias.whole(c.Tq, c.Tk) and not (c.lse and c.dropout) and table_fits(c)


def _run_sdpa_bias(q, k, v, bias, att, c):
    if bias is None:  # a wide head: its columns past v's width give the table
        return _sdpa_bias(*wide_split(q, k, v, c.Dv), att.dropout_p, att.mask, q.size(-1) ** -0.5), None
    table = bias_table(bias, q.size(2))
    if c.lse:
        return _sdpa_bias(q, k, v, table, 0.0, att.mask, need_lse=True)
    return _sdpa_bias(q, k, v, table, att.dropout_p, att.mask), None


def _takes_flex(c):
    """Under 'flex', or nanoPE's choice on CUDA but for a grid without gradients (too costly per logit); never for
    the logsumexp on CPU, which compiled FlexAttention cannot return there."""
    grid = c.bias is not None and c.bias.grid is not None and not c.grad
    return (c.backend == 'flex' or _ours(c) and not grid) and not (c.lse and c.device == 'cpu' and not FLEX_LSE_ON_CPU)


def _dropout_seed(q, att):  # a fresh dropout seed per call from torch's RNG: on the device, no host sync
    return torch.randint(0, 2**31 - 1, (), device=q.device) if att.dropout_p else None


def _run_flex(q, k, v, bias, att, c):
    return _flex_attend(q, k, v, bias, att.dropout_p, _dropout_seed(q, att), c.lse, att.mask)


def _run_dense(q, k, v, bias, att, c):
    seed = _dropout_seed(q, att)
    return chunk_queries(lambda q, k, v, a: _dense(q, k, v, bias, att.dropout_p, seed, c.lse, a), q, k, v, att)


class Route(NamedTuple):
    name: str
    what: str      # what it does, one line of the training log
    takes: object  # Call -> whether this route runs it
    run: object    # (q, k, v, bias, attender, call) -> (y, lse or None); None where no attend call runs it


# In order: route() takes the first that takes the call. 'fla' runs in a scheme's `attention` hook (Attender.run_fla)
# and 'own' is a layer that computes its attention with no call of attend (the route report names it).
ROUTES = {r.name: r for r in (
    Route('fla', "flash-linear-attention's Triton kernel for the scheme", _takes_fla, None),
    Route('sdpa', "no logit bias: SDPA's fused kernels (flash or cuDNN on a GPU)", _takes_sdpa, _run_sdpa),
    Route('qk_lift', "a bias fq_i . fk_j (ALiBi; GRAPE-A and FoX without gradients or in float32) as extra columns of "
                     "q and k, in bfloat16-exact parts, through SDPA's fused kernels (FlashBias, arXiv 2505.12044)",
          _takes_qk_lift, _run_qk_lift),
    Route('sdpa_bias', "a bias handed whole (by distance, as a table or a tensor; XL's columns past the fused "
                       "kernels' width) as a [B|1, H, T, T] table in the compute dtype, through SDPA's "
                       "memory-efficient kernel, whose backward returns its gradient (and the logsumexp's) without "
                       "atomics",
          _takes_sdpa_bias, _run_sdpa_bias),
    Route('flex', "FlexAttention, the bias evaluated at each logit in float32", _takes_flex, _run_flex),
    Route('dense', "float32 attention with the bias as a tensor (the CPU's path for a bias; without gradients in "
                   "chunks of queries)", lambda c: True, _run_dense),
    Route('own', "the scheme computes its attention itself", lambda c: False, None))}


def route(c):
    """The route of an attention call (a Call): the first entry of ROUTES that takes it, 'fla:<kernel>' for fla's."""
    for r in ROUTES.values():
        if r.takes(c):
            return f'fla:{c.fla}' if r.name == 'fla' else r.name


class RouteProbe:
    """Within `with RouteProbe(device_type, grad, dtype, B, T):` every attend call also notes the route it would take
    on device_type in that grad mode and compute dtype (None: float32's answer), at batch B and T tokens where given,
    under the layer that made it (CausalSelfAttention sets `layer`), and runs on the dense path. A layer's bias and
    its forms exist only inside a forward (they follow the positions, the cache and the grad mode), so the route
    report (model.GPT.routes) runs one forward of a small copy of the model on the CPU under a probe."""
    active = None

    def __init__(self, device_type, grad, dtype=None, B=None, T=None):
        self.device_type, self.grad, self.dtype, self.B, self.T = device_type, grad, dtype, B, T
        self.layer, self.seen, self.why = None, {}, {}

    def __enter__(self):
        RouteProbe.active = self
        return self

    def __exit__(self, *exc):
        RouteProbe.active = None

    def note(self, c):
        sizes = {'B': self.B} if self.B else {}
        if self.T and c.Tq == c.Tk:
            sizes.update(Tq=self.T, Tk=self.T)
        c = c._replace(device=self.device_type, grad=self.grad, dtype=self.dtype, **sizes)
        names = self.seen.setdefault(self.layer, [])
        if route(c) not in names:
            names.append(route(c))
        if not table_fits(c) and _takes_sdpa_bias(c._replace(B=0)):
            self.why[self.layer] = (f"sdpa_bias's bias table [{c.B}, {c.H}, {c.Tq}, {c.Tk}] would take "
                                    f"{c.B * c.H * c.Tq * c.Tk * (c.dtype or torch.float32).itemsize / 2**30:.1f} "
                                    f"GiB, over attention.SDPA_BIAS_BYTES ({SDPA_BIAS_BYTES / 2**30:g} GiB)")


def _mix(x):
    """One round of a 31-bit integer hash (xorshift-multiply); exact int64 arithmetic,
    so every device and both attention paths get the same bits."""
    x = ((x ^ (x >> 15)) * 0x2C1B3C6D) & 0x7FFFFFFF
    x = ((x ^ (x >> 12)) * 0x297A2D39) & 0x7FFFFFFF
    return x ^ (x >> 15)


def dropout_keep(seed, p, b, h, i, j):
    """Attention dropout's keep mask as a pure function of (seed, batch, head, query, key)."""
    return _mix(_mix(_mix(_mix(seed + b) + h) + i) + j) >= int(p * 2**31)


def dense_bias(bias, B, H, Tq, Tk, device, mask=CAUSAL, row0=0, key0=0):
    """The bias (a Bias, a score_mod function or a bias tensor) of query rows row0.. and keys key0.. of its problem
    as an additive mask [B|1, H|1, Tq, Tk] in float32 (float64 where the bias is: float64 references), -inf where
    `mask` (the rows' and keys' own) hides a key: its tensor's block, its grid on TABULATE_ON's devices, else its mod
    at broadcast indices."""
    bias = as_bias(bias)
    if bias is not None and bias.tensor is not None:
        t = bias.tensor[..., row0:row0 + Tq, key0:key0 + Tk]
        return wide(t).masked_fill(~mask.visibility(Tq, Tk, device), float('-inf'))
    b = torch.arange(B, device=device).view(B, 1, 1, 1)
    h = torch.arange(H, device=device).view(1, H, 1, 1)
    i = torch.arange(Tq, device=device).view(1, 1, Tq, 1)
    j = torch.arange(Tk, device=device).view(1, 1, 1, Tk)
    zero = torch.zeros((), device=device)
    if bias is None:
        t = zero
    elif bias.grid is not None and torch.device(device).type in TABULATE_ON:
        t = bias.grid(i.flatten() + row0, j.flatten() + key0)[None]
    else:
        t = bias.mod(zero, b, h, i + row0, j + key0)
    return wide(t).masked_fill(~mask.visible(i, j, Tq, Tk), float('-inf'))


def _dense(q, k, v, bias, dropout_p, seed, need_lse, att):
    """float32 attention with a dense bias for query rows att.row0.. and keys att.key0.. -> (y in float32,
    lse or None). Autocast is off inside: it would cast the float32 inputs (and so the bias's effect)
    back to bf16."""
    with torch.autocast(q.device.type, enabled=False):
        return _dense_fp32(q, k, v, bias, dropout_p, seed, need_lse, att)


def wide(t):
    """t in float32, or as it is where it is float64: the dense path computes in float32, and in float64 for
    float64 inputs (tools/gpu_check.py's reference for gradients)."""
    return t if t.dtype == torch.float64 else t.float()


def _dense_fp32(q, k, v, bias, dropout_p, seed, need_lse, att):
    B, H, Tq, d = q.shape
    q, k, v = wide(q), wide(k), wide(v)
    bias = dense_bias(bias, B, H, Tq, k.size(2), q.device, att.mask, att.row0, att.key0).to(q.dtype)
    if not (dropout_p or need_lse):  # SDPA's fused softmax; float32 inputs so the bias stays float32
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias), None
    if not dropout_p and q.device.type == 'cpu' and not torch.is_grad_enabled():
        # SDPA's fused CPU kernel also returns each row's logsumexp (15x faster than the three
        # passes below at T = 2048); without gradients only, as its lse has no backward
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=bias)
    att_w = (q @ k.transpose(-2, -1)) / math.sqrt(d) + bias
    lse = att_w.logsumexp(-1)
    p = (att_w - lse.unsqueeze(-1)).exp()
    if dropout_p:
        ix = [torch.arange(n, device=q.device).view(*[-1 if a == ax else 1 for a in range(4)])
              for ax, n in enumerate((B, H, Tq, k.size(2)))]
        ix[2], ix[3] = ix[2] + att.row0, ix[3] + att.key0
        p = p * dropout_keep(seed, dropout_p, *ix) / (1 - dropout_p)
    return p @ v, lse


def _table_mod(bias):
    """The score_mod of a bias tensor [B, H, Tq, Tk]."""
    def mod(score, b, h, i, j):
        return score + bias[b, h, i, j]
    return mod


def flex_tiles(device_type, bias):
    """FlexAttention's kernel_options for this bias: TABLE_TILES on CUDA where it reads a table, else None
    (Inductor's own choice)."""
    return TABLE_TILES if device_type == 'cuda' and bias is not None and bias.reads_table else None


def flex_own_graph(device_type):
    """True where FlexAttention starts a graph of its own under torch.compile (FLEX_OWN_GRAPH: on CUDA)."""
    return FLEX_OWN_GRAPH and device_type == 'cuda'


def _flex_attend(q, k, v, bias, dropout_p, seed, need_lse, mask):
    """FlexAttention with the bias's mod -> (y, lse or None); with dropout, the kept keys' softmax rescaled to all
    keys'."""
    if flex_own_graph(q.device.type) and torch.compiler.is_compiling():
        torch._dynamo.graph_break()
    bm = mask.block_mask(q.size(2), k.size(2), q.device)
    opts = flex_tiles(q.device.type, bias)
    mod = bias.mod if bias is not None else None

    def run(score_mod, lse):
        kw = dict(score_mod=score_mod, block_mask=bm, kernel_options=opts)
        if not lse:
            return _flex()(q, k, v, **kw), None
        if hasattr(fa, 'AuxRequest'):  # torch >= 2.9
            y, aux = _flex()(q, k, v, **kw, return_aux=fa.AuxRequest(lse=True))
            return y, aux.lse  # natural-log lse, differentiable
        return _flex()(q, k, v, **kw, return_lse=True)
    if not dropout_p:
        return run(mod, need_lse)

    def dropped(score, b, h, i, j):
        s = mod(score, b, h, i, j) if mod is not None else score
        return torch.where(dropout_keep(seed, dropout_p, b, h, i, j), s, float('-inf'))
    y, lse_kept = run(dropped, True)
    _, lse = run(mod, True)
    scale = (lse_kept - lse).exp().unsqueeze(-1) / (1 - dropout_p)  # 0 for a row with every key dropped
    return y * scale.to(y.dtype), lse


def _sdpa(q, k, v, dropout_p, mask, scale=None):
    """Attention without a bias: SDPA, with a boolean mask where the mask is not plain causal. scale: the logits'
    factor (None: SDPA's 1 / sqrt(q's head dim); lifted columns leave it at the head dim's before them)."""
    Tq, Tk = q.size(2), k.size(2)
    if mask.bounded:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.visibility(Tq, Tk, q.device),
                                              dropout_p=dropout_p, scale=scale)
    if Tq == Tk:  # no cache: plain causal
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p, scale=scale)
    if Tq == 1:  # one new token after the cache sees every key: no mask to build
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=scale)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.visibility(Tq, Tk, q.device), dropout_p=dropout_p,
                                          scale=scale)


def round_bf16(x):
    """x (float32) rounded to the nearest bfloat16 value, ties to even, kept in float32, by integer arithmetic on its
    bits: torch.compile folds x.to(torch.bfloat16).float() into x (Inductor's pointless_convert), dropping the
    rounding that split_bf16 is made of."""
    i = x.view(torch.int32)
    return ((i + 0x7FFF + ((i >> 16) & 1)) & -65536).view(torch.float32)


def split_bf16(x, parts=3):
    """x (float32) as the sum of `parts` tensors whose values bfloat16 holds exactly: each the rounding of what the
    ones before left over. Three carry float32's 24 bits (to 2^-24 of |x| where no part underflows). The gradient
    of x flows through the first part alone, and whole: the parts always meet the same partner columns, so each
    part's gradient is x's."""
    out, rest = [], x.detach()
    for _ in range(parts):
        out.append(round_bf16(rest))
        rest = rest - out[-1]
    out[0] = x - (x.detach() - out[0])  # the value of the first part, the gradient of x
    return out


def lift_qk(q, k, v, fq, fk):
    """q, k and v with columns appended so that q'_i . k'_j = q_i . k_j + fq_i . fk_j / scale, scale = 1 / sqrt(d)
    of q's own head dim d (SDPA is then called with that scale), v padded with zeros to the new width, a multiple
    of 8 as SDPA's fused kernels need, all three in the dtype the attention computes in: -> (q', k', v').
    fq [B|1, H|1, Tq|1, r], fk [B|1, H|1, Tk|1, r], float32. In bfloat16 (inputs or autocast) each factor
    becomes three bfloat16-exact parts and every pair of parts a column: the kernels multiply bfloat16 columns
    exactly into float32 and sum there, so the bias keeps float32's precision (a factor cast to bfloat16 whole
    keeps 8 bits: ALiBi's m * j at j = 1000 would be off by about 1)."""
    d, (B, H) = q.size(-1), q.shape[:2]
    dtype = compute_dtype(q)
    fq, fk = (f.double() if dtype == torch.float64 else f.float() for f in (fq, fk))  # float32, or a float64 reference
    fq = fq * d ** 0.5
    if dtype == torch.bfloat16:
        pq, pk = split_bf16(fq), split_bf16(fk)  # sum over pairs (a, b) of pq[a] * pk[b] = fq * fk, per column
        fq = torch.cat([a for a in pq for _ in pk], -1)  # block (a, b): pq[a] against pk[b], r columns each
        fk = torch.cat([b for _ in pq for b in pk], -1)
    width = -(-(d + fq.size(-1)) // 8) * 8
    fq, fk = (F.pad(f, (0, width - d - f.size(-1))) for f in (fq, fk))
    q = torch.cat((q.to(dtype), fq.expand(B, H, q.size(2), -1).to(dtype)), -1)
    k = torch.cat((k.to(dtype), fk.expand(B, H, k.size(2), -1).to(dtype)), -1)
    return q, k, F.pad(v, (0, width - v.size(-1))).to(dtype)


def toeplitz(vec, T):
    """[H, T, T] with t[h, i, j] = vec[h, i - j] for j <= i (above the diagonal other entries of vec, which the mask
    hides) from vec [H, >= T], by one strided copy of a row: the copy's backward sums a view, so autograd gives vec
    each diagonal's summed gradient with no scatter."""
    H = vec.size(0)
    row = F.pad(vec[:, :T].flip(-1), (1, 0))  # [H, T + 1]: row[c] = vec[T - c]
    # row r of the copy read from its element T + r * T on: column j is row[T - r + j] = vec[r - j]
    return row[:, None].expand(H, T, T + 1).reshape(H, T * (T + 1))[:, T:].view(H, T, T)


def query_distance_table(A):
    """[..., T, T] with t[..., i, j] = A[..., i, i - j] for j <= i (above the diagonal other entries, which the mask
    hides) from A [..., T, T] whose row i holds a term of query i at distances 0..T-1 (DeBERTa's c2p), by a flip and
    one strided view of the table padded by a column (Transformer-XL's relative shift): the view's backward is a
    view too, so A gets each entry's gradient back with no scatter."""
    T = A.size(-1)
    flat = F.pad(A.flip(-1), (0, 1)).flatten(-2)  # row i: A[i, T - 1], ..., A[i, 0], 0
    # t[i, j] is flat[T - 1 + i * T + j]: row i, column T - 1 - i + j, which holds A[i, i - j]
    return flat[..., T - 1:T - 1 + T * T].unflatten(-1, (T, T))


def key_distance_table(A):
    """[..., T, T] with t[..., i, j] = A[..., j, i - j] for j <= i from A [..., T, T] whose row j holds a term of key j
    at distances 0..T-1 (DeBERTa's p2c), by one strided view of the table padded by a column, transposed."""
    T = A.size(-1)
    flat = F.pad(A, (0, 1)).flatten(-2)  # row j: A[j, 0], ..., A[j, T - 1], 0
    # t[i, j] is flat[j * T + i]: row j, column i - j
    return flat[..., :T * T].unflatten(-1, (T, T)).transpose(-1, -2)


def bias_table(bias, T):
    """The table [B|1, H, T, T] of a bias that comes whole (Bias.whole: route 'sdpa_bias'), built when asked, in
    float32 (float64 where the bias is)."""
    if bias.distance is not None:
        return toeplitz(wide(bias.distance), T)[None]
    table = wide(bias.tensor if bias.tensor is not None else bias.table())
    return table if table.dim() == 4 else table[None]


def wide_split(q, k, v, Dv):
    """q, k [B, H, T, D] of a head wider than SDPA's fused kernels take, and v (padded to D) -> (q, k, v) cut to the
    first w columns (v's Dv, rounded up to a multiple of 8) and the bias table [B, H, T, T] that the rest give,
    their product scaled by 1 / sqrt(D): the same logits, with D's scale kept (route 'sdpa_bias')."""
    w = -(-Dv // 8) * 8
    bias = torch.matmul(q[..., w:], k[..., w:].transpose(-1, -2)) * q.size(-1) ** -0.5  # (B, H, T, T)
    return q[..., :w], k[..., :w], v[..., :w], bias


def _sdpa_bias(q, k, v, bias, dropout_p, mask, scale=None, need_lse=False):
    """Attention of T queries over as many keys with a bias table [B|1, H, T, T] (float32, or the dtype q computes
    in) in the dtype attention computes in: on CUDA SDPA's memory-efficient kernel, causal tiles skipped, whose
    backward returns the bias's gradient; elsewhere (tests force the route on the CPU) SDPA with the table as its
    mask. Hidden logits get -inf by masked_fill, whose backward zeroes their gradient: the kernel leaves the bias
    gradient of skipped tiles unwritten. scale: the logits' factor (None: 1 / sqrt(q's head dim)). -> y; with
    need_lse (no dropout) (y, each row's logsumexp in float32), both differentiable (BiasedLse)."""
    B, H, T, D = q.shape
    dtype = compute_dtype(q)
    bias = bias.masked_fill(~mask.visibility(T, T, q.device), float('-inf')).to(dtype)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    cuda = q.device.type == 'cuda'
    if cuda:
        bias = F.pad(bias, (0, -T % 16))[..., :T].expand(B, H, T, T)  # the kernel reads rows 16-element aligned
    if need_lse:
        return BiasedLse.apply(q, k, v, bias, scale or D ** -0.5)
    if not cuda:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p, scale=scale)
    return torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, bias, True, dropout_p, True,
                                                                  scale=scale)[0]


KERNEL_DEVICES = ('cuda', 'meta')  # BiasedLse's memory-efficient kernel: CUDA's, or its shape checks on the meta device


class BiasedLse(torch.autograd.Function):
    """Attention with a bias table through a fused kernel -> (y, lse), the gradient of each row's logsumexp taken
    too (a value term or sink logits read it), which the kernels return but whose gradient their backward does not
    take. That gradient, g_i, adds g_i p_ij to each logit's, and the kernels' backward forms a logit's gradient as
    p_ij (dO_i . v_j - D_i) with D_i = dO_i . out_i from the out it is handed: one more column, 0 in v, 1 in dO and
    -g_i in out, makes D_i - g_i and leaves each dO_i . v_j as it was (q and k get zero columns: one width). On
    CUDA SDPA's memory-efficient kernel, whose backward also returns the bias's gradient; on the CPU (tests force
    the route) the CPU flash kernel, and the bias's gradient from the same terms. q, k, v [B, H, T, D] in one
    dtype, bias [B, H, T, T] in it, -inf where hidden."""

    @staticmethod
    def forward(ctx, q, k, v, bias, scale):
        if q.device.type in KERNEL_DEVICES:
            y, lse, seed, offset = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, bias, True, 0.0,
                                                                                          True, scale=scale)
        else:
            (y, lse), seed, offset = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q, k, v, attn_mask=bias, scale=scale), None, None
        ctx.save_for_backward(q, k, v, bias, y, lse, seed, offset)
        ctx.scale = scale
        return y, lse[..., :q.size(2)]  # (CUDA's rows of lse are padded to a multiple of 32)

    @staticmethod
    def backward(ctx, gy, glse):
        q, k, v, bias, y, lse, seed, offset = ctx.saved_tensors
        scale = ctx.scale  # (glse is zeros where the logsumexp went unused: autograd's materialize_grads)
        one = torch.ones_like(glse).unsqueeze(-1)
        q2, k2, v2 = (F.pad(t, (0, 8)) for t in (q, k, v))
        y2 = F.pad(torch.cat((y, -glse.unsqueeze(-1).to(y.dtype)), -1), (0, 7))
        y2 = y2.transpose(1, 2).contiguous().transpose(1, 2)  # CUDA's kernel reads out's rows H * D apart: [B, T, H, D]
        g2 = F.pad(torch.cat((gy.to(y.dtype), one.to(y.dtype)), -1), (0, 7))
        if q.device.type in KERNEL_DEVICES:
            gq, gk, gv, gb = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
                g2, q2, k2, v2, bias, y2, lse, seed, offset, 0.0, [True, True, True, ctx.needs_input_grad[3]], True,
                scale=scale)
        else:
            gq, gk, gv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                g2, q2, k2, v2, y2, lse, 0.0, False, attn_mask=bias, scale=scale)
            gb = None
            if ctx.needs_input_grad[3]:  # p_ij (dO_i . v_j - D_i + g_i)
                p = (torch.matmul(q, k.transpose(-1, -2)) * scale + bias - lse.unsqueeze(-1)).exp()
                delta = (gy * y).sum(-1, keepdim=True)
                gb = (p * (torch.matmul(gy.to(v.dtype), v.transpose(-1, -2)) - delta + glse.unsqueeze(-1)))
        w = q.size(-1)
        return gq[..., :w], gk[..., :w], gv[..., :w], gb, None


def compute_dtype(q):
    """The dtype attention on q computes in: autocast's for a float32 q where autocast is on, else q's own (on the
    meta device, which autocast does not know, q's). Not torch.amp.is_autocast_available: torch 2.11's dynamo breaks
    the graph at it, in every layer."""
    dev = q.device.type
    if q.dtype == torch.float32 and dev != 'meta' and torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return q.dtype


def attend(q, k, v, bias=None, vmod=None, backend='auto', dropout_p=0.0, mask=CAUSAL, sink_logits=None):
    """Attention of the queries over the keys `mask` lets them see, with an optional logit bias (a Bias, or a
    score_mod function or bias tensor), an optional value term `vmod(lse) -> [B, H, Tq, Dv]` added to the output
    (lse = each row's logsumexp) and optional sink logits `sink_logits` [H], by the route the call takes."""
    bias = as_bias(bias)
    if k.size(1) != q.size(1):  # grouped keys and values: query head h reads key/value head h // g
        g = q.size(1) // k.size(1)
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    Dv = v.size(-1)
    if Dv < q.size(-1):  # zero columns change nothing, and let SDPA's fused kernels run
        v = F.pad(v, (0, q.size(-1) - Dv))
    att = Attender(mask, backend, dropout_p, sink_logits)
    c = Call(q.device.type, backend, bias, vmod is not None or sink_logits is not None, torch.is_grad_enabled(),
             q.size(0), q.size(1), q.size(2), k.size(2), q.size(-1), Dv, compute_dtype(q), dropout_p > 0)
    name = route(c)
    if RouteProbe.active is not None:  # (a Python check: a compiled graph keeps no trace of it)
        RouteProbe.active.note(c)
        name = 'dense' if name == 'flex' else name
    y, lse = ROUTES[name].run(q, k, v, bias, att, c)
    y = y[..., :Dv]
    if vmod is not None:
        y = y + vmod(lse).to(y.dtype)
    if sink_logits is not None:  # the sink's share of each row's softmax mass carries no value
        y = y * torch.sigmoid(wide(lse) - wide(sink_logits)[:, None]).unsqueeze(-1).to(y.dtype)
    return y.to(q.dtype)


def attend_logits(A, v, backend='auto', dropout_p=0.0, mask=CAUSAL, sink_logits=None):
    """softmax(A) @ v over the keys `mask` lets each query see, for logits A [B, H, Tq, Tk] (float32, scaled)
    that a scheme computed whole (PaTH, Wall), with attend's sink logits, dropout and query chunks. attend's
    kernels take a query and keys: they get zero ones, so that q.k = 0 and the logits are A."""
    B, H, Tq, Tk = A.shape
    q, k = v.new_zeros(B, H, Tq, v.size(-1)), v.new_zeros(B, H, Tk, v.size(-1))
    return attend(q, k, v, Bias(tensor=A, logits=True), None, backend, dropout_p, mask, sink_logits)


# --- length-dependent logit scaling (attn_scaling), applied on the model's path before attend


def logn_scale(n, original_max_len=None):
    """log-n logit factor for a query that sees n keys (tensor): log n, or with the
    training length L, max(1, log n / log L). Computed in float64, returned float32."""
    s = torch.log(n.double())
    if original_max_len is not None:
        s = torch.clamp(s / math.log(original_max_len), min=1.0)
    return s.float()


def llama4_scale(pos, floor_scale=8192.0, attn_scale=0.1):
    """Llama 4's attention temperature at query position pos (tensor, 0-based):
    log(floor((pos + 1) / floor_scale) + 1) * attn_scale + 1. float32."""
    return (torch.log1p(torch.floor((pos.double() + 1) / floor_scale)) * attn_scale + 1).float()


def logit_scale(sc, ssmax, q_pos, Tk, mask):
    """The factors s [H or 1, Tq] (float32) of a layer's attention scaling `sc` (a checked attn_scaling
    dict, layers.check_attn_scaling): every logit of query i in head h is multiplied by s[h, i]. n_i, the
    number of keys query i sees, follows the mask (i + 1 without a cache; at most W in a window).
    ssmax: the layer's learned per-head scales [H] for SSMax."""
    if sc['type'] == 'llama4':
        return llama4_scale(q_pos, sc['floor_scale'], sc['attn_scale'])[None, :]
    Tq = q_pos.numel()
    t = torch.arange(mask.k0 + Tk - Tq, mask.k0 + Tk, device=q_pos.device)  # the queries' token indices
    n = t - (torch.clamp(mask.lowest(t), min=0) if mask.bounded else 0) + 1
    if sc['type'] == 'logn':
        return logn_scale(n, sc.get('original_max_len'))[None, :]
    if sc['type'] == 'drope':  # 1 + c ln(max(1, n / L)), in float64
        return (1 + sc['c'] * torch.log(torch.clamp(n.double() / sc['original_max_len'], min=1.0))).float()[None, :]
    return ssmax[:, None] * torch.log(n.float())[None, :]  # ssmax: [H, Tq]


def scale_logits(q, bias, s):
    """Multiply every logit of query i in head h by s[h, i] (s: [H or 1, Tq] float32): through q for the content
    term q.k, and through the bias (a Bias or None; built from the unscaled q), every form alike (Bias.scaled), so
    the logits are the same on every route and the bias keeps its routes. -> (q, bias)."""
    s = s.expand(q.size(1), q.size(2))
    q = (q * s[None, :, :, None]).to(q.dtype)
    return q, (as_bias(bias).scaled(s) if bias is not None else None)


# --- one layer's attention, as its LayerSpec (layers.py) says


# sink logits added to trained weights start here: a row whose logsumexp is >= 0 gives them at most
# e^-16 (1e-7, float32's resolution) of its mass, so the outputs stay as they were, and Adam, whose steps
# do not shrink with the gradient, still moves them at the learning rate
SINK_FRESH = -16.0
# attn_backend: 'auto' (FlexAttention on CUDA, dense on CPU; fla's kernels on CUDA for the schemes that have one),
# 'flex', 'dense', or 'fla' (fla's kernels, refused where they cannot run; kernels.py)
BACKENDS = ('auto', 'flex', 'dense', 'fla')
# the weights a layer plan adds to a layer's attention (sink_logits, attn_scaling's SSMax, qk_norm, canon_set's A and
# B): a fine-tune that changes the plan may add or drop them (model.changeable)
PLAN_WEIGHTS = ('sink_logits', 'ssmax', 'q_norm.weight', 'k_norm.weight', 'canonA.weight', 'canonB.weight')


class CausalSelfAttention(nn.Module):
    """One layer's attention, as its LayerSpec says: what a query may see (mask), QK-norm, sink
    logits, logit scaling and Canon layers A and B belong to it; positions to its scheme (pe_layer: its parameters)."""

    def __init__(self, config, spec, pe):
        super().__init__()
        self.hd = hd = config.n_embd // config.n_head
        self.index = spec.index
        scheme = pe.at(spec.index)
        # query, key/value and attention heads: n_head each, unless the scheme says otherwise (RoPE++)
        self.q_heads, self.kv_heads, self.n_head = scheme.heads()
        self.c_attn = nn.Linear(config.n_embd, (self.q_heads + 2 * self.kv_heads) * hd, bias=config.bias)
        self.c_proj = nn.Linear(self.n_head * hd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.dropout = config.dropout
        if config.attn_backend not in BACKENDS:
            raise ValueError(f"attn_backend={config.attn_backend!r} is not one of {', '.join(map(repr, BACKENDS))}")
        self.backend = config.attn_backend
        self.pe_layer = scheme.new_layer()  # this layer's positional parameters, if any
        self.mask = Mask(spec.sliding_window, spec.attention_chunk_size)
        self.scaling = spec.attn_scaling
        self.ssmax = None  # SSMax's learned per-head scales
        if self.scaling is not None:
            if scheme.owns_attention:
                raise ValueError(f"attn_scaling multiplies the logits of the attention's softmax, but {scheme.name} "
                                 f"computes its attention itself (its `attention` hook) on layer {spec.index}; apply "
                                 f"attn_scaling to other layers ('layers': 'nope' with nope_layers, or a list) or "
                                 f"drop it")
            if self.scaling['type'] == 'ssmax':
                self.ssmax = nn.Parameter(torch.full((self.n_head,), float(self.scaling['init'])))
        self.q_norm = self.k_norm = None
        if spec.qk_norm:  # one norm over each head's dims, its weight (if any) shared by the heads (Qwen3)
            self.q_norm, self.k_norm = (nn.RMSNorm(hd, eps=1e-6, elementwise_affine=spec.qk_norm == 'weight')
                                        for _ in range(2))
        self.sink_logits = None
        if spec.sink_logits:
            if scheme.softmax != 'attend':
                why = 'has no softmax' if scheme.softmax is None else 'computes its softmax itself'
                raise ValueError(f"sink_logits add a logit to attention.attend's softmax, but {scheme.name} {why} "
                                 f"on layer {spec.index}: drop sink_logits there, or use another scheme")
            self.sink_logits = nn.Parameter(torch.randn(self.n_head) * 0.02)  # HF gpt-oss's init, N(0, 0.02)
        # Canon layers (layers.CANON): A on the attention's input, B on q, k and v together (c_attn's width)
        self.canonA, self.canonB = kernels.canons(spec, A=config.n_embd, B=self.c_attn.out_features)
        # the fla kernel this layer may run, and under 'auto' why it runs none ('fla' refuses what cannot run)
        self.fla, self.fla_note = kernels.fla_plan(self.backend, scheme, spec.index, self.mask, spec.sink_logits, hd,
                                                   config.dropout)

    def fla_route(self, device_type):
        """'fla:<kernel>' where this layer runs its fla kernel on device_type without a KV cache (route), else None."""
        name = route(Call(device_type, self.backend, fla=self.fla))
        return name if name.startswith('fla:') else None

    @torch.no_grad()
    def start_fresh(self, names):
        """Of this layer's weights, those a fine-tune adds (names) keep their init, except sink logits, which
        start at SINK_FRESH, where they change nothing yet."""
        if 'sink_logits' in names:
            self.sink_logits.fill_(SINK_FRESH)

    def forward(self, x, scheme, ctx, cache=None, with_ctx=False):
        """The layer's output [B, T, C]; with_ctx: (output, this layer's Context as the scheme's hooks left it), which
        model.Block hands to the scheme's `stream` hook."""
        B, T, C = x.size()
        if self.canonA is not None:  # Canon-A: everything the attention reads of x reads it after the convolution
            x = self.canonA(x, cache)
        # 1. project
        hd, kv = self.hd, self.kv_heads * self.hd
        q, k, v = self.c_attn(x).split((self.q_heads * hd, kv, kv), dim=2)
        q, k, v = (t.view(B, T, -1, hd).transpose(1, 2) for t in (q, k, v))  # (B, heads, T, hs)
        # 2. QK-norm, before the positions: the one well-defined place once a scheme changes q and k (xPos, xl)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.canonB is not None:  # Canon-B: q, k, v after QK-norm and before the positions, as the authors' code
            qkv = self.canonB(torch.cat([t.transpose(1, 2).reshape(B, T, -1) for t in (q, k, v)], 2), cache)
            q, k, v = (t.view(B, T, -1, hd).transpose(1, 2) for t in qkv.split((self.q_heads * hd, kv, kv), dim=2))
        # this layer's positions where they depend on its input x (the shared ctx otherwise)
        ctx = scheme.layer_context(x, ctx, self.pe_layer, cache)
        # 3. positions and the cache, as the cache's mode says (kvcache.LayerKV): keys cached as transform_qk made
        # them; cached raw and all of them transformed every forward; or appended and rewritten by the scheme
        mode = cache.mode if cache is not None else 'transformed'
        if mode == 'transformed':
            q, k = scheme.transform_qk(q, k, ctx, self.pe_layer)
        if cache is not None and mode != 'scheme':
            k, v = cache.append(k, v)
        if mode == 'raw':
            q, k = scheme.transform_qk(q, k, ctx, self.pe_layer)
        # 4. attention over the keys the mask lets each query see (key 0 is token k0 of the text)
        mask = self.mask.at(cache.start) if cache is not None else self.mask
        if RouteProbe.active is not None:  # the attend calls from here on are this layer's
            RouteProbe.active.layer = self.index
        att = Attender(mask, self.backend, self.dropout if self.training else 0.0, self.sink_logits, fla=self.fla)
        y = scheme.attention(q, k, v, x, ctx, self.pe_layer, cache, att)  # a scheme's own attention, or None
        if y is None:
            bias = as_bias(scheme.score_mod(q, k, ctx, self.pe_layer))
            if self.scaling is not None:  # length-dependent attention scaling (attn_scaling)
                s = logit_scale(self.scaling, self.ssmax, ctx.q_pos, k.size(2), mask)
                q, bias = scale_logits(q, bias, s)
            y = att(q, k, v, bias, scheme.value_mod(q, k, ctx, self.pe_layer, bias, att))
        y = y.transpose(1, 2).contiguous().view(B, T, self.n_head * hd)  # (B, T, attention heads x hs)
        y = self.resid_dropout(self.c_proj(y))
        return (y, ctx) if with_ctx else y
