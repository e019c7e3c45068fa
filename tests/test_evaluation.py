"""Evaluation protocols, passkey generator/checker, and the compare report."""
import glob
import json
import math
import os
import re

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from conftest import TINY, fork_run, tiny_config, tiny_model

import evaluation as E
import passkey as P

V = 37


def rand_data(n, seed=0):
    return np.random.default_rng(seed).integers(0, V, n).astype(np.uint16)


class Unigram(nn.Module):
    """A stub 'model' whose prediction depends only on the current token, so a token's
    loss is the same whatever window it is scored in: sums of scored losses then tell
    exactly which targets were scored."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.table = nn.Parameter(torch.randn(V, V))
        self.config = tiny_config('none')

    def forward(self, idx, targets=None, reduction='mean', last=None):  # GPT.forward's evaluation API
        logits = self.table[idx if last is None else idx[:, -last:]]
        if targets is None:
            return logits, None
        assert reduction == 'none'
        return None, F.cross_entropy(logits.transpose(1, 2), targets, reduction='none')

    def token_losses(self, data):
        d = torch.from_numpy(data.astype(np.int64))
        return F.cross_entropy(self.table[d[:-1]], d[1:], reduction='none').double()  # loss of target j at [j-1]


# --- windows and protocols ------------------------------------------------------

@pytest.mark.parametrize("n_data,T,S,n,runs", [(1000, 16, 16, 20, 4), (1000, 16, 4, 37, 5), (5000, 64, 8, 100, 16),
                                               (300, 64, 8, 100, 16), (65, 64, 64, 3, 2)])
def test_layout_scores_each_token_at_most_once_in_contiguous_runs(n_data, T, S, n, runs):
    starts = E.window_layout(n_data, T, S, n, runs)
    count = np.zeros(n_data, dtype=int)
    for s in starts:
        assert 0 <= s and s + T + 1 <= n_data            # inputs and the last target are in the data
        count[s + T - S + 1:s + T + 1] += 1               # the targets of the last S positions
    assert count.max() == 1                               # no token scored twice
    assert count.sum() == len(starts) * S
    assert len(starts) >= min(n, (n_data - T - 1) // S + 1)  # asked-for count unless the data is too short
    # inside a run, windows are S apart and their scored targets tile a contiguous range
    assert all(g == S or g >= T + 1 for g in np.diff(starts))


def test_sliding_scores_exactly_the_targets_of_each_run():
    """With a context-free stub, the sliding loss of one run must equal the mean loss of
    exactly the targets T-S+1 .. end of that run: each once, none missed, none extra."""
    data = rand_data(3000)
    m = Unigram()
    tl = m.token_losses(data)  # tl[j-1] = loss of target j
    for T, S, n in [(32, 8, 50), (32, 32, 10), (64, 5, 101)]:
        got = E.sliding_loss(m, data, T, S, tokens=n * S, runs=1, batch_tokens=100)
        first, last = T - S + 1, T - S + 1 + n * S  # target indices [first, last)
        want = tl[first - 1:last - 1].mean().item()
        assert got == pytest.approx(want, rel=1e-6), (T, S)  # float32 per-token losses


@pytest.mark.parametrize("scheme", ['rope', 'alibi', 'learned'])
def test_sliding_with_stride_T_equals_nonoverlapping(scheme):
    model = tiny_model(scheme).eval()  # block_size 16
    data = rand_data(2000, seed=1)
    T, n = 16, 12
    x = torch.from_numpy(data[:n * T].astype(np.int64)).view(n, T)
    y = torch.from_numpy(data[1:n * T + 1].astype(np.int64)).view(n, T)
    with torch.no_grad():
        _, direct = model(x, y)  # the model's own loss over contiguous non-overlapping windows
    slid = E.sliding_loss(model, data, T, T, tokens=n * T, runs=1, batch_tokens=5 * T)  # padded last batch
    nonov, _ = E.nonoverlap_loss(model, data, T, tokens=n * T, runs=1)
    assert slid == pytest.approx(direct.item(), rel=1e-5)
    assert nonov == pytest.approx(direct.item(), rel=1e-5)


@pytest.mark.parametrize("scheme", ['rope', 'alibi'])
def test_position_curve_averages_to_the_total(scheme):
    model = tiny_model(scheme).eval()
    data = rand_data(4000, seed=2)
    T, n = 32, 9
    total, curve = E.nonoverlap_loss(model, data, T, tokens=n * T, runs=1, batch_tokens=4 * T)
    x = torch.from_numpy(data[:n * T].astype(np.int64)).view(n, T)
    y = torch.from_numpy(data[1:n * T + 1].astype(np.int64)).view(n, T)
    with torch.no_grad():
        _, per_tok = model(x, y, reduction='none')
    per_tok = per_tok.view(n, T)
    assert curve.shape == (T,)
    assert curve.mean().item() == pytest.approx(per_tok.mean().item(), rel=1e-5)
    assert total == pytest.approx(per_tok.mean().item(), rel=1e-5)
    torch.testing.assert_close(curve.float(), per_tok.mean(0), rtol=1e-5, atol=1e-6)
    # position 0 sees only its own token: a 1-token forward must give the same loss
    with torch.no_grad():
        _, first = model(x[:, :1], y[:, :1])
    assert curve[0].item() == pytest.approx(first.item(), rel=1e-5)


def test_last_k_scores_the_same_targets_at_every_length():
    """Context-free stub: the loss of the last k tokens cannot depend on the window length
    unless different targets were scored."""
    data = rand_data(5000, seed=3)
    m = Unigram()
    tl = m.token_losses(data)
    k, spans = 8, 10
    losses = E.last_k_loss(m, data, k, [8, 16, 64, 256], spans=spans, batch_tokens=64)
    assert np.ptp(losses) < 1e-6
    ends = np.linspace(256, len(data) - 1, spans).astype(int)  # independent: targets end at each end
    want = np.mean([tl[e - k:e].mean().item() for e in ends])
    assert losses[0] == pytest.approx(want, rel=1e-6)


def test_evaluate_skips_lengths_past_a_position_table():
    """Past its table, learned has no non-overlapping or position numbers; its sliding numbers
    come from its longest window (the fallback), which the result says."""
    model = tiny_model('learned')  # 16 positions
    data = rand_data(6000, seed=4)
    res = E.evaluate(model, data, 16, mults=(1, 2, 4), tokens=256, sliding_tokens=64, last_k_spans=4)
    assert res['nonoverlap'][0] is not None and res['nonoverlap'][1:] == [None, None]
    assert res['sliding_window'] == [16, 16, 16]
    assert model.training  # evaluate restores the mode it found
    want = E.sliding_loss(model.eval(), data, 16, 8, 64)
    assert res['sliding'] == pytest.approx([want] * 3)
    assert res['position'][1:] == [None, None] and len(res['position'][0]) == 16
    assert max(res['last_k']['context']) + res['last_k']['k'] <= 16


# --- LongPPL --------------------------------------------------------------------------

def test_longppl_key_tokens_and_value_by_hand():
    """Key token: LSD = short_loss - long_loss > 2 and LCL = -long_loss > -2, both strict (the authors'
    loss_short - loss_full > 2 and loss_full < 2); LongPPL's loss is the mean long loss over the keys."""
    long_ = [0.5, 1.0, 3.0, 0.2, 1.0, 2.0, 0.1]
    short = [3.0, 1.5, 6.0, 2.5, 3.0, 4.5, 0.1]
    #        key  LSD .5 LCL -3 key  LSD=2 LCL=-2 LSD 0
    assert E.key_tokens(torch.tensor(long_), torch.tensor(short)).tolist() == [True, False, False, True, False,
                                                                               False, False]
    loss, n = E.longppl(long_, short)
    assert n == 2 and loss == pytest.approx((0.5 + 0.2) / 2) and math.exp(loss) == pytest.approx(math.exp(0.35))
    assert E.longppl([1.0, 2.5], [1.5, 3.0]) == (None, 0)
    assert E.key_tokens(torch.tensor([1.0]), torch.tensor([2.5]), alpha=1.0, beta=-1.5).tolist() == [True]


class Copier(nn.Module):
    """A stub whose prediction needs context D back: the target of input t is scored with logit C(src) on the
    token src = input t + 1 - D when the window holds it (C = 6 + src % 5), uniform logits otherwise."""
    D = 12

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))
        self.config = tiny_config('none')
        self.pe = type('PE', (), {'max_len': None, 'addresses': staticmethod(lambda T: True)})()

    def forward(self, idx, targets=None, reduction='mean', last=None):
        B, T = idx.shape
        logits = torch.zeros(B, T, V)
        for t in range(self.D - 1, T):
            src = idx[:, t + 1 - self.D]
            logits[torch.arange(B), t, src] = 6.0 + (src % 5).float()
        logits = logits if last is None else logits[:, -last:]
        return None, F.cross_entropy(logits.transpose(1, 2), targets, reduction='none')


def test_longppl_finds_the_tokens_only_the_long_context_predicts():
    """Copier data: random tokens, about half of them repeating the token D = 12 back. For each window's last k
    targets, the long context (the whole window) reaches the source and the short one (the window's last S
    inputs, a fresh forward) does so only for the later targets: the keys are the repeats whose source the
    short context misses. Losses written here from the logits' formula, per target."""
    rng = np.random.default_rng(0)
    data = rng.integers(0, V, 3000)
    rep = rng.random(3000) < 0.5
    for p in range(Copier.D, 3000):
        if rep[p]:
            data[p] = data[p - Copier.D]
    data = data.astype(np.uint16)
    m, S, k, n = Copier(), 16, 8, 6
    for T in (32, 64):
        lp = {'short': S, 'k': k, 'long': [], 'short_loss': []}
        E.nonoverlap_loss(m, data, T, tokens=n * T, runs=1, longppl=lp, batch_tokens=4 * T)  # windows at 0, T, ..
        want_long, want_short = [], []
        for s in range(0, n * T, T):
            for j in range(T - k, T):  # target data[s + 1 + j], seen from input j of the window
                tgt, src = int(data[s + 1 + j]), int(data[s + 1 + j - Copier.D])
                c = 6.0 + src % 5
                seen = math.log(math.exp(c) + V - 1) - (c if tgt == src else 0.0)
                want_long.append(seen)  # j + 1 - D >= 0 always here: the window holds the source
                short_holds = j - (T - S) + 1 - Copier.D >= 0
                want_short.append(seen if short_holds else math.log(V))
        got_long, got_short = torch.cat(lp['long']).flatten(), torch.cat(lp['short_loss']).flatten()
        np.testing.assert_allclose(got_long.numpy(), want_long, rtol=1e-5, atol=1e-5)  # float32 losses
        np.testing.assert_allclose(got_short.numpy(), want_short, rtol=1e-5, atol=1e-5)
        key = [sh - lo > 2 and lo < 2 for lo, sh in zip(want_long, want_short)]
        assert 0 < sum(key) < len(key)
        assert E.key_tokens(got_long, got_short).tolist() == key
        loss, nk = E.longppl(got_long, got_short)
        assert nk == sum(key) and loss == pytest.approx(np.mean([lo for lo, kk in zip(want_long, key) if kk]),
                                                        rel=1e-3)
    res = E.evaluate(m, data, 16, mults=(1, 2, 4), tokens=512, sliding_tokens=64, last_k_spans=4, longppl_k=k)
    lp = res['longppl']
    assert (lp['short'], lp['k'], lp['alpha'], lp['beta'], lp['evaluator']) == (16, k, 2.0, -2.0, 'self')
    assert lp['loss'][0] is None and lp['key_tokens'][0] is None  # 1L: no context past the short one
    assert lp['candidates'][1:] == [512 // 32 * k, 512 // 64 * k] and all(x > 0 for x in lp['key_tokens'][1:])
    assert E.flat_metrics(res)['val/longppl@2L'] == lp['loss'][1]
    assert 'longppl' not in E.evaluate(m, data, 16, mults=(1, 2), tokens=512, quick=True)
    calls = []
    part = E.evaluate(m, data, 16, mults=(1, 2, 4), tokens=512, longppl_k=k,
                      stop=lambda: calls.append(1) or len(calls) > 2)
    assert not part['complete'] and part['longppl']['loss'][1] == lp['loss'][1]  # stopped in the 4L windows
    assert all(part['longppl'][key][2] is None and len(part['longppl'][key]) == 3 for key in
               ('loss', 'key_tokens', 'candidates', 'candidates_loss'))


# --- passkey ------------------------------------------------------------------------

@pytest.mark.parametrize("T", [65, 128, 300, 2048])
@pytest.mark.parametrize("depth", [0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0])
def test_passkey_key_at_requested_depth(T, depth):
    rng = np.random.default_rng(int(T * 10 + depth * 10))
    prompt, key = P.make_prompt(T, depth, rng)
    assert len(prompt) + len(key) == T + 1
    assert re.fullmatch(r'[0-9]{5}', key)
    assert prompt.endswith("What is the pass key? The pass key is ")
    assert prompt.count(key) == 1 and prompt.count("The pass key is ") == 2
    n_filler = T + 1 - len("The pass key is 12345. ") - len("What is the pass key? The pass key is ") - 5
    before = prompt.index(f"The pass key is {key}. ")
    assert abs(before - depth * n_filler) <= len("yellow. ")  # snapped to a word start: within one word
    assert set(prompt) <= set("The grass is green. The sky is blue. The sun is yellow. Here we go. "
                              "There and back again. What is the pass key?0123456789")


def test_passkey_answer_checker():
    T, B = 100, 6
    rng = np.random.default_rng(0)
    ids, answer_at = P.make_batch(lambda s: [ord(c) - 32 for c in s], T, [0.5] * B, rng)
    assert ids.shape == (B, T + 1) and answer_at == [T + 1 - 5] * B

    def oracle(seq):  # logits whose argmax at t is seq[t + 1]
        return F.one_hot(seq[:, 1:], 100).float()
    assert P.answer_correct(oracle(ids), ids, answer_at) == [True] * B
    wrong = ids.clone()
    wrong[0, -1] = (wrong[0, -1] + 1) % 100   # last digit wrong
    wrong[1, answer_at[1]] = (wrong[1, answer_at[1]] + 1) % 100   # first digit wrong
    wrong[2, answer_at[2] - 3] = (wrong[2, answer_at[2] - 3] + 1) % 100  # a prompt token wrong: does not count
    assert P.answer_correct(oracle(wrong), ids, answer_at) == [False, False, True, True, True, True]
    assert P.digit_correct(oracle(wrong), ids, answer_at)[:3] == pytest.approx([0.8, 0.8, 1.0])
    # one-hot logits: CE is log(e + 99) - 1 where the 1 sits on the target, log(e + 99) where it does not
    right, miss = np.log(np.e + 99) - 1, np.log(np.e + 99)
    assert P.answer_loss(oracle(wrong), ids, answer_at)[:3] == pytest.approx(
        [(4 * right + miss) / 5, (4 * right + miss) / 5, right], rel=1e-5)
    shifted = F.one_hot(ids[:, :-1], 100).float()  # predicts the current token: off by one
    assert not any(P.answer_correct(shifted, ids, answer_at))


# --- compare ------------------------------------------------------------------------

def test_compare_report_from_fixture_jsons(tmp_path):
    import report
    mults = [1, 2, 4]
    runs = {
        'rope': ({'scheme': 'rope', 'rope_scaling': None, 'block_size': 8, 'mults': mults, 'lengths': [8, 16, 32],
                  'nonoverlap': [1.5, 1.75, 2.125], 'sliding': [1.25, 1.5, 3.0], 'stride': 4,
                  'position': [[1.0] * 8, [1.0] * 16, [1.0] * 16 + [2.0] * 16],
                  'last_k': {'k': 2, 'context': [6, 14, 30], 'loss': [1.1, 1.2, 1.3]}},
                 {'scheme': 'rope', 'rope_scaling': None, 'mults': mults, 'depths': [0.0, 1.0], 'block_size': 8,
                  'acc': [[1.0, 0.5], [0.0, 0.25], [0.0, 0.0]]}),
        'learned': ({'scheme': 'learned', 'rope_scaling': None, 'block_size': 8, 'mults': mults,
                     'lengths': [8, 16, 32], 'nonoverlap': [1.4, None, None], 'sliding': [1.3, None, None],
                     'stride': 4, 'position': [[1.0] * 8, None, None],
                     'last_k': {'k': 2, 'context': [6], 'loss': [1.05]}},
                    {'scheme': 'learned', 'rope_scaling': None, 'mults': mults, 'depths': [0.0, 1.0],
                     'block_size': 8, 'acc': [[1.0, 1.0], None, None]}),
    }
    dirs = []
    for name, (ev, pk) in runs.items():
        d = tmp_path / name
        d.mkdir()
        (d / 'eval.json').write_text(json.dumps(ev))
        (d / 'passkey.json').write_text(json.dumps(pk))
        dirs.append(str(d))
    rows = [{'iter': 0, 'val/loss@1L': 4.0},
            {'iter': 10, 'train/loss': 3.0, 'tokens_per_s': 100.0, 'ms_per_iter': 999.0},
            {'iter': 20, 'train/loss': 2.5, 'tokens_per_s': 1000.0, 'ms_per_iter': 4.0},
            {'iter': 30, 'train/loss': 2.0, 'tokens_per_s': 3000.0, 'ms_per_iter': 2.0}]
    (tmp_path / 'rope' / 'metrics.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
    yarn = dict(runs['rope'][0], rope_scaling={'type': 'yarn', 'factor': 4}, nonoverlap=[1.6, 1.7, 1.8])
    (tmp_path / 'rope' / 'eval_yarn_x4.json').write_text(json.dumps(yarn))
    quick = {k: runs['rope'][0][k] for k in ('scheme', 'rope_scaling', 'block_size', 'mults', 'lengths')}
    quick.update(nonoverlap=[1.55, 1.8, 2.2], quick=True)  # eval.py --quick=True: its own file, its own row
    (tmp_path / 'rope' / 'eval_quick.json').write_text(json.dumps(quick))
    path = report.make_report(dirs, str(tmp_path / 'report'))
    md = open(path).read()
    assert '| rope | 1 | 1.500 | 1.750 | 2.125 |' in md
    assert '| rope +quick | 1 | 1.550 | 1.800 | 2.200 |' in md
    assert '| rope +yarn_x4 | 1 | 1.600 | 1.700 | 1.800 |' in md
    assert '| learned | 1 | 1.400 | — | — |' in md
    assert '| rope | 1 | 1.250 | 1.500 | 3.000 |' in md           # sliding table
    assert '| rope | 1 | 0.75 | 0.12 | 0.00 |' in md             # passkey, mean over depths
    assert '| learned | 1 | 1.00 | — | — |' in md
    assert '| rope | 1 | 2.000 | 2,000 | 3.0 |' in md             # training: last loss, medians past the first log
    for png in ('loss_vs_length.png', 'loss_vs_position.png', 'last_k.png', 'passkey.png'):
        p = tmp_path / 'report' / png
        assert p.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n' and p.stat().st_size > 5000
        assert f'({png})' in md


def test_compare_over_seeds_cells_paired_intervals_ties_and_aggregate(tmp_path):
    """Three seeds of two schemes and one of a third: cells mean ± sd (min–max) with n, the
    difference from rope paired by seed with its t interval, a ranking that ties what the
    seeds do not separate, aggregate.json with the same numbers; values computed by hand."""
    import report
    base = {'rope_scaling': None, 'block_size': 8, 'mults': [1, 2], 'lengths': [8, 16]}
    losses = {'rope': {1: [2.0, 2.2, 2.1], 2: [3.0, 3.4, 3.2]},
              'alibi': {1: [1.9, 2.15, 2.1], 2: [2.5, 2.8, 2.7]},   # 2L: rope - 0.5, -0.6, -0.5 at each seed
              'none': {1: [2.5], 2: [2.9]}}
    dirs = []
    for scheme, by_m in losses.items():
        for i, seed in enumerate(range(len(by_m[1]))):
            d = tmp_path / f'{scheme}-s{seed}'
            d.mkdir()
            (d / 'eval.json').write_text(json.dumps(dict(base, scheme=scheme, seed=seed,
                                                         nonoverlap=[by_m[1][i], by_m[2][i]])))
            dirs.append(str(d))
    md = open(report.make_report(dirs, str(tmp_path / 'report'))).read()
    # rope 1L: mean 2.1, sd 0.1; 2L: mean 3.2, sd 0.2
    assert '| rope | 3 | 2.100 ± 0.100 (2.000–2.200) | 3.200 ± 0.200 (3.000–3.400) |' in md
    assert '| none | 1 | 2.500 | 2.900 |' in md
    # alibi - rope at 2L: d = -0.5, -0.6, -0.5: mean -0.5333, sd 0.05774, half-width 4.3027 * 0.05774 / sqrt(3)
    half = 4.302653 * (0.1 / math.sqrt(3)) / math.sqrt(3)
    assert f"{-0.5333:+.3f} [{-0.53333 - half:+.3f}, {-0.53333 + half:+.3f}] *" in md
    assert '| none | +0.500 (n=1) | -0.100 (n=1) |' in md  # seed 0 only: 2.5 - 2.0, 2.9 - 3.0
    assert '- 2L (16): 1. alibi, 1. none, 2. rope' in md  # none has one seed: nothing separates it
    assert '- 1L (8): 1. alibi, 1. rope, 1. none' in md   # alibi - rope = -0.1, -0.05, 0: not separated
    agg = json.load(open(tmp_path / 'report' / 'aggregate.json'))
    assert agg['interval'] == 'paired t, 95%' and agg['baseline'] == 'rope'
    cell = agg['nonoverlap']['2']
    assert cell['runs']['rope']['n'] == 3 and cell['runs']['rope']['sd'] == pytest.approx(0.2)
    assert cell['runs']['alibi']['seeds'] == {'0': 2.5, '1': 2.8, '2': 2.7}
    p = cell['paired_vs_rope']['alibi']
    assert p['diff'] == pytest.approx(-0.53333, abs=1e-4) and p['hi'] == pytest.approx(-0.53333 + half, abs=1e-4)
    assert p['excludes_zero']
    # the leaderboard: by place at the first length, then by mean; mean ± sd, paired difference, place per end
    half1 = 4.302653 * 0.05 / math.sqrt(3)  # alibi - rope at 1L: -0.1, -0.05, 0
    assert (f"| alibi | 3 | 2.050 ± 0.132 | -0.050 [{-0.05 - half1:+.3f}, {-0.05 + half1:+.3f}] | 1 | "
            f"2.667 ± 0.153 | -0.533 [{-0.53333 - half:+.3f}, {-0.53333 + half:+.3f}] * | 1 |\n"
            "| rope | 3 | 2.100 ± 0.100 | 0 | 1 | 3.200 ± 0.200 | 0 | 2 |\n"
            "| none | 1 | 2.500 | +0.500 (n=1) | 1 | 2.900 | -0.100 (n=1) | 1 |") in md
    # the plot's band is each length's lowest and highest seed; a length a seed lacks has none
    rope = [json.load(open(os.path.join(d, 'eval.json'))) for d in dirs if '/rope-' in d]
    assert report.seed_band(rope, 'nonoverlap') == [(1, 2.0, 2.2), (2, 3.0, 3.4)]
    rope[1]['nonoverlap'] = [2.2, None]
    assert report.seed_band(rope, 'nonoverlap') == [(1, 2.0, 2.2)] and report.seed_band(rope, 'sliding') == []


def test_leaderboard_over_sweeps_joins_lm_and_task_columns(tmp_path, capsys):
    """compare.py --leaderboard=True over an LM sweep's and a task sweep's folders: one row per run, by place at
    the longest length, then by that column's ranking; loss columns at the longest length and at L (3 digits),
    exact match past N per task (2 digits); a run one sweep lacks has '—' there, n is its most seeds in any column;
    a folder without a report is one line naming it."""
    import compare

    def col(runs, paired, ranking):
        return {'runs': {lab: dict(zip(('n', 'mean', 'sd'), v)) for lab, v in runs.items()},
                'paired_vs_rope': {lab: dict(zip(('n', 'diff', 'lo', 'hi', 'excludes_zero'), v))
                                   for lab, v in paired.items()}, 'ranking': ranking}
    lm = {'nonoverlap': {
        '1': col({'rope': (3, 1.655, 0.01), 'alibi': (3, 1.707, 0.004)}, {'alibi': (3, 0.052, 0.03, 0.074, True)},
                 [[1, 'rope', 1.655], [2, 'alibi', 1.707]]),
        '16': col({'rope': (3, 2.848, 0.191), 'alibi': (3, 1.688, 0.003)},
                  {'alibi': (3, -1.16, -1.63, -0.69, True)}, [[1, 'alibi', 1.688], [2, 'rope', 2.848]]),
        '2': col({'rope': (3, 1.833, 0.05)}, {}, [[1, 'rope', 1.833]])}}
    passkey = col({'rope': (3, 0.41, 0.15), 'none': (3, 0.884, 0.15), 'alibi': (2, 0.6, 0.1)},
                  {'none': (3, 0.474, 0.1, 0.85, True), 'alibi': (2, 0.2, -3.0, 3.4, False)},
                  [[1, 'none', 0.884], [1, 'alibi', 0.6], [2, 'rope', 0.41]])
    tasks = {'exact_ood': {'passkey': passkey}}
    for name, agg in (('lm', lm), ('tasks', tasks)):
        (tmp_path / name / 'report').mkdir(parents=True)
        (tmp_path / name / 'report' / 'aggregate.json').write_text(json.dumps(agg))
    compare.main(['--leaderboard=True', str(tmp_path / 'lm'), str(tmp_path / 'tasks')])
    md = capsys.readouterr().out
    assert '| run | n | 16L | − rope | place | 1L | − rope | place | passkey past N | − rope | place |' in md
    assert ("| alibi | 3 | 1.688 ± 0.003 | -1.160 [-1.630, -0.690] * | 1 | 1.707 ± 0.004 | +0.052 [+0.030, +0.074] * "
            "| 2 | 0.60 ± 0.10 | +0.20 [-3.00, +3.40] | 1 |\n"
            "| rope | 3 | 2.848 ± 0.191 | 0 | 2 | 1.655 ± 0.010 | 0 | 1 | 0.41 ± 0.15 | 0 | 2 |\n"
            "| none | 3 | — | — | — | — | — | — | 0.88 ± 0.15 | +0.47 [+0.10, +0.85] * | 1 |\n") in md
    # --columns keeps the named columns in its order; a name that is not a column is one line naming those that are
    compare.main(['--leaderboard=True', '--columns=passkey,16L', str(tmp_path / 'lm'), str(tmp_path / 'tasks')])
    md = capsys.readouterr().out
    assert ('| run | n | passkey past N | − rope | place | 16L | − rope | place |\n'
            '|---|---|---|---|---|---|---|---|\n'
            '| none | 3 | 0.88 ± 0.15 | +0.47 [+0.10, +0.85] * | 1 | — | — | — |\n') in md
    with pytest.raises(SystemExit) as e:
        compare.main(['--leaderboard=True', '--columns=sort,16L', str(tmp_path / 'lm'), str(tmp_path / 'tasks')])
    assert str(e.value) == (f"--columns: no column sort in {tmp_path / 'lm'}, {tmp_path / 'tasks'}; these exist: "
                            "1L,16L,2L,passkey")
    compare.main(['--leaderboard=True', '--columns=2L', str(tmp_path / 'lm')])  # any length, not only the ends
    assert '| rope | 3 | 1.833 ± 0.050 | 0 | 1 |' in capsys.readouterr().out
    # a second sweep with the same task keeps its own column, named after its folder
    (tmp_path / 'more' / 'report').mkdir(parents=True)
    (tmp_path / 'more' / 'report' / 'aggregate.json').write_text(json.dumps(
        {'exact_ood': {'passkey': col({'rope': (1, 0.9, 0)}, {}, [[1, 'rope', 0.9]])}}))
    compare.main(['--leaderboard=True', str(tmp_path / 'tasks'), str(tmp_path / 'more')])
    assert '| run | n | passkey past N | − rope | place | passkey past N (more) | − rope | place |\n' in \
        capsys.readouterr().out
    compare.main(['--leaderboard=True', '--columns=passkey@more', str(tmp_path / 'tasks'), str(tmp_path / 'more')])
    assert '| rope | 1 | 0.90 | 0 | 1 |' in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        compare.main(['--leaderboard=True', str(tmp_path / 'lm'), str(tmp_path)])
    assert str(e.value) == (f"{tmp_path / 'report' / 'aggregate.json'}: missing or not a JSON object; run the sweep "
                            f"(or compare.py) on {tmp_path} first")


def test_doc_aware_windows_never_cross_eot(monkeypatch):
    """evaluate(doc_eot=...) scores only windows inside one document, each from its start."""
    import evaluation as E
    from conftest import tiny_model
    eot = 0
    rng = np.random.default_rng(0)
    docs = [rng.integers(1, 37, size=n) for n in (40, 75, 9, 130, 64)]
    data = np.concatenate([np.append(d, eot) for d in docs]).astype(np.uint16)
    seen = []
    real = E.window_losses

    def spy(model, data_, T, starts, n_score, **kw):
        seen.append((T, list(starts)))
        return real(model, data_, T, starts, n_score, **kw)
    monkeypatch.setattr(E, 'window_losses', spy)
    doc_starts = set(np.concatenate(([0], np.flatnonzero(data == eot) + 1)).tolist())
    E.evaluate(tiny_model('alibi').eval(), data, 16, mults=(1, 2), tokens=512, quick=True, doc_eot=eot)
    assert [T for T, _ in seen] == [16, 32]
    for T, starts in seen:
        assert starts
        for s in starts:
            assert eot not in data[s:s + T + 1]                      # inputs and targets in one document
            assert any((s - d) % T == 0 and s >= d and eot not in data[d:s] for d in doc_starts)  # tiled from its start


def test_eval_records_the_standard_error_of_each_mean_loss():
    """Every length and protocol carries the standard error of its mean loss over windows: checked
    against per-window losses computed here with plain cross-entropy, one window at a time."""
    import evaluation as E
    import torch.nn.functional as F
    from conftest import tiny_model
    assert E.standard_error([1.0, 2.0, 3.0, 4.0]) == pytest.approx(math.sqrt(5 / 3) / 2)  # sd / sqrt(n)
    assert E.standard_error([2.0]) is None
    model = tiny_model('alibi').eval()
    data = np.random.default_rng(3).integers(0, 37, size=4000).astype(np.uint16)
    res = E.evaluate(model, data, 16, mults=(1, 2), tokens=512, stride=8, sliding_tokens=256, batch_tokens=64)
    for i, T in enumerate((16, 32)):
        starts = E.window_layout(len(data), T, T, 512 // T, 16)
        per = []
        with torch.no_grad():
            for s in starts:
                x = torch.from_numpy(data[s:s + T + 1].astype(np.int64))[None]
                logits = model(x[:, :-1], x[:, 1:])[0]
                per.append(F.cross_entropy(logits[0], x[0, 1:]).item())
        assert res['nonoverlap_windows'][i] == len(per)
        assert res['nonoverlap'][i] == pytest.approx(np.mean(per), abs=1e-5)
        assert res['nonoverlap_se'][i] == pytest.approx(np.std(per, ddof=1) / math.sqrt(len(per)), rel=1e-4)
    assert len(res['sliding_se']) == 2 and all(v > 0 for v in res['sliding_se'])
    assert len(res['last_k']['se']) == len(res['last_k']['loss']) and all(v > 0 for v in res['last_k']['se'])


def test_compare_report_has_longppl_over_seeds(tmp_path):
    """LongPPL's loss per length over seeds with the paired difference from rope, and the key-token counts
    (mean over seeds) beside it; a length where no run has a key token (1L) gets no column, and with no key
    token anywhere the report says so in one line instead of a table of dashes."""
    import report
    base = {'rope_scaling': None, 'block_size': 8, 'mults': [1, 2], 'lengths': [8, 16], 'nonoverlap': [2.0, 2.5]}
    runs = {('rope', 1): ([None, 0.5], [None, 10]), ('rope', 2): ([None, 0.7], [None, 14]),
            ('alibi', 1): ([None, 0.25], [None, 30]), ('alibi', 2): ([None, 0.35], [None, 40])}
    dirs = []
    for (scheme, seed), (loss, keys) in runs.items():
        d = tmp_path / f'{scheme}-s{seed}'
        d.mkdir()
        lp = {'alpha': 2.0, 'beta': -2.0, 'short': 8, 'k': 2, 'evaluator': 'self', 'loss': loss, 'key_tokens': keys,
              'candidates': [None, 64], 'candidates_loss': [None, 2.4]}
        (d / 'eval.json').write_text(json.dumps(dict(base, scheme=scheme, seed=seed, longppl=lp)))
        dirs.append(str(d))
    md = open(report.make_report(dirs, str(tmp_path / 'report'))).read()
    assert 'LongPPL: loss on the key tokens' in md and 'the last 8 tokens alone by > 2 nats and its loss is < 2' in md
    assert '| run | n | 2L (16) |\n' in md and '| rope | 2 | 0.600 ± 0.141 (0.500–0.700) |' in md
    assert '| alibi | 2 | 0.300 ± 0.071 (0.250–0.350) |' in md
    assert '| alibi | -0.300 [' in md  # 0.25 - 0.5 and 0.35 - 0.7: paired mean -0.3
    assert '| rope | 2 | — / — | 12 / 64 |' in md and '| alibi | 2 | — / — | 35 / 64 |' in md
    for d in dirs:
        e = json.load(open(os.path.join(d, 'eval.json')))
        e['longppl'].update(loss=[None, None], key_tokens=[None, 0])
        json.dump(e, open(os.path.join(d, 'eval.json'), 'w'))
    md = open(report.make_report(dirs, str(tmp_path / 'report'))).read()
    assert 'LongPPL: no key tokens at any length' in md and 'LongPPL: loss on the key tokens' not in md


def test_compare_keeps_runs_apart_that_are_not_seeds_of_one_setting(tmp_path):
    """Two runs of one scheme at the same seed (say 1000 and 30 iterations) are two runs, not two
    seeds: each gets a row labelled with its folder, n = 1."""
    import report
    base = {'scheme': 'rope', 'rope_scaling': None, 'block_size': 8, 'mults': [1], 'lengths': [8], 'seed': 1337}
    dirs = []
    for name, loss in (('long', 1.5), ('short', 2.5)):
        (tmp_path / name).mkdir()
        (tmp_path / name / 'eval.json').write_text(json.dumps(dict(base, nonoverlap=[loss])))
        dirs.append(str(tmp_path / name))
    md = open(report.make_report(dirs, str(tmp_path / 'report'))).read()
    assert '| rope (long) | 1 | 1.500 |' in md and '| rope (short) | 1 | 2.500 |' in md


def write_task_runs(root, runs):
    """{(task, scheme, name): exact match past N at seeds 1, 2, 3} -> run folders root/task/name-sSEED, each with
    an eval.json as train.py writes it for a task run (N = 4: all right in 1..4, the given value in 5..16)."""
    dirs = []
    for (task, scheme, name), vals in runs.items():
        for seed, v in zip((1, 2, 3), vals):
            d = root / task / f'{name}-s{seed}'
            d.mkdir(parents=True)
            bins = [{'lo': 1, 'hi': 4, 'exact': 1.0, 'token_acc': 1.0, 'rows': 8},
                    {'lo': 5, 'hi': 16, 'exact': v, 'token_acc': v, 'rows': 8}]
            (d / 'eval.json').write_text(json.dumps({'task': task, 'scheme': scheme, 'name': name, 'seed': seed,
                                                     'N': 4, 'iter': 10, 'exact_id': 1.0, 'exact_ood': v,
                                                     'bins': bins}))
            dirs.append(str(d))
    return dirs


def test_task_report_over_seeds_pairs_each_task_by_seed(tmp_path):
    """Two tasks x two schemes x three seeds: the beyond-N table has n = 3 per run (not one per
    task and seed), and every task column gets its own paired difference from rope and ranking;
    values by hand."""
    import report
    ood = {('copy', 'rope'): [0.10, 0.20, 0.30], ('copy', 'alibi'): [0.30, 0.45, 0.50],  # alibi - rope: .2 .25 .2
           ('sort', 'rope'): [0.50, 0.60, 0.70], ('sort', 'alibi'): [0.40, 0.70, 0.60]}  # -.1 .1 -.1: a tie
    dirs = write_task_runs(tmp_path, {(task, scheme, scheme): vals for (task, scheme), vals in ood.items()})
    md = open(report.make_task_report(dirs, str(tmp_path / 'report'))).read()
    assert '| rope | 3 | 0.20 ± 0.10 (0.10–0.30) | 0.60 ± 0.10 (0.50–0.70) |' in md
    half = 4.302653 * (0.028868 / math.sqrt(3))  # copy: d = .2, .25, .2, mean .21667, sd .028868
    assert f"| alibi | +0.22 [{0.21667 - half:+.2f}, {0.21667 + half:+.2f}] * | -0.03 [" in md
    assert '- copy: 1. alibi, 2. rope' in md and '- sort: 1. rope, 1. alibi' in md
    agg = json.load(open(tmp_path / 'report' / 'aggregate.json'))['exact_ood']
    assert agg['sort']['runs']['alibi']['seeds'] == {'1': 0.4, '2': 0.7, '3': 0.6}
    assert agg['copy']['paired_vs_rope']['alibi']['diff'] == pytest.approx(0.21667, abs=1e-4)


def test_task_report_groups_a_presets_seeds_by_its_name(tmp_path):
    """A preset runs the rope scheme under its own name (eval.json 'name', as train.py writes it): its seeds form
    one row of n = 3, paired by seed with rope's, not three rows labelled by folder."""
    import report
    ood = {('rope', 'rope'): [0.5, 0.6, 0.7], ('rope', 'gemma3'): [0.7, 0.7, 0.9]}  # gemma3 - rope: .2 .1 .2
    dirs = write_task_runs(tmp_path, {('sort', scheme, name): vals for (scheme, name), vals in ood.items()})
    md = open(report.make_task_report(dirs, str(tmp_path / 'report'))).read()
    assert '| gemma3 | 3 | 0.77 ± 0.12 (0.70–0.90) |' in md and '| rope | 3 | 0.60 ± 0.10 (0.50–0.70) |' in md
    half = 4.302653 * (0.057735 / math.sqrt(3))  # d = .2, .1, .2: mean .16667, sd .057735
    assert f"| gemma3 | +0.17 [{0.16667 - half:+.2f}, {0.16667 + half:+.2f}] * |" in md


RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'results')
COMMITTED = sorted(glob.glob(os.path.join(RESULTS, '*', 'report', 'aggregate.json')))


@pytest.mark.parametrize('agg_path', COMMITTED, ids=lambda p: os.path.relpath(p, RESULTS))
def test_committed_results_rebuild_their_reports(agg_path, tmp_path):
    """Each sweep in results/ (the runs behind docs/results.md and docs/tasks.md): every run is whole and at the
    max_iters it was started with, and compare.py over the committed runs writes the committed aggregate.json
    number for number, so the docs' tables can be rebuilt from what is in the repository."""
    import report
    import sweep as sweep_mod
    sweep = os.path.dirname(os.path.dirname(agg_path))
    runs = sorted(os.path.dirname(p) for p in glob.glob(os.path.join(sweep, '**', 'eval.json'), recursive=True)
                  if os.sep + 'report' + os.sep not in p)
    assert runs
    iters = {}  # train.py's max_iters for each run's settings (a dry run where sweep_args.json leaves it out)
    for d in runs:
        res, why = report.read_result(os.path.join(d, 'eval.json'))
        args = json.load(open(os.path.join(d, 'sweep_args.json')))
        if 'max_iters' not in args:
            key = json.dumps({k: v for k, v in args.items() if k not in ('seed', 'out_dir', 'pos_encoding')})
            iters[key] = iters.get(key) or sweep_mod.train_config(json.loads(key))['max_iters']
        assert why is None and sweep_mod.finished(res, args.get('max_iters') or iters[key]), d
    build = report.make_task_report if 'task' in res else report.make_report
    build(runs, str(tmp_path))
    assert json.load(open(tmp_path / 'aggregate.json')) == json.load(open(agg_path)), \
        f"{agg_path} does not match its runs: rebuild it with compare.py over them"


def test_readme_leaderboards_are_what_compare_prints_from_results(capsys, monkeypatch):
    """Each `python compare.py --leaderboard=True ...` command line the README and docs/ give runs on the committed
    results/ and prints the table the page shows under it, row for row: their numbers come from the runs in
    results/."""
    import compare
    root = os.path.dirname(RESULTS)
    monkeypatch.chdir(root)
    pages = {p: open(p, encoding='utf-8').read() for p in ['README.md'] + sorted(glob.glob('docs/*.md'))}
    command = re.compile(r'^python compare\.py (--leaderboard=True .*?)\s*(?:#.*)?$', re.M)
    found = {p: command.findall(t) for p, t in pages.items()}
    assert found['README.md'], 'the README gives no leaderboard command'
    for page, commands in found.items():
        for cmd in commands:
            compare.main(cmd.split())
            table = '\n'.join(line for line in capsys.readouterr().out.splitlines() if line.startswith('|'))
            assert table.count('\n') > 2 and table in pages[page], f"{page}: the table of `{cmd}` is not what it prints"


@pytest.mark.e2e
def test_a_quick_eval_never_replaces_a_full_one(data, tmp_path):
    """eval.py --quick=True next to train.py's full eval.json writes eval_quick.json and leaves eval.json byte for
    byte; a --name that points a quick eval at a full result is refused before any work; a full eval.py that
    replaces eval.json keeps what train.py recorded of the run (seed, name, timing)."""
    out = str(tmp_path / 'out')
    r = fork_run(['train.py', f'--data_dir={data}', f'--out_dir={out}', '--max_iters=2', '--eval_interval=2',
                  '--seed=7'] + TINY)
    assert r.returncode == 0, r.stderr[-2000:]
    full = os.path.join(out, 'eval.json')
    before = open(full, 'rb').read()
    trained = json.loads(before)
    assert 'sliding' in trained and 'timing' in trained and trained['seed'] == 7
    r = fork_run(['eval.py', f'--out_dir={out}', '--quick=True', '--tokens=64', '--mults=[1,2]'])
    assert r.returncode == 0, r.stderr[-2000:]
    assert open(full, 'rb').read() == before
    quick = json.load(open(os.path.join(out, 'eval_quick.json')))
    assert quick['quick'] is True and 'sliding' not in quick and len(quick['nonoverlap']) == 2
    assert f"wrote {os.path.join(out, 'eval_quick.json')}" in r.stdout
    r = fork_run(['eval.py', f'--out_dir={out}', '--quick=True', '--name=eval', '--tokens=64'])
    assert r.returncode != 0 and r.stderr.strip() == (
        f"eval.py: {full} holds a full evaluation, which a quick one would replace; nothing was written: pass "
        f"another --name, or drop --quick=True"), r.stderr[-2000:]
    assert open(full, 'rb').read() == before and 'scheme' not in r.stdout  # refused before evaluating
    r = fork_run(['eval.py', f'--out_dir={out}', '--tokens=64', '--mults=[1,2]'])
    assert r.returncode == 0, r.stderr[-2000:]
    again = json.load(open(full))
    assert again['tokens'] == 64 and 'sliding' in again and 'quick' not in again
    assert {k: again[k] for k in ('seed', 'name', 'timing')} == {k: trained[k] for k in ('seed', 'name', 'timing')}


def test_compare_writes_its_report_beside_the_runs(tmp_path, monkeypatch, capsys):
    """Without --report_dir, compare.py writes report/ in the folder its runs share (one run: inside it), never
    into the folder it was started from; --report_dir still chooses."""
    import compare
    for name, loss in (('rope', 1.5), ('alibi', 1.25)):
        d = tmp_path / 'runs' / name
        d.mkdir(parents=True)
        (d / 'eval.json').write_text(json.dumps({'scheme': name, 'block_size': 8, 'mults': [1, 2], 'lengths': [8, 16],
                                                 'nonoverlap': [loss, loss + 1], 'position': [[loss] * 8, None]}))
    elsewhere = tmp_path / 'elsewhere'
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    runs = [str(tmp_path / 'runs' / 'rope'), str(tmp_path / 'runs' / 'alibi')]
    cases = [(runs, tmp_path / 'runs' / 'report'), (runs[:1], tmp_path / 'runs' / 'rope' / 'report'),
             (runs + [f'--report_dir={tmp_path / "mine"}'], tmp_path / 'mine')]
    for argv, where in cases:
        compare.main(argv)
        assert capsys.readouterr().out == f"wrote {where / 'report.md'}\n"
        assert '| alibi |' in (where / 'report.md').read_text() or len(argv) == 1
    assert os.listdir(elsewhere) == []
    monkeypatch.chdir(tmp_path / 'runs')  # runs given relative to here: the report's path is too
    compare.main(['rope', 'alibi'])
    assert capsys.readouterr().out == f"wrote {os.path.join('.', 'report', 'report.md')}\n"


def test_a_stopped_final_suite_never_replaces_a_complete_one(tmp_path, capsys):
    """train.py's final suite stopped half way keeps what it had in eval.json (complete: false) when there was
    none, but leaves a complete eval.json (a finished run resumed to evaluate again) byte for byte."""
    m, data = tiny_model('rope').eval(), rand_data(4000)
    head = {'scheme': 'rope', 'name': 'rope', 'seed': 1, 'iter': 2}
    first, again = tmp_path / 'first', tmp_path / 'again'
    first.mkdir()
    again.mkdir()
    E.final_suite(m, str(first), head, data, 16, (1, 2), 512, stop=lambda: 'SIGINT')
    assert json.load(open(first / 'eval.json'))['complete'] is False
    assert 'what it had computed is in' in capsys.readouterr().out
    assert E.final_suite(m, str(again), head, data, 16, (1, 2), 512) is None
    before = (again / 'eval.json').read_bytes()
    assert json.loads(before)['complete'] is True
    E.final_suite(m, str(again), head, data, 16, (1, 2), 512, stop=lambda: 'SIGINT')
    assert (again / 'eval.json').read_bytes() == before
    said = capsys.readouterr().out
    assert f"{again}/eval.json keeps the complete evaluation it had, and this one is not saved" in said
