"""The kernels behind attention.attend's routes: dropout on every path (SDPA, dense, FlexAttention) and FlexAttention's
dropout == the dense path's, our causal block mask == create_block_mask, the dense bias kept float32 under autocast,
no-grad query chunks == one pass, v padded to q's width (PoPE), Shaw's value term without per-distance copies, one
compiled FlexAttention kernel per shape, qk_lift's and sdpa_bias's arithmetic (lifted columns, bfloat16 parts,
tables by distance, the logsumexp's gradient, a wide head's split) against the dense path. Which route a call takes:
tests/test_routes.py."""
import copy
import math
import os
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
import torch.nn.attention.flex_attention as fa

import attention as A
import positional
import positional as P
from conftest import forced_cuda_routes, off_init, tiny_config, tiny_model
from test_positional import qkv


@pytest.mark.parametrize('path', ['sdpa', 'dense', 'flex'])
def test_attention_dropout_on_every_path(path, monkeypatch):
    """Dropout changes the output in training on every path, keeps its expectation (the mean
    over many draws approaches the undropped attention), and drops the fraction asked for."""
    monkeypatch.setitem(A._compiled, 'flex', fa.flex_attention)
    monkeypatch.setattr(fa, '_validate_device', lambda *a: None)
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 1, 2, 12, 8).unbind(0)
    mod = None if path == 'sdpa' else (lambda score, b, h, i, j: score - 0.1 * (i - j))
    backend = 'dense' if path == 'sdpa' else path
    ref = A.attend(q, k, v, mod, backend=backend)
    draws = torch.stack([A.attend(q, k, v, mod, backend=backend, dropout_p=0.3) for _ in range(400)])
    assert (draws[0] - ref).abs().max() > 1e-2
    assert (draws.mean(0) - ref).abs().mean() < 0.04  # (without the 1/(1-p) rescale: 0.16)
    keep = A.dropout_keep(torch.tensor(12345), 0.3, torch.arange(4)[:, None, None, None],
                          torch.arange(8)[:, None, None], torch.arange(64)[:, None], torch.arange(64))
    assert keep.float().mean().item() == pytest.approx(0.7, abs=0.01)


def test_flex_dropout_equals_dense_dropout(monkeypatch):
    """With the same seed FlexAttention and the dense path drop the same keys and rescale alike."""
    monkeypatch.setitem(A._compiled, 'flex', fa.flex_attention)
    monkeypatch.setattr(fa, '_validate_device', lambda *a: None)
    q, k, v = torch.randn(3, 2, 2, 20, 8).unbind(0)
    mod = lambda score, b, h, i, j: score + 0.05 * (j - i) * (h + 1)  # noqa: E731
    outs = []
    for backend in ('flex', 'dense'):
        torch.manual_seed(3)
        outs.append(A.attend(q, k, v, mod, backend=backend, dropout_p=0.4))
    assert torch.allclose(outs[0], outs[1], atol=1e-5)


def test_causal_block_mask_equals_create_block_mask():
    for Tq, Tk in [(64, 64), (300, 300), (1, 300), (100, 356), (256, 1024), (129, 129)]:
        ours = A.causal_block_mask(Tq, Tk, 'cpu')
        off = Tk - Tq
        ref = fa.create_block_mask(lambda b, h, i, j: j <= i + off, None, None, Tq, Tk, device='cpu')
        assert torch.equal(ours.to_dense(), ref.to_dense())
        assert torch.equal(ours.full_kv_num_blocks, ref.full_kv_num_blocks)


def test_dense_bias_stays_float32_under_autocast():
    """Two keys biased -500.3 and -501.2: their softmax weights depend on the 0.9 between them,
    which a bf16 bias (spacing 2 at 500) rounds away (it became 0.88/0.12 instead of 0.71/0.29)."""
    q = torch.zeros(1, 1, 1, 8)
    k = torch.zeros(1, 1, 2, 8)
    v = torch.tensor([1.0, 0.0]).view(1, 1, 2, 1).expand(1, 1, 2, 8).contiguous()
    table = torch.tensor([-501.2, -500.3])  # bias by key index

    def mod(score, b, h, i, j):
        return score + table[j]
    with torch.autocast('cpu', dtype=torch.bfloat16):
        y = A.attend(q.bfloat16(), k.bfloat16(), v.bfloat16(), mod, backend='dense')
    want = 1 / (1 + math.exp(0.9))  # weight of key 0
    assert y[0, 0, 0, 0].item() == pytest.approx(want, abs=1e-2)
    assert A.dense_bias(mod, 1, 1, 1, 2, 'cpu').dtype == torch.float32


def test_a_bias_tensor_equals_its_score_mod_on_every_path(monkeypatch):
    """attend(..., mod=A) with A a float32 bias tensor [B, H, Tq, Tk] gives what the score_mod
    score + A[b, h, i, j] gives: the same bits on the dense path (training with dropout, sinks; a
    window's no-grad query chunks, which slice A) and on FlexAttention, and the same gradient for A."""
    monkeypatch.setitem(A._compiled, 'flex', fa.flex_attention)
    monkeypatch.setattr(A, 'DENSE_CHUNK_BYTES', 2048)  # query chunks of a few rows
    gen = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(3, 2, 3, 24, 8, generator=gen).unbind(0)
    bias = torch.randn(2, 3, 24, 24, generator=gen)
    window = A.Mask(window=7)
    for kw in (dict(dropout_p=0.2), dict(sink_logits=torch.randn(3, generator=gen)), dict(mask=window)):
        outs, grads = [], []
        for form in ('tensor', 'mod'):
            A_ = bias.clone().requires_grad_()
            mod = A_ if form == 'tensor' else (lambda score, b, h, i, j, t=A_: score + t[b, h, i, j])
            torch.manual_seed(1)
            y = A.attend(q, k, v, mod, backend='dense', **kw)
            y.square().sum().backward()
            outs.append(y.detach())
            grads.append(A_.grad)
        assert torch.equal(outs[0], outs[1]) and torch.equal(grads[0], grads[1]), kw
        assert grads[0].abs().sum() > 0
    with torch.no_grad():
        for mask in (A.CAUSAL, window):
            chunked = A.attend(q, k, v, bias, backend='dense', mask=mask)
            assert torch.equal(chunked, A.attend(q, k, v, lambda s, b, h, i, j: s + bias[b, h, i, j],
                                                 backend='dense', mask=mask))
            assert torch.allclose(A.attend(q, k, v, bias, backend='flex', mask=mask), chunked, atol=1e-5)


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


def test_shaw_value_term_saves_no_per_distance_copies():
    """Shaw's value term used to keep k+1 float32 copies of the keys [B, H, T, d] for backward
    (about 19 GB at GPT-2 size); from shifted views it keeps q and k once."""
    from conftest import tiny_config
    pe = positional.REGISTRY['shaw'](tiny_config('shaw', n_embd=64, n_head=2), max_distance=16)
    layer = pe.new_layer()
    q, k = (torch.randn(2, 2, 128, 32, requires_grad=True) for _ in range(2))
    pos = torch.arange(128)
    ctx = pe.context(pos, pos)
    mod = pe.score_mod(q, k, ctx, layer)
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        g = pe.value_mod(q, k, ctx, layer, mod, A.Attender())
        out = g(torch.randn(2, 2, 128, requires_grad=True))
    out.sum().backward()
    assert layer.rel_v.grad is not None and q.grad is not None
    assert sum(storages.values()) < 4 * q.numel() * 4  # the old code: > 16 copies


def test_flex_keeps_one_kernel_per_shape_past_dynamo_default_limit():
    """An evaluation suite calls FlexAttention at dozens of shapes (lengths x batch sizes). Past
    dynamo's default of 8 recompilations the compiled kernel used to fall back to eager
    FlexAttention, which materialises every score (and warns); each shape must stay compiled
    (model.py raises the limit to FLEX_SHAPES)."""
    import subprocess
    import sys
    code = """if True:
        import torch, sys
        torch._dynamo.config.recompile_limit = 2  # dynamo's default is 8; 2 keeps this test short
        sys.path.insert(0, 'tests')
        from conftest import tiny_model
        # head dim 32: torch 2.13's compiled CPU FlexAttention is wrong (NaN) at T = 8, 24, 40
        # with head dim 8 or 16, a torch bug outside what this test checks
        flex = tiny_model('alibi', attn_backend='flex', n_embd=64, n_head=2).eval()
        dense = tiny_model('alibi', attn_backend='dense', n_embd=64, n_head=2).eval()
        with torch.no_grad():
            for T in range(3, 7):  # 4 shapes
                x = torch.randint(0, 37, (1, T))
                assert torch.allclose(flex(x)[0], dense(x)[0], atol=1e-5), T
        print('ok')
    """
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, '-c', code], cwd=root, capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, OMP_NUM_THREADS='1'))
    assert r.returncode == 0 and 'ok' in r.stdout, r.stderr[-3000:]
    assert 'recompile_limit' not in r.stderr and 'without torch.compile' not in r.stderr, r.stderr[-3000:]


def test_flex_gets_small_tiles_on_cuda_where_the_score_mod_reads_a_table(monkeypatch):
    """A bias tensor, and the biases whose mod reads a float32 table at each logit (DeBERTa's two, FIRE's in
    training), get TABLE_TILES on CUDA, through logit scaling too: Inductor's default tiles need more shared
    memory than an H200 block has (docs/gpu.md). Other mods, and every mod on CPU, keep Inductor's choice.
    attend hands the options to FlexAttention with and without the logsumexp."""
    pos = torch.arange(8)
    q, k, v = qkv(1, 4, 8, 8, 8)

    def mod_of(name):
        pe = positional.REGISTRY[name](tiny_config(name))
        return pe.score_mod(q, k, pe.context(pos, pos), pe.new_layer())
    mods = {name: mod_of(name) for name in ('deberta', 'fire', 'alibi', 't5')}
    with torch.no_grad():  # FIRE without gradients evaluates its MLP per logit: no table
        mods['fire_no_grad'] = mod_of('fire')
    table, ones = torch.randn(1, 4, 8, 8), torch.ones(4, 8)
    for mod in (A.Bias(tensor=table), mods['deberta'], mods['fire'], A.scale_logits(q, mods['deberta'], ones)[1]):
        assert A.flex_tiles('cuda', mod) == A.TABLE_TILES and A.flex_tiles('cpu', mod) is None
    for mod in (mods['alibi'], mods['t5'], mods['fire_no_grad'], A.scale_logits(q, mods['alibi'], ones)[1], None):
        assert A.flex_tiles('cuda', mod) is None

    seen = []

    def spy(q, k, v, **kw):
        seen.append(kw['kernel_options'])
        return (q, SimpleNamespace(lse=q.new_zeros(q.shape[:3]))) if 'return_aux' in kw else q
    monkeypatch.setitem(A._compiled, 'flex', spy)
    monkeypatch.setattr(A, 'FLEX_LSE_ON_CPU', True)
    monkeypatch.setattr(A, 'flex_tiles', lambda device_type, bias: (device_type, bias.tensor is not None))
    A.attend(q, k, v, table, backend='flex')
    A.attend(q, k, v, mods['alibi'], backend='flex', sink_logits=torch.zeros(4))
    assert seen == [('cpu', True), ('cpu', False)]


@pytest.mark.parametrize('window', [None, 5])
def test_a_grid_gives_its_table_per_chunk_as_the_mod_at_each_logit(window, monkeypatch):
    """FIRE without gradients on the dense path, its bias from its grid form (FIRE.grid: the hidden units of every pair
    and one product; on attention.TABULATE_ON's devices, the CPU here) against its score_mod at each logit: the same
    attention output, in chunks of query rows (dense_chunk_bytes made small) past the training length, where the
    normaliser moves with the query; and the table itself, the rows' constant included (the output layer's bias,
    which softmax cancels)."""
    pe = positional.REGISTRY['fire'](tiny_config('fire'), init_L=4.0)
    layer, T = pe.new_layer(), 40
    pos = torch.arange(T)
    q, k, v = qkv(2, 4, T, T, 8)
    mask = A.Mask(window, None) if window else A.CAUSAL
    monkeypatch.setattr(A, 'DENSE_CHUNK_BYTES', 4 * 2 * 4 * 8 * T)
    calls, ys, tables = [], {}, {}
    for on in ((), ('cpu',)):
        monkeypatch.setattr(A, 'TABULATE_ON', on)
        with torch.no_grad():
            mod = pe.score_mod(q, k, pe.context(pos, pos), layer)
            grid = mod.grid
            mod.grid = lambda i, j: calls.append(len(i)) or grid(i, j)
            ys[on] = A.attend(q, k, v, mod, backend='dense', mask=mask)
            tables[on] = A.dense_bias(mod, 2, 4, T, T, 'cpu', mask)
    assert len(calls) > 2 and sum(calls) == 2 * T  # each chunk of rows once, and the whole table
    assert (ys[('cpu',)] - ys[()]).abs().max() < 1e-5 * ys[()].abs().max()
    seen = tables[()] > float('-inf')
    assert torch.equal(seen, tables[('cpu',)] > float('-inf'))
    assert (tables[('cpu',)][seen] - tables[()][seen]).abs().max() < 1e-5 * tables[()][seen].abs().max()


def test_flex_attention_starts_a_graph_of_its_own_on_cuda(monkeypatch):
    """Under torch.compile on CUDA a FlexAttention layer breaks the model's graph before its kernel (what compiled
    on an H200, attention.FLEX_OWN_GRAPH); on the CPU, and with the flag off, the model stays one graph. The
    break itself is checked on the CPU by letting flex_own_graph answer as on CUDA."""
    assert A.flex_own_graph('cuda') and not A.flex_own_graph('cpu')
    x = torch.randint(0, 37, (2, 64))
    counts = {}
    for own in (False, True):
        monkeypatch.setattr(A, 'flex_own_graph', lambda device_type: own)
        torch._dynamo.reset()
        m = tiny_model('alibi', block_size=64, attn_backend='flex').eval()
        with torch.no_grad():  # (FlexAttention has no backward on the CPU)
            ex = torch._dynamo.explain(m)(x, x)
        counts[own] = (ex.graph_count, ex.graph_break_count)
    torch._dynamo.reset()
    assert counts[False] == (1, 0), counts
    assert counts[True][1] >= m.config.n_layer and counts[True][0] > m.config.n_layer, counts


LIFTED = [('alibi', {}), ('grape_a', {}), ('grape_a', {'variant': 'key'}), ('grape_a', {'variant': 'query'}),
          ('fox', {})]


def mod_of(pe, layer, q, k, v, ctx):
    """The score_mod a scheme's layer hands attend: its score_mod, or the one its `attention` hook passes (FoX's,
    of a layer input x drawn here)."""
    if not pe.owns_attention:
        return pe.score_mod(q, k, ctx, layer)
    seen = []
    att = type('Seen', (), {'uses_fla': lambda self, q, cache: False,
                            '__call__': lambda self, q, k, v, mod: seen.append(mod) or v})()
    # bfloat16's values in any dtype, so that a bfloat16 layer and a float64 one see the same input
    x = torch.randn(q.size(0), q.size(2), pe.n_embd, generator=torch.Generator().manual_seed(3)).bfloat16().to(q.dtype)
    pe.attention(q, k, v, x, ctx, layer, None, att)
    return seen[0]


@pytest.mark.parametrize('name, opts', LIFTED)
def test_qk_lift_equals_the_bias_path(name, opts):
    """The qk_lift route (the mod's factors as extra columns of q and k, SDPA with q's own scale) against the dense
    path with the mod, in float64 with weights moved off their init: the output and the gradients of q, k, v and
    every scheme parameter. The mods compute their biases in float32, so both sides carry float32's rounding of
    the bias (about 1e-7 of it); a factor of the wrong sign or a forgotten key term misses by far more."""
    pe, layer = off_init(name, opts)
    B, H, T, d = 2, 4, 12, 8
    q, k, v = (torch.randn(B, H, T, d, dtype=torch.float64, requires_grad=True) for _ in range(3))
    pos = torch.arange(T)
    w = torch.randn(B, H, T, d, dtype=torch.float64)
    leaves = [q, k, v, *(layer.parameters() if layer is not None else [])]
    outs = []
    for lifted in (False, True):
        mod = mod_of(pe, layer, q, k, v, pe.context(pos, pos))
        if lifted:
            q2, k2, v2 = A.lift_qk(q, k, v, *mod.factors())
            y = A._sdpa(q2, k2, v2, 0.0, A.CAUSAL, d ** -0.5)[..., :d]
        else:
            y = A._dense(q, k, v, mod, 0.0, None, False, A.Attender())[0]
        outs.append((y, torch.autograd.grad((y * w).sum(), leaves)))
    (y0, g0), (y1, g1) = outs
    assert (y1 - y0).abs().max() < 1e-5 * y0.abs().max()
    for a, b in zip(g1, g0):
        assert (a - b).abs().max() <= 1e-5 * b.abs().max(), (a - b).abs().max()
    with torch.no_grad():  # the key term matters: without it the output moves
        fq, fk = mod.factors()
        y_far = A._sdpa(*A.lift_qk(q, k, v, fq, -fk), 0.0, A.CAUSAL, d ** -0.5)[..., :d]
    assert (y_far - y0).abs().max() > 1e-3 * y0.abs().max()


def test_qk_lift_keeps_float32s_bias_in_bfloat16():
    """In bfloat16 each factor rides as three bfloat16-exact parts, so the columns' products, summed in float32 as
    the kernels do, give the bias to float32's precision; one bfloat16 column per factor would be off by ~1 at
    ALiBi's m * j with j in the thousands. And SDPA's scale stays q's own head dim's."""
    g = torch.Generator().manual_seed(0)
    B, H, T, d = 1, 2, 4000, 16
    q, k, v = (torch.zeros(B, H, T, d, dtype=torch.bfloat16) for _ in range(3))
    fq = torch.rand(1, H, 1, 2, generator=g)  # a slope-like factor and another
    fk = torch.arange(T, dtype=torch.float32).view(1, 1, T, 1) * torch.tensor([1.0, 0.37])
    want = (fq.double() * fk.double()).sum(-1)  # [1, H, T]: q_0 . k_j's lifted part, float64
    q2, k2, v2 = A.lift_qk(q, k, v, fq, fk)
    assert q2.dtype == k2.dtype == v2.dtype == torch.bfloat16 and q2.size(-1) % 8 == 0 and v2.size(-1) == q2.size(-1)
    got = (q2[:, :, :1].float() * k2.float()).sum(-1).double() * d ** -0.5  # exact products, float32-like sums
    assert (got - want).abs().max() <= 2 ** -22 * want.abs().max()
    whole = (fq.bfloat16().float().double() * d ** 0.5 * fk.bfloat16().double()).sum(-1) * d ** -0.5
    assert (whole - want).abs().max() > 0.5  # one bfloat16 column per factor


@pytest.mark.parametrize('name, opts', LIFTED)
def test_bfloat16_training_of_a_factored_bias_keeps_its_gradients(name, opts, monkeypatch):
    """In bfloat16 training (T = 1024, 4 heads of 8) each factored bias takes a route (as on CUDA, its kernels run
    on the CPU) whose gradients of q, k, v and every scheme parameter are as close to float64's dense path as the
    dense path in bfloat16 is (within 2x, +1e-3). ALiBi takes qk_lift. Through qk_lift a learned factor's gradient
    is a small difference of sums as large as the positions (GRAPE-A's gates times positions; FoX's cumulative
    gates, summed back over the sequence), which SDPA's backward rounds to bfloat16: parameter gradients off by
    10-300%. So factors that need a gradient stay off qk_lift in bfloat16 training: GRAPE-A takes sdpa_bias with
    its table, FoX (off its fla kernel) FlexAttention, which the dense path stands in for here."""
    pe, layer = off_init(name, opts)
    B, H, T, d = 1, 4, 1024, 8
    g = torch.Generator().manual_seed(5)
    q0, k0, v0 = (torch.randn(B, H, T, d, generator=g) for _ in range(3))
    w = torch.randn(B, H, T, d, dtype=torch.float64, generator=g)
    pos = torch.arange(T)

    def grads(dtype, how):  # how: 'dense', or a route name forced, or None for the route attend picks
        lay = copy.deepcopy(layer)
        if lay is not None:
            lay.to(torch.float64 if dtype == torch.float64 and not pe.owns_attention else torch.float32)
        q, k, v = (t.to(dtype).requires_grad_() for t in (q0, k0, v0))
        ctx = pe.context(pos, pos)
        ctx.consecutive = True
        mod = mod_of(pe, lay, q, k, v, ctx)
        way = A.route(A.Call('cuda', bias=mod, dtype=dtype)) if how is None else how
        if way == 'qk_lift':
            y = A._sdpa(*A.lift_qk(q, k, v, *mod.factors()), 0.0, A.CAUSAL, d ** -0.5)[..., :d]
        elif way == 'sdpa_bias':
            y = A._sdpa_bias(q, k, v, A.bias_table(mod, T), 0.0, A.CAUSAL)
        else:
            y = A._dense(q, k, v, mod, 0.0, None, False, A.Attender())[0]
        leaves = [q, k, v, *(lay.parameters() if lay is not None else [])]
        return way, [t.double() for t in torch.autograd.grad((y.double() * w).sum(), leaves)]
    _, want = grads(torch.float64, 'dense')
    err = lambda got: max((a - b).norm().item() / b.norm().item() for a, b in zip(got, want))  # noqa: E731
    floor = err(grads(torch.bfloat16, 'dense')[1])
    way, got = grads(torch.bfloat16, None)
    assert way == {'alibi': 'qk_lift', 'grape_a': 'sdpa_bias', 'fox': 'flex'}[name]
    assert err(got) <= 2 * floor + 1e-3, (err(got), floor)
    if name != 'alibi':  # what staying off qk_lift avoids
        assert err(grads(torch.bfloat16, 'qk_lift')[1]) > 0.05


WHOLE = [('t5', {}), ('kerple_log', {}), ('kerple_power', {}), ('sandwich', {}), ('fire', {'init_L': 4.0}),
         ('grape_a', {}), ('grape_a', {'variant': 'key'}), ('grape_a', {'variant': 'query'}),
         ('deberta', {'position_buckets': 4, 'max_relative_positions': 9}), ('shaw', {'max_distance': 4})]


def test_toeplitz_table_and_its_gradient_per_diagonal():
    """toeplitz(vec, T)[h, i, j] = vec[h, i - j] on and below the diagonal, and the gradient it gives vec is, per
    distance d, the sum of the table's gradient over the entries (r, r - d), counted one by one in float64."""
    vec = torch.randn(3, 11, dtype=torch.float64, requires_grad=True)
    T = 7
    i, j = torch.arange(T)[:, None], torch.arange(T)
    low = j <= i
    t = A.toeplitz(vec, T)
    assert t.shape == (3, T, T) and torch.equal(t[:, low], vec[:, (i - j).clamp(min=0)][:, low])
    g = torch.randn(3, T, T, dtype=torch.float64) * low
    t.backward(g)
    want = torch.zeros(3, 11, dtype=torch.float64)
    for d in range(T):
        for r in range(d, T):
            want[:, d] += g[:, r, r - d]
    assert (vec.grad - want).abs().max() < 1e-12


def test_tables_of_a_term_per_query_or_key_and_distance_and_their_gradients():
    """query_distance_table(A)[b, i, j] = A[b, i, i - j] and key_distance_table(A)[b, i, j] = A[b, j, i - j] on and
    below the diagonal, read one by one; the gradient each gives A is the table's at the entry that read it, and 0 at
    the distances no pair reaches (row i of a query term has distances 0..i, row j of a key term 0..T-1-j)."""
    T = 7
    A_ = torch.randn(2, T, T, dtype=torch.float64, requires_grad=True)
    g = torch.randn(2, T, T, dtype=torch.float64).tril()
    for fn, row in ((A.query_distance_table, lambda i, j: i), (A.key_distance_table, lambda i, j: j)):
        t = fn(A_)
        want = torch.zeros(2, T, T, dtype=torch.float64)
        for i in range(T):
            for j in range(i + 1):
                assert torch.equal(t[:, i, j], A_[:, row(i, j), i - j])
                want[:, row(i, j), i - j] += g[:, i, j]
        grad, = torch.autograd.grad(t, A_, g)
        assert torch.equal(grad, want), fn.__name__


@pytest.mark.parametrize('window', [None, 5])
def test_sdpa_bias_returns_the_logsumexp_with_its_gradient(window):
    """_sdpa_bias(need_lse=True) (BiasedLse, the CPU flash kernel and its backward here, as the memory-efficient
    kernel on CUDA) -> each row's output and logsumexp, against softmax written out in float64: both values, and
    the gradients of q, k, v and the bias [1, H, T, T] under a loss that reads both, the logsumexp's through the
    extra column its backward takes; and under a loss that reads the output alone."""
    g = torch.Generator().manual_seed(0)
    B, H, T, d = 2, 3, 12, 8
    q, k, v = (torch.randn(B, H, T, d, dtype=torch.float64, generator=g, requires_grad=True) for _ in range(3))
    bias = torch.randn(1, H, T, T, dtype=torch.float64, generator=g, requires_grad=True)
    mask = A.Mask(window, None) if window else A.CAUSAL
    gy, gl = torch.randn(B, H, T, d, dtype=torch.float64, generator=g), torch.randn(B, H, T, dtype=torch.float64,
                                                                                   generator=g)
    for with_lse in (True, False):
        s = (q @ k.transpose(-1, -2) / math.sqrt(d) + bias).masked_fill(~mask.visibility(T, T, 'cpu'), float('-inf'))
        lse_want = s.logsumexp(-1)
        y_want = (s - lse_want[..., None]).exp() @ v
        y, lse = A._sdpa_bias(q, k, v, bias, 0.0, mask, need_lse=True)
        assert (y - y_want).abs().max() < 1e-12 and (lse - lse_want).abs().max() < 1e-12
        loss = (y * gy).sum() + ((lse * gl).sum() if with_lse else 0)
        want = (y_want * gy).sum() + ((lse_want * gl).sum() if with_lse else 0)
        got = torch.autograd.grad(loss, (q, k, v, bias))
        for a, b in zip(got, torch.autograd.grad(want, (q, k, v, bias))):
            assert a.shape == b.shape and (a - b).abs().max() < 1e-12 * (1 + b.abs().max()), (with_lse, a - b)


def test_the_logsumexp_route_calls_cudas_kernels_as_their_checks_allow():
    """BiasedLse's calls of CUDA's memory-efficient kernel, forward and backward, on the meta device (the kernels'
    own shape and argument checks, run on a CPU): at a length that is no multiple of 32 (the kernel pads each row's
    logsumexp) with a bias broadcast over the batch and its rows padded to 16, the output, the logsumexp and every
    gradient come back in their inputs' shapes."""
    B, H, T, d = 2, 4, 1000, 64
    q, k, v = (torch.empty(B, H, T, d, device='meta', dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    b0 = torch.empty(1, H, T, T, device='meta', dtype=torch.bfloat16, requires_grad=True)
    bias = A.F.pad(b0, (0, -T % 16))[..., :T].expand(B, H, T, T)
    y, lse = A.BiasedLse.apply(q, k, v, bias, d ** -0.5)
    assert y.shape == q.shape and lse.shape == (B, H, T) and lse.dtype == torch.float32
    backward, handed = torch.ops.aten._scaled_dot_product_efficient_attention_backward, []

    def record(grad_out, q, k, v, bias, out, *args, **kwargs):
        handed.append(out)
        return backward(grad_out, q, k, v, bias, out, *args, **kwargs)
    with mock.patch.object(torch.ops.aten, '_scaled_dot_product_efficient_attention_backward', record):
        grads = torch.autograd.grad((y.float().sum(), lse.sum()), (q, k, v, b0))
    assert [g.shape for g in grads] == [t.shape for t in (q, k, v, b0)]
    # the kernel takes out's batch and head strides but reads its rows head_dim_value * num_heads apart
    # (kernel_backward.h, o_strideM): out must be laid out as [B, T, H, D]
    out, = handed
    assert out.stride(-1) == 1 and out.stride(2) == out.size(1) * out.size(3), out.stride()


@pytest.mark.parametrize('name, opts', WHOLE)
@pytest.mark.parametrize('window', [None, 5])
def test_sdpa_bias_equals_the_bias_path(name, opts, window):
    """The sdpa_bias route (the mod's bias table, or its per-distance vector laid out by toeplitz, as SDPA's mask)
    against the dense path with the same mod, in float64 with weights moved off their init, causal and in a sliding
    window: the output and the gradients of q, k, v and every scheme parameter. Where the kernel writes garbage
    into the bias gradient of hidden logits (CUDA's skipped tiles), none of it reaches the parameters."""
    pe, layer = off_init(name, opts)
    B, H, T, d = 2, 4, 12, 8
    q, k, v = (torch.randn(B, H, T, d, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = A.Mask(window, None) if window else A.CAUSAL
    pos = torch.arange(T)
    ctx = pe.context(pos, pos)
    ctx.consecutive = True
    w = torch.randn(B, H, T, d, dtype=torch.float64)
    pe.double()  # (DeBERTa's relative embeddings are the scheme's own)
    leaves = [q, k, v, *(layer.parameters() if layer is not None else []), *pe.parameters()]
    sdpa, outs = A.F.scaled_dot_product_attention, []

    def garbage_above(q, k, v, attn_mask, dropout_p, scale=None):  # NaN in the mask's gradient wherever it is -inf
        if attn_mask.requires_grad:
            attn_mask.register_hook(lambda g: torch.where(attn_mask == float('-inf'), float('nan'), g))
        return sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale)
    for whole in (False, True):
        mod = pe.score_mod(q, k, ctx, layer)
        if whole:
            assert A.route(A.Call('cuda', bias=mod, dtype=torch.bfloat16)) == 'sdpa_bias'
            A.F.scaled_dot_product_attention = garbage_above
            try:
                y = A._sdpa_bias(q, k, v, A.bias_table(mod, T), 0.0, mask)
            finally:
                A.F.scaled_dot_product_attention = sdpa
        else:
            y = A._dense(q, k, v, mod, 0.0, None, False, A.Attender(mask))[0]
        outs.append((y, torch.autograd.grad((y * w).sum(), leaves, allow_unused=True)))
    (y0, g0), (y1, g1) = outs
    assert (y1 - y0).abs().max() < 1e-6 * y0.abs().max()
    for a, b in zip(g1, g0):
        if b is None:  # (sandwich has no parameters)
            assert a is None
            continue
        # (+1e-6: FIRE's output bias shifts whole rows, so its gradient is 0 but for the dense path's float32 bias)
        assert torch.isfinite(a).all() and (a - b).abs().max() <= 1e-6 * b.abs().max() + 1e-6, (a - b).abs().max()


def test_bfloat16_parts_survive_torch_compile():
    """round_bf16 is torch's own rounding to bfloat16 (ties to even, negative values too), and under torch.compile
    the parts of split_bf16 stay bfloat16-exact and sum to x, with x's gradient whole: Inductor folds
    x.to(torch.bfloat16).float() into x, which would leave the first part unrounded and the others zero."""
    g = torch.Generator().manual_seed(0)
    x = torch.cat(((torch.rand(4096, generator=g) - 0.5) * 3000, torch.tensor([1 + 2 ** -8, 1 + 3 * 2 ** -8, -2.5])))
    assert torch.equal(A.round_bf16(x), x.bfloat16().float())
    x.requires_grad_()
    torch._dynamo.reset()
    parts = torch.compile(A.split_bf16)(x)
    torch._dynamo.reset()
    assert all(torch.equal(p, p.bfloat16().float()) for p in parts) and parts[1].abs().max() > 0
    assert torch.equal(parts[0] + parts[1] + parts[2], x.detach())
    grad, = torch.autograd.grad(sum(3 * p for p in parts).sum(), x)
    assert torch.equal(grad, torch.full_like(x, 3.0))


@pytest.mark.parametrize('window', [None, 5])
def test_a_head_wider_than_the_fused_kernels_trains_through_its_columns_as_a_bias(window, monkeypatch):
    """q and k wider than SDPA's fused kernels take (FUSED_MAX_WIDTH; XL's 64 + 768 columns), v narrower: in training
    on CUDA under 'auto' attend splits them (route 'sdpa_bias'), the columns past v's width giving a bias table as
    their product at the whole head's scale. Against SDPA on the whole head (the 'sdpa' route), in float64, causal
    and in a sliding window: the output and the gradients of q, k and v (route's rule: tests/test_routes.py)."""
    W = A.FUSED_MAX_WIDTH
    g = torch.Generator().manual_seed(0)
    B, H, T, D, Dv = 2, 2, 12, W + 8, 8
    q, k = (torch.randn(B, H, T, D, dtype=torch.float64, generator=g, requires_grad=True) for _ in range(2))
    v = torch.randn(B, H, T, Dv, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(B, H, T, Dv, dtype=torch.float64, generator=g)
    mask = A.Mask(window, None) if window else A.CAUSAL
    outs = []
    for forced in (False, True):
        if forced:
            forced_cuda_routes(monkeypatch)
            seen = []
            monkeypatch.setattr(A, 'wide_split', lambda *a, real=A.wide_split: seen.append(1) or real(*a))
        y = A.attend(q, k, v, mask=mask)
        outs.append((y, torch.autograd.grad((y * w).sum(), (q, k, v))))
    assert seen == [1]
    (y0, g0), (y1, g1) = outs
    assert (y1 - y0).abs().max() < 1e-12 * y0.abs().max()
    for a, b in zip(g1, g0):
        assert (a - b).abs().max() < 1e-12 * b.abs().max()


