"""
Per-layer stacks and attention scaling (GPTConfig fields, any scheme; build()
returns a LayerStack wrapper when one is set, the plain scheme otherwise):
  nope_layers    int k: layers k-1, 2k-1, ... run NoPE (every k-th, the last of
                 each group: SmolLM3's and Llama 4's (i + 1) % k == 0; Cohere's
                 RNoPE); or a list of layer indices. 0/None/[] = off.
  layer_options  {layer index: dict}: pos_options overrides for those layers
                 (e.g. Gemma 3's global layers: {'base': 1e6} every 6th layer over
                 pos_options {'base': 1e4}; its 4B-27B models also give the global
                 layers {'scaling': {'type': 'linear', 'factor': 8}}). Layers with equal options share one
                 scheme instance (and its global parameters, e.g. xl's u, v).
  attn_scaling   {'type': 'logn' | 'ssmax' | 'llama4', ..., 'layers': ...}: logit
                 scaling by the query's key count or position (see check_attn_scaling);
                 usable at run time on a checkpoint trained without it (the
                 stack saves and loads under the plain scheme's state-dict keys).
The wrapper's new_layer() is called once per layer in order (model.py builds the
blocks in order) and returns a module that knows its layer index; every hook
delegates to that layer's scheme, or does nothing on a NoPE layer. Schemes that
embed positions (learned, sinusoidal) act once before block 0, for all layers,
so they refuse nope_layers and layer_options (attn_scaling works with them).
"""

import math

import torch
import torch.nn as nn

from positional import REGISTRY, NoPE, PositionalEncoding, make_context
from rope_scaling import OPTIONAL, is_number


def build(config):
    """Instantiate the scheme named by config.pos_encoding with config.pos_options;
    wrapped in a LayerStack when config sets nope_layers, layer_options or attn_scaling."""
    name = config.pos_encoding
    if name not in REGISTRY:
        raise ValueError(f"unknown pos_encoding {name!r}; valid schemes: {', '.join(sorted(REGISTRY))}")
    pe = _make_scheme(config, name, dict(config.pos_options or {}))
    if getattr(config, 'rope_scaling', None) and not getattr(pe, 'uses_rope_scaling', False):
        raise ValueError(f"rope_scaling={config.rope_scaling!r} was given, but scheme {name!r} has no "
                         f"rotary embedding to scale; drop rope_scaling or use a RoPE checkpoint")
    if not any(getattr(config, k, None) for k in ('nope_layers', 'layer_options', 'attn_scaling')):
        return pe
    return LayerStack(config, pe)


def _make_scheme(config, name, options, where=''):
    try:
        return REGISTRY[name](config, **options)
    except TypeError as e:
        raise ValueError(f"bad pos_options {options!r}{where} for scheme {name!r}: {e}. "
                         f"See the docstring of {REGISTRY[name].__name__} in positional.py "
                         f"for the options it takes.") from None


def nope_layer_indices(spec, n_layer):
    """The layers that run NoPE for config.nope_layers = spec, sorted:
      int k >= 1   every k-th layer, the last of each group of k: layers i with
                   (i + 1) % k == 0 (SmolLM3's and Llama 4's no_rope_layer_interval,
                   default 4; Cohere's RNoPE, Command A: three RoPE layers, then one NoPE);
      list/tuple   those (0-based) layer indices;
      0, None, []  none.
    Every layer NoPE is refused (that is pos_encoding='none')."""
    if spec is None or (isinstance(spec, (list, tuple)) and not spec) or (type(spec) is int and spec == 0):
        return []
    example = "e.g. nope_layers=4 (layers 3, 7, ...: every 4th) or nope_layers=[3, 7]"
    if isinstance(spec, bool) or not isinstance(spec, (int, list, tuple)):
        raise ValueError(f"nope_layers must be an int k (every k-th layer) or a list of layer indices, "
                         f"{example}; got {spec!r}")
    if isinstance(spec, int):
        if spec < 1:
            raise ValueError(f"nope_layers={spec}: k must be >= 1 (0 = no NoPE layers), {example}")
        idx = [i for i in range(n_layer) if (i + 1) % spec == 0]
        if not idx:
            raise ValueError(f"nope_layers={spec} makes every {spec}th layer NoPE (layers {spec - 1}, "
                             f"{2 * spec - 1}, ...), but n_layer={n_layer}: none is selected. Use k <= {n_layer} "
                             f"or list the layers")
    else:
        bad = [i for i in spec if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n_layer]
        if bad:
            raise ValueError(f"nope_layers {list(spec)}: {bad} are not layer indices 0..{n_layer - 1} "
                             f"(n_layer={n_layer}); {example}")
        if len(set(spec)) != len(spec):
            raise ValueError(f"nope_layers {list(spec)} lists a layer twice")
        idx = sorted(spec)
    if len(idx) == n_layer:
        raise ValueError(f"nope_layers={spec!r} makes every one of the {n_layer} layers NoPE: that is "
                         f"pos_encoding='none'")
    return idx


def check_layer_options(spec, n_layer, nope=()):
    """Validate config.layer_options: {layer index: dict of pos_options overrides}.
    Returns {int: dict}; a layer that is also in nope_layers is an error."""
    if not spec:
        return {}
    example = "e.g. layer_options={5: {'base': 1e6}, 11: {'base': 1e6}}"
    if not isinstance(spec, dict):
        raise ValueError(f"layer_options must be a dict {{layer index: pos_options overrides}}, {example}; "
                         f"got {spec!r}")
    out = {}
    for i, opts in spec.items():
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n_layer:
            raise ValueError(f"layer_options key {i!r} is not a layer index 0..{n_layer - 1} "
                             f"(n_layer={n_layer}); {example}")
        if not isinstance(opts, dict):
            raise ValueError(f"layer_options[{i}] must be a dict of pos_options for that layer, got {opts!r}")
        if i in nope:
            raise ValueError(f"layer {i} is in nope_layers and in layer_options: a NoPE layer has no "
                             f"options; drop one of the two")
        out[i] = dict(opts)
    return out


# attn_scaling: the keys each type takes (besides 'type' and 'layers'), with defaults
ATTN_SCALING_KEYS = {
    'logn': {'original_max_len': OPTIONAL},
    'ssmax': {'init': OPTIONAL},
    'llama4': {'floor_scale': 8192.0, 'attn_scale': 0.1},
}
_DEFAULT_SCALED_LAYERS = {'logn': 'all', 'ssmax': 'all', 'llama4': 'nope'}


def check_attn_scaling(sc, n_layer):
    """Validate config.attn_scaling; return it with defaults filled in. Each type
    multiplies every attention logit (content and bias) of query i by a factor s_i,
    with n_i = the number of keys query i attends to (i + 1 without a cache; cache
    length + i + 1 with one; places in the cache with a rolling one):
      {'type': 'logn'}   s = log n (Chiang & Cholak, arXiv 2202.12172: their encoder's
                         n is the input length; for a causal row it is the keys it sees).
      {'type': 'logn', 'original_max_len': L}
                         s = max(1, log n / log L): the extrapolation variant, 1 inside
                         the training length L (Su's log-n for ReRoPE; "log_L n").
      {'type': 'ssmax', 'init': s0}
                         Scalable-Softmax (Nakanishi, arXiv 2501.19399):
                         softmax(s_h * log n * z), s_h learned per head and per layer,
                         init s0 (default 1/log(block_size), nanoPE's choice: the
                         factor is 1 at n = L at initialisation).
      {'type': 'llama4', 'floor_scale': 8192, 'attn_scale': 0.1}
                         Llama 4's attention temperature tuning (HF transformers'
                         Llama4TextAttention; defaults from its config):
                         s = log(floor((pos + 1) / floor_scale) + 1) * attn_scale + 1
                         with pos the query's position; applied on NoPE layers.
    'layers' picks the layers it applies to: 'all' (default for logn, ssmax), 'nope'
    (the NoPE layers: nope_layers, or every layer of pos_encoding='none'; default
    for llama4, as Llama 4), 'pe' (the layers that run the scheme), or a list of
    layer indices."""
    example = "e.g. {'type': 'logn', 'original_max_len': 256} or {'type': 'llama4'}"
    if not isinstance(sc, dict) or sc.get('type') not in ATTN_SCALING_KEYS:
        raise ValueError(f"attn_scaling must be a dict with 'type' one of {', '.join(ATTN_SCALING_KEYS)}, "
                         f"{example}; got {sc!r}")
    kind, keys = sc['type'], ATTN_SCALING_KEYS[sc['type']]
    unknown = sorted(set(sc) - set(keys) - {'type', 'layers'})
    if unknown:
        raise ValueError(f"attn_scaling type {kind!r} does not take {unknown}; its keys are: "
                         f"{', '.join(list(keys) + ['layers'])}")
    out = {'type': kind, 'layers': sc.get('layers', _DEFAULT_SCALED_LAYERS[kind])}
    for k, default in keys.items():
        v = sc.get(k, default)
        if v is OPTIONAL or v is None:
            continue
        if not is_number(v):
            raise ValueError(f"attn_scaling {k!r} must be a number, got {v!r}")
        out[k] = float(v)
    if out.get('original_max_len', 2) <= 1:
        raise ValueError(f"attn_scaling original_max_len is the training length L (> 1: the factor is "
                         f"log n / log L), got {out['original_max_len']!r}")
    if out.get('floor_scale', 1) <= 0 or out.get('attn_scale', 0) < 0:
        raise ValueError(f"llama4 needs floor_scale > 0 and attn_scale >= 0, got {out.get('floor_scale')}, "
                         f"{out.get('attn_scale')}")
    layers = out['layers']
    if isinstance(layers, (list, tuple)):
        bad = [i for i in layers if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n_layer]
        if bad or not layers:
            raise ValueError(f"attn_scaling layers {layers!r}: give layer indices 0..{n_layer - 1}, or "
                             f"'all', 'nope', 'pe'")
        out['layers'] = sorted(set(layers))
    elif layers not in ('all', 'nope', 'pe'):
        raise ValueError(f"attn_scaling layers must be 'all', 'nope', 'pe' or a list of layer indices, "
                         f"got {layers!r}")
    return out


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


def _nest(state_dict, prefix, sub, own=()):
    """state_dict load pre-hook: key prefix + name becomes prefix + sub + name (the
    module's real name), unless name is the wrapper's own or the keys are nested already."""
    keys = [k for k in state_dict if k.startswith(prefix)]
    if any(k.startswith(prefix + sub) for k in keys):
        return
    for k in keys:
        if k[len(prefix):].split('.')[0] not in own:
            state_dict[prefix + sub + k[len(prefix):]] = state_dict.pop(k)


def _flatten(state_dict, prefix, sub):
    """state_dict post-hook: save prefix + sub + name as prefix + name, the plain scheme's key."""
    for k in [k for k in state_dict if k.startswith(prefix + sub)]:
        state_dict[prefix + k[len(prefix + sub):]] = state_dict.pop(k)


def _plain_state_dict_names(module, sub, own=()):
    """Save and load a wrapper's wrapped module under the plain scheme's names, so a checkpoint
    of the plain scheme and one of the wrapper have the same keys (a plain one loads into a
    model with attn_scaling chosen at run time, and checkpoint tools compare keys directly)."""
    module.register_state_dict_post_hook(lambda mod, sd, prefix, meta: _flatten(sd, prefix, sub))
    module.register_load_state_dict_pre_hook(lambda mod, sd, prefix, *_: _nest(sd, prefix, sub, own))


def scale_logits(q, mod, s):
    """Multiply every logit of query i in head h by s[h, i] (s: [H or 1, Tq] float32):
    through q for the content term q.k, and inside the score_mod for its bias (which
    does not depend on the scaled q: it was built from the unscaled one). A -inf bias
    is a mask and stays -inf. Same logits on every attention path."""
    s = s.expand(q.size(1), q.size(2))
    q = (q * s[None, :, :, None]).to(q.dtype)
    if mod is None:
        return q, None

    def scaled(score, b, h, i, j):
        bias = mod(torch.zeros_like(score), b, h, i, j)
        return score + torch.where(bias == float('-inf'), bias, bias * s[h, i])
    return q, scaled


def logit_scale(pe, q, ctx, layer):
    """This layer's attention scaling (config.attn_scaling) s [H or 1, Tq] float32, or None: every logit
    of query i in head h is multiplied by s[h, i]. A model part, not a scheme hook: only a LayerStack scales."""
    return pe.logit_scale(q, ctx, layer) if isinstance(pe, LayerStack) else None


class _StackLayer(nn.Module):
    """One layer's part of a LayerStack: its index, its scheme's per-layer module (or
    None) and, with SSMax on this layer, the learned per-head scales s_h."""

    def __init__(self, index, inner, ssmax):
        super().__init__()
        self.index = index
        self.inner = inner
        self.ssmax = ssmax
        _plain_state_dict_names(self, 'inner.', own=('ssmax',))


class LayerStack(PositionalEncoding):
    """A scheme per layer, or none (NoPE), plus optional length-dependent attention
    scaling; built by build() from config.nope_layers, layer_options and attn_scaling
    (see the module docstring, nope_layer_indices, check_layer_options and
    check_attn_scaling). One scheme instance per distinct set of options: layers with
    the same options share it (its context is computed once per forward, and its
    global parameters are shared as in the plain scheme). Every hook delegates to
    the layer's scheme with that scheme's own context and the layer's own module;
    a NoPE layer transforms nothing and adds no bias. Examples:
      RNoPE / Llama 4 iRoPE / SmolLM3: pos_encoding='rope', nope_layers=4
      Llama 4's temperature tuning too:  attn_scaling={'type': 'llama4'}
      Gemma 3 bases (every 6th layer global, 1M; the others local, 10k):
        pos_options={'base': 1e4}, layer_options={i: {'base': 1e6} for i in range(5, n_layer, 6)}
      ALiBi with NoPE every 3rd layer and log-n scaling beyond L:
        pos_encoding='alibi', nope_layers=3, attn_scaling={'type': 'logn', 'original_max_len': L}"""

    def __init__(self, config, pe):
        super().__init__(config)
        self.name, n = pe.name, config.n_layer
        nope = nope_layer_indices(getattr(config, 'nope_layers', None), n)
        per = check_layer_options(getattr(config, 'layer_options', None), n, nope)
        if (nope or per) and pe.embeds_positions:
            raise ValueError(f"{pe.name} adds positions to the token embeddings once, before block 0, for "
                             f"every layer: there is no per-layer position to switch off or change, so "
                             f"nope_layers/layer_options do not apply. Use an attention-side scheme "
                             f"({', '.join(s for s in sorted(REGISTRY) if REGISTRY[s].embed is PositionalEncoding.embed and s != 'none')})")
        if nope and isinstance(pe, NoPE):
            raise ValueError("pos_encoding='none' is NoPE in every layer already; drop nope_layers")
        base = dict(config.pos_options or {})
        base_key = repr(sorted(base.items()))
        schemes, plan, seen = [], [], {}
        for i in range(n):
            if i in nope:
                plan.append(None)
                continue
            opts = {**base, **per.get(i, {})}
            key = repr(sorted(opts.items()))
            if key not in seen:
                seen[key] = len(schemes)
                schemes.append(pe if key == base_key else
                               _make_scheme(config, pe.name, opts, f" (pos_options updated by layer_options[{i}])"))
            plan.append(seen[key])
        self.schemes = nn.ModuleList(schemes)
        self.plan = plan  # per layer: index into self.schemes, or None for NoPE
        if len(schemes) == 1:  # the plain scheme's state-dict keys (plus SSMax's own)
            _plain_state_dict_names(self, 'schemes.0.')
        self.uses_rope_scaling, self.scaling = pe.uses_rope_scaling, pe.scaling
        self.nope_layers = [i for i, p in enumerate(plan) if p is None or isinstance(schemes[p], NoPE)]
        sc = getattr(config, 'attn_scaling', None)
        self.attn_scaling = sc = check_attn_scaling(sc, n) if sc else None
        self.scaled = frozenset()
        if sc is not None:
            layers = sc['layers']
            self.scaled = frozenset(range(n) if layers == 'all' else self.nope_layers if layers == 'nope' else
                                    [i for i in range(n) if i not in self.nope_layers] if layers == 'pe' else layers)
            if not self.scaled:
                raise ValueError(f"attn_scaling {sc['type']!r} applies to layers={layers!r}, and this model has "
                                 f"none (NoPE layers: {self.nope_layers}). Set nope_layers (Llama 4 scales its NoPE "
                                 f"layers), or 'layers': 'all' or a list of layer indices")
            self.ssmax_init = sc.get('init', 1 / math.log(max(2, config.block_size)))
            own = [i for i in sorted(self.scaled) if plan[i] is not None and schemes[plan[i]].owns_attention]
            if own:
                raise ValueError(f"attn_scaling multiplies the logits of model.py's attention, but {pe.name} computes "
                                 f"its attention itself (its `attention` hook) on layers {own}; apply attn_scaling "
                                 f"to other layers ('layers': 'nope' with nope_layers, or a list) or drop it")
        self._built = 0

    def new_layer(self):
        i = self._built
        if i >= len(self.plan):
            raise RuntimeError(f"LayerStack was built for n_layer={len(self.plan)} layers and new_layer() was "
                               f"called once more: it is called once per layer, in order")
        self._built += 1
        p = self.plan[i]
        inner = None if p is None else self.schemes[p].new_layer()
        ssmax = None
        if self.attn_scaling is not None and self.attn_scaling['type'] == 'ssmax' and i in self.scaled:
            ssmax = nn.Parameter(torch.full((self.n_head,), float(self.ssmax_init)))
        return _StackLayer(i, inner, ssmax)

    def _at(self, ctx, layer):
        """(scheme, its context, its per-layer module) of this layer, or None for NoPE."""
        p = self.plan[layer.index]
        return None if p is None else (self.schemes[p], ctx.extra['inner'][p], layer.inner)

    def max_len_of(self):
        lens = [s.max_len for s in self.schemes if s.max_len is not None]
        return min(lens) if lens else None

    def check_positions(self, n_pos):
        for s in self.schemes:
            s.check_positions(n_pos)

    @property
    def embeds_positions(self):
        return any(s.embeds_positions for s in self.schemes)

    @property
    def transform_after_cache(self):
        return any(s.transform_after_cache for s in self.schemes)

    def embed(self, x, pos):
        for s in self.schemes:  # several schemes only when none embeds (refused above)
            x = s.embed(x, pos)
        return x

    def context(self, q_pos, k_pos, n_pos=None):
        ctx = make_context(q_pos, k_pos, n_pos)
        ctx.extra['inner'] = [s.context(q_pos, k_pos, ctx.n_pos) for s in self.schemes]
        return ctx

    def transform_qk(self, q, k, ctx, layer):
        at = self._at(ctx, layer)
        return (q, k) if at is None else at[0].transform_qk(q, k, at[1], at[2])

    def score_mod(self, q, k, ctx, layer):
        at = self._at(ctx, layer)
        return None if at is None else at[0].score_mod(q, k, at[1], at[2])

    def value_mod(self, q, k, ctx, layer, score_mod):
        at = self._at(ctx, layer)
        return None if at is None else at[0].value_mod(q, k, at[1], at[2], score_mod)

    def attention(self, q, k, v, x, ctx, layer, cache, attend):
        at = self._at(ctx, layer)
        return None if at is None else at[0].attention(q, k, v, x, at[1], at[2], cache, attend)

    def logit_scale(self, q, ctx, layer):
        """See the module function logit_scale."""
        sc = self.attn_scaling
        if sc is None or layer.index not in self.scaled:
            return None
        if sc['type'] == 'llama4':
            return llama4_scale(ctx.q_pos, sc['floor_scale'], sc['attn_scale'])[None, :]
        Tq, Tk = q.size(2), ctx.k_pos.numel()
        n = torch.arange(Tk - Tq + 1, Tk + 1, device=q.device)  # keys each query attends to
        if sc['type'] == 'logn':
            return logn_scale(n, sc.get('original_max_len'))[None, :]
        return layer.ssmax[:, None] * torch.log(n.float())[None, :]  # ssmax: [H, Tq]

    def extra_repr(self):
        names = ['nope' if p is None else f"{self.name}#{p}" for p in self.plan]
        return f"layers=[{', '.join(names)}], attn_scaling={self.attn_scaling}, scaled={sorted(self.scaled)}"
