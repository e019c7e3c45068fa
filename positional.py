"""
Positional encodings for nanoPE: every scheme is a small nn.Module, registered by the name used
in config (`pos_encoding = 'rope'`). The attention (model.py, attention.py) never asks which
scheme it runs; it calls these hooks, each of which defaults to "nothing":
  embed(x, pos)                  -> x         token embeddings, once before block 0
  context(q_pos, k_pos, n_pos)   -> Context   per-forward tables, shared by the layers that have these keys
  new_layer()                    -> module    one layer's parameters, handed back as `params`
  heads()                        -> (q, kv, attention)  head counts of a layer (n_head each; RoPE++)
  layer_context(x, ctx, params, cache) -> Context   this layer's Context where positions depend on its
                                              input x (GRAPE-M contextual, Selective RoPE); ctx otherwise
  transform_qk(q, k, ctx, params) -> (q, k)    rotate, scale or extend queries and keys
  score_mod(q, k, ctx, params)    -> Bias | None  the layer's logit bias, in the forms it can hand over
                                              (attention.Bias: the bias contract, its forms and their routes)
  value_mod(q, k, ctx, params, bias, att) -> g | None  g(lse) added to the output (Shaw's values)
  attention(q, k, v, x, ctx, params, cache, att) -> y | None   the layer's own attention; `att`
                                              (attention.Attender) carries the layer's mask and sink logits
  stream(m, ctx, params, cache)   -> stream   the positional stream the next block gets, from this block's MLP
                                              output m and this layer's ctx as its hooks left it (ctx.stream:
                                              the one this block got, which the default hands on; TAPE)
  cache_keys = 'transformed'                  what the KV cache keeps: keys as transform_qk returned
                                              them; 'raw' (transformed every forward: xPos, ExtendedRoPE);
                                              'scheme' (the scheme appends and rewrites them itself)
  softmax = 'attend'                          whose softmax makes the weights: attention.attend's (sink
                                              logits act there); 'own' or None (stick-breaking)
  fla_kernel = None                           the flash-linear-attention kernel its `attention` hook can run
                                              (a key of kernels.FLA_KERNELS: FoX, PaTH, Wall, stick-breaking)
i and j index the queries and keys, at positions ctx.q_pos[i] and ctx.k_pos[j]; the queries are the last Tq keys.
Attributes the scripts read are declared on PositionalEncoding; docs/schemes.md has the hooks with their shapes.

Sections, one per row of the README's "how positions enter" table, in its order (each scheme's class sits in the
section of its row; tested): the contract (Context, PositionalEncoding), helpers (option checks, small modules), not
at all, embed, transform_qk, score_mod, layer_context, attention, stream. The maths of RoPE context extension
(config.rope_scaling) is in rope_scaling.py. Adding a scheme: the README's "Adding a scheme".
"""

import inspect
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

import layers
from attention import CAUSAL, Attender, Bias, dense_chunk_bytes, key_distance_table, query_distance_table, wide
from kernels import causal_conv, cumsum_tokens, path_scores, wall_scores
from rope_scaling import EXTENSION_TYPES, LENGTH_DEPENDENT_SCALING, resolve_rope_scaling, rope_frequencies

REGISTRY = {}


def register(name):
    def deco(cls):
        REGISTRY[name] = cls
        cls.name = name
        return cls
    return deco


def extrapolating_schemes():
    return sorted(n for n, c in REGISTRY.items() if c.max_len_of is PositionalEncoding.max_len_of)


@dataclass
class Context:
    q_pos: torch.Tensor  # [Tq] absolute positions of the queries (= of the new keys)
    k_pos: torch.Tensor  # [Tk] absolute positions of all keys (cache + new)
    extra: dict = None   # scheme-specific precomputation (e.g. cos/sin)
    n_pos: int = None    # every position is < n_pos (a Python int, so tables need no host sync)
    consecutive: bool = False  # k_pos runs start, start + 1, ... and q_pos is its tail: dist(i, j) = i + Tk - Tq - j
    stream: object = None      # the positional stream at the new tokens as this block gets it (the stream hook's)

    def dist(self, i, j):
        """Query position minus key position for query index i and key index j, clamped at 0
        (future keys are masked anyway; the clamp keeps table lookups in range)."""
        return (self.q_pos[i] - self.k_pos[j]).clamp(min=0)


def make_context(q_pos, k_pos, n_pos=None, **extra):
    """A Context; n_pos defaults to 1 + the largest position (a host sync: model.py passes it)."""
    if n_pos is None:
        n_pos = int(torch.maximum(q_pos.max(), k_pos.max())) + 1 if k_pos.numel() else 0
    return Context(q_pos, k_pos, extra, n_pos)


class PositionalEncoding(nn.Module):
    """Base class and the 'none' behaviour for every hook (see the module docstring); also
    max_len, addresses(T), embeds_positions and owns_attention, which the scripts read."""
    name = None                    # the registry name (set by @register)
    uses_rope_scaling = False      # config.rope_scaling applies to it (the RoPE family)
    scaling = None                 # the rope_scaling dict it applies, resolved and checked, or None
    cache_keys = 'transformed'     # 'transformed' | 'raw' | 'scheme' (see the module docstring)
    softmax = 'attend'             # 'attend' | 'own' | None (see the module docstring)
    x_lookback = 0                 # tokens before a query's first visible key whose input x its logits read
    fla_kernel = None              # the fla kernel its `attention` hook can run (kernels.FLA_KERNELS), or None
    content_position = False       # its position term meets the content, q or k (Shaw, XL, DeBERTa, CoPE): bench's goal

    def __init__(self, config):
        super().__init__()
        self.n_embd, self.n_head = config.n_embd, config.n_head
        self.head_dim = config.n_embd // config.n_head
        self.block_size = config.block_size

    @classmethod
    def variant(cls, config, options):
        """The class to build for these options (the registered one; rope picks ExtendedRoPE for a
        Self-Extend or ReRoPE rope_scaling)."""
        return cls

    def max_len_of(self):
        """Largest number of positions this scheme can address; None = unbounded."""
        return None

    @property
    def max_len(self):
        return self.max_len_of()

    def addresses(self, T):
        """True when positions 0..T-1 are all within reach (always, unless there is a finite table)."""
        return self.max_len is None or T <= self.max_len

    def check_positions(self, n_pos):
        """model.py calls this with the Python-int bound on the positions of a forward,
        so a scheme with a finite table refuses them before any tensor work."""
        if not self.addresses(n_pos):
            raise ValueError(
                f"{self.name} position embeddings have {self.max_len} positions, but position "
                f"{n_pos - 1} was requested. Evaluate/sample with at most {self.max_len} tokens "
                f"of context (sample.py does this with a sliding window), or train a scheme that "
                f"extrapolates: {', '.join(extrapolating_schemes())}")

    def embed(self, x, pos):
        return x

    def context(self, q_pos, k_pos, n_pos=None):
        return make_context(q_pos, k_pos, n_pos)

    def new_layer(self):
        return None

    def training_context(self, T, device=None):
        """The Context of a forward of T tokens at positions 0..T-1 without a KV cache, as model.GPT.forward builds
        it (the scripts that run one layer alone use it)."""
        pos = torch.arange(T, device=device)
        ctx = self.context(pos, pos, T)
        ctx.consecutive = True
        return ctx

    def heads(self):
        """(query heads, key/value heads, attention heads) of a layer: the model projects that many query
        and key/value heads, transform_qk may return more query heads than key heads (grouped: query head h
        reads key/value head h // g), and the attention's output has `attention heads` heads."""
        return self.n_head, self.n_head, self.n_head

    def layer_context(self, x, ctx, params, cache):
        """This layer's Context, for a scheme whose positions depend on the layer's input x [B, Tq, C]
        (the shared ctx otherwise). Called every layer before transform_qk; what it returns is the ctx that
        layer's transform_qk, score_mod, value_mod and attention get. cache: the layer's KV cache before this
        forward's keys are appended (None without one)."""
        return ctx

    def transform_qk(self, q, k, ctx, params):
        return q, k

    def score_mod(self, q, k, ctx, params):
        return None

    def value_mod(self, q, k, ctx, params, bias, att):
        """g(lse) added to the attention output, built from the q and bias (a Bias, or None) that the attention's
        own path uses after attention scaling (attn_scaling) has scaled them; `att` says which keys each query
        sees (its mask), since a value term that rebuilds weights must give hidden keys none. One user (Shaw's
        relative values); it is a hook of its own rather than part of `attention` because a scheme with its
        own attention gets no attention scaling, and Shaw's values must be read from scaled logits
        to train with logn/ssmax."""
        return None

    def attention(self, q, k, v, x, ctx, params, cache, att):
        return None

    def stream(self, m, ctx, params, cache):
        """The positional stream the next block gets, for a scheme that carries one beside the residual stream
        (TAPE): model.Block calls it after its MLP with the MLP's output m [B, Tq, C] and this layer's ctx as
        layer_context and the attention left it. ctx.stream is the stream this block got (None before the first
        layer that makes one); the default hands it on unchanged, so a layer of another scheme (NoPE) passes it."""
        return ctx.stream

    @staticmethod
    def fla_schemes():
        """The registered schemes whose `attention` hook can run an fla kernel (kernels.py)."""
        return sorted(name for name, cls in REGISTRY.items() if cls.fla_kernel is not None)

    @property
    def owns_attention(self):
        """True when this scheme computes its layers' attention itself (its `attention` hook),
        so the model's attention scaling (attn_scaling) never sees its logits."""
        return type(self).attention is not PositionalEncoding.attention

    @property
    def embeds_positions(self):
        """True when positions enter the token embeddings (embed), i.e. the residual stream."""
        return type(self).embed is not PositionalEncoding.embed

    def extra_repr(self):
        return f"name={self.name}"


# --- helpers every scheme may use: option checks (one line naming the option and what it takes), small modules


def _softplus_inverse(y):
    """The x with softplus(x) = y, for y > 0."""
    return math.log(math.expm1(float(y)))


def _linear(n_in, n_out, bias=None):
    """nn.Linear with flash-linear-attention's init: weight N(0, 0.02), bias `bias` (None: no bias)."""
    m = nn.Linear(n_in, n_out, bias=bias is not None)
    nn.init.normal_(m.weight, std=0.02)
    if bias is not None:
        nn.init.constant_(m.bias, float(bias))
    return m


def check_flag(scheme, name, value):
    """An option that is True or False."""
    if not isinstance(value, bool):
        raise ValueError(f"{scheme} {name} must be True or False, got {value!r}")
    return value


def check_number(scheme, name, value, lo=0.0, inclusive=False, what=''):
    """A number > lo (>= lo when inclusive) -> float."""
    number = not isinstance(value, bool) and isinstance(value, (int, float))
    if not (number and (value >= lo if inclusive else value > lo)):
        raise ValueError(f"{scheme} {name} must be a number {'>=' if inclusive else '>'} {lo:g}{what}, got {value!r}")
    return float(value)


def check_whole(scheme, name, value, lo=1, hi=None, even=False, what=''):
    """A whole number lo <= value <= hi (even where asked) -> int; 16.0 is 16, 2.5 is refused."""
    whole = not isinstance(value, bool) and (isinstance(value, int) or isinstance(value, float) and value.is_integer())
    if not (whole and lo <= value and (hi is None or value <= hi) and not (even and value % 2)):
        kind = 'an even integer' if even else 'an integer'
        bound = f"in {lo}..{hi}" if hi is not None else f">= {lo}"
        raise ValueError(f"{scheme} {name} must be {kind} {bound}{what}, got {value!r}")
    return int(value)


def check_choice(scheme, name, value, choices):
    """One of `choices`."""
    if value not in choices:
        raise ValueError(f"{scheme} {name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


# --- not at all: no positional signal (the causal mask still leaks position)


@register('none')
class NoPE(PositionalEncoding):
    """NoPE: no positional information at all (Kazemnejad et al., arXiv 2305.19466;
    Haviv et al., arXiv 2203.16634). A causal decoder still learns position,
    because the causal mask leaks it (the number of attended tokens differs per row)."""


# --- added to the token embeddings (`embed`), once, before block 0


def sinusoidal_table(n_pos, dim, positions=None):
    """Vaswani et al. 2017 (arXiv 1706.03762), section 3.5, the paper's layout:
    PE[p, 2i] = sin(p / 10000^(2i/dim)),  PE[p, 2i+1] = cos(p / 10000^(2i/dim)).
    Interleaved sin/cos (fairseq/tensor2tensor concatenate instead; not the paper)."""
    assert dim % 2 == 0, f"sinusoidal embedding needs an even dim, got {dim}"
    pos = torch.arange(n_pos, dtype=torch.float64) if positions is None else positions.double()
    inv = 10000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float64, device=pos.device) / dim)  # [dim/2]
    ang = pos[:, None] * inv[None, :]
    table = torch.stack([ang.sin(), ang.cos()], dim=-1).reshape(len(pos), dim)  # interleave
    return table.float()


@register('learned')
class Learned(PositionalEncoding):
    """Learned absolute position embeddings (GPT-2 / GPT, Radford et al. 2018/2019;
    also arXiv 1706.03762 section 3.5). x_p = tok_p + W[p], W a [max_len, n_embd]
    table initialised N(0, 0.02). Cannot address positions >= max_len (default
    block_size): asking for them is an error (check_positions), not a silent clamp.
    Options: max_len (int, default block_size)."""

    def __init__(self, config, max_len=None):
        super().__init__(config)
        self.table_len = max_len or config.block_size
        self.wpe = nn.Embedding(self.table_len, config.n_embd)
        nn.init.normal_(self.wpe.weight, mean=0.0, std=0.02)

    def max_len_of(self):
        return self.table_len

    def embed(self, x, pos):
        return x + self.wpe(pos)  # model.py has checked the positions against the table


@register('sinusoidal')
class Sinusoidal(PositionalEncoding):
    """Fixed sinusoidal embeddings (Vaswani et al., arXiv 1706.03762, section 3.5):
    PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(same), interleaved.
    As in the paper (section 3.4) token embeddings are multiplied by sqrt(d_model)
    before PE is added, so neither term swamps the other. Computed for any
    position on the fly: there is no table to run past."""

    def embed(self, x, pos):
        table = sinusoidal_table(0, self.n_embd, positions=pos).to(x.device, x.dtype)
        return x * math.sqrt(self.n_embd) + table


# --- rotating or extending q and k (`transform_qk`): RoPE and its relatives, and RoPE's successors that stay
# q/k transforms (FoPE, GRAPE-M, RoPE++)


def rotate_half(x):
    """Half-split layout (GPT-NeoX, HF Llama): pairs are (i, i + d/2)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def angles(pos, inv_freq):
    """pos * inv_freq for every position and frequency, [T, n] in float32 (the paper's precision note:
    bf16 angles break at large positions)."""
    return pos.float()[:, None] * inv_freq[None, :]


def cos_sin(ang, factor=1.0):
    """Half-split rotary tables from angles [T, n]: cos and sin of [ang | ang], [T, 2n], times the
    attention factor."""
    emb = torch.cat((ang, ang), dim=-1)
    return emb.cos() * factor, emb.sin() * factor


def apply_rotary(x, cos, sin):
    """Rotate the first cos.size(-1) dims of x, pass the rest through (partial rotary).
    cos/sin: [T, rot_dim] in float32, already multiplied by the attention factor."""
    rot = cos.size(-1)
    xr, xp = x[..., :rot], x[..., rot:]
    xr = (xr.float() * cos + rotate_half(xr.float()) * sin).to(x.dtype)
    return torch.cat((xr, xp), dim=-1) if xp.size(-1) else xr


def key_tables(ctx, n_keys, q_tables, compute):
    """Position tables for the n_keys keys handed to transform_qk, which are the last
    n_keys of ctx.k_pos: the queries' own q_tables when they are the new keys
    (n_keys == len(ctx.q_pos)), else compute(ctx.k_pos[-n_keys:]) -- a cache of raw
    keys -- once per forward and key count (kept in ctx.extra for the other layers)."""
    if n_keys == ctx.q_pos.numel():
        return q_tables
    if ('k_tables', n_keys) not in ctx.extra:
        ctx.extra['k_tables', n_keys] = compute(ctx.k_pos[-n_keys:])
    return ctx.extra['k_tables', n_keys]


# Where RoPE reads its cos/sin from tables made at build (every position below L a row), rather than computing them
# each forward: CUDA, where a compiled step otherwise recomputes cos and sin of an arange inside every layer's rotary
# kernel (Inductor inlines cheap pointwise ops; on an H200 those kernels took 2.1 of rope's 38 ms a step at
# 16 x 1024). Not the CPU: there Inductor's inlined cos and ATen's differ in the last bit, and CPU runs keep their
# numbers bitwise.
ROTARY_TABLES_ON = ('cuda',)


@register('rope')
class RoPE(PositionalEncoding):
    """Rotary position embedding (Su et al., arXiv 2104.09864), half-split layout
    as in GPT-NeoX / HF Llama: q' = q*cos(p*theta) + rotate_half(q)*sin(p*theta),
    theta_i = base^(-2i/d), d = rot_dim. q'.k' depends only on the offset n - m.
    Options: base (default 10000; Llama 3 uses 500000), rotary_pct (fraction of
    head_dim rotated, default 1.0; GPT-NeoX uses 0.25), p_rope (p-RoPE, Barbero et
    al. arXiv 2410.06205, HF's 'proportional': the fraction p of the frequency pairs
    rotated, the highest ones; default None = off), scaling (context-extension dict,
    see rope_frequencies; config.rope_scaling overrides it at run time, and
    original_max_len defaults to block_size).

    rotary_pct vs p_rope: rotary_pct=0.25 rotates the first quarter of each head's
    dims as a RoPE of its own, theta_i = base^(-2i/rot_dim) over rot_dim = head_dim/4
    (the full frequency range squeezed into fewer pairs). p_rope=0.25 keeps RoPE over
    the whole head (half-split pairs (i, i + head_dim/2), theta_i = base^(-2i/head_dim))
    and sets theta_i = 0 for i >= floor(p*head_dim/2): the highest frequencies are
    kept exactly, the lowest are dropped, and the dropped pairs (dims i and
    i + head_dim/2) see cos = 1, sin = 0, i.e. pass through unrotated. p_rope=0 is
    NoPE, p_rope=1 plain RoPE. The two options do not combine.

    cos/sin (float32, times the attention factor) are computed once per forward,
    shared by all layers, from the positions themselves; on the devices of
    ROTARY_TABLES_ON (CUDA) they are read from tables made at build for positions
    below block_size (never mutated: a cache filled inside forward would make
    torch.compile recompile). 'dynamic' recomputes its frequencies from the current
    length ctx.n_pos, 'longrope' switches from its short to its long list past
    original_max_len (with a KV cache, keys cached before the switch keep their
    rotation, as in HF); every other type keeps them in a buffer.

    Dynamic NTK with a KV cache (a deliberate choice, as in HF transformers): each
    forward uses the frequencies of its current total length for its queries and
    its new keys; keys already in the cache keep the rotation they got when they
    were new. So up to L tokens decoding equals a full forward exactly; past L the
    cached keys are rotated with older (less stretched) frequencies than a full
    forward over the same tokens would use -- the method's known inconsistency.
    Re-rotating the cache every step would need unrotated keys in the cache; for
    the exact method, sample with use_cache=False (recompute each step).

    Inference-time extensions (rope_scaling types self_extend, rerope, leaky_rerope;
    distance maps in self_extend_positions / rerope_positions): every pair closer than
    `window` is scored by plain RoPE, farther pairs at a remapped distance, so the
    layer computes two logit maps and merges them by the window mask (the attention
    hook of ExtendedRoPE, which `rope` builds for these types; dense float32, query chunks
    without gradients: no FlexAttention, whose score_mod sees one q.k). The KV cache then
    keeps raw keys, rotated every step."""
    uses_rope_scaling = True

    @classmethod
    def variant(cls, config, options):
        """An extension type (self_extend, rerope, leaky_rerope, string) builds ExtendedRoPE."""
        sc = getattr(config, 'rope_scaling', None) or options.get('scaling')
        return ExtendedRoPE if isinstance(sc, dict) and sc.get('type') in EXTENSION_TYPES else cls

    def __init__(self, config, base=10000.0, rotary_pct=1.0, scaling=None, p_rope=None):
        super().__init__(config)
        self.base = float(base)
        if p_rope is not None and rotary_pct != 1.0:
            raise ValueError(f"p_rope={p_rope!r} and rotary_pct={rotary_pct!r} are two different partial "
                             f"rotaries (p_rope keeps the full-head frequencies and zeroes the lowest; rotary_pct "
                             f"recomputes them over fewer dims); give one of them")
        self.p_rope = p_rope
        rd = self.head_dim * rotary_pct
        if rd != int(rd) or int(rd) % 2 or rd <= 0:
            raise ValueError(f"rotary dimension head_dim*rotary_pct = {self.head_dim}*{rotary_pct} = {rd} "
                             f"must be a positive even integer; change rotary_pct or n_embd/n_head")
        self.rot_dim = int(rd)
        self.scaling = scaling = resolve_rope_scaling(config, scaling)
        self.dynamic = scaling is not None and scaling['type'] in LENGTH_DEPENDENT_SCALING
        inv_freq, self.attention_factor = rope_frequencies(self.rot_dim, self.base, self.scaling, p_rope=p_rope)
        self.register_buffer('inv_freq', inv_freq, persistent=False)  # at lengths <= L
        # cos/sin of positions 0..L-1, once, read on the devices of ROTARY_TABLES_ON (RoPE.context)
        cos, sin = self.cos_sin(torch.arange(self.block_size), inv_freq)
        self.register_buffer('cos_table', cos, persistent=False)
        self.register_buffer('sin_table', sin, persistent=False)

    def context(self, q_pos, k_pos, n_pos=None):
        ctx = make_context(q_pos, k_pos, n_pos)
        inv = self.inv_freq
        if self.dynamic and ctx.n_pos > self.scaling['original_max_len']:
            inv = rope_frequencies(self.rot_dim, self.base, self.scaling, seq_len=ctx.n_pos,
                                   p_rope=self.p_rope)[0].to(q_pos.device)
        tabled = q_pos.device.type in ROTARY_TABLES_ON and inv is self.inv_freq and ctx.n_pos <= self.block_size
        cos, sin = (self.cos_table[q_pos], self.sin_table[q_pos]) if tabled else self.cos_sin(q_pos, inv)
        ctx.extra.update(cos=cos, sin=sin, inv=inv, tabled=tabled)
        return ctx

    def cos_sin(self, pos, inv):
        return cos_sin(angles(pos, inv), self.attention_factor)

    def key_cos_sin(self, ctx):
        """cos and sin at key positions: rows of the tables where the context's are (RoPE.context)."""
        if ctx.extra.get('tabled'):
            return lambda pos: (self.cos_table[pos], self.sin_table[pos])
        return lambda pos: self.cos_sin(pos, ctx.extra['inv'])

    def transform_qk(self, q, k, ctx, params):
        cos, sin = ctx.extra['cos'], ctx.extra['sin']
        kcos, ksin = key_tables(ctx, k.size(2), (cos, sin), self.key_cos_sin(ctx))
        return apply_rotary(q, cos, sin), apply_rotary(k, kcos, ksin)


class ExtendedRoPE(RoPE):
    """`rope` with an inference-time extension (rope_scaling type self_extend, rerope, leaky_rerope or
    string; the distance maps are rope_scaling.self_extend_positions, rerope_positions and string_positions),
    built for `rope` when one is asked for (RoPE.variant). Near pairs (i - j < window; STRING: < shift) are
    scored by plain RoPE, far ones at the remapped distance, by two rotations of q and k:
      self_extend   q at i // G + window - window // G,  k at j // G
      rerope        q at window,                         k not rotated
      leaky_rerope  RoPE with inv_freq / k: q at i + window * (k - 1), k at j
      string        q at i - shift + local,              k at j
    and logits = where(i - j < window, exact, remapped) / sqrt(d) over the layer's mask, softmax, in
    float32 (query chunks without gradients). The layer computes this attention itself, with a softmax of
    its own (no sink logits). Every key is rotated two ways each forward, so the KV cache keeps raw keys."""
    cache_keys = 'raw'
    softmax = 'own'

    def transform_qk(self, q, k, ctx, params):
        return q, k  # attention rotates them, two ways

    def attention(self, q, k, v, x, ctx, params, cache, att):
        def rot(t, pos, slow=1.0):  # t rotated at positions pos, every frequency divided by slow
            return apply_rotary(t, *self.cos_sin(pos, ctx.extra['inv'] / slow)).float()
        ext, q_pos, k_pos = self.scaling, ctx.q_pos, ctx.k_pos[-k.size(2):]
        w = ext['shift'] if ext['type'] == 'string' else ext['window']
        if ext['type'] == 'string':  # far keys at i - j - shift + local
            q2, k2 = rot(q, q_pos - w + ext['local']), rot(k, k_pos)
        elif ext['type'] == 'self_extend':
            G = ext['group']
            q2, k2 = rot(q, q_pos // G + (w - w // G)), rot(k, k_pos // G)
        elif ext['type'] == 'rerope':  # every far key scored at distance w: q at w, k unrotated
            q2, k2 = rot(q, torch.full_like(q_pos, w)), k.float()
        else:  # leaky: distances beyond w grow k times slower
            q2, k2 = rot(q, q_pos + w * (ext['k'] - 1), ext['k']), rot(k, k_pos, ext['k'])

        def run(q1, k1, v, a):  # query rows a.row0.., the keys a.key0.. they can see
            Tq, Tk, s, lo = q1.size(2), k1.size(2), a.row0, a.key0
            near = q_pos[s:s + Tq, None] - k_pos[None, lo:lo + Tk] < w
            with torch.autocast(q.device.type, enabled=False):
                z = torch.where(near, q1 @ k1.transpose(-2, -1),
                                q2[:, :, s:s + Tq] @ k2[:, :, lo:lo + Tk].transpose(-2, -1))
                z = (z / math.sqrt(q.size(-1))).masked_fill(~a.visibility(Tq, Tk, q.device), float('-inf'))
                return z.softmax(-1) @ v.float()
        return att.rows(run, rot(q, q_pos), rot(k, k_pos), v).to(q.dtype)


def _rope_freqs(scheme, dim, ctx):
    """(inv_freq, attention factor) of a rotary scheme: its buffer, or, with
    config.rope_scaling set, rope_frequencies() at the current length ctx.n_pos
    (which the length-dependent methods need)."""
    if scheme.scaling is None:
        return scheme.inv_freq, scheme.attention_factor
    inv, factor = rope_frequencies(dim, scheme.base, scheme.scaling, seq_len=ctx.n_pos)
    return inv.to(ctx.k_pos.device), factor


@register('xpos')
class XPos(PositionalEncoding):
    """xPos (Sun et al., arXiv 2212.10554): RoPE (half-split, full head dim) plus a
    per-pair exponential decay. With zeta_i = (2i + 0.4d) / (1.4d), i = 0..d/2-1
    (same zeta for both dims of a pair), gamma = 512:
      q_n -> RoPE(q_n) * zeta^(n/gamma),   k_m -> RoPE(k_m) * zeta^(-m/gamma),
    so q.k carries zeta^((n-m)/gamma) < 1, decaying with distance.
    Centring: both exponents use n - c, m - c with c the midpoint of the key
    positions of this forward; products are unchanged, and |exponent| stays below
    T/(2 gamma), so float32 holds up to ~70k positions instead of ~35k. Because c
    moves as the cache grows, the KV cache keeps raw keys (cache_keys = 'raw')
    and all keys are rotated and scaled each forward (as the paper's torchscale code).
    Blockwise causal attention (option blockwise=True, evaluation only, as in the
    paper): each query sees only its own block and the previous one, blocks of
    bca_block = block_size // 2 by default, so no attended distance exceeds the
    training length; it changes nothing up to block_size. Options: base (10000),
    gamma (512), blockwise (False), bca_block. config.rope_scaling applies to the
    rotation through rope_frequencies()."""
    cache_keys = 'raw'
    uses_rope_scaling = True  # static rope_scaling types, applied to its rotation

    def __init__(self, config, base=10000.0, gamma=512.0, blockwise=False, bca_block=None):
        super().__init__(config)
        self.base, self.gamma, self.blockwise = float(base), float(gamma), bool(blockwise)
        self.bca_block = int(bca_block or max(1, config.block_size // 2))
        self.scaling = resolve_rope_scaling(config, static_only=True)
        d = self.head_dim
        inv_freq, self.attention_factor = rope_frequencies(d, self.base, self.scaling)
        self.register_buffer('inv_freq', inv_freq, persistent=False)
        zeta = (torch.arange(0, d, 2, dtype=torch.float32) + 0.4 * d) / (1.4 * d)
        self.register_buffer('zeta', zeta, persistent=False)

    def context(self, q_pos, k_pos, n_pos=None):
        ctx = make_context(q_pos, k_pos, n_pos)
        inv_freq, factor = _rope_freqs(self, self.head_dim, ctx)
        centre = (k_pos[0] + k_pos[-1]) // 2

        def tables(pos):
            scale = self.zeta[None, :] ** ((pos - centre).float()[:, None] / self.gamma)
            return (*cos_sin(angles(pos, inv_freq), factor), torch.cat((scale, scale), -1))
        ctx.extra.update(q=tables(q_pos), k=tables(k_pos))
        return ctx

    def transform_qk(self, q, k, ctx, params):
        cq, sq, zq = ctx.extra['q']
        ck, sk, zk = ctx.extra['k']
        return apply_rotary(q, cq * zq, sq * zq), apply_rotary(k, ck / zk, sk / zk)

    def score_mod(self, q, k, ctx, params):
        if not self.blockwise or self.training:
            return None
        w = self.bca_block

        def mod(score, b, h, i, j):  # -inf outside own and previous block (the diagonal is always kept)
            return torch.where(ctx.k_pos[j] // w >= ctx.q_pos[i] // w - 1, score, float('-inf'))
        return Bias(mod)


class _SectionRoPE(PositionalEncoding):
    """RoPE whose frequency pairs are split into sections, each rotated by the
    position on its own axis: angle[t, i] = pos[axis_of_pair[i], t] * inv_freq[i],
    half-split layout as `rope`. Subclasses give inv_freq, axis_of_pair and
    axis_positions(pos) -> [n_axes, T]."""
    uses_rope_scaling = True  # static rope_scaling types, applied to every section

    def __init__(self, config, base):
        super().__init__(config)
        self.base = float(base)
        self.scaling = resolve_rope_scaling(config, static_only=True)

    def set_sections(self, inv_freq, sections):
        self.register_buffer('inv_freq', inv_freq, persistent=False)
        axis = torch.repeat_interleave(torch.arange(len(sections)), torch.tensor(sections))
        self.register_buffer('axis_of_pair', axis, persistent=False)

    def freqs(self, ctx):
        return _rope_freqs(self, self.head_dim, ctx)

    def context(self, q_pos, k_pos, n_pos=None):
        ctx = make_context(q_pos, k_pos, n_pos)
        inv_freq, factor = self.freqs(ctx)  # [d/2] frequencies, section by section
        cos, sin = self.cos_sin(q_pos, inv_freq, factor)
        ctx.extra.update(cos=cos, sin=sin, freqs=(inv_freq, factor))
        return ctx

    def cos_sin(self, pos, inv_freq, factor):
        pos = self.axis_positions(pos).float()  # [n_axes, T]
        return cos_sin(pos[self.axis_of_pair].t() * inv_freq[None, :], factor)  # angles [T, d/2], float32

    def transform_qk(self, q, k, ctx, params):
        cos, sin = ctx.extra['cos'], ctx.extra['sin']
        kcos, ksin = key_tables(ctx, k.size(2), (cos, sin), lambda pos: self.cos_sin(pos, *ctx.extra['freqs']))
        return apply_rotary(q, cos, sin), apply_rotary(k, kcos, ksin)


@register('mrope')
class MRoPE(_SectionRoPE):
    """Multimodal RoPE (Qwen2-VL, Wang et al., arXiv 2409.12191): the d/2 frequency
    pairs of RoPE (inv_freq_i = base^(-2i/d)) are split into three contiguous
    sections driven by the temporal, height and width position ids. Qwen2-VL uses
    sections [16, 24, 24] for head_dim 128; the default here keeps those
    proportions: [P/4, (P - P/4)//2, rest] of P = d/2 pairs ([4, 6, 6] at d = 32).
    Text tokens have all three ids equal to the 1D position, and then M-RoPE is
    exactly RoPE (tested); this repo's data is text, so axis_positions repeats pos.
    Options: base, sections. config.rope_scaling goes through rope_frequencies()."""

    def __init__(self, config, base=10000.0, sections=None):
        super().__init__(config, base)
        P = self.head_dim // 2
        if sections is None:
            t = P // 4
            sections = [t, (P - t) // 2, P - t - (P - t) // 2]
        if sum(sections) != P or min(sections) < 0:
            raise ValueError(f"mrope sections {sections} must be non-negative and sum to head_dim/2 = {P}")
        self.sections = list(sections)
        inv_freq, self.attention_factor = rope_frequencies(self.head_dim, self.base, self.scaling)
        self.set_sections(inv_freq, self.sections)

    def axis_positions(self, pos):
        return pos[None, :].expand(3, -1)  # text: t = h = w = position


@register('rope2d')
class RoPE2D(_SectionRoPE):
    """Axial 2D RoPE (RoPE-Axial of Heo et al., arXiv 2403.13298; the 2D rotary of
    vision transformers): half the frequency pairs rotate by the row, half by the
    column, each half with the full RoPE frequency range over d/2:
    inv_freq_i = base^(-2i/(d/2)), i = 0..d/4-1, for both axes. A 1D sequence is
    laid out row-major on a grid `width` wide: row = p // width, col = p % width
    (for image-like data set width to the image width; default 32, so the default
    L = 128 is a 4x32 grid). Past the training length only the row axis grows.
    Needs head_dim % 4 == 0. Options: base, width."""

    def __init__(self, config, base=10000.0, width=32):
        super().__init__(config, base)
        if self.head_dim % 4:
            raise ValueError(f"rope2d splits head_dim into 2 axes of rotary pairs: head_dim must be a multiple "
                             f"of 4, got {self.head_dim}; change n_embd/n_head")
        self.width = check_whole('rope2d', 'width', width)
        inv, self.attention_factor = rope_frequencies(self.head_dim // 2, self.base, self.scaling)
        self.set_sections(torch.cat((inv, inv)), [self.head_dim // 4] * 2)

    def freqs(self, ctx):
        if self.scaling is None:
            return self.inv_freq, self.attention_factor
        inv, factor = rope_frequencies(self.head_dim // 2, self.base, self.scaling, seq_len=ctx.n_pos)
        return torch.cat((inv, inv)).to(ctx.k_pos.device), factor  # both axes, same frequencies

    def axis_positions(self, pos):
        return torch.stack((pos // self.width, pos % self.width))


class _PopeLayer(nn.Module):
    def __init__(self, n_head, head_dim, uniform):
        super().__init__()
        self.delta = nn.Parameter(torch.zeros(n_head, head_dim))  # phase bias delta_c per head
        if uniform:
            nn.init.uniform_(self.delta, -2 * math.pi, 0.0)


@register('pope')
class PoPE(PositionalEncoding):
    """Polar coordinate position embeddings (Gopalakrishnan et al., arXiv 2509.10534):
    every query/key component c is a complex number with magnitude softplus(q_c)
    (softplus(k_c)) -- the "what" -- and phase t*theta_c for a query at t, s*theta_c +
    delta_c for a key at s -- the "where" --, and the score is Re[q^H k] / sqrt(d):
        a_ts = sum_{c=1..d} softplus(q_tc) softplus(k_sc) cos((s - t) theta_c + delta_c) / sqrt(d),
    theta_c = base^(-(c-1)/d): d frequencies over all d components (RoPE has d/2 pairs).
    delta_c is learned, clamped to [-2 pi, 0] in every forward, zero init (reported
    better for length extrapolation; option delta_init='uniform' draws U(-2 pi, 0),
    reported slightly better in distribution); here one delta [n_head, head_dim] per
    layer (x-transformers keeps one [n_head, head_dim] for all layers). The sign of
    delta, the frequencies, the clamp and the 1/sqrt(d) of the original head dim follow
    x-transformers' and lucidrains/PoPE-pytorch's implementations of the paper (the key
    carries phase s*theta + delta).
    Realised as transform_qk: q -> sqrt(2) [mag cos(t theta) | mag sin(t theta)],
    k -> [mag cos(s theta + delta) | mag sin(s theta + delta)] (head dim 2d, like `xl`), so
    plain causal SDPA's 1/sqrt(2d) becomes the paper's 1/sqrt(d); computed in float32.
    Keys depend on their own position only, so the KV cache keeps them transformed.
    attend() pads v with d zero columns so that SDPA's fused (flash) kernels, which
    need equal q and v head dims, run instead of the T x T math kernel.
    Options: base (default 10000), delta_init ('zero' | 'uniform', default 'zero')."""

    def __init__(self, config, base=10000.0, delta_init='zero'):
        super().__init__(config)
        self.base, self.delta_init = float(base), check_choice('pope', 'delta_init', delta_init, ('zero', 'uniform'))
        inv = self.base ** (-torch.arange(self.head_dim, dtype=torch.float64) / self.head_dim)
        self.register_buffer('inv_freq', inv.float(), persistent=False)

    def new_layer(self):
        return _PopeLayer(self.n_head, self.head_dim, self.delta_init == 'uniform')

    def angles(self, pos):
        return angles(pos, self.inv_freq)  # [T, d]: t * theta_c

    def context(self, q_pos, k_pos, n_pos=None):
        return make_context(q_pos, k_pos, n_pos, angle=self.angles(q_pos))

    def transform_qk(self, q, k, ctx, params):
        with torch.autocast(q.device.type, enabled=False):
            ang = ctx.extra['angle']
            ang_k = key_tables(ctx, k.size(2), ang, self.angles)  # the keys' own positions
            ang_k = ang_k[None] + params.delta.float().clamp(-2 * math.pi, 0.0)[:, None]  # [H, Tk, d]
            mq, mk = F.softplus(q.float()), F.softplus(k.float())
            q2 = torch.cat((mq * ang.cos(), mq * ang.sin()), -1) * math.sqrt(2.0)
            k2 = torch.cat((mk * ang_k.cos(), mk * ang_k.sin()), -1)
        return q2.to(q.dtype), k2.to(k.dtype)


@register('xl')
class TransformerXL(PositionalEncoding):
    """Transformer-XL relative attention (Dai et al., arXiv 1901.02860, section 3.3):
    score_ij = [(q_i + u).k_j + (q_i + v).W_R R_{i-j}] / sqrt(d_head),
    R_r = [sin(r w) | cos(r w)], w_f = 10000^(-2f/r_dim) (r_dim = n_embd as in the
    paper), u, v [n_head, d_head] learned and shared by all layers, W_R [n_embd, r_dim]
    per layer. No segment recurrence (memory): this is the position scheme only.
    Exact rewrite, no TxT tensor: with a = W_R^T (q_i + v) split as [a_s | a_c],
    a.R_{i-j} = sum_f c_f(i) cos(j w_f) + s_f(i) sin(j w_f) where
    c = a_s sin(i w) + a_c cos(i w), s = a_c sin(i w) - a_s cos(i w). So the
    positional term is a dot product of a per-query vector with the fixed key
    vector [cos(j w) | sin(j w)]: transform_qk appends them to q and k (head dim
    d_head + r_dim) and plain causal SDPA does the rest. q is multiplied by
    sqrt((d_head + r_dim)/d_head) so SDPA's 1/sqrt(dim) is XL's 1/sqrt(d_head). A head that
    wide (64 + 768 in GPT-2) has no fused kernel: training on CUDA hands the appended
    columns' product to SDPA as a bias table (attention.wide_split).
    Options: r_dim (default n_embd). Init N(0, 0.02) for u, v and W_R (XL's)."""
    content_position = True

    def __init__(self, config, r_dim=None):
        super().__init__(config)
        self.r_dim = check_whole('xl', 'r_dim', r_dim or config.n_embd, even=True, what=' (the sinusoid R\'s dims)')
        self.u = nn.Parameter(torch.randn(config.n_head, self.head_dim) * 0.02)
        self.v = nn.Parameter(torch.randn(config.n_head, self.head_dim) * 0.02)
        inv = 10000.0 ** (-torch.arange(0, self.r_dim, 2, dtype=torch.float64) / self.r_dim)
        self.register_buffer('inv_freq', inv.float(), persistent=False)

    def new_layer(self):
        w_r = nn.Linear(self.r_dim, self.n_embd, bias=False)  # W_R: R -> all heads
        nn.init.normal_(w_r.weight, std=0.02)
        return w_r

    def context(self, q_pos, k_pos, n_pos=None):
        cos, sin = self.cos_sin(q_pos)
        return make_context(q_pos, k_pos, n_pos, cos=cos, sin=sin)

    def cos_sin(self, pos):
        ang = angles(pos, self.inv_freq)  # [T, r_dim/2]
        return ang.cos(), ang.sin()

    def transform_qk(self, q, k, ctx, params):
        B, H, T, d = q.shape
        cos, sin = ctx.extra['cos'], ctx.extra['sin']
        kcos, ksin = key_tables(ctx, k.size(2), (cos, sin), self.cos_sin)
        w = params.weight.view(H, d, self.r_dim)  # W_R^h
        a = torch.einsum('bhtd,hdr->bhtr', (q + self.v[:, None]).float(), w.float())
        a_s, a_c = a.chunk(2, dim=-1)  # coefficients of sin(r w) and cos(r w) in R_r
        q_r = torch.cat((a_s * sin + a_c * cos, a_c * sin - a_s * cos), -1)
        k_r = torch.cat((kcos, ksin), -1).expand(B, H, -1, -1)  # the keys' own positions
        c = math.sqrt((d + self.r_dim) / d)
        q = torch.cat((q + self.u[:, None], q_r.to(q.dtype)), -1) * c
        k = torch.cat((k, k_r.to(k.dtype)), -1)
        return q, k


class _FopeLayer(nn.Module):
    def __init__(self, sin_coef, cos_coef, learnable):
        super().__init__()
        for name, t in (('sin_coef', sin_coef), ('cos_coef', cos_coef)):  # [H, n_freq, planes]
            if learnable:
                setattr(self, name, nn.Parameter(t))
            else:  # frozen, and drawn at random: saved with the checkpoint
                self.register_buffer(name, t)


@register('fope')
class FoPE(PositionalEncoding):
    """Fourier Position Embedding, FoPE (Hua et al., arXiv 2412.17739, ICML 2025), as the code of OpenMOSS/rope_pp
    builds it (rope_pp/modeling_llama_fope.py, FourierEmbedding; settings of train_fope.py). Each of the first
    `planes` half-split planes of a head gets a Fourier series over a set of frequencies instead of RoPE's one:
        S_c(t) = sum_i A[h, i, c] sin(t f_i),   C_c(t) = sum_i B[h, i, c] cos(t f_i)
        plane c of q at t: (x1, x2) -> (x1 C_c(t) - x2 S_c(t), x2 C_c(t) + x1 S_c(t))      (k likewise at its t)
    the code's `x cos + rotate_half(x) sin` with its Fourier sin and cos in place of RoPE's. The frequencies are
    RoPE's spectrum over D = max(fourier_dim = 128, head_dim) dims, f_i = base^(-2i/D), base 10000; the floor
    clamp sets every f_i whose period 2 pi / f_i is longer than the training length L (block_size) to 0, and
    the zeros are dropped (the code's fourier_ignore_zero), so n_freq = #{i: f_i >= 2 pi / L} frequencies are
    left (21 at D = 128, L = 128). planes = min(n_freq, head_dim / 4) by default (the code's output_dim).
    As the authors' training config: A (sin) and B (cos) are separate, one pair per head (per KV head; nanoPE's
    heads are all KV heads) and per layer, initialised as xavier_normal (gain 0.3, on the [H, n_freq, planes]
    tensor, as the code) plus a step identity (A[h, c * ceil(n_freq / planes), c] += 1), and frozen (option
    learnable=True trains them). The other head_dim/2 - planes planes get sin = cos = 1 (the code pads with 1):
    (x1, x2) -> (x1 - x2, x1 + x2), which is no position and doubles those planes' share of q . k. Identity
    coefficients over every plane (planes = head_dim / 2 = n_freq, D = head_dim, no clamp, init='eye') make
    FoPE exactly `rope` (tested); zero coefficients do not (they zero those planes).
    The transform is not a rotation, and depends on the token's own position only: keys are cached transformed.
    Angles float32 (the code's rope_full_precision). The FoPE paper was read through its abstract and summaries
    only; every setting here is the code's. Options (defaults in parentheses): base (10000), fourier_dim (128),
    planes (min(n_freq, head_dim/4)), floor_clamp (True), learnable (False), init ('eye_xavier_norm' | 'eye'),
    init_gain (0.3)."""

    def __init__(self, config, base=10000.0, fourier_dim=128, planes=None, floor_clamp=True, learnable=False,
                 init='eye_xavier_norm', init_gain=0.3):
        super().__init__(config)
        if self.head_dim % 2:
            raise ValueError(f"fope works on planes of 2 dims: head_dim must be even, got {self.head_dim}; "
                             f"change n_embd/n_head")
        fourier_dim = check_whole('fope', 'fourier_dim', fourier_dim, lo=2, even=True)
        self.base, self.init_gain = check_number('fope', 'base', base), check_number('fope', 'init_gain', init_gain)
        self.floor_clamp = check_flag('fope', 'floor_clamp', floor_clamp)
        self.learnable = check_flag('fope', 'learnable', learnable)
        self.init = check_choice('fope', 'init', init, ('eye_xavier_norm', 'eye'))
        D = max(fourier_dim, self.head_dim)
        f = 1.0 / self.base ** (torch.arange(0, D, 2, dtype=torch.float32) / D)
        if self.floor_clamp:
            f = f[f >= 2 * math.pi / config.block_size]  # clamped to 0, and the zeros dropped
        if not f.numel():
            raise ValueError(f"fope: no frequency of base {base} over {D} dims has a period within the training "
                             f"length {config.block_size}; use floor_clamp=False or a longer block_size")
        self.n_freq, P = f.numel(), self.head_dim // 2
        self.planes = min(self.n_freq, self.head_dim // 4) if planes is None else planes
        self.planes = check_whole('fope', 'planes', self.planes, hi=min(self.n_freq, P),
                                      what=f" (at most head_dim/2 = {P} planes and the {self.n_freq} frequencies left)")
        self.register_buffer('freq', f, persistent=False)

    def step_eye(self):
        """[n_freq, planes]: 1 at (c * ceil(n_freq / planes), c), the code's get_step_eye."""
        eye, step = torch.zeros(self.n_freq, self.planes), -(-self.n_freq // self.planes)
        for c in range(self.planes):
            if c * step < self.n_freq:
                eye[c * step, c] = 1.0
        return eye

    def new_layer(self):
        coefs = []
        for _ in range(2):
            t = torch.zeros(self.n_head, self.n_freq, self.planes)
            if self.init == 'eye_xavier_norm':
                nn.init.xavier_normal_(t, gain=self.init_gain)
            coefs.append(t + self.step_eye())
        return _FopeLayer(*coefs, self.learnable)

    def tables(self, pos, params):
        """cos and sin tables [H, T, head_dim] at positions pos: the Fourier series, padded with 1."""
        ang = angles(pos, self.freq)  # [T, n_freq], float32
        pad = (0, self.head_dim // 2 - self.planes)
        s = F.pad(torch.einsum('ti,hic->htc', ang.sin(), params.sin_coef.float()), pad, value=1.0)
        c = F.pad(torch.einsum('ti,hic->htc', ang.cos(), params.cos_coef.float()), pad, value=1.0)
        return torch.cat((c, c), -1), torch.cat((s, s), -1)

    def transform_qk(self, q, k, ctx, params):
        with torch.autocast(q.device.type, enabled=False):
            cos, sin = self.tables(ctx.q_pos, params)
            kcos, ksin = (cos, sin) if k.size(2) == ctx.q_pos.numel() else self.tables(ctx.k_pos[-k.size(2):], params)
        return apply_rotary(q, cos, sin), apply_rotary(k, kcos, ksin)


class _GrapeMLayer(nn.Module):
    def __init__(self, log_freq, learnable):
        super().__init__()
        if learnable:
            self.log_freq = nn.Parameter(log_freq)  # [d/2] or [H, d/2]: the frequencies' logs, times the scale
        else:
            self.register_buffer('log_freq', log_freq, persistent=False)


@register('grape_m')
class GrapeM(PositionalEncoding):
    """Multiplicative GRAPE, GRAPE-M (Group RepresentAtional Position Encoding; Zhang et al., arXiv 2512.07805,
    ICLR 2026; code model-architectures/GRAPE, model/llama-mha-grape-m-nonctx.py and -ctx.py). A position n acts
    on q and k by G(n) = exp(n L), L a sum of rank-2 skew generators; on d/2 commuting planes (the canonical
    half-split pairs (i, i + d/2)) this is a rotation of plane i by the angle n f_i, so q_n . k_m depends on
    n - m only. Here, as in the authors' non-contextual model:
        plane i of q at n:  (x1, x2) -> (x1 cos(n f_i) + x2 sin(n f_i), -x1 sin(n f_i) + x2 cos(n f_i))
    and likewise for k at m, f_i = exp(log_freq_i / s), learned per layer (one spectrum shared by the heads;
    per_head=True gives each head its own), initialised to RoPE's log-uniform spectrum base^(-2i/d), base
    10000, and stored times s = log_freq_scale = 16 (the authors' device for a smaller effective learning
    rate; s = 1 when frozen).
    Direction: the authors' code turns each plane by -n f_i, the opposite of HF's RoPE (and of nanoPE's
    `rope`), as their own RoPE baseline does; this follows their code. So grape_m at its initial spectrum is
    `rope` with every second-half dim of q and k negated (a reflection of each plane, which reverses the
    turn): the logits are equal when the second half of each head's query and key weights changes sign
    (tested), or, equivalently, `rope` with the frequencies negated. The paper's G(n) = exp(n theta L) with
    J = [[0, -1], [1, 0]] turns each plane by +n theta (HF's direction; its Prop. 3.1: canonical planes and the
    log-uniform spectrum give RoPE exactly); the code turns by -n theta.
    Contextual form (option contextual=True; the authors' "ctx" model, their Type I): one phase per token
    from the layer input x, omega_t = sigmoid((w . x_t + b) / 16) (scalar, shared by the heads; ctx_per_head
    gives one per head), Phi_t = sum_{tau < t} omega_tau (exclusive prefix sum), and plane i turns by
    Phi_t f_i. w = 0, b = softplus^-1(init_omega = 1e-3) at init, as the authors' code: their comments and
    the paper use softplus, the code uses sigmoid, so omega starts at sigmoid(-6.9 / 16) = 0.39, not 1e-3;
    this follows the code. In their contextual model the frequencies are stored unscaled (s = 1). With w = 0
    the contextual form is the non-contextual one with every frequency times sigmoid(b / 16) (tested).
    Not here: the authors' QK-RMSNorm after the rotation (their layers always normalise; nanoPE's qk_norm,
    off by default, runs before the positions), and their non-commuting and learned-basis forms (no code).
    Frequencies and angles are float32. Options (defaults in parentheses): base (10000), learnable (True),
    per_head (False), log_freq_scale (16), contextual (False), omega_scale (16), init_omega (1e-3),
    ctx_per_head (False)."""

    @classmethod
    def variant(cls, config, options):
        """contextual=True builds GrapeMContextual."""
        return GrapeMContextual if options.get('contextual') is True else cls

    def __init__(self, config, base=10000.0, learnable=True, per_head=False, log_freq_scale=16.0,
                 contextual=False, omega_scale=16.0, init_omega=1e-3, ctx_per_head=False):
        super().__init__(config)
        if self.head_dim % 2:
            raise ValueError(f"grape_m rotates planes of 2 dims: head_dim must be even, got {self.head_dim}; "
                             f"change n_embd/n_head")
        self.base = check_number('grape_m', 'base', base)
        self.learnable, self.per_head = (check_flag('grape_m', k, v) for k, v in (('learnable', learnable),
                                                                                  ('per_head', per_head)))
        self.contextual = check_flag('grape_m', 'contextual', contextual)
        self.ctx_per_head = check_flag('grape_m', 'ctx_per_head', ctx_per_head)
        self.omega_scale = check_number('grape_m', 'omega_scale', omega_scale)
        self.init_omega = check_number('grape_m', 'init_omega', init_omega)
        scale = check_number('grape_m', 'log_freq_scale', log_freq_scale)
        self.scale = scale if learnable and not contextual else 1.0  # the contextual model stores them unscaled
        inv = 1.0 / self.base ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim)
        self.register_buffer('inv_freq', inv, persistent=False)

    def new_layer(self):
        log = self.inv_freq.log() * self.scale
        return _GrapeMLayer(log.repeat(self.n_head, 1) if self.per_head else log, self.learnable)

    def freq(self, params):
        """The layer's frequencies f [d/2] or [H, d/2], float32."""
        return torch.exp(params.log_freq.float() / self.scale)

    @staticmethod
    def tables(phase, freq):
        """cos and sin tables [..., T, d] of the angles phase * f: phase [T] (positions) or [B, G, T]."""
        f = freq if freq.dim() == 1 else freq[:, None, :]  # [H, 1, d/2] against [T] or [B, G, T]
        return cos_sin(phase.float()[..., None] * f)

    def transform_qk(self, q, k, ctx, params):
        f = self.freq(params)
        cos, sin = self.tables(ctx.q_pos, f)
        kcos, ksin = (cos, sin) if k.size(2) == ctx.q_pos.numel() else self.tables(ctx.k_pos[-k.size(2):], f)
        return apply_rotary(q, cos, -sin), apply_rotary(k, kcos, -ksin)  # the authors' turn: -angle


@register('ropepp')
class RoPEPP(RoPE):
    """RoPE++ (Liu et al., arXiv 2512.07525; code OpenMOSS/rope_pp, rope_pp/modeling_llama_rope_pp.py): RoPE keeps
    only the real part of the complex score; RoPE++ adds heads that use the imaginary part. With z_q, z_k the
    complex pairs (first half + i second half) of a head's q and k, theta_c = base^(-2c/d) and t, s the query's
    and key's positions, both kinds of head share the rotated keys and the values:
        real head:       Re( sum_c z_q,c conj(z_k,c) e^{i (t - s) theta_c} ) / sqrt(d)     (= `rope`'s logit)
        imaginary head:  Im( sum_c z_q,c conj(z_k,c) e^{i (t - s) theta_c} ) / sqrt(d)
    The authors get the imaginary head from the query turned by a further -pi/2 (q sin - rotate_half(q) cos),
    which gives +Im as written; this follows their sign. Query head g makes attention heads 2g (real) and
    2g + 1 (imaginary), interleaved re_0, im_0, re_1, ..., and both read key/value head g (their repeat_kv).
        variant='eh' (default; the authors' imag1, their script's default): equal heads. n_head/2 query and
        key/value heads, n_head attention heads: half the q/k/v projections and half the KV cache of `rope`.
        variant='ec' (imag2): equal cache. n_head query and key/value heads, 2 n_head attention heads: the KV
        cache of `rope`, and an output projection twice as wide (2 n_embd -> n_embd).
    How the model supports it: the scheme's heads() says (query heads, key/value heads, attention heads); model.py
    sizes its q/k/v projection and its output projection from them (one attribute, no scheme names), transform_qk
    returns 2x the query heads with the keys unchanged, and attention.attend lets query head h read key/value
    head h // 2. QK-norm, sink logits and attn_scaling act per attention head. The authors' models use GQA
    (8 query, 4 KV heads); nanoPE has none, so each RoPE++ query head has its own KV head.
    Rotation, frequencies and rope_scaling as `rope` (half-split, base 10000; the static rope_scaling types
    apply to both kinds of head, as the authors' long-context runs; Self-Extend and ReRoPE, which compute their
    own attention, are refused). Options (defaults in parentheses): variant ('eh' | 'ec'; 'eh'), base (10000),
    scaling (None)."""

    @classmethod
    def variant(cls, config, options):
        return cls

    def __init__(self, config, variant='eh', base=10000.0, scaling=None):
        self.form = check_choice('ropepp', 'variant', variant, ('eh', 'ec'))
        if variant == 'eh' and config.n_head % 2:
            raise ValueError(f"ropepp variant 'eh' halves the query and key/value heads: n_head must be even, got "
                             f"{config.n_head}; change n_head or use variant='ec'")
        super().__init__(config, base=base, scaling=scaling)
        if self.scaling is not None and self.scaling['type'] in EXTENSION_TYPES:
            raise ValueError(f"ropepp: rope_scaling type {self.scaling['type']!r} computes its own attention, which "
                             f"has no imaginary heads; use a static type (linear, ntk, yarn, llama3, longrope) or "
                             f"dynamic")

    def heads(self):
        H = self.n_head
        return (H // 2, H // 2, H) if self.form == 'eh' else (H, H, 2 * H)

    def transform_qk(self, q, k, ctx, params):
        cos, sin = ctx.extra['cos'], ctx.extra['sin']
        kcos, ksin = key_tables(ctx, k.size(2), (cos, sin), lambda pos: self.cos_sin(pos, ctx.extra['inv']))
        real, imag = apply_rotary(q, cos, sin), apply_rotary(q, sin, -cos)  # imag: turned a further -pi/2
        return torch.stack((real, imag), 2).flatten(1, 2), apply_rotary(k, kcos, ksin)


def turn(x, cos, sin):
    """x [..., d] turned over its whole head by cos and sin [..., d] (half-split, `rope`'s direction), computed in
    float32, or in float64 where x is (the tests' references), and returned in x's dtype."""
    w = wide(x)
    return (w * cos + rotate_half(w) * sin).to(x.dtype)


@register('hope')
class HoPE(RoPE):
    """High-frequency rotary Position Encoding, HoPE (Chen, Lv, Luan, Wang, Liu, arXiv 2410.21216, ACL 2025): RoPE
    without its low-frequency components. Pair i (half-split, dims i and i + d/2, theta_i = base^(-2i/d)) keeps its
    rotation only when it turns at least `turns` full periods within the training length L:
        q'_m = R(m theta_i) q_m on pair i    where theta_i L >= 2 pi turns
        q'_m = q_m         on pair i    otherwise: those dims carry no position (R = I)
    so the kept pairs are the highest frequencies, a prefix i < r, and the rest are position-independent (HoPE's
    "replaces the specific components in RoPE with position-independent ones, retaining only high-frequency
    signals"). No authors' code was found; the paper's method section could not be read here either, so the
    threshold's default is the reading of two independent re-implementations (theta_i >= 2 pi / L: a pair that
    completes a period within L); turns=0.25 keeps the pairs that pass pi/2 within L. At nanoPE's default (head_dim
    32, L = 128) 6 of the 16 pairs rotate (8 with turns=0.25). turns=0 keeps every pair: `rope` exactly (tested).
    As `rope` otherwise (tables, cache, SDPA); HoPE is `rope` with p_rope = r / (d/2), r chosen from L, so no
    rope_scaling applies (the paper extrapolates without one). Options (defaults in parentheses): base (10000),
    train_len (block_size: L), turns (1.0)."""
    uses_rope_scaling = False

    @classmethod
    def variant(cls, config, options):
        return cls

    def __init__(self, config, base=10000.0, train_len=None, turns=1.0):
        super().__init__(config, base=check_number('hope', 'base', base, lo=1.0))
        self.train_len = check_whole('hope', 'train_len', config.block_size if train_len is None else train_len,
                                     what=' (the training length L)')
        self.turns = check_number('hope', 'turns', turns, inclusive=True,
                                  what=' (the periods a pair must turn within train_len to keep its rotation)')
        d = self.head_dim
        theta = self.base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
        keep = theta * self.train_len >= 2 * math.pi * self.turns
        self.n_rot = int(keep.sum())
        self.register_buffer('theta64', theta * keep, persistent=False)  # float64 references' frequencies
        self.inv_freq = (theta * keep).float()  # the dropped pairs at frequency 0: cos = 1, sin = 0
        self.cos_table, self.sin_table = self.cos_sin(torch.arange(self.block_size), self.inv_freq)

    def transform_qk(self, q, k, ctx, params):
        if q.dtype != torch.float64:
            return super().transform_qk(q, k, ctx, params)
        cos, sin = cos_sin(ctx.q_pos.double()[:, None] * self.theta64)  # a float64 reference: float64 angles
        kcos, ksin = cos_sin(ctx.k_pos[-k.size(2):].double()[:, None] * self.theta64)
        return turn(q, cos, sin), turn(k, kcos, ksin)


# --- a bias on the logits (`score_mod`): an additive logit bias f(score, b, h, i, j). A bias that depends only on
# the distance is tabulated once per forward for distances 0..n_pos-1 (O(T)) and indexed in score_mod, so
# FlexAttention never builds a TxT tensor and its backward scatters into that small table.


def distance_bias(bias, ctx):
    """The Bias of a bias of the distance alone, bias [H, n_pos] (bias[h, r] at distance r): indexed at each logit,
    and, where the distance of query i to key j is i - j (consecutive positions, as many queries as keys: training
    without a KV cache), the vector whole (its `distance` form)."""
    def mod(score, b, h, i, j):
        return score + bias[h, ctx.dist(i, j)]
    return Bias(mod, distance=bias if consecutive(ctx) else None)


def consecutive(ctx):
    """Whether query i is at distance i - j from key j: consecutive positions, as many queries as keys."""
    return ctx.consecutive and ctx.q_pos.numel() == ctx.k_pos.numel()


def alibi_slopes(n_head):
    """ALiBi head slopes (Press et al., arXiv 2108.12409). For n = 2^k heads the
    geometric sequence m_h = 2^(-8h/n), h = 1..n. Otherwise, with c the largest
    power of two below n: slopes(c) followed by every other slope of slopes(2c),
    n - c of them (the paper's reference implementation)."""
    def pow2(n):
        start = 2.0 ** (-8.0 / n)
        return [start ** (h + 1) for h in range(n)]
    if math.log2(n_head).is_integer():
        s = pow2(n_head)
    else:
        c = 2 ** math.floor(math.log2(n_head))
        s = pow2(c) + pow2(2 * c)[0::2][: n_head - c]
    return torch.tensor(s, dtype=torch.float32)


@register('alibi')
class ALiBi(PositionalEncoding):
    """Attention with Linear Biases (Press et al., arXiv 2108.12409):
    logit_ij += -m_h * (i - j) for key j <= query i, slopes m_h from alibi_slopes().
    Added after the 1/sqrt(d) scaling, not divided by it. No embedding is added."""

    def __init__(self, config):
        super().__init__(config)
        self.register_buffer('slopes', alibi_slopes(config.n_head), persistent=False)

    def score_mod(self, q, k, ctx, params):
        slopes, q_pos, k_pos = self.slopes, ctx.q_pos, ctx.k_pos

        def mod(score, b, h, i, j):
            return score + slopes[h] * (k_pos[j] - q_pos[i])
        # the same bias as m_h * k_pos[j] plus a term of the query alone, with no parameter to train; and by distance
        distance = -slopes[:, None] * torch.arange(ctx.n_pos, device=slopes.device) if consecutive(ctx) else None
        return Bias(mod, factors=lambda: (slopes.float().view(1, -1, 1, 1), k_pos.float().view(1, 1, -1, 1)),
                    grad=False, distance=distance)


def t5_bucket(relative_position, num_buckets=32, max_distance=128, bidirectional=False):
    """T5's relative-position bucket (Raffel et al., arXiv 1910.10683, as in Mesh TF).
    relative_position = key_pos - query_pos (<= 0 for the causal past).
    Causal: n = max(-rel, 0) and all buckets describe the past. Bidirectional: half the
    buckets per side, keys in the future get +num_buckets/2, n = |rel|.
    With nb buckets per side and max_exact = nb // 2: n < max_exact is its own bucket;
    larger n share log-spaced buckets max_exact + floor(log(n/max_exact) /
    log(max_distance/max_exact) * (nb - max_exact)), capped at nb - 1. Defaults: the
    top causal bucket (31) starts at distance 113 and holds everything beyond."""
    nb = num_buckets // 2 if bidirectional else num_buckets
    max_exact = nb // 2
    if max_exact < 1 or max_distance <= max_exact:
        raise ValueError(f"t5_bucket needs num_buckets >= {4 if bidirectional else 2} and max_distance > "
                         f"{max_exact} (half the buckets of a side), got num_buckets={num_buckets}, "
                         f"max_distance={max_distance}")
    rel = torch.as_tensor(relative_position)
    if bidirectional:
        offset = (rel > 0).long() * nb
        n = rel.abs()
    else:
        offset = 0
        n = (-rel).clamp(min=0)
    # clamp inside the log: n < max_exact takes the exact branch anyway, and log(0) would be -inf
    log_ratio = torch.log(n.clamp(min=max_exact).float() / max_exact) / math.log(max_distance / max_exact)
    large = (max_exact + (log_ratio * (nb - max_exact)).long()).clamp(max=nb - 1)
    return offset + torch.where(n < max_exact, n, large)


@register('t5')
class T5Bias(PositionalEncoding):
    """T5 relative attention bias (Raffel et al., arXiv 1910.10683, section 2.1):
    logit_ij += B[t5_bucket(j - i), h], one learned table B [num_buckets, n_head]
    shared by all layers (T5 computes it in the first layer and reuses it).
    Causal buckets. Defaults num_buckets=32, max_distance=128; past 128 every key
    shares the last bucket. T5 itself drops the 1/sqrt(d) scaling; here the bias is
    added to the usual scaled logit like every other scheme. Init N(0, n_embd^-0.5)
    (HF T5's initialiser). Options: num_buckets, max_distance."""

    def __init__(self, config, num_buckets=32, max_distance=128):
        super().__init__(config)
        t5_bucket(torch.zeros(1, dtype=torch.long), num_buckets, max_distance)  # validate early
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.table = nn.Parameter(torch.randn(num_buckets, config.n_head) * config.n_embd ** -0.5)

    def context(self, q_pos, k_pos, n_pos=None):
        ctx = make_context(q_pos, k_pos, n_pos)
        r = torch.arange(ctx.n_pos, device=q_pos.device)  # every distance this forward can see
        ctx.extra['bias'] = self.table[t5_bucket(-r, self.num_buckets, self.max_distance)].t()  # [H, n_pos]
        return ctx

    def score_mod(self, q, k, ctx, params):
        return distance_bias(ctx.extra['bias'], ctx)


class _ShawLayer(nn.Module):
    def __init__(self, n, head_dim):
        super().__init__()
        self.rel_k = nn.Parameter(torch.randn(n, head_dim) * 0.02)  # a^K_r, r = distance 0..k
        self.rel_v = nn.Parameter(torch.randn(n, head_dim) * 0.02)  # a^V_r


@register('shaw')
class Shaw(PositionalEncoding):
    """Relative position representations (Shaw et al., arXiv 1803.02155):
    e_ij = q_i . (k_j + aK[r]) / sqrt(d),   z_i = sum_j a_ij (v_j + aV[r]),
    r = min(i - j, k) the distance clipped at k (option max_distance, default 16;
    the paper found k >= 2 enough for translation). Learned per layer, shared by
    heads, as in the paper. The paper has 2k+1 vectors for j - i in [-k, k]; a
    causal decoder only ever sees j <= i, so only the k+1 past ones exist here.
    Key term: q.aK is precomputed for the k+1 distances ([B, H, T, k+1]) and indexed
    in score_mod. Value term: sum_j a_ij aV[r] needs only the attention weights of
    the k nearest keys (the rest share aV[k] with weight 1 - their sum), which come
    from each row's logsumexp: a_ij = exp(e_ij - lse_i) (the value_mod hook), so
    FlexAttention can run this scheme too. Those k logits are q_i.k_{i-r} on a
    sliding-window view of the keys (no copies kept for backward) plus the key term,
    read through score_mod itself. Attention dropout is not applied to the value term. In training on CUDA
    without dropout the key term comes whole (table) to SDPA's bias, and the logsumexp from its kernel
    (attention's sdpa_bias route)."""
    content_position = True

    def __init__(self, config, max_distance=16):
        super().__init__(config)
        self.k = check_whole('shaw', 'max_distance', max_distance, what=' (the clip distance k)')

    def new_layer(self):
        return _ShawLayer(self.k + 1, self.head_dim)

    def score_mod(self, q, k, ctx, params):
        with torch.autocast(q.device.type, enabled=False):  # a bias: float32 even under autocast
            qa = (q.float() @ params.rel_k.float().t()) / math.sqrt(self.head_dim)  # [B, H, Tq, k+1]: q_i.aK[r]/sqrt(d)
        kmax = self.k

        def mod(score, b, h, i, j):
            return score + qa[b, h, i, ctx.dist(i, j).clamp(max=kmax)]
        return Bias(mod, table=(lambda: self.table(q, params)) if consecutive(ctx) else None)

    def table(self, q, params):
        """The key term whole, [B, H, T, T] float32, for T queries over as many keys at consecutive positions
        (attention's sdpa_bias route): q_i . aK[min(r, k)] / sqrt(d) at each distance r by one product with aK
        gathered per distance (no gather per logit, so no scatter in the backward), laid out by query
        (attention.query_distance_table)."""
        r = torch.arange(q.size(2), device=q.device).clamp(max=self.k)
        with torch.autocast(q.device.type, enabled=False):
            a = q.float() @ params.rel_k.float()[r].t() / math.sqrt(self.head_dim)  # [B, H, T, T]: query i, distance r
        return query_distance_table(a)

    def value_mod(self, q, k, ctx, params, bias, att):
        B, H, Tq, d = q.shape
        K, off = self.k, k.size(2) - Tq  # query i is key i + off
        # the K nearest keys of every query in one sliding-window view (no copy per distance, and
        # one op rather than K for torch.compile): kp[t] = k[t - K + 1], window s of query i is
        # key i + off - (K - 1 - s), so flipping s gives the distance r = 0..K-1
        kp = F.pad(k.float(), (0, 0, K - 1, 0))
        win = kp[:, :, off:off + Tq + K - 1].unfold(2, K, 1)  # [B, H, Tq, d, K]
        raw = (q.float().unsqueeze(-1) * win).sum(-2).flip(-1) / math.sqrt(d)  # [B, H, Tq, K]
        i = torch.arange(Tq, device=q.device)[:, None]
        j = i + off - torch.arange(K, device=q.device)  # [Tq, K] the key at distance r
        b = torch.arange(B, device=q.device)[:, None, None, None]
        h = torch.arange(H, device=q.device)[None, :, None, None]
        seen = (j >= 0) & att.mask.visible(i, j, Tq, k.size(2))  # no key r back, or hidden: weight 0
        e = torch.where(seen, bias.mod(raw, b, h, i, j.clamp(min=0)), float('-inf'))

        def g(lse):
            p = (e - lse.unsqueeze(-1)).exp()  # [B, H, Tq, K] attention weights at distance 0..K-1
            p = torch.cat((p, 1 - p.sum(-1, keepdim=True)), -1)  # every farther key shares aV[K]
            return p @ params.rel_v.to(p.dtype)  # (float64 lse: tools/gpu_check.py's reference)
        return g


class _KerpleLayer(nn.Module):
    def __init__(self, n_head):
        super().__init__()
        self.p = nn.Parameter(torch.rand(n_head) * 2)  # p ~ U(0, 2), the paper's init
        self.a = nn.Parameter(torch.rand(n_head))      # a ~ U(0, 1)


class _Kerple(PositionalEncoding):
    """KERPLE (Chi et al., arXiv 2205.09921): a conditionally positive definite
    kernel of the distance r = i - j >= 0 as a logit bias, added after 1/sqrt(d).
    p_h, a_h learned per head and per layer, init p ~ U(0, 2), a ~ U(0, 1), and
    clamped in place before every use as in the paper's code: both >= 1e-2, and
    for the power kernel p <= 2 (beyond 2 the kernel is not CPD)."""
    eps, p_max = 1e-2, None

    def new_layer(self):
        return _KerpleLayer(self.n_head)

    def score_mod(self, q, k, ctx, params):
        with torch.no_grad():  # clamp the parameters themselves, so gradients still flow at the boundary
            params.p.clamp_(min=self.eps, max=self.p_max)
            params.a.clamp_(min=self.eps)
        r = torch.arange(ctx.n_pos, device=q.device).float()
        return distance_bias(-self.kernel(r[None, :], params.p[:, None], params.a[:, None]), ctx)  # [H, n_pos]


@register('kerple_log')
class KerpleLog(_Kerple):
    __doc__ = _Kerple.__doc__ + """
    Logarithmic variant: bias = -p_h * log(1 + a_h * r)."""

    @staticmethod
    def kernel(r, p, a):
        return p * torch.log1p(a * r)


@register('kerple_power')
class KerplePower(_Kerple):
    __doc__ = _Kerple.__doc__ + """
    Power variant: bias = -a_h * r^p_h, 0 < p_h <= 2."""
    p_max = 2.0

    @staticmethod
    def kernel(r, p, a):
        # r^p as max(r,1)^p masked at r = 0: same value, and no 0 * log(0) in d/dp
        return a * r.clamp(min=1) ** p * (r > 0)


class _FireLayer(nn.Module):
    def __init__(self, n_head, width, init_c, init_L):
        super().__init__()
        self.fc1 = nn.Linear(1, width)
        self.fc2 = nn.Linear(width, n_head)
        self.c = nn.Parameter(torch.tensor(float(init_c)))  # log-transform sharpness
        self.L_mult = nn.Parameter(torch.tensor(1.0))  # learned threshold = |L_mult * init_L|
        self.register_buffer('init_L', torch.tensor(float(init_L)), persistent=False)


@register('fire')
class FIRE(PositionalEncoding):
    """FIRE, functional interpolation for relative positions (Li et al., arXiv 2310.04418):
    bias_h(i, j) = f_h( psi(i - j) / psi(max(i, L_thr)) ),  psi(x) = log(c x + 1),
    f: an MLP 1 -> width -> n_head with ReLU (width 32), c learned (init 0.1),
    L_thr = |m * L0| learned through m (init 1, L0 = 512): distances are normalised by
    the query position ("progressive interpolation") but never by less than L_thr,
    so the MLP input stays in [0, 1] at any length. psi of the normaliser gets +1e-6.
    One FIRE module per layer, as in the paper's default. The bias depends on the
    query position as well as the distance, so it cannot be tabulated per distance:
    without gradients (evaluation at any length) score_mod sums `width` scalar ReLU
    units, marked `tabulate`: the dense path evaluates it as a table per chunk of
    queries (also on CUDA, where FlexAttention would unroll the 32 units into every
    logit; attn_backend='flex' still does, in O(T) memory; on CUDA the table comes from
    `grid`, the hidden units of every pair and one product); with gradients it is
    tabulated as [H, Tq, Tk] once per layer, all units in one expression (the
    paper's dense bias; the unit loop there took torch.compile 3x longer), because
    FlexAttention's backward can only scatter a score's gradient into a tensor it indexes once;
    on CUDA that table goes whole into SDPA's memory-efficient kernel (attention's sdpa_bias).
    Note: with the default L0 = 512 and a training length below 512, training
    never reaches the interpolating regime; set init_L (e.g. block_size / 4 as
    the paper's 512 / 2048) to study it. Options: width, init_c, init_L."""

    def __init__(self, config, width=32, init_c=0.1, init_L=512.0):
        super().__init__(config)
        self.width, self.init_c, self.init_L = int(width), init_c, init_L

    def new_layer(self):
        return _FireLayer(self.n_head, self.width, self.init_c, self.init_L)

    @staticmethod
    def normalised(params, qp, r):
        """The MLP's input psi(r) / psi(max(qp, L_thr)) for query positions qp and distances r."""
        c, thr = params.c, (params.L_mult * params.init_L).abs()
        rel = torch.log(torch.abs(c * r.float()) + 1)
        return rel / (torch.log(torch.abs(c * torch.maximum(qp.float(), thr)) + 1) + 1e-6)

    def grid(self, params, ctx, i, j):
        """The bias of query rows i [Tq] and keys j [Tk] as one table [H, Tq, Tk]: every pair's hidden units, then
        the output layer as one product (attention.dense_bias's `tabulate` on CUDA)."""
        x = self.normalised(params, ctx.q_pos[i][:, None], ctx.dist(i[:, None], j))  # [Tq, Tk]
        hidden = torch.relu(x[..., None] * params.fc1.weight[:, 0] + params.fc1.bias)  # [Tq, Tk, width]
        return (hidden @ params.fc2.weight.t() + params.fc2.bias).permute(2, 0, 1)

    def score_mod(self, q, k, ctx, params):
        w1, b1, w2, b2 = params.fc1.weight[:, 0], params.fc1.bias, params.fc2.weight, params.fc2.bias
        if not torch.is_grad_enabled():
            def mod(score, b, h, i, j):
                x = self.normalised(params, ctx.q_pos[i], ctx.dist(i, j))
                for u in range(w1.size(0)):  # the MLP on a scalar, one hidden unit at a time
                    score = score + w2[h, u] * torch.relu(w1[u] * x + b1[u])
                return score + b2[h]
            # 32 units a logit: a table per chunk of queries, not a FlexAttention kernel (on CUDA by one product)
            return Bias(mod, grid=lambda i, j: self.grid(params, ctx, i, j))
        i, j = torch.arange(q.size(2), device=q.device)[:, None], torch.arange(k.size(2), device=q.device)
        x = self.normalised(params, ctx.q_pos[i], ctx.dist(i, j))  # [Tq, Tk]
        hidden = torch.relu(x[..., None, None] * w1 + b1)  # [Tq, Tk, 1, width]
        table = ((hidden * w2).sum(-1) + b2).permute(2, 0, 1)  # [H, Tq, Tk]

        def mod(score, b, h, i, j):
            return score + table[h, i, j]
        # also whole where there are as many queries as keys: the mod at every logit, indexed as the other paths
        # read it (torch 2.11's CPU Inductor crashed compiling the backward of `table` handed as it is)
        whole = (lambda: mod(0.0, 0, torch.arange(table.size(0), device=q.device)[:, None, None], i, j)) \
            if q.size(2) == k.size(2) else None
        return Bias(mod, table=whole, reads_table=True)  # (a table read at each logit: FlexAttention's small tiles)


@register('sandwich')
class Sandwich(PositionalEncoding):
    """Sandwich (Chi et al., arXiv 2212.10356): the inner product of sinusoidal
    position embeddings as a parameter-free logit bias,
    bias_h(i, j) = (sum_{k=1}^{d/2} cos((i - j) * 10000^(-2k/d)) - d/2) / (8h/H),
    h = 1..H, d = n_embd by default (option dim). It is 0 at distance 0 and <= 0
    elsewhere; the 8h/H divisor mirrors ALiBi's head slopes. Since the bias depends
    only on the distance, context() tabulates it once per forward for distances
    0..n_pos-1 (O(T) memory) and score_mod indexes the table."""

    def __init__(self, config, dim=None):
        super().__init__(config)
        self.dim = check_whole('sandwich', 'dim', dim or config.n_embd, even=True)
        k = torch.arange(1, self.dim // 2 + 1, dtype=torch.float64)
        self.register_buffer('inv_freq', 10000.0 ** (-2 * k / self.dim), persistent=False)
        h = torch.arange(1, config.n_head + 1, dtype=torch.float32)
        self.register_buffer('head_div', 8 * h / config.n_head, persistent=False)

    def context(self, q_pos, k_pos, n_pos=None):
        ctx = make_context(q_pos, k_pos, n_pos)
        r = torch.arange(ctx.n_pos, device=k_pos.device, dtype=torch.float64)
        table = torch.cos(r[:, None] * self.inv_freq[None, :]).sum(-1) - self.dim / 2  # float64: sums of d/2 cosines
        ctx.extra['table'] = table.float()
        return ctx

    def score_mod(self, q, k, ctx, params):
        return distance_bias(ctx.extra['table'][None, :] / self.head_div[:, None], ctx)  # [H, n_pos]


def deberta_log_bucket(rel, bucket_size, max_position):
    """DeBERTa-v2/v3's log-bucketed relative position (He et al., arXiv 2006.03654; the
    authors' make_log_bucket_position): rel clamped to +-(max_position - 1); with
    mid = bucket_size // 2, |rel| <= mid is kept exactly, larger distances become
    sign(rel) * (mid + ceil(log(|rel|/mid) / log((max_position - 1)/mid) * (mid - 1))),
    so |rel| = max_position - 1 lands on 2 * mid - 1: bucket_size - 1 for an even bucket_size,
    bucket_size - 2 for an odd one. Odd in rel. float64 logs."""
    mid = bucket_size // 2
    rel = torch.as_tensor(rel).long().clamp(-(max_position - 1), max_position - 1)
    a = rel.abs()
    log_pos = torch.ceil(torch.log(a.clamp(min=mid).double() / mid) / math.log((max_position - 1) / mid)
                         * (mid - 1)).long() + mid
    return torch.where(a <= mid, rel, log_pos * rel.sign())


class _DebertaLayer(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.pos_k = nn.Linear(n_embd, n_embd, bias=False)  # W_{k,r}: K^r = P W_{k,r}
        self.pos_q = nn.Linear(n_embd, n_embd, bias=False)  # W_{q,r}: Q^r = P W_{q,r}
        nn.init.normal_(self.pos_k.weight, std=0.02)
        nn.init.normal_(self.pos_q.weight, std=0.02)


@register('deberta')
class DeBERTa(PositionalEncoding):
    """Disentangled attention of DeBERTa (He et al., arXiv 2006.03654, eq. 4), causal:
        z_ij = (Q_i . K_j + Q_i . K^r_{d(i,j)} + K_j . Q^r_{d(j,i)}) / sqrt(3d)
    content-to-content, content-to-position (c2p) and position-to-content (p2c), with
    K^r = P W_{k,r}, Q^r = P W_{q,r} per layer and the relative embeddings P
    [2k, n_embd] shared by all layers, d(i, j) = k + bucket(i - j) clamped to [0, 2k)
    (k = position_buckets; bucket = deberta_log_bucket, the v2/v3 log buckets).
    The paper's attention is bidirectional; this is the causal restriction of the same
    score: keys j <= i only, so c2p reads P's rows k.. (i - j >= 0) and p2c its rows
    ..k (d(j, i) = k - bucket(i - j)). Row 0 is never read by a causal model (it would
    take bucket(i - j) = k, past the largest bucket 2 * (k // 2) - 1); with an odd k, rows 1
    and 2k - 1 are never read either. The authors' code
    (and HF's) effectively indexes p2c with d(i, j) like c2p (microsoft/DeBERTa issue
    #162); this follows the paper's d(j, i). No absolute position embedding, no biases
    on the position projections (eq. 4), init N(0, 0.02) (DeBERTa's initializer_range).
    Defaults scale DeBERTa-v3's 256 buckets / 512 relative positions at training length
    512 to block_size L: position_buckets = L // 2 (distances up to L/4 exact),
    max_relative_positions = L (beyond L - 1 every key shares the last bucket).
    Realisation: transform_qk divides q by sqrt(3), so the usual q.k / sqrt(d) is the
    content term over sqrt(3d); score_mod adds the two position terms from tables
    Q_i . K^r_m / sqrt(3d) [B, H, Tq, 2k] and K_j . Q^r_m / sqrt(3d) [B, H, Tk, 2k] (float32,
    each indexed once) through bucket indices tabulated per distance in context(). In training on CUDA both
    terms come whole (table: two products per distance, laid out by query and key) to SDPA's bias (sdpa_bias).
    Options: position_buckets, max_relative_positions."""
    content_position = True

    def __init__(self, config, position_buckets=None, max_relative_positions=None):
        super().__init__(config)
        self.buckets = int(position_buckets or max(2, config.block_size // 2))
        self.max_rel = int(max_relative_positions or config.block_size)
        if self.buckets < 2 or self.max_rel - 1 <= self.buckets // 2:
            raise ValueError(f"deberta needs position_buckets >= 2 and max_relative_positions - 1 > "
                             f"position_buckets // 2 (the last exact distance), got position_buckets={self.buckets}, "
                             f"max_relative_positions={self.max_rel}")
        self.rel_emb = nn.Parameter(torch.randn(2 * self.buckets, config.n_embd) * 0.02)  # P

    def new_layer(self):
        return _DebertaLayer(self.n_embd)

    def context(self, q_pos, k_pos, n_pos=None):
        ctx = make_context(q_pos, k_pos, n_pos)
        b = deberta_log_bucket(torch.arange(ctx.n_pos, device=q_pos.device), self.buckets, self.max_rel)
        top = 2 * self.buckets - 1
        ctx.extra.update(c2p=(self.buckets + b).clamp(0, top), p2c=(self.buckets - b).clamp(0, top))
        return ctx

    def transform_qk(self, q, k, ctx, params):
        return q / math.sqrt(3.0), k

    def score_mod(self, q, k, ctx, params):
        H, d = self.n_head, self.head_dim
        with torch.autocast(q.device.type, enabled=False):  # biases stay float32
            P = self.rel_emb.float()
            k_r = (P @ params.pos_k.weight.float().t()).view(-1, H, d).transpose(0, 1)  # [H, 2k, d]
            q_r = (P @ params.pos_q.weight.float().t()).view(-1, H, d).transpose(0, 1)
            c2p = q.float() @ k_r.transpose(-1, -2) / math.sqrt(d)  # q was divided by sqrt(3): / sqrt(3d)
            p2c = k.float() @ q_r.transpose(-1, -2) / math.sqrt(3 * d)
        ci, pi = ctx.extra['c2p'], ctx.extra['p2c']

        def mod(score, b, h, i, j):
            r = ctx.dist(i, j)
            return score + c2p[b, h, i, ci[r]] + p2c[b, h, j, pi[r]]
        whole = (lambda: self.table(q, k, k_r, q_r, ci, pi)) if consecutive(ctx) else None
        return Bias(mod, table=whole, reads_table=True)  # (two tables read at every logit: FlexAttention's small tiles)

    def table(self, q, k, k_r, q_r, ci, pi):
        """Both position terms whole, [B, H, T, T] float32, for T queries over as many keys at consecutive
        positions (attention's sdpa_bias route): c2p and p2c at each distance by two products with the position
        projections gathered per distance (O(T) rows: no gather per logit, so no scatter in the backward), then
        laid out by query and key (attention.query_distance_table, key_distance_table)."""
        T, d = q.size(2), self.head_dim
        r = torch.arange(T, device=q.device)
        with torch.autocast(q.device.type, enabled=False):
            c2p = q.float() @ k_r[:, ci[r]].transpose(-1, -2) / math.sqrt(d)  # [B, H, T, T]: query i at distance r
            p2c = k.float() @ q_r[:, pi[r]].transpose(-1, -2) / math.sqrt(3 * d)  # key j at distance r
        return query_distance_table(c2p) + key_distance_table(p2c)


class _GrapeALayer(nn.Module):
    def __init__(self, n_head, head_dim, omega_init, query, key):
        super().__init__()
        self.omega = nn.Parameter(torch.full((n_head,), _softplus_inverse(max(omega_init, 1e-8))))
        if key:  # u_h: the key gate's direction, N(0, 1/d) (the authors keep it out of their model-wide init)
            self.u = nn.Parameter(torch.randn(n_head, head_dim) / math.sqrt(head_dim))
        if query:  # v_h: the query gate's
            self.v = nn.Parameter(torch.randn(n_head, head_dim) / math.sqrt(head_dim))


class _GrapeABase(PositionalEncoding):
    """Options and checks shared by grape_a's gated forms (GrapeA) and its path-integral form (GrapeAP)."""
    VARIANTS = ('query_key', 'key', 'query', 'path')
    name = 'grape_a'

    def __init__(self, config, variant='query_key', omega_init=1.0, p_head_dim=8):
        super().__init__(config)
        self.form = check_choice('grape_a', 'variant', variant, self.VARIANTS)
        self.omega_init = check_number('grape_a', 'omega_init', omega_init, inclusive=True,
                                       what=' (the initial softplus(omega_h), a slope multiplier)')
        self.p_head_dim = check_whole('grape_a', 'p_head_dim', p_head_dim, lo=2, even=True,
                                      what=" (the path probes' dims per head)")
        self.register_buffer('slopes', alibi_slopes(config.n_head), persistent=False)


@register('grape_a')
class GrapeA(_GrapeABase):
    """Additive GRAPE, GRAPE-A (Zhang et al., arXiv 2512.07805, ICLR 2026, section 4; code model-architectures/GRAPE,
    model/llama-mha-grape-a-{querykeygated,keygated,querygated}.py): a unipotent action in GL(d+2) whose score is
    q_i . k_j plus a content-gated linear bias. As the authors' code, added to the scaled logit:
        b_ij = -(i - j) * softplus(omega_h) * m_h * gate_ij
        query_key (default; GRAPE-A-QK, eq. 4.6): gate = softplus(v^_h . q_i / sqrt(d)) + softplus(u^_h . k_j / sqrt(d))
        key:                                      gate = softplus(u^_h . k_j / sqrt(d))
        query:                                    gate = softplus(v^_h . q_i / sqrt(d))
    u^ = u / max(|u|, 1e-6) (likewise v), q and k as the attention has them (after qk_norm when set; the authors'
    layers always apply QK-RMSNorm first), m_h the ALiBi slopes (alibi_slopes; the paper's eq. 4.6 has one omega
    and no slopes: the code multiplies by both), omega_h per head and layer with softplus(omega_h) = omega_init
    = 1 at init, u, v ~ N(0, 1/d) per head and layer. Gates are >= 0, so the bias never rewards distance.
    Equalities (tested): with neutral gates (u^ . k = 0, so the key gate is softplus(0) = ln 2) the key- and
    query-gated forms are ALiBi when softplus(omega_h) = 1/ln 2, and the query_key form when softplus(omega_h)
    = 1/(2 ln 2); at init (softplus(omega) = 1) a neutral gate gives ALiBi's slopes times ln 2 (2 ln 2).
    variant='path' is GRAPE-AP (GrapeAP), whose edges can be FoX's gates. Options (defaults in parentheses):
    variant ('query_key'), omega_init (1.0), p_head_dim (8, GRAPE-AP only). Runs as a score_mod: the gates are
    tabulated per query and per key and the distance comes from the positions, so FlexAttention, windows and
    every cache work unchanged. The mod also hands the bias as factors (attention's qk_lift route) and, in
    training, whole (sdpa_bias): through qk_lift a gate's gradient is a small difference of two sums of the size
    of the positions, which SDPA's backward returns in bfloat16 (tested: parameter gradients off by 10-70% at
    T = 1024), so bfloat16 training takes the table."""

    @classmethod
    def variant(cls, config, options):
        """variant='path' builds GrapeAP."""
        return GrapeAP if options.get('variant') == 'path' else cls

    def new_layer(self):
        return _GrapeALayer(self.n_head, self.head_dim, self.omega_init,
                            query=self.form != 'key', key=self.form != 'query')

    @staticmethod
    def gate(t, w):
        """softplus(w^_h . t / sqrt(d)) for t [B, H, T, d] and directions w [H, d] -> [B, H, T], float32."""
        w = F.normalize(w.float(), dim=-1, eps=1e-6)
        return F.softplus(torch.einsum('bhtd,hd->bht', t.float(), w) / math.sqrt(t.size(-1)))

    def score_mod(self, q, k, ctx, params):
        with torch.autocast(q.device.type, enabled=False):  # a bias: float32
            rate = F.softplus(params.omega.float()) * self.slopes  # [H]: softplus(omega_h) m_h
            gq = self.gate(q, params.v) if self.form != 'key' else None  # [B, H, Tq]
            gk = self.gate(k, params.u) if self.form != 'query' else None  # [B, H, Tk]
        if gq is None:
            def mod(score, b, h, i, j):
                return score - rate[h] * ctx.dist(i, j) * gk[b, h, j]
        elif gk is None:
            def mod(score, b, h, i, j):
                return score - rate[h] * ctx.dist(i, j) * gq[b, h, i]
        else:
            def mod(score, b, h, i, j):
                return score - rate[h] * ctx.dist(i, j) * (gq[b, h, i] + gk[b, h, j])
        return Bias(mod, factors=lambda: self.factors(rate, ctx.q_pos.float(), ctx.k_pos.float(), gq, gk),
                    table=(lambda: self.table(rate, ctx, gq, gk)) if consecutive(ctx) else None)

    @staticmethod
    def table(rate, ctx, gq, gk):
        """The bias whole, -rate_h dist(i, j) (gq_i + gk_j) -> [B, H, Tq, Tk], float32 (attention's sdpa_bias route)."""
        i, j = (torch.arange(p.numel(), device=p.device) for p in (ctx.q_pos, ctx.k_pos))
        gate = (gq[..., None] if gq is not None else 0) + (gk[..., None, :] if gk is not None else 0)
        return -rate.view(-1, 1, 1) * ctx.dist(i[:, None], j).float() * gate

    @staticmethod
    def factors(rate, qp, kp, gq, gk):
        """The bias as sum_r fq_ir fk_jr plus a term of the query alone (attention's qk_lift route), from
        -rate (qp_i - kp_j)(gq_i + gk_j), gq or gk absent in the one-sided forms:
            key gate:    -rate qp_i gk_j + rate kp_j gk_j
            query gate:  rate gq_i kp_j                      (and -rate qp_i gq_i, the query's alone)
        the query_key form their sum. -> (fq [B|1, H, Tq, r], fk [B|1, H, Tk, r]), float32."""
        rate = rate.view(1, -1, 1)
        fq, fk = [], []
        if gk is not None:
            fq += [-rate * qp.view(1, 1, -1), rate.expand(1, -1, qp.numel())]
            fk += [gk, kp.view(1, 1, -1) * gk]
        if gq is not None:
            fq.append(rate * gq)
            fk.append(kp.view(1, 1, -1).expand(1, rate.size(1), -1))
        B = max(t.size(0) for t in fq + fk)  # (the gates' batch; positions and rates are one row)
        return tuple(torch.stack([t.expand(B, *t.shape[1:]) for t in f], -1) for f in (fq, fk))


class _GrapeAPLayer(nn.Module):
    def __init__(self, n_embd, n_head, p_head_dim):
        super().__init__()
        self.probe = nn.Linear(n_embd, n_head * p_head_dim, bias=False)  # p_t = W_p x_t, per head
        nn.init.normal_(self.probe.weight, std=0.5 / math.sqrt(n_embd))  # the authors' model-wide init


class GrapeAP(_GrapeABase):
    """grape_a with variant='path': Path-Integral Additive GRAPE, GRAPE-AP (arXiv 2512.07805, section 5; code
    model-architectures/GRAPE, model/llama-mha-grape-ap-v1.py). Per head h, probes p_t = W_p x_t (p_head_dim = 8
    dims per head, the authors' training config; x the layer input) and, as the code:
        psi_h(t, l) = m_h * log sigmoid( p_t . R_l p^_l / p_head_dim ),    p^ = rms_norm(p) (no weight)
        b_h(t, j)   = sum_{l = j+1..t} psi_h(t, l)                          added to the scaled logit
    R_l turns every plane of the probe by l radians (RoPE with base 1), in the authors' direction (-l, as their
    GRAPE-M); m_h the ALiBi slopes, fixed. Where paper and code differ this follows the code: the paper's
    eq. 5.1 normalises both probes and turns by exp(l J) (+l), with a per-head alpha_h; the code normalises only
    the key-side probe p^_l, turns by -l, and uses the ALiBi slopes for alpha_h. W_p ~ N(0, 0.5/sqrt(n_embd)).
    With edges that do not depend on the endpoint t, psi_h(t, l) = log f_l, b is FoX's sum_{l=j+1..t} log f_l
    (the paper's appendix C): the path sum is tested to equal `fox` there. With W_p = 0 every edge is
    m_h log(1/2), i.e. ALiBi with slopes m_h ln 2 (tested).
    Runs through `attention` as CoPE does: psi and b are dense [B, H, Tq, Tk] float32 tables (query chunks
    without gradients), then a score_mod indexes b once, so FlexAttention can run it. The key-side probes
    p^_l are kept per key in cache.state and turned by the keys' positions every forward (by place in a
    rolling cache); keys the layer's mask hides get no edge."""

    def new_layer(self):
        return _GrapeAPLayer(self.n_embd, self.n_head, self.p_head_dim)

    def edges(self, p_q, p_k):
        """psi_h(t, l) = m_h log sigmoid(p_t . R_l p^_l / p_head_dim) [B, H, Tq, Tk] from the queries' probes p_t
        [B, H, Tq, pd] and the keys' turned probes R_l p^_l [B, H, Tk, pd], float32."""
        return self.slopes[:, None, None] * F.logsigmoid(p_q @ p_k.transpose(-1, -2) / self.p_head_dim)

    def attention(self, q, k, v, x, ctx, params, cache, att):
        B, Tq, _ = x.shape
        pd = self.p_head_dim
        with torch.autocast(x.device.type, enabled=False):
            p = params.probe(x.float()).view(B, Tq, self.n_head, pd).transpose(1, 2)  # [B, H, Tq, pd]: p_t
            pn = F.rms_norm(p, (pd,))  # p^: the key side's probes
            if cache is not None:
                if 'grape_probe' in cache.state:
                    pn = torch.cat((cache.state['grape_probe'], pn), 2)
                cache.state['grape_probe'] = pn
            cos, sin = cos_sin(angles(ctx.k_pos[-pn.size(2):], pn.new_ones(pd // 2)))  # every plane at l radians
            pk = apply_rotary(pn, cos, -sin)  # R_l p^_l, the authors' direction

        def run(q1, k1, v1, a):  # query rows a.row0.. and the keys a.key0.. they can see
            Tq1, Tk1 = q1.size(2), k1.size(2)
            with torch.autocast(x.device.type, enabled=False):
                psi = self.edges(p[:, :, a.row0:a.row0 + Tq1], pk[:, :, a.key0:a.key0 + Tk1])
                psi = psi.masked_fill(~a.visibility(Tq1, Tk1, x.device), 0.0)
                after = psi.flip(-1).cumsum(-1).flip(-1)  # sum_{l >= j}
                bias = F.pad(after[..., 1:], (0, 1))  # sum_{l > j} psi(t, l); psi is 0 past the query
            return a(q1, k1, v1, bias)
        return att.rows(run, q, k, v)


class _CableLayer(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.bias_proj = nn.Linear(n_embd, n_head)  # row h: w_h, bias: c_h; the authors' nanoGPT init
        nn.init.normal_(self.bias_proj.weight, std=0.02)
        nn.init.zeros_(self.bias_proj.bias)


@register('cable')
class CABLE(PositionalEncoding):
    """Context-Aware Biases for Length Extrapolation, CABLE (Veisi, Amirzadeh, Mansourian, arXiv 2503.08067; code
    axiomlab/Cable, src/Cable.py at 8bc6b83, the nanoGPT model its README trains): ALiBi's fixed slope times the
    distance replaced by learned per-token, per-head steps, accumulated along the sequence. For layer input x_t
    (the attention's normalised input, which q, k, v are projected from), per head h:
        b_t   = -sum_{l <= t} softplus(w_h . x_l + c_h)           (the code's cumsum(-softplus(h_attn(x))))
        logit_ij = s q_i . k_j + b_i - b_j = s q_i . k_j - sum_{l = j+1..i} softplus(w_h . x_l + c_h)
    the bias added after the scale s, unscaled. w_h, c_h: one Linear(n_embd, n_head) per layer with the authors'
    init, weight N(0, 0.02), bias 0, so every step is about -ln 2 at init: ALiBi with slope ln 2 in every head.
    Steps that do not depend on x (w = 0, softplus(c_h) = m_h) give ALiBi exactly (tested). Since log sigmoid(z) =
    -softplus(-z), CABLE with (w, c) is FoX (arXiv 2503.02130) with (-w, -c) (tested): the same model, the gate's
    sign flipped, here as a score_mod rather than an attention of its own.
    The scale s where code and paper differ: the code's src/Cable.py computes q k^T / sqrt(C / n_embd)^2 with
    C = n_embd, i.e. unscaled logits (s = 1), and its first release (Cable.py at 087c3a1) 1/sqrt(n_embd); the paper's
    method section could not be read here. Option qk_scale picks it: 'none' (default: s = 1, the code, which this
    repo follows where code and paper may differ), 'head' (1/sqrt(head_dim), nanoPE's attention for every other
    scheme, so that CABLE differs from them in its positions only), 'embd' (1/sqrt(n_embd), the first release),
    applied as a gain on q in transform_qk. Not here: the
    authors' later code (src/model_gpt.py, 'cable6', "biases and weights"), which the stored snapshot lacks.
    The steps need x: made in layer_context, once per layer and forward; the KV cache keeps each key's step in
    cache.state and sums the kept ones again every forward (as FoX), so windows, chunks and a rolling attention-sink
    cache work unchanged. The bias comes in every form it has: the mod, factors (-b_j against 1, b_i the query's
    alone: qk_lift) and, in training, the table b_i - b_j (sdpa_bias). Options (defaults in parentheses):
    qk_scale ('none')."""
    QK_SCALES = ('head', 'none', 'embd')

    def __init__(self, config, qk_scale='none'):
        super().__init__(config)
        self.qk_scale = check_choice('cable', 'qk_scale', qk_scale, self.QK_SCALES)
        self.q_gain = {'head': 1.0, 'none': math.sqrt(self.head_dim),
                       'embd': math.sqrt(self.head_dim / self.n_embd)}[qk_scale]

    def new_layer(self):
        return _CableLayer(self.n_embd, self.n_head)

    def layer_context(self, x, ctx, params, cache):
        T = x.size(1)
        with torch.autocast(x.device.type, enabled=False):  # the bias stays float32 (float64 for a reference)
            step = -F.softplus(params.bias_proj(wide(x))).transpose(1, 2)  # [B, H, T]: each token's step
            if cache is not None:
                if 'cable_step' in cache.state:
                    step = torch.cat((cache.state['cable_step'], step), 2)  # [B, H, Tk]: every kept key's step
                cache.state['cable_step'] = step
            b = cumsum_tokens(step[..., None])[..., 0]  # b_j = sum_{l <= j} step_l over the kept keys
        return _layer_context(ctx, cable_b=b, cable_bq=b[..., b.size(-1) - T:])

    def transform_qk(self, q, k, ctx, params):
        return (q if self.q_gain == 1.0 else q * self.q_gain), k

    def score_mod(self, q, k, ctx, params):
        b, b_q = ctx.extra['cable_b'], ctx.extra['cable_bq']

        def mod(score, bb, h, i, j):
            return score + (b_q[bb, h, i] - b[bb, h, j])
        return Bias(mod, factors=lambda: (b.new_ones(1, 1, 1, 1), -b[..., None]),  # -b_j; b_i of the query alone
                    table=(lambda: b_q[..., :, None] - b[..., None, :]) if consecutive(ctx) else None)


# --- data-dependent: angles from the layer input (`layer_context`), then rotated as RoPE


def _layer_context(ctx, **extra):
    """A copy of the shared ctx with this layer's tables added to its extra (the shared one is left alone)."""
    return Context(ctx.q_pos, ctx.k_pos, dict(ctx.extra, **extra), ctx.n_pos, ctx.consecutive, ctx.stream)


def _running_sum(inc, cache, name):
    """Inclusive prefix sums over the tokens of per-token increments inc [B, G, Tq, n] of this forward's tokens,
    continued across a KV cache -> (sums at the queries, sums at the keys transform_qk sees, the increments at
    those keys), float32. An ordinary cache keeps the running sum in cache.carry (its keys are cached transformed,
    each at the sum it had); a rolling cache (raw keys, re-indexed by place every forward) keeps the increments
    per key in cache.state and sums the kept ones again, so positions are places in the cache."""
    if cache is None:
        s = cumsum_tokens(inc)
        return s, s, inc
    if cache.mode != 'raw':
        s = cumsum_tokens(inc)
        if name in cache.carry:
            s = s + cache.carry[name]
        cache.carry[name] = s[:, :, -1:]
        return s, s, inc
    T = inc.size(2)
    if name in cache.state:
        inc = torch.cat((cache.state[name], inc), 2)
    cache.state[name] = inc
    s = cumsum_tokens(inc)
    return s[:, :, s.size(2) - T:], s, inc


class _GrapeMContextualLayer(_GrapeMLayer):
    def __init__(self, log_freq, learnable, n_embd, n_out, init_omega):
        super().__init__(log_freq, learnable)
        self.omega = nn.Linear(n_embd, n_out)  # omega_t = sigmoid((w . x_t + b) / omega_scale)
        nn.init.zeros_(self.omega.weight)
        nn.init.constant_(self.omega.bias, _softplus_inverse(init_omega))


class GrapeMContextual(GrapeM):
    """grape_m with contextual=True (see GrapeM): one phase increment omega_t per token from the layer input x,
    Phi_t = sum_{tau < t} omega_tau, plane i turned by -Phi_t f_i (the authors' direction). The phases need x,
    so they are made in layer_context, once per layer and forward; the KV cache keeps keys transformed and the
    running sum in cache.carry (a rolling cache: omega per key in cache.state, summed again by place)."""
    name = 'grape_m'

    def new_layer(self):
        log = self.inv_freq.log() * self.scale
        return _GrapeMContextualLayer(log.repeat(self.n_head, 1) if self.per_head else log, self.learnable,
                                      self.n_embd, self.n_head if self.ctx_per_head else 1, self.init_omega)

    def layer_context(self, x, ctx, params, cache):
        with torch.autocast(x.device.type, enabled=False):
            omega = torch.sigmoid(params.omega(x.float()) / self.omega_scale)
            omega = omega.transpose(1, 2)[..., None]  # [B, G, Tq, 1]
            s_q, s_k, inc_k = _running_sum(omega, cache, 'grape_omega')
            f = self.freq(params)
            q_tab = self.tables((s_q - omega)[..., 0], f)  # exclusive: Phi_t = sum_{tau < t} omega_tau
            k_tab = q_tab if s_k is s_q else self.tables((s_k - inc_k)[..., 0], f)
        return _layer_context(ctx, grape_q=q_tab, grape_k=k_tab)

    def transform_qk(self, q, k, ctx, params):
        cos, sin = ctx.extra['grape_q']
        kcos, ksin = ctx.extra['grape_k']
        return apply_rotary(q, cos, -sin), apply_rotary(k, kcos, -ksin)


class _SelectiveLayer(nn.Module):
    def __init__(self, n_embd, n_head, P, rank, d_conv, temperature, temp_learnable, phase_gate, bias, forget_gate):
        super().__init__()
        self.down = nn.Linear(n_embd, rank, bias=False)  # the low-rank projection of x^: n_embd -> rank -> H * P
        self.up = nn.Linear(rank, n_head * P, bias=False)
        self.conv = nn.Parameter(torch.empty(n_head * P, d_conv))  # a causal depthwise convolution, no bias
        for w in (self.down.weight, self.up.weight, self.conv):  # the authors' model init: N(0, 0.02)
            nn.init.normal_(w, std=0.02)
        if temp_learnable:
            self.temperature = nn.Parameter(temperature)
        else:
            self.register_buffer('temperature', temperature, persistent=False)
        if phase_gate:  # sigmoid(W x^ + b), one per head; bias 0
            self.gate = nn.Linear(n_embd, n_head)
            nn.init.normal_(self.gate.weight, std=0.02)
            nn.init.zeros_(self.gate.bias)
        if bias:  # phi + exp(phi_bias)
            self.phi_bias = nn.Parameter(torch.zeros(n_head, P))
        if forget_gate:  # FoX's gate: log sigmoid(w_h . x_t + b_h)
            self.fgate = nn.Linear(n_embd, n_head)
            nn.init.normal_(self.fgate.weight, std=0.02)
            nn.init.zeros_(self.fgate.bias)


@register('selective_rope')
class SelectiveRoPE(PositionalEncoding):
    """Selective RoPE (Movahedi, Carstensen et al., arXiv 2511.17388, ICLR 2026; code timurcarstensen/selective-rope,
    src/selective_rope/modules/rotary.py, SelectiveRoPE; settings of configs/language_modeling/model/
    position_embedding/selective_rope.yaml): RoPE whose angles are a prefix sum of input-dependent frequencies.
    For token t with layer input x_t (the attention's normalised input, which q, k, v are projected from), per
    head h and plane c (half-split, c < d/2):
        x^_t   = x_t split into H chunks of n_embd/H, each divided by sqrt(|chunk|^2 + 1e-6)   (fla's l2_norm)
        u_t    = W_up W_down x^_t                 rank 32, no biases: [H * d/2]
        phi_t  = sum_{k<K} w_k u_{t-K+1+k}         causal depthwise convolution, width K = 4, no bias, the last
                                                  tap on the current token, zeros before the first
        phi_t <- phi_t + exp(beta)                 option bias (beta per head and plane, 0 at init)
        phi_t <- phi_t * sigmoid(g . x^_t + b_g)   option phase_gate (one gate per head)
        Theta_t = tau * sum_{s<=t} phi_s           inclusive prefix sum, float32
        q_t, k_t turned by Theta_t like `rope`: (x1, x2) -> (x1 cos - x2 sin, x1 sin + x2 cos) (HF's direction)
    tau_c = temp_max / temp_theta^(2c/d), temp_theta = 500000, temp_max = 1, not learned (the LM config).
    phi == 1 (e.g. bias=True with W_up = 0) turns token t by tau (t + 1): `rope` with base temp_theta at
    positions shifted by one, the same logits (tested). Init as the authors' model: every weight N(0, 0.02),
    biases 0, so the angles start near 0. The LM config has no phase gate and no bias (both off here too).
    Option forget_gate=True adds a forget gate, logit_ij += sum_{l=j+1..i} log f_l with f_l = sigmoid(w_h . x_l
    + b_h) (FoX, arXiv 2503.02130, nanoPE's `fox`, bias 0): the paper pairs Selective RoPE with FoX's gate for
    softmax attention; the authors' public code has no such softmax layer, so the gate is FoX's own.
    Not here: the code's full-rank and 'gla'/'low-rank' gate parametrisations, skip_conv, and its Triton kernels.
    The angles need x: they are made in layer_context, once per layer and forward. KV cache: each key's angle is
    fixed once made, so keys are cached transformed; cache.carry keeps the running sum sum_{s<=t} phi_s and the
    convolution's last K - 1 inputs (a window or chunk may drop every key, not the convolution's past). A rolling
    cache (attention sinks) numbers keys by place: u (and the gates) are kept per key in cache.state and the
    convolution and sums run again over the kept keys. The forget gate's log f is kept per key (as FoX).
    Because phi_l reads x_{l-K+1..l}, a query's logits also read the K - 2 tokens before its first visible
    key in a window or chunk (x_lookback), as in the authors' layer with a window.
    Options (defaults in parentheses): rank (32), d_conv (4), temp_theta (500000), temp_max (1.0), temp_learnable
    (False), phase_gate (False), bias (False), forget_gate (False)."""

    def __init__(self, config, rank=32, d_conv=4, temp_theta=500000.0, temp_max=1.0, temp_learnable=False,
                 phase_gate=False, bias=False, forget_gate=False):
        super().__init__(config)
        if self.head_dim % 2:
            raise ValueError(f"selective_rope rotates planes of 2 dims: head_dim must be even, got {self.head_dim}; "
                             f"change n_embd/n_head")
        self.rank, self.d_conv = (check_whole('selective_rope', name, v) for name, v in (('rank', rank),
                                                                                           ('d_conv', d_conv)))
        self.temp_theta, self.temp_max = check_number('selective_rope', 'temp_theta', temp_theta), \
            check_number('selective_rope', 'temp_max', temp_max)
        self.temp_learnable = check_flag('selective_rope', 'temp_learnable', temp_learnable)
        self.phase_gate = check_flag('selective_rope', 'phase_gate', phase_gate)
        self.bias = check_flag('selective_rope', 'bias', bias)
        self.forget_gate = check_flag('selective_rope', 'forget_gate', forget_gate)
        self.x_lookback = max(0, d_conv - 2)

    def new_layer(self):
        d = self.head_dim
        temp = self.temp_max / self.temp_theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
        return _SelectiveLayer(self.n_embd, self.n_head, d // 2, self.rank, self.d_conv, temp, self.temp_learnable,
                               self.phase_gate, self.bias, self.forget_gate)

    def increments(self, u, g, params, left):
        """phi [B, H, T, d/2] from u [B, H, T, d/2] and the gate g [B, H, T] (or None), with `left`
        [B, H, K - 1, d/2] the convolution's inputs before the first token."""
        B, H, T, P = u.shape
        w = params.conv.float().view(H, P, self.d_conv)  # channel h * P + c
        full = torch.cat((left, u), 2)
        phi = sum(w[None, :, None, :, k] * full[:, :, k:k + T] for k in range(self.d_conv))
        if self.bias:
            phi = phi + params.phi_bias.float().exp()[None, :, None]
        return phi if g is None else phi * g[..., None]

    def layer_context(self, x, ctx, params, cache):
        B, T, C = x.shape
        H, P, K = self.n_head, self.head_dim // 2, self.d_conv
        with torch.autocast(x.device.type, enabled=False):
            xf = x.float()
            chunks = xf.view(B, T, H, C // H)
            xn = (chunks * torch.rsqrt(chunks.pow(2).sum(-1, keepdim=True) + 1e-6)).view(B, T, C)
            u = params.up(params.down(xn)).view(B, T, H, P).transpose(1, 2)  # [B, H, T, P]
            g = torch.sigmoid(params.gate(xn)).transpose(1, 2) if self.phase_gate else None  # [B, H, T]
            extra = {}
            if self.forget_gate:  # log f per key, summed again over the kept keys every forward (as FoX)
                log_f = F.logsigmoid(params.fgate(xf)).transpose(1, 2)  # [B, H, T]
                if cache is not None:
                    if 'sel_log_f' in cache.state:
                        log_f = torch.cat((cache.state['sel_log_f'], log_f), 2)
                    cache.state['sel_log_f'] = log_f
                c = log_f.cumsum(-1)
                extra.update(sel_c=c, sel_cq=c[..., c.size(-1) - T:])
            zeros = u.new_zeros(B, H, K - 1, P)
            if cache is None or cache.mode != 'raw':
                left = zeros if cache is None else cache.carry.get('sel_tail', zeros)
                phi = self.increments(u, g, params, left)
                s = cumsum_tokens(phi)
                if cache is not None:
                    if 'sel_sum' in cache.carry:
                        s = s + cache.carry['sel_sum']
                    cache.carry['sel_sum'] = s[:, :, -1:]
                    cache.carry['sel_tail'] = torch.cat((left, u), 2)[:, :, T:]  # the last K - 1 inputs
                q_tab = k_tab = cos_sin(s * params.temperature.float())
            else:  # a rolling cache: by place, over the kept keys and the new tokens
                for name, t in (('sel_u', u), ('sel_gate', g)):
                    if t is not None:
                        cache.state[name] = torch.cat((cache.state[name], t), 2) if name in cache.state else t
                phi = self.increments(cache.state['sel_u'], cache.state.get('sel_gate'), params, zeros)
                k_tab = cos_sin(cumsum_tokens(phi) * params.temperature.float())
                q_tab = tuple(t[:, :, t.size(2) - T:] for t in k_tab)
        return _layer_context(ctx, sel_q=q_tab, sel_k=k_tab, **extra)

    def transform_qk(self, q, k, ctx, params):
        (cos, sin), (kcos, ksin) = ctx.extra['sel_q'], ctx.extra['sel_k']
        return apply_rotary(q, cos, sin), apply_rotary(k, kcos, ksin)

    def score_mod(self, q, k, ctx, params):
        if not self.forget_gate:
            return None
        c, c_q = ctx.extra['sel_c'], ctx.extra['sel_cq']

        def mod(score, b, h, i, j):
            return score + (c_q[b, h, i] - c[b, h, j])
        return Bias(mod, factors=lambda: (c.new_ones(1, 1, 1, 1), -c[..., None]))  # -c_j; c_i of the query alone


class _CaropeLayer(nn.Module):
    def __init__(self, n_embd, n_head, bias, init_std, bias_init):
        super().__init__()
        self.freq = nn.Linear(n_embd, n_head, bias=bias)  # W (d x h in the paper) and, with bias, b
        nn.init.normal_(self.freq.weight, std=init_std)
        if bias:
            nn.init.constant_(self.freq.bias, bias_init)


@register('carope')
class CARoPE(PositionalEncoding):
    """Context-aware Rotary Position Embedding, CARoPE (Veisi, Fartoot, Amirzadeh, arXiv 2507.23083, section 2; no
    code was found: the paper's formulas): RoPE whose base frequency theta_1 is a bounded function of each token,
    per head, so that phases accumulate per token. For layer input x_t (the attention's normalised input), per head
    h and pair i < d/2 (half-split, as `rope`):
        f_h(x_t)     = 1 / (softplus(w_h . x_t + b_h) + 1)           in (0, 1)
        phi_h,i(m)   = sum_{t <= m} f_h(x_t)^i                       (RoPE: sum_{t <= m} theta_1^i = m theta_i)
        q_m, k_m turned by phi(m) like `rope`: (x1, x2) -> (x1 cos - x2 sin, x1 sin + x2 cos)
    The paper writes f(x) = 1 / (softplus(x W) + 1) with W (d x h) and says CARoPE starts as standard RoPE, which x W
    alone cannot be (W = 0 gives f = 1 / (1 + ln 2) for every head: RoPE at base (1 + ln 2)^(d/2)); so each head also
    has a bias b_h = softplus^-1(base^(2/d) - 1) and W starts at 0: f = base^(-2/d) = RoPE's theta_1 for every token,
    and CARoPE at init is `rope` at `base` with positions counted from 1, the same logits (tested). bias=False is the
    formula as printed (W alone); init_std > 0 draws W from N(0, init_std) (0.02: nanoGPT's init). Sum from t = 1 to m
    in the paper: inclusive, the token's own f counted. Pair 0 (f^0 = 1) turns by one radian a token for every x.
    The pairs' layout (half-split here) is not stated; any fixed one gives the same model up to q's and k's weights.
    The phases need x: made in layer_context, once per layer and forward, in float32 (float64 for a reference);
    keys are cached transformed and cache.carry keeps the running phase; a rolling attention-sink cache numbers keys
    by place, so the increments are kept per key in cache.state and summed again over the kept keys (as Selective
    RoPE). Attention is SDPA's. Options (defaults in parentheses): base (10000), bias (True), init_std (0.0)."""

    def __init__(self, config, base=10000.0, bias=True, init_std=0.0):
        super().__init__(config)
        if self.head_dim % 2:
            raise ValueError(f"carope rotates pairs of 2 dims: head_dim must be even, got {self.head_dim}; "
                             f"change n_embd/n_head")
        self.base = check_number('carope', 'base', base, lo=1.0, what=" (the RoPE it starts as: f = base^(-2/d))")
        self.bias = check_flag('carope', 'bias', bias)
        self.init_std = check_number('carope', 'init_std', init_std, inclusive=True, what=" (W's initial std)")

    def new_layer(self):
        theta_1 = self.base ** (-2 / self.head_dim)
        return _CaropeLayer(self.n_embd, self.n_head, self.bias, self.init_std, _softplus_inverse(1 / theta_1 - 1))

    def layer_context(self, x, ctx, params, cache):
        with torch.autocast(x.device.type, enabled=False):
            log_f = -torch.log1p(F.softplus(params.freq(wide(x)))).transpose(1, 2)[..., None]  # [B, H, T, 1]
            i = torch.arange(self.head_dim // 2, device=x.device, dtype=log_f.dtype)
            s_q, s_k, _ = _running_sum(torch.exp(log_f * i), cache, 'carope_phase')  # sums of f^i, inclusive
            q_tab = cos_sin(s_q)
            k_tab = q_tab if s_k is s_q else cos_sin(s_k)
        return _layer_context(ctx, carope_q=q_tab, carope_k=k_tab)

    def transform_qk(self, q, k, ctx, params):
        (cos, sin), (kcos, ksin) = ctx.extra['carope_q'], ctx.extra['carope_k']
        return turn(q, cos, sin), turn(k, kcos, ksin)


# --- data-dependent, in the scheme's own attention (`attention`): gates and logits computed from the layer
# input. PaTH and Wall compute every logit as a dense [B, H, Tq, Tk] float32 tensor (O(T^2) memory, as CoPE) and
# hand it to att.logits, so that windows, chunks, sink logits and attention dropout act as for any scheme, on
# every path. The logits themselves (path_scores, wall_scores), the convolution and prefix sums they read, and
# the adapters to flash-linear-attention's kernels are in kernels.py.


class _FoxLayer(nn.Module):
    def __init__(self, n_embd, n_head, bias_init):
        super().__init__()
        self.fgate = nn.Linear(n_embd, n_head)  # row h: w_h, bias: b_h
        nn.init.normal_(self.fgate.weight, std=0.02)
        nn.init.constant_(self.fgate.bias, float(bias_init))


@register('fox')
class FoX(PositionalEncoding):
    """Forgetting Transformer (Lin et al., arXiv 2503.02130): a data-dependent forget gate
    per head and token, f_t = sigmoid(w_h . x_t + b_h) with x_t the attention layer's input
    (the one q, k, v are projected from), and
        logit_ij = q_i . k_j / sqrt(d) + sum_{l=j+1..i} log f_l = q_i . k_j / sqrt(d) + c_i - c_j,
    c_t = sum_{l<=t} log f_l (float32 prefix sums). No other position signal: the decay
    is the position information (the paper's "FoX (LLaMA)" block, without the "Pro"
    extras). Defaults as the authors' code (github.com/zhixuan-lin/forgetting-transformer,
    fgate_type='full'): one Linear(n_embd, n_head) per layer, weight N(0, 0.02), bias 0,
    so f is about 1/2 at init (x-transformers' data-dependent ALiBi uses bias 5; the
    authors' special bias init is for their data-independent gates only). Option:
    bias_init.
    Runs through `attention`: the gates need x, and the log gates of cached tokens live
    in cache.state (one per key), so decoding recomputes c over all keys. The score_mod
    reads c at the query and at the key from two tensors (c's last Tq entries and c), each
    indexed once, so FlexAttention's backward takes it; memory O(T) beyond attention.
    fla kernel: parallel_attn with the log gates as its g (kernels.fla_fox), windows and sink logits too; off it, on
    CUDA, the bias rides as an extra column of q and k (-c_j against 1; attention's qk_lift route)."""
    fla_kernel = 'attn'

    def __init__(self, config, bias_init=0.0):
        super().__init__(config)
        self.bias_init = float(bias_init)

    def new_layer(self):
        return _FoxLayer(self.n_embd, self.n_head, self.bias_init)

    def attention(self, q, k, v, x, ctx, params, cache, att):
        with torch.autocast(x.device.type, enabled=False):  # the bias stays float32
            log_f = F.logsigmoid(params.fgate(x.float())).transpose(1, 2)  # [B, H, Tq]: log f of the new tokens
        if att.uses_fla(q, cache):
            return att.run_fla(q, k, v, log_f=log_f)
        if cache is not None:
            if 'fox_log_f' in cache.state:
                log_f = torch.cat((cache.state['fox_log_f'], log_f), 2)  # [B, H, Tk]: every key's log f
            cache.state['fox_log_f'] = log_f
        c = log_f.cumsum(-1)  # c_j = sum_{l<=j} log f_l
        c_q = c[..., c.size(-1) - q.size(2):]  # at the queries (the last Tq keys)

        def mod(score, b, h, i, j):
            return score + (c_q[b, h, i] - c[b, h, j])
        return att(q, k, v, Bias(mod, factors=lambda: (c.new_ones(1, 1, 1, 1), -c[..., None])))  # -c_j; c_i alone


class _CopeLayer(nn.Module):
    def __init__(self, npos_max, head_dim):
        super().__init__()
        self.pos_emb = nn.Parameter(torch.zeros(npos_max, head_dim))  # e[0..npos_max-1], the paper's zero init


@register('cope')
class CoPE(PositionalEncoding):
    """Contextual position encoding (Golovneva et al., arXiv 2405.18719):
        g_ij = sigmoid(q_i . k_j / sqrt(d))     gates, per head (from the scaled logits, as
                                                the paper's code; future keys get 0)
        p_ij = sum_{t=j..i} g_it                the contextual position of key j seen from
                                                query i (counting from the query back), clipped
                                                at npos_max - 1
        logit_ij = q_i . k_j / sqrt(d) + q_i . e[p_ij]
    with e[p] interpolated linearly between the learned vectors e[floor p] and e[ceil p];
    computed cheaply as the scalars z_i[m] = q_i . e[m] for every integer m, interpolated.
    The CoPE term is not divided by sqrt(d) (as the paper's code listing). One table e
    [npos_max, head_dim] per layer, shared by the heads (the listing keeps one pos_emb
    [head_dim, npos_max] per attention module and applies it to head_dim-sized queries;
    x-transformers shares one table across heads too), zero init (the listing's).
    Default npos_max = 64, a choice: the paper clips positions at a small npos_max
    (its language-modelling value was not checked here); at the default training length
    128 a count reaches 64 when half the gates are open. Option: npos_max.
    Where it runs: the gates, positions and bias are dense [B, H, Tq, Tk] float32 tensors
    built in PyTorch outside the kernel (O(T^2) memory; without gradients in query chunks,
    attention.dense_chunk_bytes), then attend() adds the bias: in training on CUDA as SDPA's bias table (route
    sdpa_bias), else through a score_mod that indexes it once (FlexAttention on CUDA, the dense path on CPU)."""
    content_position = True

    def __init__(self, config, npos_max=64):
        super().__init__(config)
        self.npos_max = check_whole('cope', 'npos_max', npos_max, lo=2, what=' (number of position embeddings)')

    def new_layer(self):
        return _CopeLayer(self.npos_max, self.head_dim)

    def bias(self, q, k, params, att):
        """The CoPE term q_i . e[p_ij], [B, H, Tq, Tk] float32 (queries = the last Tq keys; keys the
        layer's mask hides get no gate, so they are not counted)."""
        with torch.autocast(q.device.type, enabled=False):
            qf = q.float()
            z = qf @ k.float().transpose(-2, -1) / math.sqrt(q.size(-1))
            g = torch.sigmoid(z).masked_fill(~att.visibility(q.size(2), k.size(2), q.device), 0.0)
            p = g.flip(-1).cumsum(-1).flip(-1).clamp(max=self.npos_max - 1)  # p_ij = sum_{t>=j} g_it
            lo = p.detach().floor()
            w = p - lo  # carries the gradient to p
            qe = qf @ params.pos_emb.float().t()  # [B, H, Tq, npos_max]: q_i . e[m]
            return qe.gather(-1, p.detach().ceil().long()) * w + qe.gather(-1, lo.long()) * (1 - w)

    def attention(self, q, k, v, x, ctx, params, cache, att):
        def run(q, k, v, a):
            return a(q, k, v, Bias(tensor=self.bias(q, k, params, a)))
        return att.rows(run, q, k, v)


@register('stick_breaking')
class StickBreaking(PositionalEncoding):
    """Stick-breaking attention (Tan et al., arXiv 2410.17980), no softmax and no
    positional encoding. With z_ij = q_i . k_j / sqrt(d) and beta_ij = sigmoid(z_ij), the
    nearest key breaks off its share of the stick first:
        A_ij = beta_ij prod_{j<l<i} (1 - beta_il)       keys j < i (the paper's default)
        o_i  = sum_{j<i} A_ij v_j + (1 - sum_j A_ij) v_i
    The last term gives the stick left over, prod_{j<i} (1 - beta_ij), to the query's own
    value (the authors' reference tests and their model code's sb_remainder option;
    option remainder=False drops it, as flash-linear-attention's layer). Option
    attend_current=True lets j = i take part (j <= i, product over j < l <= i; the
    authors' kernel option, off by default).
    Computed in log space in float32 (log A_ij = log sigmoid(z_ij) - sum_{j<l<i}
    softplus(z_il), a reversed cumulative sum), O(T^2) memory, in query chunks without
    gradients (attention.dense_chunk_bytes). There is no FlexAttention path: `attention` computes
    the output itself, applies attention dropout to A while training (config.dropout;
    the remainder term is not dropped), and ignores attn_backend but 'fla'. A sliding window or chunk hides keys,
    which then break nothing off. No softmax, so no sink logits.
    fla kernel: parallel_stickbreaking_attn (kernels.fla_stick_breaking): no window, no dropout."""
    softmax = None
    fla_kernel = 'stickbreaking'

    def __init__(self, config, attend_current=False, remainder=True):
        super().__init__(config)
        self.attend_current, self.remainder = bool(attend_current), bool(remainder)
        self.dropout = config.dropout

    def weights(self, q, k, mask=CAUSAL):
        """(A [B, H, Tq, Tk], the stick left over [B, H, Tq]) in float32; queries = the last Tq keys, and
        keys the mask hides break nothing off."""
        with torch.autocast(q.device.type, enabled=False):
            z = q.float() @ k.float().transpose(-2, -1) / math.sqrt(q.size(-1))
            vis = mask.visibility(q.size(2), k.size(2), q.device, strict=not self.attend_current)
            log_keep = F.logsigmoid(-z).masked_fill(~vis, 0.0)  # log(1 - beta_il); 0 = no break
            after = log_keep.flip(-1).cumsum(-1).flip(-1)  # sum_{l>=j}
            after = F.pad(after[..., 1:], (0, 1))  # sum_{l>j}
            A = (F.logsigmoid(z) + after).exp().masked_fill(~vis, 0.0)
            return A, log_keep.sum(-1).exp()

    def attention(self, q, k, v, x, ctx, params, cache, att):
        if att.uses_fla(q, cache):
            return att.run_fla(q, k, v, attend_current=self.attend_current, remainder=self.remainder)
        p = self.dropout if self.training else 0.0

        def run(q, k, v, a):
            A, rest = self.weights(q, k, a.mask)
            with torch.autocast(q.device.type, enabled=False):
                if p:
                    A = F.dropout(A, p)
                y = A @ v.float()
                if self.remainder:
                    y = y + rest.unsqueeze(-1) * v[:, :, v.size(2) - q.size(2):].float()
            return y
        return att.rows(run, q, k, v).to(q.dtype)


class _PathLayer(nn.Module):
    def __init__(self, n_embd, n_head, rank, width, forget_gate):
        super().__init__()
        self.w_down, self.w_up = _linear(n_embd, rank), _linear(rank, n_embd)  # w from x, low rank
        self.w_conv = nn.Parameter(torch.randn(n_embd, width) * 0.02) if width else None
        self.beta = _linear(n_embd, n_head, bias=0.0)
        self.fgate = _linear(n_embd, n_head, bias=0.0) if forget_gate else None


@register('path')
class PaTH(PositionalEncoding):
    """PaTH attention (Yang et al., arXiv 2505.16381), as flash-linear-attention's PaTHAttention layer builds it:
        logit_ij = q_i^T H_i H_{i-1} ... H_{j+1} k_j / sqrt(d)    (the empty product, I, for j = i)
        H_t = I - beta_t w_t w_t^T,   beta_t = 2 sigmoid(u . x_t + b) in (0, 2)
        w_t = L2norm per head (SiLU(causal depthwise conv of width 3 over W_up W_down x_t)),  W_down: rank 32
    with x_t the layer's input. No other positional signal. Kept from fla: the low-rank projection (its MHA
    default), the short convolution (no bias; the last tap on the current token), SiLU, the per-head norm
    w / sqrt(sum w^2 + 1e-6), beta unclipped (2 is a reflection; above 1, a negative eigenvalue along w), weights
    N(0, 0.02) and biases 0 (fla's _init_weights: beta starts near 1). Left out: fla's own QK-norm (the layer
    plan's qk_norm does that) and GQA.
    Computation (path_scores): fla's chunked UT transform in chunks of 64 tokens; no d x d matrix is formed, per
    pair or per chunk. The logits form a dense float32 [B, H, Tq, Tk] tensor (O(T^2) memory, as CoPE) that
    attend's softmax reads as a bias: windows, chunks and sink logits act as on any layer.
    KV cache (cache_keys = 'scheme'): the cache holds each key moved through the last token's H; a new token t
    first rewrites every cached key k <- k - beta_t (k . w_t) w_t, then appends its own key as it is, so decoding
    costs O(n d) for n cached keys (a segment of new tokens: the segment's product, in WY form). The
    convolution's last inputs ride in cache.carry. A query reads x up to width - 2 tokens before the first
    key it sees (x_lookback: the first Householder a key's product takes is its successor's).
    Options: rank (32), conv (3: the convolution's width; 0 for none), chunk (64).
    fla kernel: parallel_path_attn (kernels.fla_path), without a KV cache: head sizes 16, 32, 64, 128, no window, no
    sink logits."""
    cache_keys = 'scheme'
    forget_gate = False
    fla_kernel = 'path'

    def __init__(self, config, rank=32, conv=3, chunk=64):
        super().__init__(config)
        self.rank, self.conv, self.chunk = (check_whole(self.name, name, v, lo) for name, v, lo in
                                            (('rank', rank, 1), ('conv', conv, 0), ('chunk', chunk, 1)))
        self.x_lookback = max(0, conv - 2)  # H_{j+1}, the first a key j's product takes, reads x_{j+1-(conv-1)}..

    def new_layer(self):
        return _PathLayer(self.n_embd, self.n_head, self.rank, self.conv, self.forget_gate)

    def gates(self, x, params, cache):
        """(w [B, H, T, d], beta [B, H, T]) of the new tokens, float32, the convolution continuing the cache's."""
        B, T, C = x.shape
        pre = params.w_up(params.w_down(x))  # [B, T, C]
        w = pre
        if self.conv:
            past = cache.carry.get('path_w') if cache is not None else None
            w = F.silu(causal_conv(pre, params.w_conv.float(), past))
            if cache is not None and self.conv > 1:  # the last conv - 1 inputs, for the next forward
                seen = torch.cat((pre.new_zeros(B, self.conv - 1, C) if past is None else past, pre), 1)
                cache.carry['path_w'] = seen[:, seen.size(1) - (self.conv - 1):]
        w = w.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        w = w / torch.sqrt((w * w).sum(-1, keepdim=True) + 1e-6)
        return w, 2 * torch.sigmoid(params.beta(x)).transpose(1, 2)

    def attention(self, q, k, v, x, ctx, params, cache, att):
        n = cache.n if cache is not None else 0
        with torch.autocast(x.device.type, enabled=False):  # the logits stay float32
            xf = x.float()
            w, beta = self.gates(xf, params, cache)
            log_f = F.logsigmoid(params.fgate(xf)).transpose(1, 2) if params.fgate is not None else None  # [B, H, T]
            if att.uses_fla(q, cache):
                return att.run_fla(q, k, v, w=w, beta=beta, log_f=log_f)
            A, keys = path_scores(q.float(), k.float(), w, beta, cache[0].float() if n else None, self.chunk,
                                  keys=cache is not None)
            if log_f is not None:  # PaTH-FoX: G_i - G_j inside the scale, G the prefix sum of log f
                if cache is not None:
                    log_f = torch.cat((cache.state['path_log_f'], log_f), 2) if n else log_f
                    cache.state['path_log_f'] = log_f
                G = log_f.cumsum(-1)
                A = A + G[..., G.size(-1) - q.size(2):, None] - G[..., None, :]
            A = A / math.sqrt(self.head_dim)
        if cache is not None:  # every cached key moves through the new tokens' H; the new keys join
            if n:
                cache.rewrite(lambda old: keys[:, :, :n].to(old.dtype))
            k, v = cache.append(keys[:, :, n:].to(k.dtype), v)
        return att.logits(A, v)


@register('path_fox')
class PaTHFoX(PaTH):
    """PaTH-FoX (Yang et al., arXiv 2505.16381; flash-linear-attention's PaTHAttention with use_forget_gate):
    PaTH plus FoX's forget gates, inside the scale:
        logit_ij = (q_i^T H_i ... H_{j+1} k_j + G_i - G_j) / sqrt(d),   G_t = sum_{l<=t} log sigmoid(f_h . x_l + b_h)
    (fla scales the gate term here; its plain FoX, as `fox`, does not). Gate weights N(0, 0.02), bias 0 (fla's
    init: f about 1/2 at first). The log gates of cached keys ride in cache.state. Options as `path`."""
    forget_gate = True


class _WallLayer(nn.Module):
    def __init__(self, n_embd, n_head, bias_init, scalar_gate):
        super().__init__()
        self.gate = _linear(n_embd, n_embd, bias=bias_init)  # g per query head and channel
        self.scalar = _linear(n_embd, n_head, bias=bias_init) if scalar_gate else None


@register('wall')
class Wall(PositionalEncoding):
    """Wall attention (Tilde Research, 2026; flash-linear-attention's wall_attn layer and naive reference):
        logit_ij = sum_n q_in k_jn exp(P_in - P_jn) / sqrt(d)   [+ C_i - C_j with the scalar gate, unscaled]
    P_t = sum_{l<=t} g_l, g_l = log sigmoid(W x_l + b) <= 0 per head and channel (x the layer's input); with
    g = 0 it is plain attention. Init as fla: W ~ N(0, 0.02), b = 8 (g about -3.4e-4: near plain attention at
    first). The optional scalar gate is FoX's, C the prefix sum of log sigmoid(w_h . x + b_h) per head, added
    after the scale (as fla). fla sums in log base 2 (exp2 of P / ln 2): the same numbers.
    Computed stably (wall_scores): every exponent is a difference of prefix sums <= 0, never exp(P) alone. The
    logits form a dense float32 [B, H, Tq, Tk] tensor (O(T^2) memory) read by attend as a bias. The KV cache keeps
    the raw keys and each key's g (cache.state): decoding costs O(n d).
    Options: bias_init (8), scalar_gate (False).
    fla kernel: parallel_wall_attn (kernels.fla_wall), windows and sink logits too."""
    fla_kernel = 'wall'

    def __init__(self, config, bias_init=8.0, scalar_gate=False):
        super().__init__(config)
        self.bias_init, self.scalar_gate = float(bias_init), bool(scalar_gate)

    def new_layer(self):
        return _WallLayer(self.n_embd, self.n_head, self.bias_init, self.scalar_gate)

    def attention(self, q, k, v, x, ctx, params, cache, att):
        B, H, T, d = q.shape
        with torch.autocast(x.device.type, enabled=False):  # the logits stay float32
            xf = x.float()
            g = F.logsigmoid(params.gate(xf)).view(B, T, H, d).transpose(1, 2)  # [B, H, T, d]
            gs = F.logsigmoid(params.scalar(xf)).transpose(1, 2) if params.scalar is not None else None
            if att.uses_fla(q, cache):
                return att.run_fla(q, k, v, g=g, g_scalar=gs)
            if cache is not None:  # the gates of every key in the cache (its keys include the new ones)
                for name, t in (('wall_g', g), ('wall_gs', gs)):
                    if t is not None:
                        cache.state[name] = torch.cat((cache.state[name], t), 2) if name in cache.state else t
                g, gs = cache.state['wall_g'], cache.state.get('wall_gs')
            P = cumsum_tokens(g)
            A = wall_scores(q.float(), k.float(), P) / math.sqrt(d)
            if gs is not None:
                C = gs.cumsum(-1)
                A = A + C[..., C.size(-1) - T:, None] - C[..., None, :]
        return att.logits(A, v)


class _DapeLayer(nn.Module):
    def __init__(self, n_head, bias, width, kernel, init_c, init_L):
        super().__init__()
        if bias == 'kerple':
            self.p = nn.Parameter(torch.rand(n_head) * 2)  # KERPLE's init: p ~ U(0, 2), a ~ U(0, 1)
            self.a = nn.Parameter(torch.rand(n_head))
        if bias == 'fire':
            self.fc1, self.fc2 = nn.Linear(1, width), nn.Linear(width, n_head)
            self.c = nn.Parameter(torch.tensor(float(init_c)))  # log-transform sharpness
            self.L_mult = nn.Parameter(torch.tensor(1.0))  # learned threshold = |L_mult * init_L|
            self.register_buffer('init_L', torch.tensor(float(init_L)), persistent=False)
        inputs = n_head if bias == 'none' else 2 * n_head  # [logits; bias] per head
        if kernel == 1:  # DAPE: an MLP over each pair's heads (nn.Linear's init, as the authors')
            self.mix1, self.mix2 = nn.Linear(inputs, width), nn.Linear(width, n_head)
        else:  # DAPE v2: 1 x kernel convolutions over each query row's keys (nn.Conv2d's init, as the authors')
            self.mix1, self.mix2 = nn.Conv2d(inputs, width, (1, kernel)), nn.Conv2d(width, n_head, (1, kernel))


@register('dape')
class DAPE(PositionalEncoding):
    """DAPE, data-adaptive positional encoding (Zheng et al., arXiv 2405.14722, NeurIPS 2024), as the authors' code
    computes it (github.com/chuanyang-Zheng/DAPE at bde344a: DAPE.py's AliBi_DAPE, ParallelKerpleLog_DAPE, FIRE_DAPE;
    megatron/model/positional_embeddings.py's AliBi_C, ParallelKerpleLog_C, FIRE_C, Nope_C, the same arithmetic):
        A_ij = z_ij + b_ij + f([z_ij; b_ij]),   z = q k^T / sqrt(d),   f: Linear(2H, width), LeakyReLU, Linear(width, H)
    an MLP over the vector of each query-key pair across the H heads, [its scaled logits; its positional bias], added
    to both, then the causal mask and the softmax. b is the bias DAPE wraps (option bias), 0 for a future key:
      'alibi'   -m_h (i - j), ALiBi's slopes (alibi_slopes), no parameters
      'kerple'  -p_h log(1 + a_h (i - j)), KERPLE's log kernel, p ~ U(0, 2), a ~ U(0, 1) per head and layer, clamped
                in place to >= 0.01 before each use (the authors' code)
      'fire'    FIRE's MLP(psi(i - j) / (psi(max(i, |m L0|)) + 1e-6)), psi(x) = log(|c x| + 1), 1 -> width -> H,
                c (init_c), m (init 1), L0 (init_L): with LeakyReLU, as the authors' FIRE_DAPE and FIRE_C (their
                plain FIRE, as `fire`, has ReLU)
      'none'    no bias, f over the logits alone, H -> width -> H (the authors' Nope_C: DAPE on NoPE)
    i and j are the query's and the key's positions. Per layer: f, and KERPLE's or FIRE's parameters; f has
    nn.Linear's default init (as the authors' nn.Sequential), LeakyReLU PyTorch's slope 0.01; f's output bias adds
    one number to every logit of a head's row, which softmax cancels (a zero gradient, as in their code). Defaults: bias
    'kerple' (our choice of the authors' three), width 32 (their configs' mlp_width, also FIRE's MLP width as in
    their code), init_c 0.1, init_L 512 (DAPE.py's FIRE_DAPE; their Megatron layer passes noise_seq_length // 2, 64
    in their DAPE-FIRE config at training length 512). The paper's text was not available here, its abstract only:
    the formula and defaults are the code's.
    Where it runs: f mixes the heads of a pair, which no FlexAttention score_mod (one head's logit) or bias form can
    carry, so `attention` builds the logits whole and hands them to the layer's softmax (att.logits: FlexAttention on
    CUDA, the dense path elsewhere; windows, chunks, sink logits and dropout as on any layer). With gradients the
    whole [B, H, T, T] logits and f's [B, T, T, width] hidden units; without (evaluation), f being per pair, query
    chunks (att.rows), each chunk's hidden units within attention.dense_chunk_bytes: O(T) memory beyond the keys and
    values. The KV cache keeps keys and values only (the bias is of positions). Options: bias, width, init_c, init_L."""
    kernel = 1  # the width of f over keys: DAPE's f is per pair
    biases = ('alibi', 'kerple', 'fire', 'none')

    def __init__(self, config, bias='kerple', width=32, init_c=0.1, init_L=512.0):
        super().__init__(config)
        self.bias = check_choice(self.name, 'bias', bias, self.biases)
        self.width = check_whole(self.name, 'width', width, what=' (hidden units of the MLP over the heads)')
        self.init_c = check_number(self.name, 'init_c', init_c, what=" (FIRE's log-transform sharpness c)")
        self.init_L = check_number(self.name, 'init_L', init_L, what=" (FIRE's threshold L0)")
        if bias == 'alibi':
            self.register_buffer('slopes', alibi_slopes(config.n_head), persistent=False)

    def new_layer(self):
        return _DapeLayer(self.n_head, self.bias, self.width, self.kernel, self.init_c, self.init_L)

    def position_bias(self, params, qp, kp, dtype):
        """The wrapped bias [H, Tq, Tk] at query positions qp [Tq] and key positions kp [Tk] (0 for a future key)."""
        r = (qp[:, None] - kp[None, :]).clamp(min=0).to(dtype)  # (Tq, Tk) distances
        if self.bias == 'alibi':
            return -self.slopes.to(dtype)[:, None, None] * r
        if self.bias == 'kerple':
            return -params.p.to(dtype)[:, None, None] * torch.log1p(params.a.to(dtype)[:, None, None] * r)
        c, thr = params.c.to(dtype), (params.L_mult * params.init_L).abs().to(dtype)
        x = torch.log(torch.abs(c * r) + 1) / (torch.log(torch.abs(c * torch.maximum(qp.to(dtype), thr)) + 1) +
                                               1e-6)[:, None]
        hidden = F.leaky_relu(x[..., None] * params.fc1.weight[:, 0].to(dtype) + params.fc1.bias.to(dtype))
        return (hidden @ params.fc2.weight.to(dtype).t() + params.fc2.bias.to(dtype)).permute(2, 0, 1)

    def mix(self, z, b, params, vis, k0):
        """f([z; b]) [B, H, Tq, Tk] for logits z [B, H, Tq, Tk] and bias b [H, Tq, Tk] (None: 'none'): DAPE's MLP,
        or DAPE v2's convolutions over each row's keys, where vis [Tq, Tk] says which keys each query sees (hidden
        ones enter as zeros) and k0 is the text's token at key 0. Heads last, so each tap is one matmul."""
        dtype, H, Tk, k = z.dtype, z.size(1), z.size(3), self.kernel
        p = k // 2
        w1 = params.mix1.weight.to(dtype).view(self.width, -1, k)  # (width, inputs, taps)
        w2 = params.mix2.weight.to(dtype).view(H, self.width, k).permute(2, 0, 1).flatten(0, 1)  # (taps x H, width)
        b1, b2 = params.mix1.bias.to(dtype), params.mix2.bias.to(dtype)
        if vis is not None:  # the authors' tril: a key the query cannot see enters the convolution as zeros
            z = z.masked_fill(~vis, 0.0)
            b = b.masked_fill(~vis, 0.0) if b is not None else None

        def taps(x, w, bias=None):  # conv1 of x (..., Tk, inputs) at each key and p past each end (..., Tk + 2p, width)
            if p:  # each tap's inputs side by side: p + p keys of zeros at each end, then windows of k keys
                x = F.pad(x, (0, 0, 2 * p, 2 * p)).unfold(-2, k, 1).flatten(-2)
            return F.linear(x, w.flatten(1), bias)
        h = taps(z.permute(0, 2, 3, 1), w1[:, :H], b1)  # (B, Tq, Tk + 2p, width)
        if b is not None:  # the bias's half once for the batch, whose rows share it
            h = h + taps(b.permute(1, 2, 0), w1[:, H:])
        if p > k0:  # hidden units before the text's first token are the authors' zero padding
            h = F.pad(h[:, :, p - k0:], (0, 0, p - k0, 0))
        if not p:  # DAPE's MLP
            return F.linear(F.leaky_relu(h), w2, b2).permute(0, 3, 1, 2)
        g = F.linear(F.leaky_relu(h), w2)  # (B, Tq, Tk + 2p, taps x H): each tap of conv2 at every hidden unit
        out = sum((g[:, :, t:t + Tk, t * H:(t + 1) * H] for t in range(k)), b2)
        return out.permute(0, 3, 1, 2)  # (B, H, Tq, Tk)

    def logits(self, q, k, ctx, params, a):
        """The layer's logits z + b + f([z; b]) [B, H, Tq, Tk] of queries q over keys k, the rows and keys of
        att.rows's chunk `a`; without gradients a few rows at a time, so f's hidden units stay within a dense
        chunk's bytes."""
        dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        B, H, Tq, d = q.shape
        Tk, p = k.size(2), self.kernel // 2
        qp, kp = ctx.q_pos[a.row0:a.row0 + Tq], ctx.k_pos[a.key0:a.key0 + Tk]
        vis = a.visibility(Tq, Tk, q.device) if p else None
        kt = k.to(dtype).transpose(-2, -1)
        n = Tq if torch.is_grad_enabled() else \
            max(1, dense_chunk_bytes(q.device.type) // (B * self.width * (Tk + 2 * p) * kt.element_size()))
        parts = []
        for s in range(0, Tq, n):
            z = q[:, :, s:s + n].to(dtype) @ kt / math.sqrt(d)  # (B, H, rows, Tk)
            b = self.position_bias(params, qp[s:s + n], kp, dtype) if self.bias != 'none' else None
            f = self.mix(z, b, params, vis[s:s + n] if p else None, a.mask.k0)
            parts.append(z + f if b is None else z + b + f)
        return parts[0] if len(parts) == 1 else torch.cat(parts, 2)

    def attention(self, q, k, v, x, ctx, params, cache, att):
        if self.bias == 'kerple':
            with torch.no_grad():  # clamp the parameters themselves, so gradients still flow at the boundary
                params.p.clamp_(min=1e-2)
                params.a.clamp_(min=1e-2)

        def run(q, k, v, a):
            with torch.autocast(q.device.type, enabled=False):  # the logits stay float32
                A = self.logits(q, k, ctx, params, a)
            return a.logits(A, v)
        return att.rows(run, q, k, v)


@register('dape_v2')
class DAPEV2(DAPE):
    """DAPE v2, CDAPE (Zheng et al., arXiv 2410.04798): DAPE with the attention scores as feature maps, its MLP
    made two 1 x k convolutions over each query row's keys, the heads as channels, as the authors' code computes it
    (github.com/chuanyang-Zheng/DAPE at bde344a: megatron/model/positional_embeddings.py's Alibi_DAPEV2,
    Kerple_DAPEV2, FIRE_DAPEV2; the capev2 configs):
        A = z + b + conv2(LeakyReLU(conv1(tril([z; b])))),   conv1: 2H -> width, conv2: width -> H, each 1 x k
    zero-padded by k // 2 at both ends of the keys, with z, b and the options of `dape`; tril: a key the query cannot
    see enters as 0 (the future's; here a window's or chunk's hidden keys too). Row i's logit at key j reads row i's
    scores and biases at keys j - 2p .. j + 2p (p = k // 2), never another query's row, those past i as zeros: causal.
    The README's and paper's "1 x 3 convolution" is, in the code, this two-layer network of 1 x 3 convolutions (5 keys
    at k = 3): the code is followed. Defaults: kernel 3 (their configs), bias 'kerple', width 32.
    One departure, so that decoding equals a full forward: the code's second convolution zero-pads past a forward's
    last key, which only the last p rows read, so a query's logits there depend on whether its forward ends at it;
    here every row gets what the code gives a row with text after it (its hidden units past its own key from tril's
    zeros). It equals the authors' forward over T + p tokens in its first T rows, and theirs over T tokens in all but
    the last p (tested). Hidden units before the text's first token are 0 (the code's padding); before a cache's or
    chunk's first key, whose earlier tokens are hidden, they come from zeros as at any hidden key. The code's one-query
    decoding step (tril of a 1 x Tk map keeps its first key alone) is not followed. bias='none' takes the H logit maps
    alone: the code's Nope_C_FFN and DAPEV2 declare 2H input channels but are handed H, and cannot run.
    Where it runs: as `dape`, the whole logits to the layer's softmax (att.logits: FlexAttention on CUDA, dense
    elsewhere); without gradients in query chunks (att.rows), rows being independent, each chunk's keys with the zeros
    past its ends that the convolutions read, its hidden units [B, rows, Tk + 2p, width] within
    attention.dense_chunk_bytes: O(T) memory. Options: kernel (odd), and bias, width, init_c, init_L as `dape`."""

    def __init__(self, config, bias='kerple', width=32, kernel=3, init_c=0.1, init_L=512.0):
        super().__init__(config, bias, width, init_c, init_L)
        what = " (the convolutions' width over keys, padded by kernel // 2 at each end)"
        self.kernel = check_whole(self.name, 'kernel', kernel, what=what)
        if self.kernel % 2 == 0:
            raise ValueError(f"{self.name} kernel must be an odd integer >= 1{what}, got {kernel!r}")
# --- a positional stream carried beside the residual stream and updated by every layer (`stream`)


def _turn(x, e):
    """x [B, H, T, d] turned plane by plane (half-split pairs (c, c + d/2)) by its token's stream e = [C | S]
    [B|1, H, T, d]: x * [C | C] + rotate_half(x) * [S | S], RoPE's rotation where C and S are a cos and a sin; in e's
    dtype, returned in x's."""
    c, s = e.chunk(2, -1)
    xe = x.to(e.dtype)
    return (xe * torch.cat((c, c), -1) + rotate_half(xe) * torch.cat((s, s), -1)).to(x.dtype)


class _TapeLayer(nn.Module):
    def __init__(self, n_embd, n_head, size):
        super().__init__()
        self.mix = nn.Parameter(torch.zeros(n_head, n_head))  # post_attention_linear: zero init
        self.gate = nn.Parameter(torch.empty(size, n_embd))  # x_proj
        self.up = nn.Parameter(torch.zeros(size, n_head))  # up_proj: zero init
        self.down = nn.Parameter(torch.empty(n_head, size))  # down_proj
        for w in (self.gate, self.down):  # the code's Llama init, N(0, 0.02)
            nn.init.normal_(w, std=0.02)


@register('tape')
class TAPE(PositionalEncoding):
    """TAPE, contextualized equivariant positional encoding (Zhu, Wang, Cai, Lee, Li, Wang, arXiv 2501.00712,
    ICML 2025; code VITA-Group/TAPE, models/llama/adape.py with config/adape.json: 'adape' in the code). Every
    token carries a positional stream beside the residual stream, e = (C, S), each [H, d/2] (per head h and
    half-split plane c; the code keeps two [H, d] tensors whose halves are equal, kept once here), which each
    layer reads and updates:
        start    C = cos(theta_c (p + k) / f), S = sin(...), theta_c = base^(-2c/d), every head alike (RoPE's tables;
                 p the position, k a shift, f = scaling_factor)
        logits   q_i' = q_i * [C_i | C_i] + rotate_half(q_i) * [S_i | S_i], k_j' alike (RoPE where C, S are cos,
                 sin), a_ij = softmax_j(q_i' . k_j' / sqrt(d)), y = a v
        attention  e_i <- e_i + s_h sum_j a_ij e_j          the stream averaged by the layer's own weights,
                 s_h = sum_g W_mix[h, g]
        MLP      e <- e + W_down (silu(W_gate m) * (W_up e))  m: the block's MLP output (before its residual add),
                 W_gate [P, n_embd], W_up [P, H], W_down [H, P] mix heads alike for every plane, C and S
    Every update is linear in e with real weights from the content, the same for C and S and for every plane, so
    turning each token's (C_c, S_c) by one angle turns every later stream by it and leaves every logit as it was
    (the paper's orthogonal equivariance): the shift k changes no logit (tested in float64). Init as the code's
    (HF's N(0, 0.02) for every Linear, then W_up and W_mix zeroed): W_mix = W_up = 0, so at init the stream stays
    RoPE's tables and TAPE is `rope` (tested); W_gate, W_down N(0, 0.02). Defaults from config/adape.json:
    position_size P = 48, base 10000; silu is its hidden_act.
    The authors' code, followed here where it reads unlike a plain reading of its parts: the attention update's
    einsum 'bqnd,qe->bqnd' sums W_mix's rows, so head h is scaled by s_h and no heads are mixed (a map of the heads
    would be 'bqnd,qe->bend'; W_mix stays [H, H], so its gradients are the code's); the MLP update reads the MLP's
    output (the code's "this order is important"); in training the start's shift k is drawn uniformly from 0..2L
    (L = block_size; random_shift), a fixed `shift` overriding it, 0 in evaluation. The paper's text was read
    through its abstract and summaries only, so where it differs from the code is not checked: the formulas here
    are the code's.
    nanoPE's choices: its blocks (LayerNorm, GELU MLP) around the code's stream; the stream in float32 (float64
    in a float64 model), its start's angles in float64, averaged in the attention's dtype (the code casts it to
    the activations' dtype); the last layer that carries the stream has no update parameters, since its stream
    feeds nothing (the code keeps them, unused); no Flash/Triton kernel of the code's, which fuses the three
    outputs. KV cache (the code refuses one): the stream each key entered a layer with is kept per key in
    cache.state, and keys are cached turned; a rolling cache (attention sinks) keeps keys raw and turns each
    kept key's stream by its change of place every forward, which is StreamingLLM's re-indexing for the first
    layer and the equivariant one for later layers.
    Where it runs: its own attention hook, one attend call for the values and one for the stream, whose 2 x d/2
    columns a head are q's width, as SDPA's fused kernels want (no bias: SDPA on CUDA; the stream's call without
    attention dropout, which the code does not have), and the `stream` hook after the block's MLP; the last layer
    one call. attn_scaling is refused (its own attention). Options (defaults in parentheses): base (10000),
    position_size (48), random_shift (True), shift (0), scaling_factor (1.0: the code's linear rope_scaling
    factor)."""

    def __init__(self, config, base=10000.0, position_size=48, random_shift=True, shift=0, scaling_factor=1.0):
        super().__init__(config)
        if self.head_dim % 2:
            raise ValueError(f"tape turns planes of 2 dims: head_dim must be even, got {self.head_dim}; change "
                             f"n_embd/n_head")
        self.base = check_number('tape', 'base', base)
        self.size = check_whole('tape', 'position_size', position_size, what=' (the stream update\'s width P)')
        self.random_shift = check_flag('tape', 'random_shift', random_shift)
        self.shift = check_whole('tape', 'shift', shift, lo=0)
        self.scaling_factor = check_number('tape', 'scaling_factor', scaling_factor)
        # which of this instance's layers update the stream, in the order new_layer builds them: all but the last
        # layer of the model that runs tape, whose stream feeds nothing (the plan from the config, as model.py's)
        sig = inspect.signature(type(self).__init__)

        def resolved(opts):  # a layer's options with the defaults filled in
            b = sig.bind(None, config, **opts)
            b.apply_defaults()
            return {k: v for k, v in b.arguments.items() if k not in ('self', 'config')}
        plan = [None if s.pos_options is None else resolved(s.pos_options) for s in layers.layer_specs(config)]
        last = max((i for i, o in enumerate(plan) if o is not None), default=None)
        mine = resolved(dict(base=base, position_size=position_size, random_shift=random_shift, shift=shift,
                             scaling_factor=scaling_factor))
        self.updates = [i != last for i, o in enumerate(plan) if o == mine]

    def new_layer(self):
        """Once per layer of this instance, in layer order (attention.CausalSelfAttention): the stream update's
        parameters, or None on the model's last tape layer."""
        live = self.updates.pop(0) if self.updates else True
        return _TapeLayer(self.n_embd, self.n_head, self.size) if live else None

    def inv_freq(self, device):
        d = self.head_dim
        return self.base ** (-torch.arange(0, d, 2, dtype=torch.float64, device=device) / d) / self.scaling_factor

    def context(self, q_pos, k_pos, n_pos=None):
        ctx = make_context(q_pos, k_pos, n_pos)
        k = self.shift
        if not k and self.training and self.random_shift:  # the code's draw: uniform in 0..2L
            k = torch.randint(0, 2 * self.block_size + 1, (), device=q_pos.device)
        ctx.extra['tape_shift'] = k
        return ctx

    def start(self, ctx, B, dtype):
        """The stream before the first layer at the new tokens, [B, H, Tq, d]: RoPE's cos and sin of the
        shifted positions, every head alike."""
        ang = (ctx.q_pos.double() + ctx.extra['tape_shift'])[:, None] * self.inv_freq(ctx.q_pos.device)[None]
        return torch.cat((ang.cos(), ang.sin()), -1).to(dtype).expand(B, self.n_head, -1, -1)

    def moved(self, e, move):
        """Each key's stream e [B, H, Tk, d] turned by its move of place move [Tk] (a rolling cache)."""
        ang = move.double()[:, None] * self.inv_freq(e.device)[None]
        cos, sin = ang.cos().to(e.dtype), ang.sin().to(e.dtype)
        c, s = e.chunk(2, -1)
        return torch.cat((c * cos - s * sin, c * sin + s * cos), -1)

    def layer_context(self, x, ctx, params, cache):
        e = ctx.stream if ctx.stream is not None else self.start(ctx, x.size(0), torch.promote_types(x.dtype,
                                                                                                  torch.float32))
        keys = e  # the stream at every key this layer's attention reads
        if cache is not None and (params is not None or cache.mode == 'raw'):
            if 'tape' in cache.state:
                keys = torch.cat((cache.state['tape'], e), 2)
            cache.state['tape'] = keys
            if cache.mode == 'raw':  # a rolling cache places its keys anew every forward: each key's stream turned
                made = ctx.q_pos.view(1, 1, -1)  # the places the new tokens' streams were made at
                if 'tape_pos' in cache.state:
                    made = torch.cat((cache.state['tape_pos'], made), 2)
                cache.state['tape_pos'] = made
                keys = self.moved(keys, ctx.k_pos[ctx.k_pos.numel() - keys.size(2):] - made.view(-1))
        return _layer_context(ctx, tape_in=e, tape_keys=keys)

    def transform_qk(self, q, k, ctx, params):
        keys = ctx.extra['tape_keys']
        return _turn(q, ctx.extra['tape_in']), _turn(k, keys[:, :, keys.size(2) - k.size(2):])

    def attention(self, q, k, v, x, ctx, params, cache, att):
        y = att(q, k, v)
        if params is not None:  # the stream averaged by the same weights (its d columns are q's width, as SDPA's
            # fused kernels want), without attention dropout; left in this layer's own ctx for the stream hook
            plain = Attender(att.mask, att.backend, 0.0, att.sink_logits)
            ctx.extra['tape_mixed'] = plain(q, k, ctx.extra['tape_keys'].to(v.dtype))
        return y

    def stream(self, m, ctx, params, cache):
        if params is None:
            return ctx.stream
        e = ctx.extra['tape_in']
        with torch.autocast(m.device.type, enabled=False):
            mix, gate, up, down = (p.to(e.dtype) for p in (params.mix, params.gate, params.up, params.down))
            e = e + mix.sum(1)[:, None, None] * ctx.extra['tape_mixed'].to(e.dtype)  # the code's 'bqnd,qe->bqnd'
            g = F.silu(F.linear(m.to(e.dtype), gate)).transpose(1, 2)[..., None]  # [B, P, Tq, 1]
            return e + torch.einsum('hp,bptc->bhtc', down, g * torch.einsum('ph,bhtc->bptc', up, e))
