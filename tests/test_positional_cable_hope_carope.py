"""CABLE, HoPE and CARoPE against their references' arithmetic, re-derived here in float64 from the authors' code
(CABLE: axiomlab/Cable's src/Cable.py, and its first release for qk_scale='embd') or from the paper's formulas (HoPE,
CARoPE: no authors' code), never from positional.py: each layer's output and every gradient (q, k, v, the layer
input x, the scheme's weights) to 1e-12 relative; CABLE's bias in every form it hands over (the table, the factors,
their routes forced as on CUDA); the equalities that pin the defaults (CABLE is ALiBi with constant steps and FoX
with the gate's sign flipped; HoPE with turns=0 is rope, by default p-RoPE with the pairs it keeps; CARoPE at init
is rope); a KV cache in two calls equal to one; the options' one-line errors. Causality, KV-cache parity at the
model, windows, sinks, FlexAttention = dense, compile and bf16 are the registry-wide tests' (by name)."""
import math
import os
import re

import pytest
import torch
import torch.nn.functional as F

import attention as A
import kvcache
import positional as P
from conftest import ROOT, forced_cuda_routes, tiny_config, tiny_model
from model import GPT
from test_positional import test_successor_variants_cache_windows_sinks_and_16x as successor_checks
from test_positional import \
    test_successor_variants_compile_without_graph_breaks_and_flex_equals_dense as successor_compile_checks

B, H, C = 2, 4, 32  # batch, heads, n_embd: head_dim 8
D = C // H


def rel(got, want):
    """The largest error relative to the largest entry of want."""
    return ((got - want).abs().max() / want.abs().max()).item()


def rand64(*shape, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).requires_grad_()


def scheme64(name, seed=0, **opts):
    """The scheme and a float64 layer of it whose weights are drawn afresh (off their init), tiny_config's sizes."""
    pe = P.REGISTRY[name](tiny_config(name), **opts)
    layer = pe.new_layer()
    if layer is not None:
        torch.manual_seed(seed)
        with torch.no_grad():
            for p in layer.parameters():
                p.copy_(torch.randn_like(p) * 0.5)
        layer.double()
    return pe, layer


def layer_forward(pe, layer, q, k, v, x, q_pos, k_pos, cache=None, backend='dense', sink_logits=None):
    """What CausalSelfAttention does with a scheme past its projections: layer_context, transform_qk, the cache (keys
    kept transformed), the bias, attend (with sink logits where given). q_pos are the last positions of k_pos."""
    ctx = pe.context(q_pos, k_pos)
    ctx.consecutive = cache is None and q_pos.numel() == k_pos.numel() and int(k_pos[0]) == 0
    ctx = pe.layer_context(x, ctx, layer, cache)
    q, k = pe.transform_qk(q, k, ctx, layer)
    if cache is not None:
        k, v = cache.append(k, v)
    return A.attend(q, k, v, pe.score_mod(q, k, ctx, layer), backend=backend, sink_logits=sink_logits)


def causal_softmax(logits, v, q_pos, k_pos):
    """softmax over the keys at or before each query's position, then the values (float64)."""
    hidden = k_pos[None, :] > q_pos[:, None]
    return torch.softmax(logits.masked_fill(hidden, float('-inf')), -1) @ v


def grads(y, wrt, seed=99):
    """y and the gradients of sum(y * g) for a fixed random g, as one list."""
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return [y] + list(torch.autograd.grad((y * g).sum(), wrt, retain_graph=True))


def assert_all_close(got, want, tol=1e-12):
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.shape == b.shape and rel(a, b) <= tol, (i, rel(a, b))


# --- CABLE: the authors' code ------------------------------------------------------------------------------------

def cable_reference(q, k, v, x, W, c, qk_scale):
    """axiomlab/Cable's attention (src/Cable.py), written from its lines: b = cumsum(-softplus(h_attn(x)), dim=1)
    permuted to (B, nh, T); Bias = b.unsqueeze(3) - b.unsqueeze(2) + the causal -inf mask; the logits
    baddbmm(Bias, q / sqrt(C / n_embd), k^T / sqrt(C / n_embd)) with C = n_embd, i.e. q k^T unscaled; softmax; @ v.
    qk_scale='embd' is the first release (Cable.py at 087c3a1): q and k lifted with columns [ll, z] and [-z, ll],
    ll = sqrt(C), z = b, the causal mask added, all of it divided by sqrt(C). qk_scale='head': q k^T / sqrt(head_dim),
    the bias as the code adds it."""
    T = x.size(1)
    b = torch.cumsum(-F.softplus(x @ W.t() + c), dim=1).permute(0, 2, 1)  # (B, nh, T)
    causal = torch.triu(torch.full((T, T), float('-inf'), dtype=torch.float64), diagonal=1)
    if qk_scale == 'embd':
        ll = torch.full((B, H, T, 1), math.sqrt(C), dtype=torch.float64)
        z = b[..., None]
        qq, kk = torch.cat([q, ll, z], -1), torch.cat([k, -z, ll], -1)
        att = (causal + qq @ kk.transpose(-1, -2)) / math.sqrt(C)
    else:
        s = 1.0 if qk_scale == 'none' else 1 / math.sqrt(D)
        att = (b.unsqueeze(3) - b.unsqueeze(2)) + causal + (q * s) @ k.transpose(-1, -2)
    return F.softmax(att, dim=-1) @ v


@pytest.mark.parametrize('qk_scale', ['none', 'head', 'embd'])
def test_cable_equals_the_authors_attention_with_every_gradient(qk_scale):
    """The layer's output and the gradients of q, k, v, x and the step projection (weight and bias) against the
    authors' code, each scale, in float64 to 1e-12."""
    T = 13
    pe, layer = scheme64('cable', qk_scale=qk_scale)
    q, k, v = (rand64(B, H, T, D, seed=s) for s in (1, 2, 3))
    x = rand64(B, T, C, seed=4)
    W, c = layer.bias_proj.weight, layer.bias_proj.bias
    pos = torch.arange(T)
    got = grads(layer_forward(pe, layer, q, k, v, x, pos, pos), [q, k, v, x, W, c])
    want = grads(cable_reference(q, k, v, x, W, c, qk_scale), [q, k, v, x, W, c])
    assert_all_close(got, want)


def cable_bias_reference(x, W, c):
    """b_i - b_j of the authors' code, [B, H, T, T] (above the diagonal too: the mask hides it)."""
    b = torch.cumsum(-F.softplus(x @ W.t() + c), dim=1).permute(0, 2, 1)
    return b.unsqueeze(3) - b.unsqueeze(2)


def test_cable_hands_its_bias_as_a_table_and_as_factors_and_both_routes_equal_the_authors(monkeypatch):
    """table() is b_i - b_j whole; the factors give fq_i . fk_j = -b_j, plus b_i (the query's alone, which softmax
    drops); with CUDA's routes forced on the CPU (qk_lift with the factors, sdpa_bias with the table) the output and
    the gradients equal the authors' code in float64."""
    T = 12
    pe, layer = scheme64('cable', seed=1)
    q, k, v = (rand64(B, H, T, D, seed=s) for s in (5, 6, 7))
    x = rand64(B, T, C, seed=8)
    W, c = layer.bias_proj.weight, layer.bias_proj.bias
    pos = torch.arange(T)
    ctx = pe.context(pos, pos)
    ctx.consecutive = True
    ctx = pe.layer_context(x, ctx, layer, None)
    bias = pe.score_mod(q, k, ctx, layer)
    want = cable_bias_reference(x, W, c)
    assert rel(bias.table(), want) <= 1e-12
    fq, fk = bias.factors()
    b_ref = torch.cumsum(-F.softplus(x @ W.t() + c), dim=1).permute(0, 2, 1)  # [B, H, T]
    assert rel(fq @ fk.transpose(-1, -2) + b_ref[..., :, None], want) <= 1e-12  # -b_j, then b_i of the query
    forced_cuda_routes(monkeypatch)
    wrt = [q, k, v, x, W, c]
    ref = grads(cable_reference(q, k, v, x, W, c, pe.qk_scale), wrt)
    for forms, route in (({'factors': bias.factors}, 'qk_lift'), ({'table': bias.table}, 'sdpa_bias')):
        b = A.Bias(bias.mod, **forms)
        assert A.route(A.Call('cpu', bias=b, Tq=T, Tk=T, dtype=torch.float64)) == route
        y = A.attend(pe.transform_qk(q, k, ctx, layer)[0], k, v, b)
        assert_all_close(grads(y, wrt), ref)


def test_cable_through_a_kv_cache_in_two_calls_equals_one_forward():
    """Tokens :5 then 5: through a cache (each key's step kept in cache.state) give the one forward's output, with sink
    logits too, whose share reads each row's whole logits: b_i of the query as well as -b_j."""
    T, split = 11, 5
    pe, layer = scheme64('cable', seed=2)
    q, k, v = (rand64(B, H, T, D, seed=s) for s in (9, 10, 11))
    x = rand64(B, T, C, seed=12)
    pos = torch.arange(T)
    for sinks in (None, torch.linspace(-1, 1, H, dtype=torch.float64)):
        full = layer_forward(pe, layer, q, k, v, x, pos, pos, sink_logits=sinks)
        cache = kvcache.LayerKV()
        a = layer_forward(pe, layer, q[:, :, :split], k[:, :, :split], v[:, :, :split], x[:, :split], pos[:split],
                          pos[:split], cache, sink_logits=sinks)
        b = layer_forward(pe, layer, q[:, :, split:], k[:, :, split:], v[:, :, split:], x[:, split:], pos[split:],
                          pos, cache, sink_logits=sinks)
        assert cache.state['cable_step'].shape == (B, H, T)
        assert rel(torch.cat((a, b), 2), full) <= 1e-12


def test_cable_defaults_as_the_authors_init():
    m = tiny_model('cable')
    proj = m.transformer.h[0].attn.pe_layer.bias_proj
    assert proj.weight.shape == (4, 32) and (proj.bias == 0).all() and abs(proj.weight.std().item() - 0.02) < 0.006
    assert m.pe.at(0).qk_scale == 'none' and m.pe.at(0).q_gain == math.sqrt(32 / 4)  # the code's unscaled q.k


def test_cable_with_constant_steps_is_alibi_and_with_the_gate_negated_is_fox():
    """w = 0, softplus(c_h) = m_h (ALiBi's slopes): every step is -m_h, the bias -m_h (i - j). And since
    log sigmoid(z) = -softplus(-z), CABLE with (w, c) is FoX with (-w, -c). (With qk_scale='head': their q.k scale.)"""
    x = torch.randint(0, 37, (2, 16))
    cable = tiny_model('cable', seed=3, pos_options={'qk_scale': 'head'})
    alibi, fox = tiny_model('alibi', seed=3), tiny_model('fox', seed=3)
    slopes = P.alibi_slopes(4).double()
    with torch.no_grad():
        for blk in cable.transformer.h:
            blk.attn.c_attn.weight.mul_(10)  # sharp attention: the bias shows
        shared = {n: p for n, p in cable.state_dict().items() if 'pe_layer' not in n}
        alibi.load_state_dict(shared)
        fox.load_state_dict(shared, strict=False)
        for a, f in zip(cable.transformer.h, fox.transformer.h):
            a.attn.pe_layer.bias_proj.weight.normal_(std=0.5)
            a.attn.pe_layer.bias_proj.bias.uniform_(-1, 2)
            f.attn.pe_layer.fgate.weight.copy_(-a.attn.pe_layer.bias_proj.weight)
            f.attn.pe_layer.fgate.bias.copy_(-a.attn.pe_layer.bias_proj.bias)
        assert torch.allclose(cable(x)[0], fox(x)[0], atol=1e-5)
        assert not torch.allclose(cable(x)[0], alibi(x)[0], atol=1e-3)
        for a in cable.transformer.h:
            a.attn.pe_layer.bias_proj.weight.zero_()
            a.attn.pe_layer.bias_proj.bias.copy_(torch.log(torch.expm1(slopes)).float())
        assert torch.allclose(cable(x)[0], alibi(x)[0], atol=1e-5)


# --- HoPE: the paper's formula --------------------------------------------------------------------------------------

def hope_turn(x, pos, L, base, turns):
    """Pair i (dims i and i + d/2) turned by pos * theta_i, theta_i = base^(-2i/d), where theta_i L >= 2 pi turns,
    else left as it is; one pair at a time, float64."""
    d = x.size(-1)
    first, second = [], []
    for i in range(d // 2):
        x1, x2 = x[..., i], x[..., i + d // 2]
        theta = base ** (-2 * i / d)
        if theta * L >= 2 * math.pi * turns:
            a = pos.double() * theta
            x1, x2 = x1 * torch.cos(a) - x2 * torch.sin(a), x1 * torch.sin(a) + x2 * torch.cos(a)
        first.append(x1)
        second.append(x2)
    return torch.stack(first + second, -1)


def test_hope_keeps_the_pairs_that_turn_a_period_within_the_training_length():
    """At nanoPE's default sizes (head_dim 32, L = 128) theta_i = 10000^(-i/16) >= 2 pi / 128 for i <= 5: 6 pairs
    rotate; a quarter turn (pi / 2) keeps 8; turns=0 every pair; at L = 2048, 11."""
    cfg = dict(block_size=128, n_embd=128)
    assert GPT(tiny_config('hope', **cfg)).pe.at(0).n_rot == 6
    assert GPT(tiny_config('hope', **cfg, pos_options={'turns': 0.25})).pe.at(0).n_rot == 8
    assert GPT(tiny_config('hope', **cfg, pos_options={'turns': 0})).pe.at(0).n_rot == 16
    assert GPT(tiny_config('hope', **cfg, pos_options={'train_len': 2048})).pe.at(0).n_rot == 11


@pytest.mark.parametrize('opts', [{}, {'turns': 0.25}, {'train_len': 64, 'base': 500.0}])
def test_hope_equals_the_papers_rotation_with_every_gradient(opts):
    """Queries at positions 7..11 over keys 0..11 (a cache's last queries): output and the gradients of q, k, v against
    the per-pair formula, float64 to 1e-12; the float32 path (rope's tables) to float32's precision."""
    pe = P.REGISTRY['hope'](tiny_config('hope', n_embd=64, n_head=2), **opts)  # head_dim 32: 16 pairs
    L, base, turns = opts.get('train_len', 16), opts.get('base', 10000.0), opts.get('turns', 1.0)
    d, Tq, Tk = 32, 5, 12
    q, k, v = rand64(B, 2, Tq, d, seed=13), rand64(B, 2, Tk, d, seed=14), rand64(B, 2, Tk, d, seed=15)
    q_pos, k_pos = torch.arange(7, 12), torch.arange(Tk)
    got = grads(layer_forward(pe, None, q, k, v, None, q_pos, k_pos), [q, k, v])
    qq, kk = hope_turn(q, q_pos, L, base, turns), hope_turn(k, k_pos, L, base, turns)
    y = causal_softmax(qq @ kk.transpose(-1, -2) / math.sqrt(d), v, q_pos, k_pos)
    want = grads(y, [q, k, v])
    assert_all_close(got, want)
    y32 = layer_forward(pe, None, q.float(), k.float(), v.float(), None, q_pos, k_pos)
    assert rel(y32.double(), want[0]) < 1e-5


def test_hope_with_turns_0_is_rope_and_by_default_p_rope_with_the_pairs_it_keeps():
    x = torch.randint(0, 37, (2, 40))
    rope = tiny_model('rope', seed=5)
    with torch.no_grad():
        for blk in rope.transformer.h:
            blk.attn.c_attn.weight.mul_(10)  # sharp attention: the angles show
    every, hope, prope = (tiny_model(n, pos_options=o) for n, o in (('hope', {'turns': 0}), ('hope', {}),
                                                                      ('rope', {'p_rope': 0.25})))
    for m in (every, hope, prope):
        m.load_state_dict(rope.state_dict())
    assert hope.pe.at(0).n_rot == 1  # head_dim 8, L = 16: theta_i = 10000^(-i/4) >= 2 pi / 16 for i = 0 only
    with torch.no_grad():
        assert torch.equal(every(x)[0], rope(x)[0])
        assert torch.allclose(hope(x)[0], prope(x)[0], atol=1e-6)
        assert not torch.allclose(hope(x)[0], rope(x)[0], atol=1e-3)


def test_hope_tables_hold_the_cos_and_sin_it_computes(monkeypatch):
    """Where the rotary tables are read (positional.ROTARY_TABLES_ON: CUDA; forced onto the CPU here), HoPE's hold its
    own frequencies, the dropped pairs at 0: a forward equals the computed one bitwise."""
    x = torch.randint(0, 37, (2, 16), generator=torch.Generator().manual_seed(0))
    m = tiny_model('hope', n_embd=64, n_head=2)
    with torch.no_grad():
        want = m(x)[0]
        monkeypatch.setattr(P, 'ROTARY_TABLES_ON', ('cpu',))
        assert m.pe.at(0).context(torch.arange(16), torch.arange(16), 16).extra['tabled']
        assert torch.equal(m(x)[0], want)


# --- CARoPE: the paper's formula ------------------------------------------------------------------------------------

def carope_reference(q, k, v, x, W, b):
    """f_h(x_t) = 1 / (softplus(x_t W + b)_h + 1), phi_h,i(m) = sum_{t <= m} f_h(x_t)^i, pair i (dims i, i + d/2) of
    q_m and k_m turned by phi(m), logits / sqrt(d), causal softmax, @ v; one token and one pair at a time in float64."""
    Bn, T, _ = x.shape
    d = q.size(-1)
    f = 1 / (F.softplus(x @ W.t() + (0 if b is None else b)) + 1)  # [B, T, H]
    turned = []
    for t in (q, k):
        first, second = [], []
        for i in range(d // 2):
            phase = torch.stack([sum(f[:, s] ** i for s in range(m + 1)) for m in range(T)], 1)  # [B, T, H]
            a = phase.permute(0, 2, 1)  # [B, H, T]
            x1, x2 = t[..., i], t[..., i + d // 2]
            first.append(x1 * torch.cos(a) - x2 * torch.sin(a))
            second.append(x1 * torch.sin(a) + x2 * torch.cos(a))
        turned.append(torch.stack(first + second, -1))
    pos = torch.arange(T)
    return causal_softmax(turned[0] @ turned[1].transpose(-1, -2) / math.sqrt(d), v, pos, pos)


@pytest.mark.parametrize('opts', [{}, {'bias': False}])
def test_carope_equals_the_papers_phases_with_every_gradient(opts):
    """Output and the gradients of q, k, v, x, W (and b) against the paper's sums, float64 to 1e-12."""
    T = 9
    pe, layer = scheme64('carope', seed=3, **opts)
    q, k, v = (rand64(B, H, T, D, seed=s) for s in (16, 17, 18))
    x = rand64(B, T, C, seed=19)
    wrt = [q, k, v, x] + list(layer.freq.parameters())
    pos = torch.arange(T)
    got = grads(layer_forward(pe, layer, q, k, v, x, pos, pos), wrt)
    want = grads(carope_reference(q, k, v, x, layer.freq.weight, layer.freq.bias), wrt)
    assert_all_close(got, want)


def test_carope_through_a_kv_cache_in_two_calls_equals_one_forward():
    """Tokens :4 then 4: through a cache (the running phase in cache.carry) give the one forward's output."""
    T, split = 10, 4
    pe, layer = scheme64('carope', seed=4)
    q, k, v = (rand64(B, H, T, D, seed=s) for s in (20, 21, 22))
    x = rand64(B, T, C, seed=23)
    pos = torch.arange(T)
    full = layer_forward(pe, layer, q, k, v, x, pos, pos)
    cache = kvcache.LayerKV()
    a = layer_forward(pe, layer, q[:, :, :split], k[:, :, :split], v[:, :, :split], x[:, :split], pos[:split],
                      pos[:split], cache)
    b = layer_forward(pe, layer, q[:, :, split:], k[:, :, split:], v[:, :, split:], x[:, split:], pos[split:], pos,
                      cache)
    assert cache.carry['carope_phase'].shape == (B, H, 1, D // 2)
    assert rel(torch.cat((a, b), 2), full) <= 1e-12


def test_carope_at_init_is_rope_and_its_frequencies_follow_x_once_w_moves():
    """W = 0 and b_h = softplus^-1(base^(2/d) - 1): f = base^(-2/d) = theta_1 for every token, the phases (m + 1)
    theta_i: rope's logits. bias=False at W = 0 is rope at base (1 + ln 2)^(d/2)."""
    x = torch.randint(0, 37, (2, 40))
    carope, rope = tiny_model('carope', seed=6), tiny_model('rope', seed=6)
    layer = carope.transformer.h[0].attn.pe_layer
    assert (layer.freq.weight == 0).all()
    assert 1 / (F.softplus(layer.freq.bias.detach().double()) + 1) == pytest.approx(10000 ** (-2 / 8), rel=1e-6)
    with torch.no_grad():
        for blk in carope.transformer.h:
            blk.attn.c_attn.weight.mul_(10)  # sharp attention: the angles show
        rope.load_state_dict({n: p for n, p in carope.state_dict().items() if 'pe_layer' not in n})
        assert torch.allclose(carope(x)[0], rope(x)[0], atol=1e-5)
        plain = tiny_model('carope', seed=6, pos_options={'bias': False})
        rope_b = tiny_model('rope', seed=6, pos_options={'base': (1 + math.log(2)) ** 4})
        plain.load_state_dict(carope.state_dict(), strict=False)
        rope_b.load_state_dict(rope.state_dict())
        assert torch.allclose(plain(x)[0], rope_b(x)[0], atol=1e-5)
        for blk in carope.transformer.h:
            blk.attn.pe_layer.freq.weight.normal_(std=0.3)
        assert not torch.allclose(carope(x)[0], rope(x)[0], atol=1e-3)


# --- the options' variants through test_positional.py's successor checks ---------------------------------------------

VARIANTS = [('cable', {}), ('cable', {'qk_scale': 'head'}), ('hope', {}), ('hope', {'turns': 0.25}), ('carope', {}),
            ('carope', {'bias': False, 'init_std': 0.02})]
IDS = [n + ''.join(f"-{k}={v}" for k, v in o.items()) for n, o in VARIANTS]


@pytest.mark.parametrize('name, opts', VARIANTS, ids=IDS)
def test_variants_cache_windows_sinks_and_16x(name, opts):
    """test_positional.py's checks of RoPE's successors (causality; a KV cache, windowed, chunked and rolling, equal to
    a full forward; 16 x block_size; float32 tables under bf16 autocast), here for each scheme and option."""
    successor_checks(name, opts)


@pytest.mark.parametrize('name, opts', [v for v in VARIANTS if v[1]], ids=[i for i, v in zip(IDS, VARIANTS) if v[1]])
def test_variants_compile_without_graph_breaks_flex_equals_dense_and_sinks(name, opts):
    """test_positional.py's: one graph compiled, FlexAttention equal to dense, a rolling cache's step equal to a plain
    forward over the kept tokens; the defaults get them from test_model.py by name."""
    successor_compile_checks(name, opts)


# --- options, docstrings, configs -----------------------------------------------------------------------------------

@pytest.mark.parametrize('name, opts, msg', [
    ('cable', {'qk_scale': 'model'}, "cable qk_scale must be one of 'head', 'none', 'embd', got 'model'"),
    ('hope', {'turns': -1}, 'hope turns must be a number >= 0 (the periods a pair must turn within train_len'),
    ('hope', {'train_len': 0}, 'hope train_len must be an integer >= 1 (the training length L), got 0'),
    ('hope', {'base': 1}, 'hope base must be a number > 1, got 1'),
    ('carope', {'base': 0.5}, 'carope base must be a number > 1 (the RoPE it starts as: f = base^(-2/d)), got 0.5'),
    ('carope', {'bias': 1}, 'carope bias must be True or False, got 1'),
    ('carope', {'init_std': -0.1}, "carope init_std must be a number >= 0 (W's initial std), got -0.1"),
])
def test_bad_options_are_one_line_that_names_the_fix(name, opts, msg):
    with pytest.raises(ValueError, match='^' + re.escape(msg)) as e:
        GPT(tiny_config(name, pos_options=opts))
    assert '\n' not in str(e.value)


def test_hope_takes_no_rope_scaling():
    with pytest.raises(ValueError, match='no rotary embedding to scale'):
        GPT(tiny_config('hope', rope_scaling={'type': 'linear', 'factor': 2.0}))


def test_docstrings_name_paper_formula_defaults_and_configs_select_the_schemes():
    for name, aid in (('cable', '2503.08067'), ('hope', '2410.21216'), ('carope', '2507.23083')):
        doc = P.REGISTRY[name].__doc__
        assert aid in doc and 'Options' in doc and 'defaults' in doc, name
        cfg = {}
        with open(os.path.join(ROOT, 'config', f'{name}.py')) as f:
            exec(f.read(), cfg)
        assert cfg['pos_encoding'] == name and cfg['out_dir'] == f'out-{name}'
    assert 'axiomlab/Cable' in P.CABLE.__doc__ and 'src/Cable.py' in P.CABLE.__doc__
