"""Many runs at once on one machine (launch.py, sweep.py's slots): the slots it builds for CPU workers, for runs
packed on a GPU and for runs over several GPUs under torchrun; the scheduler keeping every slot busy while runs
are left (its own accounting in OUT/schedule.jsonl, and each child's own record of the device it was handed), never
a device over its share; (test_sweep.py: a concurrent sweep's report equal to a sequential one's, a torchrun run stopped
and resumed). The GPUs are stand-ins: a child is handed its GPU as
CUDA_VISIBLE_DEVICES, and trains on the CPU."""
import json
import os
import subprocess
import sys
from collections import Counter

import pytest

import launch
from conftest import ROOT, fork_run
from test_sweep import ENV

# a stand-in step: records when it ran and the GPU it was handed, after `seconds`, as its result JSON
STEP = ("import json, os, sys, time; t0 = time.time(); time.sleep(float(sys.argv[2])); sys.exit(3) if sys.argv[3] == "
        "'fail' else json.dump(dict(t0=t0, t1=time.time(), gpu=os.environ.get('CUDA_VISIBLE_DEVICES')), "
        "open(sys.argv[1], 'w'))")


def test_slots_split_the_gpus_and_cores_as_asked():
    """Packing: K slots on each GPU, each handed its GPU and a core set of its own; torchrun: one slot per G GPUs,
    its train step (only) under torchrun; the CPU: N workers of one thread each, or one with every thread."""
    s = launch.local_slots(gpu_ids=['0', '1', '2', '3'], runs_per_gpu=2, cores=list(range(16)))
    assert Counter(x['env']['CUDA_VISIBLE_DEVICES'] for x in s) == {'0': 2, '1': 2, '2': 2, '3': 2}
    assert all(x['env']['OMP_NUM_THREADS'] == '2' and len(x['cores']) == 2 and x['nproc'] == 1 for x in s)
    assert sorted(c for x in s for c in x['cores']) == list(range(16))  # disjoint, every core used
    s = launch.local_slots(gpu_ids=['4', '5', '6', '7'], gpus_per_run=2, cores=list(range(6)))
    assert [(x['env']['CUDA_VISIBLE_DEVICES'], x['nproc'], x['cores']) for x in s] == [('4,5', 2, [0, 1, 2]),
                                                                                        ('6,7', 2, [3, 4, 5])]
    train = launch.step([sys.executable, 'train.py', '--x=1'], 'eval.json', 'train.py', 10, train=True)
    evals = launch.step([sys.executable, 'eval.py', '--y=2'], 'eval_y.json', 'eval.py')
    assert launch.in_slot(train['cmd'], train, s[0]) == [sys.executable, '-m', 'torch.distributed.run',
                                                         '--standalone', '--nproc_per_node=2', 'train.py', '--x=1']
    assert launch.in_slot(evals['cmd'], evals, s[0]) == evals['cmd']  # an evaluation is one process
    s = launch.local_slots(gpu_ids=['0', '1'], runs_per_gpu=3, cores=[0, 1])  # fewer cores than slots: shared
    assert len(s) == 6 and all(x['cores'] is None and x['env']['OMP_NUM_THREADS'] == '1' for x in s)
    assert [x['env'] for x in launch.local_slots(workers=3)] == [{'OMP_NUM_THREADS': '1'}] * 3
    assert [x['env'] for x in launch.local_slots(workers=1)] == [{}]
    assert [x['env'] for x in launch.local_slots(workers=1, one_thread=True)] == [{'OMP_NUM_THREADS': '1'}]


def test_gpu_sweep_without_a_gpu_says_where_its_runs_train(monkeypatch, capsys):
    """--gpu (or --runs_per_gpu) where no GPU is visible: one line that the runs train on the CPU, and CPU slots;
    with a GPU, none."""
    import sweep
    opts = dict(launcher='local', gpu_ids=None, runs_per_gpu=4, gpus_per_run=None, workers=0, tasks='', gpu=True)
    monkeypatch.setattr(launch, 'visible_gpus', lambda: [])
    slots = sweep.slots_for(opts, {}, one_thread=False)
    assert [x['label'] for x in slots] == ['cpu'] and capsys.readouterr().out == \
        "sweep: no GPU here: the runs train on the CPU, --runs_per_gpu unused\n"
    monkeypatch.setattr(launch, 'visible_gpus', lambda: ['0'])
    assert [x['label'] for x in sweep.slots_for(opts, {}, one_thread=False)] == ['cuda:0'] * 4
    assert capsys.readouterr().out == ''


def test_launch_reads_results_without_torch():
    """A SLURM job's own process runs launch.py alone (SlurmRun): it reads results (files.read_result) without
    importing torch, so that it starts in a second."""
    code = "import sys, launch; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, '-c', code], cwd=ROOT, env=ENV, timeout=120).returncode == 0


@pytest.mark.parametrize('args, says', [
    (['--gpu_ids=0,1', '--gpus_per_run=2', '--runs_per_gpu=2'], 'a run over several GPUs shares none of them'),
    (['--gpu_ids=0,1', '--gpus_per_run=4'], '--gpus_per_run=4 but 2 GPU(s) here (0, 1)'),
    (['--gpu_ids=0', '--device=cuda:1'], 'drop --device and choose GPUs with --gpu_ids=0,1'),
    (['--launcher=slurm', '--runs_per_gpu=2'], '--runs_per_gpu and --gpu_ids are for --launcher=local'),
    (['--launcher=pbs'], "--launcher='pbs': must be 'local' or 'slurm'")])
def test_slot_options_that_cannot_be_are_one_line(args, says):
    r = fork_run(['sweep.py', '--schemes=rope'] + args)
    assert r.returncode != 0 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_config_file_sets_the_sweeps_own_keys(tmp_path):
    """A site's config file: its sweep keys reach the sweep (here a choice that cannot be, refused in one line), and
    the command line wins over it."""
    site = tmp_path / 'site.py'
    site.write_text("gpu_ids = '0,1'\ngpus_per_run = 2\nruns_per_gpu = 2\n")
    r = fork_run(['sweep.py', str(site), '--schemes=rope'])
    assert r.returncode != 0 and 'a run over several GPUs shares none of them' in r.stderr, r.stderr
    r = fork_run(['sweep.py', str(site), '--schemes=rope', '--runs_per_gpu=1', '--gpus_per_run=3'])  # the line wins
    assert r.returncode != 0 and '--gpus_per_run=3 but 2 GPU(s) here (0, 1)' in r.stderr, r.stderr


def test_slurm_launcher_without_sbatch_submitit_or_controller_says_what_to_do(tmp_path):
    """One line, before anything is locked or trained: sbatch missing; then (a fake sbatch and squeue on PATH)
    submitit missing; then (submitit there, or a stand-in) a squeue that cannot reach a controller, in its words."""
    env = dict(ENV, PATH=str(tmp_path))
    args = [sys.executable, 'sweep.py', '--launcher=slurm', f'--out={tmp_path / "out"}']
    r = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode != 0 and r.stderr.strip().splitlines() == [
        "sweep: --launcher=slurm needs SLURM's sbatch, squeue and sacct on PATH: run it on a SLURM login node (on "
        "Debian or Ubuntu: apt-get install slurm-client)"], r.stderr
    for tool in ('sbatch', 'squeue'):
        (tmp_path / tool).write_text('#!/bin/sh\necho "squeue: error: Unable to contact slurm controller" >&2\n'
                                     'exit 1\n')
        (tmp_path / tool).chmod(0o755)
    (tmp_path / 'no' / 'submitit').mkdir(parents=True)
    (tmp_path / 'no' / 'submitit' / '__init__.py').write_text("raise ImportError('no submitit here')\n")
    r = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env=dict(env, PYTHONPATH=str(tmp_path / 'no')))
    assert r.returncode != 0 and r.stderr.strip().splitlines() == [
        "sweep: --launcher=slurm needs submitit: pip install submitit (or pip install -r requirements.txt)"], r.stderr
    (tmp_path / 'yes' / 'submitit').mkdir(parents=True)
    (tmp_path / 'yes' / 'submitit' / '__init__.py').write_text('')
    r = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env=dict(env, PYTHONPATH=str(tmp_path / 'yes')))
    assert r.returncode != 0 and r.stderr.strip().splitlines() == [
        "sweep: no SLURM controller answers here (squeue: error: Unable to contact slurm controller): run "
        "the sweep on the cluster's login node, or set SLURM_CONF to its slurm.conf (this machine's test cluster: "
        "bash tools/slurm_cluster.sh start)"], r.stderr
    assert not os.path.exists(tmp_path / 'out')


def test_scheduler_keeps_every_device_busy_while_runs_are_left(tmp_path, capsys):
    """Nine runs of stand-in steps (0.45-1.5 s each) on 2 stand-in GPUs x 2 slots: the children's own records show
    4 running at once and never 3 on one GPU; the scheduler's accounting shows no free slot while a run that could
    start was waiting; a run that comes after another starts once it ended; a failed train step is reported with
    its log and ends its run (its next step never runs) while the other runs go on."""
    slots = launch.local_slots(gpu_ids=['0', '1'], runs_per_gpu=2, cores=[0])
    out, runs = str(tmp_path), []
    for i in range(9):
        d = tmp_path / f'r{i}'
        d.mkdir()
        secs = [0.9, 1.5, 1.2][i % 3]  # (each long past a loaded machine's interpreter start: 4 at once)
        how = 'fail' if i == 4 else 'ok'
        runs.append(dict(name=f'r{i}', dir=str(d), after='r1' if i == 0 else None, steps=[
            launch.step([sys.executable, '-c', STEP, str(d / 'a.json'), str(secs), how], str(d / 'a.json'), 'a',
                        train=True),
            launch.step([sys.executable, '-c', STEP, str(d / 'b.json'), str(secs / 2), 'ok'], str(d / 'b.json'), 'b')]))
    done = []
    failed = launch.run_local(runs, slots, out, lambda run, whys: done.append((run['name'], whys)))
    assert failed == [('r4', f"a failed (exit code 3); see {tmp_path}/r4/sweep.log; run the sweep again to redo it")]
    assert sorted(n for n, _ in done) == [f'r{i}' for i in range(9)] and not os.path.exists(tmp_path / 'r4' / 'b.json')
    said = capsys.readouterr().out
    starts = [line for line in said.splitlines() if line.startswith('$ ')]
    assert len(starts) == 17 and all(line.startswith('$ CUDA_VISIBLE_DEVICES=') for line in starts)
    assert all(line.endswith(('on cuda:0, 2 runs per GPU', 'on cuda:1, 2 runs per GPU')) for line in starts)
    # the children's side: when each ran, on which GPU
    ran = [json.load(open(tmp_path / f'r{i}' / f)) for i in range(9) for f in ('a.json', 'b.json')
           if os.path.exists(tmp_path / f'r{i}' / f)]
    events = sorted([(r['t0'], 1, r['gpu']) for r in ran] + [(r['t1'], -1, r['gpu']) for r in ran])
    on, most = Counter(), 0
    for _, d, gpu in events:
        on[gpu] += d
        assert on[gpu] <= 2, "a GPU over its share"
        most = max(most, sum(on.values()))
    assert most == 4 and {r['gpu'] for r in ran} == {'0', '1'}
    r1 = json.load(open(tmp_path / 'r1' / 'b.json'))
    assert json.load(open(tmp_path / 'r0' / 'a.json'))['t0'] >= r1['t1']  # r0 comes after r1, though listed first
    # the scheduler's side: its accounting of this sweep
    lines = [json.loads(line) for line in open(tmp_path / 'schedule.jsonl')]
    head, ticks = lines[0], lines[1:]
    assert head['slots'] == ['cuda:0', 'cuda:0', 'cuda:1', 'cuda:1'] and head['share'] == 2 and len(ticks) > 9
    for t in ticks:
        per_gpu = Counter(head['slots'][i] for i, run in enumerate(t['busy']) if run)
        assert max(per_gpu.values(), default=0) <= 2
        assert t['waiting'] == 0 or all(t['busy']), t  # no idle slot while a run could start
    assert max(sum(map(bool, t['busy'])) for t in ticks) == 4 and not any(ticks[-1]['busy'])
