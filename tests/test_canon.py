"""Canon layers (Allen-Zhu, arXiv 2512.17351; code facebookresearch/PhysicsLM4), the layer plan's canon_set and
canon_kernel: equal in float64, forward and every gradient, to the authors' arithmetic written out here from their
canon_helper.py and modeling_llama_canon.py (the convolution as their nn.Conv1d with padding K - 1 cut to T steps,
the residual, each place where their code puts it), at each place; their init; their one-token decoding step; KV-cache
decoding equal to a full forward, with windows, chunks and a rolling attention-sink cache; causality and what a
windowed layer reads; the registry-wide properties for NoPE, RoPE and ALiBi with Canon layers on; no graph breaks;
routes unchanged; plan weights in a fine-tune; the plan grammar and bad input."""
import math
import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import checkpoint
import kernels
import kvcache
from conftest import (SCHEMES, assert_causal, assert_flex_equals_dense, assert_kv_cache_matches_full_forward,
                      assert_trains, ROOT, tiny_config, tiny_model)
from model import GPT, changeable

F64 = torch.float64


# --- the authors' arithmetic, written out from PhysicsLM4 --------------------------------------------------------

def authors_canon(h, weight):
    """PhysicsLM4's canon_helper.py: ShortConvolution, an nn.Conv1d with groups = channels, padding kernel - 1 and no
    bias, its output cut to the first T steps, no activation (canon_activation=False); apply_canon's residual
    (canon_residual=True) returns h + conv(h). h [B, T, D]; weight [D, K] (their [D, 1, K])."""
    T, K = h.size(1), weight.size(1)
    y = F.conv1d(h.transpose(1, 2), weight[:, None, :], None, stride=1, padding=K - 1, groups=h.size(2))[..., :T]
    return h + y.transpose(1, 2)


def authors_decode(h, weight, prefill):
    """ShortConvolution with a cache, as the authors decode: a forward of the first `prefill` tokens whose state is
    the last K inputs (F.pad(x, (K - T, 0))), then one token at a time the state rolls left by one, takes the token
    last, and the output is sum(state * weight) (its step), plus apply_canon's residual."""
    K = weight.size(1)
    out = [authors_canon(h[:, :prefill], weight)]
    state = F.pad(h[:, :prefill].transpose(1, 2), (K - prefill, 0))
    for t in range(prefill, h.size(1)):
        state = torch.roll(state, shifts=-1, dims=-1)
        state[:, :, -1] = h[:, t]
        out.append(h[:, t:t + 1] + (state * weight).sum(-1)[:, None])
    return torch.cat(out, 1)


def rms(x, w, hd, eps=1e-6):
    """RMSNorm over each head's hd dims of x [B, T, heads x hd] (nanoPE's qk_norm), weight w [hd] or None."""
    B, T, _ = x.shape
    x = x.view(B, T, -1, hd)
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return (y * w if w is not None else y).view(B, T, -1)


def reference_logits(m, idx, visible=None):
    """The logits of a model of NoPE layers, written out: pre-LN blocks, softmax(q.k / sqrt(d)) over the keys
    visible(t) names for query t (default 0..t), and the Canon layers of each layer's plan where the authors' code
    puts them (modeling_llama_canon.py): A on the attention's input after its norm (canonA in the decoder layer,
    after input_layernorm); B on [q | k | v] after QK-norm and before the heads attend (canonB in the attention); C on
    the MLP's input after its norm (canonC, after post_attention_layernorm); D on the MLP's hidden layer before its
    activation (canonD on [gate | up]; here nanoPE's one c_fc, 4 n_embd, before the GELU)."""
    x = m.transformer.wte(idx)
    B, T, C = x.shape
    H = m.config.n_head
    hd = C // H
    vis = torch.tensor([[j in (visible(t) if visible else range(t + 1)) for j in range(T)] for t in range(T)])
    for blk, spec in zip(m.transformer.h, m.plan):
        at, mlp, places = blk.attn, blk.mlp, spec.canon_set
        a = blk.ln_1(x)
        if 'A' in places:
            a = authors_canon(a, at.canonA.weight)
        q, k, v = F.linear(a, at.c_attn.weight, at.c_attn.bias).split(C, 2)
        if at.q_norm is not None:
            q, k = rms(q, at.q_norm.weight, hd), rms(k, at.k_norm.weight, hd)
        if 'B' in places:
            q, k, v = authors_canon(torch.cat((q, k, v), 2), at.canonB.weight).split(C, 2)
        q, k, v = (t.view(B, T, H, hd).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-1, -2) / math.sqrt(hd)).masked_fill(~vis, float('-inf')).softmax(-1)
        x = x + F.linear((att @ v).transpose(1, 2).reshape(B, T, C), at.c_proj.weight, at.c_proj.bias)
        c = blk.ln_2(x)
        if 'C' in places:
            c = authors_canon(c, mlp.canonC.weight)
        f = F.linear(c, mlp.c_fc.weight, mlp.c_fc.bias)
        if 'D' in places:
            f = authors_canon(f, mlp.canonD.weight)
        x = x + F.linear(F.gelu(f), mlp.c_proj.weight, mlp.c_proj.bias)
    return F.linear(m.transformer.ln_f(x), m.lm_head.weight)


def rel(a, b):
    return float(((a - b).abs().max() / b.abs().max()).detach())


def f64_model(**kw):
    """A NoPE model in float64 with QK-norm, its norm weights drawn away from 1 (so Canon-B's order with the norm
    shows), biases on and drawn, matrices 10x GPT-2's init (attention far from uniform, no gradient vanishingly
    small), and the Canon layers the plan kw gives."""
    m = tiny_model('none', qk_norm=True, bias=True, **kw).double()
    with torch.no_grad():
        for n, p in m.named_parameters():
            if 'norm' in n or n.endswith('bias'):
                p.copy_(torch.randn_like(p) * 0.3 + (1.0 if n.endswith('weight') else 0.0))
            elif 'canon' not in n and p.dim() == 2:
                p.mul_(10)
    return m


# --- equal to the authors' code -----------------------------------------------------------------------------

@pytest.mark.parametrize('places, kernel', [('A', 4), ('B', 4), ('C', 4), ('D', 4), ('ABCD', 4), ('ABCD', 2),
                                            ('BD', 5)])
def test_each_place_equals_the_authors_arithmetic_forward_and_every_gradient(places, kernel):
    """Two layers of NoPE with Canon layers at `places`: logits and the gradient of every weight equal the authors'
    arithmetic (reference_logits) in float64 to 1e-12 relative; without the Canon layers they would not."""
    m = f64_model(canon_set=places, canon_kernel=kernel)
    x = torch.randint(0, 37, (2, 13), generator=torch.Generator().manual_seed(0))
    w = torch.randn(2, 13, 37, dtype=F64, generator=torch.Generator().manual_seed(1))
    grads = []
    for f in (lambda: m(x)[0], lambda: reference_logits(m, x)):
        m.zero_grad()
        out = f()
        (out * w).sum().backward()
        grads.append((out.detach(), {n: p.grad.clone() for n, p in m.named_parameters()}))
    (got, g_got), (want, g_want) = grads
    assert rel(got, want) <= 1e-12
    assert set(g_got) == set(g_want) and sum('canon' in n for n in g_got) == 2 * len(places)
    for n in g_want:
        assert rel(g_got[n], g_want[n]) <= 1e-12, n
    with torch.no_grad():  # the test sees the Canon layers: dropping them moves the logits
        for n, p in m.named_parameters():
            if 'canon' in n:
                p.zero_()
        assert rel(m(x)[0], want) > 1e-3


def test_the_convolution_on_either_route_equals_the_authors_with_a_carry():
    """kernels.depthwise_conv on both routes (the shifted products on the CPU, torch's depthwise conv1d on CUDA, here
    forced on the CPU) equals the authors' nn.Conv1d, from zeros and continuing from the last K - 1 inputs."""
    g = torch.Generator().manual_seed(0)
    for K in (1, 2, 4, 5):
        h, w = torch.randn(2, 11, 6, dtype=F64, generator=g), torch.randn(6, K, dtype=F64, generator=g)
        want = authors_canon(h, w) - h
        for conv1d in (False, True):
            assert rel(kernels.depthwise_conv(h, w, conv1d=conv1d), want) <= 1e-13
            if K > 1:
                got = kernels.depthwise_conv(h[:, 7:], w, h[:, 7 - (K - 1):7], conv1d=conv1d)
                assert rel(got, want[:, 7:]) <= 1e-13


def test_init_is_the_authors_nn_conv1d_default_and_gpt2_init_leaves_it():
    """The authors keep nn.Conv1d's init (kaiming_uniform_, a = sqrt(5): U(-1/sqrt(K), 1/sqrt(K)), std 0.288 at K = 4;
    their demo_newmodel.py checks it); a Canon layer draws the same numbers, and the model's GPT-2 init leaves them."""
    for K in (2, 4):
        torch.manual_seed(3)
        ours = kernels.Canon(96, K, 'canonA').weight
        torch.manual_seed(3)
        theirs = nn.Conv1d(96, 96, K, groups=96, bias=False, padding=K - 1).weight
        assert theirs.shape == (96, 1, K) and torch.allclose(ours, theirs[:, 0], rtol=0, atol=1e-7)
    m = tiny_model('none', n_embd=128, canon_set='ABCD')
    w = torch.cat([p.flatten() for n, p in m.named_parameters() if 'canon' in n])
    assert w.numel() == 2 * 4 * (128 + 3 * 128 + 128 + 512) and w.abs().max() <= 0.5
    assert abs(w.std().item() - 12 ** -0.5) < 0.01  # uniform on [-1/2, 1/2], not N(0, 0.02)


def test_one_token_decoding_equals_the_authors_step_and_chunks_continue_the_carry():
    """A Canon layer with a KV cache: a prefill, then one token at a time, equals the authors' decoding (their state
    of the last K inputs, rolled); then chunks of several tokens continue from the carry and equal the full forward
    (the authors' forward of several tokens with a cache restarts from zeros: one token at a time is all they do)."""
    g = torch.Generator().manual_seed(0)
    for K, prefill in ((4, 6), (4, 2), (3, 1), (5, 9)):
        h = torch.randn(2, 16, 5, dtype=F64, generator=g)
        canon = kernels.Canon(5, K, 'canonC').double()
        cache = kvcache.LayerKV()
        steps = [canon(h[:, :prefill], cache)] + [canon(h[:, t:t + 1], cache) for t in range(prefill, 16)]
        assert rel(torch.cat(steps, 1), authors_decode(h, canon.weight, prefill)) <= 1e-13
        assert cache.carry['canonC'].shape == (2, K - 1, 5)
        cache = kvcache.LayerKV()
        chunks = [canon(h[:, a:b], cache) for a, b in ((0, 1), (1, 5), (5, 6), (6, 13), (13, 16))]
        assert rel(torch.cat(chunks, 1), authors_canon(h, canon.weight)) <= 1e-13


# --- the KV cache, windows, chunks, a rolling cache ----------------------------------------------------------

@pytest.mark.parametrize('scheme', ['none', 'rope', 'alibi', 'xpos', 'path', 'selective_rope', 'fox', 'learned'])
def test_kv_cache_decoding_equals_a_full_forward(scheme):
    """Every place on, over schemes whose caches differ: keys cached transformed (rope), raw (xpos), by the scheme
    (path), a scheme's own carry beside the Canon layers' (selective_rope, path), an own attention (fox)."""
    assert_kv_cache_matches_full_forward(tiny_model(scheme, canon_set='ABCD').eval())


@pytest.mark.parametrize('kw', [dict(canon_kernel=2), dict(canon_kernel=5), dict(canon_set={1: 'BD'}),
                                dict(canon_set={0: 'A', 1: 'C'}, canon_kernel={0: 3, 1: 6})])
def test_kv_cache_decoding_equals_a_full_forward_at_other_widths_and_places(kw):
    assert_kv_cache_matches_full_forward(tiny_model('rope', **{'canon_set': 'ABCD', **kw}).eval())


@pytest.mark.parametrize('mask', [dict(sliding_window=5), dict(attention_chunk_size=6),
                                  dict(sliding_window=4, attention_chunk_size=9)])
@pytest.mark.parametrize('scheme', ['none', 'rope', 'alibi'])
def test_windowed_kv_cache_equals_full_forward_stays_bounded_and_carries_k_minus_1_inputs(scheme, mask):
    """A windowed or chunked layer's cache drops keys no later query sees; the Canon layers' carry is left alone
    (their last K - 1 inputs are not keys), so decoding past the window and across chunks equals the full forward."""
    m = tiny_model(scheme, canon_set='ABCD', **mask).eval()
    x = torch.randint(0, 37, (2, 40), generator=torch.Generator().manual_seed(2))
    bound = min(mask.values())
    with torch.no_grad():
        full, _ = m(x)
        cache = m.new_cache()
        outs = [m(x[:, :7], cache=cache)[0]]
        for t in range(7, 37):
            outs.append(m(x[:, t:t + 1], cache=cache)[0])
            assert all(layer.n < bound for layer in cache.layers)
            assert all(c.size(1) == 3 for layer in cache.layers for c in layer.carry.values())
        outs.append(m(x[:, 37:], cache=cache)[0])
    assert sorted(cache.layers[0].carry) == ['canonA', 'canonB', 'canonC', 'canonD']
    assert torch.allclose(torch.cat(outs, 1), full, atol=1e-5)


@pytest.mark.parametrize('mask', [dict(sliding_window=5), dict(attention_chunk_size=6)])
def test_a_windowed_layer_reads_its_window_and_the_k_minus_1_inputs_before_each_convolution(mask):
    """One layer, every place, K = 4: the logits at t change with every token t's mask lets it see, and with no token
    before its first visible one by more than 4 (K - 1) = 12: A and B before each visible key (6), C and D before
    the attention outputs they mix (6). The float64 reference with the same visibility is the model's output."""
    m = f64_model(n_layer=1, canon_set='ABCD', **mask).eval()
    W, Cn = mask.get('sliding_window'), mask.get('attention_chunk_size')

    def visible(t):
        return [u for u in range(t + 1) if (W is None or t - u < W) and (Cn is None or t // Cn == u // Cn)]
    T = 32
    x = torch.randint(0, 37, (1, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        base = m(x)[0]
        assert rel(base, reference_logits(m, x, visible)) <= 1e-12
        for u in (0, 5, 11, 17, 20):
            y = x.clone()
            y[0, u] = (y[0, u] + 1) % 37
            diff = (m(y)[0] - base).abs().amax(-1)[0]
            for t in range(T):
                if u in visible(t):
                    assert diff[t] > 1e-9, (t, u)
                elif u < min(visible(t)) - 12 or u > t:
                    assert diff[t] == 0, (t, u)


@pytest.mark.parametrize('scheme', ['none', 'rope', 'alibi'])
def test_rolling_cache_with_nothing_evicted_is_ordinary_decoding(scheme):
    m = tiny_model(scheme, canon_set='ABCD').eval()
    torch.manual_seed(1)
    a = m.generate(torch.zeros(1, 3, dtype=torch.long), 40, top_k=1)
    b = m.generate(torch.zeros(1, 3, dtype=torch.long), 40, top_k=1, recent=100, sink_tokens=0)
    assert torch.equal(a, b)


@pytest.mark.parametrize('sink, recent', [(2, 5), (0, 3), (3, 1)])
def test_rolling_cache_is_attention_over_the_kept_keys_with_the_texts_last_inputs(sink, recent):
    """A StreamingLLM cache keeps the first `sink` tokens' keys and the last `recent`; each cached key and value was
    computed from the text as it came, and so are the Canon layers' inputs: their carry is the text's last K - 1
    (kept by the carry, whatever the cache evicts). Two NoPE layers: every decoded logit equals the float64 reference
    in which each token t attends to the keys the cache held for it, and every convolution reads the text's
    previous tokens."""
    m = f64_model(canon_set='ABCD').eval()
    T, P = 26, sink + recent + 1  # generate's prompt: one forward of up to sink + recent + 1 tokens

    def visible(t):
        return list(range(t + 1)) if t < P else sorted(set(range(sink)) | set(range(t - recent, t + 1)))
    x = torch.randint(0, 37, (1, T), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        cache = m.new_cache(recent=recent, sink_tokens=sink)
        out = torch.cat([m(x[:, :P], cache=cache)[0]] + [m(x[:, t:t + 1], cache=cache)[0] for t in range(P, T)], 1)
        assert all(layer.n == sink + recent for layer in cache.layers)
        want = reference_logits(m, x, visible)
    assert rel(out, want) <= 1e-12
    assert rel(out, reference_logits(m, x)) > 1e-3  # what it evicted mattered


# --- the registry-wide properties with Canon layers on ------------------------------------------------------

CANON_SCHEMES = ['none', 'rope', 'alibi']


@pytest.mark.parametrize('scheme', CANON_SCHEMES)
def test_causal_past_block_size_and_generation_with_and_without_cache(scheme):
    m = tiny_model(scheme, canon_set='ABCD').eval()
    assert_causal(m)
    x = torch.randint(0, 37, (1, 64))
    with torch.no_grad():
        logits = m(x)[0]
        assert logits.shape == (1, 64, 37) and torch.isfinite(logits).all()
        assert torch.allclose(logits[:, :16], m(x[:, :16])[0], atol=1e-5)
    torch.manual_seed(1)
    a = m.generate(torch.zeros(1, 3, dtype=torch.long), 30, top_k=1)
    b = m.generate(torch.zeros(1, 3, dtype=torch.long), 30, top_k=1, use_cache=False)
    assert torch.equal(a, b)


@pytest.mark.parametrize('scheme', CANON_SCHEMES)
def test_training_lowers_the_loss_and_every_canon_weight_learns(scheme):
    m = tiny_model(scheme, canon_set='ABCD')
    before = {n: p.detach().clone() for n, p in m.named_parameters() if 'canon' in n}
    opt, _ = assert_trains(m, weight_decay=0.1)
    assert len(before) == 8 and all(not torch.equal(p, before[n]) for n, p in m.named_parameters() if n in before)
    decayed = {id(p) for p in opt.param_groups[0]['params']}  # decayed, as the authors' AdamW decays every weight
    assert all(id(p) in decayed for n, p in m.named_parameters() if n in before)


@pytest.mark.parametrize('scheme', CANON_SCHEMES)
def test_flex_equals_dense_and_bf16_autocast_step_and_cache(scheme):
    assert_flex_equals_dense(tiny_model(scheme, block_size=64, canon_set='ABCD').eval())
    m = tiny_model(scheme, canon_set='ABCD')
    x = torch.randint(0, 37, (4, 17), generator=torch.Generator().manual_seed(0))
    with torch.autocast('cpu', dtype=torch.bfloat16):
        logits, loss = m(x[:, :-1], x[:, 1:])
    assert logits.dtype == torch.bfloat16 and torch.isfinite(loss)
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for n, p in m.named_parameters() if 'canon' in n)
    m.eval()
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        full = m(x[:, :16])[0].float()
        cache = m.new_cache()
        steps = [m(x[:, :5], cache=cache)[0]] + [m(x[:, t:t + 1], cache=cache)[0] for t in range(5, 16)]
    assert (torch.cat(steps, 1).float() - full).abs().max() < 0.1


@pytest.mark.parametrize('scheme', CANON_SCHEMES)
def test_forward_and_backward_make_no_tensor_off_the_model_device(scheme, monkeypatch):
    autocast = torch.autocast
    monkeypatch.setattr(torch, 'autocast', lambda dev, *a, **kw: autocast('cpu' if dev == 'meta' else dev, *a, **kw))
    m = tiny_model(scheme, canon_set='ABCD').to('meta')
    x = torch.randint(0, 37, (2, 17)).to('meta')
    logits, loss = m(x[:, :-1], x[:, 1:])
    loss.backward()
    assert logits.device.type == 'meta' and all(p.grad.device.type == 'meta' for n, p in m.named_parameters()
                                                if 'canon' in n)


@pytest.mark.parametrize('scheme', CANON_SCHEMES)
def test_compiled_forward_has_no_graph_breaks(scheme):
    """A training forward and a no-grad FlexAttention forward with every place on compile to one graph."""
    x = torch.randint(0, 37, (2, 64))
    for backend, grad in (('auto', True), ('flex', False)):
        torch._dynamo.reset()
        m = tiny_model(scheme, block_size=64, attn_backend=backend, canon_set='ABCD', sliding_window={1: 8})
        m.train(grad)
        with torch.set_grad_enabled(grad):
            ex = torch._dynamo.explain(m)(x, x)
        assert ex.graph_break_count == 0 and ex.graph_count == 1, [str(b.reason)[:200] for b in ex.break_reasons]
    torch._dynamo.reset()


def test_canon_layers_change_no_route():
    """Every scheme's route on CUDA in bfloat16, training and evaluation, is the same with every place on."""
    for scheme in SCHEMES:
        for grad in (True, False):
            routes = [tiny_model(scheme, **kw).routes('cuda', grad=grad, dtype=torch.bfloat16)
                      for kw in ({}, dict(canon_set='ABCD'))]
            assert routes[0] == routes[1], (scheme, grad, routes)


# --- plan weights: a fine-tune adds or drops Canon layers -----------------------------------------------------

CANON_WEIGHTS = sorted(f'transformer.h.{i}.{w}.weight' for i in (0, 1)
                       for w in ('attn.canonA', 'attn.canonB', 'mlp.canonC', 'mlp.canonD'))


def test_a_fine_tune_adds_canon_layers_as_the_identity_and_drops_them():
    old = tiny_model('rope', seed=1).eval()
    new = tiny_model('rope', seed=2, canon_set='ABCD').eval()
    kept, dropped, fresh = checkpoint.load_shared(new, old.state_dict(), 'old.pt')
    assert sorted(fresh) == CANON_WEIGHTS and not dropped and all(changeable(k) for k in fresh)
    assert all((new.get_parameter(k) == 0).all() for k in fresh)
    x = torch.randint(0, 37, (2, 16))
    with torch.no_grad():
        assert torch.allclose(new(x)[0], old(x)[0], atol=1e-6)
    _, loss = new(x[:, :-1], x[:, 1:])
    loss.backward()
    assert all(new.get_parameter(k).grad.abs().sum() > 0 for k in fresh)  # the identity still learns
    plain = tiny_model('rope', seed=3)
    kept, dropped, fresh = checkpoint.load_shared(plain, tiny_model('rope', canon_set='ABCD').state_dict(), 'c.pt')
    assert sorted(dropped) == CANON_WEIGHTS and not fresh


def test_changeable_names_exactly_the_canon_weights_the_plan_adds():
    plain = set(tiny_model('rope').state_dict())
    added = set(tiny_model('rope', canon_set='ABCD').state_dict()) - plain
    assert sorted(added) == CANON_WEIGHTS and all(changeable(k) for k in added)
    assert not any(changeable(k) for k in plain if '.pe' not in k)


# --- the plan: grammar, defaults, bad input -------------------------------------------------------------------

def test_plan_grammar_places_and_widths():
    def plan(**kw):
        return [(s.canon_set, s.canon_kernel) for s in GPT(tiny_config('rope', n_layer=4, **kw)).plan]
    assert plan() == [('', 4)] * 4  # off by default
    assert plan(canon_set=True) == plan(canon_set='DCBA') == [('ABCD', 4)] * 4  # the places in their order
    assert plan(canon_set={'F': 'CA'}, layer_types='SF', canon_kernel=3) == [('', 4), ('AC', 3)] * 2
    assert plan(canon_set={1: 'B', 3: 'ABCD'}, canon_kernel={3: 2}) == [('', 4), ('B', 4), ('', 4), ('ABCD', 2)]
    assert plan(canon_set='', canon_kernel=None) == plan(canon_set=False) == [('', 4)] * 4
    lines = GPT(tiny_config('rope', n_layer=2, canon_set={1: 'AC'}, canon_kernel=3)).plan_lines()
    assert lines == ['layer 0: rope', 'layer 1: rope, canon_set AC, canon_kernel 3']


def test_the_key_off_builds_the_same_model():
    """canon_set None, '' or False: the same weights from the same seed, the same logits, no Canon module."""
    x = torch.randint(0, 37, (2, 16))
    models = [tiny_model('rope', **kw) for kw in ({}, dict(canon_set=''), dict(canon_set=False))]
    sds = [m.state_dict() for m in models]
    assert all(sd.keys() == sds[0].keys() and all(torch.equal(sd[k], sds[0][k]) for k in sd) for sd in sds)
    assert not any('canon' in n for n, _ in models[0].named_modules())
    with torch.no_grad():
        assert all(torch.equal(m(x)[0], models[0](x)[0]) for m in models)


@pytest.mark.parametrize('kw, match', [
    (dict(canon_set='AE'), "canon_set takes the places of Canon layers, some of 'A'"),
    (dict(canon_set='AA'), 'canon_set takes the places'),
    (dict(canon_set='abcd'), 'canon_set takes the places'),
    (dict(canon_set=4), 'canon_set takes the places'),
    (dict(canon_set={2: 'A'}), 'names layer 2, but the model has n_layer=2 layers'),
    (dict(canon_set={'F': 'A'}), "names layer type 'F', but layer_types is not set"),
    (dict(canon_kernel=3), 'canon_kernel=3 is the width of Canon layers, and this model has none: set canon_set'),
    (dict(canon_set={0: 'A'}, canon_kernel={1: 3}), 'canon_kernel names layer 1, which has no Canon layers'),
    (dict(canon_set='A', canon_kernel=0), "canon_kernel is a convolution's width, a whole number of tokens >= 1"),
    (dict(canon_set='A', canon_kernel=2.5), "canon_kernel is a convolution's width"),
])
def test_bad_canon_plans_say_what_to_do(kw, match):
    with pytest.raises(ValueError, match=match):
        tiny_model('rope', **kw)


def test_the_config_is_nope_with_every_place_on_and_takes_another_scheme():
    from configurator import read_config_file
    cfg = read_config_file(os.path.join(ROOT, 'config', 'canon.py'))
    assert cfg == {'pos_encoding': 'none', 'canon_set': 'ABCD', 'out_dir': 'out-canon'}
    for scheme in ('none', 'rope'):
        m = GPT(tiny_config(scheme, n_layer=4, block_size=128, canon_set=cfg['canon_set']))
        assert [(s.canon_set, s.canon_kernel) for s in m.plan] == [('ABCD', 4)] * 4
