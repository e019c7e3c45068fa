"""Every scheme's maths against independent formulas written here or published values (not calls
into the code under test; for the content-dependent schemes of issue 16, scalar loops over (query,
key) pairs that share no code with positional.py), in the order positional.py lists the zoo:
embeddings (learned, sinusoidal), q/k transforms (RoPE, xPos, M-RoPE, 2D RoPE, Transformer-XL, PoPE),
score biases (ALiBi, T5, Shaw, KERPLE, FIRE, Sandwich, causal DeBERTa), schemes with their own
attention (FoX, CoPE, stick-breaking); then FlexAttention == dense for the bias schemes, option
errors, configs and docstrings, and the gradients of learned position parameters. Causality,
KV-cache parity, long forwards, training, the backward graph, graph breaks and bf16 are parametrized
over the registry in test_model.py."""
import inspect
import math
import os
import re

import pytest
import torch

import attention as A
import kvcache
import model as M
import positional
import positional as P
import rope_scaling
from conftest import ROOT, assert_kv_cache_matches_full_forward, tiny_config, tiny_model


def dense_bias(pe, layer, q, q_pos, k_pos):
    """The scheme's score bias as a dense [B|1, H, Tq, Tk] tensor (future = -inf)."""
    ctx = pe.context(q_pos, k_pos)
    k = torch.zeros(q.size(0), q.size(1), len(k_pos), q.size(3))
    return A.dense_bias(pe.score_mod(q, k, ctx, layer), q.size(0), q.size(1), len(q_pos), len(k_pos), q.device)


NEW = ['fox', 'cope', 'pope', 'stick_breaking', 'deberta', 'grape_m', 'grape_a', 'fope', 'ropepp', 'selective_rope']


def sig(x):
    return 1.0 / (1.0 + math.exp(-x))


def softplus(x):
    return math.log1p(math.exp(x))


def run_hooks(pe, layer, q, k, v, x, q_pos, k_pos, cache=None, backend='dense'):
    """What CausalSelfAttention does with a scheme: context, transform_qk, the attention hook."""
    ctx = pe.context(q_pos, k_pos)
    qq, kk = pe.transform_qk(q, k, ctx, layer)
    return pe.attention(qq, kk, v, x, ctx, layer, cache, A.Attender(backend=backend))


def run_hooks_in_two_calls(pe, layer, q, k, v, x, split):
    """The same tokens in two forwards through one KV cache (tokens :split, then split:): both outputs, joined
    along time, and the cache, whose state holds what the scheme carried from the first call to the second."""
    pos, cache = torch.arange(q.size(2)), kvcache.LayerKV()
    k1, v1 = cache.append(k[:, :, :split], v[:, :, :split])
    a = run_hooks(pe, layer, q[:, :, :split], k1, v1, x[:, :split], pos[:split], pos[:split], cache)
    k2, v2 = cache.append(k[:, :, split:], v[:, :, split:])
    b = run_hooks(pe, layer, q[:, :, split:], k2, v2, x[:, split:], pos[split:], pos, cache)
    return torch.cat((a, b), 2), cache


def softmax_attend(logits, vs):
    """softmax over a list of scalar logits, then the weighted sum of the value vectors."""
    m = max(logits)
    w = [math.exp(z - m) for z in logits]
    s = sum(w)
    return sum((wi / s) * vi for wi, vi in zip(w, vs))


def qkv(B, H, Tq, Tk, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, Tq, d, generator=g, dtype=torch.float64).float(),
            torch.randn(B, H, Tk, d, generator=g, dtype=torch.float64).float(),
            torch.randn(B, H, Tk, d, generator=g, dtype=torch.float64).float())


# --- learned and sinusoidal embeddings ------------------------------------------

def test_sinusoidal_table_matches_paper_formula():
    d, n = 16, 50
    pe = positional.sinusoidal_table(n, d)
    for p in (0, 1, 7, 49):
        for i in range(d // 2):
            w = 1.0 / (10000 ** (2 * i / d))
            assert pe[p, 2 * i].item() == pytest.approx(math.sin(p * w), abs=1e-6)
            assert pe[p, 2 * i + 1].item() == pytest.approx(math.cos(p * w), abs=1e-6)


def test_learned_past_table_says_which_schemes_can():
    m = tiny_model('learned').eval()
    with pytest.raises(ValueError) as e:
        m(torch.zeros(1, 17, dtype=torch.long))
    msg = str(e.value)
    assert '16 positions' in msg and 'rope' in msg and 'alibi' in msg and 'learned,' not in msg


# --- RoPE -----------------------------------------------------------------------

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
    pe = m.pe.at(0)
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


@pytest.mark.parametrize('opts', [{}, {'rotary_pct': 0.5}, {'p_rope': 0.5},
                                  {'scaling': {'type': 'yarn', 'factor': 4.0}}])
def test_rope_tables_give_the_cos_and_sin_it_computes(opts, monkeypatch):
    """Where RoPE reads cos/sin from its build-time tables (positional.ROTARY_TABLES_ON: CUDA; forced onto the CPU
    here), a forward equals the computed one bitwise (float32, the same ATen ops), for plain RoPE, partial rotary,
    p-RoPE and YaRN's attention factor; the KV cache (new positions, cached keys from the tables) still equals the
    full forward; and positions past the tables (n_pos > block_size) are computed: a model 4x past its length gives
    the logits it gave before."""
    x = torch.randint(0, 37, (2, 16), generator=torch.Generator().manual_seed(0))
    long = torch.randint(0, 37, (1, 64), generator=torch.Generator().manual_seed(1))
    m = tiny_model('rope', pos_options=opts)
    with torch.no_grad():
        want, want_long = m(x)[0], m(long)[0]
        monkeypatch.setattr(positional, 'ROTARY_TABLES_ON', ('cpu',))
        ctx = m.pe.at(0).context(torch.arange(16), torch.arange(16), 16)
        assert ctx.extra['tabled']
        assert torch.equal(m(x)[0], want) and torch.equal(m(long)[0], want_long)
    assert_kv_cache_matches_full_forward(m)


def test_rope_rejects_odd_rotary_dim():
    with pytest.raises(ValueError, match='even'):
        tiny_model('rope', pos_options={'rotary_pct': 0.375})  # 8 * 0.375 = 3


# --- xPos -----------------------------------------------------------------------

def rope_half_split(x, pos, base=10000.0):
    d = x.size(-1)
    th = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = pos.double()[:, None] * th
    cos, sin = torch.cat((ang.cos(), ang.cos()), -1), torch.cat((ang.sin(), ang.sin()), -1)
    x1, x2 = x.double().chunk(2, -1)
    return x.double() * cos + torch.cat((-x2, x1), -1) * sin


def test_xpos_scale_and_centring():
    """q.k == RoPE(q_n) zeta^(n/512) . RoPE(k_m) zeta^(-m/512), zeta_i = (2i + 0.4d)/(1.4d),
    whatever centre the forward chose: a forward over keys 250..309 centres elsewhere
    than one over keys 0..309, which rescales q and k but not their logits."""
    torch.manual_seed(0)
    pe = P.REGISTRY['xpos'](tiny_config('xpos'))
    d = 8
    zeta = (torch.arange(0, d, 2, dtype=torch.float64) + 0.4 * d) / (1.4 * d)
    assert zeta[0].item() == pytest.approx(2 / 7) and (zeta < 1).all()
    zeta = torch.cat((zeta, zeta))
    q_pos, k_pos = torch.arange(300, 310), torch.arange(0, 310)
    q, k = torch.randn(1, 4, 10, d), torch.randn(1, 4, 310, d)
    qa, ka = pe.transform_qk(q, k, pe.context(q_pos, k_pos), None)
    qr = rope_half_split(q, q_pos) * zeta ** (q_pos.double()[:, None] / 512)
    kr = rope_half_split(k, k_pos) * zeta ** (-k_pos.double()[:, None] / 512)
    want = qr @ kr.transpose(-2, -1)
    assert torch.allclose((qa @ ka.transpose(-2, -1)).double(), want, rtol=1e-4, atol=1e-4)
    qb, kb = pe.transform_qk(q, k[:, :, 250:], pe.context(q_pos, k_pos[250:]), None)
    assert not torch.allclose(qa, qb, rtol=1e-2)
    assert torch.allclose((qb @ kb.transpose(-2, -1)).double(), want[..., 250:], rtol=1e-4, atol=1e-4)


def test_xpos_centring_avoids_overflow():
    """At 60k positions an uncentred zeta^(-m/512) overflows float32; the centred one does not."""
    pe = P.REGISTRY['xpos'](tiny_config('xpos'))
    pos = torch.arange(60000)
    _, _, scale = pe.context(pos, pos).extra['k']
    assert torch.isfinite(scale).all() and (scale > 0).all() and torch.isfinite(1 / scale).all()
    uncentred = torch.tensor(2 / 7, dtype=torch.float32) ** (-pos[-1:].float() / 512)
    assert torch.isinf(uncentred).all()


def test_xpos_blockwise_attention():
    """Evaluation only: each query sees its own block and the previous one. Up to
    2 blocks nothing changes; past that, logits change, and keys two blocks back are
    masked. KV-cache decoding agrees with a full forward."""
    torch.manual_seed(0)
    plain = tiny_model('xpos')
    bca = tiny_model('xpos', pos_options={'blockwise': True, 'bca_block': 8})
    bca.load_state_dict(plain.state_dict())
    plain.eval(), bca.eval()
    x = torch.randint(0, 37, (2, 40))
    with torch.no_grad():
        a, b = plain(x)[0], bca(x)[0]
        assert torch.allclose(a[:, :16], b[:, :16], atol=1e-6) and not torch.allclose(a[:, 16:], b[:, 16:])
        cache = bca.new_cache()
        steps = [bca(x[:, :28], cache=cache)[0]] + [bca(x[:, t:t + 1], cache=cache)[0] for t in range(28, 40)]
        assert torch.allclose(torch.cat(steps, 1), b, atol=1e-5)
    bca.train()
    assert bca.pe.at(0).score_mod(None, None, None, None) is None  # training uses plain causal attention
    pe = bca.pe.at(0).eval()
    q, pos = torch.randn(1, 4, 40, 8), torch.arange(40)
    bias = dense_bias(pe, None, q, pos, pos)[0, 0]
    assert torch.isinf(bias[16, :8]).all() and torch.isfinite(bias[16, 8:17]).all()
    assert torch.isinf(bias[39, :24]).all() and torch.isfinite(bias[39, 24:]).all()


# --- M-RoPE and 2D RoPE -----------------------------------------------------------

def test_mrope_equals_rope_for_text():
    x = torch.randint(0, 37, (2, 40))
    rope, mrope = tiny_model('rope', seed=3), tiny_model('mrope', seed=3)
    assert mrope.pe.at(0).sections == [1, 1, 2]  # head_dim 8: 4 pairs
    with torch.no_grad():
        assert torch.equal(rope(x)[0], mrope(x)[0])  # bit for bit
    cfg = tiny_config('mrope', n_embd=128 * 4, n_head=4)
    assert P.REGISTRY['mrope'](cfg).sections == [16, 24, 24]  # Qwen2-VL's split at head_dim 128


def test_rope2d_rotates_rows_and_columns():
    """Pairs 0..d/4-1 turn by row * base^(-4i/d), pairs d/4..d/2-1 by col * base^(-4i/d)."""
    width, d = 5, 8
    pe = P.REGISTRY['rope2d'](tiny_config('rope2d'), width=width)
    pos = torch.arange(23)
    x = torch.randn(1, 4, 23, d)
    got, _ = pe.transform_qk(x, x, pe.context(pos, pos), None)
    th = 10000.0 ** (-4 * torch.arange(d // 4, dtype=torch.float64) / d)
    ang = torch.cat(((pos // width).double()[:, None] * th, (pos % width).double()[:, None] * th), -1)  # [T, d/2]
    cos, sin = torch.cat((ang.cos(), ang.cos()), -1), torch.cat((ang.sin(), ang.sin()), -1)
    x1, x2 = x.double().chunk(2, -1)
    want = x.double() * cos + torch.cat((-x2, x1), -1) * sin
    assert torch.allclose(got.double(), want, atol=1e-5)


# --- Transformer-XL -------------------------------------------------------------

def test_xl_matches_per_pair_formula():
    """[(q_i + u).k_j + (q_i + v).W_R R_{i-j}] / sqrt(d), R_r = [sin(r w) | cos(r w)],
    against the scores the rewritten q', k' give under SDPA's 1/sqrt(dim)."""
    torch.manual_seed(0)
    pe = P.REGISTRY['xl'](tiny_config('xl'), r_dim=12)
    layer = pe.new_layer()
    with torch.no_grad():
        pe.u.normal_(), pe.v.normal_(), layer.weight.normal_()
    H, d, rd = 4, 8, 12
    pos = torch.arange(30, 40)  # positions far from 0: only differences may matter
    q, k = torch.randn(2, H, 10, d), torch.randn(2, H, 10, d)
    ctx = pe.context(pos, pos)
    q2, k2 = pe.transform_qk(q, k, ctx, layer)
    got = q2 @ k2.transpose(-2, -1) / math.sqrt(q2.size(-1))
    w = 10000.0 ** (-torch.arange(0, rd, 2, dtype=torch.float64) / rd)
    W = layer.weight.detach().double().view(H, d, rd)
    qd, kd, u, v = q.double(), k.double(), pe.u.detach().double(), pe.v.detach().double()
    for i in range(10):
        for j in range(i + 1):
            r = (pos[i] - pos[j]).item()
            R = torch.cat(((r * w).sin(), (r * w).cos()))
            for b in range(2):
                for h in range(H):
                    want = ((qd[b, h, i] + u[h]) @ kd[b, h, j] + (qd[b, h, i] + v[h]) @ (W[h] @ R)) / math.sqrt(d)
                    assert abs(got[b, h, i, j].item() - want.item()) < 1e-4


# --- PoPE -----------------------------------------------------------------------

def test_pope_scores_match_polar_formula():
    """q'.k'/sqrt(2d) == sum_c softplus(q_c) softplus(k_c) cos((s - t) theta_c + delta_c) / sqrt(d),
    theta_c = 10000^(-c/d), c = 0..d-1, delta clamped to [-2 pi, 0]; positions far from 0."""
    torch.manual_seed(0)
    pe = P.REGISTRY['pope'](tiny_config('pope'))
    layer = pe.new_layer()
    assert (layer.delta == 0).all()
    with torch.no_grad():
        layer.delta.uniform_(-2 * math.pi, 0)
        layer.delta[0, :3] = torch.tensor([1.0, -7.0, -0.5])  # outside the range: clamped
    d, H = 8, 4
    pos = torch.arange(300, 310)
    q, k, _ = qkv(1, H, 10, 10, d, seed=2)
    ctx = pe.context(pos, pos)
    q2, k2 = pe.transform_qk(q, k, ctx, layer)
    assert q2.shape[-1] == 2 * d
    got = (q2 @ k2.transpose(-2, -1)) / math.sqrt(2 * d)  # what SDPA computes
    delta = layer.delta.detach().double().clamp(-2 * math.pi, 0)
    assert delta[0, 0] == 0 and delta[0, 1] == -2 * math.pi
    for h in range(H):
        for ti in range(10):
            for si in range(ti + 1):
                t, s = pos[ti].item(), pos[si].item()
                want = sum(softplus(q[0, h, ti, c].item()) * softplus(k[0, h, si, c].item())
                           * math.cos((s - t) * 10000 ** (-c / d) + delta[h, c].item())
                           for c in range(d)) / math.sqrt(d)
                assert abs(got[0, h, ti, si].item() - want) < 1e-4


def test_pope_options():
    m = tiny_model('pope', pos_options={'delta_init': 'uniform'})
    dl = m.transformer.h[1].attn.pe_layer.delta
    assert dl.shape == (4, 8) and (dl <= 0).all() and (dl >= -2 * math.pi).all() and dl.std() > 0.5
    with pytest.raises(ValueError, match='delta_init'):
        tiny_model('pope', pos_options={'delta_init': 'normal'})


# --- ALiBi ----------------------------------------------------------------------

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
    pe = m.pe.at(0)
    q_pos = torch.arange(6)
    ctx = pe.context(q_pos, q_pos)
    bias = A.dense_bias(pe.score_mod(None, None, ctx, None), 1, 4, 6, 6, 'cpu')[0]
    slopes = positional.alibi_slopes(4)
    for h in range(4):
        for i in range(6):
            for j in range(6):
                want = -slopes[h].item() * (i - j) if j <= i else float('-inf')
                assert bias[h, i, j].item() == pytest.approx(want)


# --- T5 -----------------------------------------------------------------------

def t5_bucket_reference(rel, num_buckets=32, max_distance=128, bidirectional=False):
    """Mesh TF's _relative_position_bucket, scalar Python."""
    nb, ret = num_buckets, 0
    n = -rel
    if bidirectional:
        nb //= 2
        ret += nb if n < 0 else 0
        n = abs(n)
    else:
        n = max(n, 0)
    max_exact = nb // 2
    if n < max_exact:
        return ret + n
    return ret + min(nb - 1, max_exact + int(math.log(n / max_exact) / math.log(max_distance / max_exact)
                                             * (nb - max_exact)))


def test_t5_bucket_published_facts():
    rel = -torch.arange(0, 1000)  # key - query for keys in the past
    b = P.t5_bucket(rel)
    assert b[:16].tolist() == list(range(16))                 # exact buckets below num_buckets/2
    assert b[112].item() == 30 and b[113].item() == 31        # the top causal bucket starts at 113, not 128
    assert (b[113:] == 31).all()                              # and holds everything beyond
    assert (b.diff() >= 0).all() and set(b.tolist()) == set(range(32))
    assert P.t5_bucket(torch.tensor([1, 5, 100])).tolist() == [0, 0, 0]  # causal: future keys -> bucket 0


@pytest.mark.parametrize('nb,md,bidir', [(32, 128, False), (32, 128, True), (16, 64, False), (8, 20, True)])
def test_t5_bucket_matches_reference(nb, md, bidir):
    rel = torch.arange(-400, 401)
    got = P.t5_bucket(rel, nb, md, bidir).tolist()
    assert got == [t5_bucket_reference(r, nb, md, bidir) for r in rel.tolist()]


def test_t5_bucket_bad_input():
    with pytest.raises(ValueError, match='max_distance'):
        P.t5_bucket(torch.tensor([-3]), num_buckets=32, max_distance=10)


def test_t5_bias_is_one_shared_table():
    m = tiny_model('t5', pos_options={'max_distance': 20})
    assert [n for n in m.state_dict() if n.startswith('pe.') or 'pe_layer' in n] == ['pe.table']
    pe, table = m.pe.at(0), m.pe.at(0).table
    q = torch.randn(1, 4, 40, 8)
    pos = torch.arange(40)
    bias = dense_bias(pe, None, q, pos, pos)[0]
    for i, j in [(0, 0), (5, 2), (39, 0), (30, 10), (39, 31)]:
        want = table[t5_bucket_reference(j - i, 32, 20), :]
        assert torch.allclose(bias[:, i, j], want)
    assert torch.isinf(bias[:, 3, 4]).all()


# --- Shaw -----------------------------------------------------------------------

def shaw_reference(q, k, v, aK, aV, K, q_pos, k_pos):
    """Per-pair loop: e_ij = q_i.(k_j + aK[r]) / sqrt(d), z_i = sum_j a_ij (v_j + aV[r]), r = min(i - j, K)."""
    B, H, Tq, d = q.shape
    out = torch.zeros(B, H, Tq, d)
    for b in range(B):
        for h in range(H):
            for qi, i in enumerate(q_pos.tolist()):
                js = [kj for kj, j in enumerate(k_pos.tolist()) if j <= i]
                rs = [min(i - k_pos[kj].item(), K) for kj in js]
                e = torch.stack([q[b, h, qi] @ (k[b, h, kj] + aK[r]) for kj, r in zip(js, rs)]) / math.sqrt(d)
                a = e.softmax(0)
                out[b, h, qi] = sum(a[n] * (v[b, h, kj] + aV[r]) for n, (kj, r) in enumerate(zip(js, rs)))
    return out


def shaw_attention(pe, layer, q, k, v, q_pos, k_pos, backend='dense'):
    ctx = pe.context(q_pos, k_pos)
    mod = pe.score_mod(q, k, ctx, layer)
    return A.attend(q, k, v, mod, pe.value_mod(q, k, ctx, layer, mod, A.Attender()), backend)


@pytest.mark.parametrize('q0', [0, 6])  # 6: the last queries of a cached sequence
@pytest.mark.parametrize('grad,chunk', [(True, False), (False, False), (False, True)])
def test_shaw_matches_per_pair_loop(q0, grad, chunk, monkeypatch):
    """With gradients the dense path's own softmax; without, SDPA's fused CPU kernel and its
    logsumexp, in one pass or in query chunks of 2 rows."""
    if chunk:
        monkeypatch.setattr(A, 'DENSE_CHUNK_BYTES', 4 * 2 * 4 * 11 * 2)
    torch.manual_seed(0)
    K = 3
    pe = P.REGISTRY['shaw'](tiny_config('shaw'), max_distance=K)
    layer = pe.new_layer()
    with torch.no_grad():
        layer.rel_k.normal_(), layer.rel_v.normal_()
    Tk = 11
    q, k, v = (torch.randn(2, 4, Tk - q0, 8), torch.randn(2, 4, Tk, 8), torch.randn(2, 4, Tk, 8))
    q_pos, k_pos = torch.arange(q0, Tk), torch.arange(Tk)
    with torch.set_grad_enabled(grad):
        got = shaw_attention(pe, layer, q, k, v, q_pos, k_pos)
    want = shaw_reference(q, k, v, layer.rel_k.detach(), layer.rel_v.detach(), K, q_pos, k_pos)
    assert torch.allclose(got, want, atol=1e-5)


# --- KERPLE ---------------------------------------------------------------------

@pytest.mark.parametrize('name', ['kerple_log', 'kerple_power'])
def test_kerple_formula_and_clamping(name):
    pe = P.REGISTRY[name](tiny_config(name))
    layer = pe.new_layer()
    with torch.no_grad():
        layer.p.copy_(torch.tensor([-1.0, 0.5, 1.5, 5.0]))
        layer.a.copy_(torch.tensor([-0.5, 0.3, 2.0, 0.0]))
    q, pos = torch.randn(1, 4, 20, 8), torch.arange(20)
    bias = dense_bias(pe, layer, q, pos, pos)[0]
    p_max = 2.0 if name == 'kerple_power' else float('inf')
    assert layer.p.tolist() == pytest.approx([0.01, 0.5, 1.5, min(5.0, p_max)])  # clamped in place, as in the paper
    assert layer.a.tolist() == pytest.approx([0.01, 0.3, 2.0, 0.01])
    p, a = layer.p.tolist(), layer.a.tolist()
    for h in range(4):
        for i, j in [(0, 0), (7, 6), (19, 0), (12, 3)]:
            r = i - j
            want = -p[h] * math.log(1 + a[h] * r) if name == 'kerple_log' else -a[h] * r ** p[h]
            assert bias[h, i, j].item() == pytest.approx(want, rel=1e-5, abs=1e-6)


def test_kerple_power_gradient_finite_at_zero_distance():
    m = tiny_model('kerple_power')
    x = torch.randint(0, 37, (2, 16))
    m(x, x)[1].backward()
    for blk in m.transformer.h:
        g = blk.attn.pe_layer.p.grad
        assert torch.isfinite(g).all() and g.abs().sum() > 0


# --- FIRE -----------------------------------------------------------------------

def fire_reference(layer, i, j):
    """MLP(psi(i - j) / psi(max(i, L))), psi(x) = log(c x + 1), written out."""
    c, L = layer.c.item(), abs(layer.L_mult.item() * layer.init_L.item())
    x = math.log(abs(c * (i - j)) + 1) / (math.log(abs(c * max(i, L)) + 1) + 1e-6)
    hidden = torch.relu(layer.fc1.weight[:, 0] * x + layer.fc1.bias)
    return layer.fc2.weight @ hidden + layer.fc2.bias  # [H]


def test_fire_normalisation():
    torch.manual_seed(0)
    pe = P.REGISTRY['fire'](tiny_config('fire'), init_L=8.0)
    layer = pe.new_layer()
    q, pos = torch.randn(1, 4, 40, 8), torch.arange(40)
    with torch.no_grad():
        bias = dense_bias(pe, layer, q, pos, pos)[0]
        for i, j in [(0, 0), (3, 1), (7, 0), (8, 0), (20, 5), (39, 38), (39, 0)]:
            assert torch.allclose(bias[:, i, j], fire_reference(layer, i, j), atol=1e-5)
        # below the threshold (8) the normaliser is fixed: the bias depends on i - j only
        assert torch.allclose(bias[:, 5, 2], bias[:, 7, 4])
        # above it, the farthest key always sits at normalised distance 1: same bias at any length
        for i in (8, 20, 39):
            assert torch.allclose(bias[:, i, 0], bias[:, 8, 0], atol=1e-5)
        # and distances shrink as the query moves on (progressive interpolation)
        assert not torch.allclose(bias[:, 20, 10], bias[:, 39, 29])
    # with gradients the bias is tabulated by another code path (all units broadcast at once): same values
    trained = dense_bias(pe, layer, q, pos, pos)[0]
    assert trained.requires_grad
    keep = torch.isfinite(bias)
    assert torch.equal(keep, torch.isfinite(trained))
    assert torch.allclose(trained[keep], bias[keep], atol=1e-5)


# --- Sandwich -------------------------------------------------------------------

def test_sandwich_formula():
    cfg = tiny_config('sandwich')
    pe = P.REGISTRY['sandwich'](cfg)
    q, pos = torch.randn(1, 4, 50, 8), torch.arange(50)
    bias = dense_bias(pe, None, q, pos, pos)[0]
    d, H = cfg.n_embd, cfg.n_head
    for i, j in [(0, 0), (1, 0), (10, 3), (49, 0)]:
        s = sum(math.cos((i - j) * 10000 ** (-2 * k / d)) for k in range(1, d // 2 + 1)) - d / 2
        for h in range(1, H + 1):
            assert bias[h - 1, i, j].item() == pytest.approx(s / (8 * h / H), abs=1e-5)
    assert bias[:, 0, 0].abs().max() < 1e-6
    finite = torch.isfinite(bias)
    assert (bias[finite] <= 1e-6).all()


# --- DeBERTa --------------------------------------------------------------------

def deberta_bucket_reference(rel, bucket_size, max_position):
    """The authors' make_log_bucket_position, one integer at a time."""
    rel = max(-(max_position - 1), min(max_position - 1, rel))
    mid = bucket_size // 2
    abs_pos = mid - 1 if -mid < rel < mid else abs(rel)
    if abs_pos <= mid:
        return rel
    log_pos = math.ceil(math.log(abs_pos / mid) / math.log((max_position - 1) / mid) * (mid - 1)) + mid
    return int(log_pos * (1 if rel > 0 else -1))


@pytest.mark.parametrize('nb,mx', [(256, 512), (8, 16), (32, 128), (6, 40)])
def test_deberta_log_bucket_matches_reference(nb, mx):
    rel = torch.arange(-2 * mx, 2 * mx + 1)
    got = P.deberta_log_bucket(rel, nb, mx).tolist()
    assert got == [deberta_bucket_reference(r, nb, mx) for r in rel.tolist()]


def test_deberta_log_bucket_published_facts():
    b = P.deberta_log_bucket(torch.arange(0, 2000), 256, 512)  # DeBERTa-v3: 256 buckets, 512 positions
    assert b[:129].tolist() == list(range(129))  # exact up to bucket_size / 2
    assert b[511].item() == 255 and (b[511:] == 255).all()  # the farthest bucket, and everything beyond
    assert (b.diff() >= 0).all() and b[129].item() > 128
    assert torch.equal(P.deberta_log_bucket(-torch.arange(0, 2000), 256, 512), -b)  # odd


@pytest.mark.parametrize('k,mx', [(8, 16), (64, 128), (7, 16), (5, 40)])
def test_deberta_causal_table_rows_read(k, mx):
    """Which rows of P a causal model reads, counted through the reference bucket (not the code
    under test): c2p reads k + b(d), p2c reads k - b(d) for d = i - j >= 0. Row 0 is never read;
    an odd k leaves rows 1 and 2k - 1 unread too; the farthest distance lands on 2 * (k // 2) - 1."""
    b = [deberta_bucket_reference(d, k, mx) for d in range(4 * mx)]
    read = {min(2 * k - 1, max(0, k + s * x)) for x in b for s in (1, -1)}
    unread = sorted(set(range(2 * k)) - read)
    assert unread == ([0] if k % 2 == 0 else [0, 1, 2 * k - 1])
    assert b[mx - 1] == 2 * (k // 2) - 1 == (k - 1 if k % 2 == 0 else k - 2)
    m = P.REGISTRY['deberta'](tiny_config('deberta', block_size=mx), position_buckets=k, max_relative_positions=mx)
    ctx = m.context(torch.arange(4 * mx), torch.arange(4 * mx))
    assert sorted(set(ctx.extra['c2p'].tolist()) | set(ctx.extra['p2c'].tolist())) == sorted(read)


def test_deberta_score_matches_disentangled_formula():
    """z_ij = (Q_i.K_j + Q_i.K^r[k + b(i - j)] + K_j.Q^r[k + b(j - i)]) / sqrt(3d), indices clamped to
    [0, 2k), K^r = P W_kr, Q^r = P W_qr split into heads; the last queries of a cached sequence, with
    distances past max_relative_positions."""
    torch.manual_seed(0)
    nb, mx = 8, 12
    pe = P.REGISTRY['deberta'](tiny_config('deberta'), position_buckets=nb, max_relative_positions=mx)
    layer = pe.new_layer()
    with torch.no_grad():
        pe.rel_emb.normal_(), layer.pos_k.weight.normal_(std=0.3), layer.pos_q.weight.normal_(std=0.3)
    H, d, Tk, q0 = 4, 8, 30, 20
    q, k, _ = qkv(2, H, Tk - q0, Tk, d, seed=5)
    q_pos, k_pos = torch.arange(q0, Tk), torch.arange(Tk)
    ctx = pe.context(q_pos, k_pos)
    qq, kk = pe.transform_qk(q, k, ctx, layer)
    with torch.no_grad():
        bias = A.dense_bias(pe.score_mod(qq, kk, ctx, layer), 2, H, Tk - q0, Tk, 'cpu')
        got = (qq @ kk.transpose(-2, -1)) / math.sqrt(d) + bias  # what the attention scores
    Pm = pe.rel_emb.detach().double()
    Kr = Pm @ layer.pos_k.weight.detach().double().t()  # [2k, n_embd], head h = columns h*d..h*d+d-1
    Qr = Pm @ layer.pos_q.weight.detach().double().t()
    for b in range(2):
        for h in range(H):
            for qi in range(Tk - q0):
                i = qi + q0
                for j in range(Tk):
                    if j > i:
                        assert got[b, h, qi, j].item() == float('-inf')
                        continue
                    c2p = min(max(nb + deberta_bucket_reference(i - j, nb, mx), 0), 2 * nb - 1)
                    p2c = min(max(nb + deberta_bucket_reference(j - i, nb, mx), 0), 2 * nb - 1)
                    Q, K = q[b, h, qi].double(), k[b, h, j].double()
                    want = (Q @ K + Q @ Kr[c2p, h * d:(h + 1) * d] + K @ Qr[p2c, h * d:(h + 1) * d]) / math.sqrt(3 * d)
                    assert abs(got[b, h, qi, j].item() - want.item()) < 1e-4


def test_deberta_defaults_and_causal_rows():
    m = tiny_model('deberta')  # block_size 16: 8 buckets, 16 relative positions
    assert (m.pe.at(0).buckets, m.pe.at(0).max_rel) == (8, 16) and m.pe.at(0).rel_emb.shape == (16, 32)
    assert [n for n in m.state_dict() if n.startswith('pe.')] == ['pe.rel_emb']  # P shared by layers
    x = torch.randint(0, 37, (2, 16))
    m(x, x)[1].backward()
    g = m.pe.at(0).rel_emb.grad.abs().sum(-1)
    assert (g[1:8] > 0).all() and (g[8:] > 0).all()  # p2c reads rows below k, c2p rows from k: both halves train
    with pytest.raises(ValueError, match='position_buckets'):
        tiny_model('deberta', pos_options={'position_buckets': 8, 'max_relative_positions': 5})


# --- FoX ------------------------------------------------------------------------

def fox_reference(q, k, v, log_f, off):
    """logit_ij = q_i.k_j/sqrt(d) + sum_{l=j+1..i} log f_l over keys j <= i (query i is key i + off)."""
    B, H, Tq, d = q.shape
    out = torch.zeros(B, H, Tq, v.size(-1), dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for qi in range(Tq):
                i = qi + off
                logits = [(q[b, h, qi] @ k[b, h, j]).item() / math.sqrt(d) + sum(log_f[b][h][j + 1:i + 1])
                          for j in range(i + 1)]
                out[b, h, qi] = softmax_attend(logits, [v[b, h, j].double() for j in range(i + 1)])
    return out


def fox_log_gates(layer, x):
    """log sigmoid(w_h . x_t + b_h), as Python lists [B][H][T]."""
    W, bias = layer.fgate.weight.double(), layer.fgate.bias.double()
    B, T, _ = x.shape
    return [[[math.log(sig((W[h] @ x[b, t].double()).item() + bias[h].item())) for t in range(T)]
             for h in range(W.size(0))] for b in range(B)]


def test_fox_matches_per_pair_loop_with_and_without_cache():
    torch.manual_seed(0)
    pe = P.REGISTRY['fox'](tiny_config('fox'))
    layer = pe.new_layer()
    with torch.no_grad():
        layer.fgate.weight.normal_(std=0.5), layer.fgate.bias.uniform_(-1, 3)
    T, split = 11, 6
    q, k, v = qkv(2, 4, T, T, 8)
    x = torch.randn(2, T, 32)
    log_f = fox_log_gates(layer, x)
    want = fox_reference(q, k, v, log_f, 0)
    pos = torch.arange(T)
    with torch.no_grad():
        full = run_hooks(pe, layer, q, k, v, x, pos, pos)
        assert torch.allclose(full.double(), want, atol=1e-5)
        # the same tokens in two forwards through a cache: the gates of cached keys come from cache.state
        got, cache = run_hooks_in_two_calls(pe, layer, q, k, v, x, split)
    assert cache.state['fox_log_f'].shape == (2, 4, T)  # one log gate per key, aligned with the cache
    assert torch.allclose(got.double(), want, atol=1e-5)


def test_fox_defaults_and_no_other_position_signal():
    m = tiny_model('fox')
    gate = m.transformer.h[0].attn.pe_layer.fgate
    assert gate.weight.shape == (4, 32) and (gate.bias == 0).all()  # the authors' init: N(0, 0.02), bias 0
    assert abs(gate.weight.std().item() - 0.02) < 0.005
    # with every gate at 1 (log f = 0) FoX is NoPE: the decay is its only position signal
    nope = tiny_model('none')
    with torch.no_grad():
        for blk in m.transformer.h:
            blk.attn.pe_layer.fgate.weight.zero_()
            blk.attn.pe_layer.fgate.bias.fill_(60.0)  # sigmoid(60) == 1 in float32
        nope.load_state_dict({n: p for n, p in m.state_dict().items() if 'pe_layer' not in n})
        x = torch.randint(0, 37, (2, 16))
        assert torch.allclose(m(x)[0], nope(x)[0], atol=1e-5)


# --- CoPE -----------------------------------------------------------------------

def cope_reference(q, k, v, e, npos_max, off):
    """g_it = sigmoid(q_i.k_t/sqrt(d)), p_ij = min(sum_{t=j..i} g_it, npos_max - 1),
    logit_ij = q_i.k_j/sqrt(d) + q_i.e[p_ij], e[p] = (1 - w) e[floor p] + w e[ceil p], w = p - floor p."""
    B, H, Tq, d = q.shape
    out = torch.zeros(B, H, Tq, v.size(-1), dtype=torch.float64)
    e = e.double()
    for b in range(B):
        for h in range(H):
            for qi in range(Tq):
                i = qi + off
                qv = q[b, h, qi].double()
                z = [(qv @ k[b, h, t].double()).item() / math.sqrt(d) for t in range(i + 1)]
                logits = []
                for j in range(i + 1):
                    p = min(sum(sig(z[t]) for t in range(j, i + 1)), npos_max - 1)
                    lo, hi = math.floor(p), math.ceil(p)
                    w = p - lo
                    e_p = (1 - w) * e[lo] + w * e[hi]
                    logits.append(z[j] + (qv @ e_p).item())
                out[b, h, qi] = softmax_attend(logits, [v[b, h, j].double() for j in range(i + 1)])
    return out


@pytest.mark.parametrize('q0', [0, 7])  # 7: the last queries of a cached sequence
def test_cope_matches_per_pair_loop(q0):
    torch.manual_seed(0)
    npos = 4  # small, so positions are clipped
    pe = P.REGISTRY['cope'](tiny_config('cope'), npos_max=npos)
    layer = pe.new_layer()
    with torch.no_grad():
        layer.pos_emb.normal_()
    Tk = 12
    q, k, v = qkv(2, 4, Tk - q0, Tk, 8, seed=1)
    q = q * 2  # a spread of gates, so positions are fractional and some reach the clip
    with torch.no_grad():
        got = run_hooks(pe, layer, q, k, v, None, torch.arange(q0, Tk), torch.arange(Tk))
    want = cope_reference(q, k, v, layer.pos_emb, npos, q0)
    assert torch.allclose(got.double(), want, atol=1e-5)


def test_cope_defaults():
    m = tiny_model('cope')
    e = m.transformer.h[0].attn.pe_layer.pos_emb
    assert e.shape == (64, 8) and (e == 0).all()  # npos_max 64, one table per layer shared by heads, zero init
    assert not [n for n, _ in m.named_parameters() if n.startswith('pe.')]  # nothing outside the layers
    with pytest.raises(ValueError, match='npos_max'):
        tiny_model('cope', pos_options={'npos_max': 1})


# --- stick-breaking -------------------------------------------------------------

def stick_breaking_reference(q, k, v, off, attend_current, remainder):
    """A_ij = beta_ij prod_{j<l<i} (1 - beta_il) over keys j < i (j <= i and j<l<=i with
    attend_current), beta = sigmoid(q.k/sqrt(d)); o_i = sum_j A_ij v_j [+ (1 - sum_j A_ij) v_i]."""
    B, H, Tq, d = q.shape
    out = torch.zeros(B, H, Tq, v.size(-1), dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for qi in range(Tq):
                i = qi + off
                keys = range(i + 1) if attend_current else range(i)
                beta = {j: sig((q[b, h, qi].double() @ k[b, h, j].double()).item() / math.sqrt(d)) for j in keys}
                A = {j: beta[j] * math.prod(1 - beta[l] for l in keys if l > j) for j in keys}
                o = sum((A[j] * v[b, h, j].double() for j in keys), torch.zeros(v.size(-1), dtype=torch.float64))
                if remainder:
                    o = o + (1 - sum(A.values())) * v[b, h, i].double()
                out[b, h, qi] = o
    return out


@pytest.mark.parametrize('attend_current,remainder', [(False, True), (True, True), (False, False)])
@pytest.mark.parametrize('q0', [0, 6])
def test_stick_breaking_matches_per_pair_loop(attend_current, remainder, q0):
    pe = P.REGISTRY['stick_breaking'](tiny_config('stick_breaking'), attend_current=attend_current,
                                      remainder=remainder)
    Tk = 11
    q, k, v = qkv(2, 4, Tk - q0, Tk, 8, seed=3)
    q = q * 3  # logits of both signs and some size: breaks far from 1/2
    with torch.no_grad():
        got = run_hooks(pe, None, q, k, v, None, torch.arange(q0, Tk), torch.arange(Tk))
    want = stick_breaking_reference(q, k, v, q0, attend_current, remainder)
    assert torch.allclose(got.double(), want, atol=1e-5)


def test_stick_breaking_training_path_output_and_gradients_match_the_formula():
    """With gradients (the path training takes: one pass, no query chunks), the output and the gradients
    of q, k and v equal float64 autograd through the product form A_ij = beta_ij prod_{j<l<i} (1 - beta_il),
    written here without logs or cumulative sums, at a passkey-like length (41 tokens)."""
    pe = P.REGISTRY['stick_breaking'](tiny_config('stick_breaking', block_size=41)).train()
    B, H, T, d = 2, 2, 41, 8
    q, k, v = qkv(B, H, T, T, d, seed=5)
    q = q * 3  # logits of both signs and some size
    w = torch.randn(B, H, T, d, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    got = run_hooks(pe, None, *leaves, None, torch.arange(T), torch.arange(T))
    (got.double() * w).sum().backward()
    ref = [t.double().requires_grad_() for t in (q, k, v)]
    rq, rk, rv = ref
    beta = torch.sigmoid(rq @ rk.transpose(-2, -1) / math.sqrt(d))  # [B, H, T, T]
    rows = []
    for i in range(T):
        out = rv[:, :, i]  # all of the stick, before any key breaks it
        for j in range(i):
            a = beta[:, :, i, j] * torch.prod(1 - beta[:, :, i, j + 1:i], dim=-1)
            out = out + a[..., None] * (rv[:, :, j] - rv[:, :, i])  # A_ij v_j, and the leftover shrinks by A_ij
        rows.append(out)
    want = torch.stack(rows, 2)
    (want * w).sum().backward()
    assert torch.allclose(got.double(), want, atol=1e-5)
    for name, a, b in zip('qkv', leaves, ref):
        assert torch.allclose(a.grad.double(), b.grad, atol=1e-5), (name, (a.grad.double() - b.grad).abs().max())


def test_stick_breaking_weights_and_leftover_split_the_stick():
    pe = P.REGISTRY['stick_breaking'](tiny_config('stick_breaking'))
    q, k, _ = qkv(1, 4, 20, 20, 8, seed=4)
    A, rest = pe.weights(q * 4, k)
    assert (A >= 0).all() and torch.allclose(A.sum(-1) + rest, torch.ones(1, 4, 20), atol=1e-6)
    assert (torch.triu(A[0, 0]) == 0).all()  # keys j < i only by default
    assert rest[0, :, 0].eq(1).all()  # the first token has no key to break the stick: all of it is left over
    # equal logits: nearer keys take their share first (recency)
    A, _ = pe.weights(torch.zeros(1, 1, 10, 8), torch.zeros(1, 1, 10, 8))
    assert (A[0, 0, 9, :9].diff() > 0).all() and A[0, 0, 9, 8].item() == pytest.approx(0.5)


# --- the bias schemes through FlexAttention ---------------------------------------

def test_bias_schemes_flex_equals_dense(monkeypatch):
    """FlexAttention (eager, with uncompiled block masks: cheap on CPU) gives the dense
    path's outputs for every new bias scheme, including Shaw's value term fed by
    flex's logsumexp (which compiled flex cannot return on CPU, hence eager)."""
    from torch.nn.attention.flex_attention import flex_attention

    monkeypatch.setitem(A._compiled, 'flex', flex_attention)
    monkeypatch.setattr(A, 'FLEX_LSE_ON_CPU', True)
    schemes = [('t5', {'num_buckets': 8, 'max_distance': 10}), ('shaw', {'max_distance': 4}), ('kerple_log', {}),
               ('kerple_power', {}), ('fire', {'init_L': 6.0, 'width': 4}), ('sandwich', {}),
               ('xpos', {'blockwise': True, 'bca_block': 4})]
    torch.manual_seed(0)
    for name, opts in schemes:
        pe = P.REGISTRY[name](tiny_config(name), **opts).eval()
        layer = pe.new_layer()
        q, k, v = torch.randn(3, 2, 4, 14, 8).unbind(0)
        q_pos = k_pos = torch.arange(14)
        for qp in ((q_pos, q_pos[9:]) if name == 'shaw' else (q_pos[9:],)):  # the last queries over a cache
            ctx = pe.context(qp, k_pos)
            qq, kk = pe.transform_qk(q[:, :, qp], k, ctx, layer)  # xPos: all keys (cache_keys='raw')
            with torch.no_grad():
                mod = pe.score_mod(qq, kk, ctx, layer)
                vmod = pe.value_mod(qq, kk, ctx, layer, mod, A.Attender())
                dense = A.attend(qq, kk, v, mod, vmod, 'dense')
                flex = A.attend(qq, kk, v, mod, vmod, 'flex')
            assert torch.allclose(flex, dense, atol=1e-5), name


# --- RoPE's successors, 2025-26: GRAPE-M, GRAPE-A, GRAPE-AP, FoPE, RoPE++, Selective RoPE ------------------
# References below are written from the papers' and the authors' code's formulas in float64 and share no code
# with positional.py.

def softplus64(x):
    return torch.nn.functional.softplus(x.double())


def alibi_published(n):
    """ALiBi's slopes for a power of two n: 2^(-8h/n), h = 1..n."""
    return torch.tensor([2.0 ** (-8.0 * h / n) for h in range(1, n + 1)], dtype=torch.float64)


def turn_planes(x, ang):
    """Half-split planes (x_i, x_{i+d/2}) of x [..., T, d] turned by +ang [..., T, d/2] (HF's direction), float64."""
    x, ang = x.double(), ang.double()
    d = x.size(-1) // 2
    x1, x2 = x[..., :d], x[..., d:]
    return torch.cat((x1 * ang.cos() - x2 * ang.sin(), x1 * ang.sin() + x2 * ang.cos()), -1)


def layer_hooks(pe, layer, q, k, x, q_pos, k_pos, cache=None):
    """What CausalSelfAttention does up to the attention: context, layer_context, transform_qk."""
    ctx = pe.layer_context(x, pe.context(q_pos, k_pos), layer, cache)
    return pe.transform_qk(q, k, ctx, layer), ctx


def attn_reference(q, k, v, bias=None, off=0):
    """softmax(q_i . k_j / sqrt(d) + bias(b, h, i, j)) over keys j <= i + off, float64, per pair."""
    B, H, Tq, d = q.shape
    out = torch.zeros(B, H, Tq, v.size(-1), dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for i in range(Tq):
                logits = [(q[b, h, i].double() @ k[b, h, j].double()).item() / math.sqrt(d)
                          + (bias(b, h, i, j) if bias else 0.0) for j in range(i + off + 1)]
                out[b, h, i] = softmax_attend(logits, [v[b, h, j].double() for j in range(i + off + 1)])
    return out


def grape_layer_model(name, **opts):
    m = tiny_model(name, pos_options=opts)
    return m, m.transformer.h[0].attn


def test_grape_m_turns_planes_the_authors_way_per_pair():
    """q_n -> plane i turned by -n f_i, (x1, x2) -> (x1 cos + x2 sin, -x1 sin + x2 cos), f_i = exp(log_freq_i / 16)
    (learned, per head here): logits against that formula, positions far from 0, keys of a cache."""
    pe = P.REGISTRY['grape_m'](tiny_config('grape_m'), per_head=True)
    layer = pe.new_layer()
    assert layer.log_freq.shape == (4, 4) and isinstance(layer.log_freq, torch.nn.Parameter)
    inv = torch.tensor([10000.0 ** (-2 * i / 8) for i in range(4)], dtype=torch.float64)
    assert torch.allclose(layer.log_freq.double() / 16, inv.log().expand(4, 4), atol=1e-6)  # RoPE's, times 16
    with torch.no_grad():
        layer.log_freq.add_(torch.randn(4, 4))
    f = (layer.log_freq.detach().double() / 16).exp()  # [H, d/2]
    q, k, _ = qkv(1, 4, 6, 11, 8, seed=7)
    q_pos, k_pos = torch.arange(205, 211), torch.arange(200, 211)
    (qq, kk), _ = layer_hooks(pe, layer, q, k, None, q_pos, k_pos)
    got = (qq @ kk.transpose(-1, -2)).double()
    d = 4
    for h in range(4):
        for i, n in enumerate(q_pos.tolist()):
            for j, m in enumerate(k_pos.tolist()):
                want = 0.0
                for c in range(d):
                    a, b = n * f[h, c].item(), m * f[h, c].item()
                    q1, q2 = q[0, h, i, c].item(), q[0, h, i, c + d].item()
                    k1, k2 = k[0, h, j, c].item(), k[0, h, j, c + d].item()
                    rq = (q1 * math.cos(a) + q2 * math.sin(a), -q1 * math.sin(a) + q2 * math.cos(a))
                    rk = (k1 * math.cos(b) + k2 * math.sin(b), -k1 * math.sin(b) + k2 * math.cos(b))
                    want += rq[0] * rk[0] + rq[1] * rk[1]
                assert abs(got[0, h, i, j].item() - want) < 1e-3, (h, i, j)


def reflect_planes(m):
    """Negate the second half of every head's query and key rows of each layer's projection (c_attn)."""
    with torch.no_grad():
        for blk in m.transformer.h:
            attn = blk.attn
            w = attn.c_attn.weight.view(3, attn.n_head, 2, attn.hd // 2, -1)  # q | k | v, heads, halves
            w[:2, :, 1] *= -1


def test_grape_m_at_its_initial_spectrum_is_rope_with_each_plane_reflected():
    """The authors turn each plane by -n f_i, HF's RoPE by +n f_i: a reflection of each plane (the second half
    of q and k negated) maps one onto the other. With the initial spectrum (RoPE's, base 10000), grape_m equals
    `rope` exactly then, and differs without the reflection."""
    x = torch.randint(0, 37, (2, 40))
    rope, grape = tiny_model('rope', seed=3), tiny_model('grape_m', seed=3)
    with torch.no_grad():
        for blk in rope.transformer.h:
            blk.attn.c_attn.weight.mul_(20)  # sharp attention: the direction of the turn shows
        grape.load_state_dict({n: p for n, p in rope.state_dict().items()}, strict=False)
        plain = grape(x)[0]
        reflect_planes(grape)
        assert torch.allclose(rope(x)[0], grape(x)[0], atol=1e-5)
        assert not torch.allclose(rope(x)[0], plain, atol=1e-3)


def test_grape_m_contextual_phases_per_pair_and_through_a_cache():
    """omega_t = sigmoid((w . x_t + b) / 16), Phi_t = sum_{tau < t} omega_tau, plane i turned by -Phi_t f_i
    (per head here); a forward in two parts through a cache gives the same q and k."""
    pe = P.REGISTRY['grape_m'].variant(None, {'contextual': True})(tiny_config('grape_m'), contextual=True,
                                                                    ctx_per_head=True)
    layer = pe.new_layer()
    assert (layer.omega.weight == 0).all() and layer.omega.bias[0].item() == pytest.approx(math.log(math.expm1(1e-3)))
    with torch.no_grad():
        layer.omega.weight.normal_(std=2.0)
        layer.log_freq.add_(torch.randn(4))
    T = 9
    q, k, _ = qkv(2, 4, T, T, 8, seed=8)
    x = torch.randn(2, T, 32, generator=torch.Generator().manual_seed(9))
    pos = torch.arange(T)
    (qq, kk), _ = layer_hooks(pe, layer, q, k, x, pos, pos)
    W, bias = layer.omega.weight.detach().double(), layer.omega.bias.detach().double()
    omega = torch.sigmoid((x.double() @ W.t() + bias) / 16)  # [B, T, H]
    phi = omega.cumsum(1) - omega  # exclusive
    f = layer.log_freq.detach().double().exp()  # stored unscaled in the contextual form
    ang = -phi.permute(0, 2, 1)[..., None] * f  # [B, H, T, d/2]: the authors' -angle
    assert torch.allclose(qq.double(), turn_planes(q, ang), atol=1e-5)
    assert torch.allclose(kk.double(), turn_planes(k, ang), atol=1e-5)
    cache = kvcache.LayerKV()
    (q1, k1), _ = layer_hooks(pe, layer, q[:, :, :4], k[:, :, :4], x[:, :4], pos[:4], pos[:4], cache)
    cache.append(k1, k1)
    (q2, k2), _ = layer_hooks(pe, layer, q[:, :, 4:], k[:, :, 4:], x[:, 4:], pos[4:], pos, cache)
    assert torch.allclose(torch.cat((q1, q2), 2), qq, atol=1e-5)
    assert torch.allclose(torch.cat((k1, k2), 2), kk, atol=1e-5)


def test_grape_m_contextual_at_init_is_the_fixed_form_with_frequencies_times_sigmoid_b_over_16():
    """w = 0 at init, so omega = sigmoid(b / 16) for every token (0.394 for the authors' b = softplus^-1(1e-3)):
    Phi_t = 0.394 t, the non-contextual grape_m with every frequency times 0.394."""
    x = torch.randint(0, 37, (2, 40))
    ctx_m, fixed = tiny_model('grape_m', seed=4, pos_options={'contextual': True}), tiny_model('grape_m', seed=4)
    c = 1 / (1 + math.exp(-math.log(math.expm1(1e-3)) / 16))
    assert c == pytest.approx(0.3937, abs=1e-4)
    with torch.no_grad():
        for blk in ctx_m.transformer.h:
            blk.attn.c_attn.weight.mul_(20)  # sharp attention: the angles show
        fixed.load_state_dict({n: p for n, p in ctx_m.state_dict().items() if 'pe_layer' not in n}, strict=False)
        for a, b in zip(ctx_m.transformer.h, fixed.transformer.h):
            b.attn.pe_layer.log_freq.copy_((a.attn.pe_layer.log_freq + math.log(c)) * 16)
        assert torch.allclose(ctx_m(x)[0], fixed(x)[0], atol=1e-5)
        for blk in ctx_m.transformer.h:
            blk.attn.pe_layer.omega.weight.normal_()
        assert not torch.allclose(ctx_m(x)[0], fixed(x)[0], atol=1e-3)  # with w != 0 the phases follow x


@pytest.mark.parametrize('variant', ['query_key', 'key', 'query'])
def test_grape_a_bias_matches_the_authors_formula(variant):
    """b_ij = -(i - j) softplus(omega_h) m_h gate, gate = softplus(v^.q_i/sqrt(d)) + softplus(u^.k_j/sqrt(d))
    (or one of the two), u^ = u/|u|, m_h ALiBi's slopes; over a cache's keys."""
    pe = P.REGISTRY['grape_a'](tiny_config('grape_a'), variant=variant)
    layer = pe.new_layer()
    assert torch.allclose(softplus64(layer.omega), torch.ones(4, dtype=torch.float64))  # softplus(omega) = 1 at init
    assert hasattr(layer, 'u') == (variant != 'query') and hasattr(layer, 'v') == (variant != 'key')
    with torch.no_grad():
        layer.omega.normal_()
    q, k, _ = qkv(2, 4, 5, 12, 8, seed=10)
    q_pos, k_pos = torch.arange(7, 12), torch.arange(12)
    ctx = pe.context(q_pos, k_pos)
    bias = A.dense_bias(pe.score_mod(q, k, ctx, layer), 2, 4, 5, 12, 'cpu')
    m, w = alibi_published(4), softplus64(layer.omega.detach())
    for b in range(2):
        for h in range(4):
            for i in range(5):
                for j in range(12):
                    if k_pos[j] > q_pos[i]:
                        assert bias[b, h, i, j] == float('-inf')
                        continue
                    gate = 0.0
                    if variant != 'query':
                        u = layer.u[h].detach().double()
                        gate += softplus64(u @ k[b, h, j].double() / u.norm() / math.sqrt(8)).item()
                    if variant != 'key':
                        vv = layer.v[h].detach().double()
                        gate += softplus64(vv @ q[b, h, i].double() / vv.norm() / math.sqrt(8)).item()
                    want = -(q_pos[i] - k_pos[j]).item() * w[h].item() * m[h].item() * gate
                    assert bias[b, h, i, j].item() == pytest.approx(want, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize('variant, share', [('key', 1 / math.log(2)), ('query', 1 / math.log(2)),
                                            ('query_key', 1 / (2 * math.log(2)))])
def test_grape_a_is_alibi_at_neutral_gates_with_the_matching_omega(variant, share):
    """With u (and v) along dim 0 and every head's dim-0 query and key weights zero, each gate is softplus(0) =
    ln 2; softplus(omega_h) = 1/ln 2 (1/(2 ln 2) for the sum of two gates) then gives ALiBi's slopes exactly.
    At init (softplus(omega) = 1) the slopes are ALiBi's times ln 2 (2 ln 2): not ALiBi."""
    x = torch.randint(0, 37, (2, 40))
    alibi, grape = tiny_model('alibi', seed=5), tiny_model('grape_a', seed=5, pos_options={'variant': variant})
    with torch.no_grad():
        for m in (alibi, grape):
            for blk in m.transformer.h:
                w = blk.attn.c_attn.weight.view(3, 4, 8, -1)
                w[:2, :, 0] = 0  # dim 0 of every query and key head
        grape.load_state_dict({n: p for n, p in alibi.state_dict().items()}, strict=False)
        for blk in grape.transformer.h:
            lay = blk.attn.pe_layer
            for name in ('u', 'v'):
                if hasattr(lay, name):
                    getattr(lay, name).copy_(torch.eye(8)[0].expand(4, 8) * 3.0)
        at_init = grape(x)[0]
        for blk in grape.transformer.h:
            blk.attn.pe_layer.omega.fill_(math.log(math.expm1(share)))
        assert torch.allclose(grape(x)[0], alibi(x)[0], atol=1e-5)
        assert not torch.allclose(at_init, alibi(x)[0], atol=1e-3)


def grape_ap_reference(q, k, v, p, off, alpha):
    """GRAPE-AP, the authors' code written out: probes p_t = W_p x_t per head (pd dims), p^ = p / rms(p),
    R_l p^ turned by -l in every plane, psi(t, l) = alpha_h log sigmoid(p_t . R_l p^_l / pd),
    logit_tj = q_t . k_j / sqrt(d) + sum_{l=j+1..t} psi(t, l)."""
    B, H, Tq, d = q.shape
    pd = p.size(-1)
    pn = p / (p.pow(2).mean(-1, keepdim=True) + torch.finfo(torch.float32).eps).sqrt()
    T = p.size(2)
    ang = torch.arange(T, dtype=torch.float64)[:, None].expand(T, pd // 2)
    pk = turn_planes(pn, -ang)

    def psi(b, h, t, l):
        z = (p[b, h, t] @ pk[b, h, l]).item() / pd
        return alpha[h] * math.log(1 / (1 + math.exp(-z)))

    def bias(b, h, i, j):
        t = i + off
        return sum(psi(b, h, t, l) for l in range(j + 1, t + 1))
    return attn_reference(q, k, v, bias, off)


def test_grape_ap_matches_the_path_integral_per_pair_with_and_without_a_cache():
    pe = P.REGISTRY['grape_a'].variant(None, {'variant': 'path'})(tiny_config('grape_a'), variant='path')
    layer = pe.new_layer()
    assert layer.probe.weight.shape == (4 * 8, 32) and abs(layer.probe.weight.std().item() - 0.5 / math.sqrt(32)) < 0.02
    with torch.no_grad():
        layer.probe.weight.normal_(std=0.5)
    T, split = 10, 6
    q, k, v = qkv(2, 4, T, T, 8, seed=11)
    x = torch.randn(2, T, 32, generator=torch.Generator().manual_seed(12), dtype=torch.float64).float()
    p = (x.double() @ layer.probe.weight.detach().double().t()).view(2, T, 4, 8).transpose(1, 2)
    want = grape_ap_reference(q, k, v, p, 0, alibi_published(4).tolist())
    pos = torch.arange(T)
    with torch.no_grad():
        got = run_hooks(pe, layer, q, k, v, x, pos, pos)
        assert torch.allclose(got.double(), want, atol=1e-5)
        got, cache = run_hooks_in_two_calls(pe, layer, q, k, v, x, split)
    assert cache.state['grape_probe'].shape == (2, 4, T, 8)
    assert torch.allclose(got.double(), want, atol=1e-5)
    with torch.no_grad():  # zero probes: every edge is m_h log(1/2), ALiBi with slopes m_h ln 2
        layer.probe.weight.zero_()
        got = run_hooks(pe, layer, q, k, v, x, pos, pos)
    m = alibi_published(4)
    want = attn_reference(q, k, v, lambda b, h, i, j: -m[h].item() * math.log(2) * (i - j))
    assert torch.allclose(got.double(), want, atol=1e-5)


def test_grape_ap_with_endpoint_independent_edges_is_fox(monkeypatch):
    """The paper's appendix C: with psi(t, l) = log f_l for every endpoint t, the path sum
    sum_{l=j+1..t} psi is FoX's bias; GRAPE-AP's path sum, fed FoX's log gates as its edges, gives the `fox`
    scheme's output and the FoX formula."""
    ap = P.REGISTRY['grape_a'].variant(None, {'variant': 'path'})(tiny_config('grape_a'), variant='path')
    fox = P.REGISTRY['fox'](tiny_config('fox'))
    fox_layer = fox.new_layer()
    with torch.no_grad():
        fox_layer.fgate.weight.normal_(std=0.5), fox_layer.fgate.bias.uniform_(-1, 3)
    T = 9
    q, k, v = qkv(2, 4, T, T, 8, seed=13)
    x = torch.randn(2, T, 32, generator=torch.Generator().manual_seed(14))
    log_f = fox_log_gates(fox_layer, x)  # [B][H][T] lists, from the formula
    edges = torch.tensor(log_f, dtype=torch.float32)  # [B, H, T]
    monkeypatch.setattr(ap, 'edges', lambda pq, pk: edges[:, :, None, :pk.size(2)].expand(-1, -1, pq.size(2), -1))
    pos = torch.arange(T)
    with torch.no_grad():
        got = run_hooks(ap, ap.new_layer(), q, k, v, x, pos, pos)
        fox_out = run_hooks(fox, fox_layer, q, k, v, x, pos, pos)
    assert torch.allclose(got, fox_out, atol=1e-5)
    assert torch.allclose(got.double(), fox_reference(q, k, v, log_f, 0), atol=1e-5)


def test_fope_frequencies_clamp_and_defaults_as_the_authors_config():
    """D = max(128, head_dim) dims of RoPE's spectrum, f_i = 10000^(-2i/D); periods longer than L dropped;
    planes = min(n_freq, head_dim/4); coefficients per head and layer, frozen (buffers, saved), step identity
    plus xavier noise of gain 0.3."""
    cfg = tiny_config('fope', n_embd=128, n_head=4, block_size=128)
    pe = P.REGISTRY['fope'](cfg)
    f = [10000.0 ** (-2 * i / 128) for i in range(64)]
    kept = [x for x in f if 2 * math.pi / x <= 128]
    assert pe.n_freq == len(kept) == 21 and pe.planes == 8
    assert pe.freq.tolist() == pytest.approx(kept, rel=1e-6)
    layer = pe.new_layer()
    assert not list(layer.parameters()) and set(layer.state_dict()) == {'sin_coef', 'cos_coef'}
    step = math.ceil(21 / 8)  # 3
    for coef in (layer.sin_coef, layer.cos_coef):
        assert coef.shape == (4, 21, 8)
        eye = torch.zeros(21, 8)
        for c in range(7):  # c = 7 would sit at row 21, past the 21 frequencies: no 1 there (the code's guard)
            eye[c * step, c] = 1.0
        noise = coef - eye
        assert abs(noise.std().item() - 0.3 * math.sqrt(2 / (21 * 8 + 4 * 8))) < 0.01  # xavier on [H, n, planes]
    assert not torch.equal(layer.sin_coef, layer.cos_coef)  # separate sin and cos coefficients
    learn = P.REGISTRY['fope'](cfg, learnable=True).new_layer()
    assert {n for n, _ in learn.named_parameters()} == {'sin_coef', 'cos_coef'}


def test_fope_transform_matches_the_fourier_series_per_pair():
    """Plane c < planes: (x1, x2) -> (x1 C_c - x2 S_c, x2 C_c + x1 S_c), S_c(t) = sum_i A[h,i,c] sin(t f_i),
    C_c(t) = sum_i B[h,i,c] cos(t f_i); the other planes (x1, x2) -> (x1 - x2, x2 + x1)."""
    cfg = tiny_config('fope', block_size=64)
    pe = P.REGISTRY['fope'](cfg)
    layer = pe.new_layer()
    f = [x for x in (10000.0 ** (-2 * i / 128) for i in range(64)) if 2 * math.pi / x <= 64]
    assert pe.planes == 2 and pe.n_freq == len(f)
    q, k, _ = qkv(1, 4, 5, 5, 8, seed=15)
    pos = torch.arange(100, 105)
    (qq, _), _ = layer_hooks(pe, layer, q, k, None, pos, pos)
    A, Bc = layer.sin_coef.double(), layer.cos_coef.double()
    for h in range(4):
        for ti, t in enumerate(pos.tolist()):
            for c in range(4):
                if c < 2:
                    S = sum(A[h, i, c].item() * math.sin(t * fi) for i, fi in enumerate(f))
                    C = sum(Bc[h, i, c].item() * math.cos(t * fi) for i, fi in enumerate(f))
                else:
                    S = C = 1.0
                x1, x2 = q[0, h, ti, c].item(), q[0, h, ti, c + 4].item()
                assert qq[0, h, ti, c].item() == pytest.approx(x1 * C - x2 * S, abs=1e-4)
                assert qq[0, h, ti, c + 4].item() == pytest.approx(x2 * C + x1 * S, abs=1e-4)


def test_fope_with_identity_coefficients_over_every_plane_is_rope():
    x = torch.randint(0, 37, (2, 40))
    opts = {'fourier_dim': 8, 'floor_clamp': False, 'planes': 4, 'init': 'eye'}
    rope, fope = tiny_model('rope', seed=6), tiny_model('fope', seed=6, pos_options=opts)
    with torch.no_grad():
        for blk in rope.transformer.h:
            blk.attn.c_attn.weight.mul_(20)  # sharp attention: the positions show
        fope.load_state_dict(rope.state_dict(), strict=False)
        assert torch.allclose(rope(x)[0], fope(x)[0], atol=1e-5)
        default = tiny_model('fope', seed=6)
        default.load_state_dict(rope.state_dict(), strict=False)
        assert not torch.allclose(rope(x)[0], default(x)[0], atol=1e-3)


def ropepp_reference(q, k, v, T, base=10000.0):
    """RoPE++ per pair: z = x[:d/2] + i x[d/2:], theta_c = base^(-2c/d); query head g gives attention heads 2g
    (Re) and 2g + 1 (Im) of sum_c z_q conj(z_k) e^{i (t - s) theta_c} / sqrt(d), both over key/value head g."""
    B, G, _, d = q.shape
    P_ = d // 2
    th = [base ** (-2 * c / d) for c in range(P_)]
    zq = torch.complex(q[..., :P_].double(), q[..., P_:].double())
    zk = torch.complex(k[..., :P_].double(), k[..., P_:].double())
    out = torch.zeros(B, 2 * G, T, v.size(-1), dtype=torch.float64)
    for b in range(B):
        for g in range(G):
            for t in range(T):
                terms = [sum(zq[b, g, t, c] * zk[b, g, s, c].conj() * complex(math.cos((t - s) * th[c]),
                                                                               math.sin((t - s) * th[c]))
                             for c in range(P_)) / math.sqrt(d) for s in range(t + 1)]
                vs = [v[b, g, s].double() for s in range(t + 1)]
                out[b, 2 * g, t] = softmax_attend([z.real.item() for z in terms], vs)
                out[b, 2 * g + 1, t] = softmax_attend([z.imag.item() for z in terms], vs)
    return out


@pytest.mark.parametrize('variant', ['eh', 'ec'])
def test_ropepp_heads_are_the_real_and_imaginary_parts_per_pair(variant):
    """Through the model's layer: the q/k/v projection has n_head/2 (eh) or n_head (ec) heads, and the
    attention output fed to c_proj is the reference's real and imaginary heads, interleaved."""
    m, attn = grape_layer_model('ropepp', variant=variant)
    G = 2 if variant == 'eh' else 4
    assert (attn.q_heads, attn.kv_heads, attn.n_head) == (G, G, 2 * G)
    assert attn.c_attn.weight.shape == (3 * G * 8, 32) and attn.c_proj.weight.shape == (32, 2 * G * 8)
    T = 12
    x = torch.randn(2, T, 32, generator=torch.Generator().manual_seed(16))
    with torch.no_grad():
        attn.c_attn.weight.mul_(10)
        q, k, v = (t.view(2, T, G, 8).transpose(1, 2) for t in attn.c_attn(x).split(G * 8, dim=2))
        seen = []
        attn.c_proj.register_forward_hook(lambda mod, inp, out: seen.append(inp[0]))
        pe = m.pe.at(0)
        attn(x, pe, pe.context(torch.arange(T), torch.arange(T), T))
    want = ropepp_reference(q, k, v, T)
    assert torch.allclose(seen[0].double(), want.transpose(1, 2).reshape(2, T, 2 * G * 8), atol=1e-5)


def test_ropepp_real_heads_are_ropes():
    """ec: with `rope`'s q/k/v projection, attention heads 0, 2, 4, 6 give rope's heads 0..3."""
    x = torch.randint(0, 37, (2, 20))
    rope, pp = tiny_model('rope', seed=7, n_layer=1), tiny_model('ropepp', seed=7, n_layer=1,
                                                                   pos_options={'variant': 'ec'})
    got, ref = [], []
    pp.load_state_dict({n: p for n, p in rope.state_dict().items() if 'c_proj' not in n or 'mlp' in n}, strict=False)
    pp.transformer.h[0].attn.c_proj.register_forward_hook(lambda mod, inp, out: got.append(inp[0]))
    rope.transformer.h[0].attn.c_proj.register_forward_hook(lambda mod, inp, out: ref.append(inp[0]))
    with torch.no_grad():
        pp(x), rope(x)
    heads = got[0].view(2, 20, 8, 8)
    assert torch.allclose(heads[:, :, 0::2], ref[0].view(2, 20, 4, 8), atol=1e-6)
    assert not torch.allclose(heads[:, :, 1::2], ref[0].view(2, 20, 4, 8), atol=1e-3)


def selective_reference(layer, x, off=0, K=4, bias=False, gate=False):
    """Selective RoPE's angles [B, H, T, d/2] from the authors' rotary.py, written out in float64."""
    B, T, C = x.shape
    H = 4
    xd = x.double().view(B, T, H, C // H)
    xn = (xd / (xd.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt()).view(B, T, C)
    u = xn @ layer.down.weight.double().t() @ layer.up.weight.double().t()  # [B, T, H * P]
    w = layer.conv.detach().double()  # [H * P, K]
    phi = torch.zeros_like(u)
    for t in range(T):
        for kk in range(K):
            s = t - K + 1 + kk
            if s >= 0:
                phi[:, t] += w[:, kk] * u[:, s]
    phi = phi.view(B, T, H, -1)
    if bias:
        phi = phi + layer.phi_bias.detach().double().exp()
    if gate:
        phi = phi * torch.sigmoid(xn @ layer.gate.weight.double().t() + layer.gate.bias.double())[..., None]
    P_ = phi.size(-1)
    tau = torch.tensor([1.0 / 500000 ** (2 * c / (2 * P_)) for c in range(P_)], dtype=torch.float64)
    return (phi.cumsum(1) * tau).permute(0, 2, 1, 3)


@pytest.mark.parametrize('opts', [{}, {'bias': True, 'phase_gate': True}])
def test_selective_rope_angles_per_pair_and_through_a_cache(opts):
    """q and k of token t turned by tau * sum_{s<=t} phi_s (HF's direction), phi from the low-rank projection of
    the per-head L2-normalised x and a width-4 causal convolution; a cache in three forwards (the convolution's
    inputs and the running sum in cache.carry) gives the same q and k."""
    pe = P.REGISTRY['selective_rope'](tiny_config('selective_rope'), **opts)
    layer = pe.new_layer()
    assert layer.down.weight.shape == (32, 32) and layer.up.weight.shape == (16, 32) and layer.conv.shape == (16, 4)
    with torch.no_grad():
        for p_ in layer.parameters():
            p_.normal_(std=1.0)  # angles up to tens of radians
    T = 11
    q, k, _ = qkv(2, 4, T, T, 8, seed=17)
    x = torch.randn(2, T, 32, generator=torch.Generator().manual_seed(18))
    pos = torch.arange(T)
    with torch.no_grad():
        (qq, kk), _ = layer_hooks(pe, layer, q, k, x, pos, pos)
        ang = selective_reference(layer, x, bias=opts.get('bias', False), gate=opts.get('phase_gate', False))
        assert torch.allclose(qq.double(), turn_planes(q, ang), atol=1e-4)
        assert torch.allclose(kk.double(), turn_planes(k, ang), atol=1e-4)
        cache, outs = kvcache.LayerKV(), []
        for a, b in ((0, 2), (2, 3), (3, T)):
            (q1, k1), _ = layer_hooks(pe, layer, q[:, :, a:b], k[:, :, a:b], x[:, a:b], pos[a:b], pos[:b], cache)
            cache.append(k1, k1)
            outs.append((q1, k1))
    assert set(cache.carry) == {'sel_sum', 'sel_tail'} and cache.carry['sel_tail'].shape == (2, 4, 3, 4)
    assert torch.allclose(torch.cat([o[0] for o in outs], 2), qq, atol=1e-4)
    assert torch.allclose(torch.cat([o[1] for o in outs], 2), kk, atol=1e-4)


def test_selective_rope_with_unit_frequencies_is_rope_at_base_temp_theta():
    """phi == 1 (bias on, so phi = 0 + e^0, with W_up = 0) turns token t by tau (t + 1), tau_c = theta^(-2c/d):
    the logits of `rope` with base theta."""
    x = torch.randint(0, 37, (2, 40))
    opts = {'bias': True, 'temp_theta': 10000.0}
    rope, sel = tiny_model('rope', seed=8), tiny_model('selective_rope', seed=8, pos_options=opts)
    with torch.no_grad():
        for blk in rope.transformer.h:
            blk.attn.c_attn.weight.mul_(20)  # sharp attention: the positions show
        sel.load_state_dict(rope.state_dict(), strict=False)
        plain = sel(x)[0]
        for blk in sel.transformer.h:
            blk.attn.pe_layer.up.weight.zero_()
        assert torch.allclose(rope(x)[0], sel(x)[0], atol=1e-5)
        assert not torch.allclose(rope(x)[0], plain, atol=1e-3)


def test_selective_rope_forget_gate_is_fox_when_the_angles_are_zero():
    x = torch.randint(0, 37, (2, 30))
    fox, sel = tiny_model('fox', seed=9), tiny_model('selective_rope', seed=9, pos_options={'forget_gate': True})
    with torch.no_grad():
        for a, b in zip(fox.transformer.h, sel.transformer.h):
            a.attn.pe_layer.fgate.weight.normal_(std=0.5)
            b.attn.pe_layer.fgate.load_state_dict(a.attn.pe_layer.fgate.state_dict())
            b.attn.pe_layer.up.weight.zero_()  # phi = 0: no rotation
        sel.load_state_dict({n: p for n, p in fox.state_dict().items() if 'pe_layer' not in n}, strict=False)
        assert torch.allclose(fox(x)[0], sel(x)[0], atol=1e-5)


def test_selective_rope_reads_exactly_d_conv_minus_2_tokens_before_a_window():
    """A query's angle differences sum phi over its visible keys after the first, and phi_l reads x_{l-3..l}:
    the 2 tokens just before the window change its logits, the 3rd does not."""
    m = tiny_model('selective_rope', n_layer=1, sliding_window=5).eval()
    assert m.pe.at(0).x_lookback == 2
    with torch.no_grad():
        lay = m.transformer.h[0].attn.pe_layer
        for p_ in (lay.down.weight, lay.up.weight, lay.conv):
            p_.normal_(std=1.0)
        lay.temperature.mul_(100)
    x = torch.randint(0, 37, (1, 16), generator=torch.Generator().manual_seed(3))
    t, first = 12, 8  # the window of token 12: 8..12
    with torch.no_grad():
        base = m(x)[0][0, t]
        for u, moves in ((first - 1, True), (first - 2, True), (first - 3, False)):
            y = x.clone()
            y[0, u] = (y[0, u] + 1) % 37
            assert ((m(y)[0][0, t] - base).abs().max() > 1e-4) == moves, u


# the variants the registry-wide tests (defaults only) do not reach, and the defaults at 16 x block_size
SUCCESSORS = [('grape_m', {}), ('grape_m', {'contextual': True, 'ctx_per_head': True, 'per_head': True}),
              ('grape_a', {}), ('grape_a', {'variant': 'key'}), ('grape_a', {'variant': 'query'}),
              ('grape_a', {'variant': 'path'}), ('fope', {}), ('ropepp', {}), ('ropepp', {'variant': 'ec'}),
              ('selective_rope', {}), ('selective_rope', {'phase_gate': True, 'bias': True, 'forget_gate': True})]
IDS = [n + ''.join(f"-{k}={v}" for k, v in o.items()) for n, o in SUCCESSORS]


@pytest.mark.parametrize('name, opts', SUCCESSORS, ids=IDS)
def test_successor_variants_cache_windows_sinks_and_16x(name, opts):
    """Causality; KV-cache decoding equals a full forward (ordinary, windowed, chunked, and a rolling cache with
    nothing evicted); a forward at 16 x block_size is finite and its first block_size logits are a plain
    forward's; the tables of the angles are float32 under bf16 autocast."""
    from conftest import assert_causal, assert_kv_cache_matches_full_forward
    m = tiny_model(name, pos_options=opts).eval()
    assert_causal(m)
    assert_kv_cache_matches_full_forward(m)
    x = torch.randint(0, 37, (2, 40), generator=torch.Generator().manual_seed(2))
    for mask in (dict(sliding_window=5), dict(attention_chunk_size=7)):
        w = tiny_model(name, pos_options=opts, **mask).eval()
        with torch.no_grad():
            full = w(x)[0]
            cache = w.new_cache()
            steps = [w(x[:, :7], cache=cache)[0]] + [w(x[:, t:t + 1], cache=cache)[0] for t in range(7, 40)]
        assert torch.allclose(torch.cat(steps, 1), full, atol=1e-5), mask
    with torch.no_grad():
        full = m(x)[0]
        cache = m.new_cache(recent=100, sink_tokens=0)
        steps = [m(x[:, :5], cache=cache)[0]] + [m(x[:, t:t + 1], cache=cache)[0] for t in range(5, 40)]
        assert torch.allclose(torch.cat(steps, 1), full, atol=1e-5)
        long = torch.randint(0, 37, (1, 16 * 16), generator=torch.Generator().manual_seed(4))
        logits = m(long)[0]
        assert torch.isfinite(logits).all() and torch.allclose(logits[:, :16], m(long[:, :16])[0], atol=1e-5)
    seen = []
    pe = m.pe.at(0)
    real = pe.transform_qk

    def spy(q, k, ctx, layer):
        seen.extend(t for v in ctx.extra.values() for t in (v if isinstance(v, tuple) else (v,))
                    if torch.is_tensor(t) and t.is_floating_point())
        return real(q, k, ctx, layer)
    pe.transform_qk = spy
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        m(x)
    assert all(t.dtype == torch.float32 for t in seen)


@pytest.mark.parametrize('name, opts', [s for s in SUCCESSORS if s not in (('grape_m', {}), ('grape_a', {}),
                                                                             ('fope', {}), ('ropepp', {}),
                                                                             ('selective_rope', {}))],
                         ids=lambda v: v if isinstance(v, str) else ''.join(f"{k}={w}" for k, w in v.items()))
def test_successor_variants_compile_without_graph_breaks_and_flex_equals_dense(name, opts):
    """What test_model.py checks for every registered default, for the variants: one graph for a training
    forward and a no-grad FlexAttention forward; compiled FlexAttention equals the dense path; the rolling-cache
    (attention sinks) step equals a plain forward over the kept tokens at places 0..n."""
    x = torch.randint(0, 37, (2, 64))
    for backend, grad in (('auto', True), ('flex', False)):
        torch._dynamo.reset()
        m = tiny_model(name, block_size=64, attn_backend=backend, pos_options=opts).train(grad)
        with torch.set_grad_enabled(grad):
            ex = torch._dynamo.explain(m)(x, x)
        assert ex.graph_break_count == 0 and ex.graph_count == 1, [str(b.reason)[:200] for b in ex.break_reasons]
    torch._dynamo.reset()
    from conftest import assert_flex_equals_dense
    assert_flex_equals_dense(tiny_model(name, block_size=64, pos_options=opts).eval())
    torch._dynamo.reset()
    sink, window, T = 3, 5, 20
    m = tiny_model(name, n_layer=1, pos_options=opts).eval()
    x = torch.randint(0, 37, (1, T), generator=torch.Generator().manual_seed(0))
    cache = m.new_cache(recent=window, sink_tokens=sink)
    with torch.no_grad():
        m(x[:, :sink + window + 1], cache=cache)
        for t in range(sink + window + 1, T):
            kept = list(range(sink)) + list(range(t - window, t))
            logits, _ = m(x[:, t:t + 1], cache=cache)
            assert torch.allclose(logits[0, -1], m(x[:, kept + [t]])[0][0, -1], atol=1e-5), t


def test_successors_bad_options_are_one_line_that_names_the_fix():
    cases = [('grape_a', {'variant': 'both'}, "variant must be one of 'query_key', 'key', 'query', 'path'"),
             ('grape_a', {'p_head_dim': 3}, 'p_head_dim'), ('grape_a', {'omega_init': -1}, 'omega_init'),
             ('grape_m', {'omega_scale': 0}, 'omega_scale must be a number > 0'),
             ('grape_m', {'contextual': 'yes'}, 'contextual must be True or False'),
             ('ropepp', {'variant': 'ee'}, "variant must be one of 'eh', 'ec'"),
             ('fope', {'planes': 9}, 'planes must be an integer in 1..4'),
             ('fope', {'init': 'xavier'}, 'init must be one of'),
             ('fope', {'fourier_dim': 7}, 'fourier_dim must be an even integer'),
             ('selective_rope', {'d_conv': 0}, 'd_conv must be an integer >= 1'),
             ('selective_rope', {'temp_theta': -1.0}, 'temp_theta must be a number > 0')]
    for name, opts, msg in cases:
        with pytest.raises(ValueError, match=re.escape(msg)) as e:
            M.GPT(tiny_config(name, pos_options=opts))
        assert '\n' not in str(e.value), name
    with pytest.raises(ValueError, match="n_head must be even, got 3; change n_head or use variant='ec'"):
        M.GPT(tiny_config('ropepp', n_embd=24, n_head=3))
    with pytest.raises(ValueError, match='use a static type'):
        M.GPT(tiny_config('ropepp', rope_scaling={'type': 'self_extend', 'window': 4, 'group': 2}))
    with pytest.raises(ValueError, match='floor_clamp=False or a longer block_size'):
        M.GPT(tiny_config('fope', block_size=1, pos_options={'base': 1e9}))


# --- options, configs, docstrings, learned parameters -----------------------------

def test_bad_options_are_clear_errors():
    with pytest.raises(ValueError, match='max_distance'):
        M.GPT(tiny_config('shaw', pos_options={'max_distance': 0}))
    with pytest.raises(ValueError, match='multiple of 4'):
        M.GPT(tiny_config('rope2d', n_embd=24, n_head=4))
    with pytest.raises(ValueError, match='sum to head_dim/2'):
        M.GPT(tiny_config('mrope', pos_options={'sections': [1, 1, 1]}))
    with pytest.raises(ValueError, match='bad pos_options'):
        M.GPT(tiny_config('t5', pos_options={'buckets': 8}))


def test_configs_select_the_schemes():
    for name in NEW:
        cfg = {}
        with open(os.path.join(ROOT, 'config', f'{name}.py')) as f:
            exec(f.read(), cfg)
        assert cfg['pos_encoding'] == name and name in P.REGISTRY and cfg['out_dir'] == f'out-{name}'


def test_every_new_scheme_documents_paper_formula_defaults():
    arxiv = {'fox': '2503.02130', 'cope': '2405.18719', 'pope': '2509.10534', 'stick_breaking': '2410.17980',
             'deberta': '2006.03654', 'grape_m': '2512.07805', 'grape_a': '2512.07805', 'fope': '2412.17739',
             'ropepp': '2512.07525', 'selective_rope': '2511.17388'}
    for name, aid in arxiv.items():
        doc = P.REGISTRY[name].__doc__
        assert aid in doc and 'Option' in doc and ('efault' in doc), name
    assert 'causal restriction' in P.REGISTRY['deberta'].__doc__
    code = {'grape_m': 'model-architectures/GRAPE', 'grape_a': 'model-architectures/GRAPE', 'fope': 'OpenMOSS/rope_pp',
            'ropepp': 'OpenMOSS/rope_pp', 'selective_rope': 'timurcarstensen/selective-rope'}
    for name, repo in code.items():  # the authors' code each follows, where paper and code differ
        assert repo in P.REGISTRY[name].__doc__, name
    assert '2512.07805' in P.GrapeAP.__doc__ and 'llama-mha-grape-ap-v1.py' in P.GrapeAP.__doc__


@pytest.mark.parametrize('name', ['t5', 'shaw', 'xl', 'kerple_log', 'kerple_power', 'fire'])
def test_learned_position_parameters_get_gradients(name):
    m = tiny_model(name)
    x = torch.randint(0, 37, (2, 16))
    m(x, x)[1].backward()
    pe_params = [(n, p) for n, p in m.named_parameters() if n.startswith('pe.') or '.pe_layer.' in n]
    assert pe_params
    for n, p in pe_params:
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, n


HOOKS = ('embed', 'context', 'new_layer', 'heads', 'layer_context', 'transform_qk', 'score_mod', 'value_mod',
         'attention', 'stream', 'cache_keys', 'softmax', 'fla_kernel')


def test_docs_hook_table_lists_every_hook():
    """docs/schemes.md's hook table has a row for every hook of PositionalEncoding, and no other."""
    table = set()
    with open(os.path.join(ROOT, 'docs', 'schemes.md'), encoding='utf-8') as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip('|').split('|')]
            m = re.match(r"`(\w+)", cells[0])
            if len(cells) == 3 and m and m.group(1) in HOOKS:
                table.add(m.group(1))
    assert table == set(HOOKS)


@pytest.mark.parametrize('name, opts, msg', [
    ('rope2d', {'width': 0}, 'rope2d width must be an integer >= 1, got 0'),
    ('xl', {'r_dim': 7}, "xl r_dim must be an even integer >= 1 (the sinusoid R's dims), got 7"),
    ('pope', {'delta_init': 'x'}, "pope delta_init must be one of 'zero', 'uniform', got 'x'"),
    ('shaw', {'max_distance': 2.5}, 'shaw max_distance must be an integer >= 1 (the clip distance k), got 2.5'),
    ('sandwich', {'dim': 5}, 'sandwich dim must be an even integer >= 1, got 5'),
    ('cope', {'npos_max': 1}, 'cope npos_max must be an integer >= 2 (number of position embeddings), got 1'),
    ('path', {'rank': True}, 'path rank must be an integer >= 1, got True'),
    ('grape_a', {'omega_init': -1}, 'grape_a omega_init must be a number >= 0 (the initial softplus(omega_h)'),
])
def test_every_scheme_checks_its_options_with_the_one_set_of_checks(name, opts, msg):
    """The option checks of positional.py (check_whole, check_number, check_flag, check_choice) give every scheme
    the same one-line message; a whole number written as a float is that number."""
    with pytest.raises(ValueError, match='^' + re.escape(msg)) as e:
        M.GPT(tiny_config(name, pos_options=opts))
    assert '\n' not in str(e.value)


def test_a_whole_option_given_as_a_float_is_that_whole_number():
    assert M.GPT(tiny_config('shaw', pos_options={'max_distance': 4.0})).pe.at(0).k == 4
    assert isinstance(M.GPT(tiny_config('cope', pos_options={'npos_max': 8.0})).pe.at(0).npos_max, int)


def test_positional_sections_follow_the_readme_table_and_hold_the_registry():
    """positional.py has one section per row of the README's "how positions enter" table, in its order, and every
    registered scheme is named once in that table (grape_m twice: its contextual variant is a layer_context scheme)
    and its class sits in the section of its row."""
    readme = open(os.path.join(ROOT, 'README.md')).read()
    table = readme[readme.index('| how positions enter |'):].split('\n\n')[0].split('\n')[2:]
    rows = [(re.search(r'\(`(\w+)`\)', r.split('|')[1]), re.findall(r'`(\w+)`', r.split('|')[2])) for r in table]
    want = [('not at all' if hook is None else hook.group(1), [n for n in names if n in P.REGISTRY])
            for hook, names in rows]
    flat = [n for _, names in want for n in names]
    assert sorted(set(flat)) == sorted(P.REGISTRY) and len(flat) == len(P.REGISTRY) + 1
    src = open(os.path.join(ROOT, 'positional.py')).read().split('\n')
    heads = [(i, line) for i, line in enumerate(src) if line.startswith('# --- ')][1:]  # after the helpers
    assert [('not at all' if 'not at all' in h else re.search(r'\(`(\w+)`\)', h).group(1)) for _, h in heads] \
        == [s for s, _ in want]
    for (section, names), (start, _), end in zip(want, heads, [i for i, _ in heads[1:]] + [len(src)]):
        for n in names:
            cls = P.REGISTRY[n] if section != 'layer_context' or n != 'grape_m' else P.GrapeMContextual
            line = inspect.getsourcelines(cls)[1]
            assert start < line <= end, (n, section)