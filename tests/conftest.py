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
