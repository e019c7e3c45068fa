"""Issue 16's schemes (FoX, CoPE, PoPE, stick-breaking, causal DeBERTa) against per-pair
implementations of the papers' formulas written here, scalar loops over (query, key) pairs that
share no code with positional.py. Causality, KV-cache decoding, long forwards, training, gradients
of every positional parameter, FlexAttention == dense, the backward graph, graph breaks and bf16
are the registry-wide tests in test_core.py / test_gpu_path.py."""
import functools
import math
import os

import pytest
import torch

import attention as A
import model as M
import positional as P
from conftest import ROOT, tiny_config, tiny_model

NEW = ['fox', 'cope', 'pope', 'stick_breaking', 'deberta']


def sig(x):
    return 1.0 / (1.0 + math.exp(-x))


def softplus(x):
    return math.log1p(math.exp(x))


def run_hooks(pe, layer, q, k, v, x, q_pos, k_pos, cache=None, backend='dense'):
    """What CausalSelfAttention does with a scheme: context, transform_qk, the attention hook."""
    ctx = pe.context(q_pos, k_pos)
    qq, kk = pe.transform_qk(q, k, ctx, layer)
    return pe.attention(qq, kk, v, x, ctx, layer, cache, functools.partial(A.attend, backend=backend))


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


def test_configs_select_the_schemes():
    for name in NEW:
        cfg = {}
        with open(os.path.join(ROOT, 'config', f'{name}.py')) as f:
            exec(f.read(), cfg)
        assert cfg['pos_encoding'] == name and name in P.REGISTRY and cfg['out_dir'] == f'out-{name}'


def test_every_new_scheme_documents_paper_formula_defaults():
    arxiv = {'fox': '2503.02130', 'cope': '2405.18719', 'pope': '2509.10534', 'stick_breaking': '2410.17980',
             'deberta': '2006.03654'}
    for name, aid in arxiv.items():
        doc = P.REGISTRY[name].__doc__
        assert aid in doc and 'Option' in doc and ('efault' in doc), name
    assert 'causal restriction' in P.REGISTRY['deberta'].__doc__


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
        cache = M.LayerKV()
        k1, v1 = cache.append(k[:, :, :split], v[:, :, :split])
        a = run_hooks(pe, layer, q[:, :, :split], k1, v1, x[:, :split], pos[:split], pos[:split], cache)
        k2, v2 = cache.append(k[:, :, split:], v[:, :, split:])
        b = run_hooks(pe, layer, q[:, :, split:], k2, v2, x[:, split:], pos[split:], pos, cache)
    assert cache.state['fox_log_f'].shape == (2, 4, T)  # one log gate per key, aligned with the cache
    assert torch.allclose(torch.cat((a, b), 2).double(), want, atol=1e-5)


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
                           * math.cos((s - t) * 10000 ** (-c / d) + delta[h, c].item()) for c in range(d)) / math.sqrt(d)
                assert abs(got[0, h, ti, si].item() - want) < 1e-4


def test_attend_pads_v_for_pope_and_the_fused_kernel():
    """attend() pads PoPE's d-dim v to q's 2d: zero columns leave the output as attention with the
    d-dim v, and let SDPA take a fused kernel."""
    pe = P.REGISTRY['pope'](tiny_config('pope'))
    layer = pe.new_layer()
    q, k, v = qkv(2, 4, 12, 12, 8, seed=6)
    pos = torch.arange(12)
    ctx = pe.context(pos, pos)
    q2, k2 = pe.transform_qk(q, k, ctx, layer)
    got = A.attend(q2, k2, v)
    want = torch.nn.functional.scaled_dot_product_attention(q2, k2, v, is_causal=True)
    assert got.shape == v.shape and torch.allclose(got, want, atol=1e-6)
    if hasattr(torch, '_fused_sdp_choice'):  # private API: 0 is the math kernel
        assert torch._fused_sdp_choice(q2, k2, torch.nn.functional.pad(v, (0, 8)), None, 0.0, True) != 0


def test_pope_options():
    m = tiny_model('pope', pos_options={'delta_init': 'uniform'})
    dl = m.transformer.h[1].attn.pe_layer.delta
    assert dl.shape == (4, 8) and (dl <= 0).all() and (dl >= -2 * math.pi).all() and dl.std() > 0.5
    with pytest.raises(ValueError, match='delta_init'):
        tiny_model('pope', pos_options={'delta_init': 'normal'})


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


# --- the O(T^2) schemes' no-grad query chunks --------------------------------------

@pytest.mark.parametrize('name', ['cope', 'stick_breaking'])
def test_query_chunks_equal_one_pass(name, monkeypatch):
    m = tiny_model(name).eval()
    x = torch.randint(0, 37, (2, 40))
    with torch.no_grad():
        whole = m(x)[0]
        monkeypatch.setattr(A, 'DENSE_CHUNK_BYTES', 4 * 2 * 4 * 40 * 7)  # 7 query rows per chunk
        chunked = m(x)[0]
        cache = m.new_cache()
        m(x[:, :25], cache=cache)
        tail = m(x[:, 25:], cache=cache)[0]  # chunks after a cache (Tq < Tk)
    assert torch.allclose(whole, chunked, atol=1e-5) and torch.allclose(tail, whole[:, 25:], atol=1e-5)


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
    assert (m.pe.buckets, m.pe.max_rel) == (8, 16) and m.pe.rel_emb.shape == (16, 32)
    assert [n for n, _ in m.named_parameters() if n.startswith('pe.')] == ['pe.rel_emb']  # P shared by layers
    x = torch.randint(0, 37, (2, 16))
    m(x, x)[1].backward()
    g = m.pe.rel_emb.grad.abs().sum(-1)
    assert (g[1:8] > 0).all() and (g[8:] > 0).all()  # p2c reads rows below k, c2p rows from k: both halves train
    with pytest.raises(ValueError, match='position_buckets'):
        tiny_model('deberta', pos_options={'position_buckets': 8, 'max_relative_positions': 5})


# --- with per-layer stacks and rolling caches (the LayerStack delegates `attention`) ----

def test_layer_stack_delegates_the_attention_hook():
    m = tiny_model('fox', nope_layers=2).eval()  # layer 1 runs NoPE: plain attention
    assert m.transformer.h[0].attn.pe_layer.inner.fgate is not None and m.transformer.h[1].attn.pe_layer.inner is None
    x = torch.randint(0, 37, (2, 30))
    with torch.no_grad():
        full = m(x)[0]
        cache = m.new_cache()
        steps = [m(x[:, :9], cache=cache)[0]] + [m(x[:, t:t + 1], cache=cache)[0] for t in range(9, 30)]
        assert cache.layers[0].state['fox_log_f'].size(2) == 30 and not cache.layers[1].state
    assert torch.allclose(torch.cat(steps, 1), full, atol=1e-5)
    scaled = tiny_model('fox', attn_scaling={'type': 'llama4'}, nope_layers=2).eval()  # scales the NoPE layer only
    with torch.no_grad():
        assert torch.isfinite(scaled(x)[0]).all()
    with pytest.raises(ValueError, match='computes its attention itself'):
        tiny_model('stick_breaking', attn_scaling={'type': 'logn'})
    # rope takes attn_scaling, except with a run-time extension that computes its attention itself
    assert tiny_model('rope', attn_scaling={'type': 'logn'}).pe.attn_scaling['type'] == 'logn'
    with pytest.raises(ValueError, match='computes its attention itself'):
        tiny_model('rope', attn_scaling={'type': 'logn'}, rope_scaling={'type': 'rerope', 'window': 8})


def test_rolling_cache_evicts_fox_state_with_its_keys():
    m = tiny_model('fox').eval()
    cache = m.new_cache(window=5, sink=2)
    with torch.no_grad():
        for t in range(12):
            m(torch.randint(0, 37, (1, 1)), cache=cache)
            for layer in cache.layers:
                assert layer.state['fox_log_f'].size(2) == layer.n
    assert cache.layers[0].n == 7
