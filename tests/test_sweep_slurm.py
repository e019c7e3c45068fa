"""sweep.py --launcher=slurm against a real one-node SLURM cluster (tools/slurm_cluster.sh: munge, MariaDB, slurmdbd,
slurmctld, slurmd), started once per test run and stopped after it; the tier skips in one line where its packages
are missing (bash .ci/run installs them). A 2-scheme x 2-seed sweep through SLURM writes the local sweep's report,
each run submitted once however often the command runs, and a second sweep into its folder is refused; a job
preempted, then stopped by a time limit's signal, is requeued twice and ends equal to an uninterrupted run, bit for
bit; a job that fails is reported with its log and resubmitted on the next invocation; a run over two tasks takes its
DDP rendezvous from SLURM's environment."""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import ROOT
from test_sweep import ENV, MODEL, results, tables

pytestmark = [pytest.mark.slurm, pytest.mark.e2e, pytest.mark.xdist_group('slurm')]
SCRIPT = os.path.join(ROOT, 'tools', 'slurm_cluster.sh')
# ~3 ms an iteration on one thread: 1000 iterations are long enough to land a signal half way
ARGS = ['--schemes=rope,alibi', '--seeds=2', '--scalings=linear', '--max_iters=1000', '--eval_interval=250',
        '--final_eval_mults=[1, 2]', '--block_size=16', '--batch_size=4', '--eval_tokens=256',
        '--warmup_iters=5'] + MODEL
RUNS = ['rope-s1337', 'rope-s1338', 'alibi-s1337', 'alibi-s1338']
SLURM = ['--launcher=slurm', '--cpus_per_task=1', '--poll_s=1']


def free_ports(n):
    """The first of n consecutive free TCP ports (the cluster's daemons and its database)."""
    for base in range(17017, 30000, 10):
        try:
            for p in range(base, base + n):
                with socket.socket() as s:
                    s.bind(('127.0.0.1', p))
            return base
        except OSError:
            continue
    raise RuntimeError('no free ports')


@pytest.fixture(scope='session')
def cluster():
    """The cluster, once for the test run -> the environment its commands (and sweep.py) need."""
    missing = [b for b in ('munged', 'slurmctld', 'slurmd', 'slurmdbd', 'mariadbd', 'sbatch')
               if shutil.which(b) is None and not os.path.exists(f'/usr/sbin/{b}')]
    if missing:
        pytest.skip(f"SLURM tier: {', '.join(missing)} missing (apt-get install slurm-wlm munge slurmdbd "
                    f"mariadb-server, as bash .ci/run does)")
    try:
        import submitit  # noqa: F401
    except ImportError:
        pytest.skip("SLURM tier: submitit missing (pip install -r requirements.txt)")
    if os.geteuid() != 0:
        pytest.skip("SLURM tier: its daemons run as root; run the tests as root (as CI does)")
    folder = tempfile.mkdtemp(prefix='nanope-slurm-')
    env = dict(ENV, SLURM_PORT_BASE=str(free_ports(4)), SLURM_CONF=os.path.join(folder, 'slurm.conf'))
    t0 = time.time()
    r = subprocess.run(['bash', SCRIPT, 'start', folder], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    print(f"SLURM cluster up in {time.time() - t0:.1f} s: {folder}")
    yield env
    subprocess.run(['bash', SCRIPT, 'stop', folder], capture_output=True, text=True, env=env, timeout=300)
    shutil.rmtree(folder, ignore_errors=True)


def sweep(args, env, timeout=300):
    """sweep.py to its end; past `timeout`, a failure that shows the cluster's queue and nodes."""
    try:
        return subprocess.run([sys.executable, 'sweep.py'] + args, cwd=ROOT, capture_output=True, text=True, env=env,
                              timeout=timeout)
    except subprocess.TimeoutExpired as e:
        queue = subprocess.run('squeue -o "%i %j %T %r"; sinfo -R', shell=True, capture_output=True, text=True,
                               env=env).stdout
        pytest.fail(f"sweep.py still running after {timeout} s; the cluster:\n{queue}\n{(e.stdout or b'')[-3000:]}")


@pytest.fixture(scope='session')
def local_ref(data, tmp_path_factory):
    """The local sweep the SLURM ones must equal: two runs at a time on the CPU, one thread each."""
    out = str(tmp_path_factory.mktemp('slurm-ref') / 'out')
    r = sweep(ARGS + [f'--data_dir={data}', f'--out={out}', '--workers=2'], ENV)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return dict(out=out, tables=tables(out), results=results(out))


def wait_text(path, text, after=0, timeout=180):
    """The offset just past the first `text` in the file at `path` after byte `after`, once it is there."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if os.path.exists(path):
            data = open(path, 'rb').read()
            i = data.find(text.encode(), after)
            if i >= 0:
                return i + len(text)
        time.sleep(0.05)
    raise AssertionError(f"{text!r} not in {path} after {timeout} s:\n" +
                         (open(path, errors='replace').read()[-3000:] if os.path.exists(path) else '(no file)'))


def env_of(line):
    """The VAR=value words a '$ ...' line of a run's log starts with: the environment its child was handed."""
    env = {}
    for w in line[2:].split():
        if not re.match(r'[A-Z_]+=', w):
            break
        env.update([w.split('=', 1)])
    return env


def job_of(out, run):
    return json.load(open(os.path.join(out, run, 'slurm.json')))['job_id']


def test_slurm_sweep_reports_as_the_local_sweep_submitting_each_run_once(cluster, local_ref, data, tmp_path):
    out = str(tmp_path / 'out')
    args = ARGS + [f'--data_dir={data}', f'--out={out}'] + SLURM
    r = sweep(args, cluster)  # returns once the jobs are submitted, naming each and its logs
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    submitted = re.findall(r"^sweep: submitted (\S+) as job (\d+); its log (\S+), the job's (\S+)$", r.stdout, re.M)
    assert sorted(n for n, *_ in submitted) == sorted(RUNS), r.stdout
    for n, job, log, own in submitted:
        assert log == f'{out}/{n}/sweep.log' and own == f'{out}/slurm/{job}_0_log.err' and job_of(out, n) == job
    jobs = {n: job for n, job, *_ in submitted}
    assert "4 run(s) queued or running in SLURM: run the same command again" in r.stdout
    r = sweep(args, cluster)  # again at once: every run's state, nothing submitted twice
    assert r.returncode == 0 and 'sweep: submitted' not in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    rows = {n: (state, job) for n, state, job in re.findall(r"^sweep:   (\S+)\s+(\S+)\s+job (\d+)", r.stdout, re.M)}
    assert {n: job for n, (_, job) in rows.items()} == jobs, r.stdout
    assert all(state in ('PENDING', 'RUNNING', 'COMPLETING', 'done') for state, _ in rows.values()), r.stdout
    log = open(tmp_path / 'wait.out', 'w+')
    p = subprocess.Popen([sys.executable, 'sweep.py'] + args + ['--wait=True'], cwd=ROOT, stdout=log,
                         stderr=subprocess.STDOUT, text=True, env=cluster)
    wait_text(os.path.join(out, '.lock'), f'PID {p.pid} (sweep.py', timeout=60)
    r = sweep(args, cluster)  # a second sweep into the folder while the first waits
    assert r.returncode != 0 and r.stdout == '' and len(r.stderr.strip().splitlines()) == 1, r.stdout + r.stderr
    assert f"is in use by PID {p.pid} (sweep.py" in r.stderr
    assert p.wait(timeout=300) == 0, open(log.name).read()[-3000:]
    said = open(log.name).read()
    assert f'sweep: report -> {out}/report/report.md' in said and 'sweep: submitted' not in said
    assert {n: job_of(out, n) for n in RUNS} == jobs
    assert tables(out) == local_ref['tables']
    assert results(out) == local_ref['results']


def test_preempted_then_timed_out_job_is_requeued_and_ends_equal_to_an_uninterrupted_run(cluster, local_ref, data,
                                                                                          tmp_path):
    """rope-s1337 alone: preempted at iteration 250+ (SIGTERM, then SLURM's USR2, as submitit's own test hook sends
    them), then at 750+ given SLURM's time-limit signal alone (USR2); each time train.py saves, submitit requeues the
    one job, and the run resumes from its checkpoint; its eval*.json and final weights equal the local sweep's."""
    import submitit
    import torch
    out = str(tmp_path / 'out')
    args = [a for a in ARGS if not a.startswith(('--schemes', '--seeds'))] + \
        ['--schemes=rope', f'--data_dir={data}', f'--out={out}', '--time=5'] + SLURM
    r = sweep(args, cluster)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    log, job = os.path.join(out, 'rope-s1337', 'sweep.log'), job_of(out, 'rope-s1337')
    at = 0
    for text, timeout in (('iter 250:', False), ('iter 750:', True)):
        at = wait_text(log, text, at)
        with pytest.MonkeyPatch.context() as mp:  # submitit's scancel runs with this cluster's SLURM_CONF
            mp.setenv('SLURM_CONF', cluster['SLURM_CONF'])
            submitit.SlurmJob(os.path.join(out, 'slurm'), job)._interrupt(timeout=timeout)
        at = wait_text(log, 'stopped by SIGTERM at iter ', at)
        at = wait_text(log, '--init_from=resume', at, timeout=120)  # requeued, started again
    r = sweep(args + ['--wait=True'], cluster)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    text = open(log).read()
    stops = [int(x) for x in re.findall(r'stopped by SIGTERM at iter (\d+):', text)]
    assert len(stops) == 2 and 250 <= stops[0] < 750 <= stops[1] < 1000, stops
    assert job_of(out, 'rope-s1337') == job
    assert open(os.path.join(out, 'slurm', f'{job}_0_log.out')).read().count(f'Requeued job {job}') == 2
    shown = subprocess.run(['scontrol', 'show', 'job', job], capture_output=True, text=True, env=cluster).stdout
    assert 'Restarts=2' in shown and 'JobState=COMPLETED' in shown, shown
    got = results(out)
    assert got == {k: v for k, v in local_ref['results'].items() if k.startswith('rope-s1337/')}
    a = torch.load(os.path.join(out, 'rope-s1337', 'ckpt.pt'), weights_only=True)['model']
    b = torch.load(os.path.join(local_ref['out'], 'rope-s1337', 'ckpt.pt'), weights_only=True)['model']
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_failed_job_is_reported_with_its_log_and_resubmitted_next_time(cluster, data, tmp_path):
    """A run whose data is not there yet: its job fails, and the waiting sweep names the job, train.py's error and
    the logs, and writes no report; with the data in place, the next invocation shows the failure, submits the run
    again (a new job), waits for it and writes the report."""
    out, later = str(tmp_path / 'out'), str(tmp_path / 'data')
    args = [a for a in ARGS if not a.startswith(('--schemes', '--seeds', '--max_iters', '--scalings'))] + \
        ['--schemes=rope', '--scalings=', '--max_iters=100', f'--data_dir={later}', f'--out={out}'] + SLURM
    r = sweep(args + ['--wait=True'], cluster)
    job = job_of(out, 'rope-s1337')
    run_log, job_log = f'{out}/rope-s1337/sweep.log', f'{out}/slurm/{job}_0_log.err'
    assert r.returncode == 1 and 'report ->' not in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    assert (f"sweep: FAILED rope-s1337: job {job} FAILED: RuntimeError: train.py failed (exit code 1); see {run_log}; "
            f"run the sweep again to redo it; the job's log: {job_log}") in r.stdout.splitlines(), r.stdout
    assert f"no train.bin or val.bin in {later}" in open(run_log).read()
    shutil.copytree(data, later)
    r = sweep(args + ['--wait=True'], cluster)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert re.search(rf"^sweep:   rope-s1337\s+FAILED\s+job {job} ", r.stdout, re.M), r.stdout
    again = job_of(out, 'rope-s1337')
    assert again != job and f"sweep: submitted rope-s1337 as job {again}; its log {run_log}" in r.stdout
    assert f'sweep: report -> {out}/report/report.md' in r.stdout
    assert json.load(open(f'{out}/rope-s1337/eval.json'))['iter'] == 100


def test_run_over_two_tasks_takes_its_rendezvous_from_slurm(cluster, local_ref, data, tmp_path):
    """--ntasks_per_node=2: one job, two DDP ranks (gloo on the CPU), their MASTER_ADDR, MASTER_PORT, RANK and
    WORLD_SIZE from SLURM's environment (submitit's TorchDistributedEnvironment); rank 0 alone evaluates after it;
    the losses those of the local single-process run (the same gradient, summed in another order)."""
    import torch
    out = str(tmp_path / 'out')
    args = [a for a in ARGS if not a.startswith(('--schemes', '--seeds'))] + \
        ['--schemes=rope', f'--data_dir={data}', f'--out={out}', '--ntasks_per_node=2', '--wait=True'] + SLURM
    r = sweep(args, cluster)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    text = open(os.path.join(out, 'rope-s1337', 'sweep.log')).read()
    starts = [line for line in text.splitlines() if line.startswith('$ ')]
    ranks = [env_of(line) for line in starts if ' train.py ' in line]
    assert sorted(x['RANK'] for x in ranks) == ['0', '1'] and {x['WORLD_SIZE'] for x in ranks} == {'2'}
    assert len({(x['MASTER_ADDR'], x['MASTER_PORT']) for x in ranks}) == 1
    assert sum(' eval.py ' in line for line in starts) == 1  # rank 0 alone
    ck = torch.load(os.path.join(out, 'rope-s1337', 'ckpt.pt'), weights_only=True)
    assert ck['config']['world_size'] == 2 and ck['iter_num'] == 1000
    got = json.load(open(os.path.join(out, 'rope-s1337', 'eval.json')))
    want = local_ref['results']['rope-s1337/eval.json']
    assert got['nonoverlap'] == pytest.approx(want['nonoverlap'], rel=1e-3)


def test_a_job_sbatch_refuses_is_one_line(cluster, data, tmp_path):
    """A partition the cluster lacks: sbatch's own words and the fix in one line, nothing recorded as submitted."""
    out = str(tmp_path / 'out')
    r = sweep(['--schemes=rope', '--scalings=', f'--data_dir={data}', f'--out={out}', '--partition=nowhere'] + MODEL +
              SLURM, cluster)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("sweep: sbatch refused rope-s1337: sbatch: error: invalid partition specified: nowhere")
    assert r.stderr.strip().endswith("fix the option it names (--partition, --account, --time, --gpus_per_run, "
                                     "--cpus_per_task, --nodes) and run the same command again")
    assert not os.path.exists(os.path.join(out, 'rope-s1337', 'slurm.json'))
