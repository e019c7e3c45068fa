"""
The model's positional side (model.pe): the scheme named by config.pos_encoding, built once per distinct
set of options in the layer plan (layers.py), and for each layer the instance it runs, or NoPE. Layers
with equal options share one instance: its global parameters (xl's u, v; t5's table) and its per-forward
context. Schemes that embed positions (learned, sinusoidal) act once before block 0, for every layer, so
they refuse per-layer options and NoPE layers.

State-dict keys are the plain scheme's (`pe.NAME`) when there is one instance, and `pe.schemes.P.NAME`
when layer_options makes several, so a checkpoint of the plain scheme loads into a model that adds only
attention-side settings (attn_scaling, a window) at run time.
"""

import torch.nn as nn

from configurator import unknown_names
from positional import REGISTRY, NoPE, PositionalEncoding


def make_scheme(config, name, options, where=''):
    """An instance of scheme `name` with `options` (its pos_options); the scheme picks its class for
    them (rope with a Self-Extend or ReRoPE rope_scaling builds ExtendedRoPE)."""
    if name not in REGISTRY:
        raise ValueError(unknown_names('pos_encoding', name, REGISTRY, 'valid schemes'))
    cls = REGISTRY[name].variant(config, options)
    try:
        return cls(config, **options)
    except TypeError as e:
        raise ValueError(f"bad pos_options {options!r}{where} for scheme {name!r}: {e}. "
                         f"See the docstring of {REGISTRY[name].__name__} in positional.py "
                         f"for the options it takes.") from None


class Positions(nn.Module):
    """Per layer, the scheme instance it runs (`at(i)`); model-wide, what the scripts read of a model's
    positions (name, max_len, addresses, scaling, embeds_positions) and the embedding before block 0."""

    def __init__(self, config, plan):
        super().__init__()
        self.name = name = config.pos_encoding
        base = dict(config.pos_options or {})
        plain = make_scheme(config, name, base)  # the scheme with the config's own pos_options
        if getattr(config, 'rope_scaling', None) and not plain.uses_rope_scaling:
            raise ValueError(f"rope_scaling={config.rope_scaling!r} was given, but scheme {name!r} has no "
                             f"rotary embedding to scale; drop rope_scaling or use a RoPE checkpoint")
        if plain.embeds_positions and (getattr(config, 'nope_layers', None) or getattr(config, 'layer_options', None)):
            others = [s for s in sorted(REGISTRY) if REGISTRY[s].embed is PositionalEncoding.embed and s != 'none']
            raise ValueError(f"{name} adds positions to the token embeddings once, before block 0, for "
                             f"every layer: there is no per-layer position to switch off or change, so "
                             f"nope_layers/layer_options do not apply. Use an attention-side scheme "
                             f"({', '.join(others)})")
        schemes, seen, self.slot = [], {}, []
        for spec in plan:  # one instance per distinct options, in the order the layers plain use them
            if spec.pos_options is None:
                self.slot.append(None)
                continue
            key = repr(sorted(spec.pos_options.items()))
            if key not in seen:
                seen[key] = len(schemes)
                schemes.append(plain if spec.pos_options == base else make_scheme(
                    config, name, spec.pos_options, f" (pos_options updated by layer_options[{spec.index}])"))
            self.slot.append(seen[key])
        self.schemes = nn.ModuleList(schemes)
        self.nope = NoPE(config)
        if len(schemes) == 1:  # the plain scheme's state-dict keys
            _plain_state_dict_names(self, 'schemes.0.')
        self.uses_rope_scaling, self.scaling = plain.uses_rope_scaling, plain.scaling
        self.nope_layers = [i for i, p in enumerate(self.slot) if p is None or isinstance(schemes[p], NoPE)]

    def at(self, i):
        """The scheme layer i runs (NoPE, whose hooks do nothing, on a NoPE layer)."""
        p = self.slot[i]
        return self.nope if p is None else self.schemes[p]

    @property
    def max_len(self):
        lens = [s.max_len for s in self.schemes if s.max_len is not None]
        return min(lens) if lens else None

    def addresses(self, T):
        return self.max_len is None or T <= self.max_len

    def check_positions(self, n_pos):
        for s in self.schemes:
            s.check_positions(n_pos)

    @property
    def embeds_positions(self):
        return any(s.embeds_positions for s in self.schemes)

    def embed(self, x, pos):
        for s in self.schemes:  # several schemes only when none embeds (refused above)
            x = s.embed(x, pos)
        return x

    def extra_repr(self):
        return f"name={self.name}, layers=[{', '.join('nope' if p is None else f'#{p}' for p in self.slot)}]"


def _nest(state_dict, prefix, sub):
    """state_dict load pre-hook: key prefix + name becomes prefix + sub + name (the module's real
    name), unless the keys are nested already."""
    keys = [k for k in state_dict if k.startswith(prefix)]
    if any(k.startswith(prefix + sub) for k in keys):
        return
    for k in keys:
        state_dict[prefix + sub + k[len(prefix):]] = state_dict.pop(k)


def _flatten(state_dict, prefix, sub):
    """state_dict post-hook: save prefix + sub + name as prefix + name, the plain scheme's key."""
    for k in [k for k in state_dict if k.startswith(prefix + sub)]:
        state_dict[prefix + k[len(prefix + sub):]] = state_dict.pop(k)


def _plain_state_dict_names(module, sub):
    """Save and load the one scheme under the plain scheme's names (pe.NAME), so checkpoints keep the
    keys they had before per-layer plans existed and tools can compare keys directly."""
    module.register_state_dict_post_hook(lambda mod, sd, prefix, meta: _flatten(sd, prefix, sub))
    module.register_load_state_dict_pre_hook(lambda mod, sd, prefix, *_: _nest(sd, prefix, sub))

