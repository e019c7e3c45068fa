"""The scheme zoo's math against independent formulas written here (not calls
into the code under test), plus properties the registry-wide tests do not cover:
Shaw's value term through FlexAttention's logsumexp, xPos centring and
blockwise attention, mrope == rope. Causality, KV-cache parity, long forwards
and training are parametrized over the registry in the core tests."""
import math

import pytest
import torch

import attention as A
import model as M
import positional as P
from conftest import tiny_config, tiny_model


def dense_bias(pe, layer, q, q_pos, k_pos):
    """The scheme's score bias as a dense [B|1, H, Tq, Tk] tensor (future = -inf)."""
    ctx = pe.context(q_pos, k_pos)
    k = torch.zeros(q.size(0), q.size(1), len(k_pos), q.size(3))
    return A.dense_bias(pe.score_mod(q, k, ctx, layer), q.size(0), q.size(1), len(q_pos), len(k_pos), q.device)


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
    assert [n for n, _ in m.named_parameters() if n.startswith('pe.') or 'pe_layer' in n] == ['pe.table']
    pe, table = m.pe, m.pe.table
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
    return A.attend(q, k, v, mod, pe.value_mod(q, k, ctx, layer, mod), backend)


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
            qq, kk = pe.transform_qk(q[:, :, qp], k, ctx, layer)  # xPos: all keys (transform_after_cache)
            with torch.no_grad():
                mod = pe.score_mod(qq, kk, ctx, layer)
                vmod = pe.value_mod(qq, kk, ctx, layer, mod)
                dense = A.attend(qq, kk, v, mod, vmod, 'dense')
                flex = A.attend(qq, kk, v, mod, vmod, 'flex')
            assert torch.allclose(flex, dense, atol=1e-5), name


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
    assert bca.pe.score_mod(None, None, None, None) is None  # training uses plain causal attention
    pe = bca.pe.eval()
    q, pos = torch.randn(1, 4, 40, 8), torch.arange(40)
    bias = dense_bias(pe, None, q, pos, pos)[0, 0]
    assert torch.isinf(bias[16, :8]).all() and torch.isfinite(bias[16, 8:17]).all()
    assert torch.isinf(bias[39, :24]).all() and torch.isfinite(bias[39, 24:]).all()


# --- M-RoPE and 2D RoPE -----------------------------------------------------------

def test_mrope_equals_rope_for_text():
    x = torch.randint(0, 37, (2, 40))
    rope, mrope = tiny_model('rope', seed=3), tiny_model('mrope', seed=3)
    assert mrope.pe.sections == [1, 1, 2]  # head_dim 8: 4 pairs
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


def test_bad_options_are_clear_errors():
    with pytest.raises(ValueError, match='max_distance'):
        M.GPT(tiny_config('shaw', pos_options={'max_distance': 0}))
    with pytest.raises(ValueError, match='multiple of 4'):
        M.GPT(tiny_config('rope2d', n_embd=24, n_head=4))
    with pytest.raises(ValueError, match='sum to head_dim/2'):
        M.GPT(tiny_config('mrope', pos_options={'sections': [1, 1, 1]}))
    with pytest.raises(ValueError, match='bad pos_options'):
        M.GPT(tiny_config('t5', pos_options={'buckets': 8}))


# --- learned parameters train on the dense path -----------------------------------

@pytest.mark.parametrize('name', ['t5', 'shaw', 'xl', 'kerple_log', 'kerple_power', 'fire'])
def test_learned_position_parameters_get_gradients(name):
    m = tiny_model(name)
    x = torch.randint(0, 37, (2, 16))
    m(x, x)[1].backward()
    pe_params = [(n, p) for n, p in m.named_parameters() if n.startswith('pe.') or '.pe_layer.' in n]
    assert pe_params
    for n, p in pe_params:
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, n
