"""The CUDA path's failure modes, caught on CPU: FlexAttention's backward graph for every
score_mod (built and validated as Inductor does before it writes the CUDA kernel), graph
breaks in compiled forwards, bf16 autocast, dropout on every attention path, the padded
vocabulary, and one peak-FLOPs table."""
import math
import os

import pytest
import torch
import torch.nn.attention.flex_attention as fa

import attention as A
import positional
import runtime
from conftest import (SCHEMES, Validated, assert_same_grads, attend_mods, flex_and_dense_grads,
                      has_attention_mod, tiny_model, validating_backend)

# schemes that hand attention.attend a score_mod or value_mod (stick-breaking, with its own attention, does not)
MOD_SCHEMES = [s for s in SCHEMES if has_attention_mod(s) or has_attention_mod(s, train=True)]


def _has_training_mod(scheme):
    return any(mod is not None or vmod is not None for mod, vmod in attend_mods(scheme, train=True))


@pytest.mark.parametrize('scheme', MOD_SCHEMES)
def test_flex_backward_graph_validates_and_gradients_equal_dense(scheme, flex_with_grad_on_cpu, monkeypatch):
    """Training through FlexAttention, with attention dropout: (1) Inductor accepts the joint
    graph of every score_mod (two flex calls per layer: dropout's kept-keys pass and the lse
    pass); (2) FlexAttention's own (eager) backward gives the dense path's loss and gradients."""
    x = torch.randint(0, 37, (2, 64), generator=torch.Generator().manual_seed(0))
    counts = []
    m = tiny_model(scheme, block_size=64, attn_backend='flex', dropout=0.1)
    with pytest.raises(Validated):
        _, loss = torch.compile(m, backend=validating_backend(counts))(x, x)
        loss.backward()
    assert len(counts) == (2 * m.config.n_layer if _has_training_mod(scheme) else 0)

    monkeypatch.setitem(A._compiled, 'flex', fa.flex_attention)  # eager flex: its backward runs on CPU
    assert_same_grads(flex_and_dense_grads(lambda be: tiny_model(scheme, block_size=64, attn_backend=be,
                                                                  dropout=0.1), x))


@pytest.mark.parametrize('scheme', SCHEMES)
def test_compiled_forward_has_no_graph_breaks(scheme):
    """A training forward (grad, the backend train.py uses) and a no-grad FlexAttention forward
    (eval's long lengths) compile to one graph: no int()/.item() host sync, no Python state
    mutated inside forward."""
    x = torch.randint(0, 37, (2, 64))
    for backend, grad in (('auto', True), ('flex', False)):
        torch._dynamo.reset()
        m = tiny_model(scheme, block_size=64, attn_backend=backend)
        m.train(grad)
        with torch.set_grad_enabled(grad):
            ex = torch._dynamo.explain(m)(x, x)
        assert ex.graph_break_count == 0, (backend, [str(b.reason)[:200] for b in ex.break_reasons])
        assert ex.graph_count == 1
    torch._dynamo.reset()


@pytest.mark.parametrize('scheme', SCHEMES)
def test_bf16_autocast_train_step_and_kv_cache(scheme):
    m = tiny_model(scheme)
    opt = m.configure_optimizers(0.0, 3e-3, (0.9, 0.99), 'cpu')
    x = torch.randint(0, 37, (4, 17), generator=torch.Generator().manual_seed(0))
    with torch.autocast('cpu', dtype=torch.bfloat16):
        logits, loss = m(x[:, :-1], x[:, 1:])
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)
    opt.step()
    m.eval()
    T = 16 if m.pe.max_len else 30
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        full = m(x[:, :1].repeat(1, T) if T > 17 else x[:, :T])[0].float()
        xs = x[:, :1].repeat(1, T) if T > 17 else x[:, :T]
        cache = m.new_cache()
        steps = [m(xs[:, :5], cache=cache)[0]] + [m(xs[:, t:t + 1], cache=cache)[0] for t in range(5, T)]
    decoded = torch.cat(steps, 1).float()
    assert (decoded - full).abs().max() < 0.1  # bf16 matmuls; the biases themselves are float32


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


def test_padded_vocab_is_never_scored_or_sampled():
    m = tiny_model('rope', vocab_size=50, vocab_multiple=64)
    assert m.lm_head.weight.shape[0] == 64 and m.transformer.wte.weight.shape[0] == 64
    x = torch.randint(0, 50, (2, 16))
    logits, loss = m(x, x)
    assert torch.isinf(logits[..., 50:]).all() and torch.isfinite(logits[..., :50]).all()
    ref = torch.nn.functional.cross_entropy(logits[..., :50].reshape(-1, 50), x.reshape(-1))
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6)
    torch.manual_seed(0)
    out = m.eval().generate(x[:, :2], 200, temperature=5.0)  # hot: every real id gets sampled
    assert out.max() < 50 and len(out.unique()) > 40


def test_peak_flops_table():
    assert runtime.peak_flops('NVIDIA H100 80GB HBM3') == 989e12
    assert runtime.peak_flops('NVIDIA H100 PCIe') == 756e12
    assert runtime.peak_flops('NVIDIA H200') == 989e12
    assert runtime.peak_flops('NVIDIA A100-SXM4-80GB') == 312e12
    assert runtime.peak_flops('Tesla T4') is None


def test_split_batch_covers_the_global_batch():
    for rows, world, bs in [(32, 1, 32), (32, 2, 32), (32, 3, 32), (512, 8, 16), (11, 2, 3), (7, 7, 1)]:
        spans = []
        for r in range(world):
            row0, micro = runtime.split_batch(rows, world, r, bs)
            assert max(micro) <= bs and min(micro) >= 1 and max(micro) - min(micro) <= 1
            spans.append((row0, row0 + sum(micro)))
        assert spans[0][0] == 0 and spans[-1][1] == rows
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))  # contiguous, no overlap
        sizes = [b - a for a, b in spans]
        assert max(sizes) - min(sizes) <= 1
    with pytest.raises(ValueError):
        runtime.split_batch(3, 4, 0, 1)


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
        g = pe.value_mod(q, k, ctx, layer, mod)
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
