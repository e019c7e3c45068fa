"""Comparisons over seeds, end to end: a sweep trains every run once per seed in its own folder,
resumes per seed, and its report gives each cell's mean ± sd with n; seed s gives every scheme
the same batches."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT
from test_sweep_faults import ENV, MODEL, data, tables, wait_for  # noqa: F401 (data: a fixture)

TWO = ['--schemes=rope,alibi', '--seeds=2', '--scalings=', '--max_iters=60', '--eval_interval=30',
       '--final_eval_mults=[1, 2]', '--block_size=16', '--batch_size=4', '--eval_tokens=256', '--warmup_iters=5'] + MODEL


def sweep(args, **kw):
    return subprocess.Popen([sys.executable, 'sweep.py'] + args, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=ENV, **kw)


def aggregate(out):
    agg = json.load(open(os.path.join(out, 'report', 'aggregate.json')))
    return {k: v for k, v in agg.items() if k != 'runs'}


def test_two_seed_sweep_reports_spread_and_resumes_per_seed(data, tmp_path):
    ref = str(tmp_path / 'ref')
    p = sweep(TWO + [f'--data_dir={data}', f'--out={ref}'])
    said = p.communicate(timeout=300)[0]
    assert p.returncode == 0, said[-3000:]
    assert 'sweep: language modelling: 4 runs (2 x 2 seed(s): 1337, 1338), 4 to do, about' in said
    assert sorted(os.listdir(ref)) == ['.lock', 'alibi-s1337', 'alibi-s1338', 'report', 'rope-s1337', 'rope-s1338']
    md = open(os.path.join(ref, 'report', 'report.md')).read()
    rows = [l for l in md.splitlines() if l.startswith(('| rope | 2 |', '| alibi | 2 |'))]
    assert rows and all(' ± ' in l and '–' in l for l in rows), md
    assert 'Difference from rope (run − rope), paired by seed' in md and '| alibi | ' in md
    agg = json.load(open(os.path.join(ref, 'report', 'aggregate.json')))
    cell = agg['nonoverlap']['1']['runs']['alibi']
    assert cell['n'] == 2 and set(cell['seeds']) == {'1337', '1338'} and cell['seeds']['1337'] != cell['seeds']['1338']
    # the two seeds differ (initialisation, batches, dropout), the two schemes at one seed share the batches
    # a sweep killed half-way and run again trains only what is missing and ends with the same report
    out = str(tmp_path / 'out')
    p = sweep(TWO + [f'--data_dir={data}', f'--out={out}'], start_new_session=True)
    assert wait_for(p, os.path.join(out, 'rope-s1338', 'sweep.log'), 'iter 30:')  # rope-s1337 is done
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    time.sleep(1.0)
    p = sweep(TWO + [f'--data_dir={data}', f'--out={out}'])
    said = p.communicate(timeout=300)[0]
    assert p.returncode == 0, said[-3000:]
    assert '3 to do' in said and 'rope-s1337' not in ''.join(l for l in said.splitlines() if l.startswith('$ '))
    assert tables(out) == tables(ref)
    assert aggregate(out) == aggregate(ref)
