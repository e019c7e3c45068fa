"""Sweeps under faults: sweep.py (the LM sweep and the task suite) killed at random-ish moments
with SIGKILL, SIGTERM or SIGINT and run again ends with the report of an uninterrupted sweep;
its children stop (saving) when it stops, torchrun's ranks included; a second sweep into its folder
is refused; damaged results are named and redone; compare.py names a damaged file and reports the
rest. Runs side by side (stand-in GPUs) report as runs one after the other, number for number."""
import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest

from report import read_result
from conftest import ROOT, fork_run

ENV = dict(os.environ, OMP_NUM_THREADS='1')
MODEL = ['--n_layer=1', '--n_embd=32', '--n_head=2', '--compile=False', '--log_interval=50', '--wandb_log=False']
# 300 tiny steps: a second or so of training, long enough to land a signal inside it
LM = ['--schemes=rope,alibi', '--scalings=linear', '--max_iters=300', '--eval_interval=100',
      '--final_eval_mults=[1, 2]', '--block_size=16', '--batch_size=4', '--eval_tokens=256', '--warmup_iters=5'] + MODEL
# a progress line every 10 steps: each stop of the task suite's fault test waits for the first line after the
# last stop, and at ~2 ms a step a signal lands up to ~50 steps after the line it followed
TASKS = ['--tasks=copy', '--schemes=rope,learned', '--randomized=', '--max_iters=200', '--eval_interval=100',
         '--batch_size=8'] + [a for a in MODEL if not a.startswith('--log_interval')] + ['--log_interval=10']
NEXT_LINE = '\niter '  # a run's next progress line, whichever step it resumed at


def sweep(args):
    return subprocess.run([sys.executable, 'sweep.py'] + args, cwd=ROOT, capture_output=True, text=True, env=ENV,
                          timeout=300)


def script(line):
    """The script a '$ ...' line of the sweep's output runs."""
    return next(w for w in line.split() if w.endswith('.py'))


def results(out):
    """Every result JSON of a sweep folder (the runs' eval*.json, the task report's tasks.json), by
    path relative to it, without the folder's own name in them and without train.py's 'timing'
    (wall-clock seconds, which differ from run to run)."""
    def untimed(v):
        if isinstance(v, dict):
            return {k: untimed(x) for k, x in v.items() if k != 'timing'}
        return [untimed(x) for x in v] if isinstance(v, list) else v
    got = {}
    found = [glob.glob(os.path.join(out, *parts)) for parts in
             (('*', 'eval*.json'), ('*', '*', 'eval*.json'), ('report', 'tasks.json'))]
    for p in sorted(sum(found, [])):
        got[os.path.relpath(p, out)] = untimed(json.loads(open(p).read().replace(out, 'OUT')))
    return got


def tables(out):
    """The report's table rows, throughput columns (tokens/s, ms/iter: timings) left out."""
    rows, timed = [], False
    for line in open(os.path.join(out, 'report', 'report.md')).read().splitlines():
        if line.startswith('#'):
            timed = line.startswith('### Training')
        elif line.startswith('|'):
            rows.append('|'.join(line.split('|')[:4]) if timed else line)  # run, n, train loss
    return rows


def reference(args):
    r = sweep(args)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = args[-1].split('=', 1)[1]
    return dict(out=out, args=args, stdout=r.stdout, results=results(out), tables=tables(out))


@pytest.fixture(scope='session')  # (its tests share one xdist group: conftest.GROUPS)
def lm_ref(data, tmp_path_factory):
    """The uninterrupted LM sweep the interrupted ones must end equal to."""
    return reference(LM + [f'--data_dir={data}', f"--out={tmp_path_factory.mktemp('lm-ref') / 'out'}"])


@pytest.fixture(scope='session')
def task_ref(tmp_path_factory):
    return reference(TASKS + [f"--out={tmp_path_factory.mktemp('task-ref') / 'out'}"])


def children(out):
    """(pid, script) of every live process working on the sweep folder `out` other than sweep.py."""
    found = []
    for pid in filter(str.isdigit, os.listdir('/proc')):
        try:
            argv = open(f'/proc/{pid}/cmdline', 'rb').read().decode().split('\0')
            state = open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[0]
        except OSError:
            continue
        script = next((a for a in argv[1:2] if a.endswith('.py')), None)
        if int(pid) != os.getpid() and state != 'Z' and script not in (None, 'sweep.py') and \
                any(a.startswith('--out_dir=' + out) for a in argv):
            found.append((int(pid), script))
    return found


def start(args, tmp_path):
    log = open(tmp_path / f'sweep-{time.time()}.out', 'w+')
    return subprocess.Popen([sys.executable, 'sweep.py'] + args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env=ENV, text=True), log


def wait_for(p, path, text, timeout=120, new=True):
    """Wait until `text` appears in the file `path` (after what it held already, if `new`) -> True,
    or p ends -> False."""
    seen = os.path.getsize(path) if new and os.path.exists(path) else 0
    deadline = time.time() + timeout
    while time.time() < deadline and p.poll() is None:
        if os.path.exists(path):
            with open(path, errors='replace') as f:
                f.seek(seen)
                if text in f.read():
                    return True
        time.sleep(0.01)
    assert p.poll() is not None, f"{text!r} never appeared in {path}"
    return False


def output(p, log):
    p.wait(timeout=120)
    log.seek(0)
    return log.read()


def gone_within(out, seconds):
    deadline = time.time() + seconds
    while children(out) and time.time() < deadline:
        time.sleep(0.05)
    return children(out)


def probe(args, tmp_path, sig, run_log, text, delay, out, started=None):
    """Start the sweep (or take `started`), send it `sig` `delay` s after `text` shows in run_log ->
    (exit code, output, children at the signal). Checks the rules for each signal on the way."""
    p, log = started or start(args, tmp_path)
    assert wait_for(p, run_log, text, new=not started), f"the sweep ended before {text!r}:\n" + output(p, log)[-3000:]
    time.sleep(delay)
    running = children(out)
    p.send_signal(sig)
    text = output(p, log)
    assert 'Traceback' not in text, text[-3000:]
    if sig == signal.SIGKILL:  # its children are told (PDEATHSIG), save and exit: none runs on detached
        assert not gone_within(out, 5), f"still running 5 s after the sweep's SIGKILL: {children(out)}"
    else:  # it passes SIGTERM on, waits for them and exits with one line on resuming
        assert not children(out), children(out)
        assert p.returncode == 128 + sig, text[-3000:]
        assert text.splitlines()[-1] == (f"sweep: stopped by {signal.Signals(sig).name} (its runs saved first); run "
                                         f"the same command again to resume"), text[-3000:]
    return p.returncode, text, running


def test_finished_sweep_run_again_starts_nothing_and_other_settings_are_refused(lm_ref):
    """The sweep trained each scheme and evaluated rope with its run-time scaling; run again, it
    starts nothing and writes the same tables; the folder with other settings is refused, not mixed
    in, and left as it was; a bad option gets one line."""
    out, args = lm_ref['out'], lm_ref['args']
    started = [script(line) for line in lm_ref['stdout'].splitlines() if line.startswith('$ ')]
    assert sorted(started) == ['eval.py', 'train.py', 'train.py'] and 'passkey off' in lm_ref['stdout']
    for s in ('rope', 'alibi'):
        assert json.load(open(os.path.join(out, s + '-s1337', 'eval.json')))['iter'] == 300
    assert os.path.exists(os.path.join(out, 'rope-s1337', 'eval_linear_x16.json'))
    assert any(r.startswith('| rope +linear_x16 |') for r in lm_ref['tables'])
    assert any(r.startswith('| alibi |') for r in lm_ref['tables'])
    r = sweep(args)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert not [line for line in r.stdout.splitlines() if line.startswith('$ ')]
    assert tables(out) == lm_ref['tables']
    r = sweep([a if not a.startswith('--max_iters') else '--max_iters=301' for a in args])
    assert r.returncode != 0 and 'holds a run with other settings' in r.stdout
    assert tables(out) == lm_ref['tables'] and results(out) == lm_ref['results']
    # refused before any run: sweep.py's own code path in a forked child, no second interpreter
    r = fork_run(['sweep.py', '--passkey=maybe'])
    assert r.returncode != 0 and 'True or False' in r.stderr
    # --schemes alone runs no variant; a named one must exist
    r = fork_run(['sweep.py'] + args + ['--variants=rope-bogus'])
    assert r.returncode != 0 and "unknown variant(s) ['rope-bogus']" in r.stderr and 'Traceback' not in r.stderr


def test_lm_sweep_killed_then_rerun_ends_with_the_uninterrupted_report(lm_ref, data, tmp_path):
    rng = random.Random(0)
    out = str(tmp_path / 'out')
    args = LM + [f'--data_dir={data}', f'--out={out}']
    # each stop lands in a later stage than the one before: in training, in the final eval or the eval.py
    # that follows, in the second run's training; up to 50 ms after the line that marks the stage (the last
    # run has ~0.3 s of work left after it: a later stop could find the sweep finished)
    stops = [(signal.SIGKILL, 'rope', rng.choice(['iter 50:', 'iter 100:']), 0),
             (signal.SIGTERM, 'rope', rng.choice(['final eval:', '$ ' + sys.executable + ' eval.py']),
              rng.uniform(0, .05)),
             (signal.SIGINT, 'alibi', rng.choice(['iter 100:', 'iter 150:']), rng.uniform(0, .05))]
    for sig, run, text, delay in stops:
        rc, said, running = probe(args, tmp_path, sig, os.path.join(out, run + '-s1337', 'sweep.log'), text, delay, out)
        if sig == signal.SIGKILL:
            assert running and running[0][1] == 'train.py', running  # it landed in training...
            log = open(os.path.join(out, run + '-s1337', 'sweep.log')).read()
            assert 'stopped by SIGTERM at iter' in log  # ...which saved
    r = sweep(args)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert tables(out) == lm_ref['tables']
    assert results(out) == lm_ref['results']


def test_concurrent_lm_sweep_reports_as_the_sequential_one(lm_ref, data, tmp_path):
    """lm_ref's sweep (rope and alibi, one after the other) again with both runs side by side on one stand-in GPU
    (2 per GPU): each child was handed GPU 0, never more than 2 at once, both at once at some point; the tables
    and every eval*.json equal lm_ref's."""
    out = str(tmp_path / 'out')
    p, log = start(LM + [f'--data_dir={data}', f'--out={out}', '--gpu_ids=0', '--runs_per_gpu=2'], tmp_path)
    seen = []
    while p.poll() is None:  # the children's environment, as the kernel has it
        found = []
        for pid, name in children(out):
            try:
                env = dict(kv.split('=', 1) for kv in open(f'/proc/{pid}/environ').read().split('\0') if '=' in kv)
            except OSError:
                continue
            found.append(env.get('CUDA_VISIBLE_DEVICES'))
        seen.append(found)
        time.sleep(0.02)
    log.seek(0)
    said = log.read()
    assert p.returncode == 0, said[-3000:]
    assert all(set(s) <= {'0'} and len(s) <= 2 for s in seen) and max(map(len, seen)) == 2, seen
    starts = [line for line in said.splitlines() if line.startswith('$ ')]
    assert [script(line) for line in starts].count('train.py') == 2
    assert all(line.startswith('$ CUDA_VISIBLE_DEVICES=0 OMP_NUM_THREADS=1 ') for line in starts), starts
    assert '2 at a time on GPU(s) 0, 2 per GPU' in said
    assert tables(out) == lm_ref['tables'] and results(out) == lm_ref['results']


def test_torchrun_run_over_two_gpus_stops_saving_and_resumes(lm_ref, data, tmp_path):
    """rope over 2 stand-in GPUs (a torchrun of 2 ranks, gloo on the CPU): SIGTERM to the sweep mid-training stops
    both ranks at one iteration, saving, and the sweep exits with its one line; run again, it resumes on 2 ranks
    and ends at max_iters with the losses of lm_ref's single-process rope (the same gradient, summed in another
    order)."""
    import torch
    out = str(tmp_path / 'out')
    args = [a for a in LM if not a.startswith('--schemes')] + ['--schemes=rope', f'--data_dir={data}', f'--out={out}',
                                                              '--gpu_ids=0,1', '--gpus_per_run=2']
    log_path = os.path.join(out, 'rope-s1337', 'sweep.log')
    p, log = start(args, tmp_path)
    assert wait_for(p, log_path, 'iter 100:', timeout=180), open(log.name).read()[-3000:]
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=120)
    log.seek(0)
    said = log.read()
    assert p.returncode == 128 + signal.SIGTERM and not children(out), said[-3000:]
    assert said.splitlines()[-1] == ("sweep: stopped by SIGTERM (its runs saved first); run the same command again "
                                     "to resume")
    text = open(log_path).read()
    assert '$ CUDA_VISIBLE_DEVICES=0,1 ' in text and 'torch.distributed.run --standalone --nproc_per_node=2' in text
    stopped = int(text.split('stopped by SIGTERM at iter ')[1].split(':')[0])
    assert 100 <= stopped < 300
    r = subprocess.run([sys.executable, 'sweep.py'] + args, cwd=ROOT, capture_output=True, text=True, env=ENV,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ck = torch.load(os.path.join(out, 'rope-s1337', 'ckpt.pt'), weights_only=True)
    assert ck['config']['world_size'] == 2 and ck['iter_num'] == 300
    got = json.load(open(os.path.join(out, 'rope-s1337', 'eval.json')))
    want = json.load(open(os.path.join(lm_ref['out'], 'rope-s1337', 'eval.json')))
    assert got['nonoverlap'] == pytest.approx(want['nonoverlap'], rel=1e-3)


def test_task_suite_faults_then_rerun_ends_with_the_uninterrupted_report(task_ref, tmp_path):
    """A second sweep into the folder is refused naming the first; SIGKILL of the sweep with two runs
    going; SIGTERM to one train.py (reported FAILED with its log, not as done); SIGINT of the sweep;
    then the report of task_ref."""
    rng = random.Random(1)
    out = str(tmp_path / 'out')
    args = TASKS + [f'--out={out}']
    rope = os.path.join(out, 'copy', 'rope-s1337')
    p, log = start(args, tmp_path)
    assert wait_for(p, os.path.join(out, '.lock'), 'sweep.py')
    r = sweep(args)
    assert r.returncode != 0 and r.stdout == '' and len(r.stderr.strip().splitlines()) == 1, r.stdout + r.stderr
    assert f"is in use by PID {p.pid} (sweep.py" in r.stderr and '--out=ANOTHER_DIR' in r.stderr
    _, said, running = probe(args, tmp_path, signal.SIGKILL, os.path.join(rope, 'sweep.log'), 'iter 30:', 0, out,
                             started=(p, log))
    assert ('train.py' in [s for _, s in running]) and 'stopped by SIGTERM at iter' in open(rope + '/sweep.log').read()

    p, log = start(args, tmp_path)
    assert wait_for(p, os.path.join(rope, 'sweep.log'), NEXT_LINE)
    [(pid, script)] = children(rope)
    os.kill(pid, signal.SIGTERM)  # train.py saves and exits 0: a stopped run, not a finished one
    text = output(p, log)
    assert p.returncode == 1, text[-3000:]
    failed = [line for line in text.splitlines() if line.startswith('sweep: FAILED')]
    assert failed == [f"sweep: FAILED {rope}: train.py stopped before the end (no eval.json); see {rope}/sweep.log; "
                      f"run the sweep again to redo it"], text[-3000:]
    assert '| learned | 1 |' in open(os.path.join(out, 'report', 'report.md')).read()
    assert '| rope |' not in open(os.path.join(out, 'report', 'report.md')).read()

    _, said, running = probe(args, tmp_path, signal.SIGINT, os.path.join(rope, 'sweep.log'), NEXT_LINE,
                             rng.uniform(0, .05), out)
    assert running, said[-3000:]
    r = sweep(args)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert tables(out) == task_ref['tables']
    assert results(out) == task_ref['results']


def test_damaged_results_are_named_and_redone(lm_ref, tmp_path):
    """A truncated eval_*.json and an eval.json with complete: false (a final eval stopped half way):
    each named in one line, moved aside, and redone (eval.py / train.py's final eval), nothing else.
    A run folder still locked (a child of a killed sweep, saving) is waited for, not reported failed."""
    import fcntl
    out = lm_ref['out']
    scaled = os.path.join(out, 'rope-s1337', 'eval_linear_x16.json')
    alibi = os.path.join(out, 'alibi-s1337', 'eval.json')
    text = open(scaled).read()
    open(scaled, 'w').write(text[:len(text) // 2])
    res = json.load(open(alibi))
    json.dump(dict(res, complete=False, sliding=res['sliding'][:1]), open(alibi, 'w'))
    lock = open(os.path.join(out, 'alibi-s1337', '.lock'), 'w')
    fcntl.flock(lock, fcntl.LOCK_EX)
    lock.write('PID 4242 (train.py, stopped by its sweep)\n')
    lock.flush()
    p, log = start(lm_ref['args'], tmp_path)
    waiting = f"waiting for PID 4242 (train.py, stopped by its sweep) to let go of {out}/alibi-s1337"
    waited = wait_for(p, log.name, waiting)
    lock.close()
    said = output(p, log)
    assert waited and p.returncode == 0, said[-3000:]
    lines = said.splitlines()
    assert f"sweep: {scaled} is truncated or corrupt JSON" in said and f"moved to {scaled}.bad, redoing it" in said
    assert f"sweep: {alibi} is incomplete (complete: false" in said and os.path.exists(alibi + '.bad')
    assert [script(line) for line in lines if line.startswith('$ ')] == ['eval.py', 'train.py']
    assert tables(out) == lm_ref['tables'] and results(out) == lm_ref['results']


def test_compare_names_a_damaged_file_and_reports_the_rest(lm_ref, tmp_path):
    for run in ('rope', 'alibi'):
        shutil.copytree(os.path.join(lm_ref['out'], run + '-s1337'), tmp_path / run)
    bad = str(tmp_path / 'alibi' / 'eval.json')
    text = open(bad).read()
    open(bad, 'w').write(text[:100])
    r = subprocess.run([sys.executable, 'compare.py', str(tmp_path / 'rope'), str(tmp_path / 'alibi'),
                        f"--report_dir={tmp_path / 'report'}"], cwd=ROOT, capture_output=True, text=True, env=ENV)
    assert r.returncode == 0 and 'Traceback' not in r.stderr, r.stderr[-3000:]
    assert r.stderr.startswith(f"compare: skipping {bad}: truncated or corrupt JSON (100 bytes;"), r.stderr
    md = open(tmp_path / 'report' / 'report.md').read()
    assert '| rope |' in md and '| rope +linear_x16 |' in md and '| alibi |' not in md


def test_sweep_logs_one_line_per_stage(lm_ref, task_ref):
    """Not on a terminal: no child output and no progress bars in the sweep's own output, one line
    per started command or finished run; the children's output is in each run's sweep.log."""
    for ref in (lm_ref, task_ref):
        assert '\r' not in ref['stdout'] and 'iter 50:' not in ref['stdout']
        assert all(line.startswith(('sweep: ', '$ ')) for line in ref['stdout'].splitlines()), ref['stdout']
    assert len([line for line in lm_ref['stdout'].splitlines() if line.startswith('$ ')]) == 3  # 2 trainings, 1 eval
    assert 'iter 300:' in open(os.path.join(lm_ref['out'], 'rope-s1337', 'sweep.log')).read()


def test_read_result_tells_missing_from_damaged(tmp_path):
    p = str(tmp_path / 'eval.json')
    assert read_result(p) == (None, None)
    for text, why in (('{"iter": 3, "nonov', 'truncated or corrupt JSON'), ('[1, 2]', 'not a JSON object'),
                      ('{"iter": 3, "complete": false}', 'incomplete (complete: false')):
        open(p, 'w').write(text)
        res, got = read_result(p)
        assert res is None and got.startswith(why), got
    open(p, 'w').write('{"iter": 3, "complete": true}')
    assert read_result(p) == ({'iter': 3, 'complete': True}, None)
