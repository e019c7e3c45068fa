"""
RoPE context extension for nanoPE: the rope_scaling schema and its checks, `rope_frequencies`
(plain RoPE, linear / NTK / dynamic NTK / YaRN / Llama 3 / LongRoPE frequencies, p-RoPE), and
the distance maps of the inference-time extensions Self-Extend, (Leaky) ReRoPE and STRING, whose attention
is positional.ExtendedRoPE's. The RoPE-family schemes in positional.py read their frequencies from here.
"""

import math

import torch


# RoPE context extension: the keys each scaling type takes (besides 'type'),
# with defaults (None = required, OPTIONAL = may be left out, no default).
# See rope_frequencies.
class _Optional:
    def __repr__(self):
        return 'OPTIONAL'


OPTIONAL = _Optional()
# STRING's defaults, from the authors' code (github.com/HKUNLP/STRING, string_for_llama.py and the README):
# shifted_offset = 0.33 x the length, small_local_value = 128, and cos and sin multiplied by 0.1 ln 2 + 1
STRING_SHIFT_RATIO, STRING_ATTENTION_FACTOR = 0.33, 0.1 * math.log(2) + 1

ROPE_SCALING_KEYS = {
    'linear': {'factor': None},
    'ntk': {'factor': None},
    'dynamic': {'factor': None, 'original_max_len': None},
    'yarn': {'factor': None, 'original_max_len': None, 'beta_fast': 32.0, 'beta_slow': 1.0,
             'attention_factor': OPTIONAL, 'mscale': OPTIONAL, 'mscale_all_dim': OPTIONAL, 'truncate': True},
    'llama3': {'factor': None, 'original_max_len': None, 'low_freq_factor': 1.0, 'high_freq_factor': 4.0},
    'longrope': {'short_factor': None, 'long_factor': None, 'original_max_len': None, 'factor': None,
                 'attention_factor': OPTIONAL},
    # inference-time extensions: frequencies unchanged, two logit maps (ExtendedRoPE.attention)
    'self_extend': {'window': None, 'group': None},
    'rerope': {'window': None},
    'leaky_rerope': {'window': None, 'k': 16.0},
    # STRING: 'shift' S (resolve_rope_scaling fills in int(0.33 * block_size) when it is left out), 'local' W
    'string': {'shift': None, 'local': 128, 'attention_factor': STRING_ATTENTION_FACTOR},
}
EXTENSION_TYPES = ('self_extend', 'rerope', 'leaky_rerope', 'string')
_LIST_KEYS = ('short_factor', 'long_factor')  # per-pair lists (everything else is a number or a bool)
_BOOL_KEYS = ('truncate',)
# types whose frequencies depend on the current length (rope_frequencies' seq_len)
LENGTH_DEPENDENT_SCALING = ('dynamic', 'longrope')
_EXAMPLES = {
    'longrope': "e.g. {'type': 'longrope', 'short_factor': [1.0] * (rot_dim // 2), "
                "'long_factor': [1.0, ..., 4.0], 'original_max_len': 128, 'factor': 4}",
}


def resolve_rope_scaling(config, scaling=None, static_only=False):
    """The scaling a RoPE-family scheme applies: config.rope_scaling (run-time override)
    or the scheme's own option, validated, original_max_len defaulting to block_size.
    longrope without 'factor': s = block_size / original_max_len (at least 1), nanoPE's
    counterpart of HF's max_position_embeddings / original_max_position_embeddings
    (block_size is the length the model is configured for, e.g. after fine-tuning at
    s*L). A run-time override on a model trained at L therefore gets s = 1 and
    attention factor 1 unless 'factor' (target length / L) is given."""
    scaling = getattr(config, 'rope_scaling', None) or scaling
    if scaling is None:
        return None
    if isinstance(scaling, dict) and scaling.get('type') in ('dynamic', 'yarn', 'llama3', 'longrope'):
        scaling = {'original_max_len': config.block_size, **scaling}
    if isinstance(scaling, dict) and scaling.get('type') == 'string' and scaling.get('shift') is None:
        scaling = {**scaling, 'shift': int(STRING_SHIFT_RATIO * config.block_size)}
    if isinstance(scaling, dict) and scaling.get('type') == 'longrope' and scaling.get('factor') is None:
        L = scaling['original_max_len']
        if isinstance(L, (int, float)) and not isinstance(L, bool) and L > 0:
            scaling = {**scaling, 'factor': max(1.0, config.block_size / L)}
    scaling = check_rope_scaling(scaling)
    if static_only and scaling['type'] in ('dynamic',) + EXTENSION_TYPES:
        raise ValueError(f"rope_scaling type {scaling['type']!r} is implemented for pos_encoding='rope' only; use a "
                         f"static type here (linear, ntk, yarn, llama3, longrope)")
    return scaling


def is_number(v):
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)


def check_rope_scaling(scaling):
    """Validate a rope_scaling dict; return it with defaults filled in (optional keys
    that were left out stay out). Errors name the fix."""
    example = "e.g. {'type': 'yarn', 'factor': 4, 'original_max_len': 128}"
    if not isinstance(scaling, dict) or 'type' not in scaling:
        raise ValueError(f"rope_scaling must be a dict with a 'type', {example}; got {scaling!r}")
    kind = scaling['type']
    if kind not in ROPE_SCALING_KEYS:
        raise ValueError(f"unknown rope_scaling type {kind!r}; valid types: {', '.join(ROPE_SCALING_KEYS)}")
    example = _EXAMPLES.get(kind, example)
    keys = ROPE_SCALING_KEYS[kind]
    unknown = sorted(set(scaling) - set(keys) - {'type'})
    if unknown:
        raise ValueError(f"rope_scaling type {kind!r} does not take {unknown}; its keys are: "
                         f"{', '.join(keys)}")
    out = {'type': kind}
    for k, default in keys.items():
        v = scaling.get(k, default)
        if v is OPTIONAL or (v is None and default is OPTIONAL):
            continue
        if v is None:
            raise ValueError(f"rope_scaling type {kind!r} needs {k!r} ({example}); got {scaling!r}")
        if k in _LIST_KEYS:
            if not isinstance(v, (list, tuple)) or not v or not all(is_number(x) and x > 0 for x in v):
                raise ValueError(f"rope_scaling {k!r} must be a non-empty list of positive numbers, one "
                                 f"per rotary pair (rot_dim/2 of them), got {v!r}")
            v = [float(x) for x in v]
        elif k in _BOOL_KEYS:
            if not isinstance(v, bool):
                raise ValueError(f"rope_scaling {k!r} must be True or False, got {v!r}")
        elif not is_number(v):
            raise ValueError(f"rope_scaling {k!r} must be a number, got {v!r}")
        out[k] = v
    if kind in EXTENSION_TYPES:  # validated by their distance maps
        if kind == 'self_extend':
            self_extend_positions(torch.zeros(1), torch.zeros(1), out['window'], out['group'])
        elif kind == 'string':
            string_positions(torch.zeros(1), torch.zeros(1), out['shift'], out['local'])
            if out['attention_factor'] <= 0:
                raise ValueError(f"STRING's attention_factor multiplies cos and sin and must be > 0, got "
                                 f"{out['attention_factor']!r}")
        else:
            rerope_positions(torch.zeros(1), torch.zeros(1), out['window'], out.get('k'))
        return out
    if out['factor'] < 1:
        raise ValueError(f"rope_scaling factor must be >= 1 (the context is extended s times), "
                         f"got {out['factor']!r}")
    if out.get('original_max_len', 1) <= 0:
        raise ValueError(f"rope_scaling original_max_len must be the positive training length, "
                         f"got {out['original_max_len']!r}")
    if kind == 'yarn' and not out['beta_fast'] > out['beta_slow'] > 0:
        raise ValueError(f"yarn needs beta_fast > beta_slow > 0, got {out['beta_fast']}, {out['beta_slow']}")
    if out.get('attention_factor', 1) <= 0:
        raise ValueError(f"rope_scaling attention_factor multiplies cos and sin and must be > 0, got "
                         f"{out['attention_factor']!r}; leave it out for the method's default")
    for k in ('mscale', 'mscale_all_dim'):
        if out.get(k, 0) < 0:
            raise ValueError(f"yarn {k} must be >= 0 (0 or absent = not given, as in HF), got {out[k]!r}")
    if kind == 'llama3' and not out['high_freq_factor'] > out['low_freq_factor'] > 0:
        raise ValueError(f"llama3 needs high_freq_factor > low_freq_factor > 0, got "
                         f"{out['high_freq_factor']}, {out['low_freq_factor']}")
    if kind == 'longrope' and len(out['short_factor']) != len(out['long_factor']):
        raise ValueError(f"longrope short_factor and long_factor must have the same length (rot_dim/2 each), "
                         f"got {len(out['short_factor'])} and {len(out['long_factor'])}")
    return out


def yarn_get_mscale(s, m=1.0):
    """YaRN's attention temperature factor 0.1*m*ln(s) + 1 (1 when s <= 1): m = 1 is
    the paper's sqrt(1/t) (arXiv 2309.00071 eq. 22); DeepSeek-V2/V3 scale ln(s) by mscale."""
    return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0


def rope_frequencies(dim, base=10000.0, scaling=None, seq_len=None, p_rope=None):
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
              (seq_len=None counts as <= L). A function of the current length
              only: unlike HF transformers, whose buffer keeps the frequencies of
              the longest length seen until a call shorter than L resets them
              (so a 2L call after a 4L call gets the 4L frequencies there), here
              a 2L call always gets the 2L frequencies, whatever came before.
      yarn    YaRN (arXiv 2309.00071): NTK-by-parts, pairs that turn fewer than
              beta_slow times over L are interpolated (/s), more than beta_fast times
              kept, a linear ramp between. The correction range [low, high] is
              floored/ceiled to whole pairs (truncate=True, the paper and HF's
              default); truncate=False keeps it fractional (gpt-oss). Attention
              factor on cos and sin (so the logits scale by its square):
              attention_factor if given; else, when mscale and mscale_all_dim are
              both given and non-zero, get_mscale(s, mscale)/get_mscale(s, mscale_all_dim)
              (DeepSeek-V2/V3; 1.0 when they are equal); else get_mscale(s) =
              0.1*ln(s) + 1 -- a lone mscale or mscale_all_dim is ignored, as in HF.
              (DeepSeek's models also multiply the softmax scale by
              get_mscale(s, mscale_all_dim)^2 in their attention code; that is not
              a RoPE quantity and is not applied here.)
      llama3  Llama 3.1 (Meta's reference code; model: arXiv 2407.21783): pairs
              with wavelength 2*pi/f < L/high_freq_factor kept, > L/low_freq_factor
              divided by s, a smooth blend in between (strict inequalities).
      longrope LongRoPE (arXiv 2402.13753; Phi-3), as HF transformers: per-pair
              rescale factors inv_freq_i = 1 / (ext_i * base^(2i/dim)), ext =
              long_factor when seq_len > original_max_len (strictly; seq_len is the
              current total length, HF's max(position_ids) + 1), else short_factor
              (also for seq_len=None). Lists of dim/2 numbers. Attention factor:
              attention_factor if given, else sqrt(1 + ln s / ln L) (1 if s <= 1),
              the same for both lists. See resolve_rope_scaling for s when
              'factor' is left out.
    p_rope: p-RoPE (Barbero et al., arXiv 2410.06205; HF's 'proportional', Gemma):
      rotate only the highest-frequency fraction p of the pairs. The frequencies
      above are computed over the full `dim` (the head dim), then pairs
      i >= floor(p*dim/2) get frequency 0 (cos = 1, sin = 0: not rotated). Unlike
      partial rotary (rotary_pct), the exponent's denominator stays the full dim.
      With linear scaling this is exactly HF's proportional with its `factor`
      (HF divides every inv_freq by factor, default 1).
    Computed in float64, returned as float32."""
    if dim % 2 != 0:
        raise ValueError(f"rotary dimension must be even, got {dim}: pick head_dim/rotary_pct so that "
                         f"head_dim * rotary_pct is an even integer")
    if p_rope is not None and not (is_number(p_rope) and 0 <= p_rope <= 1):
        raise ValueError(f"p_rope is the fraction of rotary pairs rotated and must be in [0, 1], got {p_rope!r}")
    idx = torch.arange(0, dim, 2, dtype=torch.float64) / dim  # 2i/dim
    inv = base ** -idx
    attn = 1.0
    if scaling is not None:
        inv, attn = _scaled_frequencies(inv, dim, base, check_rope_scaling(scaling), seq_len)
    if p_rope is not None:
        n_rot = int(p_rope * dim // 2)  # floor(p*dim/2) rotated pairs (HF: int(p * head_dim // 2))
        inv = torch.where(torch.arange(dim // 2) < n_rot, inv, torch.zeros_like(inv))
    return inv.float(), attn


def _scaled_frequencies(inv, dim, base, sc, seq_len):
    """rope_frequencies' scaling types: (inv_freq float64, attention factor)."""
    if sc['type'] in EXTENSION_TYPES:  # they change the distances scored (ExtendedRoPE.attention), not the frequencies
        return inv, float(sc.get('attention_factor', 1.0))  # STRING's factor on cos and sin
    kind, s = sc['type'], float(sc['factor'])
    if kind in ('ntk', 'dynamic') and dim <= 2:
        raise ValueError(f"{kind} scaling changes the base by s^(d/(d-2)) and needs a rotary dim > 2, got {dim}")
    idx = torch.arange(0, dim, 2, dtype=torch.float64) / dim
    attn = 1.0
    if kind == 'linear':
        inv = inv / s
    elif kind == 'ntk':
        inv = (base * s ** (dim / (dim - 2))) ** -idx
    elif kind == 'dynamic':
        L = sc['original_max_len']
        Lp = max(seq_len or 0, L)
        if Lp > L:  # identical to plain RoPE up to L (factor below is 1 there)
            inv = (base * (s * Lp / L - (s - 1)) ** (dim / (dim - 2))) ** -idx
    elif kind == 'yarn':
        L = sc['original_max_len']

        def corr_dim(n_rot):  # the pair index i whose wavelength fits n_rot times into L
            return dim * math.log(L / (n_rot * 2 * math.pi)) / (2 * math.log(base))
        low, high = corr_dim(sc['beta_fast']), corr_dim(sc['beta_slow'])
        if sc['truncate']:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001  # avoid 0/0 in the ramp
        ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        inv = inv * (1 - ramp) + (inv / s) * ramp
        if 'attention_factor' in sc:
            attn = float(sc['attention_factor'])
        elif sc.get('mscale') and sc.get('mscale_all_dim'):  # HF: both given and non-zero
            attn = yarn_get_mscale(s, sc['mscale']) / yarn_get_mscale(s, sc['mscale_all_dim'])
        else:
            attn = yarn_get_mscale(s)
    elif kind == 'llama3':
        L, lo, hi = sc['original_max_len'], sc['low_freq_factor'], sc['high_freq_factor']
        wavelen = 2 * math.pi / inv
        smooth = (L / wavelen - lo) / (hi - lo)
        mid = (1 - smooth) * inv / s + smooth * inv
        inv = torch.where(wavelen < L / hi, inv, torch.where(wavelen > L / lo, inv / s, mid))
    elif kind == 'longrope':
        L = sc['original_max_len']
        use_long = seq_len is not None and seq_len > L
        name = 'long_factor' if use_long else 'short_factor'
        for k in ('short_factor', 'long_factor'):
            if len(sc[k]) != dim // 2:
                raise ValueError(f"longrope {k!r} has {len(sc[k])} entries, but the rotary dimension {dim} has "
                                 f"{dim // 2} pairs: give one factor per pair (rot_dim/2 = {dim // 2})")
        ext = torch.tensor(sc[name], dtype=torch.float64)
        inv = 1.0 / (ext * base ** idx)
        if 'attention_factor' in sc:
            attn = float(sc['attention_factor'])
        else:
            attn = 1.0 if s <= 1 else math.sqrt(1 + math.log(s) / math.log(L))
    return inv, attn


def _rel(q_pos, k_pos):
    q_pos, k_pos = torch.as_tensor(q_pos, dtype=torch.int64), torch.as_tensor(k_pos, dtype=torch.int64)
    return q_pos, k_pos, q_pos[:, None] - k_pos[None, :]  # r = i - j, [Tq, Tk]


def self_extend_positions(q_pos, k_pos, window, group):
    """Self-Extend (Jin et al., "LLM Maybe LongLM", arXiv 2401.01325): the relative
    distance each (query i, key j) pair is scored at, [Tq, Tk] int64. With r = i - j:
      r < window:  r  (neighbour attention: exact positions)
      otherwise:   i//G - j//G + (window - window//G)  (grouped attention, G = group)
    The merge is strict (r < window is exact), as the authors' code
    (github.com/datamllab/LongLM): its neighbour mask is the causal triangle minus
    the triangle j <= i - window. The shift makes the grouped distances continue
    where the window ends; the authors' first patch and their flash-attention
    decode path use window - window//G (integer positions, used here), their later
    eager patch window - window/G in float: identical when G divides the window.
    Keys after the query (r < 0, masked by causality) get r. The largest distance
    at n tokens is about window + n/G, so a model trained at L covers n up to
    about G*(L - window) + window.

    Realised with RoPE (attention side): two rotations and two logit maps,
      neighbour: q rotated at i,                               k at j
      grouped:   q rotated at i//G + window - window//G,       k at j//G
    (RoPE scores depend only on the difference of the two positions, so the
    grouped map scores every pair at exactly the distance above), then
    logits = where(i - j < window, neighbour, grouped), causal mask, softmax.
    Both key rotations depend on j only, so both can be cached (the authors cache
    them); for a single decoded query it is cheaper to leave q unrotated and rotate
    each (unrotated) cached key by -d_ij with d = this map, i.e. one attention pass."""
    if not (is_number(window) and is_number(group)) or int(window) != window or window < 1 \
            or int(group) != group or group < 1:
        raise ValueError(f"self-extend needs integer window >= 1 and group >= 1, got window={window!r}, "
                         f"group={group!r}")
    window, group = int(window), int(group)
    q_pos, k_pos, r = _rel(q_pos, k_pos)
    grouped = q_pos[:, None] // group - k_pos[None, :] // group + (window - window // group)
    return torch.where(r < window, r, grouped)


def rerope_positions(q_pos, k_pos, window, leaky_k=None):
    """ReRoPE / Leaky ReRoPE (Su 2023, kexue.fm/archives/9708, code: github.com/bojone/rerope):
    the relative distance each (query i, key j) pair is scored at, [Tq, Tk]. With r = i - j:
      ReRoPE (leaky_k=None): min(r, window), int64 -- every key at or beyond the
        window is scored as if it were exactly `window` back;
      Leaky ReRoPE (leaky_k = k >= 1; Su uses 16): r for r < window, else
        window + (r - window)/k, float64 (continuous at r = window; distances
        beyond grow k times slower).
    Keys after the query (r < 0, masked by causality) get r.

    Realised with RoPE (attention side, as Su's patches): two logit maps,
      exact:   q rotated at i, k at j                                     (r < window)
      ReRoPE:  q rotated at position `window`, k not rotated (position 0)
      leaky:   RoPE with inv_freq / k (linear scaling by k),
               q rotated at i + window*(k - 1), k at j
    then logits = where(i - j < window, exact, second), causal mask, softmax. Every
    key rotation depends on j only, so a KV cache can hold both rotated copies of
    the keys; Su's patches instead cache unrotated keys and, per decoded query,
    rotate each cached key by -d_ij (d = this map) with q unrotated -- one
    attention pass per step, O(cache) rotations. Su's patches also multiply q by
    max(1, log(i + 1)/log(L)) (log-n scaling, L = training length); that is a
    separate choice, not part of this map."""
    if not is_number(window) or int(window) != window or window < 1:
        raise ValueError(f"rerope window must be a positive integer number of positions, got {window!r}")
    if leaky_k is not None and not (is_number(leaky_k) and leaky_k >= 1):
        raise ValueError(f"leaky ReRoPE's leaky_k divides the distances beyond the window and must be >= 1 "
                         f"(leaky_k=None for plain ReRoPE), got {leaky_k!r}")
    window = int(window)
    _, _, r = _rel(q_pos, k_pos)
    if leaky_k is None:
        return torch.clamp(r, max=window)
    r = r.double()
    return torch.where(r < window, r, window + (r - window) / leaky_k)


def string_positions(q_pos, k_pos, shift, local):
    """STRING, ShifTed Rotary position embeddING (An et al., "Why Does the Effective Context Length of
    LLMs Fall Short?", arXiv 2410.18745; code: github.com/HKUNLP/STRING, string_for_llama.py): the relative
    distance each (query i, key j) pair is scored at, [Tq, Tk] int64. With r = i - j, S = shift, W = local:
      r < S:      r               (neighbour attention: exact positions)
      otherwise:  r - S + W       (shifted attention: the well-trained small distances reused far away)
    so the largest distances, rarely trained, are dropped: at n tokens the largest is n - 1 - S + W.
    Keys after the query (r < 0, masked by causality) get r. The authors' defaults: S = 0.33 x the length
    (their shifted_ratio times the test length; the README sets it from max_position_embeddings), W = 128.
    The merge is strict (r < S is exact) as in the paper's position matrix and the authors' decoding path,
    which splits the cache into the last S keys (distances 0..S-1) and the rest; their prefill path runs
    flash-attention with window_size=[S, 0], which is inclusive, so there the key at distance exactly S is
    scored twice, at S and at W. Followed here: the decoding path (one logit per pair), so that decoding
    with a KV cache equals a full forward.

    Realised with RoPE (attention side), as the authors' code: two logit maps,
      neighbour:  q rotated at i,          k at j
      shifted:    q rotated at i - S + W,  k at j
    logits = where(i - j < S, neighbour, shifted), causal mask, softmax; their code merges the two
    flash-attention outputs by their log-sum-exps, the same softmax. Their code also multiplies cos and sin
    by 0.1 ln 2 + 1 (an attention factor as YaRN's, so the logits scale by its square); that is not part of
    this map (rope_scaling 'attention_factor')."""
    if not (is_number(shift) and is_number(local)) or int(shift) != shift or int(local) != local or shift < 1 \
            or not 0 <= local <= shift:
        raise ValueError(f"STRING needs integers shift >= 1 and 0 <= local <= shift (distances from shift on are "
                         f"moved down by shift - local; the authors use local = 128 with shift = 0.33 x a length "
                         f"of 128K tokens: at a smaller scale give a smaller local), got shift={shift!r}, "
                         f"local={local!r}")
    shift, local = int(shift), int(local)
    _, _, r = _rel(q_pos, k_pos)
    return torch.where(r < shift, r, r - shift + local)
