"""RoPE context extension (rope_scaling.rope_frequencies and the RoPE scheme): each
formula against an independent computation written here, properties through the
real model attention, the dynamic-NTK + KV-cache choice, and run-time overrides
of a saved checkpoint."""
import json
import math
import os

import numpy as np
import pytest
import torch

from conftest import fork_run, tiny_model
import positional
import rope_scaling
from rope_scaling import rope_frequencies

D, BASE, L = 32, 10000.0, 128


def plain(d=D, base=BASE):
    return np.array([base ** (-2 * i / d) for i in range(d // 2)])


def sharpen(model, k=8.0):
    """Scale q/k/v weights so attention is far from uniform (as after training) and
    position changes show in the logits; a model at init barely attends by position."""
    with torch.no_grad():
        for blk in model.transformer.h:
            blk.attn.c_attn.weight.mul_(k)
    return model


def close(a, b, rtol=1e-6):
    np.testing.assert_allclose(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64), rtol=rtol, atol=0)


# --- formulas ------------------------------------------------------------------

def test_linear_divides_every_frequency_by_s():
    inv, af = rope_frequencies(D, BASE, {'type': 'linear', 'factor': 4})
    close(inv, plain() / 4)
    assert af == 1.0


def test_ntk_keeps_highest_and_divides_lowest_by_s():
    s = 8
    inv, af = rope_frequencies(D, BASE, {'type': 'ntk', 'factor': s})
    b = BASE * s ** (D / (D - 2))
    close(inv, [b ** (-2 * i / D) for i in range(D // 2)])
    p = plain()
    assert inv[0].item() == p[0] == 1.0           # highest frequency unchanged
    close(inv[-1], p[-1] / s)                     # lowest divided by exactly s
    assert af == 1.0


def test_dynamic_is_plain_rope_up_to_L_then_ntk_of_the_current_length():
    s = 4
    sc = {'type': 'dynamic', 'factor': s, 'original_max_len': L}
    p, _ = rope_frequencies(D, BASE)
    for n in (None, 1, L // 2, L):
        assert torch.equal(rope_frequencies(D, BASE, sc, seq_len=n)[0], p)
    for n in (L + 1, 2 * L, 8 * L):
        b = BASE * (s * n / L - (s - 1)) ** (D / (D - 2))
        close(rope_frequencies(D, BASE, sc, seq_len=n)[0], [b ** (-2 * i / D) for i in range(D // 2)])
    lowest = [rope_frequencies(D, BASE, sc, seq_len=n)[0][-1].item() for n in (L, 2 * L, 4 * L)]
    assert lowest[0] > lowest[1] > lowest[2]      # longer context, more stretched


def test_yarn_ramp_between_correction_dims():
    s = 4
    inv, af = rope_frequencies(D, BASE, {'type': 'yarn', 'factor': s, 'original_max_len': L})
    # by hand: corr(n) = d ln(L / (2 pi n)) / (2 ln base); corr(32) = -0.78 -> low 0, corr(1) = 5.24 -> high 6
    corr = lambda n: D * math.log(L / (2 * math.pi * n)) / (2 * math.log(BASE))  # noqa: E731
    assert math.floor(corr(32)) == -1 and math.ceil(corr(1)) == 6
    p = plain()
    ramp = np.clip(np.arange(D // 2) / 6.0, 0, 1)
    close(inv, p * (1 - ramp) + p / s * ramp)
    close(af, 0.1 * math.log(4) + 1.0)            # 1.1386...
    assert rope_frequencies(D, BASE, {'type': 'yarn', 'factor': 1, 'original_max_len': L})[1] == 1.0


def test_yarn_correction_range_llama2():
    """Llama 2 (d=128, base 10000, L=4096): the YaRN correction range is pairs 20..46."""
    inv, _ = rope_frequencies(128, 10000.0, {'type': 'yarn', 'factor': 16, 'original_max_len': 4096})
    p = plain(128, 10000.0)
    ramp = (p - inv.double().numpy()) / (p - p / 16)   # 0 = kept, 1 = interpolated
    np.testing.assert_allclose(ramp, np.clip((np.arange(64) - 20) / (46 - 20), 0, 1), atol=1e-5)


def test_yarn_degenerate_range_gets_the_epsilon():
    # L = 6 puts both correction dims at or below 0: low = high = 0, then high = 0.001,
    # so pair 0 is kept and every other pair is fully interpolated
    inv, _ = rope_frequencies(D, BASE, {'type': 'yarn', 'factor': 4, 'original_max_len': 6})
    p = plain()
    close(inv[0], p[0])
    close(inv[1:], p[1:] / 4)


def llama3_reference(inv, s, L, lo, hi):
    out = []
    for f in inv:
        wl = 2 * math.pi / f
        if wl < L / hi:
            out.append(f)
        elif wl > L / lo:
            out.append(f / s)
        else:
            sm = (L / wl - lo) / (hi - lo)
            out.append((1 - sm) * f / s + sm * f)
    return out


def test_llama3_three_regimes():
    s, lo, hi = 8, 1.0, 4.0
    inv, af = rope_frequencies(D, BASE, {'type': 'llama3', 'factor': s, 'original_max_len': L,
                                         'low_freq_factor': lo, 'high_freq_factor': hi})
    p = plain()
    close(inv, llama3_reference(p, s, L, lo, hi))
    assert af == 1.0
    wl = 2 * math.pi / p                                  # 6.3, 11.2, 19.9, 35.3, 62.8, 111.7, 198.7 ...
    keep, scale = wl < L / hi, wl > L / lo
    mid = ~keep & ~scale
    assert keep.sum() == 3 and mid.sum() == 3 and scale.sum() == D // 2 - 6  # all three regimes present
    inv = inv.double().numpy()
    assert (inv[keep] == p[keep].astype(np.float32)).all()
    close(inv[scale], p[scale] / s)
    smooth = (inv[mid] - p[mid] / s) / (p[mid] - p[mid] / s)
    close(smooth, (L / wl[mid] - lo) / (hi - lo))
    assert ((0 < smooth) & (smooth < 1)).all()


def test_llama3_is_continuous_at_the_regime_boundaries():
    """Put a wavelength exactly on each boundary (L/hi, L/lo). The inequalities are
    strict, so the blend applies there, with smooth = 1 at L/hi (= keep) and 0 at
    L/lo (= divide by s): the value must equal the neighbouring regime's."""
    p = plain()
    for i, which in ((3, 'hi'), (5, 'lo')):
        wl = 2 * math.pi / p[i]
        Lb = wl * 4.0 if which == 'hi' else wl * 1.0   # wl == Lb/hi or wl == Lb/lo
        inv, _ = rope_frequencies(D, BASE, {'type': 'llama3', 'factor': 8, 'original_max_len': Lb})
        close(inv[i], p[i] if which == 'hi' else p[i] / 8, rtol=1e-6)


@pytest.mark.parametrize('bad, msg', [
    ({'type': 'rotary', 'factor': 2}, 'valid types: linear, ntk, dynamic, yarn, llama3, longrope'),
    ({'type': 'linear'}, "needs 'factor'"),
    ({'type': 'ntk', 'factor': 'two'}, "'factor' must be a number"),
    ({'type': 'linear', 'factor': 0.5}, 'factor must be >= 1'),
    ({'type': 'yarn', 'factor': 4}, "needs 'original_max_len'"),
    ({'type': 'linear', 'factor': 2, 'original_max_len': 128}, 'does not take'),
    ({'type': 'llama3', 'factor': 8, 'original_max_len': 128, 'low_freq_factor': 4, 'high_freq_factor': 1},
     'high_freq_factor > low_freq_factor'),
    ('linear', "must be a dict with a 'type'"),
])
def test_bad_scaling_is_a_clear_error(bad, msg):
    with pytest.raises(ValueError, match=msg.replace('(', r'\(').replace(')', r'\)')):
        rope_frequencies(D, BASE, bad)


def test_rope_scaling_on_a_scheme_without_rotary_is_an_error():
    with pytest.raises(ValueError, match='no rotary embedding'):
        tiny_model('alibi', rope_scaling={'type': 'linear', 'factor': 2})


# --- properties through the model ------------------------------------------------

def half_split_cos_sin(pos, inv, factor=1.0):
    ang = pos.double()[:, None] * inv.double()[None, :]
    emb = torch.cat((ang, ang), dim=-1)
    return (emb.cos() * factor).float(), (emb.sin() * factor).float()


def test_linear_scaling_equals_positions_divided_by_s():
    """PI with factor s == plain RoPE fed positions p/s, through the real model attention."""
    s, T = 4, 48
    scaled = sharpen(tiny_model('rope', rope_scaling={'type': 'linear', 'factor': s}))
    ref, plain_model = tiny_model('rope'), tiny_model('rope')
    ref.load_state_dict(scaled.state_dict())
    plain_model.load_state_dict(scaled.state_dict())
    inv = torch.tensor(plain(ref.pe.at(0).rot_dim))

    def context_at_fractional_positions(q_pos, k_pos, n_pos=None):
        cos, sin = half_split_cos_sin(q_pos.double() / s, inv)
        return positional.make_context(q_pos, k_pos, n_pos, cos=cos, sin=sin)
    ref.pe.at(0).context = context_at_fractional_positions
    x = torch.randint(0, 37, (2, T))
    with torch.no_grad():
        a, b = scaled(x)[0], ref(x)[0]
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        assert (a - plain_model(x)[0]).abs().max() > 1e-2   # and scaling did change the logits


def test_yarn_scales_logits_by_attention_factor_squared():
    m = tiny_model('rope', rope_scaling={'type': 'yarn', 'factor': 4})
    inv, af = rope_frequencies(m.pe.at(0).rot_dim, 10000.0, {'type': 'yarn', 'factor': 4, 'original_max_len': 16})
    pos = torch.arange(40)
    ctx = m.pe.at(0).context(pos, pos)
    q, k = torch.randn(2, 4, 40, 8), torch.randn(2, 4, 40, 8)
    q2, k2 = m.pe.at(0).transform_qk(q, k, ctx, None)
    cos, sin = half_split_cos_sin(pos, inv)                    # same frequencies, no factor
    rot = lambda x: x * cos + torch.cat((-x[..., 4:], x[..., :4]), -1) * sin  # noqa: E731
    torch.testing.assert_close(q2 @ k2.transpose(-1, -2), (rot(q) @ rot(k).transpose(-1, -2)) * af ** 2,
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize('sc', [None, {'type': 'ntk', 'factor': 4}, {'type': 'dynamic', 'factor': 4}])
def test_rope_forward_is_stateless(sc):
    """cos/sin come from the positions each forward (a cache mutated inside forward made
    torch.compile recompile): results after other lengths equal a fresh model's, and a
    forward leaves the scheme's attributes as they were."""
    m = tiny_model('rope', rope_scaling=sc)
    before = dict(vars(m.pe.at(0)))
    lengths = (8, 64, 24, 64, 16)
    x = torch.randint(0, 37, (1, 64))
    with torch.no_grad():
        for T in lengths:
            fresh = tiny_model('rope', rope_scaling=sc)
            assert torch.equal(m(x[:, :T])[0], fresh(x[:, :T])[0])
    assert vars(m.pe.at(0)).keys() == before.keys() and all(vars(m.pe.at(0))[k] is v for k, v in before.items())


def test_dynamic_kv_cache_keeps_old_rotation_of_cached_keys():
    """Our choice (as in HF): each step rotates its query and new key with the
    frequencies of the current total length; cached keys keep their rotation."""
    torch.manual_seed(0)
    s, Lb, T = 4, 16, 40
    m = sharpen(tiny_model('rope', n_layer=1, rope_scaling={'type': 'dynamic', 'factor': s}))
    x = torch.randint(0, 37, (1, T))
    cache = m.new_cache()
    with torch.no_grad():
        logits = [m(x[:, :Lb], cache=cache)[0][:, -1]]      # prefill up to L
        for t in range(Lb, T):
            logits.append(m(x[:, t:t + 1], cache=cache)[0][:, -1])
        full = m(x)[0]
        # layer 0's keys before rotation, recomputed by hand
        attn = m.transformer.h[0].attn
        k = attn.c_attn(m.transformer.h[0].ln_1(m.transformer.wte(x))).split(32, dim=2)[1]
        k = k.view(1, T, 4, 8).transpose(1, 2).double()
    d = m.pe.at(0).rot_dim
    for p in (0, Lb - 1, Lb, 30, T - 1):
        n = max(p + 1, Lb)                                   # total length when key p was new
        b = 10000.0 * (s * n / Lb - (s - 1)) ** (d / (d - 2))
        inv = torch.tensor([b ** (-2 * i / d) for i in range(d // 2)])
        cos, sin = half_split_cos_sin(torch.tensor([p]), inv)
        kp = k[:, :, p]
        want = kp * cos.double() + torch.cat((-kp[..., d // 2:], kp[..., :d // 2]), -1) * sin.double()
        torch.testing.assert_close(cache.layers[0][0][:, :, p].double(), want, rtol=1e-4, atol=1e-5)
    # up to L decoding equals a full forward; past L it does not (the known inconsistency:
    # a full forward of T tokens rotates every key with the frequencies of length T)
    with torch.no_grad():
        torch.testing.assert_close(logits[0], m(x[:, :Lb])[0][:, -1], rtol=1e-5, atol=1e-5)
        assert (logits[-1] - full[:, -1]).abs().max() > 1e-2
        # a one-shot prefill of everything is a full forward, and matches it exactly
        torch.testing.assert_close(m(x, cache=m.new_cache())[0], full, rtol=1e-5, atol=1e-5)


def test_dynamic_cache_equals_full_forward_within_L():
    m = tiny_model('rope', rope_scaling={'type': 'dynamic', 'factor': 4})
    x = torch.randint(0, 37, (2, 16))
    cache = m.new_cache()
    with torch.no_grad():
        steps = [m(x[:, :5], cache=cache)[0]] + [m(x[:, t:t + 1], cache=cache)[0] for t in range(5, 16)]
        torch.testing.assert_close(torch.cat(steps, 1), m(x)[0], rtol=1e-5, atol=1e-5)


# --- run-time override of a saved checkpoint ------------------------------------

def save_ckpt(model, path, data_dir):
    args = {k: getattr(model.config, k) for k in model.config.__dataclass_fields__}
    torch.save({'model': model.state_dict(), 'model_args': args, 'config': {'data_dir': data_dir}}, path)


def test_eval_override_on_saved_checkpoint(tmp_path, char_data):
    from checkpoint import load_model as load_checkpoint
    vocab = json.load(open(os.path.join(char_data, 'meta.json')))['vocab_size']
    m = sharpen(tiny_model('rope', vocab_size=vocab))
    save_ckpt(m, str(tmp_path / 'ckpt.pt'), char_data)
    x = torch.randint(0, vocab, (1, 64))                      # 4x block_size
    base, ck = load_checkpoint(str(tmp_path / 'ckpt.pt'))
    ident, _ = load_checkpoint(str(tmp_path / 'ckpt.pt'), rope_scaling={'type': 'linear', 'factor': 1})
    yarn, _ = load_checkpoint(str(tmp_path / 'ckpt.pt'), rope_scaling={'type': 'yarn', 'factor': 4})
    with torch.no_grad():
        torch.testing.assert_close(ident(x)[0], base(x)[0], rtol=0, atol=1e-6)
        assert (yarn(x)[0] - base(x)[0]).abs().max() > 1e-2
    assert ck['model_args']['rope_scaling'] is None           # the checkpoint keeps what it was trained with
    assert yarn.pe.scaling['original_max_len'] == 16          # defaults to the checkpoint's block_size
    out = fork_run(['eval.py', f'--out_dir={tmp_path}', '--mults=1,2', '--tokens=256',
                    "--rope_scaling={'type':'ntk','factor':2}"])
    assert out.returncode == 0, out.stderr
    assert "trained with rope_scaling=None, evaluating with rope_scaling={'type': 'ntk', 'factor': 2}" in out.stdout
    assert 'val/loss@2L' in out.stdout


@pytest.mark.e2e
def test_finetune_from_checkpoint_keeps_new_length_and_scaling(tmp_path, char_data):
    vocab = json.load(open(os.path.join(char_data, 'meta.json')))['vocab_size']
    m = tiny_model('rope', vocab_size=vocab)
    save_ckpt(m, str(tmp_path / 'src.pt'), char_data)
    sc = "{'type':'yarn','factor':2,'original_max_len':16}"
    args = ['train.py', f'--init_from={tmp_path / "src.pt"}', f'--out_dir={tmp_path}/ft',
            f'--data_dir={char_data}', '--block_size=32', f'--rope_scaling={sc}', '--max_iters=2', '--eval_interval=2',
            '--eval_mults=[0.5, 1]', '--eval_tokens=64', '--batch_size=2', '--compile=False', '--wandb_log=False',
            '--device=cpu']
    # a shape key the checkpoint fixes is refused, not silently ignored (it was ignored, and the
    # saved config then said n_layer=9 of a 2-layer model)
    out = fork_run(args + ['--n_layer=9'])
    assert out.returncode != 0 and 'n_layer=9 cannot apply (it has n_layer=2)' in out.stderr
    assert not os.path.exists(tmp_path / 'ft' / 'ckpt.pt') and 'Traceback' not in out.stderr
    out = fork_run(args)
    assert out.returncode == 0, out.stderr[-2000:]
    assert 'eval @ iter 0: loss@0.5L' in out.stdout          # "before" at the original L
    ck = torch.load(tmp_path / 'ft' / 'ckpt.pt', weights_only=True)
    a = ck['model_args']
    assert a['block_size'] == 32 and a['rope_scaling']['type'] == 'yarn'
    assert a['n_layer'] == 2 and a['n_embd'] == 32            # architecture from the source checkpoint
    assert ck['config']['n_layer'] == 2 and ck['config']['block_size'] == 32  # and the config says so


@pytest.mark.parametrize('scaling', [{'type': 'yarn', 'factor': 4}, {'type': 'ntk', 'factor': 2},
                                     {'type': 'llama3', 'factor': 8}])
def test_mrope_with_scaling_equals_rope_with_scaling_for_text(scaling):
    """M-RoPE over text (all axes equal) reduces to RoPE, also under a static rope_scaling."""
    import torch
    from conftest import tiny_model
    x = torch.randint(0, 37, (1, 48))
    a = tiny_model('rope', rope_scaling=scaling).eval()
    b = tiny_model('mrope', rope_scaling=scaling).eval()
    b.load_state_dict(a.state_dict())
    with torch.no_grad():
        assert torch.allclose(a(x)[0], b(x)[0], atol=1e-5)
        assert not torch.equal(b.pe.at(0).inv_freq, tiny_model('mrope').pe.at(0).inv_freq)  # the scaling is applied


# --- LongRoPE (HF 'longrope') ------------------------------------------------------

SHORT = [1.0 + 0.1 * i for i in range(D // 2)]   # any distinct per-pair factors
LONG = [1.0 + 0.5 * i for i in range(D // 2)]


def longrope(**kw):
    return {'type': 'longrope', 'short_factor': SHORT, 'long_factor': LONG, 'original_max_len': L, 'factor': 4, **kw}


def test_longrope_short_list_up_to_L_long_list_strictly_beyond():
    """HF: long_factor iff seq_len > original_max_position_embeddings (seq_len =
    max(position_ids) + 1); short at init (seq_len None) and at seq_len == L."""
    short = [1 / (SHORT[i] * BASE ** (2 * i / D)) for i in range(D // 2)]
    long = [1 / (LONG[i] * BASE ** (2 * i / D)) for i in range(D // 2)]
    for n in (None, 1, L - 1, L):
        close(rope_frequencies(D, BASE, longrope(), seq_len=n)[0], short)
    for n in (L + 1, 4 * L, 100 * L):
        close(rope_frequencies(D, BASE, longrope(), seq_len=n)[0], long)


def test_longrope_attention_factor():
    # default sqrt(1 + ln s / ln L): s = 4, L = 128 = 2^7 -> sqrt(1 + 2/7) = sqrt(9/7) = 1.1339
    for n in (None, 2 * L):                                # same factor for both lists
        close(rope_frequencies(D, BASE, longrope(), seq_len=n)[1], math.sqrt(9 / 7))
    assert rope_frequencies(D, BASE, longrope(factor=1))[1] == 1.0
    assert rope_frequencies(D, BASE, longrope(attention_factor=1.5), seq_len=2 * L)[1] == 1.5
    # Phi-3-mini-128k's numbers: s = 131072 / 4096 = 32 -> sqrt(1 + ln 32 / ln 4096) = sqrt(1 + 5/12)
    sc = longrope(factor=32, original_max_len=4096)
    close(rope_frequencies(D, BASE, sc)[1], math.sqrt(17 / 12))


def test_longrope_through_the_rope_scheme():
    """block_size 32 fine-tuned from L = 16 with no 'factor': s = block_size / L = 2
    (HF: max_position_embeddings / original_max_position_embeddings); the cos/sin
    of a forward of T <= L use the short list, T > L the long one."""
    sh, lo = [1.0, 1.5, 2.0, 3.0], [1.0, 2.0, 4.0, 8.0]     # head_dim 8 -> 4 pairs
    m = tiny_model('rope', block_size=32, rope_scaling={'type': 'longrope', 'short_factor': sh,
                                                         'long_factor': lo, 'original_max_len': 16})
    assert m.pe.scaling['factor'] == 2.0
    af = math.sqrt(1 + math.log(2) / math.log(16))          # sqrt(1.25)
    close(m.pe.at(0).attention_factor, math.sqrt(1.25))
    for T, ext in ((8, sh), (16, sh), (17, lo), (32, lo), (16, sh)):
        pos = torch.arange(T)
        cos = m.pe.at(0).context(pos, pos).extra['cos']
        inv = torch.tensor([1 / (ext[i] * 10000.0 ** (2 * i / 8)) for i in range(4)], dtype=torch.float64)
        want, _ = half_split_cos_sin(pos, inv, af)
        torch.testing.assert_close(cos, want, rtol=1e-5, atol=1e-6)
    # a run-time override on a model trained at its block_size: s = 1, attention factor 1
    m = tiny_model('rope', rope_scaling={'type': 'longrope', 'short_factor': sh, 'long_factor': lo})
    assert m.pe.scaling['factor'] == 1.0 and m.pe.at(0).attention_factor == 1.0


# --- YaRN options (HF 'yarn': attention_factor, mscale, mscale_all_dim, truncate) ---------

def mscale(s, m=1.0):
    return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0


def yarn(**kw):
    return {'type': 'yarn', 'factor': 4, 'original_max_len': L, **kw}


def test_yarn_explicit_attention_factor_overrides_everything():
    base_inv, _ = rope_frequencies(D, BASE, yarn())
    for extra in ({}, {'mscale': 0.707, 'mscale_all_dim': 1.0}):
        inv, af = rope_frequencies(D, BASE, yarn(attention_factor=1.25, **extra))
        assert af == 1.25
        assert torch.equal(inv, base_inv)                    # frequencies untouched


@pytest.mark.parametrize('s, ms, msa, want', [
    (40, 1.0, 1.0, 1.0),                                     # DeepSeek-V3: equal -> 1
    (40, 0.707, 0.707, 1.0),                                 # DeepSeek-V2
    (40, 1.0, 0.707, (0.1 * math.log(40) + 1) / (0.0707 * math.log(40) + 1)),  # 1.0798
    (40, 0.707, 1.0, (0.0707 * math.log(40) + 1) / (0.1 * math.log(40) + 1)),
    (40, 1.0, None, 0.1 * math.log(40) + 1),                 # only one given: HF ignores it
    (40, None, 0.707, 0.1 * math.log(40) + 1),
    (40, 0, 1.0, 0.1 * math.log(40) + 1),                    # 0 is falsy in HF: "not given"
    (1, 1.0, 0.707, 1.0),                                    # s <= 1: every mscale is 1
])
def test_yarn_mscale_combinations_as_hf(s, ms, msa, want):
    kw = {k: v for k, v in (('mscale', ms), ('mscale_all_dim', msa)) if v is not None}
    _, af = rope_frequencies(64, BASE, {'type': 'yarn', 'factor': s, 'original_max_len': 4096, **kw})
    close(af, want, rtol=1e-12)
    close(mscale(s, ms or 1) / mscale(s, msa or 1) if ms and msa else mscale(s), want, rtol=1e-12)


def yarn_ref(d, base, s, Lo, truncate, bf=32, bs=1):
    """YaRN frequencies from the paper's formulas, with HF's truncate switch."""
    corr = lambda n: d * math.log(Lo / (2 * math.pi * n)) / (2 * math.log(base))  # noqa: E731
    lo, hi = corr(bf), corr(bs)
    if truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, d - 1)
    if lo == hi:
        hi += 0.001
    inv = np.array([base ** (-2 * i / d) for i in range(d // 2)])
    ramp = np.clip((np.arange(d // 2) - lo) / (hi - lo), 0, 1)
    return inv * (1 - ramp) + inv / s * ramp, (lo, hi)


def test_yarn_truncate_false_keeps_the_correction_range_fractional():
    """gpt-oss (head_dim 64, base 150000, L = 4096, s = 32, truncate False):
    corr(32) = 8.09 and corr(1) = 17.40; truncated, the range would be [8, 18]."""
    d, base, s, Lo = 64, 150000.0, 32, 4096
    ref_f, (lo, hi) = yarn_ref(d, base, s, Lo, truncate=False)
    ref_t, rng_t = yarn_ref(d, base, s, Lo, truncate=True)
    assert 8.0 < lo < 8.1 and 17.3 < hi < 17.5 and rng_t == (8, 18)
    sc = {'type': 'yarn', 'factor': s, 'original_max_len': Lo}
    inv_f, af = rope_frequencies(d, base, {**sc, 'truncate': False})
    inv_t, _ = rope_frequencies(d, base, {**sc, 'truncate': True})
    close(inv_f, ref_f, rtol=1e-6)
    close(inv_t, ref_t, rtol=1e-6)
    assert torch.equal(inv_t, rope_frequencies(d, base, sc)[0])  # True is the default
    p = plain(d, base)
    ramp_f = (p - inv_f.double().numpy()) / (p - p / s)
    ramp_t = (p - inv_t.double().numpy()) / (p - p / s)
    assert abs(ramp_f[16] - ramp_t[16]) > 0.04               # 0.850 vs 0.800: the rounding matters
    close(ramp_f[9:18], (np.arange(9, 18) - lo) / (hi - lo), rtol=1e-5)  # (i - 8.09)/(17.40 - 8.09)
    close(af, 0.1 * math.log(32) + 1)


# --- p-RoPE (Barbero et al. 2410.06205; HF 'proportional') ----------------------------

@pytest.mark.parametrize('p, n_rot', [(0.25, 4), (0.3, 4), (0.5, 8), (1.0, 16), (0.0, 0)])
def test_p_rope_frequencies_over_full_head_dim(p, n_rot):
    inv, af = rope_frequencies(D, BASE, p_rope=p)
    assert math.floor(p * D / 2) == n_rot
    want = [BASE ** (-2 * i / D) if i < n_rot else 0.0 for i in range(D // 2)]  # denominator: full D
    close(inv, want)
    assert af == 1.0
    # HF proportional's `factor` divides every inv_freq (zeros stay zero): nanoPE's linear scaling
    inv2, _ = rope_frequencies(D, BASE, {'type': 'linear', 'factor': 8}, p_rope=p)
    close(inv2, [w / 8 for w in want])


def test_p_rope_is_not_rotary_pct():
    pr = tiny_model('rope', pos_options={'p_rope': 0.5}).pe.at(0)          # head_dim 8: 2 of 4 pairs rotated
    rp = tiny_model('rope', pos_options={'rotary_pct': 0.5}).pe.at(0)      # rotates 4 dims as a RoPE of dim 4
    close(pr.inv_freq, [1.0, 10000 ** (-2 / 8), 0.0, 0.0])           # [1, 0.1, 0, 0]
    close(rp.inv_freq, [1.0, 10000 ** (-2 / 4)])                     # [1, 0.01]
    assert pr.rot_dim == 8 and rp.rot_dim == 4


def test_p_rope_unrotated_dims_pass_through_apply_rotary():
    """Half-split over the full head: pair i is dims (i, i + 4). Pairs 2, 3 have
    frequency 0, so dims 2, 3, 6, 7 come out unchanged; 0, 1, 4, 5 are rotated."""
    torch.manual_seed(0)
    m = tiny_model('rope', pos_options={'p_rope': 0.5})
    T = 40                                                    # past block_size too
    pos = torch.arange(T)
    ctx = m.pe.at(0).context(pos, pos)
    x = torch.randn(2, 4, T, 8)
    y = positional.apply_rotary(x, ctx.extra['cos'], ctx.extra['sin'])
    keep = [2, 3, 6, 7]
    assert torch.equal(y[..., keep], x[..., keep])
    for i, theta in ((0, 1.0), (1, 0.1)):                     # pair (i, i + 4) rotated by pos * theta
        a = pos.double() * theta
        c, s_ = a.cos().float(), a.sin().float()
        torch.testing.assert_close(y[..., i], x[..., i] * c - x[..., i + 4] * s_, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(y[..., i + 4], x[..., i + 4] * c + x[..., i] * s_, rtol=1e-5, atol=1e-5)
    q2, k2 = m.pe.at(0).transform_qk(x, x, ctx, None)
    assert torch.equal(q2[..., keep], x[..., keep])


def test_p_rope_with_dynamic_scaling_keeps_the_zeros():
    m = tiny_model('rope', pos_options={'p_rope': 0.5}, rope_scaling={'type': 'dynamic', 'factor': 4})
    pos = torch.arange(64)                                    # 4L: dynamic frequencies recomputed
    cos = m.pe.at(0).context(pos, pos).extra['cos']
    assert (cos[:, [2, 3, 6, 7]] == 1).all() and not (cos[:, [1, 5]] == 1).all()


# --- Self-Extend and ReRoPE distance maps ------------------------------------------

def self_extend_loop(qs, ks, w, G):
    """Jin et al. 2401.01325: neighbour distance i - j if i - j < w, else the grouped
    distance i//G - j//G + w - w//G."""
    return [[(i - j) if i - j < w else (i // G - j // G + w - w // G) for j in ks] for i in qs]


@pytest.mark.parametrize('w, G', [(4, 2), (5, 3), (1, 1), (3, 4), (8, 2)])
def test_self_extend_map_against_the_paper(w, G):
    T = 20
    got = rope_scaling.self_extend_positions(torch.arange(T), torch.arange(T), w, G)
    assert got.dtype == torch.int64 and got.shape == (T, T)
    assert got.tolist() == self_extend_loop(range(T), range(T), w, G)
    # one decoded query against the whole cache = the last row
    last = rope_scaling.self_extend_positions(torch.tensor([T - 1]), torch.arange(T), w, G)
    assert last.tolist() == [got[-1].tolist()]


def test_self_extend_by_hand():
    # w = 4, G = 2, query 9: keys 6..9 exact (3, 2, 1, 0); keys 0..5: 9//2 - j//2 + 4 - 2
    got = rope_scaling.self_extend_positions(torch.tensor([9]), torch.arange(10), 4, 2)
    assert got.tolist() == [[6, 6, 5, 5, 4, 4, 3, 2, 1, 0]]
    # G = 1 is plain RoPE
    assert torch.equal(rope_scaling.self_extend_positions(torch.arange(9), torch.arange(9), 3, 1),
                       torch.arange(9)[:, None] - torch.arange(9)[None, :])


def rerope_loop(qs, ks, w, k=None):
    out = []
    for i in qs:
        row = []
        for j in ks:
            r = i - j
            row.append(min(r, w) if k is None else (r if r < w else w + (r - w) / k))
        out.append(row)
    return out


@pytest.mark.parametrize('w, k', [(3, None), (1, None), (6, None), (3, 4.0), (5, 16), (2, 1.5)])
def test_rerope_map_against_su(w, k):
    T = 16
    got = rope_scaling.rerope_positions(torch.arange(T), torch.arange(T), w, leaky_k=k)
    assert got.dtype == (torch.int64 if k is None else torch.float64)
    np.testing.assert_allclose(got.numpy(), np.array(rerope_loop(range(T), range(T), w, k)), rtol=1e-15, atol=0)


def test_rerope_by_hand():
    got = rope_scaling.rerope_positions(torch.tensor([7]), torch.arange(8), 3)
    assert got.tolist() == [[3, 3, 3, 3, 3, 2, 1, 0]]
    got = rope_scaling.rerope_positions(torch.tensor([7]), torch.arange(8), 3, leaky_k=4)
    assert got.tolist() == [[4.0, 3.75, 3.5, 3.25, 3.0, 2.0, 1.0, 0.0]]


def rope_at(x, pos, inv):
    """Half-split rotation of x [T, d] at (possibly fractional) positions pos [T]."""
    ang = torch.as_tensor(pos, dtype=torch.float64)[:, None] * inv.double()[None, :]
    cos, sin = torch.cat((ang, ang), -1).cos(), torch.cat((ang, ang), -1).sin()  # float64 throughout
    return x * cos + torch.cat((-x[..., inv.numel():], x[..., :inv.numel()]), -1) * sin


def scores_at_distances(q, k, dist, inv):
    """Reference: the RoPE logit of query i and key j at relative distance dist[i, j]
    (rotate q by dist, leave k): one pair at a time."""
    T = q.size(0)
    out = torch.empty(T, T, dtype=torch.float64)
    for i in range(T):
        for j in range(T):
            out[i, j] = rope_at(q[i:i + 1], torch.tensor([float(dist[i, j])]), inv)[0] @ k[j]
    return out


def test_self_extend_two_rotations_merge_reproduce_the_map():
    """The recipe in self_extend_positions' docstring: neighbour and grouped RoPE
    logits merged by i - j < w give the RoPE logit at the map's distance for every
    pair, and equal plain RoPE's inside the window."""
    torch.manual_seed(0)
    T, d, w, G = 24, 16, 5, 3
    inv = torch.tensor(plain(d), dtype=torch.float64)
    q, k = torch.randn(T, d, dtype=torch.float64), torch.randn(T, d, dtype=torch.float64)
    i = torch.arange(T)
    neighbour = rope_at(q, i, inv) @ rope_at(k, i, inv).T
    grouped = rope_at(q, i // G + w - w // G, inv) @ rope_at(k, i // G, inv).T
    r = i[:, None] - i[None, :]
    merged = torch.where(r < w, neighbour, grouped)
    dist = rope_scaling.self_extend_positions(i, i, w, G)
    causal = r >= 0
    torch.testing.assert_close(merged[causal], scores_at_distances(q, k, dist, inv)[causal])
    inside = causal & (r < w)
    torch.testing.assert_close(merged[inside], neighbour[inside])
    assert (merged[causal & (r >= w)] - neighbour[causal & (r >= w)]).abs().max() > 1e-3


@pytest.mark.parametrize('leaky_k', [None, 4.0])
def test_rerope_two_maps_reproduce_the_map(leaky_k):
    """Su's recipe: exact logits inside the window; beyond it q at w and k unrotated
    (ReRoPE), or RoPE with inv/k with q at i + w(k - 1), k at j (leaky)."""
    torch.manual_seed(0)
    T, d, w = 20, 16, 6
    inv = torch.tensor(plain(d), dtype=torch.float64)
    q, k = torch.randn(T, d, dtype=torch.float64), torch.randn(T, d, dtype=torch.float64)
    i = torch.arange(T)
    exact = rope_at(q, i, inv) @ rope_at(k, i, inv).T
    if leaky_k is None:
        second = rope_at(q, torch.full((T,), w), inv) @ k.T
    else:
        second = rope_at(q, i + w * (leaky_k - 1), inv / leaky_k) @ rope_at(k, i, inv / leaky_k).T
    r = i[:, None] - i[None, :]
    merged = torch.where(r < w, exact, second)
    dist = rope_scaling.rerope_positions(i, i, w, leaky_k=leaky_k)
    causal = r >= 0
    torch.testing.assert_close(merged[causal], scores_at_distances(q, k, dist, inv)[causal])


def string_loop(qs, ks, S, W):
    """STRING's position matrix (An et al., arXiv 2410.18745, sec. 4): a pair r = i - j apart keeps r below
    the offset S; from S on it is shifted down by S and W is added."""
    return [[(i - j) if i - j < S else i - j - S + W for j in ks] for i in qs]


@pytest.mark.parametrize('S, W', [(4, 1), (6, 2), (1, 0), (5, 5), (13, 3)])
def test_string_map_against_the_paper(S, W):
    T = 20
    got = rope_scaling.string_positions(torch.arange(T), torch.arange(T), S, W)
    assert got.dtype == torch.int64 and got.tolist() == string_loop(range(T), range(T), S, W)
    causal = torch.arange(T)[:, None] >= torch.arange(T)[None, :]
    assert got[causal].max() == max(T - 1 - S + W, min(S, T) - 1)  # the largest distances are dropped


def test_string_by_hand():
    # query 9, keys 0..9, S = 4, W = 1: r = 9..0; r >= 4 -> r - 3
    got = rope_scaling.string_positions(torch.tensor([9]), torch.arange(10), 4, 1)
    assert got.tolist() == [[6, 5, 4, 3, 2, 1, 3, 2, 1, 0]]
    # the paper's figure 5 (L = 9, offset 3, before W is added): the largest relative position is 8 - 3 = 5
    assert rope_scaling.string_positions(torch.tensor([8]), torch.tensor([0]), 3, 0).item() == 5


def test_string_two_rotations_merge_reproduce_the_map():
    """The authors' two maps: neighbour (q at i, k at j) and shifted (q at i - S + W, k at j), merged by
    i - j < S, give the RoPE logit at STRING's distance for every pair."""
    torch.manual_seed(0)
    T, d, S, W = 24, 16, 7, 2
    inv = torch.tensor(plain(d), dtype=torch.float64)
    q, k = torch.randn(T, d, dtype=torch.float64), torch.randn(T, d, dtype=torch.float64)
    i = torch.arange(T)
    neighbour = rope_at(q, i, inv) @ rope_at(k, i, inv).T
    shifted = rope_at(q, i - S + W, inv) @ rope_at(k, i, inv).T
    r = i[:, None] - i[None, :]
    merged = torch.where(r < S, neighbour, shifted)
    dist = rope_scaling.string_positions(i, i, S, W)
    causal = r >= 0
    torch.testing.assert_close(merged[causal], scores_at_distances(q, k, dist, inv)[causal])


def test_string_options_defaults_and_errors():
    """shift defaults to int(0.33 x block_size), the authors' shifted_ratio times the length; local to 128 and
    the attention factor to 0.1 ln 2 + 1, as their code; local must lie in 0..shift."""
    m = tiny_model('rope', block_size=64, rope_scaling={'type': 'string', 'local': 4})
    assert type(m.pe.at(0)).__name__ == 'ExtendedRoPE'
    assert m.pe.at(0).scaling == {'type': 'string', 'shift': 21, 'local': 4, 'attention_factor': STRING_AF}
    assert rope_scaling.check_rope_scaling({'type': 'string', 'shift': 400})['local'] == 128
    with pytest.raises(ValueError, match=r'0 <= local <= shift'):
        tiny_model('rope', rope_scaling={'type': 'string'})  # block 16: shift 5 < local 128
    for bad in ({'shift': 0, 'local': 0}, {'shift': 4.5, 'local': 1}, {'shift': 4, 'local': -1}):
        with pytest.raises(ValueError, match='STRING needs integers'):
            rope_scaling.check_rope_scaling({'type': 'string', **bad})
    with pytest.raises(ValueError, match='attention_factor multiplies cos and sin'):
        rope_scaling.check_rope_scaling({'type': 'string', 'shift': 4, 'local': 1, 'attention_factor': 0})
    with pytest.raises(ValueError, match="needs 'shift'"):
        rope_scaling.check_rope_scaling({'type': 'string', 'local': 1})


# --- validation of the new options --------------------------------------------------

@pytest.mark.parametrize('bad, msg', [
    ({'type': 'longrope', 'long_factor': LONG, 'original_max_len': L, 'factor': 4}, "needs 'short_factor'"),
    ({'type': 'longrope', 'short_factor': SHORT, 'long_factor': LONG, 'original_max_len': L},
     "needs 'factor'"),
    (longrope(short_factor=2.0), "'short_factor' must be a non-empty list of positive numbers"),
    (longrope(long_factor=LONG[:-1] + [0.0]), "'long_factor' must be a non-empty list of positive numbers"),
    (longrope(long_factor=LONG[:-1] + ['x']), "'long_factor' must be a non-empty list"),
    (longrope(short_factor=SHORT[:3], long_factor=LONG[:3]),
     "'short_factor' has 3 entries, but the rotary dimension 32 has 16 pairs"),
    (longrope(short_factor=SHORT[:3]), 'must have the same length'),
    (longrope(beta_fast=32), 'does not take'),
    (longrope(attention_factor=0), 'attention_factor multiplies cos and sin and must be > 0'),
    (yarn(truncate='no'), "'truncate' must be True or False"),
    (yarn(truncate=0), "'truncate' must be True or False"),
    (yarn(attention_factor=-1.0), 'must be > 0'),
    (yarn(mscale=-0.5), 'yarn mscale must be >= 0'),
    (yarn(mscale_all_dim='1'), "'mscale_all_dim' must be a number"),
    ({'type': 'linear', 'factor': 2, 'truncate': False}, 'does not take'),
])
def test_bad_new_scaling_options_are_clear_errors(bad, msg):
    with pytest.raises(ValueError, match=msg.replace('(', r'\(').replace(')', r'\)').replace('[', r'\[')):
        rope_frequencies(D, BASE, bad)


def test_bad_p_rope_and_extension_maps_are_clear_errors():
    with pytest.raises(ValueError, match=r'p_rope is the fraction of rotary pairs rotated and must be in \[0, 1\]'):
        rope_frequencies(D, BASE, p_rope=1.5)
    with pytest.raises(ValueError, match='give one of them'):
        tiny_model('rope', pos_options={'p_rope': 0.5, 'rotary_pct': 0.5})
    with pytest.raises(ValueError, match='integer window >= 1 and group >= 1'):
        rope_scaling.self_extend_positions(torch.arange(4), torch.arange(4), 0, 2)
    with pytest.raises(ValueError, match='integer window >= 1 and group >= 1'):
        rope_scaling.self_extend_positions(torch.arange(4), torch.arange(4), 4, 1.5)
    with pytest.raises(ValueError, match='rerope window must be a positive integer'):
        rope_scaling.rerope_positions(torch.arange(4), torch.arange(4), 0)
    with pytest.raises(ValueError, match='leaky_k divides the distances beyond the window and must be >= 1'):
        rope_scaling.rerope_positions(torch.arange(4), torch.arange(4), 2, leaky_k=0.5)


STRING_AF = 0.1 * math.log(2) + 1  # the authors' string_for_llama.py: attention_factor on cos and sin


@pytest.mark.parametrize('ext', [{'type': 'self_extend', 'window': 6, 'group': 3}, {'type': 'rerope', 'window': 6},
                                 {'type': 'leaky_rerope', 'window': 6, 'k': 4},
                                 {'type': 'string', 'shift': 6, 'local': 2, 'attention_factor': 1.0},
                                 {'type': 'string', 'shift': 9, 'local': 3}])
def test_inference_time_extensions_score_each_pair_at_its_mapped_distance(ext):
    """Self-Extend / ReRoPE / leaky ReRoPE / STRING through the model's attention hook: a 1-layer model's
    attention equals softmax over q_i . R(d_ij) k_j with d from the papers' distance formulas
    written here per pair (STRING's logits times its attention factor squared: cos and sin carry it, on q
    and on k); inside the window it is plain RoPE; KV-cache decoding equals a full forward."""
    torch.manual_seed(0)
    m = sharpen(tiny_model('rope', n_layer=1, rope_scaling=ext)).eval()
    base = tiny_model('rope', n_layer=1).eval()
    base.load_state_dict(m.state_dict())
    T, w = 40, ext.get('window', ext.get('shift'))
    af = ext.get('attention_factor', STRING_AF) if ext['type'] == 'string' else 1.0
    x = torch.randint(0, 37, (1, T))

    def dist(i, j):
        r = i - j
        if r < w:
            return float(r)
        if ext['type'] == 'string':
            return float(r - w + ext['local'])
        if ext['type'] == 'self_extend':
            G = ext['group']
            return float(i // G - j // G + w - w // G)
        return float(w) if ext['type'] == 'rerope' else w + (r - w) / ext['k']
    attn = m.transformer.h[0].attn
    seen = {}
    attn.register_forward_hook(lambda mod, inp, out: seen.update(y=out[0]))  # (the block asks for (y, ctx))
    with torch.no_grad():
        h = m.transformer.h[0].ln_1(m.transformer.wte(x))
        q, k, v = attn.c_attn(h).split(32, dim=2)
        q, k, v = (t.view(1, T, 4, 8).transpose(1, 2)[0] for t in (q, k, v))  # [H, T, 8]
        inv = m.pe.at(0).inv_freq.double()
        ref = torch.zeros(4, T, 8, dtype=torch.float64)
        for i in range(T):
            s = []
            for j in range(i + 1):
                ang = dist(i, j) * inv  # (R_d q) . k: RoPE's score at relative distance d, half-split
                c, sn = torch.cat((ang.cos(), ang.cos())), torch.cat((ang.sin(), ang.sin()))
                qd = q[:, i].double()
                rq = qd * c + torch.cat((-qd[:, 4:], qd[:, :4]), -1) * sn
                s.append(af ** 2 * (rq * k[:, j].double()).sum(-1) / math.sqrt(8))
            a = torch.stack(s, -1).softmax(-1)
            ref[:, i] = (a.unsqueeze(1) @ v[:, :i + 1].double()).squeeze(1)  # [H, 1, i+1] @ [H, i+1, 8]
        full = m(x)[0]
        got = seen['y']  # the attention block's output: c_proj(y); compare y via the projection
        want = attn.c_proj(ref.transpose(0, 1).reshape(1, T, 32).float())
        assert torch.allclose(got, want, atol=1e-4)
        if af == 1.0:
            assert torch.allclose(full[:, :w], base(x)[0][:, :w], atol=1e-5)  # inside the window: plain RoPE
        else:
            assert not torch.allclose(full[:, 1:w], base(x)[0][:, 1:w], atol=1e-3)  # the factor sharpens
        cache = m.new_cache()
        steps = [m(x[:, :10], cache=cache)[0]] + [m(x[:, t:t + 1], cache=cache)[0] for t in range(10, T)]
        assert torch.allclose(torch.cat(steps, 1), full, atol=1e-5)


def test_extension_options_are_checked():
    with pytest.raises(ValueError, match='self-extend needs integer window'):
        tiny_model('rope', rope_scaling={'type': 'self_extend', 'window': 0, 'group': 2})
    with pytest.raises(ValueError, match="needs 'group'"):
        tiny_model('rope', rope_scaling={'type': 'self_extend', 'window': 4})
    with pytest.raises(ValueError, match='leaky_k'):
        tiny_model('rope', rope_scaling={'type': 'leaky_rerope', 'window': 4, 'k': 0.5})


def test_sweep_recipes_build_a_rope_model_at_the_default_length():
    """Every rope_scaling of sweep.py's list is valid for a model trained at L = 128 (the default char model)
    and builds the class it needs; STRING's recipe is the authors' shift 0.33 L with a scaled-down local."""
    import sweep
    dicts = sweep.scaling_dicts(sweep.SCALINGS, 16.0, 128, rot_dim=8)  # the tiny model: head dim 8
    assert [d['type'] for d in dicts][-1] == 'string' and len(dicts) == len(sweep.SCALINGS)
    assert dicts[-1] == {'type': 'string', 'shift': 42, 'local': 4}
    for sc in dicts:
        m = tiny_model('rope', block_size=128, rope_scaling=sc)
        assert type(m.pe.at(0)).__name__ == ('ExtendedRoPE' if sc['type'] in rope_scaling.EXTENSION_TYPES else 'RoPE')


@pytest.mark.parametrize('scheme', ['xpos', 'mrope', 'rope2d'])
@pytest.mark.parametrize('sc', [{'type': 'self_extend', 'window': 4, 'group': 2}, {'type': 'rerope', 'window': 4},
                                {'type': 'string', 'shift': 5, 'local': 1}])
def test_extension_types_on_other_rotary_schemes_are_refused(scheme, sc):
    """The extensions' two logit maps are ExtendedRoPE's (rope only); another rotary scheme would keep its
    frequencies and score every pair at its plain distance, so it refuses them as it refuses 'dynamic'."""
    with pytest.raises(ValueError, match=f"rope_scaling type '{sc['type']}' is implemented for pos_encoding='rope'"):
        tiny_model(scheme, rope_scaling=sc)
