"""Per-layer stacks (NoPE every k-th layer, per-layer options such as the RoPE base) and
length-dependent attention scaling (log-n, SSMax, Llama 4 temperature tuning),
their refusals, and the registry-wide properties for every hook combination they add. Expected values
come from independent references written here."""
import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

import checkpoint
import attention as A
import layers
from conftest import (Validated, assert_causal, assert_flex_equals_dense, assert_kv_cache_matches_full_forward,
                      assert_same_grads, assert_trains_and_pe_params_learn, flex_and_dense_grads, tiny_model,
                      validating_backend)


# --- independent references ---------------------------------------------------

def split_heads(attn, x):
    """q, k, v [B, heads, T, hd] of a layer's projection: its query and key/value head counts (n_head each,
    unless its scheme's heads() says otherwise)."""
    B, T, _ = x.shape
    hd = attn.hd
    q, k, v = attn.c_attn(x).split((attn.q_heads * hd, attn.kv_heads * hd, attn.kv_heads * hd), dim=2)
    return [t.view(B, T, -1, hd).transpose(1, 2) for t in (q, k, v)]


def rope_rotate(x, pos, base):
    """Half-split RoPE from the formula: pair (i, i + d/2) turned by pos * base^(-2i/d)."""
    d = x.size(-1)
    inv = torch.tensor([base ** (-2 * i / d) for i in range(d // 2)], dtype=torch.float64)
    ang = pos.double()[:, None] * inv[None, :]
    cos, sin = ang.cos().float(), ang.sin().float()
    x1, x2 = x[..., :d // 2], x[..., d // 2:]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1)


def reference_attention(attn, x, rot=None, bias=None, scale=None):
    """softmax(scale_i * (q.k/sqrt(d) + bias)) v, causal, then the output projection."""
    B, T, C = x.shape
    q, k, v = split_heads(attn, x)
    if rot is not None:
        q, k = rot(q), rot(k)
    logits = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if bias is not None:
        logits = logits + bias
    if scale is not None:
        logits = logits * scale.view(-1, T, 1) if scale.dim() == 2 else logits * scale[:, None]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    y = logits.masked_fill(~causal, float('-inf')).softmax(-1) @ v
    return attn.c_proj(y.transpose(1, 2).reshape(B, T, C))


def sharpen(m):
    """GPT-2 init gives near-uniform attention, where positions hardly matter: scale q, k, v
    up so the tests below can tell positional schemes apart."""
    with torch.no_grad():
        for blk in m.transformer.h:
            blk.attn.c_attn.weight.mul_(25)
    return m


def model_attention(m, layer, x):
    pos = torch.arange(x.size(1))
    pe = m.pe.at(layer)
    return m.transformer.h[layer].attn(x, pe, pe.context(pos, pos, x.size(1)))


def alibi_bias(n_head, T):
    slopes = torch.tensor([2.0 ** (-8 * (h + 1) / n_head) for h in range(n_head)])  # n_head a power of 2
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    return -slopes[:, None, None] * (i - j).clamp(min=0)


# --- per-layer stacks -------------------------------------------------------------

@pytest.mark.parametrize('k, n_layer', [(2, 4), (3, 8), (4, 12), (4, 3), (5, 12)])
def test_nope_every_k_matches_smollm3_llama4_rule(k, n_layer):
    """HF SmolLM3/Llama 4: no_rope_layers[i] = int((i + 1) % interval != 0), 0 = NoPE."""
    no_rope_layers = [int((i + 1) % k != 0) for i in range(n_layer)]
    want = [i for i, use_rope in enumerate(no_rope_layers) if use_rope == 0]
    if not want or len(want) == n_layer:
        with pytest.raises(ValueError):
            layers.nope_layer_indices(k, n_layer)
        return
    assert layers.nope_layer_indices(k, n_layer) == want
    assert layers.nope_layer_indices([2, 0], n_layer) == [0, 2]
    assert layers.nope_layer_indices(0, n_layer) == [] and layers.nope_layer_indices(None, n_layer) == []


@pytest.mark.parametrize('scheme', ['rope', 'alibi'])
def test_nope_layers_attend_without_positions_others_run_the_scheme(scheme):
    m = sharpen(tiny_model(scheme, n_layer=4, nope_layers=2).eval())  # layers 1 and 3 NoPE
    assert m.pe.slot[1] is None and m.pe.slot[3] is None and m.pe.nope_layers == [1, 3]
    assert [s.pos_options for s in m.plan] == [{}, None, {}, None]
    T = 12
    x = torch.randn(2, T, 32)
    pos = torch.arange(T)
    with torch.no_grad():
        for layer in range(4):
            attn = m.transformer.h[layer].attn
            got = model_attention(m, layer, x)
            nope = reference_attention(attn, x)
            if scheme == 'rope':
                want = nope if layer in (1, 3) else reference_attention(attn, x, rot=lambda t: rope_rotate(t, pos, 1e4))
            else:
                want = nope if layer in (1, 3) else reference_attention(attn, x, bias=alibi_bias(4, T))
            assert torch.allclose(got, want, atol=1e-5), layer
            assert not torch.allclose(nope, reference_attention(attn, x, rot=lambda t: rope_rotate(t, pos, 1e4)),
                                      atol=1e-3)  # the comparison can tell them apart


def test_per_layer_base_each_layer_uses_its_own_base():
    """Gemma 3's pattern: every 6th layer global (base 1M), the others local (10k)."""
    n = 12
    m = sharpen(tiny_model('rope', n_layer=n, pos_options={'base': 1e4},
                           layer_options={i: {'base': 1e6} for i in range(5, n, 6)}).eval())
    assert len(m.pe.schemes) == 2  # one instance per distinct options set
    assert [m.pe.at(i).base for i in range(n)] == [1e6 if (i + 1) % 6 == 0 else 1e4 for i in range(n)]
    T = 40
    x = torch.randn(1, T, 32)
    pos = torch.arange(T)
    with torch.no_grad():
        for layer in (0, 5, 6, 11):
            attn = m.transformer.h[layer].attn
            base = 1e6 if layer in (5, 11) else 1e4
            want = reference_attention(attn, x, rot=lambda t: rope_rotate(t, pos, base))
            other = reference_attention(attn, x, rot=lambda t: rope_rotate(t, pos, 1e10 / base))
            got = model_attention(m, layer, x)
            assert torch.allclose(got, want, atol=1e-5), layer
            assert not torch.allclose(got, other, atol=1e-4), layer
    # and the cos/sin a layer uses come from its own base
    for inner in m.pe.schemes:
        d = 8
        inv = torch.tensor([inner.base ** (-2 * i / d) for i in range(d // 2)], dtype=torch.float64)
        ang = pos.double()[:, None] * inv
        cos = inner.context(pos, pos, T).extra['cos']
        assert torch.allclose(cos, torch.cat((ang, ang), -1).cos().float(), atol=1e-6)


@pytest.mark.parametrize('kw, match', [
    (dict(nope_layers=-1), 'k must be >= 1'),
    (dict(nope_layers=3), 'none is selected'),          # n_layer=2
    (dict(nope_layers=1), "that is pos_encoding='none'"),
    (dict(nope_layers=[2]), 'not layer indices'),
    (dict(nope_layers=[1, 1]), 'twice'),
    (dict(nope_layers=True), 'int k'),
    (dict(nope_layers='every 2'), "layer type 'every 2', but layer_types is not set"),
    (dict(layer_options={2: {'base': 1e6}}), 'not a layer index'),
    (dict(layer_options={1: 1e6}), 'must be a dict'),
    (dict(layer_options=[{'base': 1e6}]), 'must be a dict'),
    (dict(layer_options={1: {'bse': 1e6}}), r'layer_options\[1\]'),
    (dict(nope_layers=[1], layer_options={1: {'base': 1e6}}), 'in nope_layers and in layer_options'),
    (dict(attn_scaling={'type': 'log'}), "'type' one of logn, ssmax, llama4"),
    (dict(attn_scaling={'type': 'logn', 'L': 8}), "does not take \\['L'\\]"),
    (dict(attn_scaling={'type': 'logn', 'original_max_len': 1}), 'original_max_len'),
    (dict(attn_scaling={'type': 'llama4'}), 'none \\(NoPE layers: \\[\\]\\)'),
    (dict(attn_scaling={'type': 'llama4', 'floor_scale': 0}, nope_layers=2), 'floor_scale > 0'),
    (dict(attn_scaling={'type': 'logn', 'layers': [5]}), 'layer indices 0..1'),
    (dict(attn_scaling={'type': 'ssmax', 'layers': 'global'}), "layer type 'global', but layer_types is not set"),
    (dict(attn_scaling={'type': 'ssmax', 'init': 'one'}), 'must be a number'),
])
def test_bad_stack_and_scaling_configs_say_what_to_do(kw, match):
    with pytest.raises(ValueError, match=match):
        tiny_model('rope', **kw)


@pytest.mark.parametrize('scheme, kw, match', [
    ('learned', dict(nope_layers=2), 'before block 0'),
    ('sinusoidal', dict(layer_options={1: {}}), 'before block 0'),
    ('none', dict(nope_layers=2), 'NoPE in every layer already'),
    ('alibi', dict(layer_options={1: {'base': 1e6}}), r"unexpected keyword argument 'base'"),
])
def test_stack_refusals(scheme, kw, match):
    with pytest.raises(ValueError, match=match):
        tiny_model(scheme, **kw)


def test_embedding_schemes_take_attention_scaling():
    m = tiny_model('learned', attn_scaling={'type': 'logn'})
    assert m.pe.max_len == 16 and m.pe.embeds_positions
    with pytest.raises(ValueError, match='16 positions'):
        m(torch.zeros(1, 17, dtype=torch.long))


# every hook combination the stacks and the scaling add, through the registry-wide properties
STACKS = {
    'rope+nope2': ('rope', dict(nope_layers=2)),
    'rope+base_per_layer': ('rope', dict(layer_options={1: {'base': 1e6}})),
    'rope+nope+llama4': ('rope', dict(nope_layers=2, attn_scaling={'type': 'llama4', 'floor_scale': 4})),
    'none+llama4': ('none', dict(attn_scaling={'type': 'llama4', 'floor_scale': 4, 'attn_scale': 0.5})),
    'rope+ssmax': ('rope', dict(attn_scaling={'type': 'ssmax'})),
    'alibi+nope+logn': ('alibi', dict(nope_layers=2, attn_scaling={'type': 'logn', 'original_max_len': 8})),
    'kerple_log+ssmax': ('kerple_log', dict(attn_scaling={'type': 'ssmax', 'init': 0.5})),
    'shaw+logn': ('shaw', dict(attn_scaling={'type': 'logn'})),
    'xl+nope0': ('xl', dict(nope_layers=[0])),
    'xpos+nope+logn': ('xpos', dict(nope_layers=2, attn_scaling={'type': 'logn', 'layers': 'pe'})),
    't5+per_layer': ('t5', dict(layer_options={1: {'num_buckets': 8, 'max_distance': 16}})),
    'learned+logn': ('learned', dict(attn_scaling={'type': 'logn'})),
}


def stack_model(name, **kw):
    scheme, cfg = STACKS[name]
    return tiny_model(scheme, **cfg, **kw)


@pytest.mark.parametrize('name', list(STACKS))
def test_stack_causal_and_kv_cache_parity(name):
    m = stack_model(name).eval()
    assert_causal(m)
    assert_kv_cache_matches_full_forward(m)


@pytest.mark.parametrize('name', list(STACKS))
def test_stack_trains_and_every_positional_parameter_learns(name):
    m = stack_model(name)
    assert_trains_and_pe_params_learn(m)
    if 'ssmax' in name:  # an attention parameter: one [H] vector per layer, learning too
        ssmax = [p for n, p in m.named_parameters() if n.endswith('attn.ssmax')]
        assert len(ssmax) == 2 and all(p.shape == (4,) and p.grad.abs().sum() > 0 for p in ssmax)


@pytest.mark.parametrize('name', ['alibi+nope+logn', 'kerple_log+ssmax', 'xpos+nope+logn'])
def test_stack_flex_equals_dense(name):
    assert_flex_equals_dense(stack_model(name, block_size=64).eval())


def test_scaled_bias_flex_backward_graph_validates_and_equals_dense(flex_with_grad_on_cpu, monkeypatch):
    """SSMax's learned scale is indexed inside the score_mod next to KERPLE's learned bias:
    Inductor's joint-graph check (what the CUDA lowering runs) accepts it, and FlexAttention's
    gradients equal the dense path's."""
    import torch.nn.attention.flex_attention as fa
    x = torch.randint(0, 37, (2, 64), generator=torch.Generator().manual_seed(0))
    counts = []
    m = stack_model('kerple_log+ssmax', block_size=64, attn_backend='flex')
    with pytest.raises(Validated):
        _, loss = torch.compile(m, backend=validating_backend(counts))(x, x)
        loss.backward()
    assert len(counts) == m.config.n_layer
    monkeypatch.setitem(A._compiled, 'flex', fa.flex_attention)
    assert_same_grads(flex_and_dense_grads(lambda be: stack_model('kerple_log+ssmax', block_size=64,
                                                                  attn_backend=be), x))


def test_stack_with_scaling_compiles_without_graph_breaks():
    torch._dynamo.reset()
    m = stack_model('alibi+nope+logn', block_size=64)
    ex = torch._dynamo.explain(m)(torch.randint(0, 37, (2, 64)), torch.randint(0, 37, (2, 64)))
    torch._dynamo.reset()
    assert ex.graph_break_count == 0 and ex.graph_count == 1, [str(b.reason)[:200] for b in ex.break_reasons]


@pytest.mark.parametrize('name', ['rope+nope+llama4', 'alibi+nope+logn', 'kerple_log+ssmax', 'xl+nope0'])
def test_stack_bf16_autocast_train_step_and_kv_cache(name):
    m = stack_model(name)
    x = torch.randint(0, 37, (4, 17), generator=torch.Generator().manual_seed(0))
    with torch.autocast('cpu', dtype=torch.bfloat16):
        logits, loss = m(x[:, :-1], x[:, 1:])
    assert logits.dtype == torch.bfloat16 and torch.isfinite(loss)
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)
    m.eval()
    xs = x[:, :1].repeat(1, 30)
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        full = m(xs)[0].float()
        cache = m.new_cache()
        steps = [m(xs[:, :5], cache=cache)[0]] + [m(xs[:, t:t + 1], cache=cache)[0] for t in range(5, 30)]
    assert (torch.cat(steps, 1).float() - full).abs().max() < 0.1


def test_layer_stack_delegates_the_attention_hook():
    m = tiny_model('fox', nope_layers=2).eval()  # layer 1 runs NoPE: plain attention
    assert m.transformer.h[0].attn.pe_layer.fgate is not None and m.transformer.h[1].attn.pe_layer is None
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
    assert tiny_model('rope', attn_scaling={'type': 'logn'}).plan[0].attn_scaling['type'] == 'logn'
    with pytest.raises(ValueError, match='computes its attention itself'):
        tiny_model('rope', attn_scaling={'type': 'logn'}, rope_scaling={'type': 'rerope', 'window': 8})


# --- attention scaling --------------------------------------------------------------

def scale_of(m, layer, Tq, Tk, pos=None):
    """The factors for Tq new queries after Tk - Tq cached keys (at positions pos), or None."""
    attn = m.transformer.h[layer].attn
    if attn.scaling is None:
        return None
    pos = torch.arange(Tk - Tq, Tk) if pos is None else pos
    return A.logit_scale(attn.scaling, attn.ssmax, pos, Tk, attn.mask)


def test_logn_factor_per_position():
    m = tiny_model('rope', attn_scaling={'type': 'logn'})
    s = scale_of(m, 0, 10, 10)
    assert s.shape == (1, 10)
    assert s[0].tolist() == pytest.approx([math.log(i + 1) for i in range(10)], rel=1e-6)
    # with a cache: 12 keys cached, 3 new queries see 13, 14, 15 keys
    assert scale_of(m, 1, 3, 15)[0].tolist() == pytest.approx([math.log(n) for n in (13, 14, 15)], rel=1e-6)


def test_logn_extrapolation_variant_is_one_inside_training_length():
    L = 8
    m = tiny_model('rope', attn_scaling={'type': 'logn', 'original_max_len': L})
    s = scale_of(m, 0, 40, 40)[0]
    want = [max(1.0, math.log(n) / math.log(L)) for n in range(1, 41)]
    assert s.tolist() == pytest.approx(want, rel=1e-6)
    assert (s[:L] == 1).all() and s[L] > 1  # exactly 1 up to n = L, log_L n beyond
    assert s[15].item() == pytest.approx(4 / 3, rel=1e-6)  # n = 16 = 8^(4/3)


def test_llama4_temperature_tuning_matches_hf_formula_and_defaults():
    m = tiny_model('rope', n_layer=4, nope_layers=4, attn_scaling={'type': 'llama4'})  # layer 3 NoPE
    sc = m.plan[3].attn_scaling
    assert sc['floor_scale'] == 8192 and sc['attn_scale'] == 0.1
    assert [i for i, s in enumerate(m.plan) if s.attn_scaling] == [3]  # Llama 4 tunes its NoPE layers only
    pos = torch.tensor([0, 100, 8190, 8191, 16382, 16383, 100000, 10 ** 6])
    s = scale_of(m, 3, len(pos), len(pos), pos)[0]
    want = [math.log(math.floor((p + 1) / 8192) + 1) * 0.1 + 1 for p in pos.tolist()]
    assert s.tolist() == pytest.approx(want, rel=1e-6)
    assert s[2] == 1 and s[3] > 1  # the first step is at position 8191: (8191 + 1) / 8192 = 1
    assert scale_of(m, 0, len(pos), len(pos), pos) is None


@pytest.mark.parametrize('scheme', ['rope', 'alibi'])
def test_scaling_multiplies_every_logit_of_a_query(scheme):
    """logits * s_i, bias included (for a bias scheme, scaling q alone would miss the bias)."""
    L = 4
    m = sharpen(tiny_model(scheme, attn_scaling={'type': 'logn', 'original_max_len': L}).eval())
    T = 20
    x = torch.randn(2, T, 32)
    pos = torch.arange(T)
    s = torch.tensor([max(1.0, math.log(n) / math.log(L)) for n in range(1, T + 1)])
    attn = m.transformer.h[0].attn
    rot = (lambda t: rope_rotate(t, pos, 1e4)) if scheme == 'rope' else None
    bias = alibi_bias(4, T) if scheme == 'alibi' else None
    with torch.no_grad():
        got = model_attention(m, 0, x)
        want = reference_attention(attn, x, rot=rot, bias=bias, scale=s)
        unscaled = reference_attention(attn, x, rot=rot, bias=bias)
        assert torch.allclose(got, want, atol=1e-5)
        assert not torch.allclose(got, unscaled, atol=1e-3)
        if scheme == 'rope':  # equals scaling q: plain SDPA on s_i * q
            q, k, v = split_heads(attn, x)
            q, k = rope_rotate(q, pos, 1e4) * s[:, None], rope_rotate(k, pos, 1e4)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            assert torch.allclose(got, attn.c_proj(y.transpose(1, 2).reshape(2, T, 32)), atol=1e-5)
        else:  # scaling q alone leaves the bias unscaled: different
            q, k, v = split_heads(attn, x)
            mask = alibi_bias(4, T).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float('-inf'))
            y = F.scaled_dot_product_attention(q * s[:, None], k, v, attn_mask=mask)
            assert not torch.allclose(got, attn.c_proj(y.transpose(1, 2).reshape(2, T, 32)), atol=1e-3)


def test_ssmax_is_learned_per_head_starts_at_one_at_L_and_gets_a_gradient():
    m = tiny_model('rope', block_size=16, attn_scaling={'type': 'ssmax'})
    layer = m.transformer.h[0].attn
    assert layer.ssmax.shape == (4,) and torch.allclose(layer.ssmax, torch.full((4,), 1 / math.log(16)))
    s = scale_of(m, 0, 16, 16)
    assert s.shape == (4, 16) and s[:, 15].tolist() == pytest.approx([1.0] * 4, rel=1e-6)  # n = L
    with torch.no_grad():
        layer.ssmax.copy_(torch.tensor([0.1, 0.2, 0.3, 0.4]))
    s = scale_of(m, 0, 5, 5)
    want = torch.tensor([[h * math.log(n) for n in range(1, 6)] for h in (0.1, 0.2, 0.3, 0.4)])
    assert torch.allclose(s, want.float(), rtol=1e-6)
    x = torch.randint(0, 37, (2, 16))
    _, loss = m(x, x)
    loss.backward()
    assert layer.ssmax.grad is not None and (layer.ssmax.grad.abs() > 0).all()


@pytest.mark.parametrize('scheme', ['kerple_log', 't5', 'xl', 'shaw', 'learned', 'rope'])
def test_plain_checkpoint_takes_logn_at_eval_and_is_unchanged_inside_L(scheme, tmp_path):
    """attn_scaling as a run-time choice (like rope_scaling): a checkpoint trained without it
    loads into the scaling-only stack; log_L n is 1 up to L, so the logits there are the
    checkpoint's own, and past L they change."""
    plain = tiny_model(scheme, seed=3).eval()
    scaled = tiny_model(scheme, seed=5, attn_scaling={'type': 'logn', 'original_max_len': 16}).eval()
    assert sorted(scaled.state_dict()) == sorted(plain.state_dict())  # the plain scheme's keys
    scaled.load_state_dict(plain.state_dict())  # strict
    # and through the scripts' loader, attn_scaling given at run time like rope_scaling
    args = {f.name: getattr(plain.config, f.name) for f in dataclasses.fields(plain.config)}
    torch.save({'model': plain.state_dict(), 'model_args': args}, tmp_path / 'ckpt.pt')
    loaded, _ = checkpoint.load_model(str(tmp_path / 'ckpt.pt'), attn_scaling={'type': 'logn', 'original_max_len': 16})
    assert loaded.plan[0].attn_scaling['type'] == 'logn'
    x = torch.randint(0, 37, (2, 16 if plain.pe.max_len else 48))
    with torch.no_grad():
        a, b = plain(x)[0], scaled(x)[0]
        assert torch.allclose(loaded(x)[0], b, atol=1e-6)
    assert torch.allclose(a[:, :16], b[:, :16], atol=1e-5)
    if x.size(1) > 16:
        assert not torch.allclose(a[:, 16:], b[:, 16:], atol=1e-4)
    if scheme in ('kerple_log', 'xl'):  # a NoPE layer has no parameters: a strict load refuses them
        with pytest.raises(RuntimeError, match='Unexpected key'):
            tiny_model(scheme, nope_layers=[1]).load_state_dict(plain.state_dict())


def test_minus_inf_bias_stays_a_mask_under_scaling():
    s = torch.tensor([[0.0, -2.0, 3.0]])
    q = torch.ones(1, 1, 3, 4)
    table = torch.tensor([0.0, float('-inf'), 1.5])
    _, bias = A.scale_logits(q, lambda score, b, h, i, j: score + table[j], s)
    out = bias.mod(torch.zeros(3), torch.zeros(3, dtype=torch.long), torch.zeros(3, dtype=torch.long),
              torch.arange(3), torch.arange(3))
    assert out[1] == float('-inf') and out[0] == 0 and out[2] == pytest.approx(4.5)
