"""Shared fixtures: tiny models over every registered scheme, small synthetic data."""
import os
import sys

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import positional  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

SCHEMES = sorted(positional.REGISTRY)
torch.set_num_threads(min(2, torch.get_num_threads()))


def tiny_config(scheme, **kw):
    args = dict(vocab_size=37, block_size=16, n_layer=2, n_head=4, n_embd=32, pos_encoding=scheme,
                attn_backend='dense')
    args.update(kw)
    return GPTConfig(**args)


def tiny_model(scheme, seed=0, **kw):
    torch.manual_seed(seed)
    return GPT(tiny_config(scheme, **kw))


def attend_mods(scheme, train):
    """The (score_mod, value_mod) pairs a scheme's hooks hand model.attend in one forward of a
    tiny model, training with gradients (train=True) or evaluating without; [] when its attention
    hook never calls attend (it computes the output itself, e.g. stick-breaking)."""
    import model as M
    m = tiny_model(scheme).train(train)
    calls, real = [], M.attend

    def spy(q, k, v, mod=None, vmod=None, *args, **kw):
        calls.append((mod, vmod))
        return real(q, k, v, mod, vmod, *args, **kw)
    M.attend = spy
    try:
        with torch.set_grad_enabled(train):
            m(torch.zeros(1, 8, dtype=torch.long))
    finally:
        M.attend = real
    return calls


def has_attention_mod(scheme, train=False):
    """Whether the scheme gives model.attend a score_mod or value_mod (so FlexAttention runs it):
    it overrides the score_mod/value_mod hooks, or its attention hook hands attend one."""
    cls, base = positional.REGISTRY[scheme], positional.PositionalEncoding
    return cls.score_mod is not base.score_mod or cls.value_mod is not base.value_mod or \
        any(mod is not None or vmod is not None for mod, vmod in attend_mods(scheme, train))


@pytest.fixture
def char_data(tmp_path):
    """A small char corpus prepared with the real prepare script's code path."""
    sys.path.insert(0, os.path.join(ROOT, 'data', 'shakespeare_char'))
    from prepare import prepare
    rng = np.random.default_rng(0)
    words = ['to', 'be', 'or', 'not', 'that', 'is', 'the', 'question', 'whether', 'tis', 'nobler']
    text = ' '.join(rng.choice(words, size=20000)) + '\n'
    prepare(text, str(tmp_path / 'data'))
    return str(tmp_path / 'data')
