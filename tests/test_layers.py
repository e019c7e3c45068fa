"""The layer plan and the attention it owns: sliding windows and chunks (against a masked reference
written from the formula, per pair, on every attention path and for every scheme, own-attention ones
included; KV-cache decoding past the window and across chunks with a bounded cache; the block mask
skips blocks), sink logits and QK-norm against explicit formulas, the sink's gradient against finite
differences, the plan grammar, a fine-tune that changes the scheme, the presets' plans, and bad input."""
import json
import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.attention.flex_attention as fa

import attention as A
import checkpoint
import layers
import positional
from conftest import ROOT, SCHEMES, assert_causal, fork_run, tiny_config, tiny_model
from model import GPT, GPTConfig, changeable

EVERY_PATH_SCHEMES = SCHEMES + ['rope+self_extend']


def build(scheme, seed=0, **kw):
    if scheme == 'rope+self_extend':
        scheme, kw = 'rope', dict(kw, rope_scaling={'type': 'self_extend', 'window': 4, 'group': 2})
    return tiny_model(scheme, seed, **kw)


# --- independent references --------------------------------------------------

def sees(t, u, window=None, chunk=None):
    """Query token t sees key token u: the definitions of HF / gpt-oss (window) and Llama 4 (chunk)."""
    if u > t:
        return False
    if window is not None and not t - u < window:
        return False
    return chunk is None or t // chunk == u // chunk


def reference_attend(q, k, v, k0=0, window=None, chunk=None, bias=None, sink_logits=None):
    """softmax over the keys each query sees, per pair in float64; bias(b, h, i, j) added to the scaled
    logit; a sink logit s_h in every row's denominator."""
    B, H, Tq, d = q.shape
    Tk = k.size(2)
    out = torch.zeros(B, H, Tq, v.size(-1), dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for i in range(Tq):
                t = k0 + Tk - Tq + i
                js = [j for j in range(Tk) if sees(t, k0 + j, window, chunk)]
                z = [float(q[b, h, i].double() @ k[b, h, j].double()) / math.sqrt(d)
                     + (float(bias(b, h, i, j)) if bias else 0.0) for j in js]
                m = max(z + ([float(sink_logits[h])] if sink_logits is not None else []))
                w = [math.exp(x - m) for x in z]
                den = sum(w) + (math.exp(float(sink_logits[h]) - m) if sink_logits is not None else 0.0)
                out[b, h, i] = sum((wi / den) * v[b, h, j].double() for wi, j in zip(w, js))
    return out


def qkv(B, H, Tq, Tk, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = torch.randn(B, H, Tq, d, generator=g), torch.randn(B, H, Tk, d, generator=g), \
        torch.randn(B, H, Tk, d, generator=g)
    return q, k, v


MASKS = [dict(window=5), dict(chunk=6), dict(window=4, chunk=7), dict()]


@pytest.mark.parametrize('mask', MASKS)
@pytest.mark.parametrize('k0, Tq, Tk', [(0, 17, 17), (0, 5, 17), (9, 6, 11), (13, 1, 4)])
def test_mask_visibility_is_the_formula_per_pair(mask, k0, Tq, Tk):
    m = A.Mask(**mask).at(k0)
    vis = m.visibility(Tq, Tk, 'cpu')
    want = torch.tensor([[sees(k0 + Tk - Tq + i, k0 + j, **mask) for j in range(Tk)] for i in range(Tq)])
    assert torch.equal(vis, want)
    for i in range(Tq):  # the first key of every row, which query chunks slice from
        row = want[i].nonzero()
        assert m.first_key(i, Tq, Tk) == (int(row[0]) if len(row) else Tk - Tq + i)


@pytest.mark.parametrize('mask', MASKS)
@pytest.mark.parametrize('path', ['sdpa', 'dense', 'dense-chunked', 'flex', 'sinks'])
@pytest.mark.parametrize('k0, Tq, Tk', [(0, 20, 20), (8, 7, 19)])
def test_attend_matches_masked_reference_on_every_path(mask, path, k0, Tq, Tk, monkeypatch):
    monkeypatch.setitem(A._compiled, 'flex', fa.flex_attention)  # eager flex: cheap on CPU, same maths
    monkeypatch.setattr(fa, '_validate_device', lambda *a: None)
    monkeypatch.setattr(A, 'FLEX_LSE_ON_CPU', True)
    q, k, v = qkv(2, 3, Tq, Tk, 8, seed=Tq)
    table = torch.randn(Tk)
    mod = None if path in ('sdpa', 'sinks') else (lambda score, b, h, i, j: score + table[j] * (h + 1))
    sink_logits = torch.tensor([0.5, -1.0, 2.0]) if path == 'sinks' else None
    m = A.Mask(**mask).at(k0)
    with torch.set_grad_enabled(path != 'dense-chunked'):
        if path == 'dense-chunked':  # 3 query rows a chunk, each with only the keys it can see
            monkeypatch.setattr(A, 'DENSE_CHUNK_BYTES', 4 * 2 * 3 * 3 * (3 + 5))
        got = A.attend(q, k, v, mod, backend='flex' if path == 'flex' else 'dense', mask=m, sink_logits=sink_logits)
    want = reference_attend(q, k, v, k0, bias=None if mod is None else (lambda b, h, i, j: table[j] * (h + 1)),
                            sink_logits=sink_logits, **mask)
    assert torch.allclose(got.double(), want, atol=1e-5)


def test_query_chunks_slice_in_only_the_keys_a_window_sees(monkeypatch):
    """Without gradients a windowed layer's query chunks see at most rows + W - 1 keys each, so the
    cost grows linearly with the length; every key range handed out is the chunk's visible range."""
    monkeypatch.setattr(A, 'DENSE_CHUNK_BYTES', 4 * 1 * 2 * 20 * (20 + 16))  # 20 query rows a chunk
    seen = []
    q, k, v = qkv(1, 2, 300, 300, 8)
    m = A.Mask(window=16)

    def fn(q, k, v, a):
        seen.append((a.row0, a.key0, q.size(2), k.size(2)))
        return q
    with torch.no_grad():
        A.chunk_queries(fn, q, k, v, A.Attender(m))
    assert sum(n for _, _, n, _ in seen) == 300 and len(seen) > 1
    for s, lo, rows, keys in seen:
        assert lo == max(0, s - 15) and keys == s + rows - lo and keys <= rows + 15


@pytest.mark.parametrize('mask', [dict(window=200), dict(chunk=256), dict(window=130, chunk=300), dict()])
@pytest.mark.parametrize('k0, Tq, Tk', [(0, 1024, 1024), (0, 300, 1000), (517, 129, 700)])
def test_block_mask_equals_create_block_mask_and_skips_blocks(mask, k0, Tq, Tk):
    m = A.Mask(**mask).at(k0)
    ours = m.block_mask(Tq, Tk, 'cpu')
    off = k0 + Tk - Tq

    def mask_mod(b, h, i, j):  # the formula, on token indices
        t, u = i + off, j + k0
        ok = u <= t
        if 'window' in mask:
            ok = ok & (t - u < mask['window'])
        if 'chunk' in mask:
            ok = ok & (t // mask['chunk'] == u // mask['chunk'])
        return ok
    ref = fa.create_block_mask(mask_mod, None, None, Tq, Tk, device='cpu')
    assert torch.equal(ours.to_dense(), ref.to_dense())
    assert torch.equal(ours.full_kv_num_blocks, ref.full_kv_num_blocks)
    visited = int(ours.kv_num_blocks.sum() + ours.full_kv_num_blocks.sum())
    causal = int(A.CAUSAL.block_mask(Tq, Tk, 'cpu').kv_num_blocks.sum()
                 + A.CAUSAL.block_mask(Tq, Tk, 'cpu').full_kv_num_blocks.sum())
    if mask == dict(window=200) and Tq == 1024:  # 8 query blocks of 128: causal visits 1 + 2 + ... + 8 = 36
        assert (visited, causal) == (21, 36)  # blocks; a 200-key window reaches back 1, 2, then 3 blocks
    if mask == dict(chunk=256) and Tq == 1024:  # two key blocks per chunk: 1 + 2 per chunk of two query blocks
        assert visited == 12


# --- every scheme, windowed and chunked, through the model -------------------------

def one_layer(scheme, **kw):
    return build(scheme, n_layer=1, **kw).eval()


@pytest.mark.parametrize('scheme', EVERY_PATH_SCHEMES)
@pytest.mark.parametrize('mask', [dict(sliding_window=5), dict(attention_chunk_size=6)])
def test_every_scheme_sees_only_its_window_or_chunk(scheme, mask):
    """One layer: the logits at token t depend on the tokens t sees (and on nothing else) -- for
    own-attention schemes too (FoX, CoPE, stick-breaking, Self-Extend get the mask from attend). A scheme
    whose positions read the layer input through a causal convolution (x_lookback > 0: Selective RoPE) also
    reads the x_lookback tokens just before t's first visible key, and no earlier one."""
    m = one_layer(scheme, **mask)
    T = 16
    x = torch.randint(0, 37, (1, T), generator=torch.Generator().manual_seed(1))
    W, C = mask.get('sliding_window'), mask.get('attention_chunk_size')
    back = m.pe.at(0).x_lookback
    with torch.no_grad():
        base = m(x)[0]
        for u in (0, 3, 5, 9):
            y = x.clone()
            y[0, u] = (y[0, u] + 1) % 37
            diff = (m(y)[0] - base).abs().amax(-1)[0]
            for t in range(T):
                first = min(v for v in range(t + 1) if sees(t, v, W, C))
                if sees(t, u, W, C):
                    assert diff[t] > 1e-6, (t, u)
                elif not first - back <= u < first:
                    assert diff[t] < 1e-6, (t, u)


@pytest.mark.parametrize('scheme', EVERY_PATH_SCHEMES)
@pytest.mark.parametrize('mask', [dict(sliding_window=5), dict(attention_chunk_size=7),
                                  dict(sliding_window=4, attention_chunk_size=9)])
def test_windowed_kv_cache_equals_full_forward_and_stays_bounded(scheme, mask):
    m = build(scheme, **mask).eval()
    T = 16 if m.pe.max_len else 40
    x = torch.randint(0, 37, (2, T), generator=torch.Generator().manual_seed(2))
    bound = min(v for v in mask.values())
    with torch.no_grad():
        full, _ = m(x)
        cache = m.new_cache()
        outs = [m(x[:, :7], cache=cache)[0]]
        for t in range(7, T - 3):
            outs.append(m(x[:, t:t + 1], cache=cache)[0])
            assert all(layer.n < bound for layer in cache.layers), [layer.n for layer in cache.layers]
        outs.append(m(x[:, T - 3:], cache=cache)[0])
    assert torch.allclose(torch.cat(outs, 1), full, atol=1e-5)


def test_windowed_cache_memory_is_constant_over_a_long_generation():
    m = tiny_model('rope', sliding_window=8).eval()
    with torch.no_grad():
        cache = m.new_cache()
        m(torch.zeros(1, 4, dtype=torch.long), cache=cache)
        caps = []
        for t in range(300):
            m(torch.zeros(1, 1, dtype=torch.long), cache=cache)
            caps.append(max(layer.k.size(2) for layer in cache.layers))
    assert cache.length == 304 and max(caps) == caps[10] and max(caps) <= 64
    assert cache.k_pos.numel() == 7 and cache.k_pos[-1] == 303  # the positions kept are those of the keys kept


def test_windowed_model_on_dense_path_equals_masked_reference_with_rope():
    """The model's layer with a window and RoPE equals softmax over the window's keys of RoPE-rotated
    q.k / sqrt(d), written per pair here."""
    m = one_layer('rope', sliding_window=6)
    attn = m.transformer.h[0].attn
    with torch.no_grad():
        attn.c_attn.weight.mul_(20)
        T = 14
        x = torch.randn(1, T, 32)
        q, k, v = (t.view(1, T, 4, 8).transpose(1, 2) for t in attn.c_attn(x).split(32, dim=2))
        pos = torch.arange(T).double()
        inv = torch.tensor([1e4 ** (-2 * i / 8) for i in range(4)], dtype=torch.float64)
        ang = pos[:, None] * inv
        cos, sin = torch.cat((ang.cos(), ang.cos()), -1), torch.cat((ang.sin(), ang.sin()), -1)

        def rot(t):
            t = t.double()
            return t * cos + torch.cat((-t[..., 4:], t[..., :4]), -1) * sin
        want = reference_attend(rot(q), rot(k), v, window=6)
        pe = m.pe.at(0)
        got_y = []
        attn.c_proj.register_forward_hook(lambda mod, inp, out: got_y.append(inp[0]))
        attn(x, pe, pe.context(torch.arange(T), torch.arange(T), T))
    assert torch.allclose(got_y[0].double(), want.transpose(1, 2).reshape(1, T, 32), atol=1e-5)


def test_flex_with_a_window_equals_dense_compiled():
    m = tiny_model('alibi', block_size=64, sliding_window=40, attention_chunk_size={1: 96}).eval()
    x = torch.randint(0, 37, (2, 256))
    with torch.no_grad():
        dense = m(x)[0]
        for blk in m.transformer.h:
            blk.attn.backend = 'flex'
        flex = m(x)[0]
    assert torch.allclose(dense, flex, atol=1e-4)


def test_windowed_model_compiles_without_graph_breaks():
    torch._dynamo.reset()
    m = tiny_model('alibi', block_size=32, sliding_window=8, qk_norm=True, sink_logits=True)
    x = torch.randint(0, 37, (2, 32))
    ex = torch._dynamo.explain(m)(x, x)
    torch._dynamo.reset()
    assert ex.graph_break_count == 0, [str(b.reason)[:200] for b in ex.break_reasons]


# --- sink logits ------------------------------------------------------------------

@pytest.mark.parametrize('scheme', [s for s in SCHEMES if positional.REGISTRY[s].softmax == 'attend'])
def test_sink_logits_every_scheme_causal_and_kv_cache(scheme):
    m = tiny_model(scheme, sink_logits=True).eval()
    with torch.no_grad():
        for blk in m.transformer.h:
            blk.attn.sink_logits.copy_(torch.tensor([-1.0, 0.0, 1.5, 3.0]))
    assert_causal(m)
    T = 16 if m.pe.max_len else 30
    x = torch.randint(0, 37, (2, T))
    with torch.no_grad():
        full = m(x)[0]
        cache = m.new_cache()
        steps = [m(x[:, :5], cache=cache)[0]] + [m(x[:, t:t + 1], cache=cache)[0] for t in range(5, T)]
        plain = tiny_model(scheme).eval()
        plain.load_state_dict({k: v for k, v in m.state_dict().items() if not k.endswith('sink_logits')})
        assert not torch.allclose(plain(x)[0], full, atol=1e-3)  # the sinks take a share
    assert torch.allclose(torch.cat(steps, 1), full, atol=1e-5)


def test_sink_logit_is_not_scaled_and_never_masked():
    """With a chunk of 1 every query sees only itself: its softmax weight is 1 / (1 + e^(s - z_ii)),
    z_ii = q.k / sqrt(d), with s as given (not divided by sqrt(d))."""
    q, k, v = qkv(1, 2, 6, 6, 4)
    s = torch.tensor([0.7, -2.0])
    y = A.attend(q, k, v, mask=A.Mask(chunk=1), sink_logits=s, backend='dense')
    z = (q * k).sum(-1) / 2.0
    want = v / (1 + torch.exp(s[None, :, None] - z))[..., None]
    assert torch.allclose(y, want, atol=1e-6)


def test_sink_gradient_equals_finite_differences():
    q, k, v = qkv(1, 3, 9, 9, 8, seed=4)
    w = torch.randn(1, 3, 9, 8, generator=torch.Generator().manual_seed(5))
    s = torch.tensor([0.3, -0.5, 1.0], requires_grad=True)

    def loss(s):
        return (A.attend(q, k, v, mask=A.Mask(window=4), sink_logits=s, backend='dense') * w).sum()
    loss(s).backward()
    eps = 1e-2
    for h in range(3):
        e = torch.zeros(3)
        e[h] = eps
        with torch.no_grad():
            fd = (loss(s + e) - loss(s - e)) / (2 * eps)
        assert s.grad[h].item() == pytest.approx(fd.item(), rel=2e-3, abs=1e-5)
    assert (s.grad.abs() > 1e-4).all()


def test_sinks_train_and_get_gradients_in_the_model():
    m = tiny_model('rope', sink_logits=True)
    x = torch.randint(0, 37, (4, 17))
    _, loss = m(x[:, :-1], x[:, 1:])
    loss.backward()
    sink_logits = [b.attn.sink_logits for b in m.transformer.h]
    assert all(s.grad is not None and (s.grad != 0).all() for s in sink_logits)
    assert all(s.dim() == 1 for s in sink_logits)  # no weight decay (configure_optimizers: dim < 2)


# --- QK-norm ----------------------------------------------------------------------

@pytest.mark.parametrize('kind', ['weight', 'weightless'])
def test_qk_norm_is_rmsnorm_per_head_before_the_positions(kind):
    m = one_layer('rope', qk_norm=True if kind == 'weight' else 'weightless')
    attn = m.transformer.h[0].attn
    if kind == 'weight':
        assert torch.equal(attn.q_norm.weight, torch.ones(8))  # starts at 1 (Qwen3, OLMo 2)
        with torch.no_grad():
            attn.q_norm.weight.copy_(torch.linspace(0.5, 2.0, 8))
            attn.k_norm.weight.copy_(torch.linspace(1.5, 0.2, 8))
    else:
        assert attn.q_norm.weight is None and not [n for n in m.state_dict() if 'norm' in n and 'attn' in n]
    T = 12
    x = torch.randn(1, T, 32)
    with torch.no_grad():
        q, k, v = (t.view(1, T, 4, 8).transpose(1, 2).double() for t in attn.c_attn(x).split(32, dim=2))

        def rms(t, w):
            return t / torch.sqrt((t * t).mean(-1, keepdim=True) + 1e-6) * w
        wq = attn.q_norm.weight.double() if kind == 'weight' else 1.0
        wk = attn.k_norm.weight.double() if kind == 'weight' else 1.0
        pos = torch.arange(T).double()
        inv = torch.tensor([1e4 ** (-2 * i / 8) for i in range(4)], dtype=torch.float64)
        ang = pos[:, None] * inv
        cos, sin = torch.cat((ang.cos(), ang.cos()), -1), torch.cat((ang.sin(), ang.sin()), -1)

        def rot(t):
            return t * cos + torch.cat((-t[..., 4:], t[..., :4]), -1) * sin
        want = reference_attend(rot(rms(q, wq)), rot(rms(k, wk)), v)
        ys = []
        attn.c_proj.register_forward_hook(lambda mod, inp, out: ys.append(inp[0]))
        pe = m.pe.at(0)
        attn(x, pe, pe.context(torch.arange(T), torch.arange(T), T))
    assert torch.allclose(ys[0].double(), want.transpose(1, 2).reshape(1, T, 32), atol=1e-5)


def test_qk_norm_per_layer_through_the_plan_llama4():
    """Llama 4 normalises only its RoPE layers: qk_norm by layer type."""
    m = tiny_model('rope', n_layer=4, layer_types='CCCF', nope_layers='F', attention_chunk_size=8,
                   qk_norm={'C': 'weightless'})
    assert [b.attn.q_norm is not None for b in m.transformer.h] == [True, True, True, False]
    assert [b.attn.mask.chunk for b in m.transformer.h] == [8, 8, 8, None]
    assert [s.pos_options for s in m.plan] == [{}, {}, {}, None]


# --- the plan's grammar ------------------------------------------------------------

def specs(**kw):
    return layers.layer_specs(tiny_config('rope', **kw))


def test_plan_grammar_plain_per_index_per_type_and_tiling():
    p = specs(n_layer=6, layer_types='SSL', sliding_window={'S': 4, 'L': 16}, sink_logits={5: True})
    assert [s.type for s in p] == list('SSLSSL')  # a pattern tiled over the layers (nanochat)
    assert [s.sliding_window for s in p] == [4, 4, 16, 4, 4, 16]
    assert [s.sink_logits for s in p] == [False] * 5 + [True]
    hf = specs(n_layer=4, layer_types=['sliding_attention', 'full_attention'] * 2, sliding_window=8)
    assert [s.sliding_window for s in hf] == [8, None, 8, None]  # HF: a number applies to the sliding layers
    assert [s.sliding_window for s in specs(n_layer=3, sliding_window=8)] == [8, 8, 8]  # no types: every layer
    ch = specs(n_layer=4, layer_types='CCCF', attention_chunk_size=16, nope_layers='F')
    assert [(s.attention_chunk_size, s.pos_options) for s in ch] == [(16, {})] * 3 + [(None, None)]
    g = specs(n_layer=6, layer_types='SSSSSF', sliding_window=4, pos_options={'base': 1e4},
              layer_options={'F': {'base': 1e6}})
    assert [s.pos_options['base'] for s in g] == [1e4] * 5 + [1e6]
    sc = specs(n_layer=4, layer_types='SF', attn_scaling={'type': 'logn', 'layers': 'F'})
    assert [s.attn_scaling is not None for s in sc] == [False, True, False, True]


def test_legacy_keys_mean_what_they_meant():
    p = specs(n_layer=4, nope_layers=2, layer_options={2: {'base': 1e6}}, attn_scaling={'type': 'llama4'})
    assert [s.pos_options for s in p] == [{}, None, {'base': 1e6}, None]
    assert [s.attn_scaling is not None for s in p] == [False, True, False, True]  # llama4: the NoPE layers
    assert [(s.sliding_window, s.attention_chunk_size, s.qk_norm, s.sink_logits) for s in p] == \
        [(None, None, None, False)] * 4


@pytest.mark.parametrize('kw, match', [
    (dict(sliding_window=0), 'sliding_window must be a whole number of tokens >= 1'),
    (dict(attention_chunk_size=-4), 'attention_chunk_size must be a whole number of tokens >= 1'),
    (dict(sliding_window=2.5), 'sliding_window must be a whole number'),
    (dict(layer_types=['S', 'F', 'S']), 'layer_types names 3 layers, but n_layer=2'),
    (dict(sliding_window={2: 8}), 'names layer 2, but the model has n_layer=2 layers'),
    (dict(sliding_window={'S': 8}), "names layer type 'S', but layer_types is not set"),
    (dict(layer_types='SF', sliding_window={'X': 8}), "layer type 'X', which is not in layer_types"),
    (dict(layer_types='FF', sliding_window=8), "applies to the layers of type 'S' or 'sliding_attention'"),
    (dict(qk_norm='l2'), "qk_norm must be True or 'weight'"),
    (dict(sink_logits='yes'), 'sink_logits must be True or False'),
    (dict(attn_scaling={'type': 'drope'}), "needs 'c'"),
])
def test_bad_plans_say_what_to_do(kw, match):
    with pytest.raises(ValueError, match=match):
        tiny_model('rope', **kw)


@pytest.mark.parametrize('scheme, kw, match', [
    ('stick_breaking', dict(sink_logits=True), 'stick_breaking has no softmax on layer 0'),
    ('rope', dict(sink_logits=True, rope_scaling={'type': 'rerope', 'window': 4}), 'computes its softmax itself'),
])
def test_sink_logits_refused_where_the_softmax_is_not_attends(scheme, kw, match):
    with pytest.raises(ValueError, match=match):
        tiny_model(scheme, **kw)
    tiny_model(scheme, **{**kw, 'sink_logits': False})  # the same model without sinks builds


@pytest.mark.parametrize('kw', [dict(sliding_window=8), dict(attention_chunk_size=8)])
def test_rolling_cache_refused_with_a_window_or_chunk(kw):
    m = tiny_model('rope', **kw).eval()
    with pytest.raises(ValueError, match='StreamingLLM .* cannot tell apart'):
        m.generate(torch.zeros(1, 2, dtype=torch.long), 4, recent=8, sink_tokens=2)


def test_windowed_generation_with_cache_equals_without_far_past_block_size():
    m = tiny_model('rope', sliding_window=8).eval()
    outs = []
    for use_cache in (True, False):
        torch.manual_seed(0)
        with torch.no_grad():
            outs.append(m.generate(torch.zeros(1, 3, dtype=torch.long), 80, use_cache=use_cache))
    assert outs[0].shape == (1, 83) and torch.equal(outs[0], outs[1])


# --- DroPE's scaling ----------------------------------------------------------------

def test_drope_scaling_is_one_plus_c_log_s():
    m = tiny_model('none', attn_scaling={'type': 'drope', 'c': 0.3})
    attn = m.transformer.h[0].attn
    s = A.logit_scale(attn.scaling, None, torch.arange(64), 64, attn.mask)[0]
    want = [1 + 0.3 * math.log(max(1.0, (i + 1) / 16)) for i in range(64)]  # L = block_size 16
    assert s.tolist() == pytest.approx(want, rel=1e-6)
    assert (s[:16] == 1).all()


# --- fine-tuning into another scheme or plan ----------------------------------------

def test_added_sink_logits_start_where_the_outputs_do_not_change():
    old = tiny_model('rope', seed=1).eval()
    new = tiny_model('rope', seed=2, sink_logits=True).eval()
    kept, dropped, fresh = checkpoint.load_shared(new, old.state_dict(), 'old.pt')
    assert sorted(fresh) == ['transformer.h.0.attn.sink_logits', 'transformer.h.1.attn.sink_logits'] and not dropped
    assert all((b.attn.sink_logits == A.SINK_FRESH).all() for b in new.transformer.h)
    x = torch.randint(0, 37, (2, 16))
    with torch.no_grad():
        assert torch.allclose(new(x)[0], old(x)[0], atol=1e-5)


def test_scheme_change_keeps_shared_weights_drops_and_starts_fresh_the_rest():
    old = tiny_model('t5', seed=1)
    new = tiny_model('kerple_log', seed=2, qk_norm=True)
    fresh_before = {k: v.clone() for k, v in new.state_dict().items()}
    kept, dropped, fresh = checkpoint.load_shared(new, old.state_dict(), 'old.pt')
    assert dropped == ['pe.table']
    assert sorted(fresh) == sorted(f'transformer.h.{i}.attn.{n}' for i in (0, 1)
                                   for n in ('pe_layer.p', 'pe_layer.a', 'q_norm.weight', 'k_norm.weight'))
    sd = new.state_dict()
    for k in kept:
        assert torch.equal(sd[k], old.state_dict()[k])
    for k in fresh:
        assert torch.equal(sd[k], fresh_before[k])
    assert checkpoint.name_groups(fresh)[0].startswith('transformer.h.{0,1}.attn.')


def test_a_shape_weight_that_differs_is_refused():
    with pytest.raises(SystemExit, match="weight 'transformer.wte.weight' differs"):
        checkpoint.load_shared(tiny_model('rope', vocab_size=40), tiny_model('rope').state_dict(), 'old.pt')


@pytest.mark.e2e
def test_finetune_with_another_scheme_prints_the_report(tmp_path, char_data):
    common = ['--n_layer=2', '--n_head=2', '--n_embd=16', '--block_size=16', '--batch_size=4', '--wandb_log=False',
              '--compile=False', '--final_eval=False', '--eval_interval=2', '--eval_tokens=64',
              f'--data_dir={char_data}']
    r = fork_run(['train.py', '--pos_encoding=t5', '--max_iters=2', f'--out_dir={tmp_path}/a'] + common)
    assert r.returncode == 0, r.stderr[-2000:]
    r = fork_run(['train.py', '--pos_encoding=alibi', '--sink_logits=True', '--max_iters=2',
                  f'--init_from={tmp_path}/a/ckpt.pt', f'--out_dir={tmp_path}/b'] + common)
    assert r.returncode == 0, r.stderr[-2000:]
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith('fine-tune weights'))
    assert 'dropped pe.table' in line and 'started fresh transformer.h.{0,1}.attn.sink_logits' in line
    assert "pos_encoding 't5' -> 'alibi'" in r.stdout and "layer 1: alibi, sink_logits" in r.stdout


# --- presets ------------------------------------------------------------------------

PRESETS = {  # written out from the models' own configs, scaled as each config file says
    'rnope_swa': dict(types='SSSF', window=[64, 64, 64, None], chunk=[None] * 4, nope=[3], qk=[None] * 4,
                      sink_logits=[False] * 4),
    'irope': dict(types='CCCF', window=[None] * 4, chunk=[4, 4, 4, None], nope=[3],
                  qk=['weightless'] * 3 + [None], sink_logits=[False] * 4),
    'gemma3': dict(types='SSSSSF', window=[4] * 5 + [None], chunk=[None] * 6, nope=[],
                   qk=['weight'] * 6, sink_logits=[False] * 6),
    'gpt_oss': dict(types='SFSF', window=[4, None, 4, None], chunk=[None] * 4, nope=[], qk=[None] * 4,
                    sink_logits=[True] * 4),
    'sssl': dict(types='SSSL', window=[33, 33, 33, 129], chunk=[None] * 4, nope=[], qk=['weightless'] * 4,
                 sink_logits=[False] * 4),
}


PLAN_KEYS = ('pos_options', 'rope_scaling') + layers.PLAN_KEYS


@pytest.mark.parametrize('name', list(PRESETS))
def test_each_preset_plan_is_what_its_config_says(name):
    """The preset at train.py's default size (4 layers unless it says otherwise, L = 128), built from its
    config file, has the plan written out above layer by layer."""
    from configurator import read_config_file
    cfg = read_config_file(os.path.join(ROOT, 'config', f'{name}.py'))
    m = GPT(tiny_config(cfg.get('pos_encoding', 'rope'), n_layer=cfg.get('n_layer', 4), block_size=128,
                        **{k: v for k, v in cfg.items() if k in PLAN_KEYS}))
    want = PRESETS[name]
    assert ''.join(s.type for s in m.plan) == want['types']
    assert [s.sliding_window for s in m.plan] == want['window']
    assert [s.attention_chunk_size for s in m.plan] == want['chunk']
    assert [s.index for s in m.plan if s.pos_options is None] == want['nope']
    assert [s.qk_norm for s in m.plan] == want['qk']
    assert [s.sink_logits for s in m.plan] == want['sink_logits']
    if name == 'gemma3':
        assert [m.pe.at(i).base for i in range(6)] == [1e4] * 5 + [1e6]
    if name == 'irope':
        assert [s.attn_scaling is not None for s in m.plan] == [False] * 3 + [True]


# --- one declaration of the per-layer keys -----------------------------------------------------

def test_every_plan_key_has_one_default_in_the_config_train_py_and_the_fine_tune_rules():
    """layers.PlanKeys is the one declaration: GPTConfig has each key with its default, train.py's resolved
    config (--dry_run) has it with the same default, and a fine-tune may change each (checkpoint.PLAN_KEYS)."""
    out = subprocess.run([sys.executable, 'train.py', '--dry_run=True'], cwd=ROOT, capture_output=True, text=True)
    train = json.loads(out.stdout)
    defaults = vars(layers.PlanKeys())
    assert set(layers.PLAN_KEYS) == set(defaults) and len(layers.PLAN_KEYS) == 10
    for key, default in defaults.items():
        assert GPTConfig.__dataclass_fields__[key].default == default, key
        assert train[key] == default, key
        assert key in checkpoint.PLAN_KEYS, key


def test_plan_weights_are_the_weights_the_plan_adds():
    """model.changeable names exactly the attention weights that sink_logits, SSMax and QK-norm add."""
    plain = set(tiny_model('rope').state_dict())
    full = set(tiny_model('rope', sink_logits=True, qk_norm=True, attn_scaling={'type': 'ssmax'}).state_dict())
    added = full - plain
    assert len(added) == 2 * 4 and all(changeable(k) for k in added)
    assert not any(changeable(k) for k in plain if '.pe' not in k)


# --- the cache mode for schemes that keep their own keys (cache_keys='scheme') --------

@pytest.fixture
def own_cache_scheme():
    """A scheme that appends its keys to the cache itself (cache_keys='scheme') and attends plainly."""
    class OwnCache(positional.PositionalEncoding):
        cache_keys = 'scheme'

        def attention(self, q, k, v, x, ctx, layer, cache, attend):
            if cache is not None:
                k, v = cache.append(k, v)
            return attend(q, k, v)
    positional.register('own_cache_test')(OwnCache)
    yield 'own_cache_test'
    del positional.REGISTRY['own_cache_test']


def test_scheme_cache_mode_leaves_the_cache_to_the_scheme(own_cache_scheme):
    m = tiny_model(own_cache_scheme).eval()
    ref = tiny_model('none').eval()
    ref.load_state_dict(m.state_dict())
    x = torch.randint(0, 37, (2, 20))
    with torch.no_grad():
        cache = m.new_cache()
        steps = [m(x[:, :6], cache=cache)[0]] + [m(x[:, t:t + 1], cache=cache)[0] for t in range(6, 20)]
        assert all(layer.n == 20 for layer in cache.layers)  # appended once, by the scheme
        assert torch.allclose(torch.cat(steps, 1), ref(x)[0], atol=1e-5)
    with pytest.raises(ValueError, match='keeps its own cache'):
        m.new_cache(recent=8)


@pytest.mark.parametrize('scheme, ordinary, rolling', [('rope', 'transformed', 'raw'), ('xpos', 'raw', 'raw'),
                                                       ('path', 'scheme', None)])
def test_the_cache_owns_each_layers_key_mode(scheme, ordinary, rolling):
    """A layer's cache mode is its scheme's ask, except that a rolling cache re-indexes keys every forward
    (raw) and refuses a scheme that keeps its own keys; NoPE layers keep transformed keys."""
    m = tiny_model(scheme, n_layer=3, **({} if scheme == 'path' else dict(nope_layers=[1])))
    modes = [layer.mode for layer in m.new_cache().layers]
    assert modes == [ordinary] * 3 if scheme == 'path' else modes == [ordinary, 'transformed', ordinary]
    if rolling is None:
        with pytest.raises(ValueError, match='keeps its own cache'):
            m.new_cache(recent=8)
    else:
        assert [layer.mode for layer in m.new_cache(recent=8).layers] == [rolling, 'raw', rolling]


@pytest.mark.parametrize('mask', [dict(), dict(window=4), dict(chunk=5)])
@pytest.mark.parametrize('path', ['dense', 'flex', 'sinks'])
def test_attend_logits_is_the_softmax_of_given_logits(mask, path):
    """Attender.logits(A, v), for a scheme that computes its logits whole, is softmax over the visible keys of
    A (plus a sink logit per head) times v, per pair in float64."""
    q, k, v = qkv(2, 3, 11, 11, 8, seed=3)
    logits = (q @ k.transpose(-2, -1)) / math.sqrt(8) + torch.randn(2, 3, 11, 11)
    sink_logits = torch.randn(3) if path == 'sinks' else None
    att = A.Attender(A.Mask(**mask), 'flex' if path == 'flex' else 'dense', sink_logits=sink_logits)
    with torch.no_grad():
        y = att.logits(logits, v)
    zero = torch.zeros_like(q)
    ref = reference_attend(zero, zero, v, window=mask.get('window'), chunk=mask.get('chunk'),
                           bias=lambda b, h, i, j: logits[b, h, i, j], sink_logits=sink_logits)
    assert torch.allclose(y.double(), ref, atol=1e-5)


def test_rewrite_changes_cached_keys_in_place_only_without_gradients():
    from kvcache import LayerKV
    kv = LayerKV()
    k = torch.randn(1, 2, 5, 4)
    kv.append(k, k)
    with torch.no_grad():
        buf = kv.k
        kv.rewrite(lambda keys: keys * 2)
        assert kv.k is buf and torch.equal(kv[0], 2 * k)  # in place: no copy per token when decoding
    saved = kv[0]
    kv.rewrite(lambda keys: keys + 1)  # with gradients: a new tensor, the old one (maybe saved) untouched
    assert torch.equal(saved, 2 * k) and torch.equal(kv[0], 2 * k + 1)


def test_windowed_sinks_flex_backward_graph_validates_and_equals_dense(flex_with_grad_on_cpu, monkeypatch):
    """A windowed, chunked layer with sink logits on FlexAttention with gradients, as on CUDA: Inductor's
    joint-graph check (what the CUDA lowering runs first) accepts it, and FlexAttention's loss and
    gradients (the sinks' included, through flex's logsumexp) equal the dense path's."""
    from conftest import Validated, assert_same_grads, flex_and_dense_grads, validating_backend
    x = torch.randint(0, 37, (2, 64), generator=torch.Generator().manual_seed(0))
    kw = dict(block_size=64, sliding_window=24, attention_chunk_size={1: 40}, sink_logits=True)
    counts = []
    m = tiny_model('alibi', attn_backend='flex', **kw)
    with pytest.raises(Validated):
        _, loss = torch.compile(m, backend=validating_backend(counts))(x, x)
        loss.backward()
    assert len(counts) == 2
    monkeypatch.setitem(A._compiled, 'flex', fa.flex_attention)
    out = flex_and_dense_grads(lambda be: tiny_model('alibi', attn_backend=be, **kw), x)
    assert_same_grads(out)
    assert out['flex'][1]['transformer.h.0.attn.sink_logits'].abs().sum() > 0


def test_a_checkpoint_with_ssmax_or_sink_logits_under_their_older_names_loads(tmp_path):
    """SSMax's scales were saved as attn.pe_layer.ssmax before attention scaling moved to the attention, and sink
    logits as attn.sinks."""
    import dataclasses
    m = tiny_model('rope', attn_scaling={'type': 'ssmax'}, sink_logits=True)
    with torch.no_grad():
        m.transformer.h[1].attn.ssmax.copy_(torch.tensor([0.1, 0.2, 0.3, 0.4]))
        m.transformer.h[0].attn.sink_logits.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    old = {k.replace('attn.ssmax', 'attn.pe_layer.ssmax').replace('attn.sink_logits', 'attn.sinks'): v
           for k, v in m.state_dict().items()}
    assert 'transformer.h.1.attn.pe_layer.ssmax' in old and 'transformer.h.0.attn.sinks' in old
    args = {f.name: getattr(m.config, f.name) for f in dataclasses.fields(m.config)}
    torch.save({'model': old, 'model_args': args}, tmp_path / 'ckpt.pt')
    loaded, _ = checkpoint.load_model(str(tmp_path / 'ckpt.pt'))
    assert torch.equal(loaded.transformer.h[1].attn.ssmax, torch.tensor([0.1, 0.2, 0.3, 0.4]))
    assert torch.equal(loaded.transformer.h[0].attn.sink_logits, torch.tensor([1.0, 2.0, 3.0, 4.0]))
