"""Tests for tasks.py: every answer against an independent computation, the answer mask,
sampling distributions, scoring on hand-made logits, and the position tricks."""
import json
import math
import os
import sys

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import tasks  # noqa: E402
import tasks as T  # noqa: E402
from conftest import fork_run  # noqa: E402

SIZES = [1, 2, 3, 5, 8, 13, 24]


def text(ids):
    return ''.join(tasks.VOCAB[i] for i in ids)


def examples(name, sizes=SIZES, seeds=range(5)):
    for seed in seeds:
        rng = np.random.default_rng(seed)
        for n in sizes:
            p, a, scored = tasks.sample(name, n, rng)
            assert text(p).endswith('=') and text(p).count('=') == 1, text(p)
            yield n, text(p)[:-1], text(a), scored


def test_vocab():
    assert len(set(tasks.VOCAB)) == len(tasks.VOCAB) == tasks.vocab_size < 64
    assert all(tasks.itos[tasks.stoi[c]] == c for c in tasks.VOCAB)
    assert tasks.VOCAB[tasks.PAD_ID] == tasks.PAD and tasks.VOCAB[tasks.SEP_ID] == '='


def test_registry_and_defaults():
    expected = {'copy', 'reverse', 'duplicate', 'addition', 'parity', 'sort', 'bucket_sort',
                'stack', 'mqar', 'passkey', 'flipflop', 'flipflop_sparse', 'flipflop_dense', 'vartrack',
                'niah_multikey'}
    assert set(tasks.TASKS) == expected == set(tasks.DEFAULT_N)
    for name, N in tasks.DEFAULT_N.items():
        assert tasks.max_len(name, 4 * N) < 600
    assert 4 * tasks.DEFAULT_N['mqar'] <= 26  # one letter per key


@pytest.mark.parametrize('name', ['copy', 'reverse', 'duplicate', 'sort', 'bucket_sort'])
def test_string_tasks(name):
    for n, body, ans, scored in examples(name):
        assert len(body) == n and all(scored)
        assert set(body) <= set('abcdefgh')
        want = {'copy': body, 'reverse': body[::-1], 'duplicate': body + body,
                'sort': ''.join(sorted(body)), 'bucket_sort': ''.join(sorted(body))}[name]
        assert ans == want
    if name == 'bucket_sort':  # Delétang's 5-symbol alphabet
        assert set(''.join(b for _, b, _, _ in examples(name, [30]))) == set('abcde')


def test_addition():
    carries = 0
    for n, body, ans, _ in examples('addition'):
        a, b = body.split('+')
        assert len(a) == len(b) == n and len(ans) == n + 1
        assert int(ans[::-1]) == int(a[::-1]) + int(b[::-1])  # digits least significant first
        carries += ans[-1] == '1'
    assert carries > 0  # the final carry digit is exercised


def test_parity():
    for n, body, ans, _ in examples('parity'):
        assert len(body) == n and set(body) <= {'0', '1'}
        assert ans == str(sum(int(c) for c in body) % 2)


def test_stack():
    seen_empty = False
    for n, body, ans, _ in examples('stack', sizes=SIZES + [40], seeds=range(20)):
        assert len(body) == n
        k = len(body) - len(body.lstrip('ab'))  # the initial stack is the leading run of a/b
        assert k >= 1 and (n == 1 or k < n)
        st = list(body[:k])
        for op in body[k:]:
            assert op in '^AB'
            if op == '^':
                if st:
                    st.pop()
            else:
                st.append({'A': 'a', 'B': 'b'}[op])
        assert ans == ''.join(st[::-1]) + '$'  # top of stack first
        assert len(ans) + len(body) + 1 <= tasks.max_len('stack', n)
        seen_empty |= ans == '$'
    assert seen_empty


def test_mqar():
    for n, body, ans, scored in examples('mqar', sizes=[1, 2, 5, 13, 26]):
        pairs = dict(zip(body[0::2], body[1::2]))
        assert len(body) == 2 * n and len(pairs) == n  # distinct keys
        assert all(k.isalpha() and v.isdigit() for k, v in pairs.items())
        assert sorted(ans[0::2]) == sorted(pairs)  # every key queried once
        assert all(pairs[k] == v for k, v in zip(ans[0::2], ans[1::2]))
        assert scored == [False, True] * n  # only the values are targets


def test_passkey_answer_and_depth():
    depths = []
    for n, body, ans, _ in examples('passkey', sizes=[40], seeds=range(600)):
        i = body.index('#')
        assert ans == body[i + 1:i + 1 + len(ans)] and ans.isdigit() and len(ans) == tasks.KEY_LEN
        filler = body[:i] + body[i + 1 + len(ans):]
        assert len(filler) == n and filler.isalpha()
        depths.append(i / n)
    depths = np.array(depths)
    for lo, hi in [(0, 0.2), (0.4, 0.6), (0.8, 1.0001)]:  # start, middle, end all covered
        assert 0.12 < np.mean((depths >= lo) & (depths < hi)) < 0.28
    assert depths.min() == 0 and depths.max() == 1  # both extremes reachable


# --- flip-flop (Liu et al., arXiv 2306.00946) and RULER's vt / niah_multikey (arXiv 2404.06654) --------

def test_flipflop_reads_return_the_last_write_and_only_reads_are_scored():
    for name in ('flipflop', 'flipflop_sparse', 'flipflop_dense'):
        for n, body, ans, scored in examples(name, sizes=SIZES + [80], seeds=range(10)):
            assert body == ''  # the prompt is SEP alone
            ops, bits = ans[0::2], ans[1::2]
            assert len(ops) == n + 2 and ops[0] == 'w' and ops[-1] == 'r'
            assert set(ops) <= set('wri') and set(bits) <= set('01')
            register = None
            for j, (op, bit) in enumerate(zip(ops, bits)):
                if op == 'w':
                    register = bit
                elif op == 'r':
                    assert bit == register, (ans, j)
            assert scored == [c for op in ops for c in (False, op == 'r')]


@pytest.mark.parametrize('name, p_ignore', [('flipflop', 0.8), ('flipflop_sparse', 0.98), ('flipflop_dense', 0.1)])
def test_flipflop_instruction_and_bit_frequencies(name, p_ignore):
    """The n free instructions: ignore with the split's p (the paper's FFL(p): 0.8 train, 0.98 sparse,
    0.1 dense), write and read (1 - p)/2 each; the bits of writes and ignores are fair coins."""
    rng = np.random.default_rng(0)
    counts, ones, wi = {'w': 0, 'r': 0, 'i': 0}, 0, 0
    for _ in range(400):
        _, a, _ = tasks.sample(name, 50, rng)
        s = text(a)
        for op, bit in zip(s[2:-2:2], s[3:-2:2]):  # the free instructions only
            counts[op] += 1
            if op != 'r':
                ones, wi = ones + (bit == '1'), wi + 1
    total = sum(counts.values())
    assert total == 400 * 50
    for op, p in (('i', p_ignore), ('w', (1 - p_ignore) / 2), ('r', (1 - p_ignore) / 2)):
        assert abs(counts[op] / total - p) < 4 * math.sqrt(p * (1 - p) / total) + 1e-9, (op, counts)
    assert abs(ones / wi - 0.5) < 4 * math.sqrt(0.25 / wi)


def test_flipflop_splits_share_the_training_task():
    assert tasks.SPLITS == {'flipflop': ('flipflop_sparse', 'flipflop_dense')}
    for split in tasks.SPLITS['flipflop']:
        assert tasks.DEFAULT_N[split] == tasks.DEFAULT_N['flipflop']
        for n in (1, 9, 80):
            assert tasks.max_len(split, n) == tasks.max_len('flipflop', n) == 2 * (n + 2) + 1


def test_vartrack_answer_is_the_queried_chain():
    """Parse the statements back ('#' + variable + value or variable), resolve every variable's value by
    following its chain, and check the answer is every variable holding the queried value, in the order
    they were assigned; two chains of five, filler of n letters from q..z."""
    import re
    for n, body, ans, _ in examples('vartrack', sizes=SIZES + [64], seeds=range(10)):
        query, text_ = body[-2:], body[:-2]
        stmts = re.findall(r'#([a-p])([0-9]{2}|[a-p])', text_)
        assert len(stmts) == 10 and len(re.sub(r'#[a-p](?:[0-9]{2}|[a-p])', '', text_)) == n
        assert set(re.sub(r'#[a-p](?:[0-9]{2}|[a-p])', '', text_)) <= set('qrstuvwxyz')
        value = {}
        for var, src in stmts:  # in text order: a chain's source is always assigned before it is used
            assert var not in value
            value[var] = src if src.isdigit() else value[src]
        assert len(set(value.values())) == 2 and query in value.values()
        assert ans == ''.join(var for var, _ in stmts if value[var] == query) and len(ans) == 5


def test_niah_multikey_answer_is_the_queried_needle():
    import re
    depths = []
    for n, body, ans, _ in examples('niah_multikey', sizes=SIZES + [64], seeds=range(20)):
        key, text_ = body[-1], body[:-1]
        needles = re.findall(r'#([a-p])([0-9]{4})', text_)
        filler = re.sub(r'#[a-p][0-9]{4}', '', text_)
        assert len(needles) == 4 and len({k for k, _ in needles}) == 4
        assert len(filler) == n and set(filler) <= set('qrstuvwxyz')
        assert ans == dict(needles)[key]
        depths.append([k for k, _ in needles].index(key))
    assert set(depths) == {0, 1, 2, 3}  # any of the four needles may be asked for


@pytest.mark.parametrize('name', sorted(tasks.TASKS))
def test_make_batch_mask_and_padding(name):
    ns = [1, 7, 3, 12, 2]
    x, y, n_out = tasks.make_batch(name, ns, np.random.default_rng(3))
    rng = np.random.default_rng(3)  # the same draws, one example at a time
    rows = [tasks.sample(name, n, rng) for n in ns]
    assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape
    assert x.shape[1] == max(len(p) + len(a) for p, a, _ in rows) - 1
    assert n_out.tolist() == ns
    for b, (p, a, scored) in enumerate(rows):
        seq = p + a
        assert x[b, :len(seq) - 1].tolist() == seq[:-1]
        assert (x[b, len(seq) - 1:] == tasks.PAD_ID).all()
        targets = {t: tok for t, tok in enumerate(seq[1:]) if t >= len(p) - 1 and scored[t - len(p) + 1]}
        for t in range(x.shape[1]):
            assert y[b, t].item() == targets.get(t, -1)
        # the unmasked targets read back as the (scored part of the) answer
        assert text(y[b][y[b] != -1].tolist()) == text([tok for tok, s in zip(a, scored) if s])
    assert not (y == tasks.PAD_ID).any()


def test_determinism():
    ns = [4, 9, 2, 16]
    for name in tasks.TASKS:
        a = tasks.make_batch(name, ns, np.random.default_rng(11))
        b = tasks.make_batch(name, ns, np.random.default_rng(11))
        c = tasks.make_batch(name, ns, np.random.default_rng(12))
        assert all(torch.equal(u, v) for u, v in zip(a, b))
        assert a[0].shape != c[0].shape or not torch.equal(a[0], c[0])


def test_train_sizes_uniform():
    N, B = 10, 20000
    n = tasks.train_sizes(B, N, np.random.default_rng(0))
    counts = np.bincount(n, minlength=N + 2)
    assert counts[0] == 0 and counts[N + 1:].sum() == 0 and (counts[1:N + 1] > 0).all()
    expected = B / N
    chi2 = ((counts[1:N + 1] - expected) ** 2 / expected).sum()
    assert chi2 < 27.9  # 99.9% quantile of chi-square with 9 degrees of freedom


def test_bin_edges_and_eval_sizes():
    for N in [1, 6, 8, 9, 12, 32]:
        e = tasks.bin_edges(N)
        assert e[0] == 1 and e[-1] == 4 * N + 1 and N + 1 in e
        assert all(a < b for a, b in zip(e, e[1:]))
        assert sorted(set(tasks.eval_sizes(N))) == list(range(1, 4 * N + 1))
    assert tasks.bin_edges(8) == [1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31, 33]


def onehot(pred, V=tasks.vocab_size):
    return torch.nn.functional.one_hot(torch.tensor(pred), V).float()


def test_score_hand_made():
    y = torch.tensor([[-1, -1, 5, 6, -1],   # answer 5 6, all right; a wrong token outside
                      [-1, -1, 5, 6, -1],   # one answer token wrong
                      [-1, 3, -1, -1, -1]])  # single-token answer, right
    pred = [[9, 9, 5, 6, 9],
            [0, 0, 5, 7, 0],
            [0, 3, 1, 1, 1]]
    exact, correct, total = tasks.score(onehot(pred), y)
    assert exact.tolist() == [True, False, True]
    assert correct.tolist() == [2, 1, 1] and total.tolist() == [2, 2, 1]
    # already-argmaxed predictions give the same answer
    assert tasks.score(torch.tensor(pred), y)[0].tolist() == [True, False, True]


def test_bin_scores():
    acc = tasks.BinScores([1, 3, 5])  # bins {1, 2} and {3, 4}
    y = torch.tensor([[-1, 4, 4], [-1, 4, 4], [-1, 4, 4], [-1, 4, 4], [-1, 4, 4]])
    pred = [[0, 4, 4], [0, 4, 0], [0, 4, 4], [0, 0, 0], [0, 4, 4]]
    acc.add(onehot(pred[:3]), y[:3], [1, 2, 3])  # two batches accumulate
    acc.add(onehot(pred[3:]), y[3:], [4, 9])     # n = 9 lies outside the edges: ignored
    res = acc.result()
    assert res == [dict(lo=1, hi=2, rows=2, exact=0.5, token_acc=0.75),
                   dict(lo=3, hi=4, rows=2, exact=0.5, token_acc=0.5)]
    json.dumps(res)


def test_randomized_positions():
    g = torch.Generator().manual_seed(0)
    T, max_pos = 20, 200
    draws = torch.stack([tasks.randomized_positions(T, max_pos, g) for _ in range(500)])
    assert draws.dtype == torch.int64 and draws.shape == (500, T)
    assert (draws[:, 1:] > draws[:, :-1]).all()  # sorted, distinct
    assert draws.min() >= 0 and draws.max() < max_pos
    # not degenerate: the start moves, and all of [0, max_pos) is used about evenly
    assert draws[:, 0].float().std() > 3 and len(set(draws[:, 0].tolist())) > 20
    quarters = np.bincount(draws.flatten().numpy() * 4 // max_pos, minlength=4) / draws.numel()
    assert (np.abs(quarters - 0.25) < 0.03).all()
    rows = tasks.randomized_positions(T, max_pos, g, batch=8)  # one subset per row
    assert rows.shape == (8, T) and (rows[:, 1:] > rows[:, :-1]).all() and rows.max() < max_pos
    assert len({tuple(r) for r in rows.tolist()}) == 8
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert torch.equal(tasks.randomized_positions(T, max_pos, g1), tasks.randomized_positions(T, max_pos, g2))
    assert torch.equal(tasks.randomized_positions(T, T, g), torch.arange(T))
    with pytest.raises(ValueError):
        tasks.randomized_positions(T, T - 1, g)


def test_random_offset():
    g = torch.Generator().manual_seed(0)
    ks = []
    for _ in range(400):
        pos = tasks.random_offset(10, 3, g)
        assert pos.dtype == torch.int64 and pos.shape == (10,)
        assert torch.equal(pos - pos[0], torch.arange(10))
        ks.append(pos[0].item())
    assert set(ks) == {0, 1, 2, 3}


# --- the tasks through train.py and sweep.py ----------------------------------------------

def _run(args, torchrun=None):
    import subprocess
    import sys
    env = dict(os.environ, OMP_NUM_THREADS='1')
    cmd = [sys.executable] + (['-m', 'torch.distributed.run', '--standalone', f'--nproc_per_node={torchrun}']
                              if torchrun else []) + args
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)


TASK_ARGS = ['--task=copy', '--task_n=4', '--n_layer=1', '--n_head=2', '--n_embd=32', '--batch_size=12',
             '--max_iters=3', '--eval_interval=3', '--log_interval=1', '--compile=False', '--wandb_log=False']


@pytest.mark.e2e
def test_task_run_ddp_equals_one_process_and_writes_bins(tmp_path):
    """A task run: loss on the answers only, weighted by each micro-step's answer tokens, so 3
    ranks on uneven shares (4/4/4 rows, different answer counts) equal one process; the final
    eval has exact match for every size bin up to 4N, unaddressable ones as None."""
    one, ddp = str(tmp_path / 'one'), str(tmp_path / 'ddp')
    r = fork_run(['train.py'] + TASK_ARGS + [f'--out_dir={one}'])
    assert r.returncode == 0, r.stderr[-2000:]
    r = _run(['train.py'] + TASK_ARGS + [f'--out_dir={ddp}'], torchrun=3)
    assert r.returncode == 0, r.stderr[-2000:]
    losses = [{m['iter']: m['train/loss'] for m in map(json.loads, open(os.path.join(d, 'metrics.jsonl')))
               if 'train/loss' in m} for d in (one, ddp)]
    assert losses[0].keys() == {1, 2, 3} and all(abs(losses[0][i] - losses[1][i]) < 1e-5 for i in losses[0])
    res = json.load(open(os.path.join(one, 'eval.json')))
    assert res['task'] == 'copy' and res['N'] == 4 and res['complete']
    assert [b['lo'] for b in res['bins']] == T.bin_edges(4)[:-1]
    r = fork_run(['train.py'] + TASK_ARGS + ['--pos_encoding=learned', f'--out_dir={tmp_path / "lrn"}'])
    assert r.returncode == 0, r.stderr[-2000:]
    bins = json.load(open(tmp_path / 'lrn' / 'eval.json'))['bins']
    assert bins[0]['exact'] is not None and bins[-1]['exact'] is None  # past its table: not 0, cannot address


@pytest.mark.e2e
def test_task_suite_end_to_end_resumes(tmp_path):
    out = str(tmp_path / 'suite')
    args = ['sweep.py', '--tasks=copy,parity', '--schemes=rope,learned', '--randomized=learned', f'--out={out}',
            '--max_iters=4', '--eval_interval=4', '--n_layer=1', '--n_embd=32', '--batch_size=8', '--wandb_log=False']
    r = _run(args)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert 'task suite: 6 runs (6 x 1 seed(s): 1337), 6 to do' in r.stdout
    md = open(os.path.join(out, 'report', 'report.md')).read()
    assert '| learned +randomized |' in md and '| learned |' in md and 'copy (N=12)' in md
    assert os.path.exists(os.path.join(out, 'report', 'tasks.png'))
    rnd = json.load(open(os.path.join(out, 'copy', 'learned-randomized-s1337', 'eval.json')))
    assert rnd['train_positions'] == 'randomized' and rnd['positions'] == 'plain' and 'bins_randomized' in rnd
    r = _run(args)  # resumed: nothing trained again
    assert r.returncode == 0 and 'exact match' not in r.stdout, r.stdout[-2000:]


@pytest.mark.e2e
def test_schemes_all_plans_every_registered_scheme(tmp_path):
    """--schemes=all: every scheme in the registry, for the task suite as for language modelling; over a folder
    whose runs are all finished the sweep trains nothing and reports every scheme."""
    import positional
    out = tmp_path / 'suite'
    bins = [{'lo': 1, 'hi': 4, 'exact': 1.0, 'token_acc': 1.0, 'rows': 8}]
    for s in positional.REGISTRY:
        (out / 'copy' / f'{s}-s1337').mkdir(parents=True)
        (out / 'copy' / f'{s}-s1337' / 'eval.json').write_text(json.dumps(
            {'task': 'copy', 'scheme': s, 'seed': 1337, 'N': 4, 'iter': 4, 'exact_id': 1.0, 'exact_ood': 0.5,
             'bins': bins}))
    r = _run(['sweep.py', '--tasks=copy', '--schemes=all', '--randomized=', f'--out={out}', '--max_iters=4',
              '--wandb_log=False'])
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    n = len(positional.REGISTRY)
    assert f'1 tasks x {n} schemes' in r.stdout and f'task suite: {n} runs ({n} x 1 seed(s): 1337), 0 to do' in r.stdout
    md = open(out / 'report' / 'report.md').read()
    assert all(f'\n| {s} |' in md for s in positional.REGISTRY)


class ZeroReader(torch.nn.Module):
    """A stub task model: every position predicts the digit '0' (flip-flop: a read is right when its bit is 0)."""

    def __init__(self):
        super().__init__()
        self.pe = type('PE', (), {'max_len': None})()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x, pos=None, n_pos=None):
        logits = torch.zeros(*x.shape, tasks.vocab_size)
        logits[..., tasks.stoi['0']] = 1.0
        return logits, None


def test_flipflop_final_eval_scores_each_split_on_its_own_data_and_the_report_shows_them(tmp_path):
    """train.py's final evaluation of a flipflop run: the training split at the top of eval.json and both
    test splits under 'splits', each scored on its own strings: exact match (every read of a string right)
    and per-token accuracy (reads right) per size bin, against the reads of the same strings drawn here in
    the evaluator's order; compare.py's task report has a column and a by-size table for each split."""
    import evaluation as E
    import report
    N, reps = 2, 16
    head = dict(scheme='rope', name='rope', seed=1, rope_scaling=None, iter=0, out_dir=str(tmp_path))
    assert E.final_suite(ZeroReader(), str(tmp_path), head, task='flipflop', task_n=N) is None
    res = json.load(open(tmp_path / 'eval.json'))
    assert res['task'] == 'flipflop' and res['complete'] and list(res['splits']) == ['flipflop_sparse',
                                                                                        'flipflop_dense']
    edges = tasks.bin_edges(N)
    for name, r in [('flipflop', res)] + list(res['splits'].items()):
        rng = np.random.default_rng(1234)  # tasks.evaluate's seed; one batch of reps rows per size, in order
        exact, right, reads, rows = [np.zeros(len(edges) - 1) for _ in range(4)]
        for n in range(1, 4 * N + 1):
            b = np.searchsorted(edges, n, side='right') - 1
            for _ in range(reps):
                _, a, scored = tasks.sample(name, n, rng)
                bits = [text([t]) for t, s in zip(a, scored) if s]
                rows[b] += 1
                exact[b] += all(c == '0' for c in bits)
                right[b] += bits.count('0')
                reads[b] += len(bits)
        assert [x['lo'] for x in r['bins']] == edges[:-1]
        assert [x['exact'] for x in r['bins']] == pytest.approx(list(exact / rows))
        assert [x['token_acc'] for x in r['bins']] == pytest.approx(list(right / reads))
        assert edges[:N + 1] == [1, 2, 3]  # one size per bin: sizes 1 and 2 in distribution
        assert r['exact_ood'] == pytest.approx(np.mean(exact[N:] / rows[N:]))  # means over the bins
        assert r['token_id'] == pytest.approx(np.mean(right[:N] / reads[:N]))
    assert res['splits']['flipflop_dense']['exact_ood'] < res['splits']['flipflop_sparse']['exact_ood']
    md = open(report.make_task_report([str(tmp_path)], str(tmp_path / 'report'))).read()
    for t in ('flipflop', 'flipflop_sparse', 'flipflop_dense'):
        assert f'{t} (N={N})' in md and f'### {t}: exact match by size' in md
    assert 'Per-token accuracy' in md
