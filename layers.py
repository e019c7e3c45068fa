"""
The layer plan: what each attention layer does, computed once from the config (`layer_specs`) and
handed to each layer with its index, as nanochat computes its per-layer windows once. Attention owns
what a query may see and how logits become weights (causal mask, sliding window, chunk, sink logits,
logit scaling, QK-norm); the scheme owns positions; the plan says which of each a layer has.

One grammar for every per-layer key: a value for every layer, or a dict {layer: value} in which a layer
is named by its index (0-based) or by its type in `layer_types`; layers not named get nothing.
  layer_types           the layers' types: a list of n_layer names (HF's 'sliding_attention',
                        'full_attention', 'chunked_attention', or any), or a string tiled over the
                        layers, one letter a layer (nanochat's 'SSSL')
  sliding_window        W >= 1: a query sees the W most recent keys, its own included (HF, gpt-oss)
  attention_chunk_size  C >= 1: a query sees the earlier keys of its own chunk of C tokens (Llama 4)
  qk_norm               True or 'weight' (RMSNorm with a weight that starts at 1: Qwen3, OLMo 2) or
                        'weightless' (Llama 4, nanochat): q and k per head, before the positions
  sink_logits           True: a learned logit per head in every row's softmax denominator (gpt-oss)
  nope_layers           the layers that run no positional scheme: an int k is every k-th layer, the
                        last of each group of k (SmolLM3's and Llama 4's (i + 1) % k == 0, Cohere's
                        RNoPE); a list of indices; or a layer type
  layer_options         {layer: dict}: pos_options overrides on those layers (Gemma 3's global base)
  attn_scaling          {'type': 'logn' | 'ssmax' | 'llama4', ..., 'layers': ...}: length-dependent
                        logit scaling on the layers 'all' | 'nope' | 'pe' | a list | a layer type
  canon_set             Canon layers (Allen-Zhu, arXiv 2512.17351; HF LlamaCanonConfig's names): the places of
                        a layer that get one, a string of 'A' (the attention's input), 'B' (q, k and v), 'C' (the
                        MLP's input), 'D' (the MLP's hidden layer), or True for 'ABCD'; see CANON
  canon_kernel          K >= 1: the Canon layers' convolution width (default 4, the authors')
As in HF, a plain number for sliding_window (attention_chunk_size) applies to the layers whose type is
sliding ('S' or 'sliding_attention'; chunked: 'C' or 'chunked_attention') when layer_types is set,
and to every layer when it is not.
  Gemma 3:  layer_types='SSSSSF', sliding_window=32, qk_norm=True, pos_options={'base': 1e4},
            layer_options={'F': {'base': 1e6}}
  gpt-oss:  layer_types='SF', sliding_window=32, sink_logits=True
  Canon:    canon_set='ABCD' (every layer, every place), or canon_set={'F': 'AC'}, canon_kernel=3
"""

import math
from dataclasses import dataclass, fields

from rope_scaling import OPTIONAL, is_number

SLIDING, CHUNKED = ('S', 'sliding_attention'), ('C', 'chunked_attention')
QK_NORMS = {True: 'weight', 'weight': 'weight', 'weightless': 'weightless'}
# Canon layers (Allen-Zhu, "Physics of Language Models: Part 4.1, Architecture Design and the Magic of Canon
# Layers", arXiv 2512.17351; code: facebookresearch/PhysicsLM4, huggingface/canon_helper.py and
# modeling_llama_canon.py): at each place, h <- h + conv(h), conv a causal depthwise convolution over time of
# width K, y_t = sum_k w[:, k] h_{t-K+1+k}, zeros before the first token. The authors' defaults: K = 4, the
# residual on, no bias, no activation (their SiLU option is off and advised against for Transformers), the weights
# nn.Conv1d's init, U(-1/sqrt(K), 1/sqrt(K)), kept (not GPT-2's N(0, 0.02)). The places, as in their code:
CANON = {'A': "the attention's input, after ln_1 (hidden size n_embd)",
         'B': "q, k and v as one vector, after QK-norm, before the positions (c_attn's width, 3 n_embd)",
         'C': "the MLP's input, after ln_2 (n_embd)",
         'D': "the MLP's hidden layer before the GELU (4 n_embd; the authors' gated MLP: gate and up together)"}
CANON_KERNEL = 4


@dataclass
class PlanKeys:
    """The config's per-layer keys and their defaults, declared here once: model.GPTConfig subclasses this,
    train.py's globals and model_args take these keys, a fine-tune may change them (checkpoint.py), and
    presets.py's stacks are made of them. Each is a value for every layer or {layer index or type: value}."""
    layer_types: object = None           # the layers' types: a list of n_layer names, or a pattern tiled ('SSSL')
    nope_layers: object = None           # int k: every k-th layer (k-1, 2k-1, ...) runs NoPE; a list; a type
    layer_options: dict = None           # {layer: pos_options overrides}, e.g. Gemma 3's global base
    attn_scaling: dict = None            # {'type': 'logn' | 'ssmax' | 'llama4' | 'drope', ...}: logit scaling
    sliding_window: object = None        # W: a query sees the W most recent keys, its own included (HF)
    attention_chunk_size: object = None  # C: a query sees the earlier keys of its own chunk of C tokens (Llama 4)
    qk_norm: object = None               # True / 'weight' | 'weightless': RMSNorm of q and k per head
    sink_logits: object = None           # True: a learned logit per head in every row's softmax denominator
    canon_set: object = None             # Canon layers' places, 'A' 'B' 'C' 'D' (True: 'ABCD'); see CANON
    canon_kernel: object = None          # K: the Canon layers' convolution width (None: 4, the authors')


PLAN_KEYS = tuple(f.name for f in fields(PlanKeys))


@dataclass(frozen=True)
class LayerSpec:
    """One layer's part of the plan."""
    index: int
    type: str = ''                   # its entry in layer_types ('' when unset)
    pos_options: dict = None         # its scheme's options; None: no positions (NoPE)
    sliding_window: int = None       # keys a query sees, its own included
    attention_chunk_size: int = None
    qk_norm: str = None              # None | 'weight' | 'weightless'
    sink_logits: bool = False
    attn_scaling: dict = None        # a checked attn_scaling dict without 'layers', or None
    canon_set: str = ''              # the places of its Canon layers, some of 'ABCD' in that order
    canon_kernel: int = CANON_KERNEL  # their convolution width

    def describe(self, scheme):
        parts = [f"{scheme} {self.pos_options}" if self.pos_options else scheme if self.pos_options is not None
                 else 'nope']
        parts += [f"{k} {v}" for k, v in (('sliding_window', self.sliding_window),
                                          ('attention_chunk_size', self.attention_chunk_size),
                                          ('qk_norm', self.qk_norm)) if v is not None]
        parts += ['sink_logits'] * self.sink_logits
        if self.attn_scaling:
            parts.append(f"attn_scaling {self.attn_scaling}")
        if self.canon_set:
            parts.append(f"canon_set {self.canon_set}" + f", canon_kernel {self.canon_kernel}" *
                         (self.canon_kernel != CANON_KERNEL))
        return f"layer {self.index}" + (f" ({self.type})" if self.type else '') + ': ' + ', '.join(parts)


def layer_types_of(spec, n_layer):
    """config.layer_types -> a list of n_layer type names ('' each when unset)."""
    if spec is None or spec == '' or spec == []:
        return [''] * n_layer
    if isinstance(spec, str):
        return [spec[i % len(spec)] for i in range(n_layer)]  # a pattern, tiled
    if not isinstance(spec, (list, tuple)) or not all(isinstance(t, str) and t for t in spec):
        raise ValueError(f"layer_types must be a list of n_layer type names or a string of one letter a layer "
                         f"(tiled), e.g. 'SSSL' or ['sliding_attention', 'full_attention']; got {spec!r}")
    if len(spec) != n_layer:
        raise ValueError(f"layer_types names {len(spec)} layers, but n_layer={n_layer}: give one type a layer, or "
                         f"a string pattern (tiled over the layers)")
    return list(spec)


def per_layer(key, value, types, default=None, plain=None):
    """One per-layer key of the grammar -> a list of n_layer values. `value`: None (every layer gets
    `default`), a plain value (every layer, or only the layers whose type is in `plain`, when given and
    layer_types is set), or a dict {layer index or type: value}."""
    n = len(types)
    if value is None:
        return [default] * n
    if not isinstance(value, dict):
        if plain and any(types):
            chosen = [t in plain for t in types]
            if not any(chosen):
                raise ValueError(f"{key}={value!r} applies to the layers of type {' or '.join(map(repr, plain))}, and "
                                 f"layer_types={''.join(types) if all(len(t) == 1 for t in types) else types} has "
                                 f"none: name the layers, e.g. {key}={{{types[0]!r}: {value!r}}}")
            return [value if c else default for c in chosen]
        return [value] * n
    out = [default] * n
    for sel, v in value.items():
        for i in select(key, sel, types):
            out[i] = v
    return out


def select(key, sel, types):
    """The layer indices a selector names: an index 0..n_layer-1, or a type of layer_types."""
    n = len(types)
    if isinstance(sel, bool) or not isinstance(sel, (int, str)):
        raise ValueError(f"{key}: {sel!r} is not a layer index or a layer type")
    if isinstance(sel, int):
        if not 0 <= sel < n:
            raise ValueError(f"{key} names layer {sel}, but the model has n_layer={n} layers (0..{n - 1})")
        return [sel]
    if not any(types):
        raise ValueError(f"{key} names layer type {sel!r}, but layer_types is not set: set layer_types (e.g. "
                         f"'SSSL') or name the layers by index")
    if sel not in types:
        raise ValueError(f"{key} names layer type {sel!r}, which is not in layer_types "
                         f"({', '.join(sorted(set(types)))})")
    return [i for i, t in enumerate(types) if t == sel]


def nope_layer_indices(spec, n_layer, types=None):
    """The layers that run NoPE for config.nope_layers = spec, sorted:
      int k >= 1   every k-th layer, the last of each group of k: layers i with
                   (i + 1) % k == 0 (SmolLM3's and Llama 4's no_rope_layer_interval,
                   default 4; Cohere's RNoPE, Command A: three RoPE layers, then one NoPE);
      list/tuple   those (0-based) layer indices;
      str          the layers of that type in layer_types;
      0, None, []  none.
    Every layer NoPE is refused (that is pos_encoding='none')."""
    if spec is None or (isinstance(spec, (list, tuple)) and not spec) or (type(spec) is int and spec == 0):
        return []
    example = "e.g. nope_layers=4 (layers 3, 7, ...: every 4th) or nope_layers=[3, 7]"
    if isinstance(spec, bool) or not isinstance(spec, (int, list, tuple, str)):
        raise ValueError(f"nope_layers must be an int k (every k-th layer), a list of layer indices or a layer "
                         f"type, {example}; got {spec!r}")
    if isinstance(spec, str):
        idx = select('nope_layers', spec, types or [''] * n_layer)
    elif isinstance(spec, int):
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


def check_layer_options(spec, types, nope=()):
    """Validate config.layer_options: {layer index or type: dict of pos_options overrides}.
    Returns {int: dict}; a layer that is also in nope_layers is an error."""
    if not spec:
        return {}
    n_layer = len(types)
    example = "e.g. layer_options={5: {'base': 1e6}, 11: {'base': 1e6}}"
    if not isinstance(spec, dict):
        raise ValueError(f"layer_options must be a dict {{layer index: pos_options overrides}}, {example}; "
                         f"got {spec!r}")
    out = {}
    for sel, opts in spec.items():
        index = isinstance(sel, int) and not isinstance(sel, bool)
        if not (index and 0 <= sel < n_layer or isinstance(sel, str)):
            raise ValueError(f"layer_options key {sel!r} is not a layer index 0..{n_layer - 1} "
                             f"(n_layer={n_layer}) or a layer type; {example}")
        if not isinstance(opts, dict):
            raise ValueError(f"layer_options[{sel!r}] must be a dict of pos_options for that layer, got {opts!r}")
        for i in select('layer_options', sel, types):
            if i in nope:
                raise ValueError(f"layer {i} is in nope_layers and in layer_options: a NoPE layer has no "
                                 f"options; drop one of the two")
            out[i] = {**out.get(i, {}), **opts}
    return out


# attn_scaling: the keys each type takes (besides 'type' and 'layers'), with defaults
ATTN_SCALING_KEYS = {
    'logn': {'original_max_len': OPTIONAL},
    'ssmax': {'init': OPTIONAL},
    'llama4': {'floor_scale': 8192.0, 'attn_scale': 0.1},
    'drope': {'c': None, 'original_max_len': OPTIONAL},
}
_DEFAULT_SCALED_LAYERS = {'logn': 'all', 'ssmax': 'all', 'llama4': 'nope', 'drope': 'all'}


def check_attn_scaling(sc, n_layer):
    """Validate config.attn_scaling; return it with defaults filled in. Each type
    multiplies every attention logit (content and bias) of query i by a factor s_i,
    with n_i = the number of keys query i attends to (i + 1 without a cache; cache
    length + i + 1 with one; places in the cache with a rolling one; at most W in a window):
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
      {'type': 'drope', 'c': c, 'original_max_len': L}
                         DroPE's (Gelberg et al., arXiv 2512.12167) s = 1 + c ln(max(1, n / L)),
                         L default block_size. The paper scales a whole evaluation window by
                         its length over L; n per query is the same for the window's last
                         query and keeps KV-cache decoding equal to a full forward. (logn with
                         original_max_len is this with c = 1 / ln L.)
    'layers' picks the layers it applies to: 'all' (default for logn, ssmax), 'nope'
    (the NoPE layers: nope_layers, or every layer of pos_encoding='none'; default
    for llama4, as Llama 4), 'pe' (the layers that run the scheme), a list of
    layer indices, or a layer type of layer_types."""
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
        if v is None and default is None:
            raise ValueError(f"attn_scaling type {kind!r} needs {k!r}, e.g. {{'type': {kind!r}, {k!r}: 0.1}}")
        if v is OPTIONAL or v is None:
            continue
        if not is_number(v):
            raise ValueError(f"attn_scaling {k!r} must be a number, got {v!r}")
        out[k] = float(v)
    if out.get('original_max_len', 2) <= 1:
        raise ValueError(f"attn_scaling original_max_len is the training length L (> 1: the factor is "
                         f"log n / log L), got {out['original_max_len']!r}")
    if out.get('c', 0) < 0:
        raise ValueError(f"drope's c multiplies ln(n / L) and must be >= 0 (0: no scaling), got {out['c']!r}")
    if out.get('floor_scale', 1) <= 0 or out.get('attn_scale', 0) < 0:
        raise ValueError(f"llama4 needs floor_scale > 0 and attn_scale >= 0, got {out.get('floor_scale')}, "
                         f"{out.get('attn_scale')}")
    layers = out['layers']
    if isinstance(layers, (list, tuple)):
        bad = [i for i in layers if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n_layer]
        if bad or not layers:
            raise ValueError(f"attn_scaling layers {layers!r}: give layer indices 0..{n_layer - 1}, or "
                             f"'all', 'nope', 'pe' or a layer type")
        out['layers'] = sorted(set(layers))
    elif not isinstance(layers, str):
        raise ValueError(f"attn_scaling layers must be 'all', 'nope', 'pe', a list of layer indices or a layer "
                         f"type, got {layers!r}")
    return out


def check_canon(sets, kernel, types):
    """canon_set (a value a layer: per_layer) and config.canon_kernel -> (places a layer, width a layer). A plain
    canon_kernel applies to the layers with Canon layers; one a dict names must have them."""
    places = []
    for v in sets:
        p = 'ABCD' if v is True else '' if v in (None, False) else v
        if not isinstance(p, str) or any(c not in CANON for c in p) or len(set(p)) < len(p):
            raise ValueError(f"canon_set takes the places of Canon layers, some of 'A' (the attention's input), 'B' "
                             f"(q, k, v), 'C' (the MLP's input), 'D' (the MLP's hidden layer), e.g. 'ABCD' or 'AC', "
                             f"or True (all four); got {v!r}")
        places.append(''.join(c for c in CANON if c in p))
    widths = per_layer('canon_kernel', kernel, types)
    if kernel is not None and not isinstance(kernel, dict):
        widths = [k if p else None for k, p in zip(widths, places)]
    if kernel is not None and not any(places):
        raise ValueError(f"canon_kernel={kernel!r} is the width of Canon layers, and this model has none: set "
                         f"canon_set (e.g. canon_set='ABCD'), or drop canon_kernel")
    bare = [i for i, (p, k) in enumerate(zip(places, widths)) if k is not None and not p]
    if bare:
        raise ValueError(f"canon_kernel names layer {bare[0]}, which has no Canon layers: set canon_set there, or "
                         f"name only the layers canon_set gives Canon layers")
    bad = [k for k in widths if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1)]
    if bad:
        raise ValueError(f"canon_kernel is a convolution's width, a whole number of tokens >= 1 (the authors' 4), "
                         f"got {bad[0]!r}")
    return places, [CANON_KERNEL if k is None else k for k in widths]


def _positive_ints(key, values):
    for v in values:
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"{key} must be a whole number of tokens >= 1 (or None: no limit), got {v!r}")


def layer_specs(config, nope_scheme=False):
    """The plan: a LayerSpec per layer from the config's per-layer keys (see the module docstring).
    nope_scheme: the model's scheme is NoPE in every layer (pos_encoding='none')."""
    n = config.n_layer
    types = layer_types_of(getattr(config, 'layer_types', None), n)
    nope = nope_layer_indices(getattr(config, 'nope_layers', None), n, types)
    if nope and nope_scheme:
        raise ValueError("pos_encoding='none' is NoPE in every layer already; drop nope_layers")
    per = check_layer_options(getattr(config, 'layer_options', None), types, nope)
    window = per_layer('sliding_window', getattr(config, 'sliding_window', None), types, plain=SLIDING)
    chunk = per_layer('attention_chunk_size', getattr(config, 'attention_chunk_size', None), types, plain=CHUNKED)
    _positive_ints('sliding_window', window)
    _positive_ints('attention_chunk_size', chunk)
    norms = per_layer('qk_norm', getattr(config, 'qk_norm', None), types)
    bad = [v for v in norms if v not in (None, False) and v not in QK_NORMS]
    if bad:
        raise ValueError(f"qk_norm must be True or 'weight' (RMSNorm with a weight, Qwen3 / OLMo 2), 'weightless' "
                         f"(Llama 4, nanochat) or False, got {bad[0]!r}")
    sinks = per_layer('sink_logits', getattr(config, 'sink_logits', None), types, default=False)
    if any(not isinstance(v, bool) for v in sinks):
        raise ValueError(f"sink_logits must be True or False (per layer: a dict of them), got "
                         f"{next(v for v in sinks if not isinstance(v, bool))!r}")
    canon, width = check_canon(per_layer('canon_set', getattr(config, 'canon_set', None), types),
                               getattr(config, 'canon_kernel', None), types)
    base = dict(config.pos_options or {})
    pos = [None if i in nope else {**base, **per.get(i, {})} for i in range(n)]
    scaling = [None] * n
    sc = getattr(config, 'attn_scaling', None)
    if sc:
        sc = check_attn_scaling(sc, n)
        layers, nopes = sc['layers'], [i for i in range(n) if pos[i] is None or nope_scheme]
        chosen = (range(n) if layers == 'all' else nopes if layers == 'nope' else
                  [i for i in range(n) if i not in nopes] if layers == 'pe' else
                  select('attn_scaling layers', layers, types) if isinstance(layers, str) else layers)
        if not chosen:
            raise ValueError(f"attn_scaling {sc['type']!r} applies to layers={layers!r}, and this model has "
                             f"none (NoPE layers: {nopes}). Set nope_layers (Llama 4 scales its NoPE "
                             f"layers), or 'layers': 'all' or a list of layer indices")
        one = {k: v for k, v in sc.items() if k != 'layers'}
        if one['type'] == 'ssmax' and 'init' not in one:
            one['init'] = 1 / math.log(max(2, config.block_size))
        if one['type'] == 'drope' and 'original_max_len' not in one:
            one['original_max_len'] = float(config.block_size)
        for i in chosen:
            scaling[i] = one
    return [LayerSpec(i, types[i], pos[i], window[i], chunk[i], QK_NORMS.get(norms[i]), sinks[i], scaling[i],
                      canon[i], width[i]) for i in range(n)]
