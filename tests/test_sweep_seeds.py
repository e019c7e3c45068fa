"""Comparisons over seeds, end to end: a sweep trains every run once per seed in its own folder,
resumes per seed, logs one wandb run per scheme and seed in the sweep's group, and its report gives
each cell's mean ± sd with n; seed s gives every scheme the same batches."""
import json
import os
import signal
import subprocess
import sys

import pytest

from conftest import ROOT
from test_sweep import ENV, MODEL, children, gone_within, tables, wait_for

TWO = ['--schemes=rope,alibi', '--seeds=2', '--scalings=', '--max_iters=60', '--eval_interval=30',
       '--final_eval_mults=[1, 2]', '--block_size=16', '--batch_size=4', '--eval_tokens=256',
       '--warmup_iters=5'] + MODEL


def sweep(args, env=ENV, **kw):
    return subprocess.Popen([sys.executable, 'sweep.py'] + args, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, **kw)


def aggregate(out):
    agg = json.load(open(os.path.join(out, 'report', 'aggregate.json')))
    return {k: v for k, v in agg.items() if k != 'runs'}


def wandb_records(run_dir):
    """The records of the one offline wandb run under run_dir, read with wandb's own CLI
    (`wandb leet inspect --json`, run by this interpreter, so no activated environment is needed):
    {'run': ..., 'summary': merged summary updates}."""
    import glob
    [path] = glob.glob(os.path.join(run_dir, 'wandb', 'offline-run-*', 'run-*.wandb'))
    r = subprocess.run([sys.executable, '-m', 'wandb', 'leet', 'inspect', '--json', path], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    recs = [json.loads(line) for line in r.stdout.splitlines() if line.startswith('{')]
    summary = {}
    for r in recs:
        summary.update(r.get('summary', {}).get('update', {}))
    return {'run': next(r['run'] for r in recs if 'run' in r), 'summary': summary}


def assert_one_wandb_run_per_scheme_and_seed_in_one_group(out):
    """Each run logged (offline) as NAME-sSEED in the sweep's group, its config and final losses;
    the report's aggregate as a wandb Table in the same group."""
    group = os.path.basename(out)
    for scheme in ('rope', 'alibi'):
        for seed in (1337, 1338):
            d = os.path.join(out, f'{scheme}-s{seed}')
            rec = wandb_records(d)
            run, cfg = rec['run'], rec['run']['config']['update']
            assert (run['display_name'], run['run_group'], run['job_type']) == (f'{scheme}-s{seed}', group, 'lm')
            assert cfg['pos_encoding'] == scheme and cfg['seed'] == seed
            res = json.load(open(os.path.join(d, 'eval.json')))
            for m, v in zip(res['mults'], res['nonoverlap']):
                assert rec['summary'][f'val/loss@{m}L'] == pytest.approx(v, abs=1e-9)
    agg = wandb_records(os.path.join(out, 'report'))
    assert (agg['run']['display_name'], agg['run']['run_group'], agg['run']['job_type']) == \
        ('aggregate', group, 'aggregate')
    assert agg['summary']['aggregate._type'] == 'table-file'
    import glob
    [table] = glob.glob(os.path.join(out, 'report', 'wandb', 'offline-run-*', 'files', 'media', 'table',
                                     'aggregate_*.json'))
    table = json.load(open(table))
    rows = {(r[0], r[1], r[2]): dict(zip(table['columns'], r)) for r in table['data']}
    want = json.load(open(os.path.join(out, 'report', 'aggregate.json')))['nonoverlap']['1']
    row = rows[('nonoverlap', '1', 'alibi')]
    assert row['n'] == 2 and row['mean'] == pytest.approx(want['runs']['alibi']['mean'])
    assert row['diff_vs_baseline'] == pytest.approx(want['paired_vs_rope']['alibi']['diff'])


@pytest.mark.e2e
def test_two_seed_sweep_reports_spread_logs_to_wandb_and_resumes_per_seed(data, tmp_path):
    """The reference sweep logs to wandb (offline); the sweep killed half-way and run again does not,
    and ends with the same report: wandb changes no result."""
    ref = str(tmp_path / 'two-seeds')
    p = sweep([a for a in TWO if a != '--wandb_log=False'] + [f'--data_dir={data}', f'--out={ref}'],
              env=dict(ENV, WANDB_MODE='offline'))
    said = p.communicate(timeout=300)[0]
    assert p.returncode == 0, said[-3000:]
    assert 'sweep: language modelling: 4 runs (2 x 2 seed(s): 1337, 1338), 4 to do, about' in said
    assert sorted(os.listdir(ref)) == ['.lock', 'alibi-s1337', 'alibi-s1338', 'report', 'rope-s1337', 'rope-s1338',
                                       'schedule.jsonl']
    md = open(os.path.join(ref, 'report', 'report.md')).read()
    detail = md.split('### Val loss', 1)[1]  # past the leaderboard, whose cells have no min–max
    rows = [l for l in detail.splitlines() if l.startswith(('| rope | 2 |', '| alibi | 2 |'))]
    assert rows and all(' ± ' in l and '–' in l for l in rows), md
    assert 'Difference from rope (run − rope), paired by seed' in md and '| alibi | ' in md
    agg = json.load(open(os.path.join(ref, 'report', 'aggregate.json')))
    cell = agg['nonoverlap']['1']['runs']['alibi']
    assert cell['n'] == 2 and set(cell['seeds']) == {'1337', '1338'} and cell['seeds']['1337'] != cell['seeds']['1338']
    # the two seeds differ (initialisation, batches, dropout), the two schemes at one seed share the batches
    assert_one_wandb_run_per_scheme_and_seed_in_one_group(ref)
    # a sweep killed half-way and run again trains only what is missing and ends with the same report
    out = str(tmp_path / 'out')
    p = sweep(TWO + [f'--data_dir={data}', f'--out={out}'], start_new_session=True)
    assert wait_for(p, os.path.join(out, 'rope-s1338', 'sweep.log'), 'iter 30:')  # rope-s1337 is done
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    assert not gone_within(out, 10), children(out)  # the killed train.py has let go of its folder
    # rope-s1338 was killed at iteration 30 of 60, unless the kill landed late on a loaded machine and it had ended
    ended = sum(os.path.exists(os.path.join(out, f'rope-s{s}', 'eval.json')) for s in (1337, 1338))
    assert ended in (1, 2)
    p = sweep(TWO + [f'--data_dir={data}', f'--out={out}'])
    said = p.communicate(timeout=300)[0]
    assert p.returncode == 0, said[-3000:]
    assert f'{4 - ended} to do' in said, said[:400]
    assert 'rope-s1337' not in ''.join(l for l in said.splitlines() if l.startswith('$ '))
    assert tables(out) == tables(ref)
    assert aggregate(out) == aggregate(ref)


def batches_seen(data_dir, tmp_path, scheme, seed, iters=6):
    """The training inputs train.py feeds the model, one digest per forward, for a run of `scheme`
    at `seed`: train.py runs in a forked child whose GPT.forward records what it is given."""
    import hashlib
    import runpy
    path = tmp_path / f'{scheme}-{seed}.json'
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            import torch
            import model
            torch.set_num_threads(1)
            seen, real = [], model.GPT.forward

            def spy(self, idx, *a, **kw):
                if self.training and idx.shape == (4, 16):  # a training batch (not the route probe's copy)
                    seen.append(hashlib.sha1(idx.cpu().numpy().tobytes()).hexdigest())
                return real(self, idx, *a, **kw)
            model.GPT.forward = spy
            os.chdir(ROOT)
            sys.argv = ['train.py', f'--pos_encoding={scheme}', f'--seed={seed}', f'--data_dir={data_dir}',
                        f'--out_dir={tmp_path}/{scheme}-{seed}', f'--max_iters={iters}', '--eval_interval=100',
                        '--final_eval=False', '--gradient_accumulation_steps=2'] + MODEL + \
                ['--block_size=16', '--batch_size=4', '--eval_tokens=64', '--eval_mults=[1]']
            sys.stdout = open(os.devnull, 'w')
            runpy.run_path('train.py', run_name='__main__')
            json.dump(seen, open(path, 'w'))
            code = 0
        finally:
            os._exit(code)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    return json.load(open(path))


@pytest.mark.e2e
def test_seed_s_gives_every_scheme_the_same_batches(data, tmp_path):
    """The paired design: at one seed, two schemes train on identical batches (2 micro-steps per
    iteration); another seed draws other batches."""
    rope, alibi = batches_seen(data, tmp_path, 'rope', 7), batches_seen(data, tmp_path, 'alibi', 7)
    assert len(rope) == 12 and rope == alibi
    other = batches_seen(data, tmp_path, 'rope', 8)
    assert len(other) == 12 and not set(other) & set(rope)


def test_plan_estimate_uses_each_tasks_own_finished_runs(tmp_path):
    """The up-front estimate: finished runs cost nothing; a run left costs the median seconds per
    iteration trained of its task's finished runs (a resumed run counts only what it trained)
    times its max_iters, plus their median seconds outside training; a task with no finished run
    takes the median over all; two at a time halves the total."""
    sys.path.insert(0, ROOT)
    from sweep import COST, estimate

    def job(name, task, iters, timing=None):
        d = tmp_path / name
        d.mkdir()
        if timing:
            (d / 'eval.json').write_text(json.dumps({'iter': iters, 'complete': True, 'timing': timing}))
        return {'out_dir': str(d), 'task': task, 'max_iters': iters}
    jobs = [job('a1', 'copy', 1000, {'startup_s': 2.0, 'train_s': 20.0, 'final_eval_s': 1.0, 'iters_trained': 1000}),
            job('a2', 'copy', 1000, {'startup_s': 2.0, 'train_s': 6.0, 'final_eval_s': 1.0, 'iters_trained': 300}),
            job('a3', 'copy', 1000, {'startup_s': 4.0, 'train_s': 40.0, 'final_eval_s': 1.0, 'iters_trained': 1000}),
            job('b1', 'stack', 3000, {'startup_s': 1.0, 'train_s': 150.0, 'final_eval_s': 1.0, 'iters_trained': 3000}),
            job('a4', 'copy', 1000), job('a5', 'copy', 500), job('b2', 'stack', 3000), job('c1', 'sort', 1000)]
    # copy: 0.02, 0.02, 0.04 s/iter -> median 0.02; fixed 3, 3, 5 -> 3.  stack: 0.05 s/iter, fixed 2.
    # all four: s/iter 0.02, 0.02, 0.04, 0.05 -> sorted[2] = 0.04; fixed 3, 3, 5, 2 -> sorted[2] = 3
    left, secs = estimate(jobs, 'task', workers=1)
    assert left == 4
    assert secs == pytest.approx((0.02 * 1000 + 3) + (0.02 * 500 + 3) + (0.05 * 3000 + 2) + (0.04 * 1000 + 3))
    assert estimate(jobs, 'task', workers=2)[1] == pytest.approx(secs / 2)
    # three evaluations of a finished run (rope_scaling): the median final_eval_s (1.0) each
    assert estimate(jobs, 'task', workers=1, evals=3) == (4, pytest.approx(secs + 3 * 1.0))
    # no finished run at all: the built-in per-kind cost
    fresh = [job('x', 'copy', 100)]
    assert estimate(fresh, 'task', 1) == (1, pytest.approx(COST['task'][0] * 100 + COST['task'][1]))
    assert estimate(fresh, 'task', 1, evals=2)[1] == pytest.approx(COST['task'][0] * 100 + 3 * COST['task'][1])
