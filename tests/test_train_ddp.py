"""Ranks that stop, die or freeze under torchrun (2 CPU ranks, gloo): SIGTERM to one rank stops
both at one iteration, saving; after a SIGKILL or SIGSTOP the survivor exits within a bound with
one line on its own stderr naming the lost rank and how to resume; and each resumed run continues
the uninterrupted run's losses, on the same world size bit for bit (the two resumed 2-rank runs
are equal), on another up to float summation order."""
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import N, ROOT, TINY, fork_run
from test_train_robust import ENV, ckpt_iter, cmd, losses, run, wait_for_iter, worker_pid

# trained's settings, saving every 10 iterations: a fault at iteration 15 lands after a save, mid-training
ARGS = ['train.py', f'--max_iters={N}', '--eval_interval=10', '--final_eval=False',
        '--gradient_accumulation_steps=2'] + TINY


def launch(args, logs):
    """torchrun, 2 ranks; each worker's stdout and stderr go to their own files under `logs`,
    so a worker's own stderr can be told from torchrun's summary."""
    return subprocess.Popen([sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2',
                             f'--log-dir={logs}', '--redirects=3'] + args, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV)


def worker_stderr(logs, rank):
    return open(glob.glob(f'{logs}/*/attempt_0/{rank}/stderr.log')[0]).read()


def alive(pid):
    try:
        return open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[0] != 'Z'
    except OSError:
        return False


def fault(data, tmp_path, sig, extra=()):
    """Send `sig` to rank 1 once iteration 15 is logged (after the save at 10); return the
    seconds rank 0 took to exit after it, rank 0's own stderr, the out_dir and torchrun's rc."""
    out, logs = str(tmp_path / 'run'), str(tmp_path / 'logs')
    p = launch(ARGS + [f'--data_dir={data}', f'--out_dir={out}'] + list(extra), logs)
    r1 = None
    try:
        wait_for_iter(out, lambda: p.poll() is None, 15)
        r0, r1 = worker_pid(p.pid, 0), worker_pid(p.pid, 1)
        t = time.time()
        os.kill(r1, sig)
        while alive(r0) and time.time() - t < 60:
            time.sleep(0.02)
        took = time.time() - t
        if sig == signal.SIGSTOP:  # torchrun would wait 30 s for the frozen rank to honour its SIGTERM
            os.kill(r1, signal.SIGKILL)
        p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            for pid in (r1, p.pid):
                if pid:
                    os.kill(pid, signal.SIGKILL)
            p.wait()
    return took, worker_stderr(logs, 0), out, p.returncode


@pytest.fixture(scope='session')  # (its tests share one xdist group: conftest.GROUPS)
def killed(data, tmp_path_factory):
    return fault(data, tmp_path_factory.mktemp('killed'), signal.SIGKILL)


@pytest.fixture(scope='session')
def stopped(data, tmp_path_factory):
    """SIGTERM to rank 1 once iteration 3 is logged, then the run resumed on 2 ranks to the end:
    {'out', 'rc', 'stdout', 'stderr', 'saved' (the checkpoint's iteration at the stop), 'resumed'}."""
    out = str(tmp_path_factory.mktemp('stopped') / 'run')
    args = ARGS + [f'--data_dir={data}', f'--out_dir={out}']
    p = subprocess.Popen(cmd(args, torchrun=2), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=ENV)
    wait_for_iter(out, lambda: p.poll() is None)
    os.kill(worker_pid(p.pid, 1), signal.SIGTERM)
    stdout, stderr = p.communicate(timeout=120)
    saved = ckpt_iter(out) if os.path.exists(os.path.join(out, 'ckpt.pt')) else None
    resumed = run(args + ['--init_from=resume'], torchrun=2) if p.returncode == 0 else None
    return dict(out=out, rc=p.returncode, stdout=stdout, stderr=stderr, saved=saved, resumed=resumed)


def test_sigterm_to_one_ddp_rank_stops_every_rank_then_resumes(stopped, trained):
    """SIGTERM to rank 1 only: both ranks must stop at the same iteration (else the next
    collective hangs), rank 0 saves, both exit 0 (torchrun's exit code is 0 only then).
    The resumed 2-rank run continues the same losses as the single-process reference."""
    assert stopped['rc'] == 0, stopped['stderr'][-3000:]
    assert '[rank 1] got SIGTERM' in stopped['stdout'] and '[rank 0] got' not in stopped['stdout']
    stop = int(re.search(r'stopped by a signal to another rank at iter (\d+)', stopped['stdout']).group(1))
    assert stop < N and stopped['saved'] == stop
    assert stopped['resumed'].returncode == 0, stopped['resumed'].stderr[-3000:]
    a, b = losses(trained), losses(stopped['out'])
    assert sorted(b) == list(range(1, N + 1))
    # DDP vs one process on the same global batch: equal up to float summation order
    assert max(abs(a[k] - b[k]) for k in a) < 1e-5


def test_sigkill_of_rank_1_ends_rank_0_with_one_line(killed):
    took, err, out, rc = killed
    assert rc != 0
    assert took < 10, f"rank 0 took {took:.1f} s to exit"  # expected: the 3 s heartbeat window
    saved = ckpt_iter(out)
    assert 10 <= saved < N
    assert re.fullmatch(rf'\[rank 0\] lost rank 1 \(no heartbeat .*killed, crashed or frozen\).* resume from '
                        rf'{re.escape(out)}/ckpt.pt \(iter {saved}\) .*--init_from=resume\n', err), err
    assert 'Traceback' not in err


@pytest.mark.e2e
def test_frozen_rank_1_ends_rank_0_after_ddp_timeout(data, tmp_path):
    """SIGSTOP: rank 1's sockets stay open, so only the process-group timeout can end rank 0's wait."""
    took, err, out, rc = fault(data, tmp_path, signal.SIGSTOP, ['--ddp_timeout=5'])
    assert rc != 0
    assert 5 <= took < 20, f"rank 0 took {took:.1f} s to exit"  # expected: 5 s timeout + the 3 s window
    assert re.fullmatch(r'\[rank 0\] lost rank 1 \(no heartbeat .*frozen\).*--init_from=resume\n', err), err
    assert f'(iter {ckpt_iter(out)})' in err and 'Traceback' not in err


def test_resume_after_the_kill_continues_the_same_losses(killed, stopped, tmp_path):
    """Same world size: the checkpoint saved before the kill loads, the lines logged after it are
    dropped and logged again, and every iteration's loss is, bit for bit, the one of the run stopped
    by SIGTERM and resumed (the uninterrupted run's, each if its resume is exact)."""
    out = str(tmp_path / 'run')
    shutil.copytree(killed[2], out)
    r = run(ARGS + [f'--out_dir={out}', '--init_from=resume'], torchrun=2)
    assert r.returncode == 0, r.stderr[-3000:]
    assert 'world size' not in r.stdout
    b = losses(out)
    assert sorted(b) == list(range(1, N + 1)) and b == losses(stopped['out'])


def test_resume_on_another_world_size_says_so(killed, stopped, tmp_path):
    """One process resumes the 2-rank checkpoint: it says so and continues the same global
    batches, equal to the 2-rank run up to float summation order."""
    out = str(tmp_path / 'run')
    shutil.copytree(killed[2], out)
    r = fork_run(['train.py', f'--out_dir={out}', '--init_from=resume'])
    assert r.returncode == 0, r.stderr[-3000:]
    assert 'resuming with world size 2 -> 1: the run continues' in r.stdout
    b, ref = losses(out), losses(stopped['out'])
    assert sorted(b) == list(range(1, N + 1)) and max(abs(b[k] - ref[k]) for k in b) < 1e-5
