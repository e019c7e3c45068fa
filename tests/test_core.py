"""Core properties, parametrized over the registry: a new scheme is covered by its name alone."""
import math

import pytest
import torch

import positional
import rope_scaling
from conftest import SCHEMES, assert_trains_and_pe_params_learn, has_attention_mod, tiny_model
from attention import dense_bias


# --- math of the core schemes against independent formulas / published values ---

def test_sinusoidal_table_matches_paper_formula():
    d, n = 16, 50
    pe = positional.sinusoidal_table(n, d)
    for p in (0, 1, 7, 49):
        for i in range(d // 2):
            w = 1.0 / (10000 ** (2 * i / d))
            assert pe[p, 2 * i].item() == pytest.approx(math.sin(p * w), abs=1e-6)
            assert pe[p, 2 * i + 1].item() == pytest.approx(math.cos(p * w), abs=1e-6)


@pytest.mark.parametrize('n, expected', [
    (8, [2.0 ** -k for k in range(1, 9)]),                  # 1/2 ... 1/256 (ALiBi paper)
    (4, [2.0 ** -k for k in (2, 4, 6, 8)]),
    (6, [2.0 ** -k for k in (2, 4, 6, 8, 1, 3)]),           # non power of two: not monotonic
    (12, [2.0 ** -k for k in (1, 2, 3, 4, 5, 6, 7, 8, 0.5, 1.5, 2.5, 3.5)]),
])
def test_alibi_slopes_published(n, expected):
    assert positional.alibi_slopes(n).tolist() == pytest.approx(expected, rel=1e-6)


def test_alibi_bias_is_minus_slope_times_distance():
    m = tiny_model('alibi')
    pe = m.pe
    q_pos = torch.arange(6)
    ctx = pe.context(q_pos, q_pos)
    bias = dense_bias(pe.score_mod(None, None, ctx, None), 1, 4, 6, 6, 'cpu')[0]
    slopes = positional.alibi_slopes(4)
    for h in range(4):
        for i in range(6):
            for j in range(6):
                want = -slopes[h].item() * (i - j) if j <= i else float('-inf')
                assert bias[h, i, j].item() == pytest.approx(want)


def test_rope_inv_freq_and_half_split_rotation():
    d, base = 8, 10000.0
    inv, factor = rope_scaling.rope_frequencies(d, base)
    assert factor == 1.0 and inv.dtype == torch.float32
    assert inv.tolist() == pytest.approx([base ** (-2 * i / d) for i in range(d // 2)], rel=1e-6)
    # half-split: pair (i, i + d/2) is rotated by angle p * inv[i], as a 2D rotation
    x = torch.randn(d)
    p = 5
    ang = torch.cat([p * inv, p * inv])
    y = positional.apply_rotary(x[None], ang.cos()[None], ang.sin()[None])[0]
    for i in range(d // 2):
        a = p * inv[i].item()
        x1, x2 = x[i].item(), x[i + d // 2].item()
        assert y[i].item() == pytest.approx(x1 * math.cos(a) - x2 * math.sin(a), abs=1e-5)
        assert y[i + d // 2].item() == pytest.approx(x1 * math.sin(a) + x2 * math.cos(a), abs=1e-5)


def test_rope_scores_depend_only_on_offset_and_partial_rotary_passes_through():
    m = tiny_model('rope', pos_options={'rotary_pct': 0.5})  # head_dim 8 -> rotate 4 dims
    pe = m.pe
    q = torch.randn(1, 1, 1, 8).expand(1, 1, 64, 8).contiguous()
    k = torch.randn(1, 1, 1, 8).expand(1, 1, 64, 8).contiguous()
    pos = torch.arange(64)
    qr, kr = pe.transform_qk(q, k, pe.context(pos, pos), None)
    assert torch.equal(qr[..., 4:], q[..., 4:])  # un-rotated half untouched
    s = qr[0, 0] @ kr[0, 0].T  # [64, 64]
    for off in (0, 3, 17):
        diag = torch.diagonal(s, -off)
        assert torch.allclose(diag, diag[0].expand_as(diag), atol=1e-4)
    assert not torch.allclose(torch.diagonal(s, 0)[0], torch.diagonal(s, -3)[0])


def test_rope_rejects_odd_rotary_dim():
    with pytest.raises(ValueError, match='even'):
        tiny_model('rope', pos_options={'rotary_pct': 0.375})  # 8 * 0.375 = 3


def test_unknown_scheme_lists_valid_ones():
    with pytest.raises(ValueError) as e:
        tiny_model('ropee')
    for name in SCHEMES:
        assert name in str(e.value)


def test_learned_past_table_says_which_schemes_can():
    m = tiny_model('learned').eval()
    with pytest.raises(ValueError) as e:
        m(torch.zeros(1, 17, dtype=torch.long))
    msg = str(e.value)
    assert '16 positions' in msg and 'rope' in msg and 'alibi' in msg and 'learned,' not in msg


# --- model properties for every registered scheme ---

@pytest.mark.parametrize('scheme', SCHEMES)
def test_causal(scheme):
    m = tiny_model(scheme).eval()
    x = torch.randint(0, 37, (2, 16))
    y = x.clone()
    y[:, 9:] = torch.randint(0, 37, (2, 7))
    with torch.no_grad():
        a, _ = m(x)
        b, _ = m(y)
    assert torch.allclose(a[:, :9], b[:, :9], atol=1e-6)
    assert not torch.allclose(a[:, 9:], b[:, 9:], atol=1e-3)


@pytest.mark.parametrize('scheme', SCHEMES)
def test_kv_cache_matches_full_forward(scheme):
    m = tiny_model(scheme).eval()
    T = 16 if m.pe.max_len else 40  # decode past block_size where the scheme allows it
    x = torch.randint(0, 37, (2, T))
    with torch.no_grad():
        full, _ = m(x)
        cache = m.new_cache()
        outs = [m(x[:, :7], cache=cache)[0]]
        outs += [m(x[:, t:t + 1], cache=cache)[0] for t in range(7, T - 3)]
        outs.append(m(x[:, T - 3:], cache=cache)[0])  # a multi-token chunk after the cache too
    assert torch.allclose(torch.cat(outs, 1), full, atol=1e-5)


@pytest.mark.parametrize('scheme', SCHEMES)
def test_forward_at_4x_block_size(scheme):
    m = tiny_model(scheme).eval()
    x = torch.randint(0, 37, (1, 64))
    if m.pe.max_len is not None and m.pe.max_len < 64:
        with pytest.raises(ValueError, match='positions'):
            m(x)
        return
    with torch.no_grad():
        logits, loss = m(x, x)
    assert logits.shape == (1, 64, 37) and torch.isfinite(logits).all()
    # the first block_size logits are those of a forward over just those tokens
    assert torch.allclose(logits[:, :16], m(x[:, :16])[0], atol=1e-5)


@pytest.mark.parametrize('scheme', SCHEMES)
def test_training_lowers_loss(scheme):
    assert_trains_and_pe_params_learn(tiny_model(scheme))


def test_generate_learned_falls_back_to_sliding_window():
    m = tiny_model('learned').eval()
    torch.manual_seed(0)
    out = m.generate(torch.zeros(1, 1, dtype=torch.long), 40, top_k=1)
    assert out.shape == (1, 41)
    # greedy step past the table = argmax of a forward over the last 16 tokens
    with torch.no_grad():
        want = m(out[:, 24:40])[0][0, -1].argmax()
    assert out[0, 40] == want


@pytest.mark.parametrize('scheme', [s for s in SCHEMES if s != 'learned'])
def test_generate_with_cache_equals_without(scheme):
    m = tiny_model(scheme).eval()
    torch.manual_seed(1)
    a = m.generate(torch.zeros(1, 3, dtype=torch.long), 30, top_k=1)
    b = m.generate(torch.zeros(1, 3, dtype=torch.long), 30, top_k=1, use_cache=False)
    assert torch.equal(a, b)


BIAS_SCHEMES = [s for s in SCHEMES if has_attention_mod(s)]  # derived from the hooks, not the name


@pytest.mark.parametrize('scheme', BIAS_SCHEMES)
def test_flex_attention_equals_dense_on_cpu(scheme):
    """Compiled FlexAttention forward (CPU, no grad) gives the dense path's logits."""
    m = tiny_model(scheme, block_size=64).eval()
    x = torch.randint(0, 37, (2, 128))  # 2 flex blocks: exercises the block mask
    with torch.no_grad():
        dense, _ = m(x)
        for blk in m.transformer.h:
            blk.attn.backend = 'flex'
        flex, _ = m(x)
    assert torch.allclose(dense, flex, atol=1e-4)
