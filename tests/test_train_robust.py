"""Runs that survive: exact resume, atomic checkpoints, signals (a 2-rank DDP run's: test_train_ddp.py),
non-finite losses, and a clear error for each kind of bad input.
train.py and sample.py run with tiny settings as subprocesses, or as forked children of
this process (conftest.fork_run) where that is the same thing but cheaper."""
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from conftest import N, ROOT, RUN_ENV as ENV, SCHEMES, TINY, fork_run, fork_start, fork_wait


def cmd(args, torchrun=None):
    return [sys.executable] + (['-m', 'torch.distributed.run', '--standalone', f'--nproc_per_node={torchrun}']
                               if torchrun else []) + args


def run(args, torchrun=None, timeout=300):
    return subprocess.run(cmd(args, torchrun), cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=ENV)


def metrics(out_dir):
    with open(os.path.join(out_dir, 'metrics.jsonl')) as f:
        return [json.loads(line) for line in f]


def losses(out_dir):
    return {r['iter']: r['train/loss'] for r in metrics(out_dir) if 'train/loss' in r}


def ckpt_iter(out_dir, name='ckpt.pt'):
    return torch.load(os.path.join(out_dir, name), weights_only=True)['iter_num']


def wait_for_iter(out_dir, alive, it=3):
    """Return once the run writing out_dir has logged iteration `it`."""
    deadline = time.time() + 120
    while time.time() < deadline and alive():
        if os.path.exists(os.path.join(out_dir, 'metrics.jsonl')) and it in losses(out_dir):
            return
        time.sleep(0.01)
    raise AssertionError(f"run did not reach iter {it}")


def worker_pid(launcher, rank):
    """pid of the torchrun worker with RANK=rank."""
    for pid in filter(str.isdigit, os.listdir('/proc')):
        try:
            ppid = int(open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[1])
            env = open(f'/proc/{pid}/environ', 'rb').read().split(b'\0')
        except OSError:
            continue
        if ppid == launcher and f'RANK={rank}'.encode() in env:
            return int(pid)
    raise AssertionError(f"no worker with RANK={rank} under pid {launcher}")


def copy_run(src, tmp_path):
    dst = str(tmp_path / 'run')
    shutil.copytree(src, dst)
    return dst


# --- exact resume and signals -------------------------------------------------------------

@pytest.mark.e2e
def test_sigint_saves_and_resume_is_exact(data, tmp_path):
    """Dropout on, so the torch RNG state must be restored; losses are compared exactly."""
    args = ['train.py', f'--data_dir={data}', f'--max_iters={N}', '--eval_interval=50', '--dropout=0.1'] + TINY
    ref, out = str(tmp_path / 'ref'), str(tmp_path / 'out')
    r = fork_run(args + [f'--out_dir={ref}'])
    assert r.returncode == 0, r.stderr[-3000:]
    child = fork_start(args + [f'--out_dir={out}'])
    wait_for_iter(out, lambda: open(f'/proc/{child[0]}/stat').read().rsplit(')', 1)[1].split()[0] != 'Z')
    os.kill(child[0], signal.SIGINT)
    r = fork_wait(child)
    assert r.returncode == 0, r.stderr[-3000:]
    stop = int(re.search(r'stopped by SIGINT at iter (\d+)', r.stdout).group(1))
    assert 3 <= stop < N and ckpt_iter(out) == stop and 'Traceback' not in r.stderr
    r = fork_run(args + [f'--out_dir={out}', '--init_from=resume'])
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = losses(ref), losses(out)
    assert sorted(b) == list(range(1, N + 1))  # every step logged once, none twice
    assert a == b  # bit-identical per-step losses
    final = lambda d: [m['val/loss@1L'] for m in metrics(d) if m['iter'] == N and 'val/loss@1L' in m]  # noqa: E731
    assert final(ref) == final(out) and len(final(out)) == 1
    # eval.json's timing counts the iterations the resuming process trained, not the run's total
    timing = lambda d: json.load(open(os.path.join(d, 'eval.json')))['timing']['iters_trained']  # noqa: E731
    assert timing(ref) == N and timing(out) == N - stop


# --- atomic checkpoints -------------------------------------------------------------------

def test_sigkill_mid_save_leaves_previous_checkpoint_loadable(tmp_path):
    """A child process saves an 8 MB checkpoint in a loop with checkpoint.atomic_save (the one
    train.py uses); we SIGKILL it at random moments, then the file must load whole."""
    from checkpoint import atomic_save, read_checkpoint
    path = str(tmp_path / 'ckpt.pt')
    big = torch.arange(2 * 2**20, dtype=torch.float32)
    t_save = 0.0
    for _ in range(3):  # the slowest of three: on a loaded machine one cold save misleads
        t = time.time()
        atomic_save({'model': big, 'model_args': {}, 'version': 0}, path)
        t_save = max(t_save, time.time() - t)  # kill within ~4 saves: mostly mid-save, some after a finished one
    rng, mid_save, versions = random.Random(0), 0, set()
    for kill in range(40):  # at least 8 kills, until 4 of them landed mid-save (a loaded machine times saves unevenly)
        if kill >= 8 and mid_save >= 4:
            break
        pid = os.fork()
        if pid == 0:  # child: only torch.save/rename here (no tensor math after fork)
            try:
                for v in range(1, 10**6):
                    atomic_save({'model': big, 'model_args': {}, 'version': v}, path)
            finally:
                os._exit(0)
        time.sleep(rng.uniform(0.1, 4.0) * t_save)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        mid_save += os.path.exists(path + '.tmp')  # killed while a new file was being written
        ck = read_checkpoint(path)
        assert torch.equal(ck['model'], big)
        versions.add(ck['version'])
    assert mid_save >= 4  # the kills did land mid-save
    assert len(versions) > 1  # and saves did complete between them


def test_latest_and_best_checkpoints(trained):
    ref = torch.load(os.path.join(trained, 'ckpt.pt'), weights_only=True)
    best = torch.load(os.path.join(trained, 'ckpt_best.pt'), weights_only=True)
    vals = {m['iter']: m['val/loss@1L'] for m in metrics(trained) if 'val/loss@1L' in m and m['iter'] > 0}
    assert ref['iter_num'] == N and ref['best_val_loss'] == min(vals.values())
    assert best['iter_num'] == min(vals, key=vals.get)
    for k in ('model', 'optimizer', 'rng', 'scaler', 'config'):  # what an exact resume restores
        assert k in ref


def test_resume_refuses_explicitly_different_model(trained, tmp_path):
    out = copy_run(trained, tmp_path)
    r = fork_run(['train.py', 'config/alibi.py', f'--out_dir={out}', '--init_from=resume', '--n_layer=2',
                  '--n_head=2', '--wandb_log=False'])
    assert r.returncode != 0 and 'Traceback' not in r.stderr
    trained_with, asked = r.stderr.split('but this run asks for')
    assert "n_layer=1, pos_encoding='rope'" in trained_with and "n_layer=2, pos_encoding='alibi'" in asked
    assert 'n_head' not in r.stderr  # equal keys are not reported
    assert ckpt_iter(out) == N


def test_new_run_refuses_to_overwrite_a_run(trained, tmp_path):
    out = copy_run(trained, tmp_path)
    before = os.path.getmtime(os.path.join(out, 'ckpt.pt'))
    r = fork_run(['train.py', f'--out_dir={out}', '--wandb_log=False'])
    assert r.returncode != 0 and 'ckpt.pt exists' in r.stderr and '--init_from=resume' in r.stderr
    assert os.path.getmtime(os.path.join(out, 'ckpt.pt')) == before


# --- non-finite loss ------------------------------------------------------------------------

@pytest.mark.parametrize('eval_interval', [1, 1000])
def test_nonfinite_loss_stops_and_keeps_last_good_checkpoint(trained, tmp_path, eval_interval):
    """A real divergence: resume with learning_rate=1e6. eval_interval=1: saves every step
    until the val loss goes non-finite; 1000: caught by the train loss at a log step."""
    out = copy_run(trained, tmp_path)
    r = fork_run(['train.py', f'--out_dir={out}', '--init_from=resume', '--learning_rate=1e6',
                  f'--max_iters={N + 30}', f'--eval_interval={eval_interval}', '--wandb_log=False'])
    assert r.returncode != 0 and 'Traceback' not in r.stderr
    m = re.search(r'stopping: (val|train) loss is (nan|inf|-inf|not finite) at iter (\d+)', r.stderr)
    assert m, r.stderr[-2000:]
    bad = int(m.group(3))
    ck = torch.load(os.path.join(out, 'ckpt.pt'), weights_only=True)
    assert N <= ck['iter_num'] < bad and f"ckpt.pt (iter {ck['iter_num']}) is the last good" in r.stderr
    assert all(torch.isfinite(v).all() for v in ck['model'].values())
    if eval_interval == 1000:  # nothing was saved during the run: the checkpoint is the original
        assert ck['iter_num'] == N and m.group(1) == 'train'
    else:
        assert ck['iter_num'] > N  # it did save while the loss was finite


# --- bad input: a clear error naming the problem and the fix ---------------------------------

def test_model_config_errors_in_process():
    from model import GPT, GPTConfig
    with pytest.raises(ValueError, match=r'n_embd=30 is not divisible by n_head=4.*1, 2, 3, 5, 6'):
        GPT(GPTConfig(n_embd=30, n_head=4, vocab_size=10))
    with pytest.raises(ValueError, match=r'rotary dimension .* must be a positive even integer; change rotary_pct'):
        GPT(GPTConfig(n_embd=24, n_head=4, vocab_size=10, pos_options={'rotary_pct': 0.5}))  # 6 * 0.5 = 3
    with pytest.raises(ValueError, match=re.escape("unknown pos_encoding 'rop'; did you mean rope, mrope, ropepp? "
                                                   "valid schemes: " + ', '.join(SCHEMES))):
        GPT(GPTConfig(pos_encoding='rop', vocab_size=10))
    m = GPT(GPTConfig(pos_encoding='learned', block_size=8, n_embd=16, n_head=2, n_layer=1, vocab_size=10))
    with pytest.raises(ValueError, match=r'learned position embeddings have 8 positions, but position 8 was '
                                         r'requested.*sliding window'):
        m(torch.zeros(1, 9, dtype=torch.long))


def write_corpus(d, n_train, n_val):
    os.makedirs(d, exist_ok=True)
    np.zeros(n_train, dtype=np.uint16).tofile(os.path.join(d, 'train.bin'))
    np.zeros(n_val, dtype=np.uint16).tofile(os.path.join(d, 'val.bin'))
    return d


BAD_TRAIN = {  # name: (extra args, fragments the error must contain)
    'unknown key': (['--n_layers=2'], ["unknown config key 'n_layers'", 'did you mean n_layer']),
    'wrong type': (['--n_layer=2.5'], ["'n_layer' expects int (default 1), got 2.5 (float)", '--n_layer=1']),
    'unknown scheme': (['--pos_encoding=rop'], ["unknown pos_encoding 'rop'; did you mean rope, mrope, ropepp? "
                                                "valid schemes: " + ', '.join(SCHEMES)]),
    'n_embd % n_head': (['--n_embd=30', '--n_head=4'], ['n_embd=30 is not divisible by n_head=4', 'Use an n_head']),
    'odd rotary dim': (['--n_embd=24', '--n_head=4', "--pos_options={'rotary_pct': 0.5}"],
                       ['rotary dimension', 'change rotary_pct or n_embd/n_head']),
    'learned table': (['--pos_encoding=learned', "--pos_options={'max_len': 8}"],
                      ['learned addresses 8 positions, fewer than block_size=16', 'lower block_size']),
    'init_from typo': (['--init_from=resme'], ["init_from='resme': use 'scratch', 'resume'"]),
}


@pytest.mark.parametrize('case', sorted(BAD_TRAIN))
def test_train_bad_input(case, data, tmp_path):
    extra, fragments = BAD_TRAIN[case]
    r = fork_run(['train.py', f'--data_dir={data}', f'--out_dir={tmp_path}/out', '--max_iters=2'] + TINY + extra)
    assert r.returncode != 0 and 'Traceback' not in r.stderr, r.stderr[-2000:]
    for f in fragments:
        assert f in r.stderr, (f, r.stderr[-2000:])
    assert not os.path.exists(f'{tmp_path}/out/ckpt.pt')


def test_train_bad_data(tmp_path):
    base = ['train.py', f'--out_dir={tmp_path}/out', '--max_iters=2', '--eval_mults=[1, 8]'] + TINY
    r = run(base + [f'--data_dir={tmp_path}/nope'])
    assert r.returncode != 0 and 'no train.bin or val.bin in' in r.stderr
    assert 'data/shakespeare_char/prepare.py --input FILE' in r.stderr and 'Traceback' not in r.stderr
    r = fork_run(base + [f'--data_dir={write_corpus(str(tmp_path / "empty"), 0, 0)}'])
    assert r.returncode != 0 and 'train.bin is empty' in r.stderr and 'prepare.py' in r.stderr
    # one training window of 16 needs 18 tokens: input, shifted target, and a choice of start
    r = fork_run(base + [f'--data_dir={write_corpus(str(tmp_path / "short"), 17, 1000)}'])
    assert r.returncode != 0 and 'train.bin has 17 tokens, fewer than the 18 needed for block_size=16' in r.stderr
    # evaluating at 8L = 128 needs 129 val tokens
    r = fork_run(base + [f'--data_dir={write_corpus(str(tmp_path / "shortval"), 1000, 100)}'])
    assert r.returncode != 0 and 'val.bin has 100 tokens, fewer than the 129 needed' in r.stderr
    assert 'evaluation at 128 tokens' in r.stderr and 'smaller block_size or eval_mults' in r.stderr
    assert 'Traceback' not in r.stderr


def test_corrupt_checkpoint(trained, tmp_path):
    out = copy_run(trained, tmp_path)
    path = os.path.join(out, 'ckpt.pt')
    blob = open(path, 'rb').read()
    os.remove(path)  # (a hard link to ckpt_best.pt: write a new file, not through the link)
    open(path, 'wb').write(blob[:len(blob) // 2])  # what a non-atomic save cut by a kill leaves
    r = fork_run(['train.py', f'--out_dir={out}', '--init_from=resume', '--wandb_log=False'])
    assert r.returncode != 0 and 'Traceback' not in r.stderr
    assert f'checkpoint {path} is unreadable' in r.stderr and 'ckpt_best.pt' in r.stderr
    r = fork_run(['sample.py', f'--out_dir={out}', '--max_new_tokens=5'])
    assert r.returncode != 0 and f'checkpoint {path} is unreadable' in r.stderr and 'Traceback' not in r.stderr


def test_sample_prompt_outside_char_vocab(trained):
    r = fork_run(['sample.py', f'--out_dir={trained}', '--max_new_tokens=5', '--start=to be, XZ'])
    assert r.returncode != 0 and 'Traceback' not in r.stderr
    assert "prompt has characters outside the model's vocabulary: [',', 'X', 'Z']" in r.stderr
    assert 'use only these' in r.stderr


# --- part two: one writer per out_dir, signals in evaluations, bad values, full disks ----------

def alive(pid):
    try:
        return open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[0] != 'Z'
    except OSError:
        return False


@pytest.mark.e2e
def test_second_writer_is_refused_while_the_first_runs_on(data, tmp_path):
    """Two runs into one out_dir used to both pass the ckpt.pt check and overwrite each other;
    now the second (new or resumed, or an eval writing there) is refused naming the first's PID,
    and the first finishes intact. The first runs until told to stop (SIGINT, after the checks):
    a fixed short run could end before the refused runs get to their lock check."""
    out = str(tmp_path / 'out')
    args = ['train.py', f'--data_dir={data}', f'--out_dir={out}', '--eval_interval=20'] + TINY
    first = fork_start(args + ['--max_iters=1000000'])
    wait_for_iter(out, lambda: alive(first[0]), it=21)  # past its first save (iter 20): eval.py finds a checkpoint
    for extra in (['--max_iters=60'], ['--max_iters=60', '--init_from=resume']):
        r = fork_run(args + extra)
        assert r.returncode != 0 and 'Traceback' not in r.stderr
        assert f'out_dir {out} is in use by PID {first[0]} (train.py' in r.stderr
    r = fork_run(['eval.py', f'--out_dir={out}', '--quick=True'])
    assert r.returncode != 0 and f'PID {first[0]}' in r.stderr and '--init_from=' in r.stderr
    assert alive(first[0])  # the checks ran while the first was still training
    os.kill(first[0], signal.SIGINT)
    r = fork_wait(first)
    assert r.returncode == 0, r.stderr[-2000:]
    stop = int(re.search(r'stopped by SIGINT at iter (\d+)', r.stdout).group(1))
    assert ckpt_iter(out) == stop and sorted(losses(out)) == list(range(1, stop + 1))  # one run's lines, once each
    r = fork_run(args + ['--init_from=resume', f'--max_iters={stop + 2}'])  # the lock died with its process
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.e2e
def test_sigint_in_the_final_eval_stops_fast_keeps_partial_results_and_resume_finishes(data, tmp_path):
    out = str(tmp_path / 'out')
    args = ['train.py', f'--data_dir={data}', f'--out_dir={out}', '--max_iters=6', '--eval_interval=3',
            '--final_eval_tokens=65536', '--final_eval_mults=[1, 2, 4, 8, 16, 32]'] + TINY
    child = fork_start(args)
    deadline = time.time() + 120
    while alive(child[0]) and time.time() < deadline:
        child[2].seek(0)
        if 'final eval:' in child[2].read():
            break
        time.sleep(0.05)
    time.sleep(1.0)  # well inside the suite
    t0 = time.time()
    os.kill(child[0], signal.SIGINT)
    r = fork_wait(child)
    assert time.time() - t0 < 5 and r.returncode == 0, r.stderr[-2000:]
    assert 'final eval interrupted by SIGINT' in r.stdout and '--init_from=resume runs it again' in r.stdout
    partial = json.load(open(os.path.join(out, 'eval.json')))
    assert partial['complete'] is False and partial['iter'] == 6
    assert len(partial['nonoverlap']) == 6  # aligned with the lengths, None where it did not get to
    r = fork_run(['train.py', f'--out_dir={out}', '--init_from=resume', '--final_eval_tokens=2048'])
    assert r.returncode == 0, r.stderr[-2000:]
    done = json.load(open(os.path.join(out, 'eval.json')))
    assert done['complete'] is True and done['iter'] == 6 and None not in done['nonoverlap']
    assert ckpt_iter(out) == 6 and sorted(losses(out)) == list(range(1, 7))  # no step trained twice


BAD_VALUES = {'--gradient_accumulation_steps=0': '--gradient_accumulation_steps=0: must be a positive number',
              '--max_iters=-5': '--max_iters=-5: must be zero or more',
              '--batch_size=0': '--batch_size=0: must be a positive number',
              '--block_size=0': '--block_size=0: must be a positive number',
              '--block_size=-3': '--block_size=-3: must be a positive number',
              '--eval_interval=0': '--eval_interval=0: must be a positive number',
              '--log_interval=0': '--log_interval=0: must be a positive number',
              '--dropout=1.0': '--dropout=1.0: must be in [0, 1)'}


def test_values_that_make_no_sense_are_refused_one_line_each(data, tmp_path):
    base = ['train.py', f'--data_dir={data}', f'--out_dir={tmp_path}/out'] + TINY
    for arg, line in BAD_VALUES.items():
        r = fork_run(base + [arg])
        assert r.returncode != 0 and r.stderr.strip() == line, (arg, r.stderr[-1000:])
    at_once = {a: line for a, line in BAD_VALUES.items() if a != '--block_size=0'}  # (one value per key)
    r = fork_run(base + list(at_once))  # all at once: every problem, one line each
    assert r.returncode != 0 and sorted(r.stderr.strip().splitlines()) == sorted(at_once.values())
    assert not os.path.exists(f'{tmp_path}/out/ckpt.pt') and not os.path.exists(f'{tmp_path}/out/eval.json')


def test_bad_inputs_get_one_line(trained, tmp_path):
    r = fork_run(['sample.py', f'--out_dir={trained}', '--start=FILE:/no/such/file'])
    assert r.returncode != 0
    assert r.stderr.strip() == '--start=FILE:/no/such/file: cannot read it (No such file or directory)'
    bad = tmp_path / 'latin1.txt'
    bad.write_bytes(b'caf\xe9')
    r = fork_run(['sample.py', f'--out_dir={trained}', f'--start=FILE:{bad}'])
    assert r.returncode != 0 and r.stderr.strip() == f'--start=FILE:{bad}: not UTF-8 text'
    r = fork_run(['sample.py', f'--out_dir={trained}', '--start='])
    assert r.returncode != 0 and '--start is empty' in r.stderr and 'Traceback' not in r.stderr
    blocker = tmp_path / 'a_file'
    blocker.write_text('x')  # an out_dir that cannot be created: checked before any work
    for script in (['train.py', '--max_iters=2'] + TINY, ['eval.py', f'--init_from={trained}/ckpt.pt']):
        r = fork_run(script + [f'--out_dir={blocker}/out'])
        assert r.returncode != 0 and 'Traceback' not in r.stderr
        assert f'cannot write to out_dir {blocker}/out' in r.stderr
    ck = torch.load(os.path.join(trained, 'ckpt.pt'), weights_only=True)
    ck['model_args']['n_embd'] = 64  # weights of a 32-wide model under a 64-wide description
    torch.save(ck, tmp_path / 'edited.pt')
    r = fork_run(['eval.py', f'--init_from={tmp_path}/edited.pt', f'--out_dir={tmp_path}/ev', '--quick=True'])
    assert r.returncode != 0 and "weights do not match its model_args, first at 'transformer.wte.weight'" in r.stderr
    assert 'Traceback' not in r.stderr
    r = fork_run(['compare.py', trained, str(blocker)])
    assert r.returncode != 0 and f'not a run directory: {blocker}' in r.stderr


def test_full_disk_keeps_the_previous_checkpoint_and_no_temp_file(data, trained, tmp_path):
    """A save into a full disk: one clear line (how much space it needed), the temporary file
    removed, the previous ckpt.pt loadable -- in process, and through train.py."""
    import errno
    from checkpoint import atomic_save
    path = str(tmp_path / 'ckpt.pt')
    atomic_save({'model': torch.ones(4), 'model_args': {}, 'v': 1}, path)
    real = torch.save

    def full(obj, f, *a, **k):
        f.write(b'partial bytes')
        raise OSError(errno.ENOSPC, 'No space left on device')
    torch.save = full
    try:
        with pytest.raises(OSError, match=r'no space left on device: .*ckpt.pt needs about'):
            atomic_save({'model': torch.ones(2**20), 'model_args': {}, 'v': 2}, path)
    finally:
        torch.save = real
    assert os.listdir(tmp_path) == ['ckpt.pt'] and torch.load(path)['v'] == 1
    wrapper = tmp_path / 'full_disk.py'  # train.py with a disk that fills up after its first save
    wrapper.write_text(f"import errno, runpy, sys, torch\nsys.path.insert(0, {ROOT!r})\nreal, n = torch.save, [0]\n"
                       "def save(obj, f, *a, **k):\n    n[0] += 1\n    if n[0] > 1:\n"
                       "        f.write(b'partial')\n        raise OSError(errno.ENOSPC, 'No space left on device')\n"
                       "    return real(obj, f, *a, **k)\ntorch.save = save\nsys.argv = ['train.py'] + sys.argv[1:]\n"
                       "runpy.run_path('train.py', run_name='__main__')\n")
    out = str(tmp_path / 'out')
    r = run([str(wrapper), f'--data_dir={data}', f'--out_dir={out}', '--max_iters=6', '--eval_interval=2'] + TINY)
    assert r.returncode != 0 and 'Traceback' not in r.stderr
    assert 'no space left on device' in r.stderr and 'ckpt.pt (iter 2) is the last good checkpoint' in r.stderr
    assert not [f for f in os.listdir(out) if f.endswith('.tmp')] and ckpt_iter(out) == 2


def test_memory_guard_skips_lengths_that_would_not_fit(monkeypatch, capsys):
    import evaluation as E
    from conftest import tiny_model
    m = tiny_model('alibi')
    monkeypatch.setattr(E, 'available_bytes', lambda device: 600 * 2**20)  # 600 MB free
    data = np.random.default_rng(0).integers(0, 37, 400_000).astype(np.uint16)
    need = E.peak_bytes(m, 2**18, 2**14, 'cpu')
    assert need > 0.8 * 600 * 2**20 > E.peak_bytes(m, 16, 2**14, 'cpu')
    res = E.evaluate(m, data, 16, mults=(1, 2**14), tokens=512, quick=True)
    assert res['nonoverlap'][0] is not None and res['nonoverlap'][1] is None and res['complete']
    assert '16384' in res['skipped'] and 'skipping 16384L' in capsys.readouterr().err


def test_smaller_ones(data, trained, tmp_path):
    """The truncated-checkpoint advice names ckpt_best.pt only where it is whole; a resume that
    raises max_iters says what happens to the schedule; --rope_scaling=None turns a fine-tuned
    model's scaling off at evaluation."""
    out = copy_run(trained, tmp_path)
    blob = open(os.path.join(out, 'ckpt.pt'), 'rb').read()
    os.remove(os.path.join(out, 'ckpt_best.pt'))
    with open(os.path.join(out, 'ckpt.pt'), 'wb') as f:
        f.write(blob[:len(blob) // 2])
    r = fork_run(['sample.py', f'--out_dir={out}', '--max_new_tokens=2'])
    assert r.returncode != 0 and 'is unreadable' in r.stderr and 'ckpt_best' not in r.stderr
    out = copy_run(trained, tmp_path / 'b')
    r = fork_run(['train.py', f'--out_dir={out}', '--init_from=resume', f'--max_iters={N + 2}', '--final_eval=False'])
    assert r.returncode == 0 and f'the cosine now reaches min_lr at iter {N + 2} instead of {N}' in r.stdout
    ft = str(tmp_path / 'ft')
    r = fork_run(['train.py', f'--init_from={trained}/ckpt.pt', f'--out_dir={ft}', '--max_iters=2'] + TINY)
    assert r.returncode != 0 and 'cannot fine-tune' in r.stderr and 'vocab_size=16' in r.stderr  # another corpus
    r = fork_run(['train.py', f'--init_from={trained}/ckpt.pt', f'--out_dir={ft}', '--max_iters=2',
                  f'--data_dir={data}', '--eval_interval=2', "--rope_scaling={'type': 'linear', 'factor': 2}",
                  '--final_eval=False'] + TINY)
    assert r.returncode == 0, r.stderr[-2000:]
    r = fork_run(['eval.py', f'--out_dir={ft}', '--quick=True', '--mults=[1]', '--tokens=64', '--rope_scaling=None'])
    assert r.returncode == 0 and 'evaluating with rope_scaling=None' in r.stdout, r.stderr[-2000:]
    assert os.path.exists(os.path.join(ft, 'eval_noscaling_quick.json'))


# --- bad data, bad checkpoints, damaged logs: one line each, nothing already written lost ------

def corpus_with_meta(d, train_ids, val_ids, vocab_size=84, raw_train=None):
    os.makedirs(d, exist_ok=True)
    if raw_train is not None:
        open(os.path.join(d, 'train.bin'), 'wb').write(raw_train)
    else:
        np.asarray(train_ids, dtype=np.uint16).tofile(os.path.join(d, 'train.bin'))
    np.asarray(val_ids, dtype=np.uint16).tofile(os.path.join(d, 'val.bin'))
    json.dump({'vocab_size': vocab_size}, open(os.path.join(d, 'meta.json'), 'w'))
    return d


def test_bad_data_files_get_one_line(data, tmp_path):
    base = ['train.py', f'--out_dir={tmp_path}/out', '--max_iters=2'] + TINY
    ok = np.arange(5000) % 84
    cases = {  # folder: the line's start
        corpus_with_meta(str(tmp_path / 'odd'), None, ok, raw_train=b'\x01' * 5001):
            'train.bin has 5001 bytes, not a whole number of uint16 tokens',
        corpus_with_meta(str(tmp_path / 'val_ids'), ok, np.full(5000, 90)):
            'val.bin holds token id 90, past the vocabulary of 84',
        corpus_with_meta(str(tmp_path / 'train_ids'), np.full(5000, 300), ok):
            'train.bin holds token id 300, past the vocabulary of 84',
    }
    for folder, line in cases.items():
        r = fork_run(base + [f'--data_dir={folder}'])
        assert r.returncode != 0 and 'Traceback' not in r.stderr, r.stderr[-2000:]
        assert f'{folder}/{line}' in r.stderr and 're-run the prepare script' in r.stderr
    assert not os.path.exists(f'{tmp_path}/out/ckpt.pt')


def test_bad_task_settings_get_one_line(tmp_path):
    base = ['train.py', f'--out_dir={tmp_path}/out', '--max_iters=2'] + TINY
    r = fork_run(base + ['--task=copy', '--task_n=1000000000'])
    assert r.returncode != 0 and r.stderr.strip().startswith('task_n=1000000000 is too large') and \
        'use task_n <= 1024' in r.stderr
    r = fork_run(base + ['--task=cpy'])
    assert r.returncode != 0 and r.stderr.strip().startswith("unknown task 'cpy'; tasks: copy")


def test_checkpoint_missing_parts_on_resume(trained, tmp_path):
    """A checkpoint shared as weights only cannot continue its run: resume refuses in one line
    and names the fine-tune that works; the fine-tune then runs."""
    for drop in (('optimizer',), ('config',), ('optimizer', 'rng', 'config')):
        out = copy_run(trained, tmp_path / '-'.join(drop))
        path = os.path.join(out, 'ckpt.pt')
        ck = torch.load(path, weights_only=True)
        for k in drop:
            del ck[k]
        os.remove(path)
        torch.save(ck, path)
        before = open(path, 'rb').read()
        r = fork_run(['train.py', f'--out_dir={out}', '--init_from=resume', '--max_iters=200'])
        assert r.returncode != 0 and 'Traceback' not in r.stderr, r.stderr[-2000:]
        assert f"cannot resume {path}: it has no {', '.join(k for k in ('optimizer', 'config') if k in drop)}" \
            in r.stderr and f'--init_from={path} --out_dir=ANOTHER_DIR' in r.stderr
        assert open(path, 'rb').read() == before
    data_dir = torch.load(os.path.join(trained, 'ckpt.pt'), weights_only=True)['config']['data_dir']
    r = fork_run(['train.py', f'--init_from={path}', f'--out_dir={tmp_path}/ft', f'--data_dir={data_dir}',
                  '--max_iters=2'] + TINY)
    assert r.returncode == 0, r.stderr[-2000:]


def test_damaged_metrics_line_does_not_block_resume(trained, tmp_path):
    out = copy_run(trained, tmp_path)
    path = os.path.join(out, 'metrics.jsonl')
    lines = open(path).read().splitlines(keepends=True)
    k = next(i for i, l in enumerate(lines) if json.loads(l).get('iter') == 4 and 'train/loss' in l)
    lines[k] = '{"iter": 4, "train/lo\n'  # a line edited or cut mid-write
    open(path, 'w').writelines(lines)
    r = fork_run(['train.py', f'--out_dir={out}', '--init_from=resume', f'--max_iters={N + 5}'])
    assert r.returncode == 0, r.stderr[-2000:]
    assert f'{path}: 1 damaged line(s) moved to {path}.damaged' in r.stdout
    assert open(path + '.damaged').read() == '{"iter": 4, "train/lo\n'  # kept, not lost
    its = [m['iter'] for m in metrics(out) if 'train/loss' in m]
    assert its == sorted(set(its)) and its[-1] == N + 5 and 4 not in its


def test_explicit_data_dir_that_does_not_fit_is_refused(trained, tmp_path):
    """eval.py --data_dir=FOLDER with another vocabulary is refused in one line, never silently
    replaced by the run's own data; a fitting one is used."""
    other = corpus_with_meta(str(tmp_path / 'other'), np.arange(5000) % 50, np.arange(5000) % 50, vocab_size=50)
    out = copy_run(trained, tmp_path)
    r = fork_run(['eval.py', f'--out_dir={out}', f'--data_dir={other}', '--quick=True', '--tokens=64'])
    assert r.returncode != 0 and 'Traceback' not in r.stderr
    have = torch.load(os.path.join(trained, 'ckpt.pt'), weights_only=True)['meta']['vocab_size']
    assert f'--data_dir does not fit this run: {other}: another vocabulary (50 tokens; the run has {have})' in r.stderr
    r = fork_run(['passkey.py', f'--out_dir={out}', f'--data_dir={other}', '--iters=1', '--trials=1'])
    assert r.returncode != 0 and 'Traceback' not in r.stderr and '--data_dir does not fit this run' in r.stderr
    assert not os.path.exists(os.path.join(out, 'passkey_ckpt.pt'))  # refused before any work
    own = torch.load(os.path.join(trained, 'ckpt.pt'), weights_only=True)['config']['data_dir']
    r = fork_run(['eval.py', f'--out_dir={out}', f'--data_dir={own}', '--quick=True', '--tokens=64', '--mults=[1]'])
    assert r.returncode == 0, r.stderr[-2000:]


def test_passkey_on_a_block_shorter_than_its_prompt_is_one_line(trained, tmp_path):
    """passkey.py on a run whose block_size cannot hold the prompt (the key sentence and the question, 65 tokens)
    stops in one line naming both fixes, before any fine-tune."""
    import passkey
    out = copy_run(trained, tmp_path)
    ck = torch.load(os.path.join(out, 'ckpt.pt'), weights_only=True)
    L = ck['model_args']['block_size']
    assert L < 65
    chars = sorted(set(passkey.FILLER + passkey.KEY + passkey.QUESTION + '0123456789'))
    ck['meta'] = {**ck['meta'], 'stoi': {c: i for i, c in enumerate(chars)}}  # a vocabulary the prompt fits
    torch.save(ck, os.path.join(out, 'ckpt.pt'))
    r = fork_run(['passkey.py', f'--out_dir={out}', '--iters=1', '--trials=1'])
    assert r.returncode != 0 and 'Traceback' not in r.stderr, r.stderr[-2000:]
    assert r.stderr.strip() == (f"passkey.py: the prompt needs at least 65 tokens, but block_size is {L} and "
                                f"train_len {L}; train with --block_size>=65 or pass --train_len>=65")
    assert not os.path.exists(os.path.join(out, 'passkey_ckpt.pt'))


def test_eval_split_shorter_than_a_window_is_one_line(trained, tmp_path):
    meta = torch.load(os.path.join(trained, 'ckpt.pt'), weights_only=True)['meta']
    short = corpus_with_meta(str(tmp_path / 'short'), np.arange(5000) % 16, np.arange(20) % 16)
    json.dump(meta, open(os.path.join(short, 'meta.json'), 'w'))  # the run's own vocabulary
    r = fork_run(['eval.py', f'--init_from={trained}/ckpt.pt', f'--out_dir={tmp_path}/ev', f'--data_dir={short}',
                  '--tokens=64'])
    assert r.returncode != 0 and 'Traceback' not in r.stderr
    assert r.stderr.strip().startswith('eval.py: the eval data has 20 tokens, too few for one window of 32')
    assert not os.path.exists(f'{tmp_path}/ev/eval.json')


# --- logs a person can read ---------------------------------------------------------------------

@pytest.mark.parametrize('extra', [[], ['--window=4', '--sink=2', '--start=to be or not to be'], ['--use_cache=False']],
                         ids=['cache', 'sinks after a long prompt', 'no cache'])
def test_sample_shows_progress_and_draws_the_same_tokens(trained, extra):
    """sample.py counts its new tokens on stderr (in a log: a line when a sample is done) however the prompt goes
    in, and prints the text model.generate draws without any progress."""
    import checkpoint
    r = fork_run(['sample.py', f'--out_dir={trained}', '--max_new_tokens=40', '--num_samples=2'] + extra)
    assert r.returncode == 0, r.stderr[-2000:]
    stages = [line.split(' in ')[0] for line in r.stderr.splitlines() if ' token(s) in ' in line]
    assert stages == ['sample 1/2: 40 token(s)', 'sample 2/2: 40 token(s)'], r.stderr[-2000:]
    assert '%|' not in r.stderr and '\r' not in r.stderr
    opts = dict(a[2:].split('=') for a in extra)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the forked child
    try:
        torch.manual_seed(1337)  # as sample.py: before the model is built
        model, ckpt = checkpoint.load('resume', trained, 'cpu')
        encode, decode = checkpoint.tokenizer(ckpt, '')
        x = torch.tensor([encode(opts.get('start', '\n'))])
        texts = [decode(model.generate(x, 40, temperature=0.8, top_k=200, use_cache=opts.get('use_cache') != 'False',
                                       recent=int(opts.get('window', 0)) or None,
                                       sink_tokens=int(opts.get('sink', 4)))[0].tolist()) for _ in range(2)]
    finally:
        torch.set_num_threads(threads)
    assert r.stdout.endswith(''.join(t + '\n---------------\n' for t in texts))


def test_a_stage_in_a_log_says_how_far_it_is_while_it_runs(capsys):
    """Off a terminal, progress(every=...) adds a line per interval while the stage runs, then the stage's line."""
    from console import progress
    with progress(3, 'sample 1/1', 'token', every=1e-9) as bar:
        for _ in range(3):
            bar.update()
    lines = [line.split(', ')[0] for line in capsys.readouterr().err.splitlines()]
    assert lines == ['sample 1/1: 1/3 token(s) so far', 'sample 1/1: 2/3 token(s) so far',
                     'sample 1/1: 3/3 token(s) so far', 'sample 1/1: 3 token(s) in 0.0s'], lines


def test_log_file_gets_one_line_per_stage_and_no_bars(trained, tmp_path):
    """Off a terminal (a log file, CI, nohup), eval.py prints one line per finished stage and
    no progress bar residue."""
    r = fork_run(['eval.py', f'--init_from={trained}/ckpt.pt', f'--out_dir={tmp_path}', '--tokens=512',
                  '--mults=[1,2]', '--batch_tokens=64'])
    assert r.returncode == 0, r.stderr[-2000:]
    assert '%|' not in r.stderr and '\r' not in r.stderr
    stages = [l for l in r.stderr.splitlines() if ' batch(s) in ' in l]
    assert [l.split(':')[0] for l in stages] == ['non-overlapping @1L', 'non-overlapping @2L', 'sliding @1L',
                                                 'sliding @2L', 'last-k (window 16)', 'last-k (window 32)']


@pytest.mark.parametrize('script', ['eval.py', 'sample.py'])
def test_ctrl_c_ends_a_script_with_one_line(trained, tmp_path, script):
    out = copy_run(trained, tmp_path)
    meta = torch.load(os.path.join(trained, 'ckpt.pt'), weights_only=True)['meta']
    big = corpus_with_meta(str(tmp_path / 'big'), np.arange(5000) % 16, np.arange(2_000_000) % 16)  # a long eval
    json.dump(meta, open(os.path.join(big, 'meta.json'), 'w'))
    args = {'eval.py': [f'--out_dir={out}', f'--data_dir={big}', '--tokens=2000000', '--mults=[1]'],
            'sample.py': [f'--out_dir={out}', '--max_new_tokens=100000', '--num_samples=50']}[script]
    p = subprocess.Popen(cmd([script] + args), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=ENV)
    first = p.stdout.readline()  # the script is past its imports and loading
    assert first, p.stderr.read()
    time.sleep(1.0)
    p.send_signal(signal.SIGINT)
    out_text, err = p.communicate(timeout=60)
    assert p.returncode != 0 and 'Traceback' not in err and 'KeyboardInterrupt' not in err, err[-2000:]
    assert err.strip().splitlines()[-1].startswith(f'{script}: interrupted by Ctrl-C')
    assert not os.path.exists(os.path.join(out, 'eval.json.tmp'))  # nothing half-made was left behind
