"""RoPE context extension (positional.rope_frequencies and the RoPE scheme): each
formula against an independent computation written here, properties through the
real model attention, the dynamic-NTK + KV-cache choice, and run-time overrides
of a saved checkpoint."""
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import ROOT, tiny_model
import positional
from positional import rope_frequencies

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
    ({'type': 'rotary', 'factor': 2}, 'valid types: linear, ntk, dynamic, yarn, llama3'),
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
    inv = torch.tensor(plain(ref.pe.rot_dim))

    def context_at_fractional_positions(q_pos, k_pos, n_pos=None):
        cos, sin = half_split_cos_sin(q_pos.double() / s, inv)
        return positional.make_context(q_pos, k_pos, n_pos, cos=cos, sin=sin)
    ref.pe.context = context_at_fractional_positions
    x = torch.randint(0, 37, (2, T))
    with torch.no_grad():
        a, b = scaled(x)[0], ref(x)[0]
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        assert (a - plain_model(x)[0]).abs().max() > 1e-2   # and scaling did change the logits


def test_yarn_scales_logits_by_attention_factor_squared():
    m = tiny_model('rope', rope_scaling={'type': 'yarn', 'factor': 4})
    inv, af = rope_frequencies(m.pe.rot_dim, 10000.0, {'type': 'yarn', 'factor': 4, 'original_max_len': 16})
    pos = torch.arange(40)
    ctx = m.pe.context(pos, pos)
    q, k = torch.randn(2, 4, 40, 8), torch.randn(2, 4, 40, 8)
    q2, k2 = m.pe.transform_qk(q, k, ctx, None)
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
    before = dict(vars(m.pe))
    lengths = (8, 64, 24, 64, 16)
    x = torch.randint(0, 37, (1, 64))
    with torch.no_grad():
        for T in lengths:
            fresh = tiny_model('rope', rope_scaling=sc)
            assert torch.equal(m(x[:, :T])[0], fresh(x[:, :T])[0])
    assert vars(m.pe).keys() == before.keys() and all(vars(m.pe)[k] is v for k, v in before.items())


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
    d = m.pe.rot_dim
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
    from eval import load_checkpoint
    import pickle
    vocab = pickle.load(open(os.path.join(char_data, 'meta.pkl'), 'rb'))['vocab_size']
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
    out = subprocess.run([sys.executable, 'eval.py', f'--out_dir={tmp_path}', '--mults=1,2', '--tokens=256',
                          "--rope_scaling={'type':'ntk','factor':2}"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "trained with rope_scaling=None, evaluating with rope_scaling={'type': 'ntk', 'factor': 2}" in out.stdout
    assert 'val/loss@2L' in out.stdout


def test_finetune_from_checkpoint_keeps_new_length_and_scaling(tmp_path, char_data):
    import pickle
    vocab = pickle.load(open(os.path.join(char_data, 'meta.pkl'), 'rb'))['vocab_size']
    m = tiny_model('rope', vocab_size=vocab)
    save_ckpt(m, str(tmp_path / 'src.pt'), char_data)
    sc = "{'type':'yarn','factor':2,'original_max_len':16}"
    out = subprocess.run([sys.executable, 'train.py', f'--init_from={tmp_path / "src.pt"}', f'--out_dir={tmp_path}/ft',
                          f'--data_dir={char_data}', '--block_size=32', f'--rope_scaling={sc}', '--n_layer=9',
                          '--max_iters=2', '--eval_interval=2', '--eval_mults=[0.5, 1]', '--eval_tokens=64',
                          '--batch_size=2', '--compile=False', '--wandb_log=False', '--device=cpu'],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert 'eval @ iter 0: 0.5L' in out.stdout               # "before" at the original L
    ck = torch.load(tmp_path / 'ft' / 'ckpt.pt', weights_only=False)
    a = ck['model_args']
    assert a['block_size'] == 32 and a['rope_scaling']['type'] == 'yarn'
    assert a['n_layer'] == 2 and a['n_embd'] == 32            # architecture from the source checkpoint


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
        assert not torch.equal(b.pe.inv_freq, tiny_model('mrope').pe.inv_freq)  # the scaling is applied
