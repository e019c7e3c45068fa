"""TAPE (arXiv 2501.00712): a float64 model against the authors' arithmetic, written here from their code's own
formulas (VITA-Group/TAPE, models/llama/adape.py: AdaRotaryEmbedding, apply_rotary_pos_emb, PELlamaAttention,
PELayer, LlamaDecoderLayer) around nanoPE's blocks, forward and every gradient to 1e-12; the stream through a KV
cache, a windowed cache and a rolling one; equalities (TAPE at init is RoPE, the start's shift changes no logit);
options and the docstring. The registry-wide properties (causality, KV cache at init, windows, compile, bf16,
routes) cover it by name elsewhere."""
import math
import os

import pytest
import torch
import torch.nn.functional as F

import model as M
import positional as P
from conftest import ROOT, tiny_config, tiny_model

TOL = 1e-12


def rel(a, b):
    """The largest difference over the largest entry of the reference b."""
    return ((a - b).abs().max() / b.abs().max()).item()


def tape_model(seed=0, **kw):
    """A float64 tiny tape model whose stream updates are drawn afresh (at init W_mix = W_up = 0 and the stream never
    moves), with gates large enough that the MLP's update is of the stream's own size."""
    m = tiny_model('tape', seed=seed, **{'n_layer': 3, **kw}).double()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for blk in m.transformer.h:
            layer = blk.attn.pe_layer
            if layer is not None:
                for p, scale in ((layer.mix, 0.5), (layer.up, 0.5), (layer.down, 0.5), (layer.gate, 20.0)):
                    p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * scale)
    return m


def rotate_half(x):
    x1, x2 = x[..., :x.size(-1) // 2], x[..., x.size(-1) // 2:]
    return torch.cat((-x2, x1), -1)


def reference_logits(m, idx, shift=0, base=10000.0, nope=(), dead_seed=123):
    """The logits of m by the authors' arithmetic, float64. Their stream is a pair of [B, H, T, d] tensors (cos, sin)
    with equal halves: t = shift..shift + T - 1, emb = [t theta | t theta], theta = 1 / base^(2c/d), repeated over the
    heads. Per layer: q, k as q * cos + rotate_half(q) * sin; the weights w = softmax(q.k / sqrt(d)), y = w v and the
    stream's average (w cos, w sin); after the attention's residual add, stream = einsum('bqnd,qe->bqnd', average,
    W_post) + stream (post_attention_linear); after the MLP (its output o, before its residual add), stream =
    einsum('bend,qe->bqnd', silu(o W_x^T)^T[..., None] * einsum('bqnd,eq->bend', stream, W_up), W_down) + stream
    (PELayer: x_proj, up_proj, down_proj). nanoPE's blocks around it: LayerNorm, GELU MLP, tied head. The model's
    last tape layer has no update weights (its stream feeds nothing): the code's update runs there on random ones
    (drawn from dead_seed).
    Layers in `nope` turn nothing and leave the stream alone."""
    B, T = idx.shape
    H, C = m.config.n_head, m.config.n_embd
    d = C // H
    theta = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    freqs = torch.outer(torch.arange(shift, T + shift, dtype=torch.float64), theta)
    emb = torch.cat((freqs, freqs), -1)
    stream = tuple(f(emb)[None, None].repeat(1, H, 1, 1).expand(B, -1, -1, -1) for f in (torch.cos, torch.sin))
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    dead = torch.Generator().manual_seed(dead_seed)
    x = m.transformer.wte.weight[idx]
    for i, blk in enumerate(m.transformer.h):
        a, mlp, pe = blk.attn, blk.mlp, blk.attn.pe_layer
        if pe is not None:
            W_post, W_x, W_up, W_down = pe.mix, pe.gate, pe.up, pe.down
        else:
            W_post, W_up = (torch.randn(s, generator=dead, dtype=torch.float64) for s in ((H, H), (48, H)))
            W_x, W_down = (torch.randn(s, generator=dead, dtype=torch.float64) for s in ((48, C), (H, 48)))
        h = F.layer_norm(x, (C,), blk.ln_1.weight)
        q, k, v = (t.view(B, T, H, d).transpose(1, 2) for t in (h @ a.c_attn.weight.t()).split(C, -1))
        if i not in nope:
            q, k = (t * stream[0] + rotate_half(t) * stream[1] for t in (q, k))
        w = (q @ k.transpose(-1, -2) / math.sqrt(d)).masked_fill(~causal, float('-inf')).softmax(-1)
        x = x + (w @ v).transpose(1, 2).reshape(B, T, C) @ a.c_proj.weight.t()
        if i not in nope:
            stream = tuple(torch.einsum('bqnd,qe->bqnd', w @ s, W_post) + s for s in stream)
        o = F.gelu(F.layer_norm(x, (C,), blk.ln_2.weight) @ mlp.c_fc.weight.t()) @ mlp.c_proj.weight.t()
        if i not in nope:
            gate = F.silu(o @ W_x.t()).transpose(1, 2).unsqueeze(-1)
            stream = tuple(torch.einsum('bend,qe->bqnd', gate * torch.einsum('bqnd,eq->bend', s, W_up), W_down) + s
                           for s in stream)
        x = x + o
    return F.layer_norm(x, (C,), m.transformer.ln_f.weight) @ m.transformer.wte.weight.t()


def grads(loss, m):
    names, params = zip(*m.named_parameters())
    return dict(zip(names, torch.autograd.grad(loss, params, allow_unused=True)))


def assert_equals_reference(m, x, **ref):
    """Logits and the gradient of every parameter of a loss on them against the reference's, each to TOL (the loss
    in float64 here: GPT.forward's own takes float32 logits)."""
    logits, _ = m(x)
    want = reference_logits(m, x, **ref)
    loss, ref_loss = (F.cross_entropy(t.reshape(-1, t.size(-1)), x.reshape(-1)) for t in (logits, want))
    assert rel(logits, want) <= TOL
    got, exp = grads(loss, m), grads(ref_loss, m)
    for n in exp:
        assert (got[n] is None) == (exp[n] is None), n
        if exp[n] is not None:
            assert exp[n].abs().max() > 0, n
            assert rel(got[n], exp[n]) <= TOL, (n, rel(got[n], exp[n]))
    return logits


@pytest.mark.parametrize('kw, ref', [
    ({}, {}), ({'pos_options': {'shift': 5, 'base': 500.0}}, {'shift': 5, 'base': 500.0}),
    ({'nope_layers': [1]}, {'nope': (1,)}), ({'n_layer': 4}, {})])
def test_float64_model_equals_the_authors_arithmetic_forward_and_every_gradient(kw, ref):
    """Evaluation (no shift), a fixed shift with another base, a NoPE layer the stream passes, four layers: logits
    and every parameter's gradient (the stream's weights included) within 1e-12 of the code's arithmetic."""
    m = tape_model(**kw).eval()
    x = torch.randint(0, 37, (2, 13), generator=torch.Generator().manual_seed(0))
    assert_equals_reference(m, x, **ref)


def test_training_draws_a_shift_that_changes_no_logit():
    """In training the start's positions are shifted by a uniform draw from 0..2L (the code's AdaRotaryEmbedding): the
    stream is equivariant to turning every token's planes alike, so logits and gradients are the reference's
    without a shift, to 1e-12, for several draws; the draws differ (the shifted stream itself is not the same)."""
    m = tape_model().train()
    x = torch.randint(0, 37, (2, 13), generator=torch.Generator().manual_seed(1))
    shifts = []
    for seed in range(4):
        torch.manual_seed(seed)
        ctx = m.pe.at(0).context(torch.arange(13), torch.arange(13), 13)
        shifts.append(int(ctx.extra['tape_shift']))
        assert 0 <= shifts[-1] <= 2 * m.config.block_size
        torch.manual_seed(seed)
        assert_equals_reference(m, x)
    assert len(set(shifts)) > 1
    assert int(m.pe.at(0).eval().context(torch.arange(3), torch.arange(3), 3).extra['tape_shift']) == 0


def test_the_codes_last_layer_update_feeds_nothing_so_it_has_no_weights_here():
    """The reference's logits do not depend on its last layer's stream weights (random in reference_logits, two
    draws): nanoPE builds none there, and every other layer's weights get gradients."""
    m = tape_model()
    assert [blk.attn.pe_layer is None for blk in m.transformer.h] == [False, False, True]
    m2 = tiny_model('tape', n_layer=3, nope_layers=[2])
    assert [blk.attn.pe_layer is None for blk in m2.transformer.h] == [False, True, True]  # layer 1: the last tape
    x = torch.randint(0, 37, (1, 9))
    with torch.no_grad():
        assert torch.equal(reference_logits(m, x, dead_seed=1), reference_logits(m, x, dead_seed=2))


@pytest.mark.parametrize('kw', [{}, {'sliding_window': 5}])
def test_kv_cache_carries_the_stream_and_equals_the_full_forward_float64(kw):
    """A prompt, one token at a time, then a chunk through the KV cache equal one full forward to 1e-12 with the
    stream off init (every key's stream is per-key state), with every layer windowed or not; past 2x block_size."""
    m = tape_model(**kw).eval()
    x = torch.randint(0, 37, (2, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full, _ = m(x)
        cache = m.new_cache()
        outs = [m(x[:, :7], cache=cache)[0]] + [m(x[:, t:t + 1], cache=cache)[0] for t in range(7, 36)]
        outs.append(m(x[:, 36:], cache=cache)[0])
    assert rel(torch.cat(outs, 1), full) <= TOL
    if kw:
        assert all(layer.state['tape'].size(2) == layer.n <= 5 for layer in cache.layers[:2])


def test_rolling_cache_without_sinks_equals_a_sliding_window():
    """A rolling cache (sink 0, recent w) re-places its keys every step: each kept key's stream is turned by its move,
    so every step is the same computation shifted, which the stream's equivariance makes that of a model whose
    layers see the last w + 1 keys at their text positions (an ordinary windowed cache), to 1e-12 with the stream
    off init. A stream turned the wrong way, or not at all, differs."""
    w, T = 6, 30
    a, b = tape_model().eval(), tape_model(sliding_window=w + 1).eval()
    b.load_state_dict(a.state_dict())
    x = torch.randint(0, 37, (1, T), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ca, cb = a.new_cache(recent=w, sink_tokens=0), b.new_cache()
        got = [a(x[:, :4], cache=ca)[0]] + [a(x[:, t:t + 1], cache=ca)[0] for t in range(4, T)]
        want = [b(x[:, :4], cache=cb)[0]] + [b(x[:, t:t + 1], cache=cb)[0] for t in range(4, T)]
    assert ca.layers[0].n == w and ca.k_pos.numel() == w + 1
    assert rel(torch.cat(got, 1), torch.cat(want, 1)) <= TOL


def test_tape_at_init_is_rope():
    """At init W_mix = W_up = 0: the stream stays RoPE's cos and sin and TAPE's logits are rope's with the same
    weights (RoPE's angles are float32: to float32's precision)."""
    t = tiny_model('tape', n_layer=3).eval()
    r = tiny_model('rope', n_layer=3).eval()
    r.load_state_dict({k: v for k, v in t.state_dict().items() if 'pe_layer' not in k})
    x = torch.randint(0, 37, (2, 16))
    with torch.no_grad():
        assert torch.allclose(t(x)[0], r(x)[0], atol=1e-5)


def test_the_stream_passes_a_layer_of_another_scheme_unchanged():
    """PositionalEncoding.stream's default hands the stream on: a NoPE layer between two tape layers leaves it as it
    got it (the reference's `nope` above), and every scheme's block returns the stream it was given."""
    pe = P.REGISTRY['rope'](tiny_config('rope'))
    ctx = P.Context(torch.arange(3), torch.arange(3), {}, 3, stream=torch.ones(1))
    assert pe.stream(torch.zeros(1, 3, 32), ctx, None, None) is ctx.stream


@pytest.mark.parametrize('opts, msg', [
    ({'position_size': 0}, "tape position_size must be an integer >= 1 (the stream update's width P), got 0"),
    ({'shift': -1}, 'tape shift must be an integer >= 0, got -1'),
    ({'random_shift': 1}, 'tape random_shift must be True or False, got 1'),
    ({'base': 0}, 'tape base must be a number > 0, got 0'),
])
def test_bad_options_are_one_line_that_names_the_fix(opts, msg):
    with pytest.raises(ValueError, match='^' + msg.replace('(', r'\(').replace(')', r'\)')) as e:
        M.GPT(tiny_config('tape', pos_options=opts))
    assert '\n' not in str(e.value)
    with pytest.raises(ValueError, match='head_dim must be even'):
        M.GPT(tiny_config('tape', n_embd=36, n_head=4))
    with pytest.raises(ValueError, match='attn_scaling'):
        M.GPT(tiny_config('tape', attn_scaling={'type': 'logn'}))


def test_docstring_and_config():
    doc = P.REGISTRY['tape'].__doc__
    for s in ('2501.00712', 'VITA-Group/TAPE', 'adape.py', 'Options', 'efault', "'bqnd,qe->bqnd'"):
        assert s in doc, s
    cfg = {}
    exec(open(os.path.join(ROOT, 'config', 'tape.py')).read(), cfg)
    assert cfg['pos_encoding'] == 'tape' and cfg['out_dir'] == 'out-tape'
