"""
How sweep.py runs its runs. A run is a chain of steps, each a child process (train.py, then its evaluations), each
skipped where its result is already whole. Runs go to the slots of this machine, as many at a time as there are
slots, or to SLURM, one job a run (submitit), which checkpoints and is requeued at its time limit or on preemption.

  slots = local_slots(workers=2, one_thread=True)          # CPU: 2 runs at a time, one thread each
  slots = local_slots(gpu_ids=['0', '1'], runs_per_gpu=4)  # 8 at a time, 4 on each GPU (small models packed)
  slots = local_slots(gpu_ids=['0', '1', '2', '3'], gpus_per_run=2)  # 2 at a time, each a torchrun over 2 GPUs
  failed = run_local(runs, slots, out, on_done)
  failed, active = run_slurm(runs, out, params, wait)      # submit what is missing or failed; the rest's state

On this machine: SIGTERM or Ctrl-C to the sweep is passed on as SIGTERM to every child (train.py finishes its step,
saves and exits); a kill -9 of the sweep reaches them as SIGTERM too (Linux PR_SET_PDEATHSIG); each child writes
straight to its run's sweep.log. A slot hands its child its GPU(s) as CUDA_VISIBLE_DEVICES, so a child sees them as
cuda:0.. and no other; OUT/schedule.jsonl records which run held which slot at every change.
Under SLURM: the jobs are SLURM's, and outlive the command; SLURM's signal before a time limit (or a preemption)
reaches submitit in the job, which stops train.py (it saves) and requeues the job, whose run then resumes from
its checkpoint. RUN/slurm.json names the run's job, so a run is never submitted while its job is queued or running.
"""
import contextlib
import ctypes
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time

from files import atomic_json, open_append, open_no_follow, read_json, read_result

HERE = os.path.dirname(os.path.abspath(__file__))
PRCTL = ctypes.CDLL(None).prctl if sys.platform.startswith('linux') else None
children = []       # running children: a SIGTERM/SIGINT to the sweep is passed on to each
stop_signal = None  # the signal that asked the sweep to stop


# --- steps and runs ------------------------------------------------------------------------------------------------

def step(cmd, result, what, iters=None, train=False):
    """One child of a run: `cmd` (argv), done when the JSON `result` is whole (and at `iters`, for train.py's
    eval.json). A train step is resumed from the run's ckpt.pt where there is one, runs on every rank of a run over
    several GPUs, and the run's other steps need it done."""
    return dict(cmd=cmd, result=result, what=what, iters=iters, train=train)


def result(path):
    """A result file's dict, or None when missing; a damaged or incomplete one is named and moved
    aside (NAME.bad) so that what it should hold is redone, never mixed into a report."""
    res, why = read_result(path)
    if why:
        os.replace(path, path + '.bad')
        print(f"sweep: {path} is {why}: moved to {path}.bad, redoing it", flush=True)
    return res


def finished(res, iters):
    """Whether a result (a dict, or None) is whole and, for train.py's eval.json, at max_iters = iters."""
    return res is not None and (iters is None or res.get('iter') == int(iters))


def step_done(s, quiet=False):
    """Whether step s left its whole result; quiet: only read (another rank may be moving a damaged one aside)."""
    if quiet:
        return finished(read_result(s['result'])[0], s['iters'])
    return finished(result(s['result']), s['iters'])


def run_done(run):
    """Whether every step of a run has its whole result (read only: nothing is moved)."""
    return all(step_done(s, quiet=True) for s in run['steps'])


def command(s, run_dir):
    """A step's argv as it runs now: a train step resumes from the run's checkpoint where there is one (the last
    --init_from wins over a fine-tune's)."""
    resume = s['train'] and os.path.exists(os.path.join(run_dir, 'ckpt.pt'))
    return s['cmd'] + (['--init_from=resume'] if resume else [])


def outcome(rc, path, log, what, iters=None):
    """None when the child `what` left its result in path (at `iters`), else why not, naming its log.
    Exit code 0 is not enough: train.py stopped by a signal saves and exits 0 too."""
    res, why = read_result(path)
    if rc == 0 and finished(res, iters):
        return None
    if rc != 0:
        how = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"failed (exit code {rc})"
    elif res is None:
        how = f"stopped before the end ({why or 'no ' + os.path.basename(path)})"
    else:
        how = f"stopped before the end ({os.path.basename(path)} at iter {res.get('iter')}, not {iters})"
    return f"{what} {how}; see {log}; run the sweep again to redo it"


# --- child processes -----------------------------------------------------------------------------------------------

def on_signal(signum, frame):
    """Pass SIGTERM on to every running child (train.py finishes its step, saves and exits); the
    sweep then stops as soon as they have exited. A second signal is passed on too (exit at once)."""
    global stop_signal
    stop_signal = stop_signal or signum
    for p in children:
        try:
            if p.returncode is None:  # (not yet reaped: its pid is still its own)
                os.kill(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def catch_signals():
    """From here on SIGTERM and SIGINT stop the runs, which save first."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)


def in_child(parent, prctl, cores):
    """In the child before exec: SIGTERM when the sweep (or the SLURM job) dies, even by kill -9, so a run saves and
    stops rather than running on detached (Linux prctl PR_SET_PDEATHSIG; libc's prctl is looked up before the fork);
    SIGUSR2, SLURM's warning before a time limit, ignored (its default would end the run unsaved: the job stops it);
    the slot's cores, where it has its own."""
    if prctl is not None:
        prctl(1, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before the prctl
            os.kill(os.getpid(), signal.SIGTERM)
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    if cores:
        os.sched_setaffinity(0, cores)


def holder(d):
    """What holds d/.lock (a child of an earlier, killed sweep, still saving), or None when it is free."""
    import fcntl
    try:
        f = os.fdopen(open_no_follow(os.path.join(d, '.lock'), os.O_RDONLY))
    except OSError:  # none, or a link: train.py refuses the link in one line, in the run's log
        return None
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return None  # (closing the file lets go again, for the child)
        except BlockingIOError:
            return f.read().strip() or 'another process'


def spawn(cmd, log, env=None, preexec_fn=None):
    """Start cmd in the repo with its output going straight to the open file `log`: no pipe through the parent, so
    the child never dies of a broken pipe, and the log is written line by line as it runs. A session of its own: a
    terminal's Ctrl-C reaches the parent only, which decides what the child gets. (runtime.spawn's child, without
    importing torch: a SLURM job that only runs a run's children starts in a second.)"""
    return subprocess.Popen(cmd, cwd=HERE, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=dict(os.environ, PYTHONUNBUFFERED='1', **(env or {})), start_new_session=True,
                            preexec_fn=preexec_fn)


def start(cmd, log_path, env=None, note='', cores=None):
    """Start a child whose output goes to log_path (spawn), that gets SIGTERM when its parent dies and that
    a SIGTERM/SIGINT to the sweep stops; its command line, with `env` and `note` (its device), is printed and
    logged."""
    stop_if_asked()
    line = '$ ' + ' '.join([f'{k}={v}' for k, v in (env or {}).items()] + cmd) + (f'  # {note}' if note else '')
    print(line, flush=True)
    with open(log_path, 'a') as log:
        log.write(line + '\n')
        log.flush()
        p = spawn(cmd, log, env, preexec_fn=lambda parent=os.getpid(), f=PRCTL: in_child(parent, f, cores))
    children.append(p)
    if stop_signal:  # the signal came while it was starting
        on_signal(stop_signal, None)
    return p


def stop_if_asked():
    """After a SIGTERM/SIGINT: wait for the children (saving), then exit with one line on resuming."""
    if stop_signal:
        for p in children:
            p.wait()
        print(f"sweep: stopped by {signal.Signals(stop_signal).name} (its runs saved first); run the same command "
              f"again to resume", file=sys.stderr, flush=True)
        raise SystemExit(128 + stop_signal)


def reap(p):
    """A finished child's exit code (or the sweep's exit, if it was asked to stop)."""
    rc = p.wait()
    children.remove(p)
    stop_if_asked()
    return rc


# --- slots on this machine -----------------------------------------------------------------------------------------

def visible_gpus():
    """The GPUs this machine lends the sweep: CUDA_VISIBLE_DEVICES where it is set, else nvidia-smi's list (no torch
    import, no CUDA context in the sweep itself); [] without either."""
    if os.environ.get('CUDA_VISIBLE_DEVICES') is not None:
        return [g for g in os.environ['CUDA_VISIBLE_DEVICES'].split(',') if g.strip() and g.strip() != '-1']
    try:
        r = subprocess.run(['nvidia-smi', '-L'], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [str(i) for i, line in enumerate(r.stdout.splitlines()) if line.startswith('GPU ')] if r.returncode == 0 \
        else []


def local_slots(workers=1, one_thread=False, gpu_ids=(), runs_per_gpu=1, gpus_per_run=1, cores=None):
    """The slots of this machine: without GPUs, `workers` CPU slots (one thread each where one_thread or workers > 1,
    else all the cores); with them, `runs_per_gpu` slots on each GPU or one slot per `gpus_per_run` GPUs (a torchrun
    of as many ranks), the cores split evenly between the slots (each its own where there are enough).
    Each slot: dict(label, gpus, env, nproc, cores, share, note: its words in a child's command line)."""
    cores = sorted(os.sched_getaffinity(0)) if cores is None else cores
    if not gpu_ids:
        env = {'OMP_NUM_THREADS': '1'} if one_thread or workers > 1 else {}
        return [dict(label='cpu', gpus=(), env=env, nproc=1, cores=None, share=workers,
                     note=f"cpu, worker {i + 1} of {workers}" + (', 1 thread' if env else '')) for i in range(workers)]
    groups = [tuple(gpu_ids[i:i + gpus_per_run]) for i in range(0, len(gpu_ids) - gpus_per_run + 1, gpus_per_run)]
    slots = [g for g in groups for _ in range(runs_per_gpu)]
    per = max(1, len(cores) // len(slots))
    out = []
    for i, g in enumerate(slots):
        own = cores[i * per:(i + 1) * per] if len(cores) >= len(slots) else None
        label = 'cuda:' + ','.join(g)  # the physical GPUs (nvidia-smi's numbers); the child sees them as cuda:0..
        threads = str(max(1, per // len(g)))  # per process: a torchrun's ranks share their slot's cores
        out.append(dict(label=label, gpus=g, env={'CUDA_VISIBLE_DEVICES': ','.join(g), 'OMP_NUM_THREADS': threads},
                        nproc=len(g), cores=own, share=runs_per_gpu,
                        note=f"{label}" + (f", {runs_per_gpu} runs per GPU" if runs_per_gpu > 1 else '')
                        + (f", torchrun of {len(g)} ranks" if len(g) > 1 else '')))
    return out


def describe(slots):
    """The slots in a few words, for the plan line."""
    n, s = len(slots), slots[0]
    if not s['gpus']:
        return f"{n} at a time on the CPU" + (" (one thread each)" if s['env'] else '')
    gpus = list(dict.fromkeys(g for x in slots for g in x['gpus']))
    return (f"{n} at a time on GPU(s) {', '.join(gpus)}" + (f", {s['share']} per GPU" if s['share'] > 1 else '')
            + (f", {s['nproc']} GPUs per run (torchrun)" if s['nproc'] > 1 else ''))


def in_slot(cmd, s, slot):
    """A step's argv in its slot: a train step over several GPUs under torchrun (a free rendezvous port of its own,
    so that runs side by side never meet)."""
    if s['train'] and slot['nproc'] > 1:
        return [cmd[0], '-m', 'torch.distributed.run', '--standalone', f"--nproc_per_node={slot['nproc']}"] + cmd[1:]
    return cmd


def run_local(runs, slots, out, on_done, echo=False):
    """Run every run's steps, one child at a time per run, as many runs at a time as there are slots; a run waits
    for the run it comes `after` (DroPE: its rope run) to end, and for a folder a killed sweep's child still holds
    (up to 120 s). on_done(run, whys) after each run. Returns [(run name, why)] for every step that failed; a train
    step that fails ends its run. OUT/schedule.jsonl: a line per change, each slot's run and the runs left waiting."""
    pending, busy, failed = list(runs), {}, []  # busy: slot index -> [run, step index, child, whys, log offset]
    ended, t_start, waited, said, names = set(), time.time(), {}, set(), {r['name'] for r in runs}
    sched = open_append(os.path.join(out, 'schedule.jsonl'))
    sched.write(json.dumps({'sweep': os.getpid(), 'started': time.strftime('%Y-%m-%d %H:%M:%S'),
                            'slots': [s['label'] for s in slots], 'share': slots[0]['share'],
                            'runs': [r['name'] for r in runs]}) + '\n')

    def advance(i):
        """Start run busy[i]'s next step that is not done, or end the run and free the slot."""
        run, k, _, whys, _ = busy[i]
        while k < len(run['steps']) and step_done(run['steps'][k]):
            k += 1
        if k < len(run['steps']):
            s, log = run['steps'][k], os.path.join(run['dir'], 'sweep.log')
            p = start(in_slot(command(s, run['dir']), s, slots[i]), log, slots[i]['env'],
                      f"{run['name']} on {slots[i]['note']}", slots[i]['cores'])
            busy[i] = [run, k, p, whys, os.path.getsize(log)]
            run['ran'] = True
            return
        del busy[i]
        ended.add(run['name'])
        failed.extend((run['name'], w) for w in whys)
        on_done(run, whys)

    def ready():
        """The runs that could start now: what they come after has ended, and no killed sweep's child holds them."""
        can = []
        for r in pending:
            if r.get('after') in names and r['after'] not in ended:
                continue
            who = holder(r['dir'])
            if who and time.time() - waited.setdefault(r['name'], time.time()) < 120:
                if r['name'] not in said:
                    print(f"sweep: waiting for {who} to let go of {r['dir']}", flush=True)
                    said.add(r['name'])
                continue
            can.append(r)
        return can

    try:
        while pending or busy:
            changed = False
            for i in [i for i in busy if busy[i][2].poll() is not None]:
                run, k, p, whys, _ = busy[i]
                s = run['steps'][k]
                why = outcome(reap(p), s['result'], os.path.join(run['dir'], 'sweep.log'), s['what'], s['iters'])
                whys += [why] if why else []
                busy[i][1] = len(run['steps']) if why and s['train'] else k + 1  # no train.py: nothing else to do
                advance(i)
                changed = True
            for i in range(len(slots)):
                while i not in busy:
                    can = ready()
                    if not can:
                        break
                    pending.remove(can[0])
                    busy[i] = [can[0], 0, None, [], 0]
                    can[0]['t0'] = time.time()
                    advance(i)
                    changed = True
            if changed:
                sched.write(json.dumps({'t': round(time.time() - t_start, 3),
                                        'busy': [busy[i][0]['name'] if i in busy else None for i in range(len(slots))],
                                        'waiting': len(ready())}) + '\n')
                sched.flush()
            if echo and busy:  # one run at a time on a terminal: its child's output as it comes
                i = next(iter(busy))
                with open(os.path.join(busy[i][0]['dir'], 'sweep.log'), 'rb') as f:
                    f.seek(busy[i][4])
                    text = f.read()
                busy[i][4] += len(text)
                sys.stdout.write(text.decode(errors='replace'))
                sys.stdout.flush()
            if not changed:
                time.sleep(0.1)
    finally:
        sched.close()
    return failed


# --- SLURM ---------------------------------------------------------------------------------------------------------

# a job in one of these states may still run its run (PREEMPTED is final: a preempted job to be requeued shows as
# REQUEUED or PENDING)
ACTIVE = {'PENDING', 'RUNNING', 'REQUEUED', 'REQUEUE_FED', 'REQUEUE_HOLD', 'RESIZING', 'SUSPENDED', 'COMPLETING',
          'CONFIGURING', 'STAGE_OUT', 'SIGNALING', 'SPECIAL_EXIT', 'RESV_DEL_HOLD'}


class SlurmRun:
    """One run as a SLURM job (submitit pickles it, by reference to this module: the job starts in the repo).
    Every task of the job (one per GPU, or --ntasks_per_node) runs the train step as one DDP rank, its rendezvous
    (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK) from SLURM's environment through submitit's
    TorchDistributedEnvironment; task 0 alone runs the steps after it. On SLURM's signal before the time limit, or on
    preemption, submitit calls checkpoint(): train.py is stopped (it saves), and submitit requeues the job."""

    def __init__(self, run):
        self.run, self.child = run, None

    def __getstate__(self):  # what is pickled: the run, never the child
        return {'run': self.run}

    def __setstate__(self, state):
        self.run, self.child = state['run'], None

    def __call__(self):
        import submitit
        job = submitit.JobEnvironment()
        env = {'OMP_NUM_THREADS': os.environ.get('SLURM_CPUS_PER_TASK', '1')}
        ranks = {}
        if job.num_tasks > 1:
            d = submitit.helpers.TorchDistributedEnvironment()
            ranks = dict(MASTER_ADDR=d.master_addr, MASTER_PORT=str(d.master_port), RANK=str(d.rank),
                         WORLD_SIZE=str(d.world_size), LOCAL_RANK=str(d.local_rank),
                         LOCAL_WORLD_SIZE=str(d.local_world_size))
        rank, run, whys = job.global_rank, self.run, []
        log = os.path.join(run['dir'], 'sweep.log')
        for s in run['steps']:
            if (rank > 0 and not s['train']) or step_done(s, quiet=rank > 0):
                continue
            while rank == 0 and holder(run['dir']):  # an earlier attempt's train.py, still saving
                time.sleep(0.5)
            note = f"{run['name']} in SLURM job {job.job_id} on {job.hostname}" + (f", rank {rank}" if ranks else '')
            self.child = start(command(s, run['dir']), log, {**env, **(ranks if s['train'] else {})}, note)
            while self.child.poll() is None:
                time.sleep(0.5)
            rc, self.child = self.child.returncode, None
            why = outcome(rc, s['result'], log, s['what'], s['iters'])
            if why and rank == 0:
                if s['train'] and rc == 0:  # stopped by SLURM's SIGTERM (a preemption): submitit's signal may follow
                    time.sleep(30)
                whys.append(why)
            if why and s['train']:  # nothing else of this run can be done
                break
        if whys:
            raise RuntimeError('; '.join(whys))
        return 'done'

    def checkpoint(self, *args, **kwargs):
        """Stop the running child (train.py finishes its step and saves; an evaluation stops at its next batch),
        wait for it to exit (without reaping it: the loop in __call__ does), and hand submitit this run to requeue:
        the requeued job skips what is done and resumes train.py from its checkpoint."""
        import submitit
        p = self.child
        if p is not None and p.returncode is None:
            try:
                os.kill(p.pid, signal.SIGTERM)
                os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)
            except (ProcessLookupError, ChildProcessError):
                pass
        return submitit.helpers.DelayedSubmission(self)


def slurm_ready():
    """submitit, or exit with one line naming what to install, or that no SLURM controller answers: the queue
    must be readable before anything is submitted, since it is what keeps a run from being submitted twice."""
    if shutil.which('sbatch') is None or shutil.which('squeue') is None:
        sys.exit("sweep: --launcher=slurm needs SLURM's sbatch, squeue and sacct on PATH: run it on a SLURM login "
                 "node (on Debian or Ubuntu: apt-get install slurm-client)")
    try:
        import submitit
    except ImportError:
        sys.exit("sweep: --launcher=slurm needs submitit: pip install submitit (or pip install -r requirements.txt)")
    r = subprocess.run(['squeue', '-h', '-o', '%i'], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        said = [line.strip().removeprefix('squeue: ') for line in r.stderr.splitlines() if line.strip()]
        sys.exit(f"sweep: no SLURM controller answers here (squeue: {said[-1] if said else f'exit {r.returncode}'}):"
                 f" run the sweep on the cluster's login node, or set SLURM_CONF to its slurm.conf (this machine's "
                 f"test cluster: bash tools/slurm_cluster.sh start)")
    return submitit


def squeue_jobs():
    """{comment: (job id, state)} of the jobs SLURM still lists (sweep.py puts each run's folder in its job's
    comment), so that a job whose record was never written is found rather than submitted twice."""
    r = subprocess.run(['squeue', '-h', '-t', 'all', '-o', '%i|%T|%k'], capture_output=True, text=True, timeout=60)
    jobs = {}
    for line in r.stdout.splitlines() if r.returncode == 0 else []:
        jid, state, comment = (line.split('|', 2) + ['', ''])[:3]
        jobs.setdefault(comment, []).append((jid, state))
    return jobs


def slurm_held(runs):
    """[(run name, why)] for the runs a queued or running SLURM job of theirs holds, so that a local sweep never
    trains one beside its job; [] where there is no squeue, or no run was ever submitted."""
    if shutil.which('squeue') is None or not any(os.path.exists(os.path.join(r['dir'], 'slurm.json')) for r in runs):
        return []
    listed, held = squeue_jobs(), []
    for r in runs:
        jobs = [(j, state) for j, state in listed.get(r['dir'], []) if state in ACTIVE]
        if jobs:
            held.append((r['name'], f"SLURM job {jobs[0][0]} ({jobs[0][1]}) runs it: wait for it (the same command "
                                    f"with --launcher=slurm shows its state) or scancel {jobs[0][0]}"))
    return held


def states(submitit, runs, records):
    """{run name: (state, job id)}: 'done' where every step's result is whole, else its job's state: squeue's while
    the controller lists the job (it knows a requeue at once), else sacct's (one call, submitit's watcher: the
    accounting keeps jobs the controller has forgotten), UNKNOWN where neither knows it; else 'not submitted'."""
    jobs = {n: submitit.SlurmJob(folder=r['folder'], job_id=r['job_id']) for n, r in records.items()}
    if jobs:
        submitit.SlurmJob.watcher.update()
    listed = {jid: state for js in squeue_jobs().values() for jid, state in js}
    rows = {}
    for r in runs:
        n = r['name']
        if run_done(r):
            rows[n] = ('done', records.get(n, {}).get('job_id', ''))
        elif n in jobs:
            state = submitit.SlurmJob.watcher.get_state(jobs[n].job_id, mode='cache').split()[0]  # 'CANCELLED by 0'
            rows[n] = (listed.get(jobs[n].job_id, state), jobs[n].job_id)
        else:
            rows[n] = ('not submitted', '')
    return rows


def job_log(rec, last_line=False):
    """The job's own stderr log (submitit's), or its last line that is not srun's: why the job failed (the run's
    error, or slurmstepd's line on a time limit or a cancellation)."""
    path = os.path.join(rec['folder'], f"{rec['job_id']}_0_log.err")
    if not last_line:
        return path
    try:
        lines = [l.strip() for l in open(path, errors='replace').read().splitlines()]
    except OSError:
        return ''
    lines = [l for l in lines if l and not l.startswith(('srun:', 'submitit INFO', 'submitit WARNING'))]
    return lines[-1][:500] if lines else ''


def run_slurm(runs, out, params, wait=False, poll_s=30.0):
    """Show every run's state; submit, as one SLURM job each, the runs neither done nor queued or running (never a
    run twice); with `wait`, poll every poll_s seconds until none is queued or running. Returns (failed, active):
    [(run name, why)] for the runs whose job ended without finishing them, and the names still queued or running."""
    submitit = slurm_ready()
    folder = os.path.join(out, 'slurm')
    records = {}
    for r in runs:
        rec, _ = read_json(os.path.join(r['dir'], 'slurm.json'))
        if isinstance(rec, dict) and {'job_id', 'folder'} <= rec.keys():
            records[r['name']] = rec
    listed = squeue_jobs()
    for r in runs:  # a job submitted by a sweep that died before it wrote the record
        mine = [j for j, state in listed.get(r['dir'], []) if state in ACTIVE]
        if mine and records.get(r['name'], {}).get('job_id') != mine[0]:
            records[r['name']] = dict(job_id=mine[0], folder=folder, submitted=None)
            atomic_json(records[r['name']], os.path.join(r['dir'], 'slurm.json'))
    rows = states(submitit, runs, records)
    show(runs, rows, records)
    todo = [r for r in runs if rows[r['name']][0] not in ACTIVE | {'done'}]
    if todo:
        executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=params.get('max_num_timeout', 3))
        executor.update_parameters(**{k: v for k, v in params.items() if k != 'max_num_timeout' and v not in
                                      (None, '')})
        submit(submitit, executor, todo, records, {n for n, (state, _) in rows.items() if state in ACTIVE})
        rows.update({r['name']: ('submitted', records[r['name']]['job_id']) for r in todo})
    while wait and any(state in ACTIVE | {'submitted'} for state, _ in rows.values()):
        time.sleep(poll_s)
        now = states(submitit, runs, records)
        show(runs, now, records, rows)
        rows = now
    failed = []
    for r in runs:
        (state, jid), rec = rows[r['name']], records.get(r['name'])
        if state not in ACTIVE | {'done', 'submitted', 'not submitted'}:
            why = job_log(rec, last_line=True)
            failed.append((r['name'], f"job {jid} {state}" + (f": {why}" if why else f"; see {r['dir']}/sweep.log")
                           + f"; the job's log: {job_log(rec)}"))
    return failed, [n for n, (state, _) in rows.items() if state in ACTIVE | {'submitted'}]


def submit(submitit, executor, todo, records, active):
    """sbatch each run in `todo`, its folder as the job's comment (squeue_jobs), and record its job in
    RUN/slurm.json at once. A run that comes after another that is queued, running or submitted here waits for
    that job to end well (SLURM's afterok; cancelled if it cannot)."""
    names = active | {r['name'] for r in todo}
    for r in sorted(todo, key=lambda r: bool(r.get('after'))):  # what others wait for goes first
        dep = records[r['after']]['job_id'] if r.get('after') in names else None
        extra = dict(chdir=HERE, **({'dependency': f'afterok:{dep}', 'kill-on-invalid-dep': 'yes'} if dep else {}))
        executor.update_parameters(comment=r['dir'], job_name=r['name'], additional_parameters=extra)
        try:
            with contextlib.redirect_stderr(io.StringIO()):  # (submitit prints sbatch's refusal too: one line, below)
                job = executor.submit(SlurmRun(r))
        except submitit.core.utils.FailedJobError as e:  # sbatch refused the job: its own words, then the fix
            words = '; '.join(line.strip() for line in str(e).splitlines() if line.strip())
            sys.exit(f"sweep: sbatch refused {r['name']}: {words}; fix the option it names (--partition, --account, "
                     f"--time, --gpus_per_run, --cpus_per_task, --nodes) and run the same command again")
        records[r['name']] = dict(job_id=job.job_id, folder=str(executor.folder), submitted=time.time())
        atomic_json(records[r['name']], os.path.join(r['dir'], 'slurm.json'))
        print(f"sweep: submitted {r['name']} as job {job.job_id}" + (f" (after job {dep})" if dep else '')
              + f"; its log {r['dir']}/sweep.log, the job's {job_log(records[r['name']])}", flush=True)


def show(runs, rows, records, before=None):
    """Every run's state at a glance, a failed job's reason under it (on a later poll: only what changed)."""
    if before is None:
        counts = {}
        for state, _ in rows.values():
            counts[state] = counts.get(state, 0) + 1
        print(f"sweep: {len(runs)} runs in SLURM: " + ', '.join(f"{n} {k}" for k, n in sorted(counts.items())),
              flush=True)
    width = max(len(r['name']) for r in runs)
    for r in runs:
        n, (state, jid) = r['name'], rows[r['name']]
        if before is not None and before.get(n) == rows[n]:
            continue
        print(f"sweep:   {n:<{width}}  {state:<13}" + (f"  job {jid:<8}  log {r['dir']}/sweep.log" if jid else ''),
              flush=True)
        if state not in ACTIVE | {'done', 'not submitted'}:
            print(f"sweep:     {job_log(records[n], last_line=True)}", flush=True)
