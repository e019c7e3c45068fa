"""PaTH, PaTH-FoX and Wall: their logits against per-pair formulas written here in float64 (explicit d x d
Householder products; exp of prefix-sum differences), the gates they read from the layer input, PaTH's KV
cache of rewritten keys, Wall's stability over long sequences, and their options. The registry-wide
properties (causality, KV cache, windows, FlexAttention, compile) cover them by name elsewhere."""
import math

import pytest
import torch
import torch.nn.functional as F

import kernels as K
import positional as P
from conftest import tiny_model


def householder_logits(q, k, w, beta):
    """A[i, j] = q_i^T H_i H_{i-1} ... H_{j+1} k_j with H_t = I - beta_t w_t w_t^T, per pair in float64."""
    B, H, T, d = q.shape
    A = torch.zeros(B, H, T, T, dtype=torch.float64)
    eye = torch.eye(d, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                prod = eye.clone()  # H_i ... H_{j+1}, grown one factor at a time as j goes down
                for j in range(i, -1, -1):
                    A[b, h, i, j] = q[b, h, i].double() @ prod @ k[b, h, j].double()
                    wj = w[b, h, j].double()
                    prod = prod @ (eye - beta[b, h, j].double() * torch.outer(wj, wj))
    return A


def moved_keys(k, w, beta):
    """Each key j moved through every later token's H: H_{T-1} ... H_{j+1} k_j, float64."""
    B, H, T, d = k.shape
    out = k.double().clone()
    for t in range(T):
        wt = w[:, :, t].double()
        later = torch.arange(T) < t  # keys before token t cross its H
        upd = out - beta[:, :, t, None, None].double() * (out @ wt[..., None]) * wt[:, :, None, :]
        out = torch.where(later[None, None, :, None], upd, out)
    return out


def rand_path(B=2, H=2, T=13, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(B, H, T, d, generator=g), torch.randn(B, H, T, d, generator=g)
    w = F.normalize(torch.randn(B, H, T, d, generator=g), dim=-1)
    return q, k, w, 2 * torch.rand(B, H, T, generator=g)  # beta over (0, 2): reflections and negative eigenvalues


@pytest.mark.parametrize('chunk', [64, 5, 1])
def test_path_scores_equal_the_per_pair_product(chunk):
    q, k, w, beta = rand_path()
    A, keys = K.path_scores(q, k, w, beta, chunk=chunk, keys=True)
    want = householder_logits(q, k, w, beta)
    causal = torch.ones(13, 13, dtype=torch.bool).tril()
    assert torch.allclose(A[..., causal].double(), want[..., causal], atol=1e-5)
    assert (A[..., ~causal] == 0).all()
    assert torch.allclose(keys.double(), moved_keys(k, w, beta), atol=1e-5)


def test_path_scores_over_a_cache_of_moved_keys_equal_the_whole_sequence():
    """Segments of 7, 1, 1 and 4 tokens, each after the keys the previous ones left (moved through the last
    token's H), give the whole sequence's logits and keys: PaTH's KV cache."""
    q, k, w, beta = rand_path(seed=1)
    want = householder_logits(q, k, w, beta)
    prev = None
    for a, b in ((0, 7), (7, 8), (8, 9), (9, 13)):
        A, prev = K.path_scores(q[:, :, a:b], k[:, :, a:b], w[:, :, a:b], beta[:, :, a:b], prev, chunk=3, keys=True)
        seen = torch.ones(b - a, b, dtype=torch.bool).tril(a)
        assert torch.allclose(A[..., seen].double(), want[:, :, a:b, :b][..., seen], atol=1e-5)
    assert torch.allclose(prev.double(), moved_keys(k, w, beta), atol=1e-5)


def path_reference(m, x):
    """The one-layer PaTH model's attention output before c_proj, from its parameters in float64: w_t =
    L2norm(SiLU(sum_s conv[:, s] (W_up W_down x)_{t-2+s})), beta = 2 sigmoid(u . x + b), logits = the Householder
    product / sqrt(d) (+ (G_i - G_j) / sqrt(d) with forget gates), softmax, values."""
    attn = m.transformer.h[0].attn
    layer = attn.pe_layer
    B, T, C = x.shape
    H, d = attn.n_head, C // attn.n_head
    xd = x.double()
    q, k, v = (t.view(B, T, H, d).transpose(1, 2).double() for t in attn.c_attn(x).split(C, dim=2))
    pre = xd @ layer.w_down.weight.double().t() @ layer.w_up.weight.double().t()  # [B, T, C]
    conv = layer.w_conv.double()
    w = torch.zeros(B, T, C, dtype=torch.float64)
    for t in range(T):
        for s in range(conv.size(1)):
            src = t - (conv.size(1) - 1) + s
            if src >= 0:
                w[:, t] += conv[:, s] * pre[:, src]
    w = F.silu(w).view(B, T, H, d).transpose(1, 2)
    w = w / torch.sqrt((w * w).sum(-1, keepdim=True) + 1e-6)
    beta = 2 * torch.sigmoid(xd @ layer.beta.weight.double().t() + layer.beta.bias.double()).transpose(1, 2)
    A = householder_logits(q, k, w, beta)
    if layer.fgate is not None:
        G = F.logsigmoid(xd @ layer.fgate.weight.double().t() + layer.fgate.bias.double()).transpose(1, 2).cumsum(-1)
        A = A + G[..., :, None] - G[..., None, :]
    A = (A / math.sqrt(d)).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float('-inf'))
    return A.softmax(-1) @ v


@pytest.mark.parametrize('scheme', ['path', 'path_fox'])
def test_path_layer_equals_the_reference_from_its_parameters(scheme):
    m = tiny_model(scheme, n_layer=1).eval()
    layer = m.transformer.h[0].attn.pe_layer
    with torch.no_grad():  # gates away from their init, so every part of the formula matters
        layer.beta.bias.uniform_(-2, 2)
        layer.w_up.weight.mul_(20)
        layer.w_down.weight.mul_(20)
        layer.w_conv.normal_()
        if layer.fgate is not None:
            layer.fgate.bias.uniform_(-1, 3)
    x = torch.randn(2, 12, 32)
    seen = []
    m.transformer.h[0].attn.c_proj.register_forward_hook(lambda mod, inp, out: seen.append(inp[0]))
    with torch.no_grad():
        pe = m.pe.at(0)
        m.transformer.h[0].attn(x, pe, pe.context(torch.arange(12), torch.arange(12), 12))
    want = path_reference(m, x).transpose(1, 2).reshape(2, 12, 32)
    assert torch.allclose(seen[0].double(), want, atol=1e-5)


def test_path_decoding_rewrites_each_cached_key_by_the_new_tokens_h():
    """After each decoded token t the cache holds H_t ... H_{j+1} k_j for every earlier key j, and k_t as it came:
    the rank-one update k <- k - beta_t (k . w_t) w_t per cached key and token."""
    m = tiny_model('path', n_layer=1).eval()
    attn = m.transformer.h[0].attn
    x = torch.randint(0, 37, (1, 9))
    steps, pe = [], m.pe.at(0)
    real = pe.gates

    def recording(*args):  # the layer's w and beta, as its gates computed them
        steps.append(real(*args))
        return steps[-1]
    pe.gates = recording
    try:
        with torch.no_grad():
            cache = m.new_cache()
            m(x[:, :4], cache=cache)
            for t in range(4, 9):
                m(x[:, t:t + 1], cache=cache)
    finally:
        pe.gates = real
    w, beta = torch.cat([s[0] for s in steps], 2), torch.cat([s[1] for s in steps], 2)
    h = m.transformer.h[0].ln_1(m.transformer.wte(x))
    k = attn.c_attn(h).split(32, dim=2)[1].view(1, 9, 4, 8).transpose(1, 2)
    assert cache.layers[0].n == 9
    assert torch.allclose(cache.layers[0][0].double(), moved_keys(k, w, beta), atol=1e-5)


def test_cumsum_tokens_op_is_cumsum_bit_for_bit_eager_and_compiled():
    """The op Selective RoPE, Wall and contextual GRAPE-M sum their increments with on CUDA: the prefix sums over
    tokens (against float64), cumsum(2)'s numbers and gradients exactly, eager and under torch.compile, and a
    custom op whose fake and autograd registrations agree with it (torch.library.opcheck)."""
    x = torch.randn(2, 3, 1000, 5, generator=torch.Generator().manual_seed(0)).transpose(2, 3).contiguous()
    x = x.transpose(2, 3).requires_grad_()  # a non-contiguous input, as the transposed gates are
    want = torch.stack([x[:, :, :t + 1].double().sum(2) for t in (0, 1, 499, 999)], 2)
    assert torch.allclose(K.aten_cumsum_tokens(x)[:, :, [0, 1, 499, 999]].double(), want, atol=1e-4)
    w = torch.randn_like(x)
    for f in (K.aten_cumsum_tokens, torch.compile(K.aten_cumsum_tokens, fullgraph=True), P.cumsum_tokens):
        y = f(x)
        assert torch.equal(y, x.cumsum(2))
        assert torch.equal(torch.autograd.grad((y * w).sum(), x)[0],
                           torch.autograd.grad((x.cumsum(2) * w).sum(), x)[0])
    torch.library.opcheck(K.aten_cumsum_tokens, (x.detach().requires_grad_(),))


@pytest.mark.parametrize('scheme', ['selective_rope', 'wall'])
def test_cuda_prefix_sum_op_compiles_in_the_model_as_one_graph(scheme, monkeypatch):
    """CUDA's branch of cumsum_tokens (the opaque op), taken on CPU: a training forward still compiles to one graph
    and its loss and gradients equal plain cumsum's."""
    x = torch.randint(0, 37, (2, 33), generator=torch.Generator().manual_seed(0))
    grads = []
    for op in (K.aten_cumsum_tokens, lambda t: t.cumsum(2)):
        monkeypatch.setattr(P, 'cumsum_tokens', op)
        m = tiny_model(scheme, block_size=32)
        loss = m(x[:, :-1], x[:, 1:])[1]
        loss.backward()
        grads.append(torch.cat([loss.detach()[None]] + [p.grad.flatten() for p in m.parameters()
                                                         if p.grad is not None]))
        if op is K.aten_cumsum_tokens:
            torch._dynamo.reset()
            ex = torch._dynamo.explain(tiny_model(scheme, block_size=32))(x[:, :-1], x[:, 1:])
            assert ex.graph_break_count == 0 and ex.graph_count == 1, [str(b.reason)[:200] for b in ex.break_reasons]
            torch._dynamo.reset()
    assert torch.equal(grads[0], grads[1])


def wall_logits(q, k, g):
    """sum_n q_in k_jn exp(P_in - P_jn) for j <= i, P the prefix sum of g over tokens, per pair in float64."""
    Pd = g.double().cumsum(2)
    B, H, T, d = q.shape
    A = torch.zeros(B, H, T, T, dtype=torch.float64)
    for i in range(T):
        for j in range(i + 1):
            A[:, :, i, j] = (q[:, :, i].double() * k[:, :, j].double() * torch.exp(Pd[:, :, i] - Pd[:, :, j])).sum(-1)
    return A


@pytest.mark.parametrize('T, q0, run', [(13, 0, 128), (16, 0, 128), (1, 0, 128), (13, 8, 128), (13, 12, 128),
                                        (40, 3, 128), (40, 0, 8), (40, 8, 8), (32, 0, 8)])
@pytest.mark.parametrize('grad', [False, True])
def test_wall_scores_equal_the_per_pair_formula(T, q0, run, grad):
    """Queries the last T - q0 of T keys (q0 > 0: a KV cache), in runs of 2^m queries (13 = 8 + 4 + 1), at
    most `run` (40 = 5 x 8); with gradients and no cache, 40 and 32 queries in runs of 8 go at once (_wall_runs)."""
    gen = torch.Generator().manual_seed(2)
    q, k = torch.randn(2, 2, T, 4, generator=gen), torch.randn(2, 2, T, 4, generator=gen)
    g = F.logsigmoid(2 * torch.randn(2, 2, T, 4, generator=gen))
    with torch.set_grad_enabled(grad):
        A = K.wall_scores(q[:, :, q0:], k, g.cumsum(2), run)
    want = wall_logits(q, k, g)[:, :, q0:]
    seen = torch.ones(T - q0, T, dtype=torch.bool).tril(q0)
    assert torch.allclose(A[..., seen].double(), want[..., seen], atol=1e-5) and (A[..., ~seen] == 0).all()


def test_wall_runs_at_once_have_the_per_pair_gradients():
    """The runs taken at once (32 tokens, runs of 8): the gradients of q, k and the gates equal those of the
    per-pair formula in float64, with no NaN or inf where g decays steeply (e^-30 a token at most)."""
    gen = torch.Generator().manual_seed(5)
    q, k = (torch.randn(1, 2, 32, 4, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(2))
    g = (F.logsigmoid(torch.randn(1, 2, 32, 4, generator=gen, dtype=torch.float64)) * 30).requires_grad_()
    w = torch.randn(1, 2, 32, 32, generator=gen, dtype=torch.float64)
    seen = torch.ones(32, 32, dtype=torch.bool).tril()
    grads = []
    for A in (K.wall_scores(q, k, g.cumsum(2), run=8), wall_logits(q, k, g)):
        grads.append(torch.autograd.grad((A * w)[..., seen].sum(), (q, k, g)))
    for got, want in zip(*grads):
        assert torch.isfinite(got).all() and torch.allclose(got, want, rtol=1e-9, atol=1e-12)


def test_wall_is_stable_where_exp_of_a_prefix_sum_overflows():
    """g = -5 for 3000 tokens: exp(-P_j) would be e^15000; every logit stays finite and equals the formula."""
    T = 3000
    gen = torch.Generator().manual_seed(3)
    q, k = torch.randn(1, 1, T, 4, generator=gen), torch.randn(1, 1, T, 4, generator=gen)
    Pk = torch.full((1, 1, T, 4), -5.0).cumsum(2)
    A = K.wall_scores(q, k, Pk)
    assert torch.isfinite(A).all()
    for i, j in ((2999, 2999), (2999, 2997), (1500, 1490), (65, 63)):
        want = (q[0, 0, i].double() * k[0, 0, j].double()).sum() * math.exp(-5.0 * (i - j))
        assert A[0, 0, i, j].item() == pytest.approx(want.item(), rel=1e-4, abs=1e-30)


def test_wall_with_gates_at_one_is_plain_attention_and_the_scalar_gate_is_unscaled():
    m = tiny_model('wall').eval()
    plain = tiny_model('none').eval()
    plain.load_state_dict({n: p for n, p in m.state_dict().items() if 'pe_layer' not in n})
    with torch.no_grad():
        for blk in m.transformer.h:
            blk.attn.pe_layer.gate.weight.zero_()
            blk.attn.pe_layer.gate.bias.fill_(60.0)  # log sigmoid(60) = -9e-27: g = 0 in float32 sums
        x = torch.randint(0, 37, (2, 20))
        assert torch.allclose(m(x)[0], plain(x)[0], atol=1e-5)
    gated = tiny_model('wall', n_layer=1, pos_options={'scalar_gate': True}).eval()
    attn, layer = gated.transformer.h[0].attn, gated.transformer.h[0].attn.pe_layer
    with torch.no_grad():
        layer.scalar.bias.uniform_(-2, 2)
        x = torch.randn(1, 10, 32)
        q, k, v = (t.view(1, 10, 4, 8).transpose(1, 2) for t in attn.c_attn(x).split(32, dim=2))
        g = F.logsigmoid(layer.gate(x)).view(1, 10, 4, 8).transpose(1, 2)
        Cs = F.logsigmoid(layer.scalar(x)).transpose(1, 2).double().cumsum(-1)
        A = wall_logits(q, k, g) / math.sqrt(8) + Cs[..., :, None] - Cs[..., None, :]  # the gate term unscaled
        A = A.masked_fill(~torch.ones(10, 10, dtype=torch.bool).tril(), float('-inf'))
        seen = []
        attn.c_proj.register_forward_hook(lambda mod, inp, out: seen.append(inp[0]))
        pe = gated.pe.at(0)
        attn(x, pe, pe.context(torch.arange(10), torch.arange(10), 10))
    want = (A.softmax(-1) @ v.double()).transpose(1, 2).reshape(1, 10, 32)
    assert torch.allclose(seen[0].double(), want, atol=1e-5)


def test_wall_init_is_near_plain_attention():
    layer = tiny_model('wall').transformer.h[0].attn.pe_layer
    assert (layer.gate.bias == 8).all() and abs(layer.gate.weight.std().item() - 0.02) < 0.005
    assert F.logsigmoid(torch.tensor(8.0)).item() == pytest.approx(-3.35e-4, rel=1e-2)


@pytest.mark.parametrize('scheme, opts, match', [
    ('path', {'rank': 0}, 'rank must be an integer >= 1'),
    ('path', {'conv': -1}, 'conv must be an integer >= 0'),
    ('path_fox', {'chunk': 2.5}, 'chunk must be an integer >= 1'),
    ('wall', {'gates': 3}, 'bad pos_options'),
])
def test_bad_options_say_what_to_do(scheme, opts, match):
    with pytest.raises(ValueError, match=match):
        tiny_model(scheme, pos_options=opts)


def test_path_refuses_a_rolling_cache():
    with pytest.raises(ValueError, match='keeps its own cache'):
        tiny_model('path').new_cache(recent=8)


@pytest.mark.parametrize('name, source', [('path', '2505.16381'), ('path_fox', '2505.16381'),
                                          ('wall', 'Tilde Research')])
def test_each_scheme_documents_its_source_and_has_a_config(name, source):
    import os
    from configurator import read_config_file
    from conftest import ROOT
    doc = P.REGISTRY[name].__doc__
    assert source in doc and 'flash-linear-attention' in doc and 'Option' in doc
    cfg = read_config_file(os.path.join(ROOT, 'config', f'{name}.py'))
    assert cfg == {'pos_encoding': name, 'out_dir': f'out-{name}'}


def test_wall_training_graph_does_not_grow_with_the_runs():
    """A compiled training step traces wall_scores in every layer: with gradients and T a multiple of 128 it takes
    all runs of 128 queries at once, so the traced graph has as many operations at T = 1024 (8 runs) as at 256 (2);
    a loop over the runs would add each run's tree to the graph."""
    counts = []
    for T in (256, 1024):
        m, x = tiny_model('wall', block_size=T, n_layer=1), torch.randint(0, 37, (1, T))
        torch._dynamo.reset()
        ex = torch._dynamo.explain(m)(x, x)
        counts.append(sum(len(g.graph.nodes) for g in ex.graphs))
    torch._dynamo.reset()
    assert counts[0] == counts[1] and ex.graph_break_count == 0, counts
