"""DAPE and DAPE v2 against their authors' arithmetic (github.com/chuanyang-Zheng/DAPE at bde344a: DAPE.py's *_DAPE
classes, megatron/model/positional_embeddings.py's *_C and *_DAPEV2 classes, the attention in
megatron/model/transformer.py), written here from that code in float64 and sharing no code with positional.py: the
attention output and every gradient within 1e-12, over a KV cache, in query chunks, in a window; the edge where the
authors' convolution pads; the memory of evaluation's chunks; options, defaults and docs. The registry-wide
properties (causality, KV cache, windows, sinks, FlexAttention, compile, routes) cover both by name elsewhere."""
import math
import os
import re

import pytest
import torch
import torch.nn.functional as F

import attention as A
import model as M
import positional as P
from conftest import ROOT, tiny_config, tiny_model

KINDS = ['alibi', 'kerple', 'fire', 'none']
REL = 1e-12  # float64: every output and gradient within this of the reference, relative to its largest entry


def authors_slopes(n):
    """ALiBi's slopes as the authors' _get_slopes writes them for a power of two n."""
    start = 2 ** (-(2 ** -(math.log2(n) - 3)))
    return torch.tensor([start * start ** i for i in range(n)], dtype=torch.float64)


def authors_scores(x, layer, kind, kernel, seen=None):
    """The authors' module on the scaled scores x [B, H, T, T] (every key, the future's too, as their attention hands
    them over), in their layout: the bias from the tril'd distance matrix; DAPE: x + bias + mlp2(cat(x, bias)) over
    the heads of each pair; DAPE v2: x + bias + mlp2(tril(cat(x, bias))) with mlp2 two 1 x k Conv2d zero-padded by
    k // 2. seen [T, T]: the keys each query sees, for tril (a window hides more keys; the authors have none)."""
    B, H, T, _ = x.shape
    diff = torch.tril(torch.arange(T).view(T, 1).repeat(1, T) + torch.arange(0, -T, -1)).double()
    if kind == 'alibi':
        bias = -diff * authors_slopes(H).view(H, 1, 1)
    elif kind == 'kerple':
        bias = -layer.p.view(H, 1, 1) * torch.log(1 + layer.a.view(H, 1, 1) * diff)
    elif kind == 'fire':
        threshold = torch.abs(layer.L_mult * layer.init_L)
        normalizer = torch.max(torch.max(torch.tril(diff), dim=-1)[0], threshold)[:, None]
        nd = torch.log(torch.abs(layer.c * diff) + 1) / (torch.log(torch.abs(layer.c * normalizer) + 1) + 1e-6)
        fire = F.linear(F.leaky_relu(F.linear(nd.unsqueeze(-1), layer.fc1.weight, layer.fc1.bias)),
                        layer.fc2.weight, layer.fc2.bias)  # (T, T, H)
        bias = fire.unsqueeze(0).permute(0, 3, 1, 2)
    else:
        bias = torch.zeros(())
    feat = x if kind == 'none' else torch.cat((x, torch.tile(bias, (B, 1, 1, 1))), dim=1)
    if kernel == 1:
        w1, w2 = layer.mix1.weight, layer.mix2.weight
        f = F.linear(F.leaky_relu(F.linear(feat.permute(0, 2, 3, 1), w1, layer.mix1.bias)), w2, layer.mix2.bias)
        f = f.permute(0, 3, 1, 2)
    else:
        tril = feat.masked_fill(~seen, 0.0) if seen is not None else torch.tril(feat)
        pad = (0, kernel // 2)
        f = F.conv2d(F.leaky_relu(F.conv2d(tril, layer.mix1.weight, layer.mix1.bias, padding=pad)),
                     layer.mix2.weight, layer.mix2.bias, padding=pad)
    return x + bias + f


def authors_attention(q, k, v, layer, kind, kernel, seen=None):
    """Their attention on T queries over T keys: scores q k^T / sqrt(d), the module, masked with -10000 (their
    attention_mask_func), softmax, values."""
    T = q.size(2)
    seen = torch.ones(T, T, dtype=torch.bool).tril() if seen is None else seen
    x = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
    return authors_scores(x, layer, kind, kernel, seen if kernel > 1 else None).masked_fill(~seen, -10000.0) \
        .softmax(-1) @ v


def drawn(name, kind, **opts):
    """The scheme and one layer of it in float64, its parameters drawn away from their init so that every part of
    the formula matters: LeakyReLU's negative side, KERPLE's p and a above the clamp, FIRE's threshold (7) amid
    the queries' positions and a c of 0.7."""
    pe = P.REGISTRY[name](tiny_config(name), bias=kind, width=5, init_L=5.0, **opts)
    torch.manual_seed(0)
    layer = pe.new_layer().double()
    with torch.no_grad():
        for n, p in layer.named_parameters():
            p.copy_(torch.rand_like(p) * 2 + 0.05 if n in ('p', 'a') else torch.randn_like(p))
        if kind == 'fire':
            layer.c.fill_(0.7)
            layer.L_mult.fill_(1.4)
    return pe, layer


def ours(pe, layer, q, k, v, q_pos, k_pos, att=None):
    ctx = pe.context(q_pos, k_pos)
    return pe.attention(q, k, v, None, ctx, layer, None, att or A.Attender())


def qkv(T, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(2, 4, T, 8, generator=g, dtype=torch.float64) * s).requires_grad_() for s in (2.0, 1.0, 1.0)]


def rel_err(got, want):
    return ((got - want).abs().max() / want.abs().max()).item()


CASES = [(n, kind, {}) for n in ('dape', 'dape_v2') for kind in KINDS] + [('dape_v2', 'kerple', {'kernel': 5}),
                                                                          ('dape_v2', 'fire', {'kernel': 1})]
IDS = [f"{n}-{kind}" + ''.join(f"-{a}={b}" for a, b in o.items()) for n, kind, o in CASES]


@pytest.mark.parametrize('q0', [0, 5])  # 5: the last queries over a KV cache
@pytest.mark.parametrize('name, kind, opts', CASES, ids=IDS)
def test_output_and_every_gradient_equal_the_authors_code_in_float64(name, kind, opts, q0):
    """The layer's attention output, and the gradients of a weighted sum of it for q, k, v and every parameter of
    the layer, equal the authors' arithmetic within 1e-12 (relative to the largest entry; the output layer's bias,
    which softmax cancels, has a zero gradient in both). DAPE v2's reference runs over p = kernel // 2 tokens more,
    whose keys its first T rows see as the future (the edge: next test)."""
    pe, layer = drawn(name, kind, **opts)
    T, p = 11, pe.kernel // 2
    q, k, v = qkv(T + p)
    w = torch.randn(2, 4, T - q0, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    params = list(layer.parameters())
    want = authors_attention(q, k, v, layer, kind, pe.kernel)[:, :, q0:T]
    want_grads = torch.autograd.grad((want * w).sum(), [q, k, v] + params)
    got = ours(pe, layer, q[:, :, q0:T], k[:, :, :T], v[:, :, :T], torch.arange(q0, T), torch.arange(T))
    got_grads = torch.autograd.grad((got * w).sum(), [q, k, v] + params, allow_unused=True)
    assert got.dtype == torch.float64 and rel_err(got, want) <= REL
    names = ['q', 'k', 'v'] + [n for n, _ in layer.named_parameters()]
    assert len(names) == len(got_grads) == {'alibi': 7, 'none': 7, 'kerple': 9, 'fire': 13}[kind]
    scale = max(g.abs().max() for g in want_grads)
    for n, g, gw in zip(names, got_grads, want_grads):
        assert g is not None, n
        if n == 'mix2.bias':  # a head's constant on every logit of its rows, which softmax cancels: a zero gradient
            assert g.abs().max() <= REL * scale and gw.abs().max() <= REL * scale
        else:
            assert rel_err(g, gw) <= REL, (n, rel_err(g, gw))


@pytest.mark.parametrize('kernel', [3, 5])
def test_dape_v2_differs_from_the_authors_forward_only_in_its_last_kernel_half_rows(kernel):
    """The authors' second convolution zero-pads past the forward's last key, which its last p = kernel // 2 rows
    read: over the same T tokens the two agree in rows 0..T-p-1 and differ in the last p (ours are their rows with
    text after them, previous test); DAPE's MLP (per pair) agrees in every row."""
    T = 10
    q, k, v = (t.detach() for t in qkv(T, seed=2))
    for name, p in (('dape_v2', kernel // 2), ('dape', 0)):
        pe, layer = drawn(name, 'alibi', **({'kernel': kernel} if name == 'dape_v2' else {}))
        with torch.no_grad():
            got = ours(pe, layer, q, k, v, torch.arange(T), torch.arange(T))
            want = authors_attention(q, k, v, layer, 'alibi', pe.kernel)
        assert rel_err(got[:, :, :T - p], want[:, :, :T - p]) <= REL
        last = (got[:, :, T - p:] - want[:, :, T - p:]).abs().amax((0, 1, 3))
        assert (last > 1e-6).all(), (name, last)


@pytest.mark.parametrize('name, opts', [('dape', {}), ('dape_v2', {}), ('dape_v2', {'kernel': 5})])
@pytest.mark.parametrize('mask', [A.Mask(), A.Mask(window=4), A.Mask(chunk=5), A.Mask(window=3, chunk=6)])
def test_query_chunks_and_windows_equal_the_authors_code(name, opts, mask, monkeypatch):
    """Without gradients in query chunks of a few rows (attention.DENSE_CHUNK_BYTES made tiny: att.rows's chunks
    start at their first visible key, and each chunk's rows go a few at a time), and with gradients whole, the
    output equals the authors' with the window's or chunk's hidden keys entering as the future's (their tril), also
    over a KV cache whose window dropped the keys before the first that token 10 sees (the convolution's hidden units
    left of key 0 then come from zeros, not the padding before the text)."""
    pe, layer = drawn(name, 'fire', **opts)
    T, p = 16, pe.kernel // 2
    q, k, v = (t.detach() for t in qkv(T + p, seed=3))
    i, j = torch.arange(T + p)[:, None], torch.arange(T + p)[None, :]
    want = authors_attention(q, k, v, layer, 'fire', pe.kernel, mask.visible(i, j, T + p, T + p))[:, :, :T]
    pos = torch.arange(T)
    whole = ours(pe, layer, q[:, :, :T], k[:, :, :T], v[:, :, :T], pos, pos, A.Attender(mask))
    monkeypatch.setattr(A, 'DENSE_CHUNK_BYTES', 2 * 4 * 3 * T * 8)  # 3 rows of [B, H, rows, T] float64
    with torch.no_grad():
        chunked = ours(pe, layer, q[:, :, :T], k[:, :, :T], v[:, :, :T], pos, pos, A.Attender(mask))
        if mask.bounded:  # queries 10..15 over the keys a windowed cache keeps: from token 10's first visible one
            k0 = mask.lowest(10)
            cached = ours(pe, layer, q[:, :, 10:T], k[:, :, k0:T], v[:, :, k0:T], pos[10:], pos[k0:],
                          A.Attender(mask.at(k0)))
            assert k0 > 0 and rel_err(cached, want[:, :, 10:]) <= REL
    assert rel_err(whole.detach(), want) <= REL and rel_err(chunked, want) <= REL


def test_evaluation_chunks_keep_the_hidden_units_within_a_dense_chunk(monkeypatch):
    """Without gradients every tensor f's layers make ([B, rows, Tk + 2p, width] hidden units, the largest) stays
    within attention.dense_chunk_bytes, at 8x and 16x the training length: O(T) memory beyond q, k, v."""
    sizes = []
    real = F.linear

    def spy(*args, **kw):
        out = real(*args, **kw)
        sizes.append(out.numel() * out.element_size())
        return out
    monkeypatch.setattr(P.F, 'linear', spy)
    for name in ('dape', 'dape_v2'):
        m = tiny_model(name, pos_options={'bias': 'fire'}).eval()
        for T in (8 * 16, 16 * 16):
            monkeypatch.setattr(A, 'DENSE_CHUNK_BYTES', 4 * 32 * T * 8)  # 8 rows of [B=1, rows, T, width] float32
            sizes.clear()
            with torch.no_grad():
                m(torch.randint(0, 37, (1, T)))
            # each under the budget, which is 1/16 or less of the whole hidden units [1, 32, T, T]
            assert sizes and max(sizes) <= A.DENSE_CHUNK_BYTES <= 32 * T * T * 4 / 16, (name, T, max(sizes))


def test_defaults_shapes_and_init_as_the_authors():
    """bias 'kerple', width 32, kernel 3; DAPE's MLP as nn.Linear(2H, 32), nn.Linear(32, H), v2's as
    nn.Conv2d(2H, 32, (1, 3)), nn.Conv2d(32, H, (1, 3)), PyTorch's default init (U(+-1/sqrt(fan_in))); KERPLE's
    p in (0, 2), a in (0, 1); FIRE's MLP 1 -> 32 -> H with c = 0.1, L = |1 x 512|; bias 'none' takes H maps."""
    torch.manual_seed(0)
    one, two = P.REGISTRY['dape'](tiny_config('dape')), P.REGISTRY['dape_v2'](tiny_config('dape_v2'))
    assert (one.bias, one.width, one.kernel, two.bias, two.width, two.kernel) == ('kerple', 32, 1, 'kerple', 32, 3)
    a, b = one.new_layer(), two.new_layer()
    assert isinstance(a.mix1, torch.nn.Linear) and a.mix1.weight.shape == (32, 8) and a.mix2.weight.shape == (4, 32)
    assert isinstance(b.mix1, torch.nn.Conv2d) and b.mix1.weight.shape == (32, 8, 1, 3)
    assert b.mix2.weight.shape == (4, 32, 1, 3) and b.mix1.padding == (0, 0)  # padded by the scheme, not the module
    for m, fan_in in ((a.mix1, 8), (a.mix2, 32), (b.mix1, 24), (b.mix2, 96)):
        bound = 1 / math.sqrt(fan_in)
        assert m.weight.abs().max() <= bound and m.weight.abs().max() > 0.8 * bound
    assert 0 < a.p.min() and a.p.max() < 2 and 0 < a.a.min() and a.a.max() < 1
    fire = P.REGISTRY['dape'](tiny_config('dape'), bias='fire').new_layer()
    assert fire.fc1.weight.shape == (32, 1) and fire.fc2.weight.shape == (4, 32)
    assert (fire.c.item(), fire.L_mult.item(), fire.init_L.item()) == (pytest.approx(0.1), 1.0, 512.0)
    assert P.REGISTRY['dape_v2'](tiny_config('dape_v2'), bias='none').new_layer().mix1.weight.shape == (32, 4, 1, 3)
    assert not [n for n, _ in tiny_model('dape').named_parameters() if n.startswith('pe.')]  # all per layer


def test_kerple_parameters_are_clamped_in_place_before_use():
    pe, layer = drawn('dape', 'kerple')
    with torch.no_grad():
        layer.p[0], layer.a[1] = -1.0, 0.0
    q, k, v = (t.detach() for t in qkv(6))
    with torch.no_grad():
        ours(pe, layer, q, k, v, torch.arange(6), torch.arange(6))
    assert layer.p[0].item() == 1e-2 and layer.a[1].item() == 1e-2


@pytest.mark.parametrize('name, opts, msg', [
    ('dape', {'bias': 't5'}, "dape bias must be one of 'alibi', 'kerple', 'fire', 'none', got 't5'"),
    ('dape', {'width': 0}, 'dape width must be an integer >= 1 (hidden units of the MLP over the heads), got 0'),
    ('dape_v2', {'kernel': 4}, "dape_v2 kernel must be an odd integer >= 1 (the convolutions' width over keys"),
    ('dape_v2', {'kernel': 2.5}, "dape_v2 kernel must be an integer >= 1"),
    ('dape', {'init_L': 0}, "dape init_L must be a number > 0 (FIRE's threshold L0), got 0"),
    ('dape_v2', {'kernal': 3}, 'bad pos_options'),
])
def test_bad_options_are_one_line_that_names_the_fix(name, opts, msg):
    with pytest.raises(ValueError, match='^' + re.escape(msg)) as e:
        M.GPT(tiny_config(name, pos_options=opts))
    assert '\n' not in str(e.value)


@pytest.mark.parametrize('name, arxiv, files', [
    ('dape', '2405.14722', ['DAPE.py', 'AliBi_DAPE', 'ParallelKerpleLog_DAPE', 'FIRE_DAPE', 'Nope_C']),
    ('dape_v2', '2410.04798', ['Alibi_DAPEV2', 'Kerple_DAPEV2', 'FIRE_DAPEV2', 'Nope_C_FFN'])])
def test_each_scheme_documents_its_source_and_has_a_config(name, arxiv, files):
    from configurator import read_config_file
    doc = P.REGISTRY[name].__doc__
    assert arxiv in doc and 'chuanyang-Zheng/DAPE at bde344a' in doc and 'Option' in doc and 'efault' in doc
    assert all(f in doc for f in files) and 'att.logits' in doc and 'att.rows' in doc
    cfg = read_config_file(os.path.join(ROOT, 'config', f'{name}.py'))
    assert cfg == {'pos_encoding': name, 'out_dir': f'out-{name}'}
