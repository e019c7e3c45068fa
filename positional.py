"""
Positional encodings for nanoPE. Every scheme is a small nn.Module registered by
the name used in config (`pos_encoding = 'rope'`).

The attention code in model.py never asks *which* scheme it runs. It asks the
scheme for up to four things, each of which defaults to "nothing":

  embed(x, pos)                -> x         add/alter token embeddings before block 0
  context(q_pos, k_pos)        -> ctx       per-forward precomputation shared by all layers
  transform_qk(q, k, ctx, lyr) -> (q, k)    rotate/scale queries and keys (RoPE family)
  score_mod(q, ctx, lyr)       -> f | None  additive logit bias f(score, b, h, q_pos, k_pos)

`score_mod` returns a function in FlexAttention's `score_mod` form but written on
*absolute positions*. model.py either hands it to FlexAttention (one scalar at a
time, never building a TxT tensor) or calls it once on broadcast index tensors
to build a dense additive mask for SDPA. One definition, both paths, same logits.

Per-layer parameters (if a scheme has any) live in the module returned by
`new_layer()`, which each attention layer owns and passes back as `lyr`.
Shapes: q, k are [B, n_head, T, head_dim]; positions are int64 tensors.

Adding a scheme = write a subclass here, decorate it with @register('name'),
add config/name.py. Nothing else changes.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

REGISTRY = {}


def register(name):
    def deco(cls):
        REGISTRY[name] = cls
        cls.name = name
        return cls
    return deco


def build(config):
    """Instantiate the scheme named by config.pos_encoding with config.pos_options."""
    name = config.pos_encoding
    if name not in REGISTRY:
        raise ValueError(f"unknown pos_encoding {name!r}; valid schemes: {', '.join(sorted(REGISTRY))}")
    try:
        pe = REGISTRY[name](config, **(config.pos_options or {}))
    except TypeError as e:
        raise ValueError(f"bad pos_options {config.pos_options!r} for scheme {name!r}: {e}. "
                         f"See the docstring of {REGISTRY[name].__name__} in positional.py "
                         f"for the options it takes.") from None
    if getattr(config, 'rope_scaling', None) and not getattr(pe, 'uses_rope_scaling', False):
        raise ValueError(f"rope_scaling={config.rope_scaling!r} was given, but scheme {name!r} has no "
                         f"rotary embedding to scale; drop rope_scaling or use a RoPE checkpoint")
    return pe


def extrapolating_schemes():
    return sorted(n for n, c in REGISTRY.items() if c.max_len_of is PositionalEncoding.max_len_of)


@dataclass
class Context:
    q_pos: torch.Tensor  # [Tq] absolute positions of the queries (= of the new keys)
    k_pos: torch.Tensor  # [Tk] absolute positions of all keys (cache + new)
    extra: dict = None   # scheme-specific precomputation (e.g. cos/sin)


# -----------------------------------------------------------------------------
# pure functions where the math lives (tests call these directly)

def sinusoidal_table(n_pos, dim, positions=None):
    """Vaswani et al. 2017 (arXiv 1706.03762), section 3.5, the paper's layout:
    PE[p, 2i] = sin(p / 10000^(2i/dim)),  PE[p, 2i+1] = cos(p / 10000^(2i/dim)).
    Interleaved sin/cos (fairseq/tensor2tensor concatenate instead; not the paper)."""
    assert dim % 2 == 0, f"sinusoidal embedding needs an even dim, got {dim}"
    pos = torch.arange(n_pos, dtype=torch.float64) if positions is None else positions.double()
    inv = 10000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # [dim/2]
    ang = pos[:, None] * inv[None, :]
    pe = torch.stack([ang.sin(), ang.cos()], dim=-1).reshape(len(pos), dim)  # interleave
    return pe.float()


# RoPE context extension: the keys each scaling type takes (besides 'type'),
# with defaults (None = required). See rope_frequencies.
ROPE_SCALING_KEYS = {
    'linear': {'factor': None},
    'ntk': {'factor': None},
    'dynamic': {'factor': None, 'original_max_len': None},
    'yarn': {'factor': None, 'original_max_len': None, 'beta_fast': 32.0, 'beta_slow': 1.0},
    'llama3': {'factor': None, 'original_max_len': None, 'low_freq_factor': 1.0, 'high_freq_factor': 4.0},
}


def check_rope_scaling(scaling):
    """Validate a rope_scaling dict; return it with defaults filled in. Errors name the fix."""
    example = "e.g. {'type': 'yarn', 'factor': 4, 'original_max_len': 128}"
    if not isinstance(scaling, dict) or 'type' not in scaling:
        raise ValueError(f"rope_scaling must be a dict with a 'type', {example}; got {scaling!r}")
    kind = scaling['type']
    if kind not in ROPE_SCALING_KEYS:
        raise ValueError(f"unknown rope_scaling type {kind!r}; valid types: {', '.join(ROPE_SCALING_KEYS)}")
    keys = ROPE_SCALING_KEYS[kind]
    unknown = sorted(set(scaling) - set(keys) - {'type'})
    if unknown:
        raise ValueError(f"rope_scaling type {kind!r} does not take {unknown}; its keys are: "
                         f"{', '.join(keys)}")
    out = {'type': kind}
    for k, default in keys.items():
        v = scaling.get(k, default)
        if v is None:
            raise ValueError(f"rope_scaling type {kind!r} needs {k!r} ({example}); got {scaling!r}")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"rope_scaling {k!r} must be a number, got {v!r}")
        out[k] = v
    if out['factor'] < 1:
        raise ValueError(f"rope_scaling factor must be >= 1 (the context is extended s times), "
                         f"got {out['factor']!r}")
    if out.get('original_max_len', 1) <= 0:
        raise ValueError(f"rope_scaling original_max_len must be the positive training length, "
                         f"got {out['original_max_len']!r}")
    if kind == 'yarn' and not out['beta_fast'] > out['beta_slow'] > 0:
        raise ValueError(f"yarn needs beta_fast > beta_slow > 0, got {out['beta_fast']}, {out['beta_slow']}")
    if kind == 'llama3' and not out['high_freq_factor'] > out['low_freq_factor'] > 0:
        raise ValueError(f"llama3 needs high_freq_factor > low_freq_factor > 0, got "
                         f"{out['high_freq_factor']}, {out['low_freq_factor']}")
    return out


def rope_frequencies(dim, base=10000.0, scaling=None, seq_len=None):
    """RoPE inverse frequencies inv_freq[i] = base^(-2i/dim), i = 0..dim/2-1 (float32),
    and the attention factor that multiplies cos and sin (1.0 without scaling).
    `scaling` is a context-extension dict {'type': ..., 'factor': s, ...} (s > 1
    stretches a model trained at L = original_max_len to s*L):
      linear  Position Interpolation (arXiv 2306.15595): inv_freq / s (= positions / s).
      ntk     NTK-aware (bloc97 2023; as stated in arXiv 2309.00071 sec. 3.1):
              base * s^(d/(d-2)); the highest frequency is unchanged, the
              lowest divided by exactly s.
      dynamic dynamic NTK (emozilla 2023; arXiv 2309.00071 sec. 3.3): ntk with
              the factor recomputed from the current length L' = max(seq_len, L):
              base * (s*L'/L - (s-1))^(d/(d-2)); plain RoPE at seq_len <= L
              (seq_len=None counts as <= L).
      yarn    YaRN (arXiv 2309.00071): NTK-by-parts, pairs that turn fewer than
              beta_slow times over L are interpolated (/s), more than beta_fast times
              kept, a linear ramp between; attention factor 0.1*ln(s) + 1 on cos and
              sin, so the logits scale by its square.
      llama3  Llama 3.1 (Meta's reference code; model: arXiv 2407.21783): pairs
              with wavelength 2*pi/f < L/high_freq_factor kept, > L/low_freq_factor
              divided by s, a smooth blend in between (strict inequalities).
    Computed in float64, returned as float32."""
    if dim % 2 != 0:
        raise ValueError(f"rotary dimension must be even, got {dim}: pick head_dim/rotary_pct so that "
                         f"head_dim * rotary_pct is an even integer")
    inv = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    if scaling is None:
        return inv.float(), 1.0
    sc = check_rope_scaling(scaling)
    kind, s = sc['type'], float(sc['factor'])
    if kind in ('ntk', 'dynamic') and dim <= 2:
        raise ValueError(f"{kind} scaling changes the base by s^(d/(d-2)) and needs a rotary dim > 2, got {dim}")
    attn = 1.0
    if kind == 'linear':
        inv = inv / s
    elif kind == 'ntk':
        inv = (base * s ** (dim / (dim - 2))) ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    elif kind == 'dynamic':
        L = sc['original_max_len']
        Lp = max(seq_len or 0, L)
        if Lp > L:  # identical to plain RoPE up to L (factor below is 1 there)
            b = base * (s * Lp / L - (s - 1)) ** (dim / (dim - 2))
            inv = b ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    elif kind == 'yarn':
        L = sc['original_max_len']

        def corr_dim(n_rot):  # the pair index i whose wavelength fits n_rot times into L
            return dim * math.log(L / (n_rot * 2 * math.pi)) / (2 * math.log(base))
        low = max(math.floor(corr_dim(sc['beta_fast'])), 0)
        high = min(math.ceil(corr_dim(sc['beta_slow'])), dim - 1)
        if low == high:
            high += 0.001  # avoid 0/0 in the ramp
        ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        inv = inv * (1 - ramp) + (inv / s) * ramp
        attn = 0.1 * math.log(s) + 1.0 if s > 1 else 1.0
    elif kind == 'llama3':
        L, lo, hi = sc['original_max_len'], sc['low_freq_factor'], sc['high_freq_factor']
        wavelen = 2 * math.pi / inv
        smooth = (L / wavelen - lo) / (hi - lo)
        mid = (1 - smooth) * inv / s + smooth * inv
        inv = torch.where(wavelen < L / hi, inv, torch.where(wavelen > L / lo, inv / s, mid))
    return inv.float(), attn


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


def rotate_half(x):
    """Half-split layout (GPT-NeoX, HF Llama): pairs are (i, i + d/2)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x, cos, sin):
    """Rotate the first cos.size(-1) dims of x, pass the rest through (partial rotary).
    cos/sin: [T, rot_dim] in float32, already multiplied by the attention factor."""
    rot = cos.size(-1)
    xr, xp = x[..., :rot], x[..., rot:]
    xr = (xr.float() * cos + rotate_half(xr.float()) * sin).to(x.dtype)
    return torch.cat((xr, xp), dim=-1) if xp.size(-1) else xr


# -----------------------------------------------------------------------------
# the schemes

class PositionalEncoding(nn.Module):
    """Base class and the 'none' behaviour for every hook."""
    name = None

    def __init__(self, config):
        super().__init__()
        self.n_embd, self.n_head = config.n_embd, config.n_head
        self.head_dim = config.n_embd // config.n_head
        self.block_size = config.block_size

    def max_len_of(self):
        """Largest number of positions this scheme can address; None = unbounded."""
        return None

    @property
    def max_len(self):
        return self.max_len_of()

    def embed(self, x, pos):
        return x

    def new_layer(self):
        return None

    def context(self, q_pos, k_pos):
        return Context(q_pos, k_pos, {})

    def transform_qk(self, q, k, ctx, layer):
        return q, k

    def score_mod(self, q, ctx, layer):
        return None

    def extra_repr(self):
        return f"name={self.name}"


@register('none')
class NoPE(PositionalEncoding):
    """NoPE: no positional information at all (Kazemnejad et al., arXiv 2305.19466;
    Haviv et al., arXiv 2203.16634). A causal decoder still learns position,
    because the causal mask leaks it (the number of attended tokens differs per row)."""


@register('learned')
class Learned(PositionalEncoding):
    """Learned absolute position embeddings (GPT-2 / GPT, Radford et al. 2018/2019;
    also arXiv 1706.03762 section 3.5). x_p = tok_p + W[p], W a [max_len, n_embd]
    table initialised N(0, 0.02). Cannot address positions >= max_len (default
    block_size): asking for them is an error, not a silent clamp.
    Options: max_len (int, default block_size)."""

    def __init__(self, config, max_len=None):
        super().__init__(config)
        self.table_len = max_len or config.block_size
        self.wpe = nn.Embedding(self.table_len, config.n_embd)
        nn.init.normal_(self.wpe.weight, mean=0.0, std=0.02)

    def max_len_of(self):
        return self.table_len

    def embed(self, x, pos):
        if pos.numel() and int(pos.max()) >= self.table_len:
            raise ValueError(
                f"learned position embeddings have {self.table_len} positions, but position "
                f"{int(pos.max())} was requested. Evaluate/sample with at most {self.table_len} tokens "
                f"of context (sample.py does this with a sliding window), or train a scheme that "
                f"extrapolates: {', '.join(extrapolating_schemes())}")
        return x + self.wpe(pos)


@register('sinusoidal')
class Sinusoidal(PositionalEncoding):
    """Fixed sinusoidal embeddings (Vaswani et al., arXiv 1706.03762, section 3.5):
    PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(same), interleaved.
    As in the paper (section 3.4) token embeddings are multiplied by sqrt(d_model)
    before PE is added, so neither term swamps the other. Computed for any
    position on the fly: there is no table to run past."""

    def embed(self, x, pos):
        pe = sinusoidal_table(0, self.n_embd, positions=pos).to(x.device, x.dtype)
        return x * math.sqrt(self.n_embd) + pe


@register('rope')
class RoPE(PositionalEncoding):
    """Rotary position embedding (Su et al., arXiv 2104.09864), half-split layout
    as in GPT-NeoX / HF Llama: q' = q*cos(p*theta) + rotate_half(q)*sin(p*theta),
    theta_i = base^(-2i/d), d = rot_dim. q'.k' depends only on the offset n - m.
    Options: base (default 10000; Llama 3 uses 500000), rotary_pct (fraction of
    head_dim rotated, default 1.0; GPT-NeoX uses 0.25), scaling (context-extension
    dict, see rope_frequencies; config.rope_scaling overrides it at run time, and
    original_max_len defaults to block_size).

    cos/sin (float32, times the attention factor) are computed once per forward,
    shared by all layers, from a table cached by length and extended on demand.
    The table is keyed on the frequencies: fixed for every type but 'dynamic',
    whose frequencies follow the current length len(k_pos) (cache + new tokens).

    Dynamic NTK with a KV cache (a deliberate choice, as in HF transformers): each
    forward uses the frequencies of its current total length for its queries and
    its new keys; keys already in the cache keep the rotation they got when they
    were new. So up to L tokens decoding equals a full forward exactly; past L the
    cached keys are rotated with older (less stretched) frequencies than a full
    forward over the same tokens would use -- the method's known inconsistency.
    Re-rotating the cache every step would need unrotated keys in the cache; for
    the exact method, sample with use_cache=False (recompute each step)."""
    uses_rope_scaling = True

    def __init__(self, config, base=10000.0, rotary_pct=1.0, scaling=None):
        super().__init__(config)
        self.base = float(base)
        rd = self.head_dim * rotary_pct
        if rd != int(rd) or int(rd) % 2 or rd <= 0:
            raise ValueError(f"rotary dimension head_dim*rotary_pct = {self.head_dim}*{rotary_pct} = {rd} "
                             f"must be a positive even integer; change rotary_pct or n_embd/n_head")
        self.rot_dim = int(rd)
        scaling = getattr(config, 'rope_scaling', None) or scaling
        if scaling is not None:
            if isinstance(scaling, dict) and scaling.get('type') in ('dynamic', 'yarn', 'llama3'):
                scaling = {'original_max_len': config.block_size, **scaling}
            scaling = check_rope_scaling(scaling)
        self.scaling = scaling
        self.dynamic = scaling is not None and scaling['type'] == 'dynamic'
        inv_freq, self.attention_factor = rope_frequencies(self.rot_dim, self.base, self.scaling)
        self.register_buffer('inv_freq', inv_freq, persistent=False)  # at lengths <= L
        self._table = (None, None, None)  # (key, cos, sin); not a buffer: stays float32

    def freq_key(self, seq_len):
        """What the frequencies depend on: nothing, or (dynamic) the effective length."""
        return max(seq_len, self.scaling['original_max_len']) if self.dynamic else 0

    def cos_sin(self, n, device):
        """cos, sin [>= n, rot_dim] for positions 0.. with the frequencies of length n."""
        key = (self.freq_key(n), str(device))
        old_key, cos, sin = self._table
        if old_key != key or cos.size(0) < n:
            inv = self.inv_freq
            if self.dynamic and key[0] > self.scaling['original_max_len']:
                inv = rope_frequencies(self.rot_dim, self.base, self.scaling, seq_len=n)[0].to(device)
            # static frequencies: grow geometrically, so decoding extends the table rarely
            size = n if self.dynamic else max(n, 2 * cos.size(0) if old_key == key else 0)
            ang = torch.arange(size, device=device, dtype=torch.float32)[:, None] * inv.float().to(device)[None, :]
            emb = torch.cat((ang, ang), dim=-1)
            cos, sin = emb.cos() * self.attention_factor, emb.sin() * self.attention_factor
            self._table = (key, cos, sin)
        return cos, sin

    def context(self, q_pos, k_pos):
        # model.py's keys are positions 0..Tk-1, so the current length is len(k_pos)
        cos, sin = self.cos_sin(max(k_pos.numel(), q_pos.numel()), q_pos.device)
        return Context(q_pos, k_pos, {'cos': cos[q_pos], 'sin': sin[q_pos]})

    def transform_qk(self, q, k, ctx, layer):
        cos, sin = ctx.extra['cos'], ctx.extra['sin']
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)


@register('alibi')
class ALiBi(PositionalEncoding):
    """Attention with Linear Biases (Press et al., arXiv 2108.12409):
    logit_ij += -m_h * (i - j) for key j <= query i, slopes m_h from alibi_slopes().
    Added after the 1/sqrt(d) scaling, not divided by it. No embedding is added."""

    def __init__(self, config):
        super().__init__(config)
        self.register_buffer('slopes', alibi_slopes(config.n_head), persistent=False)

    def score_mod(self, q, ctx, layer):
        slopes = self.slopes

        def mod(score, b, h, qp, kp):
            return score + slopes[h] * (kp - qp)
        return mod
